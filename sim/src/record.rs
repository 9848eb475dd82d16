//! Conversion of engine steps into trace records (the trace format is its own set of
//! types, so it stays stable while the core changes): the batch as scheduled, what each
//! row sampled and accepted, and digests of the exact bits of the metadata, every
//! layer's attention output per row, the logits, hidden states and drafter inputs (and
//! with `--trace-tensors` the attention outputs and logits themselves).

use specmla_core::backend::Backend;
use specmla_core::config::EngineConfig;
use specmla_core::engine::StepOutcome;
use specmla_core::grammar::GrammarState;
use specmla_core::plan::StepPlan;
use specmla_core::request::RequestSpec;
use specmla_traces::format::encode_payload;
use specmla_traces::{
    digest_f32, digest_u64s, Fnv1a64, ForcedDraft, LayerDigest, RowPath, StepRecord, StepTensors,
    TraceHeader, TraceRequest, TraceRow, TraceViolation, FORMAT_VERSION,
};

use crate::scenarios::Scenario;

/// The trace header of a run of `scenario` (with `cfg`, flags applied) on `workload`.
pub fn trace_header<B: Backend>(
    s: &Scenario,
    cfg: &EngineConfig,
    seed: u64,
    workload: &[RequestSpec],
    tensors: bool,
    backend: &B,
) -> TraceHeader {
    TraceHeader {
        format_version: FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        scenario: s.name.to_string(),
        seed,
        config_json: serde_json::to_string(cfg).expect("configs serialize"),
        faults: cfg.faults.iter().map(|f| f.id().to_string()).collect(),
        acceptance_rates: s.acceptance_rate.rates().to_vec(),
        trace_tensors: tensors,
        workload: workload
            .iter()
            .map(|r| TraceRequest {
                id: r.id,
                prompt: r.prompt.clone(),
                max_new_tokens: r.max_new_tokens as u64,
                arrival_step: r.arrival_step,
                grammar_seed: r.grammar.as_ref().map(|g| g.automaton.seed),
            })
            .collect(),
        backend: B::KIND.to_string(),
        kernels: backend.kernels(),
        digest_scheme: specmla_traces::DIGEST_SCHEME,
        bf16_compute: backend.bf16_compute(),
    }
}

/// The record of one executed step; `forced` is what the acceptance controller forced.
pub fn step_record(o: &StepOutcome, forced: &[(u64, usize, u32)], tensors: bool) -> StepRecord {
    let plan = &o.plan;
    let rows = o
        .batch
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let planned = plan
                .order
                .iter()
                .position(|&x| x == i)
                .expect("every row is planned");
            TraceRow {
                req_id: r.req_id,
                num_computed_tokens: r.num_computed_tokens as u64,
                num_prompt_tokens: r.num_prompt_tokens as u64,
                num_scheduled_tokens: r.num_scheduled_tokens as u64,
                token_ids: r.token_ids.clone(),
                num_draft_tokens: r.num_draft_tokens as u64,
                samples: r.samples,
                next_prompt_token: r.next_prompt_token,
                block_ids: r.block_ids.clone(),
                req_state_idx: r.req_state_idx as u32,
                grammar_state: grammar_state_id(o.grammar_states.get(i).copied().flatten()),
                path: if plan.rows[planned].is_decode {
                    RowPath::Decode
                } else {
                    RowPath::Prefill
                },
            }
        })
        .collect();
    let per_row = |f: &dyn Fn(&specmla_core::verify::RowVerify) -> Vec<u32>| -> Vec<Vec<u32>> {
        o.verifies
            .iter()
            .map(|v| v.as_ref().map(f).unwrap_or_default())
            .collect()
    };
    StepRecord {
        step: plan.step,
        rows,
        order: plan.order.iter().map(|&i| i as u32).collect(),
        preempted: o.batch.preempted.clone(),
        metadata_digest: metadata_digest(plan),
        sampled: per_row(&|v| v.sampled.clone()),
        num_accepted: o
            .verifies
            .iter()
            .map(|v| v.as_ref().map_or(0, |v| v.num_accepted as u32))
            .collect(),
        new_tokens: per_row(&|v| v.new_tokens.clone()),
        proposals: o.proposals.clone(),
        forced_drafts: forced
            .iter()
            .map(|&(req_id, position, token)| ForcedDraft {
                req_id,
                position: position as u64,
                token,
            })
            .collect(),
        logits_digest: digest_f32(&o.target.logits),
        hidden_digest: digest_u64s(&o.target.hidden_digests),
        layers: layer_digests(o),
        drafter_digest: drafter_digest(o),
        // The engine asks the backend for full tensors when a trace stores them; a step
        // that ran no forward has none.
        tensors: tensors.then(|| StepTensors {
            attn_outputs: o
                .target
                .tensors
                .as_ref()
                .map_or_else(Vec::new, |t| t.attn_outputs.clone()),
            logits: o.target.logits.clone(),
        }),
        violations: o
            .violations
            .iter()
            .map(|v| TraceViolation {
                rule: v.rule.name().to_string(),
                row: v.row.map(|r| r as u32),
                detail: v.detail.clone(),
            })
            .collect(),
    }
}

