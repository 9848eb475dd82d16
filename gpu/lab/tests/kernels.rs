//! Kernel checks as a cargo test: on a machine with a CUDA device every case must pass;
//! without one the test prints why it skipped (CI has no GPU), unless
//! `SPECMLA_REQUIRE_GPU=1` says the runner has a GPU: then no device is a failure.

use std::sync::Arc;

use specmla_gpu::{GpuDevice, GpuError};
use specmla_gpu_lab::checks::run_all;
use specmla_gpu_lab::invariance::run_invariance;

/// The device, or `None` after printing why the GPU checks are skipped. Under
/// `SPECMLA_REQUIRE_GPU=1` a missing device fails the test instead.
fn device(what: &str) -> Option<GpuDevice> {
    match GpuDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) if required() => panic!("SPECMLA_REQUIRE_GPU=1 but no GPU for the {what}: {e}"),
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

/// Whether this runner promises a GPU (`SPECMLA_REQUIRE_GPU=1`).
fn required() -> bool {
    std::env::var("SPECMLA_REQUIRE_GPU").is_ok_and(|v| v == "1")
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
            assert!(!required(), "SPECMLA_REQUIRE_GPU=1 but no GPU: {msg}");
            assert_eq!(msg.lines().count(), 1, "{msg}");
            assert!(msg.len() > 20, "too terse: {msg}");
        }
    }
}

/// Without a device, `SPECMLA_REQUIRE_GPU=1` turns the skip into a failure: this test
/// binary, run again with it on the opening test, must fail (and pass without it).
#[test]
fn requiring_a_gpu_fails_where_there_is_none() {
    if GpuDevice::open(0).is_ok() || required() {
        return; // a device to test on, or already the inner run
    }
    let run = |require: bool| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "opening_the_device_succeeds_or_says_why_in_one_line",
        ]);
        if require {
            cmd.env("SPECMLA_REQUIRE_GPU", "1");
        } else {
            cmd.env_remove("SPECMLA_REQUIRE_GPU");
        }
        cmd.output().unwrap().status.success()
    };
    assert!(run(false), "the opening test fails without the switch");
    assert!(
        !run(true),
        "SPECMLA_REQUIRE_GPU=1 still passed without a GPU"
    );
}
