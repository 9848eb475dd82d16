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

/// Reorders rows given as `(num_computed_tokens, q_len)` and splits them.
///
/// Regions are stable partitions: decode, extend, prefill. With `require_uniform`, the
/// decode kernel takes the run of decode-region rows whose q equals the first one's (or
/// 0, a padding row) up to the first mismatch; the rest of the decode region joins the
/// prefill path. Decode-first puts the decode rows first (vLLM); extend-first puts them
/// last (TokenSpeed `num_extends`).
pub fn reorder_and_split(
    rows: &[(usize, usize)],
    threshold: usize,
    require_uniform: bool,
    layout: RowLayout,
) -> ReorderSplit {
    let by_region = |want: Region| {
        rows.iter()
            .enumerate()
            .filter(move |(_, &(c, q))| region(c, q, threshold) == want)
            .map(|(i, _)| i)
    };
    let decode_region: Vec<usize> = by_region(Region::Decode).collect();
    let num_decodes = if require_uniform {
        uniform_prefix_len(decode_region.iter().map(|&i| rows[i].1))
    } else {
        decode_region.len()
    };
    let (decodes, spilled) = decode_region.split_at(num_decodes);
    let mut order = Vec::with_capacity(rows.len());
    let n = rows.len();
    match layout {
        RowLayout::DecodeFirst => {
            order.extend_from_slice(decodes);
            order.extend_from_slice(spilled);
            order.extend(by_region(Region::Extend));
            order.extend(by_region(Region::Prefill));
            ReorderSplit {
                order,
                decode_rows: 0..num_decodes,
                prefill_rows: num_decodes..n,
            }
        }
        RowLayout::ExtendFirst => {
            order.extend_from_slice(spilled);
            order.extend(by_region(Region::Extend));
            order.extend(by_region(Region::Prefill));
            order.extend_from_slice(decodes);
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
