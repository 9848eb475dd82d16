//! The seesaw decode's timeline: with `SPECMLA_FLASH_DEFINES=FS_TRACE`, the CTA of block
//! (0, 0, 0) writes `clock64` readings over the split partials' buffer, one set of marks per
//! pair iteration and warpgroup (`gpu/kernels/flash_seesaw.cu`, `FS_MARK`). This module
//! reads them back and says where each warpgroup's time goes in a steady iteration (which
//! waits are long, how long each product drains) and how long the CTA spends before its
//! first iteration and after its last, and how the two warpgroups line up: each mark's
//! median offset from warpgroup 0's first mark of the same iteration (which of the two
//! products drains first, whose softmax runs with the tensor cores idle). The marks go
//! out as CSV for anything finer.
//!
//! A mark right after a named barrier or a wgmma wait does not say when that wait ended:
//! the clock can be read before the barrier completes (likely because ptxas emits
//! `BAR.SYNC` with deferred blocking), and the time spent waiting then shows in the phase
//! after it. On the H100 (run 70) warpgroup 0's mark after tile B's maxima barrier came
//! 1100-1500 cycles before warpgroup 1 had even passed the barrier before its own arrival
//! there. Gaps between marks that straddle no wait, and whole iterations, are sound.

use specmla_gpu::ops::{
    FlashKernels, FlashWorkspace, WideKernel, SEESAW_CTA_AT, SEESAW_CTA_MAGIC, SEESAW_CTA_WORDS,
    SEESAW_TRACE_EPILOGUE_MARKS, SEESAW_TRACE_EVENTS, SEESAW_TRACE_ITERS, SEESAW_TRACE_MAGIC,
};
use specmla_gpu::{GpuDevice, GpuError};

use crate::bench::DecodeInputs;

/// Pair iterations the kernel records.
pub const TRACE_ITERS: usize = SEESAW_TRACE_ITERS;
/// Marks per warpgroup and iteration.
pub const TRACE_EVENTS: usize = SEESAW_TRACE_EVENTS;
/// Marks of the CTA's epilogue.
pub const EPILOGUE_MARKS: usize = SEESAW_TRACE_EPILOGUE_MARKS;
/// 64-bit words the kernel writes: the marks, then the CTA's start, its end and a magic
/// word, written last (the timeline is whole only where it reads back), then the
/// epilogue's marks (written before the magic).
pub const TRACE_WORDS: usize = TRACE_ITERS * 2 * TRACE_EVENTS + 3 + EPILOGUE_MARKS;

/// What the epilogue does up to each of its marks (`fw_epilogue`, `fs_item_end`); the last
/// step runs to the CTA's end (the persistent kernel's: its first item's end, the one
/// traced). A one-split CTA stages its rows and writes them (marks 0-2), the persistent
/// kernel issues its next item's Q and stores its rows from registers (0-2); a cluster
/// of splits waits for every split's tiles to be free, pushes its rows to the splits that
/// merge them, and merges its own share (0-3); a global merge writes its partial and
/// merges (0-1, then its end).
pub const EPILOGUE_STEPS: [&str; EPILOGUE_MARKS + 1] = [
    "last products drained, row sums",
    "rows staged (persistent: next item's Q issued; cluster: every split's tiles free)",
    "rows written (persistent: stored from registers; cluster: rows pushed to their splits)",
    "cluster: rows merged and written",
    "to the CTA's end",
];

/// What warpgroup 0 does between its marks i and i + 1; the last phase runs from its last
/// mark (10) to the next iteration's first. Its mark 11, out of order, ends its
/// exponentials inside phase 3 (only the offsets line shows it).
pub const WG0_PHASES: [&str; 11] = [
    "tile A's blocks in, scores issued",
    "scores drain",
    "row maxima, handed over",
    "exp, rescale, own PV issued",
    "wait for tile B's maxima",
    "P_A stored, own PV drain",
    "copies (left) issued",
    "rescale, wait for P_B",
    "other PV (P_B V_B left) drain",
    "copies (left, rope) issued",
    "to the next iteration",
];
/// What warpgroup 1 does between its marks i and i + 1; the last phase runs from its last
/// mark (11) to the next iteration's first.
pub const WG1_PHASES: [&str; 12] = [
    "tile B's blocks in, scores issued",
    "scores drain",
    "row maxima, wait for tile A's",
    "maxima handed over",
    "exp, rescale, own PV issued",
    "P_B stored, handed over",
    "wait for P_A",
    "other PV issued, own PV drain",
    "copies (right) issued",
    "other PV drain",
    "copies (right, rope) issued",
    "to the next iteration",
];

