//! Reorder and split: the decode threshold, the region of each row, vLLM's in-place
//! reorder by swaps, and vLLM's query-length split that decides which rows the decode
//! kernel takes.
//!
//! Every rule here follows vLLM's code, not a tidier restatement of it:
//! - `vllm/v1/attention/backends/utils.py`, `reorder_batch_to_split_decodes_and_prefills`
//!   and `split_decodes_and_prefills`. The four-region rule ([`Planner::Vllm`]) is vLLM
//!   main after PR #37303, read at commit `cca57d421f5aa1786deb113981ebe3bbbbd94581` (a
//!   mirror of vllm-project/vllm); the three-region rule ([`Planner::Vllm3Region`]) is
//!   vllm-project/vllm at commit `00bd1493b3e82d6c13c68ee8a0e1c5a96707e190`.
//! - `vllm/v1/attention/backend.py` (`_init_reorder_batch_threshold`) for the threshold.
//!
//! What that code does, in our words:
//! - Regions come from `num_computed_tokens`, `num_scheduled_tokens` and (four-region)
//!   `num_prompt_tokens`. A row is moved only when its slot's target region differs from
//!   its own; the misplaced rows, taken in (region, index) order, fill the misplaced slots
//!   in index order. A row already in its region never moves, so this is not a sort.
//! - The split reads query lengths only. Under `require_uniform` the first row's q is
//!   the decode q and the decodes end at the first row with another q, so a fresh prompt
//!   with the right q that follows the decodes is a decode too.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::config::{BackendProfile, Planner, QueryLenSupport, RowLayout, SpecConfig, SpecMethod};

/// The region a row is reordered into, in the order regions are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Region {
    /// Has context, q <= threshold, prompt done (three-region: prompt done or not).
    Decode,
    /// Has context, q <= threshold, still prefilling (four-region planner only).
    ShortExtend,
    /// Has context, q > threshold (the three-region rule's "extend").
    LongExtend,
    /// No computed tokens: a prompt's first chunk, even when q = 1.
    Prefill,
}

impl Region {
    /// vLLM's name for the region.
    pub fn name(self) -> &'static str {
        match self {
            Region::Decode => "decode",
            Region::ShortExtend => "short_extend",
            Region::LongExtend => "long_extend",
            Region::Prefill => "prefill",
        }
    }
}

/// What the reorder reads of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowShape {
    pub num_computed_tokens: usize,
    /// This step's q_len (0 for a padding row).
    pub num_scheduled_tokens: usize,
    /// The request's prompt length; the four-region rule compares it with
    /// `num_computed_tokens` to tell a decode from a short extend.
    pub num_prompt_tokens: usize,
}

impl RowShape {
    /// vLLM's `is_prefilling`: the prompt is not yet all in the cache.
    pub fn is_prefilling(&self) -> bool {
        self.num_computed_tokens < self.num_prompt_tokens
    }
}

/// The decode threshold of one backend profile under `spec`.
pub fn profile_threshold(profile: BackendProfile, spec: &SpecConfig) -> usize {
    let caps = profile.capabilities();
    if caps.query_len_support == QueryLenSupport::SingleOnly {
        return 1;
    }
    if !spec.enabled() {
        return caps.base_threshold;
    }
    let k = spec.k();
    let verify_len = if spec.parallel_drafting {
        1 + 2 * k
    } else {
        1 + k
    };
    caps.base_threshold.max(verify_len)
}

/// [`profile_threshold`] with F14 on: vLLM's TritonMLA builder (SingleOnly) asserted a
/// threshold of 1, then re-derived it as if spec-as-decode were supported whenever its
/// group carried `non_causal_multi_token_decode`, which a non-causal drafter's layers set
/// for the whole group (`MLAAttentionSpec.merge` ORs it): vLLM #51848, before #51065
/// (`vllm/v1/attention/backends/mla/triton_mla.py`). Our non-causal drafter is DFlash; a
/// profile without non-causal attention cannot host it and keeps 1.
pub fn f14_profile_threshold(profile: BackendProfile, spec: &SpecConfig) -> usize {
    let caps = profile.capabilities();
    let raised = caps.query_len_support == QueryLenSupport::SingleOnly
        && caps.non_causal
        && spec.method == SpecMethod::DFlash;
    if !raised {
        return profile_threshold(profile, spec);
    }
    let k = spec.k();
    1.max(if spec.parallel_drafting {
        1 + 2 * k
    } else {
        1 + k
    })
}

