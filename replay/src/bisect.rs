//! Shrinks a diverging trace to a minimal reproducer, on the CPU backend: the steps up
//! to the first divergence, and the fewest requests that still diverge (delta debugging
//! over request sets). Every candidate is re-recorded under the recorded faults, so the result
//! replays on its own: identical under the recorded faults, divergent under the
//! replay's.

use std::collections::BTreeSet;

use specmla_core::backend::Backend;
use specmla_core::fault::Faults;
use specmla_cpu::CpuBackend;
use specmla_traces::{StepRecord, TraceHeader};

use crate::replayer::{parse_config, ReplayError, Replayer};
use crate::{replay_records, replay_records_with, ReplayReport};

/// A trace in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub records: Vec<StepRecord>,
}

impl Trace {
    /// Requests that appear in any step.
    pub fn requests(&self) -> BTreeSet<u64> {
        self.records
            .iter()
            .flat_map(|r| r.rows.iter().map(|x| x.req_id))
            .collect()
    }

    /// Rows across all steps.
    pub fn num_rows(&self) -> usize {
        self.records.iter().map(|r| r.rows.len()).sum()
    }
}

/// The trace restricted to `keep` requests and its first `steps` records; empty steps
/// are dropped, except on a data-parallel rank (they are its dummy steps). Expected values
/// are stale until [`re_record`].
fn restrict(t: &Trace, keep: &BTreeSet<u64>, steps: usize) -> Trace {
    // A data-parallel rank runs a dummy step when it has nothing scheduled: an emptied
    // step stays, or the dummy steps (F15's) would vanish with the requests.
    let keep_idle = parse_config(&t.header).is_ok_and(|c| c.dp_peer_num_tokens > 0);
    let mut header = t.header.clone();
    header.workload.retain(|r| keep.contains(&r.id));
    let records = t.records[..steps.min(t.records.len())]
        .iter()
        .filter_map(|rec| {
            let mut rec = rec.clone();
            rec.rows.retain(|r| keep.contains(&r.req_id));
            rec.forced_drafts.retain(|f| keep.contains(&f.req_id));
            rec.preempted.retain(|id| keep.contains(id));
            (keep_idle || !rec.rows.is_empty()).then_some(rec)
        })
        .collect();
    Trace { header, records }
}

/// Replays `t` on the CPU under the faults it was recorded with and keeps the replay's
/// records as the expected values, so a candidate stays what the original recording
/// would have written for it, on the CPU: the header says so, and the result replays
/// bit for bit there whichever backend recorded `t`.
pub fn re_record(t: &Trace) -> Result<Trace, ReplayError> {
    let mut r = Replayer::new(&t.header, recorded_faults(&t.header))?;
    let mut header = t.header.clone();
    header.backend = <CpuBackend as Backend>::KIND.to_string();
    header.kernels = specmla_cpu::CPU_KERNELS.to_string();
    header.bf16_compute = false;
    let records = t
        .records
        .iter()
        .map(|rec| r.step(rec))
        .collect::<Result<_, _>>()?;
    Ok(Trace { header, records })
}

/// The fault switches a trace was recorded with (unknown ids are ignored: the header
/// came through a checksum, and an id this build lacks cannot be re-created).
pub fn recorded_faults(h: &TraceHeader) -> Faults {
    h.faults
        .iter()
        .filter_map(|id| specmla_core::fault::Fault::from_id(id))
        .collect()
}

/// Whether `t`, re-recorded clean, still diverges under `faults`; returns the report.
fn diverges(t: &Trace, faults: Faults) -> Result<Option<(Trace, ReplayReport)>, ReplayError> {
    let clean = re_record(t)?;
    let report = replay_records(&clean.header, &clean.records, faults)?;
    Ok(report.divergence.is_some().then_some((clean, report)))
}

/// Shrinks `t` (which must diverge under `faults`). `None` if it does not diverge.
pub fn bisect(t: &Trace, faults: Faults) -> Result<Option<Trace>, ReplayError> {
    bisect_with(t, faults, |_| {})
}

/// Where a bisection stands, for progress reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BisectProgress {
    /// The first replay, which finds the step to shrink to: `done` of `steps` replayed.
    FirstReplay { done: usize, steps: usize },
    /// After a candidate: this many requests still kept.
    Kept(usize),
}

/// [`bisect`], calling `on_progress` during the first replay and after every candidate.
/// Ctrl-C ([`specmla_sim::progress::interrupted`]) stops it early with the smallest
/// diverging trace found so far, which replays on its own like the final one.
pub fn bisect_with(
    t: &Trace,
    faults: Faults,
    mut on_progress: impl FnMut(BisectProgress),
) -> Result<Option<Trace>, ReplayError> {
    let steps = t.records.len();
    let report = replay_records_with(&t.header, &t.records, faults, |done| {
        on_progress(BisectProgress::FirstReplay { done, steps })
    })?;
    let Some(d) = report.divergence else {
        return Ok(None);
    };
    let steps = t
        .records
        .iter()
        .position(|r| r.step == d.step)
        .map_or(t.records.len(), |i| i + 1);
    let mut keep: Vec<u64> = restrict(t, &t.requests(), steps)
        .requests()
        .into_iter()
        .collect();
    let candidate = restrict(t, &keep.iter().copied().collect(), steps);
    let Some((clean, rep)) = diverges(&candidate, faults)? else {
        return Ok(None);
    };
    let mut best = trim_after(clean, rep.divergence.as_ref().map(|d| d.step));

    let mut chunk = keep.len().div_ceil(2);
    while chunk >= 1 && keep.len() > 1 {
        let mut i = 0;
        let mut removed_any = false;
        while i < keep.len() && keep.len() > 1 {
            if specmla_sim::progress::interrupted() {
                return Ok(Some(best));
            }
            on_progress(BisectProgress::Kept(keep.len()));
            let candidate: BTreeSet<u64> = keep
                .iter()
                .enumerate()
                .filter(|&(j, _)| j < i || j >= i + chunk)
                .map(|(_, &id)| id)
                .collect();
            if !candidate.is_empty() {
                if let Some((clean, rep)) = diverges(&restrict(t, &candidate, steps), faults)? {
                    keep = candidate.into_iter().collect();
                    best = trim_after(clean, rep.divergence.as_ref().map(|d| d.step));
                    removed_any = true;
                    continue;
                }
            }
            i += chunk;
        }
        if !removed_any {
            chunk /= 2;
        }
    }
    Ok(Some(best))
}

/// Drops the records after the divergent step.
fn trim_after(mut t: Trace, step: Option<u64>) -> Trace {
    if let Some(s) = step {
        t.records.retain(|r| r.step <= s);
    }
    t
}
