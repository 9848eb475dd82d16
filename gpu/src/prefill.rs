//! Host side of the materialized prefill path: K/V expansion from latent rows, block
//! attention (causal-tail for the new tokens, full for context chunks and DFlash
//! blocks), and the LSE merge of context chunks into the new tokens' result.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use crate::device::{GpuDevice, GpuError};

/// The kernels' CUDA C source.
pub const PREFILL_SRC: &str = include_str!("../kernels/prefill.cu");

/// MLA dimensions the prefill kernels need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillDims {
    pub heads: usize,
    pub kv_lora: usize,
    pub rope: usize,
    pub nope: usize,
    pub dv: usize,
}

impl PrefillDims {
    pub fn latent(&self) -> usize {
        self.kv_lora + self.rope
    }
}

/// Keys of one attention call: views into expanded K/V and the latent rows.
pub struct Keys<'a> {
    pub k_nope: CudaView<'a, f32>,
    pub latent: CudaView<'a, f32>,
    pub v: CudaView<'a, f32>,
    pub n: usize,
}

/// The compiled prefill kernels.
pub struct PrefillKernels {
    _module: Arc<CudaModule>,
    expand: CudaFunction,
    attend: CudaFunction,
    merge: CudaFunction,
}

const THREADS: u32 = 128;

fn grid(x: usize, y: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl PrefillKernels {
    pub fn load(dev: &GpuDevice) -> Result<Self, GpuError> {
        let module = dev.compile("prefill.cu", PREFILL_SRC)?;
        let f = |n: &str| {
            module
                .load_function(n)
                .map_err(GpuError::driver(format!("loading kernel {n}")))
        };
        Ok(Self {
            expand: f("expand_kv")?,
            attend: f("mla_prefill")?,
            merge: f("merge_states")?,
            _module: module,
        })
    }

    /// Expands `n` latent rows into k_nope [n, H, nope] and v [n, H, dv].
    #[allow(clippy::too_many_arguments)]
    pub fn expand(
        &self,
        dev: &GpuDevice,
        d: PrefillDims,
        latent: &CudaSlice<f32>,
        w_uk: &CudaSlice<f32>,
        w_uv: &CudaSlice<f32>,
        k_nope: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        n: usize,
    ) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        let ints = [n, d.heads, d.latent(), d.kv_lora, d.nope, d.dv].map(|x| x as i32);
        let mut b = dev.stream.launch_builder(&self.expand);
        b.arg(latent).arg(w_uk).arg(w_uv).arg(k_nope).arg(v);
        for x in &ints {
            b.arg(x);
        }
        // SAFETY: arguments match expand_kv; buffers are sized for n rows and d.
        unsafe { b.launch(grid(n, d.heads)) }.map_err(GpuError::driver("launching expand_kv"))?;
        Ok(())
    }

    /// Attention of m queries over `keys`; out [m, H, dv], lse [H, m].
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        dev: &GpuDevice,
        d: PrefillDims,
        q: &CudaSlice<f32>,
        m: usize,
        keys: &Keys<'_>,
        causal: bool,
        scale: f32,
        out: &mut CudaSlice<f32>,
        lse: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        assert!(
            d.dv <= 2 * THREADS as usize,
            "v_head_dim {} is above the kernel's 256",
            d.dv
        );
        let ints = [
            m,
            keys.n,
            d.heads,
            d.nope,
            d.rope,
            d.latent(),
            d.kv_lora,
            d.dv,
            causal as usize,
        ]
        .map(|x| x as i32);
        let mut b = dev.stream.launch_builder(&self.attend);
        b.arg(q)
            .arg(&keys.k_nope)
            .arg(&keys.latent)
            .arg(&keys.v)
            .arg(out)
            .arg(lse);
        for x in &ints {
            b.arg(x);
        }
        b.arg(&scale);
        // SAFETY: arguments match mla_prefill; q holds m queries and the views n keys.
        unsafe { b.launch(grid(m, d.heads)) }.map_err(GpuError::driver("launching mla_prefill"))?;
        Ok(())
    }

    /// a <- merge(a, b) over m tokens.
    pub fn merge(
        &self,
        dev: &GpuDevice,
        d: PrefillDims,
        a: (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        b: (&CudaSlice<f32>, &CudaSlice<f32>),
        m: usize,
    ) -> Result<(), GpuError> {
        let ints = [m, d.heads, d.dv].map(|x| x as i32);
        let mut l = dev.stream.launch_builder(&self.merge);
        l.arg(a.0).arg(a.1).arg(b.0).arg(b.1);
        for x in &ints {
            l.arg(x);
        }
        // SAFETY: arguments match merge_states; all four buffers hold m tokens.
        unsafe { l.launch(grid(m, d.heads)) }
            .map_err(GpuError::driver("launching merge_states"))?;
        Ok(())
    }
}
