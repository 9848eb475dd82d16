//! The engine step loop (RULES §3), generic over a [`Backend`]: schedule, plan,
//! check invariants, target forward, verify, drafter, commit. Optional shadow runs check
//! that the other row layout and the other drafter batch mode give identical results.

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, DrafterOutput, TargetOutput};
use crate::batch::ScheduledBatch;
use crate::config::{DrafterBatch, EngineConfig, RowLayout, SpecMethod};
use crate::cudagraph::{capture_sizes, graph_shapes};
use crate::drafter::{dflash_pass, first_pass, next_pass, DFlashPass, DrafterPass, RowOutcome};
use crate::fault::Faults;
use crate::fired;
use crate::grammar::{masked_argmax, GrammarState, TokenAutomaton};
use crate::graph_buffers::{dummy_step, DummyStep, GraphBuffers, RequestStateTables};
use crate::invariants::{self, Violation};
use crate::plan::{build_step_plan, PlanError, StepPlan};
use crate::request::RequestSpec;
use crate::rng::{keyed_rng, Stream};
use crate::scheduler::{Commit, FinishedRequest, Scheduler};
use crate::verify::{probs, sample, verify_greedy, verify_rejection, RowVerify};

/// Which shadow checks run each step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineOptions {
    /// Also run the target with the other row layout and compare bit for bit.
    pub check_layouts: bool,
    /// Also run the multi-step drafter with the other batch mode and compare proposals.
    pub check_drafter_batches: bool,
    /// Seed for sampling decisions (temperature > 0).
    pub seed: u64,
    /// Have the backend return every forward's full tensors (hidden states, attention
    /// outputs), for traces that store them; otherwise only logits and digests.
    pub full_outputs: bool,
}

/// A draft position the acceptance controller may force: the token at `position` of a
/// request whose sequence this step ends with `suffix` (new tokens then earlier drafts),
/// the row's draft number `draft_index` (0 for its first draft).
#[derive(Clone, Copy, Debug)]
pub struct DraftQuery<'a> {
    pub req_id: u64,
    pub position: usize,
    pub draft_index: usize,
    pub suffix: &'a [u32],
}

/// Controls acceptance in simulation by forcing some draft tokens (e.g. the greedy
/// token of an oracle with a seeded probability). Under temperature > 0 a forced draft
/// must be a draw from the target's own distribution: the engine then takes its q to be
/// p, so rejection sampling accepts it. Must be deterministic: the same query after the
/// same history of steps gives the same answer, whatever the batch.
pub trait DraftOracle {
    fn forced_draft(&mut self, query: DraftQuery<'_>) -> Option<u32>;
}

/// No forcing: the drafter's own argmax is proposed.
pub struct NoOracle;

impl DraftOracle for NoOracle {
    fn forced_draft(&mut self, _: DraftQuery<'_>) -> Option<u32> {
        None
    }
}

/// A proposal that differed between the padded and compacted drafter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrafterMismatch {
    pub req_id: u64,
    pub primary: Vec<u32>,
    pub shadow: Vec<u32>,
}

/// Everything one step did, for checkers and recorders.
#[derive(Clone, Debug)]
pub struct StepOutcome {
    pub batch: ScheduledBatch,
    /// Per scheduled row: the request's committed grammar state before this step.
    pub grammar_states: Vec<Option<GrammarState>>,
    pub plan: StepPlan,
    pub target: TargetOutput,
    /// Per planned row: the verification of a sampling row.
    pub verifies: Vec<Option<RowVerify>>,
    pub outcomes: Vec<RowOutcome>,
    /// Per planned row: drafts proposed for the next step.
    pub proposals: Vec<Vec<u32>>,
    /// Per planned row: the drafter's probabilities for each proposal (temperature > 0).
    pub proposal_probs: Vec<Vec<Vec<f32>>>,
    pub drafter_passes: Vec<DrafterPass>,
    /// The primary drafter's output of every pass (or the DFlash pass): its own logits
    /// and hidden states, before any draft was forced.
    pub drafter_outputs: Vec<DrafterOutput>,
    pub dflash: Option<DFlashPass>,
    /// The dummy step an idle data-parallel rank ran instead (an empty batch).
    pub dummy: Option<DummyStep>,
    pub violations: Vec<Violation>,
    /// Requests whose outputs differed under the other row layout.
    pub layout_mismatches: Vec<u64>,
    pub drafter_mismatches: Vec<DrafterMismatch>,
    pub finished: Vec<FinishedRequest>,
    /// The armed fault switches that changed what this step computed (`fired`).
    pub faults_fired: Faults,
}

