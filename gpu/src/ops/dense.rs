//! The f32 model kernels (embedding, RMSNorm, GEMM, RoPE, SwiGLU, the absorbed-query and
//! value projections, row gathers, fills) and two the lab uses on bf16 buffers (a hash
//! fill and an L2 scrub).

use super::{blocks, Kernels, MlaDims};
use crate::device::{GpuDevice, GpuError};
use crate::launch::{Arg, DPtr};
use specmla_model::init::{Init, TensorInit};

/// `init_value`'s `(norm_gain, half_width)` arguments for `init`.
fn init_args(init: Init) -> (Arg, Arg) {
    match init {
        Init::Uniform { half_width } => (Arg::I32(0), Arg::F32(half_width)),
        Init::NormGain => (Arg::I32(1), Arg::F32(0.0)),
    }
}

impl Kernels {
    /// `out[t] = table[ids[t]]`, rows of width `d`.
    ///
    /// # Safety
    /// Every id is below the table's row count: the kernel reads the row it names.
    pub unsafe fn embed(
        &self,
        dev: &GpuDevice,
        table: DPtr<f32>,
        ids: DPtr<i32>,
        out: DPtr<f32>,
        n: usize,
        d: usize,
    ) -> Result<(), GpuError> {
        ids.need(n);
        out.need(n * d);
        let args = [table.into(), ids.into(), out.into(), n.into(), d.into()];
        // SAFETY: argument list matches embed_rows; the backend checks ids < vocab.
        unsafe { self.go(dev, "embed_rows", (n, 1), &args) }
    }

