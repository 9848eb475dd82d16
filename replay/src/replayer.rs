//! Re-executes recorded steps: the recorded batches (not a new schedule) run through the
//! core's executor on any backend (the caller passes its factory, as to `sim`'s
//! runner), with the recorded forced drafts and grammar states, and each step is
//! re-recorded for comparison.

use std::collections::BTreeMap;
use std::sync::Arc;

use specmla_core::backend::Backend;
use specmla_core::batch::{ScheduledBatch, ScheduledRow};
use specmla_core::config::{EngineConfig, SpecMethod};
use specmla_core::engine::{
    BatchContext, DraftOracle, DraftQuery, EngineError, EngineOptions, Executor, StepOutcome,
};
use specmla_core::fault::Faults;
use specmla_core::grammar::{GrammarState, TokenAutomaton};
use specmla_cpu::{cpu_backend, CpuBackend};
use specmla_sim::model::{DrafterModel, TargetModel};
use specmla_sim::record::step_record;
use specmla_sim::runner::check_host_memory;
use specmla_sim::scenarios::grammar_from_seed;
use specmla_traces::{StepRecord, TraceHeader};

/// Why a trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("the trace's config does not parse: {0}")]
    Config(String),
    /// The config parses but cannot run (the cause is in the message, not a `source`,
    /// so it prints once).
    #[error("the trace's {0}")]
    Invalid(specmla_core::error::ConfigError),
    #[error("step {step}: {message}")]
    Engine { step: u64, message: String },
    /// The backend cannot be used here (no GPU, no driver, out of memory):
    /// `--backend gpu: reason`.
    #[error("{0}")]
    Environment(String),
    #[error("step {step}: {reason}")]
    BadRecord { step: u64, reason: String },
}

impl From<specmla_core::error::ConfigError> for ReplayError {
    fn from(e: specmla_core::error::ConfigError) -> Self {
        ReplayError::Invalid(e)
    }
}

/// What a replayed step's own checks found, and what a cross-backend comparison needs
/// from the replay beyond its record.
#[derive(Clone, Debug, Default)]
pub struct StepFindings {
    /// Violated invariants, "rule: detail".
    pub violations: Vec<String>,
    /// Mismatches of the shadow runs.
    pub cross_checks: Vec<String>,
    /// Target logits per `(req_id, sample index in the row)`: what a cross-backend
    /// replay needs to tell a near-tie from a real token difference.
    pub target_logits: BTreeMap<(u64, usize), Vec<f32>>,
    /// The drafter's own logits per `(req_id, draft index)`.
    pub draft_logits: BTreeMap<(u64, usize), Vec<f32>>,
    /// Whether a row's drafts chain (multi-step: draft k + 1 is drafted from draft k),
    /// so a draft after a differing one differs as a consequence. DFlash drafts a block
    /// at once: each draft stands alone.
    pub drafts_chain: bool,
    /// The replay's armed fault switches that changed what this step computed.
    pub faults_fired: specmla_core::fault::Faults,
}

/// An engine error at `step` on `B`: the environment's or a failed replay.
fn engine_error<B: Backend>(step: u64, e: EngineError<B::Error>) -> ReplayError {
    match &e {
        EngineError::Backend(b) if B::is_environment(b) => {
            ReplayError::Environment(format!("--backend {}: step {step}: {e}", B::KIND))
        }
        _ => ReplayError::Engine {
            step,
            message: e.to_string(),
        },
    }
}

/// Grammar automata of the trace's requests, their recorded states, and the drafter's
/// probabilities from the previous replayed step.
#[derive(Default)]
struct ReplayContext {
    automata: BTreeMap<u64, Arc<TokenAutomaton>>,
    states: BTreeMap<u64, u32>,
    draft_probs: BTreeMap<u64, Vec<Vec<f32>>>,
}

impl BatchContext for ReplayContext {
    fn grammar(&self, req_id: u64) -> Option<(&TokenAutomaton, GrammarState)> {
        let a = self.automata.get(&req_id)?;
        Some((a, GrammarState::Live(*self.states.get(&req_id)?)))
    }
    fn draft_probs(&self, req_id: u64) -> &[Vec<f32>] {
        self.draft_probs.get(&req_id).map_or(&[], |p| p.as_slice())
    }
}

/// Forces exactly the drafts the recording forced.
struct RecordedOracle(BTreeMap<(u64, u64), u32>);

impl DraftOracle for RecordedOracle {
    fn forced_draft(&mut self, q: DraftQuery<'_>) -> Option<u32> {
        self.0.get(&(q.req_id, q.position as u64)).copied()
    }
}

/// An executor rebuilt from a trace header, on backend `B` (the CPU unless told).
pub struct Replayer<B: Backend = CpuBackend> {
    exec: Executor<B>,
    ctx: ReplayContext,
    tensors: bool,
    device: String,
    kernels: String,
    bf16_compute: bool,
}

