//! Kernel checks as a cargo test: on a machine with a CUDA device every case must pass;
//! without one the test prints why it skipped (CI has no GPU).

use specmla_gpu::checks::run_all;
use specmla_gpu::{GpuDevice, GpuError};

#[test]
fn kernels_match_the_f64_reference() {
    let dev = match GpuDevice::open(0) {
        Ok(d) => d,
        Err(e @ (GpuError::NoDriver(_) | GpuError::NoDevice(_) | GpuError::NoNvrtc(_))) => {
            eprintln!("skipping GPU kernel checks: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let results = run_all(&dev).unwrap();
    let failed: Vec<_> = results.iter().filter(|r| !r.passed).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn no_gpu_is_one_clear_error() {
    if let Err(e) = GpuDevice::open(0) {
        let msg = e.to_string();
        assert_eq!(msg.lines().count(), 1, "{msg}");
        assert!(!msg.is_empty());
    }
}