/// `reorder_batch_threshold`: the minimum over attention groups.
pub fn reorder_batch_threshold(profiles: &[BackendProfile], spec: &SpecConfig) -> usize {
    profiles
        .iter()
        .map(|&p| profile_threshold(p, spec))
        .min()
        .unwrap_or(1)
}

/// `require_uniform`: every group except a Varlen one needs uniform decode rows.
pub fn require_uniform(profiles: &[BackendProfile]) -> bool {
    profiles
        .iter()
        .any(|p| p.capabilities().query_len_support != QueryLenSupport::Varlen)
}

/// The region of one row under `planner`.
pub fn region(planner: Planner, row: RowShape, threshold: usize) -> Region {
    if row.num_computed_tokens == 0 {
        Region::Prefill
    } else if row.num_scheduled_tokens > threshold {
        Region::LongExtend
    } else if planner == Planner::Vllm && row.is_prefilling() {
        Region::ShortExtend
    } else {
        Region::Decode
    }
}

/// vLLM's reorder: the input row index at each output position, and whether any row
/// moved (vLLM's return value, which tells the runner to rebuild its persistent batch).
pub fn reorder(planner: Planner, rows: &[RowShape], threshold: usize) -> (Vec<usize>, bool) {
    let regions: Vec<Region> = rows
        .iter()
        .map(|&r| region(planner, r, threshold))
        .collect();
    let target = target_regions(&regions);
    let misplaced: Vec<usize> = (0..rows.len())
        .filter(|&i| regions[i] != target[i])
        .collect();
    let mut movers = misplaced.clone();
    movers.sort_by_key(|&i| regions[i]); // stable: ties keep index order
    let mut order: Vec<usize> = (0..rows.len()).collect();
    for (&slot, &row) in misplaced.iter().zip(&movers) {
        order[slot] = row;
    }
    (order, !misplaced.is_empty())
}

/// The region each slot must hold once the rows are laid out region by region.
fn target_regions(regions: &[Region]) -> Vec<Region> {
    let mut sorted = regions.to_vec();
    sorted.sort_unstable();
    sorted
}

/// vLLM's `split_decodes_and_prefills` result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitCounts {
    pub num_decodes: usize,
    pub num_prefills: usize,
    pub num_decode_tokens: usize,
    pub num_prefill_tokens: usize,
}

/// The inputs of vLLM's split over rows already reordered.
#[derive(Clone, Copy, Debug)]
pub struct SplitInput<'a> {
    /// q_len of each row, in batch order (0 = padding row).
    pub query_lens: &'a [usize],
    /// `num_actual_tokens` (the graph-padded count when the runner padded it).
    pub num_actual_tokens: usize,
    pub decode_threshold: usize,
    pub require_uniform: bool,
    /// vLLM's default (and the MLA builders' value) is true.
    pub treat_short_extends_as_decodes: bool,
    /// Per row, still prefilling; read only when `treat_short_extends_as_decodes` is off.
    pub is_prefilling: &'a [bool],
}

/// vLLM's split: the decodes are a prefix found from query lengths alone.
pub fn split(input: SplitInput<'_>) -> SplitCounts {
    let qs = input.query_lens;
    let n = qs.len();
    let thr = input.decode_threshold;
    let total = input.num_actual_tokens;
    let all_decodes = SplitCounts {
        num_decodes: n,
        num_prefills: 0,
        num_decode_tokens: total,
        num_prefill_tokens: 0,
    };
    let max_q = qs.iter().copied().max().unwrap_or(0);
    if max_q <= thr && (!input.require_uniform || thr <= 1) && input.treat_short_extends_as_decodes
    {
        return all_decodes;
    }
    let Some(&q0) = qs.first() else {
        return all_decodes;
    };
    if q0 > thr {
        return SplitCounts {
            num_decodes: 0,
            num_prefills: n,
            num_decode_tokens: 0,
            num_prefill_tokens: total,
        };
    }
    // A padded uniform batch (every q equal to the first or 0) is all decodes, so the
    // decode count matches the captured graph's row count.
    if input.require_uniform && qs.iter().all(|&q| q == q0 || q == 0) {
        return all_decodes;
    }
    let ends_decodes = |i: usize| {
        let by_len = if input.require_uniform {
            qs[i] != q0
        } else {
            qs[i] > thr
        };
        by_len || (!input.treat_short_extends_as_decodes && input.is_prefilling[i])
    };
    match (0..n).find(|&i| ends_decodes(i)) {
        None => all_decodes,
        Some(first_prefill) => {
            let decode_tokens: usize = qs[..first_prefill].iter().sum();
            SplitCounts {
                num_decodes: first_prefill,
                num_prefills: n - first_prefill,
                num_decode_tokens: decode_tokens,
                num_prefill_tokens: total - decode_tokens,
            }
        }
    }
}