/// Why a step could not run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError<E: std::error::Error + 'static> {
    #[error("backend: {0}")]
    Backend(#[source] E),
    #[error("plan: {0}")]
    Plan(PlanError),
    #[error("scheduler stalled at step {0}: requests remain but nothing could be scheduled")]
    Stalled(u64),
}

impl<E: std::error::Error + 'static> From<PlanError> for EngineError<E> {
    fn from(e: PlanError) -> Self {
        EngineError::Plan(e)
    }
}

/// What a batch needs from the requests behind it: grammar state and the drafter's
/// probabilities for the drafts being verified. The scheduler provides it while
/// running; a replay provides it from the trace.
pub trait BatchContext {
    /// The request's grammar and its committed state.
    fn grammar(&self, req_id: u64) -> Option<(&TokenAutomaton, GrammarState)>;
    /// The drafter's probabilities for the request's drafts (temperature > 0 only).
    fn draft_probs(&self, req_id: u64) -> &[Vec<f32>];
}

impl BatchContext for Scheduler {
    fn grammar(&self, req_id: u64) -> Option<(&TokenAutomaton, GrammarState)> {
        let g = self.request(req_id)?.grammar.as_ref()?;
        Some((&*g.automaton, g.state))
    }
    fn draft_probs(&self, req_id: u64) -> &[Vec<f32>] {
        self.request(req_id).map_or(&[], |r| &r.draft_probs)
    }
}

/// Executes scheduled batches on a backend: plan, invariants, target forward, verify,
/// drafter. Holds no request state, so a replay can drive it with recorded batches.
pub struct Executor<B: Backend> {
    cfg: EngineConfig,
    opts: EngineOptions,
    backend: B,
    capture_sizes: Vec<usize>,
    /// What the captured graphs read, persistent across steps.
    graph_buffers: GraphBuffers,
    /// Per-request block tables by request-state slot, persistent across steps.
    state_tables: RequestStateTables,
}

/// The engine: one scheduler feeding one executor.
pub struct Engine<B: Backend> {
    exec: Executor<B>,
    scheduler: Scheduler,
}

type StepResult<T, B> = Result<T, EngineError<<B as Backend>::Error>>;

