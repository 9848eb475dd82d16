//! specmla-gpu-lab: the CUDA backend's test and bench lab, apart from the backend and with
//! its own dependencies. `gpu-test` checks every kernel against f64 (attention) or the
//! CPU's f32 (dense) and runs the engine-level invariance cases on the device;
//! `gpu-bench` times the MLA decode kernels against measured ceilings and peers.

pub mod bench;
pub mod bench_prefill;
pub mod bench_step;
pub mod calibrate;
pub mod checks;
pub mod checks_balanced;
pub mod checks_dense;
pub mod checks_gemm;
pub mod checks_prefill;
pub mod checks_weights;
pub mod clock;
pub mod invariance;
pub mod reference;
pub mod trace;
