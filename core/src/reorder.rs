//! Reorder and split (SPEC section 4): the decode threshold, the region of each row,
//! the stable reorder, and which rows the decode kernel takes.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::config::{BackendProfile, QueryLenSupport, RowLayout, SpecConfig};

/// The region a row is reordered into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Region {
    /// q <= threshold and has computed tokens.
    Decode,
    /// q > threshold and has computed tokens (a later chunk, or a long verify row).
    Extend,
    /// No computed tokens (a fresh prompt), even when q = 1.
    Prefill,
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

/// The region of a row with `num_computed_tokens` and q_len `q`.
pub fn region(num_computed_tokens: usize, q: usize, threshold: usize) -> Region {
    if num_computed_tokens == 0 {
        Region::Prefill
    } else if q <= threshold {
        Region::Decode
    } else {
        Region::Extend
    }
}

/// Result of reorder + split over a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReorderSplit {
    /// Input row index of each output row.
    pub order: Vec<usize>,
    /// Output rows the decode kernel takes.
    pub decode_rows: Range<usize>,
    /// Output rows the prefill path takes.
    pub prefill_rows: Range<usize>,
}

impl ReorderSplit {
    pub fn num_decodes(&self) -> usize {
        self.decode_rows.len()
    }
    pub fn num_prefills(&self) -> usize {
        self.prefill_rows.len()
    }
}

/// The SPEC's reorder: a stable partition of rows given as `(num_computed_tokens,
/// q_len)` into the decode, extend and prefill regions. A permutation, and idempotent.
pub fn reorder(rows: &[(usize, usize)], threshold: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| region(rows[i].0, rows[i].1, threshold));
    order
}

/// The split over reordered rows: how many leading rows the decode kernel takes. With
/// `require_uniform`, the leading decode-region rows whose q equals the first one's (or
/// 0, a padding row) up to the first mismatch; otherwise the whole decode region.
pub fn split(rows_in_order: &[(usize, usize)], threshold: usize, require_uniform: bool) -> usize {
    let decode_region = rows_in_order
        .iter()
        .take_while(|&&(c, q)| region(c, q, threshold) == Region::Decode)
        .map(|&(_, q)| q);
    if require_uniform {
        uniform_prefix_len(decode_region)
    } else {
        decode_region.count()
    }
}

/// Reorders, splits and lays out rows given as `(num_computed_tokens, q_len)`.
/// Decode-first keeps the reorder as is (vLLM: decodes are a prefix). Extend-first
/// (TokenSpeed `num_extends`) moves the same decode rows to the end, so both layouts
/// send exactly the same rows down each path.
pub fn reorder_and_split(
    rows: &[(usize, usize)],
    threshold: usize,
    require_uniform: bool,
    layout: RowLayout,
) -> ReorderSplit {
    let mut order = reorder(rows, threshold);
    let in_order: Vec<(usize, usize)> = order.iter().map(|&i| rows[i]).collect();
    let num_decodes = split(&in_order, threshold, require_uniform);
    let n = rows.len();
    match layout {
        RowLayout::DecodeFirst => ReorderSplit {
            order,
            decode_rows: 0..num_decodes,
            prefill_rows: num_decodes..n,
        },
        RowLayout::ExtendFirst => {
            order.rotate_left(num_decodes);
            let ne = n - num_decodes;
            ReorderSplit {
                order,
                decode_rows: ne..n,
                prefill_rows: 0..ne,
            }
        }
    }
}

/// Length of the leading run whose q equals the first q (0 = padding always matches).
pub fn uniform_prefix_len(qs: impl IntoIterator<Item = usize>) -> usize {
    let mut first = None;
    let mut n = 0;
    for q in qs {
        match first {
            None => first = Some(q),
            Some(f) if q == f || q == 0 => {}
            Some(_) => break,
        }
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn uniform_split_stops_at_first_mismatch() {
        // rows: decode q=2, decode q=4, fresh prefill q=1, decode q=2
        let rows = [(10, 2), (10, 4), (0, 1), (10, 2)];
        let s = reorder_and_split(&rows, 4, true, RowLayout::DecodeFirst);
        assert_eq!(s.order, vec![0, 1, 3, 2]);
        assert_eq!(s.decode_rows, 0..1);
        let s = reorder_and_split(&rows, 4, false, RowLayout::DecodeFirst);
        assert_eq!(s.decode_rows, 0..3);
        let s = reorder_and_split(&rows, 4, true, RowLayout::ExtendFirst);
        assert_eq!(s.order, vec![1, 3, 2, 0]);
        assert_eq!(s.decode_rows, 3..4);
    }
}
