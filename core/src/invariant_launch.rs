//! Which kernel runs a batch-invariant decode launch. The split schedule (each request's
//! split length and count, from the policy and the request's own length) fixes the bits.
//! Two launches run the same splits with the same bits: the split grid (a CTA a split, the
//! splits merged in clusters or through memory) and the persistent kernel on
//! [`invariant_balanced_schedule`](crate::balanced::invariant_balanced_schedule) (the
//! pieces dealt to parts, a cut request's partials merged after the launch). `gpu-test`
//! checks that they agree bit for bit, so a launch may take either, per batch, by cost;
//! the choice is this module's, the backend only runs it.
//!
//! The rule comes from the H100 (run 205, `gpu-bench`: both launches on the same splits at
//! 45 shapes, one process; with runs 207 and 208 it is this module's test):
//! - no request cut: the grid of one split a request (the host then takes the persistent
//!   one-split kernel wherever a request has two or more row blocks). A grid of the
//!   policy's cap would hold empty splits: at 128 heads, q 1, B 64, L 2k it took 132.5 µs
//!   against 73.2. The balanced persistent schedule of whole requests measured
//!   0.965-1.009 of the one-split kernel's time in `gpu-bench` (runs 205-215; 0.965-0.984
//!   at the part-full 128-head q 2 B 40 and q 4 B 36), but taken by the engine's eager
//!   steps it made their steps with prefill rows slower (run 215, q 4: attention 1.04 →
//!   1.67 ms in the mixed step, 5.6 → 7.3 ms in steps with context chunks; run 216 the
//!   same at q 1), not traced, so whole requests keep the one-split kernel. At one row
//!   block the one-split grid took 1.011x and 1.040x the cap's grid (16 heads L 1k, q 1 B
//!   64 and q 4 B 100, runs 207 and 215), whose empty split CTAs it spares; why the
//!   cap's clusters ran faster was not traced.
//! - requests of two or more row blocks cut into splits of [`PERSISTENT_SPLIT_KEYS`] keys or
//!   more: the persistent kernel, 0.940-1.001 of the grid's time at 10 shapes (128 heads,
//!   q 1, L 8k and 16k, B 16-128). Its copy warpgroup and its L2 prefetch among a request's
//!   row blocks make a key cheaper, and long pieces pay for the partials and the combine.
//! - otherwise, at two or more row blocks, the persistent kernel where the grid's last wave
//!   runs at most [`LAST_WAVE_SIXTHS`] sixths full; at one row block (no L2 prefetch,
//!   3-5% slower at whole waves) only past one wave and at most half full. The grid
//!   elsewhere: at whole or nearly whole waves the persistent kernel's partial stores and
//!   combine cost more than the grid's wave starts (1.001-1.101 of the grid's time).
//!
//! The form was fitted in three rounds, each checked on shapes it had not seen. A single
//! threshold on the waves' idle room (run 205's data) took the faster launch at 15 of run
//! 207's 16 new shapes; a threshold per row-block count (runs 205 and 207) at 13 of run
//! 208's 16, missing single waves, where the grid's idle multiprocessors cost it nothing
//! and the persistent kernel's pieces cost their partials (128 heads q 1 B 30 and 31 at L
//! 4k 1.04-1.05x, 16 heads q 1 B 55 at L 8k 1.045x). This form, the last wave's fill,
//! takes the faster launch (or one within the 2.1% floor) at all 77 shapes of the three
//! runs; run 209 checks it on 16 more.

use serde::{Deserialize, Serialize};

use crate::balanced::BalancedPolicy;
use crate::split::SplitPolicy;

/// The largest of a launch's split counts, a count of 0 (no plan makes one) read as one
/// split: the grid's splits a request.
pub fn largest_split_count(counts: impl IntoIterator<Item = u32>) -> usize {
    counts
        .into_iter()
        .map(|n| n.max(1) as usize)
        .max()
        .unwrap_or(1)
}

/// Each request's `(split_len_tokens, num_splits)` under `split`: what
/// [`invariant_launch`] reads, for callers that hold lengths and a policy.
pub fn splits_of(kv_lens: &[u32], split: SplitPolicy) -> Vec<(u32, u32)> {
    kv_lens
        .iter()
        .map(|&l| split.split_of(l as usize))
        .collect()
}

/// How a batch-invariant decode launch runs its splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InvariantLaunch {
    /// The split grid, `max_splits` splits a request: the batch's largest split count,
    /// which may be below the policy's cap.
    Grid { max_splits: usize },
    /// The persistent kernel on the invariant balanced schedule over these parts.
    Persistent(BalancedPolicy),
}

/// The shortest split (keys) that takes the persistent kernel by its length alone, where
/// a request has two or more row blocks.
pub const PERSISTENT_SPLIT_KEYS: usize = 4096;

/// At two or more row blocks, cut requests take the persistent kernel where the grid's
/// last wave runs at most this many sixths full (run 207: 128 heads q 1 B 60 at L 4k, 82%
/// full, 0.947 of the grid's time; run 208: 85-94% full, 1.001-1.034).
pub const LAST_WAVE_SIXTHS: usize = 5;

