//! The dense layer body shared by the target and the drafter: projections, norms,
//! RoPE, the latent's rounding to the cache dtype, the MLP, the LM head, and one absorbed
//! decode launch.

use specmla_core::config::KvCacheDtype;
use specmla_model::RMS_EPS;

use super::{CacheOf, DecodeLaunch, GpuBackend, Region, Result};
use crate::launch::{Buf, DPtr};
use crate::ops::GemmShape;
use crate::ops::{DecodeBufs, DecodeShape};
use crate::weights::{LayerWeights, Linear};
use crate::workspace::Workspace;

impl GpuBackend {
    /// `h = norm(x)`, `q = rope(h W_q)` (with a query compression `q = rope(norm(h W_q_a)
    /// W_q)`), `latent = [norm(c_kv) | rope(k_rope)]`.
    pub(super) fn qkv(
        &self,
        w: &LayerWeights,
        ws: &Workspace,
        n: usize,
        with_q: bool,
    ) -> Result<()> {
        let (dev, k, d) = (self.dev(), &self.k, &self.dims);
        let (hid, lat, qk) = (d.hidden_size, d.latent_dim(), d.qk_head_dim());
        let heads = d.num_heads;
        k.rms_norm(
            dev,
            ws.x.ptr(),
            hid,
            w.attn_norm.ptr(),
            ws.h.ptr(),
            hid,
            n,
            hid,
            RMS_EPS,
        )?;
        if with_q {
            let (q_in, q_dim) = match &w.q_lora {
                Some((w_q_a, q_a_norm)) => {
                    let r = d.q_lora_rank;
                    let c_q = ws.q_a.ptr();
                    self.linear(ws, (ws.h.ptr(), hid), w_q_a, c_q, false, n)?;
                    k.rms_norm(dev, c_q, r, q_a_norm.ptr(), c_q, r, n, r, RMS_EPS)?;
                    (c_q, r)
                }
                None => (ws.h.ptr(), hid),
            };
            self.linear(ws, (q_in, q_dim), &w.w_q, ws.q.ptr(), false, n)?;
            let rope = (d.qk_nope_head_dim, d.qk_rope_head_dim);
            k.rope(
                dev,
                ws.q.ptr(),
                ws.positions.ptr(),
                n,
                (heads, heads * qk, qk),
                rope,
                d.rope_theta,
            )?;
        }
        self.linear(ws, (ws.h.ptr(), hid), &w.w_dkv, ws.latent.ptr(), false, n)?;
        let lora = d.kv_lora_rank;
        let c_kv = ws.latent.ptr();
        k.rms_norm(dev, c_kv, lat, w.kv_norm.ptr(), c_kv, lat, n, lora, RMS_EPS)?;
        let rope = (lora, d.qk_rope_head_dim);
        k.rope(
            dev,
            ws.latent.ptr(),
            ws.positions.ptr(),
            n,
            (1, lat, 0),
            rope,
            d.rope_theta,
        )?;
        // Rounded where produced, as the CPU backend does (`KvCacheDtype`): a prefill row's
        // own keys then equal what the cache returns.
        if self.cfg.kv_cache_dtype == KvCacheDtype::Bf16 {
            k.round_bf16(dev, ws.latent.ptr(), n * lat)?;
        }
        Ok(())
    }

    /// `x += attn W_o`, then `x += W_down(silu(norm(x) W_gate) * norm(x) W_up)`.
    pub(super) fn finish(
        &self,
        w: &LayerWeights,
        ws: &Workspace,
        x: DPtr<f32>,
        attn: DPtr<f32>,
        n: usize,
    ) -> Result<()> {
        let (dev, k, d) = (self.dev(), &self.k, &self.dims);
        let (hid, inter) = (d.hidden_size, d.intermediate_size);
        let hv = self.attn_width();
        self.linear(ws, (attn, hv), &w.w_o, x, true, n)?;
        k.rms_norm(
            dev,
            x,
            hid,
            w.mlp_norm.ptr(),
            ws.h.ptr(),
            hid,
            n,
            hid,
            RMS_EPS,
        )?;
        self.linear(ws, (ws.h.ptr(), hid), &w.w_gate, ws.gate.ptr(), false, n)?;
        self.linear(ws, (ws.h.ptr(), hid), &w.w_up, ws.up.ptr(), false, n)?;
        k.silu_mul(dev, ws.gate.ptr(), ws.up.ptr(), ws.act.ptr(), n * inter)?;
        self.linear(ws, (ws.act.ptr(), inter), &w.w_down, x, true, n)?;
        Ok(())
    }

