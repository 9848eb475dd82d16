//! The decode kernels' split-KV policy: how many splits of how many keys each request
//! takes. Split boundaries sit at absolute positions and splits merge in split order, so
//! a plan that depends only on the request and the model's shape keeps a request's bits
//! independent of its batch. The device facts a plan needs (query rows per CTA, tile
//! keys, how many split groups fit at once) come in as arguments: the core stays pure.

use serde::{Deserialize, Serialize};

/// A split plan: keys per split (a multiple of the kernel's tile) and the most splits a
/// request takes; a longer request takes longer splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitPlan {
    pub split_size_tokens: usize,
    pub max_splits: usize,
}

impl From<SplitPlan> for (usize, usize) {
    fn from(p: SplitPlan) -> Self {
        (p.split_size_tokens, p.max_splits)
    }
}

/// The batch-invariant split plan for requests of `query_rows` query rows, on a kernel
/// whose CTA takes `block_rows` of them. A request longer than unit x count takes longer splits
/// (a multiple of the unit). The plan depends on the model's shape (heads x q_len) and the
/// request's own length, never on the batch.
///
/// Each split costs a CTA's cold start (its Q and first tiles) and a merge (on chip, in
/// a cluster of the request's splits), while one split per request is fastest once the
/// batch fills the GPU. `gpu-bench --sweep-splits` on the H100 (seesaw kernel, cluster
/// merge), time against the best split count:
/// - H 128, q 2 and 4: 1 split is best at every batch from 32;
/// - H 128, q 1: 2 splits are best at B 32 and within 6-12% of 1 split at B 64 and 128;
/// - H 16: 3 splits are best at B 32 (2 within 19%), 1 at B 128 (2 within 2-8%; 3 and 4
///   cost 10-23% there).
///
/// So: one 64-row block (H 16) takes up to 2 splits of 1024+ keys; two blocks (H 128,
/// q 1) up to 2 of 2048+; four or more (H 128, q 2 and up) one split, no merge at all.
///
/// Batches far below 32 requests leave SMs idle under this plan; the fast plan does not.
pub fn invariant_split_plan(query_rows: usize, block_rows: usize) -> SplitPlan {
    let (split_size_tokens, max_splits) = match query_rows.div_ceil(block_rows) {
        0 | 1 => (1024, 2),
        blocks => (2048, (4 / blocks).max(1)),
    };
    SplitPlan {
        split_size_tokens,
        max_splits,
    }
}

/// `splits` equal splits of a `context`-key request, each a whole number of `tile_keys`
/// tiles (a tile may span pages or part of one).
pub fn equal_split_plan(context: usize, splits: usize, tile_keys: usize) -> SplitPlan {
    let split = context.div_ceil(splits).div_ceil(tile_keys) * tile_keys;
    SplitPlan {
        split_size_tokens: split,
        max_splits: context.div_ceil(split),
    }
}

/// The fast plan, which may look at the batch: the most splits per request whose CTAs
/// still run in one wave, at least one, at most one per 256 keys. `groups` is the
/// launch's CTA groups (requests x blocks of query rows); `resident(n)` is how many
/// groups of n split CTAs the device runs at once (SMs / n, or fewer where clusters of n
/// must fit in a GPC). Past one wave a split only adds a cold start and a merge:
/// `gpu-bench --sweep-splits` found the best count at every shape was the largest that
/// fit one wave.
pub fn fast_split_plan(
    groups: usize,
    context: usize,
    resident: &dyn Fn(usize) -> usize,
    tile_keys: usize,
) -> SplitPlan {
    let most = context.div_ceil(256).max(1);
    let splits = (1..=most)
        .filter(|&n| groups <= resident(n))
        .max()
        .unwrap_or(1);
    equal_split_plan(context, splits, tile_keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invariant_plan_depends_on_the_model_shape_only() {
        let plan = |rows| -> (usize, usize) { invariant_split_plan(rows, 64).into() };
        assert_eq!(plan(16), (1024, 2));
        assert_eq!(plan(64), (1024, 2));
        assert_eq!(plan(128), (2048, 2));
        assert_eq!(plan(192), (2048, 1));
        assert_eq!(plan(512), (2048, 1));
    }

    /// (heads, q_len, batch, context) on a kernel of 64-row CTAs and 64-key tiles.
    fn fast(
        shape: (usize, usize, usize, usize),
        resident: &dyn Fn(usize) -> usize,
    ) -> (usize, usize) {
        let (h, q, b, l) = shape;
        fast_split_plan(b * (q * h).div_ceil(64), l, resident, 64).into()
    }

    #[test]
    fn the_fast_plan_fills_one_wave() {
        let plain = |n: usize| 132 / n;
        // 64 CTAs a split on 132 SMs: two splits of 2048 fill one wave.
        assert_eq!(fast((128, 1, 32, 4096), &plain), (2048, 2));
        // 128 CTAs already fill it: one split.
        assert_eq!(fast((128, 1, 64, 16384), &plain), (16384, 1));
        // 1024 CTAs make 7.8 waves: splitting only adds cold starts.
        assert_eq!(fast((128, 4, 128, 4096), &plain), (4096, 1));
        // H 16, B 32: 32 CTAs, four splits; but where only 30 clusters of four fit at once
        // (they must sit in one GPC), three.
        assert_eq!(fast((16, 1, 32, 4096), &plain), (1024, 4));
        let gpcs = |n: usize| if n == 4 { 30 } else { 132 / n };
        assert_eq!(fast((16, 1, 32, 4096), &gpcs), (1408, 3));
        // Splits stay whole tiles, at most one per 256 keys.
        for (h, q, b, l) in [(16, 1, 1, 300), (16, 1, 2, 100_000), (128, 2, 7, 5000)] {
            let (split, n) = fast((h, q, b, l), &|n| 132 / n);
            assert_eq!(n, l.div_ceil(split));
            assert!(split.is_multiple_of(64), "{split}");
            assert!(
                l.div_ceil(split) <= l.div_ceil(256),
                "{l} in splits of {split}"
            );
        }
    }
}