/// A scheduled row's committed grammar state as a trace stores it.
pub fn grammar_state_id(state: Option<GrammarState>) -> Option<u32> {
    match state? {
        GrammarState::Live(s) => Some(s),
        GrammarState::Dead => None,
    }
}

fn metadata_digest(plan: &StepPlan) -> u64 {
    let mut h = Fnv1a64::new();
    let parts = (
        &plan.order,
        &plan.common,
        &plan.mla,
        &plan.cudagraph,
        &plan.logits_indices,
        &plan.grammar_masks,
    );
    h.update(&encode_payload(&parts).expect("plans serialize"));
    h.finish()
}

/// Per layer: one digest per planned row, and one over each path's rows.
fn layer_digests(o: &StepOutcome) -> Vec<LayerDigest> {
    let plan = &o.plan;
    let n = plan.num_tokens();
    if n == 0 {
        return Vec::new();
    }
    let tokens = |r: std::ops::Range<usize>| r.start.min(n)..r.end.min(n);
    o.target
        .attn_digests
        .iter()
        .enumerate()
        .map(|(l, a)| LayerDigest {
            layer: l as u32,
            decode_rows: plan
                .mla
                .decode
                .as_ref()
                .map_or(0, |d| digest_u64s(&a[tokens(d.tokens.clone())])),
            prefill_rows: plan
                .mla
                .prefill
                .as_ref()
                .map_or(0, |p| digest_u64s(&a[tokens(p.tokens.clone())])),
            per_row: (0..plan.rows.len())
                .map(|r| digest_u64s(&a[tokens(plan.common.row_tokens(r))]))
                .collect(),
        })
        .collect()
}

/// Everything the drafter saw and produced: every primary pass's inputs (tokens,
/// positions, slots, seq_lens, sampled indices, hidden sources, block table), the DFlash
/// context and block, the drafter's own logits and hidden states before any draft was
/// forced, and the proposals. Shadow passes (the other batch mode, run first) are a
/// check, not the step's output.
fn drafter_digest(o: &StepOutcome) -> u64 {
    let mut h = Fnv1a64::new();
    let primary = o.drafter_passes.last().map(|p| p.mode);
    for p in o.drafter_passes.iter().filter(|p| Some(p.mode) == primary) {
        let inputs = (
            &p.token_ids,
            &p.positions,
            &p.slot_mapping,
            &p.seq_lens,
            &p.query_start_loc,
        );
        h.update(&encode_payload(&inputs).expect("passes serialize"));
        let more = (&p.token_indices_to_sample, &p.hidden, &*p.block_table);
        h.update(&encode_payload(&more).expect("passes serialize"));
    }
    if let Some(d) = &o.dflash {
        let block = (
            &d.block_positions,
            &d.block_slots,
            &d.block_indices,
            &d.block_tokens,
        );
        h.update(&encode_payload(&block).expect("passes serialize"));
        let context = (
            &d.context_slots,
            &d.context_token_indices,
            &d.context_positions,
            &d.context_lens,
        );
        h.update(&encode_payload(&context).expect("passes serialize"));
    }
    for out in &o.drafter_outputs {
        h.update_f32(&out.logits);
        for d in &out.hidden_digests {
            h.update(&d.to_le_bytes());
        }
    }
    h.update(&encode_payload(&(&o.proposals, &o.proposal_probs)).expect("proposals serialize"));
    h.finish()
}

/// A [`StepSink`](crate::runner::StepSink) that writes a trace, flushing every record so
/// a killed run leaves a readable prefix.
pub struct TraceSink<W: std::io::Write> {
    out: Option<W>,
    writer: Option<specmla_traces::TraceWriter<W>>,
    tensors: bool,
    finished: Option<W>,
}

impl<W: std::io::Write> TraceSink<W> {
    /// A sink writing to `out`; `tensors` also stores full attention outputs and logits.
    pub fn new(out: W, tensors: bool) -> Self {
        Self {
            out: Some(out),
            writer: None,
            tensors,
            finished: None,
        }
    }

    /// The output once the run ended.
    pub fn into_inner(self) -> Option<W> {
        self.finished
    }
}

impl<W: std::io::Write> crate::runner::StepSink for TraceSink<W> {
    fn begin(&mut self, mut header: TraceHeader) -> Result<(), crate::runner::RunError> {
        header.trace_tensors = self.tensors;
        let out = self.out.take().expect("begin is called once");
        self.writer = Some(specmla_traces::TraceWriter::new(out, &header)?);
        Ok(())
    }

    fn step(
        &mut self,
        o: &StepOutcome,
        forced: &[(u64, usize, u32)],
    ) -> Result<(), crate::runner::RunError> {
        let w = self.writer.as_mut().expect("begin came first");
        Ok(w.write_step(&step_record(o, forced, self.tensors))?)
    }

    fn end(&mut self) -> Result<(), crate::runner::RunError> {
        let w = self.writer.take().expect("begin came first");
        self.finished = Some(w.finish()?);
        Ok(())
    }
    fn wants_tensors(&self) -> bool {
        self.tensors
    }
}
