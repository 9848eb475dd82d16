//! specmla-replay: re-executes traces recorded by `sim --trace` on either backend,
//! compares every step with its record (bit for bit on the backend kind that recorded
//! it, within stated tolerances on another), localizes the first divergence, and
//! shrinks diverging traces to minimal reproducers (on the CPU).
#![forbid(unsafe_code)]

pub mod audit_log;
pub mod bisect;
pub mod compare;
pub mod replayer;
pub mod show;

use std::sync::Arc;

use serde::Serialize;
use specmla_core::backend::Backend;
use specmla_core::config::EngineConfig;
use specmla_core::fault::Faults;
use specmla_cpu::cpu_backend;
use specmla_sim::model::{DrafterModel, TargetModel};
use specmla_traces::{StepRecord, TraceHeader};

use compare::{
    compare_cross, compare_step, cross_tolerances, CrossNearTie, CrossTolerances, Divergence,
};
use replayer::{ReplayError, Replayer};

/// What a replay found.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub steps_replayed: usize,
    pub steps_in_trace: usize,
    pub divergence: Option<Divergence>,
    /// The backend kind the trace was recorded on and the one it replayed on.
    pub recorded_on: String,
    pub replayed_on: String,
    /// The kernel fingerprints of the recording and of the replay (`Backend::kernels`).
    pub recorded_kernels: String,
    pub replayed_kernels: String,
    /// The device the replay ran on.
    pub device: String,
    /// How steps were compared, in words: `bitwise (same backend)` or `cross-backend
    /// (...)` with the tolerances.
    pub mode: String,
    /// Cross-backend only: the tolerances applied.
    pub tolerances: Option<CrossTolerances>,
    /// Cross-backend only: differing tokens excused as near-ties.
    pub near_ties: Vec<CrossNearTie>,
    /// True when Ctrl-C stopped the replay after `steps_replayed` steps.
    pub interrupted: bool,
    /// Each fault switched on for the replay and the steps (of those replayed) in which
    /// it fired, in catalog order.
    pub faults: Vec<specmla_sim::runner::FaultCount>,
}

impl ReplayReport {
    /// The replay's faults that never fired in the steps it replayed.
    pub fn unfired_faults(&self) -> Vec<&specmla_sim::runner::FaultCount> {
        self.faults.iter().filter(|f| f.fired_steps == 0).collect()
    }
}

impl ReplayReport {
    /// Whether the replay compared bit for bit (it ran on the backend kind that
    /// recorded the trace).
    pub fn bitwise(&self) -> bool {
        self.tolerances.is_none()
    }
}

/// How a replay compares with its trace, in words: `(recorded, replayed)` are each
/// side's backend kind and kernel fingerprint; a trace with stored tensors or not.
pub fn comparison_mode(
    recorded: (&str, &str),
    replayed: (&str, &str),
    tensors: bool,
    t: CrossTolerances,
) -> String {
    if recorded == replayed {
        return "bitwise (same backend)".to_string();
    }
    let what = if recorded.0 == replayed.0 {
        format!(
            "cross-kernel (recorded on {}, replayed on {}: not bit for bit",
            recorded.1, replayed.1
        )
    } else {
        "cross-backend (".to_string()
    };
    let sep = if recorded.0 == replayed.0 { "; " } else { "" };
    if tensors {
        format!(
            "{what}{sep}metadata and tokens exact, near-ties under {:e} reported; attention outputs and logits within abs {:e} + rel {:e})",
            t.near_tie_margin, t.atol, t.rtol
        )
    } else {
        format!(
            "{what}{sep}metadata and tokens exact, near-ties under {:e} reported; the trace has no tensors, so only metadata and tokens are compared: record with --trace-tensors to compare values)",
            t.near_tie_margin
        )
    }
}

/// Replays `records` on the CPU backend under `faults`, stopping at the first
/// divergent step.
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
    replay_records_on(header, records, faults, cpu_backend, on_step)
}

/// [`replay_records_with`] on the backend `make` builds. On the backend kind that
/// recorded the trace every step must match bit for bit ([`compare_step`]); on another
/// kind, within [`cross_tolerances`] of the trace's cache dtype ([`compare_cross`]).
pub fn replay_records_on<B: Backend>(
    header: &TraceHeader,
    records: &[StepRecord],
    faults: Faults,
    make: impl FnOnce(&EngineConfig, Arc<TargetModel>, Arc<DrafterModel>) -> Result<B, B::Error>,
    mut on_step: impl FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    let mut r = Replayer::with_backend(header, faults, make)?;
    let recorded = (header.backend.as_str(), header.kernels.as_str());
    let replayed = (B::KIND, r.kernels());
    let same = recorded == replayed;
    let bf16_compute = header.bf16_compute || r.bf16_compute();
    let tol = cross_tolerances(r.config().kv_cache_dtype, bf16_compute);
    let mut report = ReplayReport {
        steps_replayed: 0,
        steps_in_trace: records.len(),
        divergence: None,
        recorded_on: header.backend.clone(),
        replayed_on: B::KIND.to_string(),
        recorded_kernels: header.kernels.clone(),
        replayed_kernels: r.kernels().to_string(),
        device: r.device_name().to_string(),
        mode: comparison_mode(recorded, replayed, header.trace_tensors, tol),
        tolerances: (!same).then_some(tol),
        near_ties: Vec::new(),
        interrupted: false,
        faults: faults
            .iter()
            .map(|f| specmla_sim::runner::FaultCount {
                id: f.id(),
                fired_steps: 0,
                trigger: f.trigger(),
            })
            .collect(),
    };
    // Under exactly the recorded faults, a step's own check failures were already there
    // when it was recorded: only differences from the record count then.
    let own_checks_count = faults != bisect::recorded_faults(header);
    // A trace whose steps cannot have come from its header is refused before any step
    // runs, rather than read as a divergence.
    for rec in records {
        replayer::check_record_shape(rec, r.config())?;
    }
    for (i, rec) in records.iter().enumerate() {
        if specmla_sim::progress::interrupted() {
            report.interrupted = true;
            return Ok(report);
        }
        let (got, findings) = r.step_checked(rec)?;
        for (f, count) in faults.iter().zip(&mut report.faults) {
            count.fired_steps += findings.faults_fired.has(f) as u64;
        }
        on_step(i + 1);
        let mut found = if same {
            compare_step(rec, &got)
        } else {
            let (d, ties) = compare_cross(rec, &got, &findings, &tol);
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

/// The default scenario's engine config, once (the fuzz targets' reference config).
#[doc(hidden)]
pub fn fuzz_config() -> EngineConfig {
    static CFG: std::sync::OnceLock<EngineConfig> = std::sync::OnceLock::new();
    CFG.get_or_init(|| specmla_sim::scenarios::all()[0].cfg.clone())
        .clone()
}
