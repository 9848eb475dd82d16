//! `sim --step-log FILE.jsonl`: every step of a run written as an engine would log it, in
//! the step-log schema `specmla.step/1` (`specmla_core::audit::StepLog`), so `replay
//! audit` (or `specmla.audit` in Python) checks the engine's own metadata against the
//! planner's rules. The values logged are the plan's, faults included: a fault that lives
//! in planning shows in the log as an engine's bug would.

use std::io::Write;

use specmla_core::audit::{
    chunked_context_log, ChunkedContextLog, DFlashLog, DrafterPassLog, GraphLog, SpecDecodeLog,
    StepLog, STEP_LOG_SCHEMA,
};
use specmla_core::block_pool::NO_BLOCK;
use specmla_core::config::EngineConfig;
use specmla_core::config::SpecMethod;
use specmla_core::cudagraph::capture_sizes;
use specmla_core::engine::StepOutcome;
use specmla_core::plan::StepPlan;
use specmla_traces::TraceHeader;

use crate::runner::{RunError, StepSink};

/// The log line of one executed step under `cfg` (whose graphs were captured at
/// `sizes`).
pub fn step_log(cfg: &EngineConfig, sizes: &[usize], o: &StepOutcome) -> StepLog {
    let plan = &o.plan;
    let (c, m) = (&plan.common, &plan.mla);
    let rows = &o.batch.rows;
    let n = plan.rows.len();
    let multi_step = cfg.spec.method == SpecMethod::MultiStep && !o.verifies.is_empty();
    // A graph step logs its padding rows' entries too, as vLLM's padded metadata holds them.
    let padded = plan.cudagraph.map_or(n, |g| g.shape.num_rows.max(n));
    StepLog {
        decode_threshold: plan.threshold,
        require_uniform: plan.require_uniform,
        planner: plan.planner,
        num_spec_tokens: cfg.spec.k(),
        page_size: Some(cfg.scheduler.page_size),
        workspace_tokens: Some(cfg.scheduler.workspace_tokens),
        capture_sizes: Some(sizes.to_vec()),
        // The matrix decides the threshold unless the configuration overrides it.
        attention_backends: (cfg.split_override == Default::default())
            .then(|| cfg.backends.iter().map(|b| b.name().to_string()).collect()),
        num_computed_tokens: rows.iter().map(|r| r.num_computed_tokens).collect(),
        num_scheduled_tokens: rows.iter().map(|r| r.num_scheduled_tokens).collect(),
        num_prompt_tokens: rows.iter().map(|r| r.num_prompt_tokens).collect(),
        num_draft_tokens: Some(rows.iter().map(|r| r.num_draft_tokens).collect()),
        order: plan.order.clone(),
        query_start_loc: c.query_start_loc[..=padded]
            .iter()
            .map(|&x| x as usize)
            .collect(),
        seq_lens: c.seq_lens[..padded].iter().map(|&x| x as usize).collect(),
        idx_mapping: Some(plan.idx_mapping[..padded.min(plan.idx_mapping.len())].to_vec()),
        num_decodes: m.num_decodes,
        num_decode_tokens: m.num_decode_tokens,
        num_prefills: m.num_prefills,
        block_table: Some(
            (0..n)
                .map(|r| c.block_row(r).iter().map(|&b| block_id(b)).collect())
                .collect(),
        ),
        slot_mapping: Some(c.slot_mapping[..plan.num_tokens()].to_vec()),
        chunked_context: Some(chunks(plan)),
        graph: Some(graph(plan)),
        spec_decode: Some(spec_decode(plan)),
        num_rejected_tokens: Some(o.outcomes.iter().map(|r| r.num_rejected).collect()),
        drafter_batch: Some(cfg.spec.drafter_batch),
        drafter_passes: multi_step.then(|| drafter_passes(o)),
        max_model_len: Some(cfg.scheduler.max_model_len),
        dflash: o.dflash.as_ref().map(dflash),
    }
}

fn dflash(d: &specmla_core::drafter::DFlashPass) -> DFlashLog {
    let w = d.block_table_width.max(1);
    DFlashLog {
        block_len: d.block_len,
        block_table: d
            .block_table
            .chunks(w)
            .map(|row| row.iter().map(|&b| block_id(b)).collect())
            .collect(),
        block_positions: d.block_positions.iter().map(|&p| p as usize).collect(),
        block_slots: d.block_slots.clone(),
        block_indices: Some(d.block_indices.iter().map(|&i| i as usize).collect()),
    }
}

/// The primary drafter run's passes (the shadow run, a check, is left out).
fn drafter_passes(o: &StepOutcome) -> Vec<DrafterPassLog> {
    let primary = o.drafter_passes.last().map(|p| p.mode);
    o.drafter_passes
        .iter()
        .filter(|p| Some(p.mode) == primary)
        .map(|p| DrafterPassLog {
            query_start_loc: p.query_start_loc.iter().map(|&x| x as usize).collect(),
            seq_lens: p.seq_lens.iter().map(|&x| x as usize).collect(),
            num_actual_tokens: p.num_actual_tokens,
            token_indices_to_sample: p
                .token_indices_to_sample
                .iter()
                .map(|&x| x as usize)
                .collect(),
        })
        .collect()
}

