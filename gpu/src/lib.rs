//! specmla-gpu: the CUDA backend on cudarc. Kernels are CUDA C embedded in the crate and
//! compiled by NVRTC at run time for the device's arch, so nothing CUDA is needed at
//! build time: the crate builds and its tests pass (skipping, with the reason printed)
//! on machines without a GPU. Its test and bench lab is the `specmla-gpu-lab` crate.

pub mod backend;
pub mod device;
pub mod launch;
pub mod ops;
pub mod weights;
pub mod workspace;

pub use backend::{GpuBackend, GpuBackendError};
pub use device::{GpuDevice, GpuError};
