//! The f32 MLA attention kernels the backend runs: the latent KV write, the absorbed
//! split-KV decode, the context gather and up-projection, the materialized prefill and
//! the LSE merge (with the F1 switch).

use super::{Kernels, MlaDims};
use crate::device::{GpuDevice, GpuError};
use crate::launch::{Arg, DPtr, THREADS};

/// Largest kv_lora the decode kernel holds per thread (8 values x 128 threads).
pub const MAX_DECODE_DV: usize = 8 * THREADS as usize;
/// Largest v_head_dim the prefill kernel holds per thread (2 values x 128 threads).
pub const MAX_PREFILL_DV: usize = 2 * THREADS as usize;

/// Shape of one uniform decode launch over the paged cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    pub num_rows: usize,
    pub q_len: usize,
    pub heads: usize,
    /// Latent width (kv_lora + rope).
    pub dim: usize,
    /// Value width in the absorbed form (kv_lora).
    pub dv: usize,
    pub page: usize,
    /// Block-table width.
    pub width: usize,
}

/// Device buffers of one decode launch.
#[derive(Clone, Copy, Debug)]
pub struct DecodeBufs {
    /// Absorbed queries `[rows * q_len, heads, dim]`.
    pub q: DPtr<f32>,
    pub cache: DPtr<f32>,
    pub block_table: DPtr<i32>,
    pub seq_lens: DPtr<i32>,
    /// The split schedule, `[rows]` each: keys per split and splits per row.
    pub split_lens: DPtr<i32>,
    pub num_splits: DPtr<i32>,
    /// `[rows * q_len, heads, dv]`.
    pub out: DPtr<f32>,
    /// `[heads, rows * q_len]`.
    pub lse: DPtr<f32>,
}

/// Keys of one materialized attention call.
#[derive(Clone, Copy, Debug)]
pub struct KeyBufs {
    /// `[n, heads, nope]`.
    pub k_nope: DPtr<f32>,
    /// The keys' latent rows `[n, latent]` (their rope part is the shared k_rope).
    pub latent: DPtr<f32>,
    /// `[n, heads, dv]`.
    pub v: DPtr<f32>,
    pub n: usize,
}

/// An attention result: `out [m, heads, dv]`, `lse [heads, m]`.
#[derive(Clone, Copy, Debug)]
pub struct State {
    pub out: DPtr<f32>,
    pub lse: DPtr<f32>,
}

impl Kernels {
    /// Writes `n` latent rows of width `dim` to their slots; PAD (-1) slots are skipped.
    ///
    /// # Safety
    /// Every slot in `slots[..n]` is PAD or below the cache's slot count
    /// (`cache.len() / dim`): the kernel writes where the slot says, unchecked.
    pub unsafe fn kv_write(
        &self,
        dev: &GpuDevice,
        latent: DPtr<f32>,
        slots: DPtr<i64>,
        cache: DPtr<f32>,
        (n, dim): (usize, usize),
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's promise, forwarded.
        unsafe { self.write_slots(dev, "kv_write", (latent, slots), cache, (n, dim)) }
    }

    /// [`Self::kv_write`] into a bf16 cache (`[slots, dim]` bf16 bits), each value rounded
    /// to nearest even.
    ///
    /// # Safety
    /// As [`Self::kv_write`]: every slot is PAD or below the cache's slot count.
    pub unsafe fn kv_write_bf16(
        &self,
        dev: &GpuDevice,
        latent: DPtr<f32>,
        slots: DPtr<i64>,
        cache: DPtr<u16>,
        (n, dim): (usize, usize),
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's promise, forwarded.
        unsafe { self.write_slots(dev, "kv_write_bf16", (latent, slots), cache, (n, dim)) }
    }

    /// The launch both cache writes share.
    ///
    /// # Safety
    /// As [`Self::kv_write`].
    unsafe fn write_slots<T>(
        &self,
        dev: &GpuDevice,
        name: &'static str,
        (latent, slots): (DPtr<f32>, DPtr<i64>),
        cache: DPtr<T>,
        (n, dim): (usize, usize),
    ) -> Result<(), GpuError> {
        latent.need(n * dim);
        slots.need(n);
        // Slots are data: the cache must hold every slot a plan can name, which the
        // backend guarantees by sizing caches for num_gpu_blocks * page_size.
        let args = [
            latent.into(),
            slots.into(),
            cache.into(),
            n.into(),
            dim.into(),
        ];
        // SAFETY: argument list matches kv_write and kv_write_bf16; sizes checked above;
        // the slots as the caller promised.
        unsafe { self.go(dev, name, (n, 1), &args) }
    }

