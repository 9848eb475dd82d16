//! The fast mode's balanced decode schedule: every part of the device gets an equal share
//! of the batch's key tiles, whole requests while they fit and a cut one where a share
//! ends, so a batch that fills no whole wave leaves no multiprocessor idle. A cut request's
//! pieces write partials that a combine step merges in key order; an uncut one is written
//! once, final. The cuts depend on the whole batch: this is for the fast mode, never the
//! batch-invariant one.
//!
//! It follows FlashMLA's scheduler (`csrc/smxx/decode/get_decoding_sched_meta/
//! get_decoding_sched_meta.cu` at 9241ae3, parameters in `csrc/api/dense_decode.h`): a
//! request costs its 64-key blocks plus a fixed overhead (5 there), a part's payload is
//! the total over the parts, rounded up, plus that overhead, and the parts take requests
//! in order, cutting the one a payload ends inside. FlashMLA plans it on the device; here
//! it is plain data the plan carries and the kernel reads as given.

use serde::{Deserialize, Serialize};

use crate::split::{fast_split_choice, CtaOverhead, SplitPolicy};

/// How a balanced schedule divides a batch: the device's parts and the costs it weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalancedPolicy {
    /// Parts that run side by side, each a CTA per 64-row block of a request (FlashMLA's
    /// `num_sm_parts`: multiprocessors over row blocks, one KV head).
    pub parts: usize,
    /// Keys a tile holds (the kernel's, 64).
    pub tile_keys: usize,
    /// What a request, or a cut piece of one, costs beyond its tiles, in tiles (FlashMLA's
    /// `fixed_overhead_num_blocks`, 5): a CTA's start on it and its share of a merge.
    pub fixed_tiles: usize,
}

impl BalancedPolicy {
    /// FlashMLA's parts for requests of `row_blocks` 64-row blocks on `sms`
    /// multiprocessors (`sms / row_blocks`, at least one), with its overhead of 5 tiles of
    /// 64 keys.
    pub fn for_device(sms: usize, row_blocks: usize) -> Self {
        Self {
            parts: (sms / row_blocks.max(1)).max(1),
            tile_keys: 64,
            fixed_tiles: 5,
        }
    }

    /// The schedule of requests of `kv_lens` keys.
    pub fn schedule(&self, kv_lens: &[u32]) -> BalancedSchedule {
        balanced_schedule(kv_lens, *self)
    }
}

/// The fast mode's decode plan for a batch: equal splits for every request, or a
/// balanced schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FastPlan {
    Split(SplitPolicy),
    Balanced(BalancedPolicy),
}

/// The fast plan of `batch` requests of `context` keys, `row_blocks` 64-row blocks each, on
/// `sms` multiprocessors (`resident` and `overhead` as for `split::fast_split_plan`, tiles
/// of 64 keys): the cheaper, by the cost model, of the split plan and FlashMLA's balanced
/// schedule. The split plan costs its waves times a CTA's tiles and overhead; the balanced
/// one its parts' share of the tiles, `one_split_tiles` a request, rounded up, plus
/// `overhead.balanced_tiles` (its cut pieces' partials and their combine), or
/// `overhead.balanced_one_wave_tiles` against a split plan of several splits that fits one
/// wave (a small batch: fewer requests cut, against splits that merge too). Ties take the
/// split plan. The balanced schedule wins where a last wave would run part full (at 128
/// heads q 2, B 40: 160 row blocks on 132 multiprocessors) and loses where the waves are
/// whole or nearly so (its partials then cost more than the idle multiprocessors).
pub fn fast_decode_plan(
    (batch, row_blocks, context): (usize, usize, usize),
    sms: usize,
    resident: &dyn Fn(usize) -> usize,
    overhead: CtaOverhead,
) -> FastPlan {
    let groups = batch * row_blocks;
    let (split, split_cost) = fast_split_choice(groups, context, resident, 64, overhead);
    let policy = BalancedPolicy::for_device(sms, row_blocks);
    // A part's CTAs (one a row block) must all be resident: past one part a device, split.
    if policy.parts * row_blocks > sms {
        return FastPlan::Split(split);
    }
    let tiles = context.div_ceil(policy.tile_keys).max(1) + overhead.one_split_tiles;
    let split_one_wave = split.max_splits > 1 && groups <= resident(split.max_splits);
    let fixed = if split_one_wave {
        overhead.balanced_one_wave_tiles
    } else {
        overhead.balanced_tiles
    };
    let balanced_cost = (batch * tiles).div_ceil(policy.parts) + fixed;
    if balanced_cost < split_cost {
        FastPlan::Balanced(policy)
    } else {
        FastPlan::Split(split)
    }
}