impl<B: Backend> Executor<B> {
    /// Captures the graphs of `cfg` on `backend`. `cfg` must have passed validation.
    pub fn new(cfg: EngineConfig, opts: EngineOptions, mut backend: B) -> StepResult<Self, B> {
        let shapes = graph_shapes(&cfg);
        backend.set_full_outputs(opts.full_outputs);
        backend
            .capture_graphs(&shapes)
            .map_err(EngineError::Backend)?;
        let capture_sizes = capture_sizes(&cfg);
        Ok(Self {
            graph_buffers: GraphBuffers::captured(&cfg, &shapes),
            state_tables: RequestStateTables::default(),
            cfg,
            opts,
            backend,
            capture_sizes,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }
    pub fn backend(&self) -> &B {
        &self.backend
    }
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }
    pub fn capture_sizes(&self) -> &[usize] {
        &self.capture_sizes
    }

    /// Executes one scheduled batch; nothing is committed (`finished` is empty).
    pub fn execute(
        &mut self,
        batch: ScheduledBatch,
        ctx: &dyn BatchContext,
        oracle: &mut dyn DraftOracle,
    ) -> StepResult<StepOutcome, B> {
        let mut plan = self.plan(&batch, self.cfg.scheduler.row_layout, ctx)?;
        if batch.rows.is_empty() {
            let mut out = empty_outcome(batch, plan);
            out.dummy = dummy_step(&self.cfg, &self.state_tables);
            if let Some(d) = &out.dummy {
                out.violations = invariants::check_dummy_step(&self.cfg, out.plan.step, d);
            }
            out.faults_fired =
                fired::fired_in_dummy_step(&self.cfg, &self.state_tables, out.dummy.as_ref());
            return Ok(out);
        }
        // Only a data-parallel rank's dummy step reads them.
        if self.cfg.dp_peer_num_tokens > 0 {
            self.state_tables.write(&self.cfg, &batch, self.opts.seed);
        }
        // The other layout replays from the same buffer contents, and an armed fault is
        // judged against them too.
        let armed = self.cfg.faults != Faults::none();
        let buffers_before = (self.opts.check_layouts || armed).then(|| self.graph_buffers.clone());
        let fault_buffers = buffers_before.clone().filter(|_| armed);
        self.graph_buffers
            .write_step(&self.cfg, &mut plan, self.opts.seed);
        let mut violations = self.check_plan(&batch, &plan, ctx);
        let shadow = self.shadow_layout(&batch, &plan, buffers_before, ctx, &mut violations)?;
        let target = self
            .backend
            .forward_target(&plan)
            .map_err(EngineError::Backend)?;
        let layout_mismatches = shadow
            .map(|(alt, alt_out)| compare_layouts(&plan, &target, &alt, &alt_out))
            .unwrap_or_default();
        let (verifies, outcomes) = self.verify(&plan, &target, ctx);
        let drafts = self.draft(&plan, &target, &verifies, &outcomes, oracle)?;
        for p in &drafts.passes {
            violations.extend(invariants::check_drafter_pass(
                &self.cfg, &batch, &plan, &outcomes, p,
            ));
        }
        if let Some(d) = &drafts.dflash {
            violations.extend(invariants::check_dflash(
                &self.cfg, &batch, &plan, &outcomes, d,
            ));
        }
        let faults_fired = match &fault_buffers {
            Some(before) => {
                let a = fired::StepArtifacts {
                    batch: &batch,
                    plan: &plan,
                    buffers_before: before,
                    outcomes: &outcomes,
                    passes: &drafts.passes,
                    dflash: drafts.dflash.as_ref(),
                };
                let lookup = |id: u64| ctx.grammar(id);
                fired::fired_in_step(&self.cfg, self.opts.seed, &a, &lookup)
            }
            None => Faults::none(),
        };
        let grammar_states = batch
            .rows
            .iter()
            .map(|r| ctx.grammar(r.req_id).map(|g| g.1))
            .collect();
        Ok(StepOutcome {
            batch,
            grammar_states,
            plan,
            target,
            verifies,
            outcomes,
            proposals: drafts.proposals,
            proposal_probs: drafts.probs,
            drafter_passes: drafts.passes,
            drafter_outputs: drafts.outputs,
            dflash: drafts.dflash,
            dummy: None,
            violations,
            layout_mismatches,
            drafter_mismatches: drafts.mismatches,
            finished: Vec::new(),
            faults_fired,
        })
    }

    /// Builds the plan of `batch` with `layout`.
    pub fn plan(
        &self,
        batch: &ScheduledBatch,
        layout: RowLayout,
        ctx: &dyn BatchContext,
    ) -> Result<StepPlan, PlanError> {
        let lookup = |id: u64| ctx.grammar(id);
        build_step_plan(&self.cfg, batch, &self.capture_sizes, layout, &lookup)
    }

    /// Every plan-level invariant, grammar masks included.
    fn check_plan(
        &self,
        batch: &ScheduledBatch,
        plan: &StepPlan,
        ctx: &dyn BatchContext,
    ) -> Vec<Violation> {
        let lookup = |id: u64| ctx.grammar(id);
        let mut v = invariants::check_plan(&self.cfg, batch, plan, &self.capture_sizes);
        v.extend(invariants::check_grammar_masks(batch, plan, &lookup));
        v
    }

    /// Runs the other layout before the primary (KV writes are idempotent: the same
    /// values land in the same slots, and the primary's land last). Returns the other
    /// plan and its output for a bit-for-bit comparison with the primary's.
    fn shadow_layout(
        &mut self,
        batch: &ScheduledBatch,
        plan: &StepPlan,
        buffers: Option<GraphBuffers>,
        ctx: &dyn BatchContext,
        violations: &mut Vec<Violation>,
    ) -> StepResult<Option<(StepPlan, TargetOutput)>, B> {
        let Some(mut buffers) = buffers else {
            return Ok(None);
        };
        let other = match plan.layout {
            RowLayout::DecodeFirst => RowLayout::ExtendFirst,
            RowLayout::ExtendFirst => RowLayout::DecodeFirst,
        };
        let mut alt = self.plan(batch, other, ctx)?;
        buffers.write_step(&self.cfg, &mut alt, self.opts.seed);
        violations.extend(self.check_plan(batch, &alt, ctx));
        self.backend.set_check_forwards(true);
        let alt_out = self.backend.forward_target(&alt);
        self.backend.set_check_forwards(false);
        Ok(Some((alt, alt_out.map_err(EngineError::Backend)?)))
    }

    fn verify(
        &self,
        plan: &StepPlan,
        target: &TargetOutput,
        ctx: &dyn BatchContext,
    ) -> (Vec<Option<RowVerify>>, Vec<RowOutcome>) {
        let mut verifies = Vec::with_capacity(plan.rows.len());
        let mut outcomes = Vec::with_capacity(plan.rows.len());
        for (r, row) in plan.rows.iter().enumerate() {
            if !row.samples {
                verifies.push(None);
                outcomes.push(RowOutcome {
                    valid: row.query_len,
                    next_token: row
                        .next_prompt_token
                        .expect("a non-sampling row is a partial prefill"),
                    num_rejected: 0,
                });
                continue;
            }
            let v = self.verify_row(plan, target, r, ctx);
            let nd = row.num_draft_tokens;
            outcomes.push(RowOutcome {
                valid: row.query_len - nd + v.num_accepted,
                next_token: *v.new_tokens.last().expect("bonus token"),
                num_rejected: nd - v.num_accepted,
            });
            verifies.push(Some(v));
        }
        (verifies, outcomes)
    }

    fn verify_row(
        &self,
        plan: &StepPlan,
        target: &TargetOutput,
        r: usize,
        ctx: &dyn BatchContext,
    ) -> RowVerify {
        let row = &plan.rows[r];
        let samples = plan.row_samples(r);
        let end = plan.common.query_start_loc[r + 1] as usize;
        let drafts = &plan.token_ids[end - row.num_draft_tokens..end];
        let logits: Vec<&[f32]> = samples.clone().map(|i| target.logits_row(i)).collect();
        let masks: Vec<_> = samples.map(|i| plan.grammar_masks[i].as_ref()).collect();
        let temperature = self.cfg.spec.temperature;
        if temperature == 0.0 {
            return verify_greedy(row.req_id, drafts, &logits, &masks);
        }
        let target_probs: Vec<Vec<f32>> = logits
            .iter()
            .zip(&masks)
            .map(|(l, m)| probs(l, temperature, *m))
            .collect();
        let position = (row.num_computed_tokens + row.query_len - row.num_draft_tokens) as u64;
        let mut rng = keyed_rng(self.opts.seed, Stream::Verify, row.req_id, position);
        let draft_probs = ctx.draft_probs(row.req_id);
        // Drafts without recorded probabilities (none should exist) verify greedily.
        if draft_probs.len() < drafts.len() {
            return verify_greedy(row.req_id, drafts, &logits, &masks);
        }
        verify_rejection(row.req_id, drafts, &target_probs, draft_probs, &mut rng)
    }
}

impl<B: Backend> Engine<B> {
    /// Builds the engine and captures the graphs. `cfg` must have passed validation.
    pub fn new(
        cfg: EngineConfig,
        opts: EngineOptions,
        workload: Vec<RequestSpec>,
        backend: B,
    ) -> StepResult<Self, B> {
        let scheduler = Scheduler::new(cfg.clone(), workload);
        Ok(Self {
            exec: Executor::new(cfg, opts, backend)?,
            scheduler,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.exec.cfg
    }
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }
    pub fn backend(&self) -> &B {
        &self.exec.backend
    }
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.exec.backend
    }
    pub fn capture_sizes(&self) -> &[usize] {
        &self.exec.capture_sizes
    }