/// Result of reorder + split over a batch, placed in a row layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReorderSplit {
    /// Input row index of each output row.
    pub order: Vec<usize>,
    /// Whether vLLM's reorder moved any row.
    pub modified: bool,
    /// Region of each output row.
    pub regions: Vec<Region>,
    /// Output rows the decode kernel takes.
    pub decode_rows: Range<usize>,
    /// Output rows the prefill path takes.
    pub prefill_rows: Range<usize>,
    /// The split's own counts (over the decode-first order).
    pub counts: SplitCounts,
}

impl ReorderSplit {
    pub fn num_decodes(&self) -> usize {
        self.decode_rows.len()
    }
    pub fn num_prefills(&self) -> usize {
        self.prefill_rows.len()
    }
}

/// The inputs of one reorder-and-split.
#[derive(Clone, Copy, Debug)]
pub struct PlanRules {
    pub planner: Planner,
    pub threshold: usize,
    pub require_uniform: bool,
    pub layout: RowLayout,
}

/// Reorders (vLLM's swaps), splits (vLLM's query-length rule) and lays out the rows.
/// Decode-first keeps vLLM's order. Extend-first (TokenSpeed's `num_extends`) moves the
/// same decode rows to the end, so both layouts send the same rows down each path.
pub fn reorder_and_split(rows: &[RowShape], rules: PlanRules) -> ReorderSplit {
    let (mut order, modified) = reorder(rules.planner, rows, rules.threshold);
    let query_lens: Vec<usize> = order
        .iter()
        .map(|&i| rows[i].num_scheduled_tokens)
        .collect();
    let is_prefilling: Vec<bool> = order.iter().map(|&i| rows[i].is_prefilling()).collect();
    let counts = split(SplitInput {
        query_lens: &query_lens,
        num_actual_tokens: query_lens.iter().sum(),
        decode_threshold: rules.threshold,
        require_uniform: rules.require_uniform,
        treat_short_extends_as_decodes: true,
        is_prefilling: &is_prefilling,
    });
    let nd = counts.num_decodes;
    let n = rows.len();
    let (decode_rows, prefill_rows) = match rules.layout {
        RowLayout::DecodeFirst => (0..nd, nd..n),
        RowLayout::ExtendFirst => {
            order.rotate_left(nd);
            (n - nd..n, 0..n - nd)
        }
    };
    let regions = order
        .iter()
        .map(|&i| region(rules.planner, rows[i], rules.threshold))
        .collect();
    ReorderSplit {
        order,
        modified,
        regions,
        decode_rows,
        prefill_rows,
        counts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(q: usize, computed: usize, prompt: usize) -> RowShape {
        RowShape {
            num_computed_tokens: computed,
            num_scheduled_tokens: q,
            num_prompt_tokens: prompt,
        }
    }

    #[test]
    fn thresholds_follow_the_matrix() {
        let spec = SpecConfig::multi_step(3, crate::config::DrafterBatch::Padded);
        assert_eq!(profile_threshold(BackendProfile::FlashMla, &spec), 128);
        assert_eq!(profile_threshold(BackendProfile::FlashInferMla, &spec), 4);
        assert_eq!(profile_threshold(BackendProfile::CutlassMla, &spec), 1);
        let mut par = spec.clone();
        par.parallel_drafting = true;
        assert_eq!(profile_threshold(BackendProfile::FlashInferMla, &par), 7);
        let both = [BackendProfile::FlashMla, BackendProfile::FlashInferMla];
        assert_eq!(reorder_batch_threshold(&both, &spec), 4);
        assert!(!require_uniform(&[BackendProfile::FlashAttnMla]));
        assert!(require_uniform(&both));
    }

    /// A fresh 4-token prompt after q = 4 verify rows takes the decode kernel
    /// (FlashMLA: "small prefills with the decode pathway").
    #[test]
    fn a_fresh_prompt_with_the_decode_q_is_a_decode() {
        let rows = [shape(4, 0, 4), shape(4, 100, 90), shape(4, 50, 40)];
        let rules = PlanRules {
            planner: Planner::Vllm,
            threshold: 128,
            require_uniform: true,
            layout: RowLayout::DecodeFirst,
        };
        let s = reorder_and_split(&rows, rules);
        assert_eq!(
            s.order,
            vec![2, 1, 0],
            "row 0 swaps with row 2, row 1 stays"
        );
        assert_eq!(s.num_decodes(), 3);
        assert_eq!(s.regions[2], Region::Prefill);
    }
}