/// A piece of a request's keys that one part runs: tiles `[tile_begin, tile_end)`, the
/// request's split `split` in key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub request: u32,
    pub tile_begin: u32,
    pub tile_end: u32,
    pub split: u32,
}

/// A batch divided into parts: part p runs `segments[part_starts[p]..part_starts[p + 1]]`
/// in order. A request of one split is written final; the splits of a cut request write
/// partials in slots `partial_slot[r]..partial_slot[r] + num_splits[r]`, merged in split
/// order afterwards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalancedSchedule {
    pub policy: BalancedPolicy,
    /// `[parts + 1]`.
    pub part_starts: Vec<u32>,
    pub segments: Vec<Segment>,
    /// `[requests]`: each request's splits.
    pub num_splits: Vec<u32>,
    /// `[requests]`: the first partial slot of a request of several splits; [`NO_SLOT`]
    /// for one of a single split.
    pub partial_slot: Vec<u32>,
    /// Partial slots the schedule uses (at most two a part: only a part's first and last
    /// segment can be a cut request's).
    pub partial_slots: usize,
}

/// A request of one split has no partial slot.
pub const NO_SLOT: u32 = u32::MAX;

impl BalancedSchedule {
    /// Parts of the schedule (some may run nothing).
    pub fn parts(&self) -> usize {
        self.part_starts.len().saturating_sub(1)
    }

    /// Part `p`'s segments, in the order it runs them.
    pub fn part(&self, p: usize) -> &[Segment] {
        &self.segments[self.part_starts[p] as usize..self.part_starts[p + 1] as usize]
    }

    /// Where segment `s` writes: its partial slot, or `None` for a final row.
    pub fn slot_of(&self, s: &Segment) -> Option<u32> {
        let first = self.partial_slot[s.request as usize];
        (first != NO_SLOT).then_some(first + s.split)
    }

    /// Requests cut into several splits, as `(request, first slot, splits)`: what the
    /// combine step merges.
    pub fn cut_requests(&self) -> Vec<(u32, u32, u32)> {
        (0..self.num_splits.len())
            .filter(|&r| self.num_splits[r] > 1)
            .map(|r| (r as u32, self.partial_slot[r], self.num_splits[r]))
            .collect()
    }
}

