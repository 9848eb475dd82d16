//! The models' weights on the device, generated there from the seed: every weight is a
//! hash of (seed, tensor, index) (`specmla_model::init`), so each tensor is filled in place
//! in the layout its kernels read, and the host's `TargetModel`/`DrafterModel` (the CPU
//! backend's and the oracle's copy) hold the same bits. Nothing is uploaded. On the bf16
//! path (the flash path's configurations) the projections are bf16 in nn.Linear's layout
//! for the cuBLASLt GEMMs, the per-head up-projections get bf16 copies beside their f32
//! originals, and one bf16 key-and-value up-projection (DeepSeek's `kv_b_proj`) expands
//! cached latents for the tensor-core prefill path.

use specmla_core::config::{MlaDims, ModelDims};
use specmla_model::init::{DrafterInit, LayerInit, TargetInit, TensorInit};
use specmla_model::{q_in_dim, DrafterModel, MlaLayer, TargetModel};

use crate::device::{GpuDevice, GpuError};
use crate::launch::Buf;
use crate::ops::Kernels;

/// Which form the projections take on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightForm {
    /// `[k, n]` f32, for the portable kernels.
    F32,
    /// `[n, k]` bf16 (rounded to nearest even), for the cuBLASLt GEMMs.
    Bf16,
}

/// A projection `y = x W` with `W [k, n]`, in one of the two forms.
pub struct Linear {
    pub k: usize,
    pub n: usize,
    /// `[k, n]` f32 (form F32).
    pub f32: Option<Buf<f32>>,
    /// `W^T [n, k]` bf16 (form Bf16).
    pub bf16_t: Option<Buf<u16>>,
}

/// What generating weights on one device needs: the device, its kernels, the form and
/// whether f32 tensors are rounded to bf16 (a bf16 checkpoint's values).
#[derive(Clone, Copy)]
pub struct Gen<'a> {
    pub dev: &'a GpuDevice,
    pub k: &'a Kernels,
    pub form: WeightForm,
    pub round_bf16: bool,
}

impl Gen<'_> {
    /// An f32 tensor, as is.
    fn f32(&self, t: &TensorInit, what: &str) -> Result<Buf<f32>, GpuError> {
        let b = Buf::uninit(self.dev, t.len, what)?;
        self.k.init_f32(self.dev, b.ptr(), t, self.round_bf16)?;
        Ok(b)
    }

    /// A bf16 tensor in its logical layout.
    fn bf16(&self, t: &TensorInit, what: &str) -> Result<Buf<u16>, GpuError> {
        let b = Buf::uninit(self.dev, t.len, &format!("{what} (bf16)"))?;
        self.k.init_bf16_t(self.dev, b.ptr(), t, (1, t.len))?;
        Ok(b)
    }

    /// A projection `[k, n]` in the form.
    fn linear(
        &self,
        t: &TensorInit,
        (k, n): (usize, usize),
        what: &str,
    ) -> Result<Linear, GpuError> {
        assert_eq!(t.len, k * n, "{what} is not [{k}, {n}]");
        let (f32, bf16_t) = match self.form {
            WeightForm::F32 => (Some(self.f32(t, what)?), None),
            WeightForm::Bf16 => {
                let b = Buf::uninit(self.dev, t.len, &format!("{what} (bf16, transposed)"))?;
                self.k.init_bf16_t(self.dev, b.ptr(), t, (k, n))?;
                (None, Some(b))
            }
        };
        Ok(Linear { k, n, f32, bf16_t })
    }
}

/// One MLA layer's weights (layouts as in [`MlaLayer`]).
pub struct LayerWeights {
    pub attn_norm: Buf<f32>,
    /// The query's compression `(w_q_a, q_a_norm)`, where the model has one.
    pub q_lora: Option<(Linear, Buf<f32>)>,
    pub w_q: Linear,
    pub w_dkv: Linear,
    pub kv_norm: Buf<f32>,
    pub w_uk: Buf<f32>,
    pub w_uv: Buf<f32>,
    /// bf16 copies of `w_uk` and `w_uv` (same layouts), on the bf16 path.
    pub w_uk_uv_bf16: Option<(Buf<u16>, Buf<u16>)>,
    /// On the bf16 path, `[H * (nope + v), kv_lora]` bf16: head h's key rows, then its
    /// value rows (DeepSeek's `kv_b_proj` in nn.Linear's layout). One GEMM of a latent
    /// row by it gives every head's `[k_nope | v]`, the prefill kernel's key layout.
    pub w_kv_b: Option<Buf<u16>>,
    pub w_o: Linear,
    pub mlp_norm: Buf<f32>,
    pub w_gate: Linear,
    pub w_up: Linear,
    pub w_down: Linear,
}