fn block_id(b: u32) -> i64 {
    if b == NO_BLOCK {
        -1
    } else {
        b as i64
    }
}

fn chunks(plan: &StepPlan) -> ChunkedContextLog {
    let cc = plan
        .mla
        .prefill
        .as_ref()
        .and_then(|p| p.chunked_context.as_ref());
    chunked_context_log(cc)
}

/// The step's `BatchDescriptor`: the uniform-decode graph it replayed, or the eager
/// (piecewise) run of its real tokens.
fn graph(plan: &StepPlan) -> GraphLog {
    match &plan.cudagraph {
        Some(g) => GraphLog {
            num_tokens: g.shape.num_tokens,
            uniform: true,
            num_reqs: Some(g.shape.num_rows),
        },
        None => GraphLog {
            num_tokens: plan.num_tokens(),
            uniform: false,
            num_reqs: None,
        },
    }
}

/// The spec-decode metadata as vLLM's runner builds it from the plan: a sampling row's
/// logits indices are the plan's; a row that does not sample (a partial prefill) still
/// computes one logit at its last token, as vLLM's does, and discards it.
fn spec_decode(plan: &StepPlan) -> SpecDecodeLog {
    let mut out = SpecDecodeLog::default();
    let mut drafts = 0;
    for (r, row) in plan.rows.iter().enumerate() {
        let nd = if row.samples { row.num_draft_tokens } else { 0 };
        drafts += nd;
        out.cu_num_draft_tokens.push(drafts);
        let first = out.logits_indices.len();
        if row.samples {
            let s = plan.sample_start[r] as usize..plan.sample_start[r + 1] as usize;
            out.logits_indices
                .extend(plan.logits_indices[s].iter().map(|&i| i as usize));
        } else {
            let end = plan.common.query_start_loc[r + 1] as usize;
            out.logits_indices.push(end.saturating_sub(1));
        }
        out.target_logits_indices.extend(first..first + nd);
        out.bonus_logits_indices.push(first + nd);
    }
    out
}

/// A [`StepSink`] writing one JSON line per step, flushed per line so a killed run
/// leaves a readable prefix.
pub struct StepLogSink<W: Write> {
    out: W,
    cfg: EngineConfig,
    sizes: Vec<usize>,
}

impl<W: Write> StepLogSink<W> {
    /// A sink for a run of `cfg`.
    pub fn new(out: W, cfg: &EngineConfig) -> Self {
        Self {
            out,
            sizes: capture_sizes(cfg),
            cfg: cfg.clone(),
        }
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write> StepSink for StepLogSink<W> {
    fn begin(&mut self, _header: TraceHeader) -> Result<(), RunError> {
        Ok(())
    }

    fn step(&mut self, o: &StepOutcome, _forced: &[(u64, usize, u32)]) -> Result<(), RunError> {
        let log = step_log(&self.cfg, &self.sizes, o);
        let mut line = serde_json::json!({"schema": STEP_LOG_SCHEMA, "step": o.plan.step});
        let fields = serde_json::to_value(&log).expect("a step log serializes");
        if let (Some(line), Some(fields)) = (line.as_object_mut(), fields.as_object()) {
            line.extend(fields.clone());
        }
        writeln!(self.out, "{line}").map_err(|e| RunError::Output(e.to_string()))?;
        self.out
            .flush()
            .map_err(|e| RunError::Output(e.to_string()))
    }

    fn end(&mut self) -> Result<(), RunError> {
        self.out
            .flush()
            .map_err(|e| RunError::Output(e.to_string()))
    }
}

/// Several sinks fed the same steps (a trace and a step log).
pub struct Tee<'a>(pub Vec<&'a mut dyn StepSink>);

impl StepSink for Tee<'_> {
    fn begin(&mut self, header: TraceHeader) -> Result<(), RunError> {
        self.0.iter_mut().try_for_each(|s| s.begin(header.clone()))
    }
    fn step(&mut self, o: &StepOutcome, forced: &[(u64, usize, u32)]) -> Result<(), RunError> {
        self.0.iter_mut().try_for_each(|s| s.step(o, forced))
    }
    fn end(&mut self) -> Result<(), RunError> {
        self.0.iter_mut().try_for_each(|s| s.end())
    }
    fn wants_tensors(&self) -> bool {
        self.0.iter().any(|s| s.wants_tensors())
    }
    fn measured(&mut self, o: &StepOutcome, t: &specmla_core::backend::StepTime) {
        self.0.iter_mut().for_each(|s| s.measured(o, t))
    }
}