/// FlashMLA's division (see the module header). A request of `len` keys costs
/// `max(ceil(len / tile_keys), 1)` tiles (a request without keys still takes a CTA's
/// start) plus `fixed_tiles`; the payload is `ceil(total / parts) + fixed_tiles`. A part
/// takes whole requests while their cost fits what it has left; then, if more than the
/// overhead is left, the tiles it pays for of the next one, which the next part goes on
/// with.
pub fn balanced_schedule(kv_lens: &[u32], policy: BalancedPolicy) -> BalancedSchedule {
    let unit = policy.tile_keys.max(1);
    let fixed = policy.fixed_tiles;
    let parts = policy.parts.max(1);
    let tiles: Vec<usize> = kv_lens
        .iter()
        .map(|&l| (l as usize).div_ceil(unit).max(1))
        .collect();
    let total: usize = tiles.iter().map(|t| t + fixed).sum();
    let payload = total.div_ceil(parts) + fixed;
    let mut s = BalancedSchedule {
        policy,
        part_starts: vec![0],
        segments: Vec::new(),
        num_splits: vec![0; tiles.len()],
        partial_slot: Vec::new(),
        partial_slots: 0,
    };
    let (mut req, mut tile, mut split) = (0usize, 0usize, 0u32);
    for _ in 0..parts {
        let mut left = payload;
        while req < tiles.len() {
            let rest = tiles[req] - tile;
            let take = if left >= rest + fixed {
                rest
            } else if left > fixed {
                left - fixed
            } else {
                break;
            };
            s.segments.push(Segment {
                request: req as u32,
                tile_begin: tile as u32,
                tile_end: (tile + take) as u32,
                split,
            });
            left -= take + fixed;
            if take == rest {
                s.num_splits[req] = split + 1;
                (req, tile, split) = (req + 1, 0, 0);
            } else {
                (tile, split) = (tile + take, split + 1);
                break;
            }
        }
        s.part_starts.push(s.segments.len() as u32);
    }
    // Each part uses at least ceil(total / parts) of its payload (a cut uses all of it,
    // its second overhead included), so the parts cover the batch: FlashMLA asserts the same.
    assert!(
        req == tiles.len(),
        "balanced schedule left requests unplanned"
    );
    s.assign_slots();
    s
}

impl BalancedSchedule {
    /// Dense partial slots for the requests of several splits, in request order.
    fn assign_slots(&mut self) {
        let mut next = 0u32;
        self.partial_slot = self
            .num_splits
            .iter()
            .map(|&n| {
                if n > 1 {
                    next += n;
                    next - n
                } else {
                    NO_SLOT
                }
            })
            .collect();
        self.partial_slots = next as usize;
    }
}

/// The batch-invariant mode's schedule for the persistent kernel: each request cut where
/// `split` cuts it ([`SplitPolicy::split_of`]: absolute positions, from the request's own
/// length), never elsewhere, so its pieces, their partials and their merge are the same in
/// every batch; only which part runs a piece depends on the batch, and a piece's bits do
/// not. The pieces, in request and key order, go to the parts as contiguous runs whose
/// largest cost (tiles plus `fixed_tiles` a piece) is the least any contiguous division
/// reaches. Unlike the grid of one CTA a split, a part's later pieces start under the
/// earlier ones' ends (the persistent kernel's copy warpgroup loads ahead), so finer
/// invariant splits cost a piece's partial and merge, not a cold start.
///
/// A split length must be a whole number of tiles (a caller bug otherwise, and panics).
pub fn invariant_balanced_schedule(
    kv_lens: &[u32],
    split: SplitPolicy,
    policy: BalancedPolicy,
) -> BalancedSchedule {
    let splits: Vec<(u32, u32)> = kv_lens
        .iter()
        .map(|&l| split.split_of(l as usize))
        .collect();
    balanced_schedule_of_splits(kv_lens, &splits, policy)
}