/// One pair iteration's marks, `[warpgroup][event]`.
pub type PairMarks = [[u64; TRACE_EVENTS]; 2];

/// One CTA's marks: `marks[it][wg][event]`, cycles on its SM's clock (0: not recorded,
/// as for the scores of a missing tile B).
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub marks: Vec<PairMarks>,
    /// The CTA's pair iterations, recorded or not.
    pub pairs: usize,
    pub cta_start: u64,
    pub cta_end: u64,
    /// The epilogue's marks (0: not recorded, as for the steps a path does not take).
    pub epilogue: [u64; EPILOGUE_MARKS],
    /// Every persistent CTA's record, in CTA order (empty for other launches).
    pub ctas: Vec<CtaTime>,
}

const _: () = assert!(
    TRACE_WORDS <= SEESAW_CTA_AT,
    "the CTAs' records follow the timeline"
);

/// One persistent CTA's record (`FS_CTA_*` in the kernel): the SM that ran it, how many
/// items it took, its cycles and nanoseconds (`%globaltimer`) from start to end. The launch
/// ends with its slowest CTA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtaTime {
    pub cta: usize,
    pub sm: u32,
    pub items: u32,
    pub cycles: u64,
    pub ns: u64,
}

/// The records of the first `ctas` CTAs in the buffer's 64-bit words; a CTA that wrote no
/// magic word (it had no item) is left out.
pub fn cta_times(words: &[u64], ctas: usize) -> Vec<CtaTime> {
    (0..ctas)
        .filter_map(|cta| {
            let r = &words[SEESAW_CTA_AT + cta * SEESAW_CTA_WORDS..][..SEESAW_CTA_WORDS];
            (r[3] == SEESAW_CTA_MAGIC).then(|| CtaTime {
                cta,
                sm: r[2] as u32,
                items: (r[2] >> 32) as u32,
                cycles: r[1].saturating_sub(r[0]),
                ns: r[5].saturating_sub(r[4]),
            })
        })
        .collect()
}

/// How the CTAs' cycles spread, per item count: the fastest, the median and the slowest
/// (with its CTA and SM), then the five slowest CTAs of the largest item count.
pub fn cta_report(ctas: &[CtaTime]) -> Vec<String> {
    let mut counts: Vec<u32> = ctas.iter().map(|c| c.items).collect();
    counts.sort_unstable();
    counts.dedup();
    let mut lines = Vec::new();
    for &n in counts.iter().rev() {
        let mut group: Vec<&CtaTime> = ctas.iter().filter(|c| c.items == n).collect();
        group.sort_by_key(|c| c.cycles);
        let (lo, mid, hi) = (group[0], group[group.len() / 2], group[group.len() - 1]);
        lines.push(format!(
            "CTAs of {n} items: {}; cycles start to end: fastest {} (CTA {}, SM {}), median {}, slowest {} (CTA {}, SM {}), {:+.1}% over the median",
            group.len(),
            lo.cycles,
            lo.cta,
            lo.sm,
            mid.cycles,
            hi.cycles,
            hi.cta,
            hi.sm,
            100.0 * (hi.cycles as f64 / mid.cycles as f64 - 1.0)
        ));
        let (cycles, ns) = group
            .iter()
            .fold((0u64, 0u64), |(c, t), g| (c + g.cycles, t + g.ns));
        if ns > 0 {
            lines.push(format!(
                "  SM clock over these CTAs: {:.3} GHz (cycles / globaltimer ns)",
                cycles as f64 / ns as f64
            ));
        }
        if n == counts[counts.len() - 1] {
            let slow: Vec<String> = group
                .iter()
                .rev()
                .take(5)
                .map(|c| format!("CTA {} SM {} {}", c.cta, c.sm, c.cycles))
                .collect();
            lines.push(format!("  slowest: {}", slow.join("; ")));
        }
    }
    lines
}