impl Replayer<CpuBackend> {
    /// Rebuilds config, weights and caches from `header` on the CPU backend, with
    /// `faults` switched on (replacing the recorded ones).
    pub fn new(header: &TraceHeader, faults: Faults) -> Result<Self, ReplayError> {
        Self::with_backend(header, faults, cpu_backend)
    }
}

impl<B: Backend> Replayer<B> {
    /// [`Replayer::new`] on the backend `make` builds from the trace's config and the
    /// seed's weights. A backend that cannot be created is
    /// [`ReplayError::Environment`], `--backend KIND: reason`.
    pub fn with_backend(
        header: &TraceHeader,
        faults: Faults,
        make: impl FnOnce(&EngineConfig, Arc<TargetModel>, Arc<DrafterModel>) -> Result<B, B::Error>,
    ) -> Result<Self, ReplayError> {
        let mut cfg = parse_config(header)?;
        check_host_memory::<B>(&cfg)
            .map_err(|e| ReplayError::Config(format!("the trace's {e}")))?;
        B::check_dims(&cfg.model)
            .map_err(|e| ReplayError::Environment(format!("--backend {}: {e}", B::KIND)))?;
        cfg.faults = faults;
        // The weights the recording ran with: drawn from the seed, and rounded to bf16
        // where the cache is bf16, exactly as `sim` draws them.
        let (target, drafter) = specmla_sim::runner::models(&cfg, header.seed);
        // The recording's shadow checks are not in the header, so the replay always runs
        // both: they are sound (idempotent KV writes) and only add evidence.
        let multi_step = cfg.spec.method == SpecMethod::MultiStep;
        let opts = EngineOptions {
            seed: header.seed,
            check_layouts: true,
            check_drafter_batches: multi_step,
            full_outputs: header.trace_tensors,
        };
        let vocab = cfg.model.vocab_size;
        let backend = make(&cfg, target, drafter)
            .map_err(|e| ReplayError::Environment(format!("--backend {}: {e}", B::KIND)))?;
        let device = backend.device_name();
        let (kernels, bf16_compute) = (backend.kernels(), backend.bf16_compute());
        let exec = Executor::new(cfg, opts, backend).map_err(|e| engine_error::<B>(0, e))?;
        let automata = header
            .workload
            .iter()
            .filter_map(|r| Some((r.id, grammar_from_seed(vocab, r.grammar_seed?).automaton)))
            .collect();
        Ok(Self {
            exec,
            ctx: ReplayContext {
                automata,
                ..Default::default()
            },
            tensors: header.trace_tensors,
            device,
            kernels,
            bf16_compute,
        })
    }

    /// The replay backend's kernel fingerprint (`Backend::kernels`).
    pub fn kernels(&self) -> &str {
        &self.kernels
    }

    /// Whether the replay backend's attention rounds to bf16 (`Backend::bf16_compute`).
    pub fn bf16_compute(&self) -> bool {
        self.bf16_compute
    }

    /// The device the replay runs on, for reports.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// The config the replay runs.
    pub fn config(&self) -> &EngineConfig {
        self.exec.config()
    }

    /// Re-executes one recorded step and returns its fresh record.
    pub fn step(&mut self, rec: &StepRecord) -> Result<StepRecord, ReplayError> {
        Ok(self.step_checked(rec)?.0)
    }