/// [`invariant_balanced_schedule`] of a schedule already split: request r's keys in
/// `splits[r].1` splits of `splits[r].0` keys (a plan's [`crate::split::SplitSchedule`],
/// read as given). A split length must be a whole number of tiles.
pub fn balanced_schedule_of_splits(
    kv_lens: &[u32],
    splits: &[(u32, u32)],
    policy: BalancedPolicy,
) -> BalancedSchedule {
    assert_eq!(kv_lens.len(), splits.len(), "a split a request");
    let unit = policy.tile_keys.max(1);
    let mut segments = Vec::new();
    let mut num_splits = Vec::with_capacity(kv_lens.len());
    for (r, (&len, &(split_len, n))) in kv_lens.iter().zip(splits).enumerate() {
        assert_eq!(split_len as usize % unit, 0, "splits of whole tiles");
        let per = split_len / unit as u32;
        let tiles = (len as usize).div_ceil(unit).max(1) as u32;
        num_splits.push(n);
        segments.extend((0..n).map(|i| Segment {
            request: r as u32,
            tile_begin: i * per,
            // A split past the keys (no plan makes one) is an empty piece, never a
            // reversed one.
            tile_end: ((i + 1) * per).min(tiles).max(i * per),
            split: i,
        }));
    }
    let costs: Vec<usize> = segments
        .iter()
        .map(|g| (g.tile_end - g.tile_begin) as usize + policy.fixed_tiles)
        .collect();
    let cap = least_contiguous_cap(&costs, policy.parts.max(1));
    let mut part_starts = vec![0u32];
    let mut load = 0;
    for (i, &c) in costs.iter().enumerate() {
        if load + c > cap {
            part_starts.push(i as u32);
            load = 0;
        }
        load += c;
    }
    part_starts.resize(policy.parts.max(1) + 1, segments.len() as u32);
    let mut s = BalancedSchedule {
        policy,
        part_starts,
        segments,
        num_splits,
        partial_slot: Vec::new(),
        partial_slots: 0,
    };
    s.assign_slots();
    s
}

