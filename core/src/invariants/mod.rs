//! Invariant checkers for every rule of RULES §4-§8. Each recomputes the rule
//! from the scheduled batch with a deliberately simple reference and reports structured
//! violations (rule, step, row) instead of panicking, so `sim` can name what broke.
//!
//! One module per plan stage: `reorder` (threshold, order, split), `metadata` (common
//! tensors, slots, decode rows and their split schedule, chunked context), `graphs`
//! (dispatch, persistent buffers, dummy steps), `sampling` (logits indices, grammar
//! masks), `drafter` (multi-step and DFlash passes). This module holds the violation
//! types and the entry points.

use serde::{Deserialize, Serialize};

use crate::batch::ScheduledBatch;
use crate::block_pool::PAD_SLOT;
use crate::config::{DrafterBatch, EngineConfig, Planner, QueryLenSupport};
use crate::drafter::{DFlashPass, DrafterPass, RowOutcome};
use crate::graph_buffers::DummyStep;
use crate::plan::StepPlan;
use crate::reorder::Region;
use crate::split::SplitSchedule;

mod drafter;
mod graphs;
mod metadata;
mod reorder;
mod sampling;

pub use drafter::{check_dflash, check_drafter_pass};
pub use graphs::check_dummy_step;
use graphs::{check_graph, check_graph_buffers};
use metadata::{check_chunks, check_common, check_decode_rows};
pub use reorder::matrix_threshold;
use reorder::{check_reorder, check_split, check_threshold};
pub use sampling::check_grammar_masks;
use sampling::check_sampling;

/// The rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Rule {
    /// Threshold and require_uniform follow the capability matrix (section 4).
    Threshold,
    /// Regions and order are vLLM's: rows already in their region stay, misplaced rows
    /// fill the misplaced slots in (region, index) order.
    Reorder,
    /// Decode rows are contiguous at the layout's edge and as many as vLLM's
    /// query-length split gives.
    Split,
    /// query_start_loc, seq_lens, positions and counts agree with the batch (section 1).
    CommonMetadata,
    /// Every token's slot is its own page slot; PAD only where nothing may be written.
    SlotMapping,
    /// The decode planner and kernel read the same rows (section 8).
    DecodeRows,
    /// Context chunks fit the workspace and cover each row's context (section 5).
    ChunkedContext,
    /// Graph sizes, dispatch and padding (section 7).
    CudaGraph,
    /// Logits indices and grammar masks of verify positions (section 3, 8).
    Sampling,
    /// Multi-step drafter inputs, padded and compacted (section 6).
    DrafterInputs,
    /// DFlash block positions and slots (section 6).
    DFlashSlots,
    /// What a replayed graph reads from its persistent buffers is this step's: padding
    /// rows see no key, and the split schedule is the one the current seq_lens give.
    GraphBuffers,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::Threshold => "threshold",
            Rule::Reorder => "reorder",
            Rule::Split => "split",
            Rule::CommonMetadata => "common-metadata",
            Rule::SlotMapping => "slot-mapping",
            Rule::DecodeRows => "decode-rows",
            Rule::ChunkedContext => "chunked-context",
            Rule::CudaGraph => "cuda-graph",
            Rule::Sampling => "sampling",
            Rule::DrafterInputs => "drafter-inputs",
            Rule::DFlashSlots => "dflash-slots",
            Rule::GraphBuffers => "graph-buffers",
        }
    }
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub rule: Rule,
    pub step: u64,
    /// Planned row, when the rule is about one row.
    pub row: Option<usize>,
    pub detail: String,
}

struct Sink {
    step: u64,
    out: Vec<Violation>,
}

impl Sink {
    fn check(&mut self, ok: bool, rule: Rule, row: Option<usize>, detail: impl FnOnce() -> String) {
        if !ok {
            self.out.push(Violation {
                rule,
                step: self.step,
                row,
                detail: detail(),
            });
        }
    }
}

/// The slot a request's position must have, restated here rather than borrowed from
/// the planner (`block_pool::slot_for`), so a wrong slot rule in the planner cannot also
/// pass its own check. The block table is the request's own block list, as scheduled:
/// -1 (PAD) at or past `max_model_len` or past the allocated blocks, else the block's
/// first slot plus the offset in the page.
fn ref_slot(block_ids: &[u32], pos: usize, page_size: usize, max_model_len: usize) -> i64 {
    let block = pos / page_size;
    if pos >= max_model_len || block >= block_ids.len() || block_ids[block] == u32::MAX {
        return -1;
    }
    i64::from(block_ids[block]) * page_size as i64 + (pos % page_size) as i64
}

