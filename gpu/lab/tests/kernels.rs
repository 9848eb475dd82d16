//! Kernel checks as a cargo test: on a machine with a CUDA device every case must pass;
//! without one the test prints why it skipped (CI has no GPU).

use std::sync::Arc;

use specmla_gpu::{GpuDevice, GpuError};
use specmla_gpu_lab::checks::run_all;
use specmla_gpu_lab::invariance::run_invariance;

/// The device, or `None` after printing why the GPU checks are skipped.
fn device(what: &str) -> Option<GpuDevice> {
    match GpuDevice::open(0) {
        Ok(d) => Some(d),
        Err(
            e @ (GpuError::NoDriver(_)
            | GpuError::NoDevice(_)
            | GpuError::NoNvrtc(_)
            | GpuError::DriverTooOld { .. }),
        ) => {
            // Straight to the stderr handle: the test harness captures `eprintln!`, and
            // the reason for skipping must show in CI logs.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipping GPU {what}: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn kernels_match_the_f64_reference() {
    let Some(dev) = device("kernel checks") else {
        return;
    };
    let results = run_all(&dev).unwrap();
    let failed: Vec<_> = results.iter().filter(|r| !r.passed).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn the_backend_is_batch_invariant_and_f2_breaks_it() {
    let Some(dev) = device("invariance checks") else {
        return;
    };
    let results = run_invariance(&Arc::new(dev)).unwrap();
    let failed: Vec<_> = results.iter().filter(|r| !r.passed).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Either the device opens with a real arch, or the reason is one clear line.
#[test]
fn opening_the_device_succeeds_or_says_why_in_one_line() {
    match GpuDevice::open(0) {
        Ok(dev) => assert!(dev.arch.starts_with("sm_"), "arch {:?}", dev.arch),
        Err(e) => {
            let msg = e.to_string();
            assert_eq!(msg.lines().count(), 1, "{msg}");
            assert!(msg.len() > 20, "too terse: {msg}");
        }
    }
}
