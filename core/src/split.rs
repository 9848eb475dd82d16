//! The decode kernels' split-KV rule, the one every decode kernel reads: a policy (keys
//! per split, the most splits a request takes), and from it each row's schedule (its split
//! length, its split count and how many keys its block table maps), which the plan
//! carries and the kernels read as given. Split boundaries sit at absolute positions and
//! splits merge in split order, so a schedule that depends only on the request and the
//! policy keeps a request's bits independent of its batch. The device facts a policy
//! needs (query rows per CTA, tile keys, how many split groups fit at once) come in as
//! arguments: the core stays pure.

use serde::{Deserialize, Serialize};

use crate::block_pool::NO_BLOCK;

/// A split policy: keys per split (a multiple of the kernel's tile) and the most splits a
/// request takes; a longer request takes longer splits (see [`SplitPolicy::split_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitPolicy {
    pub split_size_tokens: usize,
    pub max_splits: usize,
}

impl From<SplitPolicy> for (usize, usize) {
    fn from(p: SplitPolicy) -> Self {
        (p.split_size_tokens, p.max_splits)
    }
}

impl SplitPolicy {
    /// The split of a row of `kv_len` keys: `(split_len_tokens, num_splits)`. The split
    /// length is the smallest multiple of `split_size_tokens` that covers the keys in at
    /// most `max_splits` splits; a row without keys takes one (empty) split. It depends
    /// on the row's own length and the policy alone.
    pub fn split_of(&self, kv_len: usize) -> (u32, u32) {
        let unit = self.split_size_tokens.max(1);
        let per = kv_len.div_ceil(self.max_splits.max(1));
        let len = per.div_ceil(unit).max(1) * unit;
        (len as u32, kv_len.div_ceil(len).max(1) as u32)
    }

    /// The schedule of rows with `kv_lens` keys, whose block tables are the rows of
    /// `block_table` (`width` entries each; a row past the table maps nothing).
    pub fn schedule(
        &self,
        kv_lens: &[u32],
        block_table: &[u32],
        width: usize,
        page_size: usize,
    ) -> SplitSchedule {
        let mut s = SplitSchedule::default();
        for (r, &len) in kv_lens.iter().enumerate() {
            let (split, n) = self.split_of(len as usize);
            s.split_len_tokens.push(split);
            s.num_splits.push(n);
            let row = block_table.get(r * width..(r + 1) * width).unwrap_or(&[]);
            s.mapped_kv_tokens.push(mapped_kv_tokens(row, page_size));
        }
        s
    }
}

/// Each row's split-KV schedule, as the decode kernels read it (one entry per kernel row).
/// Row r covers keys `[i * split_len_tokens[r], (i + 1) * split_len_tokens[r])` in split
/// i for i below `num_splits[r]`, merged in split order, and reads no key at or past
/// `mapped_kv_tokens[r]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitSchedule {
    pub split_len_tokens: Vec<u32>,
    pub num_splits: Vec<u32>,
    /// Keys the row's block table maps before its first hole ([`mapped_kv_tokens`]): the
    /// kernels' read bound, rewritten with the block table on every step.
    pub mapped_kv_tokens: Vec<u32>,
}

impl SplitSchedule {
    pub fn len(&self) -> usize {
        self.num_splits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.num_splits.is_empty()
    }
}