impl LayerWeights {
    /// Generates the layer `i` describes.
    pub fn generate(g: Gen, i: &LayerInit, d: &ModelDims, name: &str) -> Result<Self, GpuError> {
        let f32 = |t: &TensorInit, w: &str| g.f32(t, &format!("{name}.{w}"));
        let lin = |t: &TensorInit, kn, w: &str| g.linear(t, kn, &format!("{name}.{w}"));
        let (hid, inter, heads) = (d.hidden_size, d.intermediate_size, d.num_heads);
        let bf16_path = g.form == WeightForm::Bf16;
        Ok(Self {
            attn_norm: f32(&i.attn_norm, "attn_norm")?,
            q_lora: match &i.q_lora {
                Some((a, n)) => Some((lin(a, (hid, d.q_lora_rank), "w_q_a")?, f32(n, "q_a_norm")?)),
                None => None,
            },
            w_q: lin(&i.w_q, (q_in_dim(d), heads * d.qk_head_dim()), "w_q")?,
            w_dkv: lin(&i.w_dkv, (hid, d.latent_dim()), "w_dkv")?,
            kv_norm: f32(&i.kv_norm, "kv_norm")?,
            w_uk: f32(&i.w_uk, "w_uk")?,
            w_uv: f32(&i.w_uv, "w_uv")?,
            w_uk_uv_bf16: match bf16_path {
                true => Some((
                    g.bf16(&i.w_uk, &format!("{name}.w_uk"))?,
                    g.bf16(&i.w_uv, &format!("{name}.w_uv"))?,
                )),
                false => None,
            },
            w_kv_b: match bf16_path {
                true => {
                    let md = MlaDims::from(d);
                    let len = heads * (md.nope + md.v) * md.kv_lora;
                    let b = Buf::uninit(g.dev, len, &format!("{name}.kv_b (bf16)"))?;
                    g.k.init_kv_b(g.dev, b.ptr(), (&i.w_uk, &i.w_uv), md)?;
                    Some(b)
                }
                false => None,
            },
            w_o: lin(&i.w_o, (heads * d.v_head_dim, hid), "w_o")?,
            mlp_norm: f32(&i.mlp_norm, "mlp_norm")?,
            w_gate: lin(&i.w_gate, (hid, inter), "w_gate")?,
            w_up: lin(&i.w_up, (hid, inter), "w_up")?,
            w_down: lin(&i.w_down, (inter, hid), "w_down")?,
        })
    }
}

/// `[H * (nope + v), kv_lora]`: row `h * (nope + v) + j` is column j of head h's
/// `w_uk` (`[kv_lora][nope]`) for j below nope, else column `j - nope` of its `w_uv`.
/// The host's statement of the layout `init_kv_b` fills, for checks.
pub fn kv_b(l: &MlaLayer, d: &ModelDims) -> Vec<f32> {
    let (heads, lora) = (d.num_heads, d.kv_lora_rank);
    let (nope, v) = (d.qk_nope_head_dim, d.v_head_dim);
    let mut out = Vec::with_capacity(heads * (nope + v) * lora);
    for h in 0..heads {
        let uk = &l.w_uk[h * lora * nope..(h + 1) * lora * nope];
        let uv = &l.w_uv[h * lora * v..(h + 1) * lora * v];
        for j in 0..nope {
            out.extend((0..lora).map(|c| uk[c * nope + j]));
        }
        for j in 0..v {
            out.extend((0..lora).map(|c| uv[c * v + j]));
        }
    }
    out
}

/// The target model on the device.
pub struct TargetWeights {
    pub embed_tokens: Buf<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Buf<f32>,
    pub lm_head: Linear,
}

