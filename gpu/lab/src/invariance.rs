//! The harness's invariance cases (`specmla_sim::invariance`, one body for every backend)
//! run on the device, as rows of `gpu-test`'s table.

use std::sync::Arc;

use specmla_gpu::{GpuBackend, GpuDevice};

use crate::checks::CaseResult;

/// Every invariance case on `dev`.
pub fn run_invariance(dev: &Arc<GpuDevice>) -> Result<Vec<CaseResult>, String> {
    let make =
        |cfg: &_, target, drafter| GpuBackend::on_device(Arc::clone(dev), cfg, target, drafter);
    let cases = specmla_sim::invariance::run_invariance(&make)?;
    Ok(cases
        .into_iter()
        .map(|c| CaseResult {
            kernel: "invariance",
            case: c.case,
            max_rel_err: c.differing as f64,
            passed: c.passed,
        })
        .collect())
}
