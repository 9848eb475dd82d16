//! `gpu-test`: runs every kernel check on the GPU and prints a pass/fail table.
//! Exit 0 all passed; 1 a check failed or a CUDA call failed mid-run (a launch, a copy);
//! 2 no usable GPU (no driver or device, NVRTC missing or refusing a kernel, out of
//! memory), one line saying why.

use std::process::ExitCode;
use std::sync::Arc;

use specmla_gpu::{GpuDevice, GpuError};
use specmla_gpu_lab::checks::{run_all, F32_TOL};
use specmla_gpu_lab::checks_dense::DENSE_TOL;
use specmla_gpu_lab::checks_gemm::{run_gemm, GEMM_TOL};
use specmla_gpu_lab::invariance::run_invariance;

/// Runs every CUDA kernel check on GPU 0 against f64 (attention) or the CPU's f32
/// (dense kernels), then the batch-invariance cases, and prints a pass/fail table.
/// Exit 0 all passed; 1 a check failed, or a CUDA call failed mid-run; 2 no usable GPU
/// (one line saying why).
#[derive(clap::Parser)]
#[command(name = "gpu-test", version)]
struct Cli {
    /// The kernel checks alone (attention, dense, prefill), without the GEMM checks and the
    /// engine's invariance cases, a somewhat shorter pass while a kernel changes. A full run is
    /// what counts as the device's verdict.
    #[arg(long)]
    kernels_only: bool,
}

fn main() -> ExitCode {
    let cli = <Cli as clap::Parser>::parse();
    let dev = match GpuDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let dev = Arc::new(dev);
    println!(
        "device: {} ({}); attention kernels within {F32_TOL:.0e} relative of f64, dense \
         kernels within {DENSE_TOL:.0e} of the CPU's f32, bf16 GEMMs within {GEMM_TOL:.0e} \
         of f64 and bit for bit across M, invariance cases bit for bit",
        dev.name, dev.arch
    );
    let mut results = match run_all(&dev) {
        Ok(r) => r,
        Err(e) => return stopped("kernel checks", &e),
    };
    let gemm = if cli.kernels_only {
        Ok((Vec::new(), Vec::new()))
    } else {
        run_gemm(&dev)
    };
    match gemm {
        Ok((r, notes)) => {
            results.extend(r);
            for n in notes {
                println!("note: {n}");
            }
        }
        Err(e) => return stopped("GEMM checks", &e),
    }
    let engine = if cli.kernels_only {
        Ok(Vec::new())
    } else {
        run_invariance(&dev)
    };
    match engine {
        Ok(r) => results.extend(r),
        Err(e) => {
            // The device already ran the kernel checks: a failure here is the engine's.
            eprintln!("error: invariance checks stopped: {e}");
            return ExitCode::from(1);
        }
    }
    println!("{:<19} {:<6} {:>10}  case", "kernel", "result", "max rel");
    for r in &results {
        println!(
            "{:<19} {:<6} {:>10.2e}  {}",
            r.kernel,
            if r.passed { "PASS" } else { "FAIL" },
            r.max_rel_err,
            r.case
        );
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    println!("{} passed, {} failed", results.len() - failed, failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// A run that stopped before its table: exit 2 where the machine is at fault, else 1
/// (a launch or copy failing mid-run is a failure of the code under test, not "no GPU").
fn stopped(what: &str, e: &GpuError) -> ExitCode {
    if e.is_environment() {
        eprintln!("error: {what}: {e}");
        ExitCode::from(2)
    } else {
        eprintln!("error: {what} stopped: {e} (a failed run, not a missing GPU)");
        ExitCode::from(1)
    }
}