impl TargetWeights {
    /// Generates the weights of `m` from its seed (`m`'s own vectors are the host mirror
    /// and are not read, except by [`check_mirror`]).
    pub fn generate(
        dev: &GpuDevice,
        k: &Kernels,
        m: &TargetModel,
        form: WeightForm,
    ) -> Result<Self, GpuError> {
        let d = &m.dims;
        let i = TargetInit::new(d, m.seed);
        let g = Gen {
            dev,
            k,
            form,
            round_bf16: m.bf16_weights,
        };
        let w = Self {
            embed_tokens: g.f32(&i.embed_tokens, "target embed_tokens")?,
            layers: i
                .layers
                .iter()
                .enumerate()
                .map(|(l, li)| LayerWeights::generate(g, li, d, &format!("target layer {l}")))
                .collect::<Result<_, _>>()?,
            final_norm: g.f32(&i.final_norm, "target final_norm")?,
            lm_head: g.linear(&i.lm_head, (d.hidden_size, d.vocab_size), "target lm_head")?,
        };
        check_mirror(dev, &w.final_norm, &m.final_norm, "target final_norm")?;
        Ok(w)
    }
}

/// The drafter on the device. Its embedding table has one row more than the vocabulary:
/// row `vocab` is DFlash's mask embedding, so a query block's inputs are one gather.
pub struct DrafterWeights {
    pub embed_tokens: Buf<f32>,
    pub fc: Linear,
    pub fc_ctx: Linear,
    pub layer: LayerWeights,
    pub final_norm: Buf<f32>,
    pub lm_head: Linear,
}

impl DrafterWeights {
    /// Generates the weights of `m` from its seed, as [`TargetWeights::generate`].
    pub fn generate(
        dev: &GpuDevice,
        k: &Kernels,
        m: &DrafterModel,
        form: WeightForm,
    ) -> Result<Self, GpuError> {
        let d = &m.dims;
        let (hid, vocab) = (d.hidden_size, d.vocab_size);
        let i = DrafterInit::new(d, m.seed);
        let g = Gen {
            dev,
            k,
            form,
            round_bf16: m.bf16_weights,
        };
        let embed_tokens = Buf::uninit(dev, (vocab + 1) * hid, "drafter embed_tokens")?;
        k.init_f32(dev, embed_tokens.ptr(), &i.embed_tokens, g.round_bf16)?;
        let mask = embed_tokens.ptr().range(vocab * hid, hid);
        k.init_f32(dev, mask, &i.mask_embedding, g.round_bf16)?;
        let w = Self {
            embed_tokens,
            fc: g.linear(&i.fc, (2 * hid, hid), "drafter fc")?,
            fc_ctx: g.linear(&i.fc_ctx, (hid, hid), "drafter fc_ctx")?,
            layer: LayerWeights::generate(g, &i.layer, d, "drafter layer")?,
            final_norm: g.f32(&i.final_norm, "drafter final_norm")?,
            lm_head: g.linear(&i.lm_head, (hid, vocab), "drafter lm_head")?,
        };
        check_mirror(dev, &w.final_norm, &m.final_norm, "drafter final_norm")?;
        Ok(w)
    }
}

/// Compares a small generated tensor with the host's copy bit for bit: a start-up guard
/// that the device and the host compute the same model (a host model edited after
/// `from_seed`, or a device whose arithmetic differs, fails here rather than in a check
/// far downstream). `gpu-test` compares every tensor.
fn check_mirror(dev: &GpuDevice, got: &Buf<f32>, host: &[f32], what: &str) -> Result<(), GpuError> {
    let got = got.read(dev, host.len())?;
    match got
        .iter()
        .zip(host)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        None => Ok(()),
        Some(i) => Err(GpuError::Mirror(format!(
            "{what}[{i}] generated on the device is {:e}, the host's copy {:e}: the GPU does \
             not run the host's model",
            got[i], host[i]
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kv_b`'s row for head h and output j holds, along the latent, column j of head h's
    /// `w_uk` (j below nope) or column j - nope of its `w_uv`: one GEMM by it gives the
    /// prefill kernel's `[k_nope | v]` per head.
    #[test]
    fn kv_b_holds_each_heads_key_then_value_columns() {
        let d = ModelDims::tiny();
        let l = MlaLayer::from_seed(&d, 3, 0);
        let w = kv_b(&l, &d);
        let (heads, lora) = (d.num_heads, d.kv_lora_rank);
        let (nope, v) = (d.qk_nope_head_dim, d.v_head_dim);
        assert_eq!(w.len(), heads * (nope + v) * lora);
        for h in 0..heads {
            for c in 0..lora {
                for j in 0..nope + v {
                    let got = w[(h * (nope + v) + j) * lora + c];
                    let want = match j < nope {
                        true => l.w_uk[(h * lora + c) * nope + j],
                        false => l.w_uv[(h * lora + c) * v + j - nope],
                    };
                    assert_eq!(got.to_bits(), want.to_bits(), "head {h} latent {c} out {j}");
                }
            }
        }
    }
}