    /// `logits = lm_head(norm(rows))` for `n` rows already in `ws.xs`.
    pub(super) fn lm_head(
        &self,
        ws: &Workspace,
        norm: &Buf<f32>,
        head: &Linear,
        n: usize,
    ) -> Result<()> {
        let (dev, k, d) = (self.dev(), &self.k, &self.dims);
        let hid = d.hidden_size;
        k.rms_norm(
            dev,
            ws.xs.ptr(),
            hid,
            norm.ptr(),
            ws.xs.ptr(),
            hid,
            n,
            hid,
            RMS_EPS,
        )?;
        self.linear(ws, (ws.xs.ptr(), hid), head, ws.logits.ptr(), false, n)?;
        Ok(())
    }

    /// Absorbed decode of one uniform launch over cache `c`, on the flash kernels where
    /// the backend has them; writes the attention output of tokens below `n_real` into
    /// `attn` (the rest belong to padding and are dropped).
    pub(super) fn decode(
        &self,
        w: &LayerWeights,
        ws: &Workspace,
        c: CacheOf,
        dl: DecodeLaunch,
        n_real: usize,
        attn: DPtr<f32>,
    ) -> Result<()> {
        let (dev, k, md) = (self.dev(), &self.k, self.md);
        let tokens = dl.rows * dl.q_len;
        let s = dl.token_start;
        let q = ws.q.ptr().offset(s * md.heads * md.qk());
        let keep = tokens.min(n_real.saturating_sub(s));
        let out = attn.offset(s * md.heads * md.v);
        match (&self.flash, &w.w_uk_uv_bf16) {
            (Some(fp), Some((uk, uv))) => {
                let gemm = Region::Gemm;
                let fs = ws.flash.as_ref().expect("a flash backend's workspaces");
                let qb = fs.q.ptr().range(0, tokens * md.heads * md.latent());
                // The decode writes its rows in bf16, what the W_UV GEMM reads.
                let ob = fs.o_lat.ptr().range(0, tokens * md.heads * md.kv_lora);
                self.timed(gemm, || self.absorb_q_bf16(ws, q, uk.ptr(), qb, tokens))?;
                self.timed(Region::Attention, || {
                    self.flash_decode(ws, fp.cache(c), dl, (qb, ob))
                })?;
                self.timed(gemm, || self.apply_uv_bf16(ob, uv.ptr(), out, keep))?;
            }
            _ => {
                // f32 absorbed queries and latent rows exist only off the flash path
                // (`portable_latent_tokens`).
                let q_lat = ws.q_lat.ptr().offset(s * md.heads * md.latent());
                let o_lat = ws.o_lat.ptr().offset(s * md.heads * md.kv_lora);
                self.timed(Region::Gemm, || {
                    Ok(k.absorb_q(dev, md, q, w.w_uk.ptr(), q_lat, tokens)?)
                })?;
                self.timed(Region::Attention, || {
                    self.portable_decode(ws, c, dl, (q_lat, o_lat))
                })?;
                self.timed(Region::Gemm, || {
                    Ok(k.apply_uv(dev, md, o_lat, w.w_uv.ptr(), out, keep)?)
                })?;
            }
        }
        Ok(())
    }

    /// `y = x W` (`+ y` with `residual`) for `n` rows of `x` (rows `sx` apart): on
    /// cuBLASLt in bf16 where the weight is in bf16 (the input rounded to bf16 first, as
    /// an engine's bf16 activations are), else on the portable f32 kernel.
    pub(super) fn linear(
        &self,
        ws: &Workspace,
        (x, sx): (DPtr<f32>, usize),
        lin: &Linear,
        y: DPtr<f32>,
        residual: bool,
        n: usize,
    ) -> Result<()> {
        let (dev, k) = (self.dev(), &self.k);
        if n == 0 {
            return Ok(());
        }
        self.timed(Region::Gemm, || {
            match (&lin.bf16_t, &lin.f32) {
                (Some(wt), _) => {
                    let xb = self.bf16_input(ws, x, (n - 1) * sx + lin.k)?;
                    let shape = GemmShape::linear(n, lin.k, lin.n, sx);
                    self.gemm().run(dev, shape, wt.ptr(), xb, y, residual)?;
                }
                (None, Some(w)) => {
                    let res = residual.then_some(y);
                    k.matmul(dev, x, sx, w.ptr(), res, y, (n, lin.k, lin.n))?;
                }
                (None, None) => unreachable!("Linear::upload keeps one form"),
            }
            Ok(())
        })
    }

