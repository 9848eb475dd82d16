//! specmla-cpu: the CPU reference backend. Exact f32 MLA math on the tiny model whose
//! weights come from a seed (`specmla-model`): the absorbed decode form with split-KV at
//! fixed positions, the materialized prefill form with context chunks merged by LSE,
//! paged latent caches that start as NaN, emulated CUDA graphs that replay the frozen
//! shape. It implements core's `Backend` and knows nothing of the harness.
#![forbid(unsafe_code)]

pub mod attention;
pub mod backend;
pub mod kv_cache;
/// The model both backends run lives in its own crate; re-exported for the backend's
/// modules.
pub use specmla_model as model;

pub use backend::{cpu_backend, CpuBackend, CpuBackendError, CPU_KERNELS};