/// Keys a block-table row maps before its first hole: `page_size` times the index of its
/// first [`NO_BLOCK`] entry, or the whole row. A flash kernel reads nothing past it, so
/// it never dereferences a missing block (a row whose window reaches past it comes out
/// NaN instead).
pub fn mapped_kv_tokens(row: &[u32], page_size: usize) -> u32 {
    let blocks = row.iter().position(|&b| b == NO_BLOCK).unwrap_or(row.len());
    (blocks * page_size) as u32
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
///
/// Measured again with faster kernels (run 195, H 128 q 1, `--sweep-splits`), the q 1
/// trade-off has moved: at L 4k two splits cost 20-23% at B 64 and 128 and save 23% at B
/// 32 and 35% at B 16; at L 16k on the persistent kernel (`inv-persist`) they cost 6% at
/// B 64 and 128 and save 38-45% at B 32 and 16. No batch-blind count serves both ends at
/// L 4k; an engine sets its own (`EngineConfig::split_size_tokens`, `max_splits`), as
/// SGLang's deterministic mode takes its split size from a setting.
pub fn invariant_split_plan(query_rows: usize, block_rows: usize) -> SplitPolicy {
    let (split_size_tokens, max_splits) = match query_rows.div_ceil(block_rows) {
        0 | 1 => (1024, 2),
        blocks => (2048, (4 / blocks).max(1)),
    };
    SplitPolicy {
        split_size_tokens,
        max_splits,
    }
}

/// `splits` equal splits of a `context`-key request, each a whole number of `tile_keys`
/// tiles (a tile may span pages or part of one). A request without keys, zero splits or
/// zero-key tiles still gives a policy: one split of at least one tile (of at least one key).
pub fn equal_split_plan(context: usize, splits: usize, tile_keys: usize) -> SplitPolicy {
    let tile = tile_keys.max(1);
    let split = context.div_ceil(splits.max(1)).div_ceil(tile).max(1) * tile;
    SplitPolicy {
        split_size_tokens: split,
        max_splits: context.div_ceil(split).max(1),
    }
}

/// What a decode CTA costs beyond its keys, in key tiles: the device facts the fast plan
/// weighs split counts with past one wave (a cold start, and for a split its share of the
/// merge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtaOverhead {
    /// A CTA of a launch of one split a request.
    pub one_split_tiles: usize,
    /// A CTA of a launch of 2 to `priced_splits` splits a request.
    pub split_tiles: usize,
    /// The most splits `split_tiles` prices: more merge another way (through L2, at a
    /// cost it does not hold), and the plan never takes them, in one wave or past it.
    pub priced_splits: usize,
    /// A balanced launch (`balanced::fast_decode_plan`), beyond its parts' tiles and a
    /// `one_split_tiles` a piece: its cut pieces' partial stores and their combine.
    pub balanced_tiles: usize,
    /// The same against a split plan of several splits that fits one wave.
    pub balanced_one_wave_tiles: usize,
}

/// The fast plan, which may look at the batch, at most one split per 256 keys. `groups` is
/// the launch's CTA groups (requests x blocks of query rows); `resident(n)` is how many
/// groups of n split CTAs the device runs at once (SMs / n, or fewer where clusters of n
/// must fit in a GPC).
/// - Where some count up to `overhead.priced_splits` fits one wave: the most splits that
///   do (what `gpu-bench --sweep-splits` found best at every such shape). More would fit
///   a tiny batch's wave too, but past what a cluster merges the splits merge through L2:
///   at 128 heads q 1 B 4 L 4k the 16 splits that fit took 56.0 µs, 8 took 31.6 (run 230).
/// - Past one wave, where a last, part-full wave costs a whole one: the count up to
///   `overhead.priced_splits` with the least `ceil(groups / resident(n))` waves times a
///   split's tiles plus a CTA's overhead, ties to fewer splits. A few splits can pay for
///   their overhead by filling that last wave: at 128 heads and q 1, B 96 is 192 row
///   blocks on 132 multiprocessors, two waves unsplit and three of half the keys split in
///   two.
pub fn fast_split_plan(
    groups: usize,
    context: usize,
    resident: &dyn Fn(usize) -> usize,
    tile_keys: usize,
    overhead: CtaOverhead,
) -> SplitPolicy {
    fast_split_choice(groups, context, resident, tile_keys, overhead).0
}