    /// [`Replayer::step`], also returning what the replayed step's own checks found:
    /// violated invariants and cross-check mismatches (the other row layout, the other
    /// drafter batch mode).
    pub fn step_checked(
        &mut self,
        rec: &StepRecord,
    ) -> Result<(StepRecord, StepFindings), ReplayError> {
        let batch = to_batch(rec, self.exec.config())?;
        let vocab = self.exec.config().model.vocab_size;
        if rec.forced_drafts.iter().any(|f| f.token as usize >= vocab) {
            return Err(ReplayError::BadRecord {
                step: rec.step,
                reason: "a forced draft is outside the vocabulary".into(),
            });
        }
        for r in &rec.rows {
            let states = self
                .ctx
                .automata
                .get(&r.req_id)
                .map_or(0, |a| a.num_states as u32);
            if r.grammar_state.is_some_and(|s| s >= states) {
                return Err(ReplayError::BadRecord {
                    step: rec.step,
                    reason: format!("request {} has an unknown grammar state", r.req_id),
                });
            }
            match r.grammar_state {
                Some(s) => self.ctx.states.insert(r.req_id, s),
                None => self.ctx.states.remove(&r.req_id),
            };
        }
        let forced = rec
            .forced_drafts
            .iter()
            .map(|f| ((f.req_id, f.position), f.token))
            .collect();
        let mut oracle = RecordedOracle(forced);
        let out = self
            .exec
            .execute(batch, &self.ctx, &mut oracle)
            .map_err(|e| engine_error::<B>(rec.step, e))?;
        for (row, probs) in out.plan.rows.iter().zip(&out.proposal_probs) {
            self.ctx.draft_probs.insert(row.req_id, probs.clone());
        }
        let forced: Vec<(u64, usize, u32)> = rec
            .forced_drafts
            .iter()
            .map(|f| (f.req_id, f.position as usize, f.token))
            .collect();
        let findings = StepFindings {
            violations: out
                .violations
                .iter()
                .map(|v| format!("{}: {}", v.rule.name(), v.detail))
                .collect(),
            cross_checks: out
                .layout_mismatches
                .iter()
                .map(|id| format!("request {id}: decode-first and extend-first layouts differ"))
                .chain(out.drafter_mismatches.iter().map(|m| {
                    format!(
                        "request {}: padded and compacted drafters propose {:?} vs {:?}",
                        m.req_id, m.primary, m.shadow
                    )
                }))
                .collect(),
            target_logits: target_logits(&out),
            draft_logits: draft_logits(&out, self.exec.config().spec.k()),
            drafts_chain: self.exec.config().spec.method == SpecMethod::MultiStep,
            faults_fired: out.faults_fired,
        };
        Ok((step_record(&out, &forced, self.tensors), findings))
    }
}

fn target_logits(out: &StepOutcome) -> BTreeMap<(u64, usize), Vec<f32>> {
    let mut m = BTreeMap::new();
    for (r, row) in out.plan.rows.iter().enumerate() {
        for (i, s) in out.plan.row_samples(r).enumerate() {
            m.insert((row.req_id, i), out.target.logits_row(s).to_vec());
        }
    }
    m
}

/// The drafter's logits behind each proposal, as the executor chose from them: the
/// primary multi-step run's output `p`, row `r`, is planned row `r`'s draft `p` (the
/// other batch mode's shadow passes are a check, and their outputs are not kept); DFlash
/// row `r`'s drafts `0..k` come from output rows `r * k ..`.
fn draft_logits(out: &StepOutcome, k: usize) -> BTreeMap<(u64, usize), Vec<f32>> {
    let mut m = BTreeMap::new();
    let rows = out.plan.rows.iter().enumerate();
    if out.dflash.is_some() {
        if let Some(o) = out.drafter_outputs.first() {
            for (r, row) in rows {
                for j in 0..k {
                    let i = r * k + j;
                    if (i + 1) * o.vocab_size <= o.logits.len() {
                        m.insert((row.req_id, j), o.logits_row(i).to_vec());
                    }
                }
            }
        }
        return m;
    }
    for (r, row) in rows {
        for (p, o) in out.drafter_outputs.iter().enumerate() {
            if (r + 1) * o.vocab_size <= o.logits.len() {
                m.insert((row.req_id, p), o.logits_row(r).to_vec());
            }
        }
    }
    m
}

/// The engine config stored in a trace header.
pub fn parse_config(header: &TraceHeader) -> Result<EngineConfig, ReplayError> {
    let cfg: EngineConfig = serde_json::from_str(&header.config_json)
        .map_err(|e| ReplayError::Config(e.to_string()))?;
    cfg.validate()?;
    Ok(cfg)
}