impl Timeline {
    /// The kernel's words for a CTA of `pairs` pair iterations (at most [`TRACE_ITERS`]
    /// kept). `None` without the magic word: a kernel built without `FS_TRACE`, or a
    /// timeline the launch's own writes overwrote.
    pub fn from_words(words: &[u64], pairs: usize) -> Option<Self> {
        assert!(words.len() >= TRACE_WORDS, "a trace is {TRACE_WORDS} words");
        let tail = TRACE_ITERS * 2 * TRACE_EVENTS;
        if words[tail + 2] != SEESAW_TRACE_MAGIC {
            return None;
        }
        let cta_start = words[tail];
        let marks = (0..pairs.min(TRACE_ITERS))
            .map(|it| {
                let mut m: PairMarks = [[0; TRACE_EVENTS]; 2];
                for (wg, row) in m.iter_mut().enumerate() {
                    let at = (it * 2 + wg) * TRACE_EVENTS;
                    row.copy_from_slice(&words[at..at + TRACE_EVENTS]);
                }
                m
            })
            .collect();
        Some(Self {
            marks,
            pairs,
            cta_start,
            cta_end: words[tail + 1],
            epilogue: std::array::from_fn(|i| words[tail + 3 + i]),
            ctas: Vec::new(),
        })
    }

    /// The iterations away from both ends (the first two fill the pipeline, the last two
    /// drain it), or all of them when there are too few.
    fn steady(&self) -> &[PairMarks] {
        let n = self.marks.len();
        if n > 6 {
            &self.marks[2..n - 2]
        } else {
            &self.marks
        }
    }