/// [`fast_split_plan`] and what it costs by the same model: waves times a split's tiles
/// plus a CTA's overhead (one wave where the plan fits one).
pub fn fast_split_choice(
    groups: usize,
    context: usize,
    resident: &dyn Fn(usize) -> usize,
    tile_keys: usize,
    overhead: CtaOverhead,
) -> (SplitPolicy, usize) {
    let most = context.div_ceil(256).max(1);
    let cost = |n: usize| {
        let waves = groups.div_ceil(resident(n).max(1));
        let tiles = equal_split_plan(context, n, tile_keys).split_size_tokens / tile_keys.max(1);
        let fixed = if n == 1 {
            overhead.one_split_tiles
        } else {
            overhead.split_tiles
        };
        waves * (tiles + fixed)
    };
    let priced = most.min(overhead.priced_splits.max(1));
    let one_wave = (1..=priced).filter(|&n| groups <= resident(n)).max();
    let splits =
        one_wave.unwrap_or_else(|| (1..=priced).min_by_key(|&n| (cost(n), n)).unwrap_or(1));
    (equal_split_plan(context, splits, tile_keys), cost(splits))
}

/// The seesaw kernels' overheads on the H100, for the plans' table tests: a copy of
/// `FlashKernels::CTA_OVERHEAD` (gpu/src/ops/flash.rs), whose own test pins the same values.
#[cfg(test)]
pub(crate) const H100_OVERHEAD: CtaOverhead = CtaOverhead {
    one_split_tiles: 1,
    split_tiles: 8,
    priced_splits: 8,
    balanced_tiles: 20,
    balanced_one_wave_tiles: 12,
};