/// The least cap under which `costs`, taken in order, fill at most `parts` contiguous runs
/// of at most the cap each (a binary search over the cap; greedy filling is optimal for
/// a given cap).
fn least_contiguous_cap(costs: &[usize], parts: usize) -> usize {
    let runs = |cap: usize| {
        let (mut n, mut load) = (1, 0);
        for &c in costs {
            if load + c > cap {
                n += 1;
                load = 0;
            }
            load += c;
        }
        n
    };
    let (mut lo, mut hi) = (
        costs.iter().copied().max().unwrap_or(0),
        costs.iter().sum::<usize>(),
    );
    while lo < hi {
        let mid = (lo + hi) / 2;
        if runs(mid) <= parts {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(parts: usize) -> BalancedPolicy {
        BalancedPolicy {
            parts,
            tile_keys: 64,
            fixed_tiles: 5,
        }
    }

    fn ranges(s: &BalancedSchedule, p: usize) -> Vec<(u32, u32, u32)> {
        s.part(p)
            .iter()
            .map(|g| (g.request, g.tile_begin, g.tile_end))
            .collect()
    }

    /// FlashMLA's parts on the H100's 132 multiprocessors: 66 at q 1, 33 at q 2, 16 at q 4
    /// (128 heads), 132 at 16 heads.
    #[test]
    fn the_parts_are_flashmlas() {
        assert_eq!(BalancedPolicy::for_device(132, 2).parts, 66);
        assert_eq!(BalancedPolicy::for_device(132, 4).parts, 33);
        assert_eq!(BalancedPolicy::for_device(132, 8).parts, 16);
        assert_eq!(BalancedPolicy::for_device(132, 1).parts, 132);
        assert_eq!(BalancedPolicy::for_device(4, 8).parts, 1);
    }

    /// Worked by hand from FlashMLA's loop: 3 requests of 4096 keys (64 tiles, cost 69
    /// each, 207 in all) on 2 parts: payload 104 + 5 = 109. Part 0 takes request 0 (69,
    /// 40 left) and 35 tiles of request 1; part 1 the other 29 and request 2.
    #[test]
    fn a_payload_ending_inside_a_request_cuts_it() {
        let s = policy(2).schedule(&[4096, 4096, 4096]);
        assert_eq!(ranges(&s, 0), vec![(0, 0, 64), (1, 0, 35)]);
        assert_eq!(ranges(&s, 1), vec![(1, 35, 64), (2, 0, 64)]);
        assert_eq!(s.num_splits, vec![1, 2, 1]);
        assert_eq!(s.partial_slot, vec![NO_SLOT, 0, NO_SLOT]);
        assert_eq!(s.partial_slots, 2);
        assert_eq!(s.cut_requests(), vec![(1, 0, 2)]);
        assert_eq!(s.slot_of(&s.part(1)[0]), Some(1));
        assert_eq!(s.slot_of(&s.part(1)[1]), None);
    }

    /// A batch that fills the parts whole is not cut: 64 requests of 4096 keys on 66
    /// parts (q 1 at B 64): payload 67 + 5, one request a part, two parts idle.
    #[test]
    fn whole_waves_stay_uncut() {
        let s = policy(66).schedule(&[4096; 64]);
        assert!(s.num_splits.iter().all(|&n| n == 1));
        assert_eq!(s.partial_slots, 0);
        assert!((0..64).all(|p| s.part(p).len() == 1));
        assert!(s.part(64).is_empty() && s.part(65).is_empty());
    }

    /// Left with no more than the overhead, a part stops without a piece: 2 requests of 64
    /// keys (cost 6 each) on 2 parts: payload 6 + 5 = 11; part 0 takes request 0 and has 5
    /// left, which pays for no tile.
    #[test]
    fn an_overhead_alone_buys_no_piece() {
        let s = policy(2).schedule(&[64, 64]);
        assert_eq!(ranges(&s, 0), vec![(0, 0, 1)]);
        assert_eq!(ranges(&s, 1), vec![(1, 0, 1)]);
        // A request without keys costs one tile, as in FlashMLA.
        let s = policy(1).schedule(&[0, 4096, 0]);
        assert_eq!(ranges(&s, 0), vec![(0, 0, 1), (1, 0, 64), (2, 0, 1)]);
    }

    /// One long request on every part: 16 parts at 16384 keys (256 tiles, cost 261):
    /// payload 17 + 5 = 22, so 17 tiles a part; the last part's piece is the rest.
    #[test]
    fn a_lone_request_spreads_over_the_parts() {
        let s = policy(16).schedule(&[16384]);
        assert_eq!(s.num_splits, vec![16]);
        for p in 0..15 {
            assert_eq!(ranges(&s, p), vec![(0, 17 * p as u32, 17 * p as u32 + 17)]);
        }
        assert_eq!(ranges(&s, 15), vec![(0, 255, 256)]);
        assert_eq!(s.partial_slots, 16);
    }

    /// Run 134 on the H100 (`gpu-bench --sweep-splits`, 2 rounds): at 20 shapes whose last
    /// wave is part full, whether the balanced schedule beat the split plan's count, as
    /// (heads, q_len, batch, context, balanced faster). The plan picks the faster at each.
    #[test]
    fn the_fast_plan_balances_where_a_last_wave_runs_part_full() {
        use crate::split::{h100_resident_groups as h100, H100_OVERHEAD as overhead};
        for (h, q, b, l, faster) in [
            (128usize, 1usize, 80usize, 4096usize, true), // 194.9 against 2 splits' 228.4 us
            (128, 1, 96, 4096, true),                     // 212.4 / 231.2
            (128, 1, 112, 4096, false),                   // 255.3 / 1 split's 244.2
            (128, 1, 120, 4096, false),                   // 269.2 / 248.5
            (128, 1, 136, 4096, true),                    // 305.1 / 365.4
            (128, 1, 72, 16384, true),                    // 590.3 / 4 splits' 668.9
            (128, 1, 128, 16384, false),                  // 1044.1 / 1011.3
            (128, 2, 40, 4096, true),                     // 182.3 / 227.2
            (128, 2, 60, 4096, false),                    // 245.1 / 233.5
            (128, 2, 72, 4096, true),                     // 282.3 / 338.7
            (128, 2, 80, 4096, true),                     // 311.6 / 339.4
            (128, 4, 12, 4096, false),                    // 115.2 / 113.5
            (128, 4, 20, 4096, true),                     // 175.7 / 213.8
            (128, 4, 28, 4096, false),                    // 229.6 / 224.9
            (128, 4, 36, 4096, true),                     // 282.2 / 330.7
            (128, 4, 44, 4096, false),                    // 336.7 / 332.9
            (128, 4, 60, 4096, false),                    // 440.4 / 438.7
            (16, 1, 140, 8192, true),                     // 464.3 / 4 splits' 485.5
            (16, 1, 250, 8192, false),                    // 809.9 / 790.3
            (16, 4, 150, 8192, true),                     // 520.4 / 524.9
        ] {
            let rb = (q * h).div_ceil(64);
            let plan = fast_decode_plan((b, rb, l), 132, &h100, overhead);
            assert_eq!(
                matches!(plan, FastPlan::Balanced(_)),
                faster,
                "{h} {q} {b} {l}: {plan:?}"
            );
        }
        // More row blocks than multiprocessors: no part fits, the split plan.
        let plan = fast_decode_plan((3, 200, 4096), 132, &h100, overhead);
        assert!(matches!(plan, FastPlan::Split(_)), "{plan:?}");
        // The table's whole waves stay on the split plan.
        for (h, q, b, l) in [
            (128usize, 1usize, 64, 4096),
            (128, 4, 64, 4096),
            (16, 1, 128, 8192),
        ] {
            let plan = fast_decode_plan((b, (q * h).div_ceil(64), l), 132, &h100, overhead);
            assert!(matches!(plan, FastPlan::Split(_)), "{h} {q} {b} {l}");
        }
    }

    /// Small verify batches, where the split plan fits one wave with several splits: run 230
    /// on the H100 (`gpu-bench --sweep-splits`), the balanced schedule (piece cost 5)
    /// against the plan's split count, as (heads, q_len, batch, context, balanced faster).
    /// 12 tiles is the only balanced overhead that tells the faster at all 11.
    #[test]
    fn the_fast_plan_at_small_verify_batches() {
        use crate::split::{h100_resident_groups as h100, H100_OVERHEAD};
        let balanced = |(h, q, b, l): (usize, usize, usize, usize), o| {
            let plan = fast_decode_plan((b, (q * h).div_ceil(64), l), 132, &h100, o);
            matches!(plan, FastPlan::Balanced(_))
        };
        let fit = [
            ((128, 1, 4, 4096), false),  // 33.6 against 8 splits' 31.6 us
            ((128, 1, 8, 4096), false),  // 40.8 / 6 splits' 38.1
            ((128, 1, 16, 4096), true),  // 55.1 / 3 splits' 57.0
            ((128, 2, 4, 4096), false),  // 37.4 / 6 splits' 37.1
            ((128, 2, 8, 4096), true),   // 50.0 / 3 splits' 55.1
            ((128, 2, 16, 4096), false), // 78.1 / 2 splits' 75.6
            ((128, 4, 4, 4096), true),   // 52.2 / 3 splits' 54.8
            ((128, 4, 8, 4096), false),  // 80.3 / 2 splits' 73.6
            ((128, 4, 16, 4096), false), // 116.8 / 1 split's 116.4
            ((128, 2, 8, 16384), true),  // 128.2 / 3 splits' 165.5
            ((128, 4, 4, 16384), true),  // 129.2 / 3 splits' 165.7
        ];
        for other in [11, 13] {
            let o = CtaOverhead {
                balanced_one_wave_tiles: other,
                ..H100_OVERHEAD
            };
            assert!(fit.iter().any(|&(sh, f)| balanced(sh, o) != f), "{other}");
        }
        // Shapes it was not fitted on (run 231), with the plan's pick: the faster at 9 of 11;
        // at 16 heads q 4 B 8 it takes the balanced schedule (51.2 against 8 splits' 50.0
        // us) and at 16 heads q 1 B 16 the split plan (6 splits' 45.5 against 44.4).
        let held_out = [
            ((128, 1, 2, 4096), true),   // 30.4 / 8 splits' 31.9
            ((128, 1, 6, 4096), false),  // 37.8 / 8 splits' 34.8
            ((128, 1, 12, 4096), false), // 47.5 / 4 splits' 45.0
            ((128, 2, 6, 4096), false),  // 42.8 / 4 splits' 42.2
            ((128, 2, 12, 8192), true),  // 104.3 / 2 splits' 126.8
            ((128, 4, 2, 4096), false),  // 37.2 / 6 splits' 36.9
            ((128, 4, 6, 4096), true),   // 64.6 / 2 splits' 71.2
            ((16, 1, 4, 8192), true),    // 36.3 / 8 splits' 44.0
            ((128, 1, 4, 16384), true),  // 54.3 / 8 splits' 69.7
            ((16, 4, 8, 8192), true),    // the miss: 51.2 / 50.0
            ((16, 1, 16, 4096), false),  // the miss: 44.4 / 45.5
        ];
        for &(shape, picked) in fit.iter().chain(&held_out) {
            assert_eq!(balanced(shape, H100_OVERHEAD), picked, "{shape:?}");
        }
    }

    /// Worked by hand: requests of 701, 1501 and 91 keys (11, 24 and 2 tiles), splits of
    /// 512+ keys (8 tiles), up to 8: pieces of 8 + 3, 8 + 8 + 8 and 2 tiles, costs 13, 8,
    /// 13, 13, 13, 7 (67 in all) on 2 parts: the least cap is 34, so the second request's
    /// first piece shares part 0 with the first request and its other two run on part 1.
    #[test]
    fn invariant_pieces_are_the_split_policys_dealt_in_order() {
        let split = SplitPolicy {
            split_size_tokens: 512,
            max_splits: 8,
        };
        let s = invariant_balanced_schedule(&[701, 1501, 91], split, policy(2));
        assert_eq!(ranges(&s, 0), vec![(0, 0, 8), (0, 8, 11), (1, 0, 8)]);
        assert_eq!(ranges(&s, 1), vec![(1, 8, 16), (1, 16, 24), (2, 0, 2)]);
        assert_eq!(s.num_splits, vec![2, 3, 1]);
        assert_eq!(s.partial_slot, vec![0, 2, NO_SLOT]);
        assert_eq!(s.partial_slots, 5);
        // Alone on 66 parts, the second request's pieces are the same, a part each.
        let alone = invariant_balanced_schedule(&[1501], split, policy(66));
        assert_eq!(
            (0..3).map(|p| ranges(&alone, p)).collect::<Vec<_>>(),
            vec![vec![(0, 0, 8)], vec![(0, 8, 16)], vec![(0, 16, 24)]]
        );
        assert!(alone.part(3).is_empty());
    }

    /// The least largest cost over every division of `costs` into at most `parts`
    /// contiguous runs, by dynamic programming (the reference for the binary search).
    fn least_max_by_dp(costs: &[usize], parts: usize) -> usize {
        let n = costs.len();
        let mut best = vec![vec![usize::MAX; n + 1]; parts + 1];
        best[0][0] = 0;
        for p in 1..=parts {
            best[p][0] = 0;
            for i in 1..=n {
                for j in 0..i {
                    let run: usize = costs[j..i].iter().sum();
                    best[p][i] = best[p][i].min(best[p - 1][j].max(run));
                }
            }
        }
        best[parts][n]
    }

    proptest! {
        /// The invariant schedule: each request's pieces are its split policy's, the same
        /// alone as in any batch on any parts; every tile runs once; the largest part costs
        /// the least any contiguous division reaches; slots are dense.
        #[test]
        fn invariant_pieces_do_not_depend_on_the_batch(
            lens in proptest::collection::vec(0u32..9_000, 1..12),
            parts in 1usize..9,
            unit_tiles in 1usize..40,
            max_splits in 1usize..6,
        ) {
            let split = SplitPolicy { split_size_tokens: 64 * unit_tiles, max_splits };
            let pol = BalancedPolicy { parts, tile_keys: 64, fixed_tiles: 5 };
            let s = invariant_balanced_schedule(&lens, split, pol);
            prop_assert_eq!(s.parts(), parts);
            let pieces = |sched: &BalancedSchedule, r: u32| -> Vec<(u32, u32, u32)> {
                sched.segments.iter().filter(|g| g.request == r)
                    .map(|g| (g.tile_begin, g.tile_end, g.split)).collect()
            };
            for (r, &len) in lens.iter().enumerate() {
                let alone = invariant_balanced_schedule(&[len], split, policy(1));
                prop_assert_eq!(pieces(&s, r as u32), pieces(&alone, 0));
                let tiles = (len as usize).div_ceil(64).max(1) as u32;
                let p = pieces(&s, r as u32);
                prop_assert_eq!(p.len() as u32, s.num_splits[r]);
                prop_assert_eq!((p[0].0, p[p.len() - 1].1), (0, tiles));
                prop_assert!(p.windows(2).all(|w| w[0].1 == w[1].0));
            }
            let costs: Vec<usize> = s.segments.iter()
                .map(|g| (g.tile_end - g.tile_begin) as usize + 5).collect();
            let largest = (0..parts)
                .map(|p| s.part(p).iter().map(|g| (g.tile_end - g.tile_begin) as usize + 5).sum::<usize>())
                .max().unwrap_or(0);
            prop_assert_eq!(largest, least_max_by_dp(&costs, parts));
            let mut slots = Vec::new();
            for r in 0..lens.len() {
                if s.num_splits[r] > 1 {
                    slots.extend(s.partial_slot[r]..s.partial_slot[r] + s.num_splits[r]);
                } else {
                    prop_assert_eq!(s.partial_slot[r], NO_SLOT);
                }
            }
            prop_assert_eq!(slots, (0..s.partial_slots as u32).collect::<Vec<_>>());
        }

        /// Every tile of every request is run once, pieces in key order and split order,
        /// no part costs more than the payload, and partial slots are dense, two a part at
        /// most.
        #[test]
        fn every_tile_runs_once_within_the_payload(
            lens in proptest::collection::vec(0u32..20_000, 1..80),
            parts in 1usize..140,
            fixed in 0usize..9,
        ) {
            let pol = BalancedPolicy { parts, tile_keys: 64, fixed_tiles: fixed };
            let s = pol.schedule(&lens);
            prop_assert_eq!(s.parts(), parts);
            let tiles = |r: usize| (lens[r] as usize).div_ceil(64).max(1) as u32;
            let total: usize = (0..lens.len()).map(|r| tiles(r) as usize + fixed).sum();
            let payload = total.div_ceil(parts) + fixed;
            let mut next = vec![(0u32, 0u32); lens.len()];
            for p in 0..parts {
                let cost: usize = s.part(p).iter().map(|g| (g.tile_end - g.tile_begin) as usize + fixed).sum();
                prop_assert!(cost <= payload, "part {} costs {} > {}", p, cost, payload);
                for (i, g) in s.part(p).iter().enumerate() {
                    let r = g.request as usize;
                    prop_assert!(g.tile_end > g.tile_begin);
                    prop_assert_eq!((g.tile_begin, g.split), next[r]);
                    next[r] = (g.tile_end, g.split + 1);
                    let cut = s.num_splits[r] > 1;
                    prop_assert!(!cut || i == 0 || i + 1 == s.part(p).len());
                }
            }
            let mut slots = Vec::new();
            for r in 0..lens.len() {
                prop_assert_eq!(next[r], (tiles(r), s.num_splits[r]));
                if s.num_splits[r] > 1 {
                    slots.extend(s.partial_slot[r]..s.partial_slot[r] + s.num_splits[r]);
                } else {
                    prop_assert_eq!(s.partial_slot[r], NO_SLOT);
                }
            }
            prop_assert_eq!(slots, (0..s.partial_slots as u32).collect::<Vec<_>>());
            prop_assert!(s.partial_slots <= 2 * parts);
        }
    }
}
