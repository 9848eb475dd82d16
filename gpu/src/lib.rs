//! specmla-gpu: the CUDA backend on cudarc. Kernels are CUDA C embedded in the crate and
//! compiled by NVRTC at run time for the device's arch, so nothing CUDA is needed at
//! build time: the crate builds and its tests pass (skipping, with the reason printed)
//! on machines without a GPU.

pub mod checks;
pub mod device;
pub mod mla;
pub mod prefill;
pub mod reference;

pub use device::{GpuDevice, GpuError};