    /// Mean cycles of each of warpgroup `wg`'s phases over the steady iterations, then the
    /// whole iteration (its first mark to the next iteration's). A phase counts only where
    /// both its marks were recorded; the last phase needs a next iteration.
    pub fn phase_means(&self, wg: usize) -> Vec<(&'static str, f64)> {
        let names: &[&'static str] = if wg == 0 { &WG0_PHASES } else { &WG1_PHASES };
        let last = names.len() - 1; // the phase that ends at the next iteration's mark 0
        let steady = self.steady();
        let mean = |f: &dyn Fn(&PairMarks, usize) -> Option<u64>| {
            let v: Vec<u64> = steady
                .iter()
                .enumerate()
                .filter_map(|(i, m)| f(m, i))
                .collect();
            if v.is_empty() {
                f64::NAN
            } else {
                v.iter().sum::<u64>() as f64 / v.len() as f64
            }
        };
        let gap = |a: u64, b: u64| (a != 0 && b >= a).then(|| b - a);
        let next = |i: usize| steady.get(i + 1).map(|m| m[wg][0]);
        let mut out: Vec<(&'static str, f64)> = names
            .iter()
            .enumerate()
            .map(|(p, &name)| {
                let phase = |m: &PairMarks, i: usize| match p == last {
                    true => next(i).and_then(|n| gap(m[wg][p], n)),
                    false => gap(m[wg][p], m[wg][p + 1]),
                };
                (name, mean(&phase))
            })
            .collect();
        out.push((
            "whole iteration",
            mean(&|m, i| next(i).and_then(|n| gap(m[wg][0], n))),
        ));
        out
    }

    /// Each warpgroup's marks as offsets from warpgroup 0's first mark of the same
    /// iteration, the median over the steady iterations (negative: before it; `None`: a
    /// mark recorded in none of them). The phase means give each warpgroup's own gaps;
    /// these say how the two line up.
    pub fn mark_offsets(&self) -> [[Option<i64>; TRACE_EVENTS]; 2] {
        let steady = self.steady();
        std::array::from_fn(|wg| {
            std::array::from_fn(|e| {
                let mut v: Vec<i64> = steady
                    .iter()
                    .filter(|m| m[0][0] != 0 && m[wg][e] != 0)
                    .map(|m| m[wg][e] as i64 - m[0][0] as i64)
                    .collect();
                v.sort_unstable();
                let n = v.len();
                (n > 0).then(|| (v[(n - 1) / 2] + v[n / 2]).div_euclid(2))
            })
        })
    }

    /// Cycles from the CTA's start to its first iteration (the Q tile's and the first
    /// tiles' loads), and from its last iteration's last mark to its end (the epilogue);
    /// the second only where every iteration was recorded.
    pub fn prologue_epilogue(&self) -> (Option<u64>, Option<u64>) {
        let first = self.marks.first().map(|m| m[0][0]).filter(|&c| c != 0);
        let prologue = first.and_then(|c| c.checked_sub(self.cta_start));
        let epilogue = self.last_mark().and_then(|c| self.cta_end.checked_sub(c));
        (prologue, epilogue)
    }

    /// The last iteration's last mark, where every iteration was recorded: where the
    /// epilogue starts.
    fn last_mark(&self) -> Option<u64> {
        (self.marks.len() == self.pairs)
            .then(|| self.marks.last())
            .flatten()
            .and_then(|m| m.iter().flatten().copied().max())
    }

    /// Cycles of each epilogue step ([`EPILOGUE_STEPS`]) that has both its ends: from the
    /// last iteration's last mark (every iteration recorded) through the epilogue's marks
    /// a path records, to the CTA's end.
    pub fn epilogue_steps(&self) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        let mut from = self.last_mark();
        for (i, &name) in EPILOGUE_STEPS.iter().enumerate() {
            let to = match self.epilogue.get(i) {
                Some(&c) if c != 0 => c,
                Some(_) => continue,
                None => self.cta_end,
            };
            if let Some(f) = from.filter(|&f| to >= f) {
                out.push((name, to - f));
            }
            from = Some(to);
        }
        out
    }

    /// The report: the CTA's start and end, then each warpgroup's phases in cycles and as
    /// a share of its iteration.
    pub fn report(&self) -> Vec<String> {
        let (prologue, epilogue) = self.prologue_epilogue();
        let show = |c: Option<u64>| c.map_or("not recorded".into(), |c| format!("{c} cycles"));
        let mut lines = vec![
            format!(
                "timeline of CTA (0, 0, 0): {} of {} pair iterations recorded, {} cycles start to end",
                self.marks.len(),
                self.pairs,
                self.cta_end.saturating_sub(self.cta_start)
            ),
            format!(
                "  before the first iteration (Q, first tiles): {}; after the last (epilogue): {}",
                show(prologue),
                show(epilogue)
            ),
        ];
        let steps = self.epilogue_steps();
        if !steps.is_empty() {
            let steps: Vec<String> = steps.iter().map(|(n, c)| format!("{n} {c}")).collect();
            lines.push(format!("  epilogue steps (cycles): {}", steps.join("; ")));
        }
        for wg in 0..2 {
            let phases = self.phase_means(wg);
            let whole = phases.last().map_or(f64::NAN, |p| p.1);
            lines.push(format!(
                "warpgroup {wg}, steady iteration (mean cycles, share):"
            ));
            for (name, c) in &phases {
                lines.push(format!("  {name:<36} {c:>8.0} {:>5.1}%", 100.0 * c / whole));
            }
        }
        for (wg, row) in self.mark_offsets().iter().enumerate() {
            let at: Vec<String> = row
                .iter()
                .enumerate()
                .filter_map(|(e, c)| c.map(|c| format!("{e}:{c}")))
                .collect();
            lines.push(format!(
                "warpgroup {wg}'s marks from warpgroup 0's first (median cycles): {}",
                at.join(" ")
            ));
        }
        lines.extend(cta_report(&self.ctas));
        lines
    }

    /// `iteration,warpgroup,event,cycle` rows, cycles counted from the CTA's start (empty
    /// for a mark not recorded).
    pub fn to_csv(&self) -> String {
        let mut out = String::from("iteration,warpgroup,event,cycle\n");
        for (it, m) in self.marks.iter().enumerate() {
            for (wg, row) in m.iter().enumerate() {
                for (e, &c) in row.iter().enumerate() {
                    let at = if c == 0 {
                        String::new()
                    } else {
                        c.saturating_sub(self.cta_start).to_string()
                    };
                    out += &format!("{it},{wg},{e},{at}\n");
                }
            }
        }
        out
    }
}

/// Runs the default decode kernel on `inp` with `plan` (split size, splits) and reads back
/// CTA (0, 0, 0)'s timeline: `Ok(None)` when the kernels were built without `FS_TRACE`,
/// the default kernel is not the seesaw one, or the plan merges splits through global
/// partials (which take the timeline's place). The launch's outputs are not checked.
pub fn seesaw_timeline(
    dev: &GpuDevice,
    k: &FlashKernels,
    inp: &DecodeInputs,
    plan: (usize, usize),
) -> Result<Option<Timeline>, GpuError> {
    let s = inp.shape;
    let max_splits = plan.1;
    let shape = inp.flash_shape(plan);
    // Only the seesaw kernel records a timeline, and only where no global merge writes
    // over it (one split per request, or a cluster merge).
    if k.wide != WideKernel::Seesaw || (max_splits > 1 && !k.merge.in_clusters(max_splits)) {
        return Ok(None);
    }
    let mut ws = FlashWorkspace::new(dev, shape, k.out, None)?;
    // The persistent kernel's CTAs each add a record after the timeline.
    let ctas = k.persistent_ctas(k.wide, shape, dev.sms).unwrap_or(0);
    let words_read = if ctas > 0 {
        SEESAW_CTA_AT + ctas * SEESAW_CTA_WORDS
    } else {
        TRACE_WORDS
    };
    assert!(
        ws.o_part.len() >= 2 * words_read,
        "the split partials hold the timeline"
    );
    let (sched, sched_dev) = inp.schedule(dev, plan)?;
    let scale = 1.0 / 192f32.sqrt();
    for round in 0..3 {
        if round == 2 {
            // The traced launch starts from zeros, so a mark it skips reads as missing.
            ws.o_part.write(dev, &vec![0f32; 2 * words_read])?;
        }
        let bufs = ws.bufs(
            inp.q.ptr(),
            inp.cache.ptr(),
            inp.block_table.ptr(),
            inp.seq_lens.ptr(),
            &sched_dev,
        );
        // SAFETY: DecodeInputs builds a block table with no hole, every entry inside its
        // cache, and its mapped keys from that table.
        unsafe { k.flash_decode(dev, shape, bufs, scale) }?;
    }
    let raw = ws.o_part.read(dev, 2 * words_read)?;
    let words: Vec<u64> = raw
        .chunks_exact(2)
        .map(|w| w[0].to_bits() as u64 | (w[1].to_bits() as u64) << 32)
        .collect();
    // CTA (0, 0, 0) takes split 0 of request 0: its tiles, in pairs.
    let keys = (sched.split_len_tokens[0] as usize).min(s.context);
    Ok(
        Timeline::from_words(&words, keys.div_ceil(64).div_ceil(2)).map(|mut t| {
            t.ctas = cta_times(&words, ctas);
            t
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic trace: every iteration 1000 cycles, warpgroup 0's marks 80 apart,
    /// warpgroup 1's 50 apart after a 300-cycle wait in phase 6.
    fn synthetic(iters: usize) -> Vec<u64> {
        let mut w = vec![0u64; TRACE_WORDS];
        w[TRACE_ITERS * 2 * TRACE_EVENTS] = 7;
        w[TRACE_ITERS * 2 * TRACE_EVENTS + 1] = 7 + 1000 * iters as u64;
        w[TRACE_ITERS * 2 * TRACE_EVENTS + 2] = SEESAW_TRACE_MAGIC;
        for it in 0..iters.min(TRACE_ITERS) {
            let t0 = 10 + 1000 * it as u64;
            for e in 0..WG0_PHASES.len() {
                w[(it * 2) * TRACE_EVENTS + e] = t0 + 80 * e as u64;
            }
            for e in 0..WG1_PHASES.len() {
                w[(it * 2 + 1) * TRACE_EVENTS + e] =
                    t0 + 50 * e as u64 + if e >= 7 { 300 } else { 0 };
            }
        }
        w
    }

    #[test]
    fn epilogue_steps_run_from_the_last_mark_through_those_recorded_to_the_end() {
        // The last iteration's last mark: warpgroup 1's mark 11 of iteration 9 at 9860;
        // the CTA ends at 10007.
        let mut w = synthetic(10);
        let at = TRACE_ITERS * 2 * TRACE_EVENTS + 3;
        let t = Timeline::from_words(&w, 10).unwrap();
        assert_eq!(t.epilogue_steps(), vec![("to the CTA's end", 147)]);
        // A one-split CTA's path: marks 0-2, none at 3.
        w[at..at + 3].copy_from_slice(&[9900, 9950, 9990]);
        let t = Timeline::from_words(&w, 10).unwrap();
        assert_eq!(
            t.epilogue_steps(),
            vec![
                (EPILOGUE_STEPS[0], 40),
                (EPILOGUE_STEPS[1], 50),
                (EPILOGUE_STEPS[2], 40),
                (EPILOGUE_STEPS[4], 17)
            ]
        );
        assert!(t.report().iter().any(|l| l.contains("epilogue steps")));
        // Not every iteration recorded: no start for the first step.
        let t = Timeline::from_words(&w, 70).unwrap();
        assert_eq!(t.epilogue_steps()[0], (EPILOGUE_STEPS[1], 50));
    }

    #[test]
    fn phases_are_the_gaps_between_marks_over_the_steady_iterations() {
        let t = Timeline::from_words(&synthetic(10), 10).unwrap();
        assert_eq!(t.marks.len(), 10);
        let wg0 = t.phase_means(0);
        assert_eq!(wg0.len(), WG0_PHASES.len() + 1);
        assert!(wg0[..10].iter().all(|p| p.1 == 80.0));
        // Mark 10 at 800, the next iteration's mark 0 at 1000.
        assert_eq!(wg0[10].1, 200.0);
        assert_eq!(wg0[11], ("whole iteration", 1000.0));
        // The phases cover the iteration: their sum is its length.
        assert_eq!(wg0[..11].iter().map(|p| p.1).sum::<f64>(), 1000.0);
        let wg1 = t.phase_means(1);
        assert_eq!(wg1[6], ("wait for P_A", 350.0));
        assert_eq!(wg1[0].1, 50.0);
        assert_eq!(wg1[..12].iter().map(|p| p.1).sum::<f64>(), 1000.0);
        let report = t.report();
        assert!(report[0].contains("10 of 10 pair iterations"), "{report:?}");
        // Start 7, first mark 10; the last iteration's last mark is warpgroup 1's at
        // 9010 + 550 + 300, the end 10007.
        assert_eq!(t.prologue_epilogue(), (Some(3), Some(147)));
        assert!(
            report[1].contains("3 cycles") && report[1].contains("147 cycles"),
            "{report:?}"
        );
        assert!(report
            .iter()
            .any(|l| l.contains("wait for P_A") && l.contains("35.0%")));
    }

    #[test]
    fn mark_offsets_line_the_warpgroups_up_against_warpgroup_0s_first_mark() {
        let mut w = synthetic(10);
        // Warpgroup 1 starts 40 cycles before warpgroup 0 in every iteration after the
        // first (which starts at cycle 10), and 25 more in iterations 4 and 5; its mark 1 is
        // recorded in none of them.
        for it in 1..10 {
            let shift = 40 + if it == 4 || it == 5 { 25 } else { 0 };
            for e in 0..TRACE_EVENTS {
                let at = (it * 2 + 1) * TRACE_EVENTS + e;
                w[at] = if e == 1 { 0 } else { w[at] - shift };
            }
        }
        let t = Timeline::from_words(&w, 10).unwrap();
        let off = t.mark_offsets();
        assert_eq!(off[0][0], Some(0));
        assert_eq!(off[0][3], Some(240));
        // Steady iterations 2..8: shifts 40, 40, 65, 65, 40, 40; the median is 40.
        assert_eq!(off[1][0], Some(-40));
        assert_eq!(off[1][7], Some(350 + 300 - 40));
        assert_eq!(off[1][1], None);
        // An even count takes the mean of its two middles, floored: warpgroup 1's mark 2
        // lost in iterations 2 and 6 leaves 60, 35, 35, 60 (100 less each shift).
        for it in [2, 6] {
            w[(it * 2 + 1) * TRACE_EVENTS + 2] = 0;
        }
        let t = Timeline::from_words(&w, 10).unwrap();
        assert_eq!(t.mark_offsets()[1][2], Some(47));
        let report = t.report();
        assert!(
            report.iter().any(|l| l.starts_with("warpgroup 1's marks")
                && l.contains(" 0:-40 2:")
                && !l.contains(" 1:")),
            "{report:?}"
        );
    }

    #[test]
    fn a_mark_not_recorded_leaves_its_phases_out() {
        let mut w = synthetic(10);
        for it in 0..10 {
            w[(it * 2 + 1) * TRACE_EVENTS + 1] = 0; // no tile B: no scores issued
        }
        let t = Timeline::from_words(&w, 10).unwrap();
        let wg1 = t.phase_means(1);
        assert!(wg1[0].1.is_nan() && wg1[1].1.is_nan());
        assert_eq!(wg1[2].1, 50.0);
        assert!(t.to_csv().contains("3,1,1,\n"));
    }

    #[test]
    fn words_without_the_magic_are_no_timeline() {
        assert!(Timeline::from_words(&vec![0u64; TRACE_WORDS], 4).is_none());
        // Output values where the marks were (a global merge wrote its partials there):
        // every word set, the magic word not.
        let mut w: Vec<u64> = (0..TRACE_WORDS as u64)
            .map(|i| 0x3f80_0000_3f80_0000 + i)
            .collect();
        assert!(Timeline::from_words(&w, 4).is_none());
        w[TRACE_ITERS * 2 * TRACE_EVENTS + 2] = SEESAW_TRACE_MAGIC;
        assert!(Timeline::from_words(&w, 4).is_some());
        let t = Timeline::from_words(&synthetic(80), 200).unwrap();
        assert_eq!(t.marks.len(), TRACE_ITERS);
        // Iterations past the recorded ones: no epilogue to measure.
        assert_eq!(t.prologue_epilogue().1, None);
    }

    #[test]
    fn cta_records_give_the_spread_per_item_count() {
        let mut w = vec![0u64; SEESAW_CTA_AT + 6 * SEESAW_CTA_WORDS];
        // CTAs 0-3 take 4 items, 4 takes 3; CTA 5 wrote no magic (no item).
        for (cta, (items, cycles)) in [(4, 1000), (4, 1100), (4, 900), (4, 1300), (3, 700)]
            .into_iter()
            .enumerate()
        {
            let r = &mut w[SEESAW_CTA_AT + cta * SEESAW_CTA_WORDS..][..SEESAW_CTA_WORDS];
            r.copy_from_slice(&[
                50,
                50 + cycles,
                (100 + cta as u64) | (items as u64) << 32,
                SEESAW_CTA_MAGIC,
                1000,
                1000 + cycles / 2,
            ]);
        }
        w[SEESAW_CTA_AT + 5 * SEESAW_CTA_WORDS] = 7;
        let t = cta_times(&w, 6);
        assert_eq!(t.len(), 5);
        assert_eq!(
            t[3],
            CtaTime {
                cta: 3,
                sm: 103,
                items: 4,
                cycles: 1300,
                ns: 650
            }
        );
        let lines = cta_report(&t);
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "CTAs of 4 items: 4; cycles start to end: fastest 900 (CTA 2, SM 102), median 1100, slowest 1300 (CTA 3, SM 103), +18.2%"
            ),
            "{}",
            lines[0]
        );
        assert_eq!(
            lines[1],
            "  SM clock over these CTAs: 2.000 GHz (cycles / globaltimer ns)"
        );
        assert!(lines[2].starts_with("  slowest: CTA 3 SM 103 1300; CTA 1 SM 101 1100"));
        assert!(lines[3].starts_with("CTAs of 3 items: 1;"));
    }
}
