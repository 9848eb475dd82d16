//! Typed host wrappers of every specmla kernel, one file per kernel family:
//! [`attention`] (the f32 MLA decode, prefill and LSE merge the backend runs), [`dense`]
//! (the model's embedding, norms, GEMM, RoPE and friends, plus the lab's fills), [`gemm`]
//! (the bf16 projections on cuBLASLt) and
//! [`flash`] (the bf16 tensor-core decode at DeepSeek-V3 widths, compiled into its own
//! module only by those who use it). Each wrapper checks on the host that its buffers
//! hold what the launch will touch, then launches through [`launch`]; wrappers whose
//! kernels read indices they do not check say so in their docs. The backend and the
//! kernel checks call the same wrappers, so what `gpu-test` verifies is what the backend
//! runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

use crate::device::{GpuDevice, GpuError};
use crate::launch::{launch, Arg, THREADS};

pub mod attention;
pub mod chunked_prefill;
pub mod dense;
pub mod flash;
pub mod flash_balanced;
pub mod gemm;
pub mod prefill_flash;

pub use attention::*;
pub use chunked_prefill::*;
pub use flash::*;
pub use flash_balanced::*;
pub use gemm::{Gemm, GemmAlgo, GemmOut, GemmShape};
pub use prefill_flash::*;

/// The kernels' CUDA C sources, compiled as one module after `common.cuh`.
pub const KERNEL_SRC: [&str; 3] = [
    include_str!("../../kernels/mla.cu"),
    include_str!("../../kernels/prefill.cu"),
    include_str!("../../kernels/dense.cu"),
];

const NAMES: [&str; 29] = [
    "init_f32",
    "init_bf16_t",
    "init_kv_b",
    "fill_bf16_hash",
    "scrub_l2",
    "kv_write",
    "kv_write_bf16",
    "to_bf16",
    "mla_decode",
    "gather_context",
    "expand_kv",
    "mla_prefill",
    "merge_states",
    "embed_rows",
    "rms_norm",
    "matmul",
    "rope",
    "silu_mul",
    "round_bf16",
    "absorb_q",
    "apply_uv",
    "gather_rows",
    "concat_rows",
    "copy_cols",
    "copy_cols_bf16",
    "fill",
    "gather_rows2",
    "row_digest",
    "sm_clock",
];

pub use specmla_core::config::MlaDims;

/// The compiled f32 kernels (one NVRTC module): what the backend runs, and the fills the
/// lab uses. The tensor-core decode is [`FlashKernels`].
pub struct Kernels {
    _module: Arc<CudaModule>,
    fns: BTreeMap<&'static str, CudaFunction>,
}

fn blocks(n: usize) -> usize {
    n.div_ceil(THREADS as usize)
}

impl Kernels {
    /// Compiles the f32 kernels for `dev` (one NVRTC call) and loads them.
    pub fn load(dev: &GpuDevice) -> Result<Self, GpuError> {
        let module = dev.compile("specmla_kernels.cu", &KERNEL_SRC.join("\n"))?;
        let mut fns = BTreeMap::new();
        for name in NAMES {
            let f = module
                .load_function(name)
                .map_err(GpuError::driver(format!("loading kernel {name}")))?;
            fns.insert(name, f);
        }
        Ok(Self {
            _module: module,
            fns,
        })
    }

    /// # Safety
    /// As [`launch`]: the wrapper calling this checked the buffers against `args`.
    unsafe fn go(
        &self,
        dev: &GpuDevice,
        name: &'static str,
        grid: (usize, usize),
        args: &[Arg],
    ) -> Result<(), GpuError> {
        // SAFETY: forwarded.
        unsafe { launch(dev, &self.fns[name], name, grid, args) }
    }
}

#[cfg(test)]
mod tests {
    /// Every kernel a wrapper launches by name is loaded: `go` looks names up in the
    /// module's table, so a kernel missing from `NAMES` would only fail on a device.
    #[test]
    fn every_launched_kernel_is_loaded() {
        let sources = [include_str!("attention.rs"), include_str!("dense.rs")];
        let mut launched = 0;
        for src in sources {
            for call in src.split("self.go(dev, \"").skip(1) {
                let name = &call[..call.find('"').expect("closing quote")];
                assert!(
                    super::NAMES.contains(&name),
                    "kernel {name} is not in NAMES"
                );
                launched += 1;
            }
        }
        assert!(launched > 20, "found {launched} launches");
        for name in super::NAMES {
            let defined = format!("void {name}(");
            assert!(
                super::KERNEL_SRC.iter().any(|s| s.contains(&defined)),
                "{name} is not defined in the kernel sources"
            );
        }
    }
}