    /// Builds the plan of `batch` with `layout` against the live requests.
    pub fn plan(&self, batch: &ScheduledBatch, layout: RowLayout) -> Result<StepPlan, PlanError> {
        self.exec.plan(batch, layout, &self.scheduler)
    }

    /// Runs one step; `None` once every request has finished.
    pub fn step(&mut self, oracle: &mut dyn DraftOracle) -> StepResult<Option<StepOutcome>, B> {
        if self.scheduler.is_done() {
            return Ok(None);
        }
        let batch = self.scheduler.schedule();
        if batch.rows.is_empty() && self.scheduler.requests().next().is_some() {
            return Err(EngineError::Stalled(batch.step));
        }
        let mut out = self.exec.execute(batch, &self.scheduler, oracle)?;
        self.commit(&out);
        out.finished = self.scheduler.take_finished();
        Ok(Some(out))
    }

    fn commit(&mut self, o: &StepOutcome) {
        let commits: Vec<Commit> = o
            .plan
            .rows
            .iter()
            .zip(&o.verifies)
            .map(|(row, v)| Commit {
                req_id: row.req_id,
                num_scheduled_tokens: row.query_len,
                num_draft_tokens: row.num_draft_tokens,
                new_tokens: v.as_ref().map(|v| v.new_tokens.clone()).unwrap_or_default(),
            })
            .collect();
        self.scheduler.commit(&commits);
        for (r, row) in o.plan.rows.iter().enumerate() {
            if row.samples && o.proposals.get(r).is_some_and(|p| !p.is_empty()) {
                let p = o.proposal_probs.get(r).cloned().unwrap_or_default();
                self.scheduler
                    .set_drafts(row.req_id, o.proposals[r].clone(), p);
            }
        }
    }
}

fn empty_outcome(batch: ScheduledBatch, plan: StepPlan) -> StepOutcome {
    StepOutcome {
        batch,
        grammar_states: Vec::new(),
        plan,
        target: TargetOutput::default(),
        verifies: Vec::new(),
        outcomes: Vec::new(),
        proposals: Vec::new(),
        proposal_probs: Vec::new(),
        drafter_passes: Vec::new(),
        drafter_outputs: Vec::new(),
        dflash: None,
        dummy: None,
        violations: Vec::new(),
        layout_mismatches: Vec::new(),
        drafter_mismatches: Vec::new(),
        finished: Vec::new(),
        faults_fired: Faults::none(),
    }
}

/// Requests whose logits or hidden states differ between two layouts of one batch.
fn compare_layouts(
    plan: &StepPlan,
    out: &TargetOutput,
    alt: &StepPlan,
    alt_out: &TargetOutput,
) -> Vec<u64> {
    let mut bad = Vec::new();
    for (r, row) in plan.rows.iter().enumerate() {
        let Some(a) = alt.rows.iter().position(|x| x.req_id == row.req_id) else {
            bad.push(row.req_id);
            continue;
        };
        let same_logits = plan
            .row_samples(r)
            .zip(alt.row_samples(a))
            .all(|(i, j)| bits_eq(out.logits_row(i), alt_out.logits_row(j)));
        let same_hidden = plan
            .common
            .row_tokens(r)
            .zip(alt.common.row_tokens(a))
            .all(|(i, j)| out.hidden_digests.get(i) == alt_out.hidden_digests.get(j));
        if !same_logits || !same_hidden {
            bad.push(row.req_id);
        }
    }
    bad
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Drafter results of one step.
/// One run of the multi-step drafter.
struct DraftRun {
    proposals: Vec<Vec<u32>>,
    probs: Vec<Vec<Vec<f32>>>,
    passes: Vec<DrafterPass>,
    outputs: Vec<DrafterOutput>,
}

struct Drafts {
    proposals: Vec<Vec<u32>>,
    probs: Vec<Vec<Vec<f32>>>,
    passes: Vec<DrafterPass>,
    dflash: Option<DFlashPass>,
    mismatches: Vec<DrafterMismatch>,
    /// The primary run's output of every pass (the drafter's own logits and hidden).
    outputs: Vec<DrafterOutput>,
}

impl<B: Backend> Executor<B> {
    fn draft(
        &mut self,
        plan: &StepPlan,
        target: &TargetOutput,
        verifies: &[Option<RowVerify>],
        outcomes: &[RowOutcome],
        oracle: &mut dyn DraftOracle,
    ) -> StepResult<Drafts, B> {
        let mut d = Drafts {
            proposals: Vec::new(),
            probs: Vec::new(),
            passes: Vec::new(),
            dflash: None,
            mismatches: Vec::new(),
            outputs: Vec::new(),
        };
        match self.cfg.spec.method {
            SpecMethod::Off => {}
            SpecMethod::DFlash => {
                let pass = dflash_pass(&self.cfg, plan, outcomes);
                let out = self
                    .backend
                    .forward_dflash(&pass, target)
                    .map_err(EngineError::Backend)?;
                (d.proposals, d.probs) = self.choose_dflash(plan, verifies, &pass, &out, oracle);
                d.dflash = Some(pass);
                d.outputs.push(out);
            }
            SpecMethod::MultiStep => {
                let primary = self.cfg.spec.drafter_batch;
                if self.opts.check_drafter_batches {
                    let other = match primary {
                        DrafterBatch::Padded => DrafterBatch::Compacted,
                        DrafterBatch::Compacted => DrafterBatch::Padded,
                    };
                    self.backend.set_check_forwards(true);
                    let shadow =
                        self.run_multistep(plan, target, verifies, outcomes, other, oracle);
                    self.backend.set_check_forwards(false);
                    let shadow = shadow?;
                    d.passes.extend(shadow.passes);
                    let run =
                        self.run_multistep(plan, target, verifies, outcomes, primary, oracle)?;
                    d.mismatches = drafter_mismatches(plan, &run.proposals, &shadow.proposals);
                    (d.proposals, d.probs, d.outputs) = (run.proposals, run.probs, run.outputs);
                    d.passes.extend(run.passes);
                } else {
                    let run =
                        self.run_multistep(plan, target, verifies, outcomes, primary, oracle)?;
                    (d.proposals, d.probs, d.passes, d.outputs) =
                        (run.proposals, run.probs, run.passes, run.outputs);
                }
            }
        }
        Ok(d)
    }

    #[allow(clippy::type_complexity)]
    fn run_multistep(
        &mut self,
        plan: &StepPlan,
        target: &TargetOutput,
        verifies: &[Option<RowVerify>],
        outcomes: &[RowOutcome],
        mode: DrafterBatch,
        oracle: &mut dyn DraftOracle,
    ) -> StepResult<DraftRun, B> {
        let n = plan.rows.len();
        let mut outputs = Vec::with_capacity(self.cfg.spec.k());
        let mut proposals = vec![Vec::new(); n];
        let mut probs = vec![Vec::new(); n];
        let mut passes = Vec::new();
        let mut pass = first_pass(&self.cfg, plan, outcomes, mode);
        let mut prev: Option<DrafterOutput> = None;
        for j in 0..self.cfg.spec.k() {
            let out = self
                .backend
                .forward_drafter(&pass, target, prev.as_ref())
                .map_err(EngineError::Backend)?;
            let mut tokens = Vec::with_capacity(n);
            for r in 0..n {
                let position =
                    pass.positions[pass.token_indices_to_sample[r] as usize] as usize + 2;
                let (t, p) = self.choose_draft(
                    plan,
                    verifies,
                    r,
                    position,
                    &proposals[r],
                    out.logits_row(r),
                    oracle,
                );
                tokens.push(t);
                proposals[r].push(t);
                probs[r].extend(p);
            }
            let next = (j + 1 < self.cfg.spec.k()).then(|| next_pass(&self.cfg, &pass, &tokens));
            passes.push(std::mem::replace(&mut pass, next.unwrap_or_default_pass()));
            if let Some(p) = prev.replace(out) {
                outputs.push(p);
            }
        }
        outputs.extend(prev);
        Ok(DraftRun {
            proposals,
            probs,
            passes,
            outputs,
        })
    }

    fn choose_dflash(
        &self,
        plan: &StepPlan,
        verifies: &[Option<RowVerify>],
        pass: &DFlashPass,
        out: &DrafterOutput,
        oracle: &mut dyn DraftOracle,
    ) -> (Vec<Vec<u32>>, Vec<Vec<Vec<f32>>>) {
        let k = self.cfg.spec.k();
        let mut proposals = vec![Vec::new(); plan.rows.len()];
        let mut probs = vec![Vec::new(); plan.rows.len()];
        for r in 0..plan.rows.len() {
            for i in 1..=k {
                let position = pass.block_positions[r * pass.block_len + i] as usize;
                let logits = out.logits_row(r * k + i - 1);
                let (t, p) =
                    self.choose_draft(plan, verifies, r, position, &proposals[r], logits, oracle);
                proposals[r].push(t);
                probs[r].extend(p);
            }
        }
        (proposals, probs)
    }

    /// The drafter's token for one position: its argmax (or a seeded sample when
    /// temperature > 0), unless the acceptance oracle forces one. Under temperature > 0
    /// a forced token is a draw from the target's distribution, so its proposal
    /// distribution is the target's own: an empty q, which `verify_rejection` reads as p.
    #[allow(clippy::too_many_arguments)]
    fn choose_draft(
        &self,
        plan: &StepPlan,
        verifies: &[Option<RowVerify>],
        r: usize,
        position: usize,
        earlier: &[u32],
        logits: &[f32],
        oracle: &mut dyn DraftOracle,
    ) -> (u32, Option<Vec<f32>>) {
        let temperature = self.cfg.spec.temperature;
        let req_id = plan.rows[r].req_id;
        let forced = verifies[r].as_ref().and_then(|v| {
            let mut suffix = v.new_tokens.clone();
            suffix.extend_from_slice(earlier);
            oracle.forced_draft(DraftQuery {
                req_id,
                position,
                draft_index: earlier.len(),
                suffix: &suffix,
            })
        });
        if temperature > 0.0 {
            // A forced draft was drawn from the target's own distribution: its q is p,
            // which verification reads as an empty q (`verify_rejection`).
            if let Some(t) = forced {
                return (t, Some(Vec::new()));
            }
            let p = probs(logits, temperature, None);
            let mut rng = keyed_rng(self.opts.seed, Stream::DraftSample, req_id, position as u64);
            return (sample(&p, &mut rng), Some(p));
        }
        (
            forced.unwrap_or_else(|| masked_argmax(logits, None).0),
            None,
        )
    }
}

fn drafter_mismatches(
    plan: &StepPlan,
    primary: &[Vec<u32>],
    shadow: &[Vec<u32>],
) -> Vec<DrafterMismatch> {
    plan.rows
        .iter()
        .enumerate()
        .filter(|(r, row)| row.samples && primary[*r] != shadow[*r])
        .map(|(r, row)| DrafterMismatch {
            req_id: row.req_id,
            primary: primary[r].clone(),
            shadow: shadow[r].clone(),
        })
        .collect()
}

trait UnwrapPass {
    fn unwrap_or_default_pass(self) -> DrafterPass;
}

impl UnwrapPass for Option<DrafterPass> {
    fn unwrap_or_default_pass(self) -> DrafterPass {
        self.unwrap_or_else(|| DrafterPass {
            pass: usize::MAX,
            mode: DrafterBatch::Padded,
            req_ids: Vec::new(),
            token_ids: Vec::new(),
            positions: Vec::new(),
            slot_mapping: Vec::new(),
            hidden: Vec::new(),
            query_start_loc: vec![0],
            seq_lens: Vec::new(),
            block_table: Default::default(),
            block_table_width: 0,
            token_indices_to_sample: Vec::new(),
            num_rejected: Vec::new(),
            kv_lens: Vec::new(),
            split: Default::default(),
            num_padded_tokens: 0,
            num_actual_tokens: 0,
        })
    }
}
