//! specmla-replay: re-executes traces recorded by `sim --trace`, compares every step bit
//! for bit with its record, localizes the first divergence, and shrinks diverging traces
//! to minimal reproducers.
#![forbid(unsafe_code)]

pub mod bisect;
pub mod compare;
pub mod replayer;

use serde::Serialize;
use specmla_core::fault::Faults;
use specmla_traces::{StepRecord, TraceHeader};

use compare::{compare_step, Divergence};
use replayer::{ReplayError, Replayer};

/// What a replay found.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub steps_replayed: usize,
    pub steps_in_trace: usize,
    pub divergence: Option<Divergence>,
}

/// Replays `records` under `faults`, stopping at the first divergent step.
pub fn replay_records(
    header: &TraceHeader,
    records: &[StepRecord],
    faults: Faults,
) -> Result<ReplayReport, ReplayError> {
    replay_records_with(header, records, faults, |_| {})
}

/// [`replay_records`], calling `on_step` with the number of steps replayed so far.
pub fn replay_records_with(
    header: &TraceHeader,
    records: &[StepRecord],
    faults: Faults,
    mut on_step: impl FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    let mut r = Replayer::new(header, faults)?;
    // Under exactly the recorded faults, a step's own check failures were already there
    // when it was recorded: only differences from the record count then.
    let own_checks_count = faults != bisect::recorded_faults(header);
    for (i, rec) in records.iter().enumerate() {
        let (got, findings) = r.step_checked(rec)?;
        on_step(i + 1);
        let mut found = compare_step(rec, &got);
        let failed_checks = !findings.violations.is_empty() || !findings.cross_checks.is_empty();
        if failed_checks && (own_checks_count || found.is_some()) {
            let d = found.get_or_insert_with(|| Divergence::invariants_only(rec.step));
            d.violations = findings.violations;
            d.cross_checks = findings.cross_checks;
        }
        if let Some(d) = found {
            return Ok(ReplayReport {
                steps_replayed: i + 1,
                steps_in_trace: records.len(),
                divergence: Some(d),
            });
        }
    }
    Ok(ReplayReport {
        steps_replayed: records.len(),
        steps_in_trace: records.len(),
        divergence: None,
    })
}
