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

use compare::{compare_cross, compare_step, CrossNearTie, Divergence, CROSS_ATOL, CROSS_RTOL};
use replayer::{ReplayError, Replayer};
use specmla_sim::checks::Tolerances;
use specmla_sim::runner::DeviceBackend;

/// What a replay found.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub steps_replayed: usize,
    pub steps_in_trace: usize,
    pub divergence: Option<Divergence>,
    /// The backend the trace was recorded on and the one it replayed on.
    pub recorded_on: String,
    pub replayed_on: String,
    /// How steps were compared, in words.
    pub mode: String,
    /// Cross-backend only: differing tokens excused as near-ties.
    pub near_ties: Vec<CrossNearTie>,
}

/// How a replay on `device` compares with a trace recorded on `recorded`.
pub fn comparison_mode(recorded: &str, device: DeviceBackend, tensors: bool) -> String {
    if recorded == device.name() {
        return "bitwise (same backend)".to_string();
    }
    if tensors {
        format!(
            "cross-backend (metadata and tokens exact, near-ties reported; attention outputs within abs {CROSS_ATOL:e} + rel {CROSS_RTOL:e})"
        )
    } else {
        "cross-backend (metadata and tokens exact, near-ties reported; the trace has no tensors, so only tokens are compared)".to_string()
    }
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
    on_step: impl FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    replay_records_on(DeviceBackend::Cpu, header, records, faults, on_step)
}

/// [`replay_records_with`] on the chosen device backend. On the backend that recorded
/// the trace every step must match bit for bit; on the other, see [`compare_cross`].
pub fn replay_records_on(
    device: DeviceBackend,
    header: &TraceHeader,
    records: &[StepRecord],
    faults: Faults,
    mut on_step: impl FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    let mut r = Replayer::new_on(device, header, faults)?;
    let same = header.backend == device.name();
    let near_tie = Tolerances::default().near_tie_margin;
    let mut report = ReplayReport {
        steps_replayed: 0,
        steps_in_trace: records.len(),
        divergence: None,
        recorded_on: header.backend.clone(),
        replayed_on: device.name().to_string(),
        mode: comparison_mode(&header.backend, device, header.trace_tensors),
        near_ties: Vec::new(),
    };
    // Under exactly the recorded faults, a step's own check failures were already there
    // when it was recorded: only differences from the record count then.
    let own_checks_count = faults != bisect::recorded_faults(header);
    for (i, rec) in records.iter().enumerate() {
        let (got, findings) = r.step_checked(rec)?;
        on_step(i + 1);
        let mut found = if same {
            compare_step(rec, &got)
        } else {
            let (d, ties) = compare_cross(rec, &got, &findings, near_tie);
            report.near_ties.extend(ties);
            d
        };
        let failed_checks = !findings.violations.is_empty() || !findings.cross_checks.is_empty();
        if failed_checks && (own_checks_count || found.is_some()) {
            let d = found.get_or_insert_with(|| Divergence::invariants_only(rec.step));
            d.violations = findings.violations;
            d.cross_checks = findings.cross_checks;
        }
        report.steps_replayed = i + 1;
        if let Some(d) = found {
            report.divergence = Some(d);
            return Ok(report);
        }
    }
    Ok(report)
}