/// The launch of requests split as `splits` (each request's `(split_len_tokens,
/// num_splits)`: the plan's schedule, read as given), `row_blocks` 64-row blocks a
/// request, on `sms` multiprocessors, where `resident(n)` groups of n split CTAs run at
/// once (the driver's count of resident clusters past one split). See the module header.
pub fn invariant_launch(
    splits: &[(u32, u32)],
    row_blocks: usize,
    sms: usize,
    resident: &dyn Fn(usize) -> usize,
) -> InvariantLaunch {
    let largest = largest_split_count(splits.iter().map(|&(_, n)| n));
    let grid = InvariantLaunch::Grid {
        max_splits: largest,
    };
    let policy = BalancedPolicy::for_device(sms, row_blocks);
    // No request cut, no row, or parts whose CTAs could not all be resident: the grid.
    if largest == 1 || row_blocks == 0 || policy.parts * row_blocks > sms {
        return grid;
    }
    let shortest_cut = splits
        .iter()
        .filter(|&&(_, n)| n > 1)
        .map(|&(len, _)| len as usize)
        .min()
        .unwrap_or(0);
    if row_blocks >= 2 && shortest_cut >= PERSISTENT_SPLIT_KEYS {
        return InvariantLaunch::Persistent(policy);
    }
    // The grid's waves and how full its last one runs.
    let groups = splits.len() * row_blocks;
    let per_wave = resident(largest).max(1);
    let waves = groups.div_ceil(per_wave);
    let last = groups - (waves - 1) * per_wave;
    let persistent = if row_blocks >= 2 {
        last * 6 <= per_wave * LAST_WAVE_SIXTHS
    } else {
        waves >= 2 && last * 2 <= per_wave
    };
    if persistent {
        InvariantLaunch::Persistent(policy)
    } else {
        grid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::{h100_resident_groups, invariant_split_plan};

    fn launch(heads: usize, q: usize, batch: usize, context: u32) -> InvariantLaunch {
        let rows = heads * q;
        let split = invariant_split_plan(rows, 64);
        invariant_launch(
            &splits_of(&vec![context; batch], split),
            rows.div_ceil(64),
            132,
            &h100_resident_groups,
        )
    }

    /// Runs 205, 207 and 208 on the H100 (`gpu-bench`, 10 and 20 repetitions, runs 207
    /// and 208 the mean of two processes each): the split grid of the policy's cap (as a graph launches it)
    /// against the persistent kernel on the same splits, as (heads, q_len, batch, context,
    /// persistent / grid time). The rule takes the faster launch wherever they differ by
    /// more than 2.1%; two identical launches differed by up to 1.7% (run 204). The one
    /// shape it misses by more than that floor: 16 heads, q 1, B 128, L 4k, where it keeps
    /// the grid and the persistent kernel was 2.1% faster.
    #[test]
    fn the_launch_is_the_faster_one_runs_205_207_and_208_measured() {
        let persist = |h, q, b, l| matches!(launch(h, q, b, l), InvariantLaunch::Persistent(_));
        #[rustfmt::skip]
        let cut = [
            // Run 205.
            (16usize, 1usize, 64usize, 4096u32, 1.038f64), (16, 1, 64, 8192, 1.029),
            (16, 1, 128, 4096, 0.979), (16, 1, 128, 8192, 1.000), (16, 1, 140, 4096, 0.872),
            (16, 1, 140, 8192, 0.885), (16, 1, 200, 4096, 0.921), (16, 1, 200, 8192, 0.941),
            (16, 4, 64, 8192, 1.039), (16, 4, 128, 8192, 1.041), (16, 4, 140, 8192, 0.919),
            (128, 1, 16, 4096, 0.975), (128, 1, 16, 8192, 0.965), (128, 1, 16, 16384, 0.940),
            (128, 1, 32, 4096, 1.062), (128, 1, 32, 8192, 1.001), (128, 1, 32, 16384, 0.969),
            (128, 1, 64, 4096, 1.009), (128, 1, 64, 8192, 0.974), (128, 1, 64, 16384, 0.961),
            (128, 1, 96, 4096, 1.010), (128, 1, 96, 8192, 0.974), (128, 1, 96, 16384, 0.965),
            (128, 1, 128, 4096, 1.021), (128, 1, 128, 8192, 0.974),
            (128, 1, 128, 16384, 0.967),
            // Run 207, shapes run 205 did not have.
            (128, 1, 24, 4096, 0.987), (128, 1, 40, 4096, 0.889), (128, 1, 56, 4096, 0.918),
            (128, 1, 60, 4096, 0.947), (128, 1, 80, 4096, 0.920), (128, 1, 64, 6144, 0.800),
            (128, 1, 64, 10240, 0.804), (128, 1, 32, 12288, 0.892), (128, 1, 48, 8192, 0.888),
            (16, 2, 100, 8192, 0.989), (16, 2, 120, 8192, 1.015), (64, 1, 64, 8192, 1.046),
            (64, 1, 90, 8192, 0.956), (16, 4, 180, 4096, 1.090),
            // Run 208, shapes runs 205 and 207 did not have.
            (128, 1, 30, 4096, 1.039), (128, 1, 31, 4096, 1.046), (128, 1, 33, 4096, 1.101),
            (128, 1, 34, 4096, 0.922), (128, 1, 62, 4096, 1.001), (128, 1, 63, 4096, 1.034),
            (128, 1, 94, 4096, 1.006), (128, 1, 95, 4096, 1.022), (16, 1, 55, 8192, 1.045),
            (16, 1, 62, 8192, 1.037), (16, 1, 118, 8192, 1.013), (16, 1, 120, 8192, 1.029),
            (16, 1, 125, 8192, 1.009), (64, 2, 60, 4096, 0.991), (64, 2, 64, 4096, 1.039),
            (64, 2, 64, 8192, 0.972),
        ];
        for (h, q, b, l, ratio) in cut {
            let p = persist(h, q, b, l);
            let ok = (p && ratio <= 1.0) || (!p && ratio >= 1.0) || (ratio - 1.0).abs() <= 0.0215;
            assert!(
                ok,
                "H {h} q {q} B {b} L {l}: persistent {p}, measured {ratio}"
            );
        }
        // Whole requests: the one-split grid (the persistent one-split kernel from two row
        // blocks: 128 heads q 1 at L 2k, q 2 and q 4; `_2wg` at 16 heads L 1k).
        for (h, q, b, l) in [
            (128, 1, 64, 2048),
            (128, 1, 112, 2048),
            (128, 2, 40, 4096),
            (128, 4, 36, 4096),
            (16, 1, 64, 1024),
        ] {
            assert_eq!(launch(h, q, b, l), InvariantLaunch::Grid { max_splits: 1 });
        }
    }

    /// The grid is as wide as the batch's most split request needs, not the cap.
    #[test]
    fn the_grid_takes_the_batchs_largest_split_count() {
        let split = SplitPolicy {
            split_size_tokens: 64,
            max_splits: 8,
        };
        // 200 keys take 4 splits of 64, 100 keys 2, 64 keys 1; groups of 4 splits, 30 at
        // once on the H100. 40 requests of one row block: a second wave 10 of 30 full.
        let mut lens = vec![64u32, 200, 100];
        lens.resize(40, 200);
        let l = invariant_launch(&splits_of(&lens, split), 1, 132, &h100_resident_groups);
        assert_eq!(
            l,
            InvariantLaunch::Persistent(BalancedPolicy::for_device(132, 1))
        );
        // 30 requests fill one wave: the grid, 4 splits a request (the cap is 8); 3 do not,
        // but a single wave at one row block keeps the grid too.
        for n in [30, 3] {
            let l = invariant_launch(&splits_of(&lens[..n], split), 1, 132, &h100_resident_groups);
            assert_eq!(l, InvariantLaunch::Grid { max_splits: 4 });
        }
    }

    /// Splits of 4096 keys and more at two or more row blocks take the persistent kernel
    /// even where the grid's waves are whole; at one row block they do not.
    #[test]
    fn long_splits_take_the_persistent_kernel_past_one_row_block() {
        let split = SplitPolicy {
            split_size_tokens: 4096,
            max_splits: 2,
        };
        let lens = vec![8192u32; 33];
        let two = invariant_launch(&splits_of(&lens, split), 2, 132, &h100_resident_groups);
        assert_eq!(
            two,
            InvariantLaunch::Persistent(BalancedPolicy::for_device(132, 2))
        );
        // 66 requests of one row block: one whole wave of pairs.
        let lens = vec![8192u32; 66];
        let one = invariant_launch(&splits_of(&lens, split), 1, 132, &h100_resident_groups);
        assert_eq!(one, InvariantLaunch::Grid { max_splits: 2 });
    }

    /// An empty batch, parts that could not be resident and launches without rows keep
    /// the grid.
    #[test]
    fn degenerate_batches_keep_the_grid() {
        let split = invariant_split_plan(128, 64);
        let none = invariant_launch(&splits_of(&[], split), 2, 132, &h100_resident_groups);
        assert_eq!(none, InvariantLaunch::Grid { max_splits: 1 });
        let wide = invariant_launch(
            &splits_of(&[8192; 4], split),
            200,
            132,
            &h100_resident_groups,
        );
        assert_eq!(wide, InvariantLaunch::Grid { max_splits: 2 });
        let rowless =
            invariant_launch(&splits_of(&[8192; 4], split), 0, 132, &h100_resident_groups);
        assert_eq!(rowless, InvariantLaunch::Grid { max_splits: 2 });
        // A count of 0 (no plan makes one) reads as one split.
        assert_eq!(largest_split_count([]), 1);
        assert_eq!(largest_split_count([0, 3, 2]), 3);
        let zero = invariant_launch(&[(2048, 0), (2048, 1)], 2, 132, &h100_resident_groups);
        assert_eq!(zero, InvariantLaunch::Grid { max_splits: 1 });
    }
}