    /// RMSNorm of the first `d` columns of `n` rows (strides `sx`, `so`); in place is allowed.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        dev: &GpuDevice,
        x: DPtr<f32>,
        sx: usize,
        w: DPtr<f32>,
        out: DPtr<f32>,
        so: usize,
        n: usize,
        d: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        x.need((n - 1) * sx + d);
        out.need((n - 1) * so + d);
        w.need(d);
        let args = [
            x.into(),
            sx.into(),
            w.into(),
            out.into(),
            so.into(),
            n.into(),
            d.into(),
            eps.into(),
        ];
        // SAFETY: argument list matches rms_norm; sizes checked above.
        unsafe { self.go(dev, "rms_norm", (n, 1), &args) }
    }

    /// `y = res + x @ w` for `rows` rows of `x` (stride `sx`), `w [k, n]`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        dev: &GpuDevice,
        x: DPtr<f32>,
        sx: usize,
        w: DPtr<f32>,
        res: Option<DPtr<f32>>,
        y: DPtr<f32>,
        (rows, k, n): (usize, usize, usize),
    ) -> Result<(), GpuError> {
        if rows == 0 {
            return Ok(());
        }
        x.need((rows - 1) * sx + k);
        w.need(k * n);
        y.need(rows * n);
        let res = match res {
            Some(r) => Arg::from(r.need(rows * n)),
            None => Arg::Ptr(0),
        };
        let args = [
            x.into(),
            sx.into(),
            w.into(),
            res,
            y.into(),
            rows.into(),
            k.into(),
            n.into(),
        ];
        // SAFETY: argument list matches matmul; sizes checked above; a null res is
        // handled by the kernel.
        unsafe { self.go(dev, "matmul", (blocks(n), rows), &args) }
    }

    /// RoPE over the `len`-wide segment at column `off` of each of `heads` heads (head
    /// stride `hs`) of `n` tokens (token stride `ts`).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        dev: &GpuDevice,
        x: DPtr<f32>,
        positions: DPtr<i32>,
        n: usize,
        (heads, ts, hs): (usize, usize, usize),
        (off, len): (usize, usize),
        theta: f64,
    ) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        assert!(len % 2 == 0, "RoPE needs an even width");
        x.need((n - 1) * ts + (heads - 1) * hs + off + len);
        positions.need(n);
        let args = [
            x.into(),
            positions.into(),
            n.into(),
            heads.into(),
            ts.into(),
            hs.into(),
            off.into(),
            len.into(),
            theta.into(),
        ];
        // SAFETY: argument list matches rope; sizes checked above.
        unsafe { self.go(dev, "rope", (n, 1), &args) }
    }

    /// `out = silu(gate) * up` over `n` values.
    pub fn silu_mul(
        &self,
        dev: &GpuDevice,
        gate: DPtr<f32>,
        up: DPtr<f32>,
        out: DPtr<f32>,
        n: usize,
    ) -> Result<(), GpuError> {
        gate.need(n);
        up.need(n);
        out.need(n);
        let args = [gate.into(), up.into(), out.into(), n.into()];
        // SAFETY: argument list matches silu_mul; sizes checked above.
        unsafe { self.go(dev, "silu_mul", (blocks(n), 1), &args) }
    }

    /// Rounds `n` values to bf16 in place (to nearest even, widened back to f32): a
    /// latent as a bf16 cache holds it. Matches `half::bf16::from_f32`.
    pub fn round_bf16(&self, dev: &GpuDevice, x: DPtr<f32>, n: usize) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        x.need(n);
        let args = [x.into(), n.into()];
        // SAFETY: argument list matches round_bf16; size checked above.
        unsafe { self.go(dev, "round_bf16", (blocks(n), 1), &args) }
    }

    /// `out[i] = bf16(x[i])` for `n` values (to nearest even, as [`Self::round_bf16`];
    /// NaN stays NaN).
    pub fn to_bf16(
        &self,
        dev: &GpuDevice,
        x: DPtr<f32>,
        out: DPtr<u16>,
        n: usize,
    ) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        x.need(n);
        out.need(n);
        let args = [x.into(), out.into(), n.into()];
        // SAFETY: argument list matches to_bf16; sizes checked above.
        unsafe { self.go(dev, "to_bf16", (blocks(n), 1), &args) }
    }

    /// `q_lat [n, H, kv_lora + rope]` from `q [n, H, nope + rope]` and `w_uk`.
    pub fn absorb_q(
        &self,
        dev: &GpuDevice,
        d: MlaDims,
        q: DPtr<f32>,
        w_uk: DPtr<f32>,
        q_lat: DPtr<f32>,
        n: usize,
    ) -> Result<(), GpuError> {
        q.need(n * d.heads * d.qk());
        w_uk.need(d.heads * d.kv_lora * d.nope);
        q_lat.need(n * d.heads * d.latent());
        let args = [
            q.into(),
            w_uk.into(),
            q_lat.into(),
            n.into(),
            d.heads.into(),
            d.nope.into(),
            d.rope.into(),
            d.kv_lora.into(),
        ];
        // SAFETY: argument list matches absorb_q; sizes checked above.
        unsafe { self.go(dev, "absorb_q", (n, d.heads), &args) }
    }

    /// `out [n, H, dv] = o_lat [n, H, kv_lora] @ W_UV_h`.
    pub fn apply_uv(
        &self,
        dev: &GpuDevice,
        d: MlaDims,
        o_lat: DPtr<f32>,
        w_uv: DPtr<f32>,
        out: DPtr<f32>,
        n: usize,
    ) -> Result<(), GpuError> {
        o_lat.need(n * d.heads * d.kv_lora);
        w_uv.need(d.heads * d.kv_lora * d.v);
        out.need(n * d.heads * d.v);
        let args = [
            o_lat.into(),
            w_uv.into(),
            out.into(),
            n.into(),
            d.heads.into(),
            d.kv_lora.into(),
            d.v.into(),
        ];
        // SAFETY: argument list matches apply_uv; sizes checked above.
        unsafe { self.go(dev, "apply_uv", (n, d.heads), &args) }
    }

    /// `out[i] = src[idx[i]]`, rows of width `d`.
    ///
    /// # Safety
    /// Every index is below `src`'s row count: the kernel reads the row it names.
    pub unsafe fn gather_rows(
        &self,
        dev: &GpuDevice,
        src: DPtr<f32>,
        idx: DPtr<i32>,
        out: DPtr<f32>,
        n: usize,
        d: usize,
    ) -> Result<(), GpuError> {
        idx.need(n);
        out.need(n * d);
        let args = [src.into(), idx.into(), out.into(), n.into(), d.into()];
        // SAFETY: argument list matches gather_rows; callers check indices on the host.
        unsafe { self.go(dev, "gather_rows", (n, 1), &args) }
    }

    /// `out[i] = a[idx[i]]` where `idx[i] >= 0`, else `b[-1 - idx[i]]`; rows of width `d`.
    ///
    /// # Safety
    /// Every index names a row inside the buffer it selects.
    pub unsafe fn gather_rows2(
        &self,
        dev: &GpuDevice,
        (a, b): (DPtr<f32>, DPtr<f32>),
        idx: DPtr<i32>,
        out: DPtr<f32>,
        (n, d): (usize, usize),
    ) -> Result<(), GpuError> {
        idx.need(n);
        out.need(n * d);
        let args = [
            a.into(),
            b.into(),
            idx.into(),
            out.into(),
            n.into(),
            d.into(),
        ];
        // SAFETY: argument list matches gather_rows2; callers check indices on the host.
        unsafe { self.go(dev, "gather_rows2", (n, 1), &args) }
    }

    /// `out[g * n + i]` = the row digest (`specmla_core::backend::row_digest`) of row `i`
    /// of group `g`: `groups` groups of `n` rows of width `d`, `group_stride` values apart.
    pub fn row_digest(
        &self,
        dev: &GpuDevice,
        src: DPtr<f32>,
        out: DPtr<u64>,
        (groups, n, d): (usize, usize, usize),
        group_stride: usize,
    ) -> Result<(), GpuError> {
        if groups == 0 || n == 0 {
            return Ok(());
        }
        assert!(group_stride >= n * d, "digest groups overlap");
        src.need((groups - 1) * group_stride + n * d);
        out.need(groups * n);
        let stride = Arg::I64(i64::try_from(group_stride).expect("stride fits in i64"));
        let args = [src.into(), out.into(), n.into(), d.into(), stride];
        // SAFETY: argument list matches row_digest; sizes checked above.
        unsafe { self.go(dev, "row_digest", (n, groups), &args) }
    }

    /// `out[t] = [a[t] | b[t]]` for `n` rows of widths `da`, `db`.
    #[allow(clippy::too_many_arguments)]
    pub fn concat_rows(
        &self,
        dev: &GpuDevice,
        a: DPtr<f32>,
        b: DPtr<f32>,
        out: DPtr<f32>,
        n: usize,
        da: usize,
        db: usize,
    ) -> Result<(), GpuError> {
        a.need(n * da);
        b.need(n * db);
        out.need(n * (da + db));
        let args = [
            a.into(),
            b.into(),
            out.into(),
            n.into(),
            da.into(),
            db.into(),
        ];
        // SAFETY: argument list matches concat_rows; sizes checked above.
        unsafe { self.go(dev, "concat_rows", (n, 1), &args) }
    }

    /// `dst[r * sd + c] = src[r * ss + c]` for `c < width`, `r < n`.
    pub fn copy_cols(
        &self,
        dev: &GpuDevice,
        src: (DPtr<f32>, usize),
        dst: (DPtr<f32>, usize),
        n: usize,
        width: usize,
    ) -> Result<(), GpuError> {
        self.col_band("copy_cols", dev, src, dst, (n, width))
    }

    /// [`Self::copy_cols`] into bf16, rounded to nearest even as [`Self::to_bf16`].
    pub fn copy_cols_bf16(
        &self,
        dev: &GpuDevice,
        src: (DPtr<f32>, usize),
        dst: (DPtr<u16>, usize),
        n: usize,
        width: usize,
    ) -> Result<(), GpuError> {
        self.col_band("copy_cols_bf16", dev, src, dst, (n, width))
    }

    /// One launch of the column-band copy `name` (`copy_cols` or `copy_cols_bf16`,
    /// whose destination element is `U`).
    fn col_band<U>(
        &self,
        name: &'static str,
        dev: &GpuDevice,
        (src, ss): (DPtr<f32>, usize),
        (dst, sd): (DPtr<U>, usize),
        (n, width): (usize, usize),
    ) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        src.need((n - 1) * ss + width);
        dst.need((n - 1) * sd + width);
        let args = [
            src.into(),
            ss.into(),
            dst.into(),
            sd.into(),
            n.into(),
            width.into(),
        ];
        // SAFETY: argument list matches both kernels (they differ in the destination's
        // element type only, which `U` carries); sizes checked above.
        unsafe { self.go(dev, name, (n, 1), &args) }
    }

    /// Fills `n` bf16 values with a deterministic hash of `(seed, index)` in [-1, 1).
    pub fn fill_bf16_hash(
        &self,
        dev: &GpuDevice,
        x: DPtr<u16>,
        n: usize,
        seed: u32,
    ) -> Result<(), GpuError> {
        x.need(n);
        let args = [x.into(), Arg::I64(n as i64), Arg::I32(seed as i32)];
        // SAFETY: argument list matches fill_bf16_hash (the seed's bits pass as an int);
        // size checked above; the kernel strides over n.
        unsafe { self.go(dev, "fill_bf16_hash", (blocks(n).min(1 << 20), 1), &args) }
    }

    /// Fills `out` with the f32 tensor `t` (specmla-model's `init`), each weight rounded to
    /// bf16 where `round_bf16` is set.
    pub fn init_f32(
        &self,
        dev: &GpuDevice,
        out: DPtr<f32>,
        t: &TensorInit,
        round_bf16: bool,
    ) -> Result<(), GpuError> {
        out.need(t.len);
        let (norm_gain, half_width) = init_args(t.init);
        let args = [
            out.into(),
            Arg::I64(t.len as i64),
            Arg::I64(t.key as i64),
            norm_gain,
            half_width,
            Arg::I32(round_bf16 as i32),
        ];
        // SAFETY: argument list matches init_f32 (the key's bits pass as a long long); size
        // checked above; the kernel strides over len.
        unsafe { self.go(dev, "init_f32", (blocks(t.len).min(1 << 16), 1), &args) }
    }

    /// Fills `out` with the logical `[k, n]` tensor `t` stored transposed as bf16 (`[n, k]`,
    /// nn.Linear's layout); `k` 1 stores it as is.
    pub fn init_bf16_t(
        &self,
        dev: &GpuDevice,
        out: DPtr<u16>,
        t: &TensorInit,
        (k, n): (usize, usize),
    ) -> Result<(), GpuError> {
        assert_eq!(k * n, t.len, "tensor is not [{k}, {n}]");
        out.need(t.len);
        let (norm_gain, half_width) = init_args(t.init);
        let args = [
            out.into(),
            Arg::I64(k as i64),
            Arg::I64(n as i64),
            Arg::I64(t.key as i64),
            norm_gain,
            half_width,
        ];
        // SAFETY: argument list matches init_bf16_t; size checked above; the kernel
        // strides over k * n.
        unsafe { self.go(dev, "init_bf16_t", (blocks(t.len).min(1 << 16), 1), &args) }
    }

    /// Fills `out` with DeepSeek's `kv_b_proj` in nn.Linear's layout, `[H * (nope + v),
    /// kv_lora]` bf16, from the layer's `w_uk` and `w_uv` recipes.
    pub fn init_kv_b(
        &self,
        dev: &GpuDevice,
        out: DPtr<u16>,
        (uk, uv): (&TensorInit, &TensorInit),
        d: MlaDims,
    ) -> Result<(), GpuError> {
        let len = d.heads * (d.nope + d.v) * d.kv_lora;
        assert_eq!(
            (uk.len, uv.len),
            (d.heads * d.kv_lora * d.nope, d.heads * d.kv_lora * d.v)
        );
        out.need(len);
        let (_, hw_uk) = init_args(uk.init);
        let (_, hw_uv) = init_args(uv.init);
        let args = [
            out.into(),
            d.heads.into(),
            d.kv_lora.into(),
            d.nope.into(),
            d.v.into(),
            Arg::I64(uk.key as i64),
            hw_uk,
            Arg::I64(uv.key as i64),
            hw_uv,
        ];
        // SAFETY: argument list matches init_kv_b; size checked above; the kernel strides
        // over heads * (nope + v) * lora.
        unsafe { self.go(dev, "init_kv_b", (blocks(len).min(1 << 16), 1), &args) }
    }

    /// Reads the `n` floats of `x` (n a multiple of 4) and writes nothing: over a buffer
    /// twice the L2's size, the benchmark's way of starting each timed launch from the
    /// same clean cache.
    pub fn scrub_l2(
        &self,
        dev: &GpuDevice,
        x: DPtr<f32>,
        n: usize,
        sink: DPtr<f32>,
    ) -> Result<(), GpuError> {
        x.need(n);
        sink.need(1);
        let args = [x.into(), Arg::I64((n / 4) as i64), sink.into()];
        // SAFETY: argument list matches scrub_l2; it reads n / 4 float4 of x (size checked
        // above) and writes at most sink[0].
        unsafe { self.go(dev, "scrub_l2", (1024, 1), &args) }
    }

    /// The SM clock in MHz now: one thread's `clock64` cycles over `%globaltimer`
    /// nanoseconds while it spins for `spin_cycles` cycles (waits for the stream). Launched
    /// right after a timed batch it reads the clock that batch ran at, which a power cap or
    /// a thermal slowdown lowers.
    pub fn sm_clock_mhz(&self, dev: &GpuDevice, spin_cycles: u32) -> Result<f64, GpuError> {
        let out = crate::launch::Buf::<u64>::uninit(dev, 2, "SM clock probe")?;
        let args = [out.ptr().into(), Arg::I64(i64::from(spin_cycles))];
        // SAFETY: argument list matches sm_clock; its one working thread writes 2 values.
        unsafe { self.go(dev, "sm_clock", (1, 1), &args)? };
        let got = out.read(dev, 2)?;
        if got[1] == 0 {
            return Err(GpuError::NoDevice(
                "the SM clock probe saw no global-timer tick".into(),
            ));
        }
        Ok(got[0] as f64 * 1e3 / got[1] as f64)
    }

    /// Sets the first `n` values of `x` to `v`.
    pub fn fill(&self, dev: &GpuDevice, x: DPtr<f32>, v: f32, n: usize) -> Result<(), GpuError> {
        x.need(n);
        let args = [x.into(), v.into(), n.into()];
        // SAFETY: argument list matches fill; size checked above.
        unsafe { self.go(dev, "fill", (blocks(n), 1), &args) }
    }
}