    /// The first `len` values of `x` as bf16, in the workspace's GEMM staging.
    fn bf16_input(&self, ws: &Workspace, x: DPtr<f32>, len: usize) -> Result<DPtr<u16>> {
        let fs = ws
            .flash
            .as_ref()
            .expect("a bf16 backend's workspaces have bf16 scratch");
        let xb = fs.gemm_in.ptr().range(0, len);
        self.k.to_bf16(self.dev(), x, xb, len)?;
        Ok(xb)
    }

    fn gemm(&self) -> &crate::ops::Gemm {
        &self
            .flash
            .as_ref()
            .expect("bf16 weights come with the flash path")
            .gemm
    }

    /// `q_lat[t, h] = [q_nope[t, h] W_UK_h^T | q_rope[t, h]]` for `n` tokens, in bf16
    /// where the flash decode reads it: one GEMM per head (batched) over bf16 inputs,
    /// rounded to bf16 by its epilogue, and the rope part rounded beside it.
    fn absorb_q_bf16(
        &self,
        ws: &Workspace,
        q: DPtr<f32>,
        w_uk: DPtr<u16>,
        q_lat: DPtr<u16>,
        n: usize,
    ) -> Result<()> {
        let (dev, md) = (self.dev(), self.md);
        if n == 0 {
            return Ok(());
        }
        let (qk, lat) = (md.qk(), md.latent());
        let qb = self.bf16_input(ws, q, n * md.heads * qk)?;
        let shape = GemmShape {
            m: n,
            n: md.kv_lora,
            k: md.nope,
            trans_a: true,
            lda: md.nope,
            ldb: md.heads * qk,
            ldd: md.heads * lat,
            batch: md.heads,
            stride_a: md.kv_lora * md.nope,
            stride_b: qk,
            stride_d: lat,
        };
        self.gemm().run_bf16_out(dev, shape, w_uk, qb, q_lat)?;
        let rows = n * md.heads;
        let src = (q.offset(md.nope), qk);
        let dst = (q_lat.offset(md.kv_lora), lat);
        self.k.copy_cols_bf16(dev, src, dst, rows, md.rope)?;
        Ok(())
    }

    /// `out[t, h] = o_lat[t, h] W_UV_h` for `n` tokens, `o_lat` in bf16 (the flash
    /// decode's rows): one GEMM per head (batched).
    fn apply_uv_bf16(
        &self,
        o_lat: DPtr<u16>,
        w_uv: DPtr<u16>,
        out: DPtr<f32>,
        n: usize,
    ) -> Result<()> {
        let (dev, md) = (self.dev(), self.md);
        if n == 0 {
            return Ok(());
        }
        let ob = o_lat.need(n * md.heads * md.kv_lora);
        let shape = GemmShape {
            m: n,
            n: md.v,
            k: md.kv_lora,
            trans_a: false,
            lda: md.v,
            ldb: md.heads * md.kv_lora,
            ldd: md.heads * md.v,
            batch: md.heads,
            stride_a: md.kv_lora * md.v,
            stride_b: md.kv_lora,
            stride_d: md.v,
        };
        self.gemm().run(dev, shape, w_uv, ob, out, false)?;
        Ok(())
    }

    /// One decode launch on the portable f32 kernel (`mla_decode`) over cache `c`.
    fn portable_decode(
        &self,
        ws: &Workspace,
        c: CacheOf,
        dl: DecodeLaunch,
        (q_lat, o_lat): (DPtr<f32>, DPtr<f32>),
    ) -> Result<()> {
        let (dev, k, md) = (self.dev(), &self.k, self.md);
        let cache = self.f32_cache(c);
        let shape = DecodeShape {
            num_rows: dl.rows,
            q_len: dl.q_len,
            heads: md.heads,
            dim: md.latent(),
            dv: md.kv_lora,
            page: self.cfg.scheduler.page_size,
            width: dl.width,
        };
        let bufs = DecodeBufs {
            q: q_lat,
            cache,
            block_table: dl.block_table,
            seq_lens: dl.seq_lens,
            split_lens: dl.split_lens,
            num_splits: dl.num_splits,
            out: o_lat,
            lse: ws.lse.ptr(),
        };
        // SAFETY: every caller writes the launch's block table through block_ids, and a row's seq_len stays within the table width (max_model_len).
        unsafe { k.decode(dev, shape, bufs, md.softmax_scale()) }?;
        Ok(())
    }
}
