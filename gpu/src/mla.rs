//! Host side of the MLA kernels: shapes, launches, and device buffers for the latent KV
//! write and the split-KV absorbed decode.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::{GpuDevice, GpuError};

/// The kernels' CUDA C source.
pub const MLA_SRC: &str = include_str!("../kernels/mla.cu");

/// The compiled MLA kernels.
pub struct MlaKernels {
    _module: Arc<CudaModule>,
    kv_write: CudaFunction,
    decode: CudaFunction,
    gather: CudaFunction,
}

/// Shape of one uniform decode launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    pub num_rows: usize,
    pub q_len: usize,
    pub heads: usize,
    /// kv_lora + rope (576 for DeepSeek-V3).
    pub dim: usize,
    /// kv_lora (512 for DeepSeek-V3).
    pub dv: usize,
    pub page: usize,
    /// Block-table width.
    pub width: usize,
    pub split_size: usize,
}

/// Device buffers of one decode launch.
pub struct DecodeArgs<'a> {
    pub q: &'a CudaSlice<f32>,
    pub cache: &'a CudaSlice<f32>,
    pub block_table: &'a CudaSlice<i32>,
    pub seq_lens: &'a CudaSlice<i32>,
    pub num_splits: &'a CudaSlice<i32>,
    pub out: &'a mut CudaSlice<f32>,
    pub lse: &'a mut CudaSlice<f32>,
}

const THREADS: u32 = 128;
const MAX_DV: usize = 8 * THREADS as usize;

impl MlaKernels {
    /// Compiles and loads the kernels on `dev`.
    pub fn load(dev: &GpuDevice) -> Result<Self, GpuError> {
        let module = dev.compile("mla.cu", MLA_SRC)?;
        let f = |n: &str| {
            module
                .load_function(n)
                .map_err(GpuError::driver(format!("loading kernel {n}")))
        };
        Ok(Self {
            kv_write: f("kv_write")?,
            decode: f("mla_decode")?,
            gather: f("gather_context")?,
            _module: module,
        })
    }

    /// Writes `num_tokens` latent rows of width `dim` to their slots (PAD skipped).
    pub fn kv_write(
        &self,
        dev: &GpuDevice,
        latent: &CudaSlice<f32>,
        slot_mapping: &CudaSlice<i64>,
        cache: &mut CudaSlice<f32>,
        num_tokens: usize,
        dim: usize,
    ) -> Result<(), GpuError> {
        if num_tokens == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (num_tokens as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (n, d) = (num_tokens as i32, dim as i32);
        let mut b = dev.stream.launch_builder(&self.kv_write);
        b.arg(latent).arg(slot_mapping).arg(cache).arg(&n).arg(&d);
        // SAFETY: the argument list matches kv_write's signature; the caller sized
        // latent [num_tokens, dim], slot_mapping [num_tokens], and every non-PAD slot
        // indexes inside cache.
        unsafe { b.launch(cfg) }.map_err(GpuError::driver("launching kv_write"))?;
        Ok(())
    }

    /// Gathers positions `[start, start + len)` of the request whose block-table row is
    /// `block_row` from `cache` into `workspace` (`[len, dim]`).
    #[allow(clippy::too_many_arguments)]
    pub fn gather_context(
        &self,
        dev: &GpuDevice,
        cache: &CudaSlice<f32>,
        block_row: &CudaSlice<i32>,
        workspace: &mut CudaSlice<f32>,
        start: usize,
        len: usize,
        page: usize,
        dim: usize,
    ) -> Result<(), GpuError> {
        if len == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (len as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let ints = [start, len, page, dim].map(|x| x as i32);
        let mut b = dev.stream.launch_builder(&self.gather);
        b.arg(cache).arg(block_row).arg(workspace);
        for x in &ints {
            b.arg(x);
        }
        // SAFETY: arguments match gather_context; block_row covers every position below
        // start + len and workspace holds len rows of dim.
        unsafe { b.launch(cfg) }.map_err(GpuError::driver("launching gather_context"))?;
        Ok(())
    }

    /// Runs the uniform decode: out [rows * q_len, heads, dv], lse [heads, rows * q_len].
    pub fn decode(
        &self,
        dev: &GpuDevice,
        s: DecodeShape,
        a: DecodeArgs<'_>,
        scale: f32,
    ) -> Result<(), GpuError> {
        assert!(
            s.dv <= MAX_DV && s.dv <= s.dim && s.q_len >= 1,
            "unsupported decode shape {s:?}"
        );
        let tokens = (s.num_rows * s.q_len) as u32;
        if tokens == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (tokens, s.heads as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let ints = [
            s.num_rows,
            s.q_len,
            s.heads,
            s.dim,
            s.dv,
            s.page,
            s.width,
            s.split_size,
        ]
        .map(|x| x as i32);
        let mut b = dev.stream.launch_builder(&self.decode);
        b.arg(a.q)
            .arg(a.cache)
            .arg(a.block_table)
            .arg(a.seq_lens)
            .arg(a.num_splits)
            .arg(a.out)
            .arg(a.lse);
        for x in &ints {
            b.arg(x);
        }
        b.arg(&scale);
        // SAFETY: the arguments match mla_decode's signature in order and type; the
        // caller sized every buffer for `s` and the block table holds valid blocks for
        // every position below each row's seq_len.
        unsafe { b.launch(cfg) }.map_err(GpuError::driver("launching mla_decode"))?;
        Ok(())
    }
}