/// Checks a target plan against the batch it was built from.
pub fn check_plan(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    capture_sizes: &[usize],
) -> Vec<Violation> {
    let mut s = Sink {
        step: plan.step,
        out: Vec::new(),
    };
    check_threshold(cfg, plan, &mut s);
    check_reorder(cfg, batch, plan, &mut s);
    check_split(plan, &mut s);
    check_common(cfg, batch, plan, &mut s);
    check_decode_rows(cfg, plan, &mut s);
    check_chunks(cfg, plan, &mut s);
    check_graph(cfg, plan, capture_sizes, &mut s);
    check_graph_buffers(cfg, plan, &mut s);
    check_sampling(batch, plan, &mut s);
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::ScheduledRow;
    use crate::config::*;
    use crate::plan::build_step_plan;

    fn cfg() -> EngineConfig {
        EngineConfig {
            model: ModelDims::tiny(),
            spec: SpecConfig::multi_step(3, DrafterBatch::Padded),
            scheduler: SchedulerConfig {
                max_num_seqs: 8,
                max_num_batched_tokens: 256,
                max_model_len: 512,
                page_size: 16,
                num_gpu_blocks: 256,
                chunked_prefill: true,
                prefill_chunk_tokens: 48,
                mixed_batches: true,
                row_layout: RowLayout::DecodeFirst,
                planner: Planner::Vllm,
                workspace_tokens: 512,
            },
            backends: vec![BackendProfile::FlashMla],
            cuda_graphs: false,
            max_capture_size_tokens: 64,
            split_size_tokens: 64,
            max_splits: 0,
            kv_cache_dtype: Default::default(),
            dp_peer_num_tokens: 0,
            faults: Default::default(),
            poison_stale_buffers: false,
            split_override: Default::default(),
        }
    }

    fn row(id: u64, computed: usize, q: usize, first_block: u32) -> ScheduledRow {
        ScheduledRow {
            req_id: id,
            num_computed_tokens: computed,
            // A verify row is past its prompt; a chunk is partway through it.
            num_prompt_tokens: if q == 4 { computed } else { computed + q + 1 },
            num_scheduled_tokens: q,
            token_ids: vec![1; q],
            num_draft_tokens: if q == 4 { 3 } else { 0 },
            samples: q == 4,
            next_prompt_token: (q != 4).then_some(2),
            block_ids: (first_block..first_block + 16).collect(),
            req_state_idx: id as usize,
        }
    }

    /// Found by `sim` on mixed_mtp seed 0, step 6 (under the old stable reorder, where
    /// only the leading q=4 row took the decode kernel). Postmortem: vLLM's reorder swaps
    /// the trailing verify row into the first short-extend slot, so both q=4 rows lead and
    /// both are decodes; the 48-token chunks follow as short extends on the prefill path.
    #[test]
    fn vllm_swaps_the_second_verify_row_next_to_the_first() {
        let cfg = cfg();
        // FlashMLA's threshold is 128, so 48-token chunks with context are short extends.
        let rows = vec![
            row(3, 113, 4, 0),
            row(5, 96, 48, 16),
            row(10, 96, 48, 32),
            row(13, 91, 4, 48),
        ];
        let batch = ScheduledBatch {
            step: 6,
            rows,
            preempted: Vec::new(),
        };
        for layout in [RowLayout::DecodeFirst, RowLayout::ExtendFirst] {
            let plan = build_step_plan(&cfg, &batch, &[], layout, &|_| None).unwrap();
            assert_eq!(plan.mla.num_decodes, 2, "both q=4 rows are decodes");
            let v = check_plan(&cfg, &batch, &plan, &[]);
            assert!(v.is_empty(), "{layout:?}: {v:?}");
        }
        let plan = build_step_plan(&cfg, &batch, &[], RowLayout::DecodeFirst, &|_| None).unwrap();
        assert_eq!(plan.order, vec![0, 3, 2, 1]);
    }

    /// The split rule fires when the decodes stop early without a mismatch.
    #[test]
    fn a_split_that_stops_before_a_mismatch_is_flagged() {
        let cfg = cfg();
        let rows = vec![row(3, 113, 4, 0), row(13, 91, 4, 48)];
        let batch = ScheduledBatch {
            step: 0,
            rows,
            preempted: Vec::new(),
        };
        let mut plan =
            build_step_plan(&cfg, &batch, &[], RowLayout::DecodeFirst, &|_| None).unwrap();
        plan.rows[1].is_decode = false;
        let v = check_plan(&cfg, &batch, &plan, &[]);
        assert!(v.iter().any(|v| v.rule == Rule::Split), "{v:?}");
    }
}
