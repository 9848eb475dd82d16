//! The dense layer body shared by the target and the drafter: projections, norms,
//! RoPE, the latent's rounding to the cache dtype, the MLP, the LM head, and one absorbed
//! decode launch.

use specmla_core::config::KvCacheDtype;
use specmla_model::RMS_EPS;

use super::{CacheOf, DecodeLaunch, GpuBackend, Result};
use crate::launch::{Buf, DPtr};
use crate::ops::{DecodeBufs, DecodeShape};
use crate::weights::LayerWeights;
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
                    k.matmul(dev, ws.h.ptr(), hid, w_q_a.ptr(), None, c_q, (n, hid, r))?;
                    k.rms_norm(dev, c_q, r, q_a_norm.ptr(), c_q, r, n, r, RMS_EPS)?;
                    (c_q, r)
                }
                None => (ws.h.ptr(), hid),
            };
            k.matmul(
                dev,
                q_in,
                q_dim,
                w.w_q.ptr(),
                None,
                ws.q.ptr(),
                (n, q_dim, heads * qk),
            )?;
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
        k.matmul(
            dev,
            ws.h.ptr(),
            hid,
            w.w_dkv.ptr(),
            None,
            ws.latent.ptr(),
            (n, hid, lat),
        )?;
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
        k.matmul(dev, attn, hv, w.w_o.ptr(), Some(x), x, (n, hv, hid))?;
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
        k.matmul(
            dev,
            ws.h.ptr(),
            hid,
            w.w_gate.ptr(),
            None,
            ws.gate.ptr(),
            (n, hid, inter),
        )?;
        k.matmul(
            dev,
            ws.h.ptr(),
            hid,
            w.w_up.ptr(),
            None,
            ws.up.ptr(),
            (n, hid, inter),
        )?;
        k.silu_mul(dev, ws.gate.ptr(), ws.up.ptr(), ws.act.ptr(), n * inter)?;
        k.matmul(
            dev,
            ws.act.ptr(),
            inter,
            w.w_down.ptr(),
            Some(x),
            x,
            (n, inter, hid),
        )?;
        Ok(())
    }

    /// `logits = lm_head(norm(rows))` for `n` rows already in `ws.xs`.
    pub(super) fn lm_head(
        &self,
        ws: &Workspace,
        norm: &Buf<f32>,
        head: &Buf<f32>,
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
        k.matmul(
            dev,
            ws.xs.ptr(),
            hid,
            head.ptr(),
            None,
            ws.logits.ptr(),
            (n, hid, d.vocab_size),
        )?;
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
        let q_lat = ws.q_lat.ptr().offset(s * md.heads * md.latent());
        let o_lat = ws.o_lat.ptr().offset(s * md.heads * md.kv_lora);
        k.absorb_q(dev, md, q, w.w_uk.ptr(), q_lat, tokens)?;
        if let Some(fp) = &self.flash {
            self.flash_decode(ws, fp.cache(c), dl, (q_lat, o_lat))?;
        } else {
            self.portable_decode(ws, c, dl, (q_lat, o_lat))?;
        }
        let keep = tokens.min(n_real.saturating_sub(s));
        k.apply_uv(
            dev,
            md,
            o_lat,
            w.w_uv.ptr(),
            attn.offset(s * md.heads * md.v),
            keep,
        )?;
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