/// Groups of n split CTAs resident at once on the H100, as `gpu-bench` measured them (the
/// driver's cluster counts past one split), for the plans' table tests.
#[cfg(test)]
pub(crate) fn h100_resident_groups(n: usize) -> usize {
    match n {
        1 => 132,
        2 => 66,
        3 => 39,
        4 => 30,
        5 => 22,
        6 => 17,
        7 | 8 => 15,
        n => 132 / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_is_the_shortest_multiple_of_the_unit_within_the_cap() {
        let p = SplitPolicy {
            split_size_tokens: 64,
            max_splits: 4,
        };
        assert_eq!(p.split_of(0), (64, 1));
        assert_eq!(p.split_of(1), (64, 1));
        assert_eq!(p.split_of(64), (64, 1));
        assert_eq!(p.split_of(65), (64, 2));
        assert_eq!(p.split_of(256), (64, 4));
        // Past four units the splits grow by whole units, never past four of them.
        assert_eq!(p.split_of(257), (128, 3));
        assert_eq!(p.split_of(4096), (1024, 4));
        assert_eq!(p.split_of(4097), (1088, 4));
        for len in 0..3000 {
            let (split, n) = p.split_of(len);
            assert!(
                split % 64 == 0 && (1..=4).contains(&n),
                "{len}: {split} x {n}"
            );
            assert!(
                (split * n) as usize >= len,
                "{len} uncovered by {split} x {n}"
            );
            assert!(
                len == 0 || ((n - 1) * split) < len as u32,
                "{len}: an empty split"
            );
        }
    }

    #[test]
    fn the_schedule_maps_keys_up_to_the_first_hole() {
        let p = SplitPolicy {
            split_size_tokens: 16,
            max_splits: 8,
        };
        let table = [4, 5, NO_BLOCK, 7, 8, 9, NO_BLOCK, 1, 2];
        let s = p.schedule(&[40, 17, 0, 5], &table, 3, 16);
        assert_eq!(s.split_len_tokens, vec![16, 16, 16, 16]);
        assert_eq!(s.num_splits, vec![3, 2, 1, 1]);
        // The fourth row is past the table: it maps nothing.
        assert_eq!(s.mapped_kv_tokens, vec![32, 48, 0, 0]);
    }

    /// Postmortem: a zero context or tile divided by zero (found by review, never by a
    /// caller: gpu-bench's shapes are positive).
    #[test]
    fn equal_splits_of_nothing_are_one_tile() {
        let plan = |c, n, t| -> (usize, usize) { equal_split_plan(c, n, t).into() };
        assert_eq!(plan(0, 4, 64), (64, 1));
        assert_eq!(plan(100, 0, 64), (128, 1));
        assert_eq!(plan(100, 2, 0), (50, 2));
        assert_eq!(plan(4096, 2, 64), (2048, 2));
        assert_eq!(plan(4097, 2, 64), (2112, 2));
    }

    #[test]
    fn the_invariant_plan_depends_on_the_model_shape_only() {
        let plan = |rows| -> (usize, usize) { invariant_split_plan(rows, 64).into() };
        assert_eq!(plan(16), (1024, 2));
        assert_eq!(plan(64), (1024, 2));
        assert_eq!(plan(128), (2048, 2));
        assert_eq!(plan(192), (2048, 1));
        assert_eq!(plan(512), (2048, 1));
    }

    /// (heads, q_len, batch, context) on a kernel of 64-row CTAs and 64-key tiles, with the
    /// seesaw kernels' overheads on the H100 (`FlashKernels::CTA_OVERHEAD`).
    fn fast(
        shape: (usize, usize, usize, usize),
        resident: &dyn Fn(usize) -> usize,
    ) -> (usize, usize) {
        let (h, q, b, l) = shape;
        fast_split_plan(b * (q * h).div_ceil(64), l, resident, 64, H100_OVERHEAD).into()
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
        // The table's shapes fill their waves unsplit.
        for shape in [(128, 1, 64, 4096), (128, 2, 64, 4096), (16, 4, 128, 8192)] {
            assert_eq!(fast(shape, &plain).1, 1, "{shape:?}");
        }
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

    /// Small verify batches in one wave: the split count `gpu-bench --sweep-splits` found
    /// fastest at each (run 230, H100, among the equal split counts; the balanced schedule
    /// is `balanced::fast_decode_plan`'s choice). q 1 B 4 was the bug: 16 splits fit one
    /// wave and merged through L2 (56.0 µs against 31.6 for 8).
    #[test]
    fn the_fast_plan_at_small_verify_batches() {
        let h100 = h100_resident_groups;
        for (shape, best) in [
            ((128, 1, 4, 4096), 8),
            ((128, 1, 8, 4096), 6),
            ((128, 1, 16, 4096), 3),
            ((128, 2, 4, 4096), 6),
            ((128, 2, 8, 4096), 3),
            ((128, 2, 16, 4096), 2),
            ((128, 4, 4, 4096), 3),
            ((128, 4, 8, 4096), 2),
            ((128, 4, 16, 4096), 1),
            ((128, 2, 8, 16384), 3),
            ((128, 4, 4, 16384), 3),
        ] {
            assert_eq!(fast(shape, &h100).1, best, "{shape:?}");
        }
        // However few the groups, no more splits than a cluster merges.
        for b in 1..=8 {
            assert!(fast((16, 1, b, 65536), &h100).1 <= 8, "B {b}");
        }
    }

    /// Past one wave: `gpu-bench --sweep-splits` on the H100 (run 130), the split counts
    /// that were fastest, with the resident cluster counts that run measured. The plan
    /// takes the fastest count at each but q 1 B 72 (2 splits, 228 µs; 4 took 216).
    #[test]
    fn the_fast_plan_splits_to_fill_a_last_part_full_wave() {
        let h100 = h100_resident_groups;
        for (shape, best) in [
            ((128, 1, 80, 4096), 2),
            ((128, 1, 96, 4096), 2),
            ((128, 1, 112, 4096), 1),
            ((128, 1, 160, 4096), 1),
            ((128, 1, 200, 4096), 1),
            ((128, 1, 96, 16384), 2),
            ((128, 2, 40, 4096), 2),
            ((128, 2, 48, 4096), 2),
            ((128, 2, 80, 4096), 1),
            ((128, 2, 96, 4096), 1),
            ((128, 4, 20, 4096), 2),
            ((128, 4, 40, 4096), 1),
            ((128, 4, 48, 4096), 1),
            ((128, 4, 72, 4096), 1),
            ((16, 1, 160, 8192), 2),
            ((16, 4, 200, 8192), 1),
        ] {
            assert_eq!(fast(shape, &h100).1, best, "{shape:?}");
        }
        assert_eq!(fast((128, 1, 72, 4096), &h100).1, 2);
        // Long contexts: never more splits than the overhead prices (at 32k keys waves
        // alone would take 9-12, merged through L2).
        for b in 67..=140 {
            assert!(fast((128, 1, b, 32768), &h100).1 <= 8, "B {b}");
        }
    }
}