/// The scheduled batch of a record, checked against the config so a damaged record is a
/// clear error rather than a panic deep in the backend.
/// Checks that a record could have come from a run of `cfg` (the header's config): the
/// plan order is a permutation of its rows, every per-row vector has a row each, one
/// layer digest per model layer with one digest per row, and recorded tensors of the
/// model's widths. A record that fails is a trace that disagrees with its own header
/// (exit 2), not a divergence. Checked on a trace as read, before its replay (a
/// bisection's candidates, restricted to fewer requests, are re-recorded first).
pub fn check_record_shape(rec: &StepRecord, cfg: &EngineConfig) -> Result<(), ReplayError> {
    let bad = |reason: String| ReplayError::BadRecord {
        step: rec.step,
        reason: format!("disagrees with the header's config: {reason}"),
    };
    let n = rec.rows.len();
    let mut seen = vec![false; n];
    for &i in &rec.order {
        match seen.get_mut(i as usize) {
            Some(s) if !*s => *s = true,
            _ => {
                return Err(bad(format!(
                    "plan order {:?} is not a permutation of {n} rows",
                    rec.order
                )))
            }
        }
    }
    let lens = [
        ("plan order", rec.order.len()),
        ("sampled", rec.sampled.len()),
        ("num_accepted", rec.num_accepted.len()),
        ("new_tokens", rec.new_tokens.len()),
        ("proposals", rec.proposals.len()),
    ];
    if let Some((what, len)) = lens.iter().find(|(_, len)| *len != n) {
        return Err(bad(format!("{len} entries of {what} for {n} rows")));
    }
    let m = &cfg.model;
    // An empty step (a data-parallel rank's dummy step) runs no target forward.
    if n == 0 {
        return Ok(());
    }
    if rec.layers.len() != m.num_layers {
        return Err(bad(format!(
            "{} layer digests, the model has {} layers",
            rec.layers.len(),
            m.num_layers
        )));
    }
    if let Some(l) = rec.layers.iter().find(|l| l.per_row.len() != n) {
        return Err(bad(format!(
            "layer {} has {} row digests for {n} rows",
            l.layer,
            l.per_row.len()
        )));
    }
    let Some(t) = &rec.tensors else {
        return Ok(());
    };
    let tokens: u64 = rec.rows.iter().map(|r| r.num_scheduled_tokens).sum();
    let width = (m.num_heads * m.v_head_dim) as u64;
    if t.attn_outputs.len() != m.num_layers
        || t.attn_outputs
            .iter()
            .any(|a| a.len() as u64 != tokens * width)
    {
        return Err(bad(format!(
            "attention outputs are not {} layers of {tokens} tokens x {width} values",
            m.num_layers
        )));
    }
    let samples: u64 = rec
        .rows
        .iter()
        .filter(|r| r.samples)
        .map(|r| 1 + r.num_draft_tokens)
        .sum();
    if t.logits.len() as u64 != samples * m.vocab_size as u64 {
        return Err(bad(format!(
            "{} logits for {samples} sampled positions of a vocabulary of {}",
            t.logits.len(),
            m.vocab_size
        )));
    }
    Ok(())
}

fn to_batch(rec: &StepRecord, cfg: &EngineConfig) -> Result<ScheduledBatch, ReplayError> {
    let bad = |reason: String| ReplayError::BadRecord {
        step: rec.step,
        reason,
    };
    let s = &cfg.scheduler;
    let mut rows = Vec::with_capacity(rec.rows.len());
    for (i, r) in rec.rows.iter().enumerate() {
        let q = r.num_scheduled_tokens as usize;
        let c = r.num_computed_tokens as usize;
        let prompt = r.num_prompt_tokens as usize;
        if prompt == 0 || prompt >= s.max_model_len {
            return Err(bad(format!(
                "row {i}: a prompt of {prompt} tokens (must be 1..{})",
                s.max_model_len
            )));
        }
        if q == 0 || r.token_ids.len() != q || r.num_draft_tokens as usize >= q {
            return Err(bad(format!(
                "row {i}: q_len {q} does not match its {} tokens",
                r.token_ids.len()
            )));
        }
        if c > s.max_model_len
            || q > s.max_model_len - c
            || r.block_ids.iter().any(|&b| b as usize >= s.num_gpu_blocks)
        {
            return Err(bad(format!(
                "row {i}: positions or blocks outside the config"
            )));
        }
        if r.block_ids.len() * s.page_size < c + q
            || r.token_ids
                .iter()
                .any(|&t| t as usize >= cfg.model.vocab_size)
        {
            return Err(bad(format!(
                "row {i}: blocks do not cover its tokens, or a token is outside the vocabulary"
            )));
        }
        if r.next_prompt_token
            .is_some_and(|t| t as usize >= cfg.model.vocab_size)
        {
            return Err(bad(format!(
                "row {i}: its next prompt token is outside the vocabulary"
            )));
        }
        if !r.samples && r.next_prompt_token.is_none() {
            return Err(bad(format!(
                "row {i}: a partial chunk without its next prompt token"
            )));
        }
        rows.push(ScheduledRow {
            req_id: r.req_id,
            num_computed_tokens: c,
            num_prompt_tokens: prompt,
            num_scheduled_tokens: q,
            token_ids: r.token_ids.clone(),
            num_draft_tokens: r.num_draft_tokens as usize,
            samples: r.samples,
            next_prompt_token: r.next_prompt_token,
            block_ids: r.block_ids.clone(),
            req_state_idx: r.req_state_idx as usize,
        });
    }
    if has_duplicates(rows.iter().map(|r| r.req_id)) || rows.len() > s.max_num_seqs {
        return Err(bad("a request appears twice, or too many rows".into()));
    }
    if has_duplicates(rows.iter().map(|r| r.req_state_idx)) {
        return Err(bad("two rows share a request-state slot".into()));
    }
    Ok(ScheduledBatch {
        step: rec.step,
        rows,
        preempted: rec.preempted.clone(),
    })
}

/// Whether any value of `v` appears twice.
fn has_duplicates<T: Ord>(v: impl Iterator<Item = T>) -> bool {
    let mut v: Vec<T> = v.collect();
    v.sort_unstable();
    v.windows(2).any(|w| w[0] == w[1])
}