    /// Uniform absorbed decode: token j of row r at `r * q_len + j` sees keys below
    /// `seq_lens[r] - q_len + j + 1`, in the schedule's splits: `num_splits[r]` of
    /// `split_lens[r]` positions (keys past them are never read).
    ///
    /// # Safety
    /// Every block-table entry a row's `seq_len` reaches is -1 (no block: read as NaN)
    /// or a block inside `cache`: the kernel reads where the table says, unchecked.
    pub unsafe fn decode(
        &self,
        dev: &GpuDevice,
        s: DecodeShape,
        b: DecodeBufs,
        scale: f32,
    ) -> Result<(), GpuError> {
        assert!(
            s.dv <= MAX_DECODE_DV && s.dv <= s.dim && s.q_len >= 1,
            "unsupported decode shape {s:?}"
        );
        let tokens = s.num_rows * s.q_len;
        b.q.need(tokens * s.heads * s.dim);
        b.block_table.need(s.num_rows * s.width);
        b.seq_lens.need(s.num_rows);
        b.split_lens.need(s.num_rows);
        b.num_splits.need(s.num_rows);
        b.out.need(tokens * s.heads * s.dv);
        b.lse.need(tokens * s.heads);
        let mut args: Vec<Arg> = vec![
            b.q.into(),
            b.cache.into(),
            b.block_table.into(),
            b.seq_lens.into(),
            b.split_lens.into(),
            b.num_splits.into(),
            b.out.into(),
            b.lse.into(),
        ];
        for x in [s.num_rows, s.q_len, s.heads, s.dim, s.dv, s.page, s.width] {
            args.push(x.into());
        }
        args.push(scale.into());
        // SAFETY: argument list matches mla_decode; sizes checked above; the block table
        // names blocks inside the cache for every position below each row's seq_len.
        unsafe { self.go(dev, "mla_decode", (tokens, s.heads), &args) }
    }

    /// Gathers positions `[start, start + len)` of one request into `ws [len, dim]`;
    /// `block_row` is exactly the request's block-table row (its length is the width).
    ///
    /// # Safety
    /// Every entry of `block_row` the positions reach is -1 or a block inside `cache`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather_context(
        &self,
        dev: &GpuDevice,
        cache: DPtr<f32>,
        block_row: DPtr<i32>,
        ws: DPtr<f32>,
        start: usize,
        len: usize,
        page: usize,
        dim: usize,
    ) -> Result<(), GpuError> {
        if len == 0 {
            return Ok(());
        }
        ws.need(len * dim);
        let width = block_row.len();
        let args = [
            cache.into(),
            block_row.into(),
            ws.into(),
            start.into(),
            len.into(),
            page.into(),
            dim.into(),
            width.into(),
        ];
        // SAFETY: argument list matches gather_context; sizes checked above.
        unsafe { self.go(dev, "gather_context", (len, 1), &args) }
    }

    /// Expands `n` latent rows into `k_nope [n, H, nope]` and `v [n, H, dv]`.
    #[allow(clippy::too_many_arguments)]
    pub fn expand(
        &self,
        dev: &GpuDevice,
        d: MlaDims,
        latent: DPtr<f32>,
        w_uk: DPtr<f32>,
        w_uv: DPtr<f32>,
        k_nope: DPtr<f32>,
        v: DPtr<f32>,
        n: usize,
    ) -> Result<(), GpuError> {
        latent.need(n * d.latent());
        w_uk.need(d.heads * d.kv_lora * d.nope);
        w_uv.need(d.heads * d.kv_lora * d.v);
        k_nope.need(n * d.heads * d.nope);
        v.need(n * d.heads * d.v);
        let mut args: Vec<Arg> = vec![
            latent.into(),
            w_uk.into(),
            w_uv.into(),
            k_nope.into(),
            v.into(),
        ];
        for x in [n, d.heads, d.latent(), d.kv_lora, d.nope, d.v] {
            args.push(x.into());
        }
        // SAFETY: argument list matches expand_kv; sizes checked above.
        unsafe { self.go(dev, "expand_kv", (n, d.heads), &args) }
    }

    /// Materialized attention of `m` queries `[m, H, nope + rope]` over `keys`
    /// (causal: the queries are the keys' tail).
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        dev: &GpuDevice,
        d: MlaDims,
        q: DPtr<f32>,
        m: usize,
        keys: KeyBufs,
        causal: bool,
        out: State,
    ) -> Result<(), GpuError> {
        assert!(
            d.v <= MAX_PREFILL_DV,
            "v_head_dim {} is above the kernel's {MAX_PREFILL_DV}",
            d.v
        );
        q.need(m * d.heads * d.qk());
        keys.k_nope.need(keys.n * d.heads * d.nope);
        keys.latent.need(keys.n * d.latent());
        keys.v.need(keys.n * d.heads * d.v);
        out.out.need(m * d.heads * d.v);
        out.lse.need(m * d.heads);
        let mut args: Vec<Arg> = vec![
            q.into(),
            keys.k_nope.into(),
            keys.latent.into(),
            keys.v.into(),
            out.out.into(),
            out.lse.into(),
        ];
        for x in [
            m,
            keys.n,
            d.heads,
            d.nope,
            d.rope,
            d.latent(),
            d.kv_lora,
            d.v,
        ] {
            args.push(x.into());
        }
        args.push(causal.into());
        args.push(d.softmax_scale().into());
        // SAFETY: argument list matches mla_prefill; sizes checked above.
        unsafe { self.go(dev, "mla_prefill", (m, d.heads), &args) }
    }

    /// `a <- merge(a, b)` over `m` tokens; `b_lse_transposed` is fault F1.
    pub fn merge(
        &self,
        dev: &GpuDevice,
        d: MlaDims,
        a: State,
        b: State,
        m: usize,
        b_lse_transposed: bool,
    ) -> Result<(), GpuError> {
        for s in [a, b] {
            s.out.need(m * d.heads * d.v);
            s.lse.need(m * d.heads);
        }
        let args = [
            a.out.into(),
            a.lse.into(),
            b.out.into(),
            b.lse.into(),
            m.into(),
            d.heads.into(),
            d.v.into(),
            b_lse_transposed.into(),
        ];
        // SAFETY: argument list matches merge_states; sizes checked above.
        unsafe { self.go(dev, "merge_states", (m, d.heads), &args) }
    }
}
