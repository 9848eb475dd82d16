//! The models' weights on the device: the same `specmla-model` tensors the CPU backend
//! computes with, uploaded once. On the bf16 path (the flash path's configurations) the
//! projections are uploaded as bf16 in nn.Linear's layout for the cuBLASLt GEMMs
//! instead of as f32, and the per-head up-projections get bf16 copies beside their f32
//! originals, and one bf16 key-and-value up-projection (DeepSeek's `kv_b_proj`) that the
//! tensor-core prefill path expands cached latents with.

use specmla_core::config::ModelDims;
use specmla_model::{q_in_dim, DrafterModel, MlaLayer, TargetModel};

use crate::device::{GpuDevice, GpuError};
use crate::launch::Buf;

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

/// `v` as bf16 bits, to nearest even (as the kernels' `to_bf16`).
fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect()
}

impl Linear {
    /// Uploads `w [k, n]` in `form`.
    pub fn upload(
        dev: &GpuDevice,
        w: &[f32],
        (k, n): (usize, usize),
        form: WeightForm,
        what: &str,
    ) -> Result<Self, GpuError> {
        assert_eq!(w.len(), k * n, "{what} is not [{k}, {n}]");
        let (f32, bf16_t) = match form {
            WeightForm::F32 => (Some(Buf::from_host(dev, w, what)?), None),
            WeightForm::Bf16 => {
                let mut t = vec![0f32; k * n];
                for (i, row) in w.chunks_exact(n).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        t[j * k + i] = v;
                    }
                }
                let what = format!("{what} (bf16, transposed)");
                (None, Some(Buf::from_host(dev, &bf16_bits(&t), &what)?))
            }
        };
        Ok(Self { k, n, f32, bf16_t })
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
    pub fn upload(
        dev: &GpuDevice,
        l: &MlaLayer,
        d: &ModelDims,
        form: WeightForm,
        name: &str,
    ) -> Result<Self, GpuError> {
        let up = |v: &[f32], w: &str| Buf::from_host(dev, v, &format!("{name}.{w}"));
        let lin = |v: &[f32], kn, w: &str| Linear::upload(dev, v, kn, form, &format!("{name}.{w}"));
        let (hid, inter, heads) = (d.hidden_size, d.intermediate_size, d.num_heads);
        let bf16 =
            |v: &[f32], w: &str| Buf::from_host(dev, &bf16_bits(v), &format!("{name}.{w} (bf16)"));
        Ok(Self {
            attn_norm: up(&l.attn_norm, "attn_norm")?,
            q_lora: match &l.q_lora {
                Some(q) => Some((
                    lin(&q.w_q_a, (hid, d.q_lora_rank), "w_q_a")?,
                    up(&q.q_a_norm, "q_a_norm")?,
                )),
                None => None,
            },
            w_q: lin(&l.w_q, (q_in_dim(d), heads * d.qk_head_dim()), "w_q")?,
            w_dkv: lin(&l.w_dkv, (hid, d.latent_dim()), "w_dkv")?,
            kv_norm: up(&l.kv_norm, "kv_norm")?,
            w_uk: up(&l.w_uk, "w_uk")?,
            w_uv: up(&l.w_uv, "w_uv")?,
            w_uk_uv_bf16: match form {
                WeightForm::Bf16 => Some((bf16(&l.w_uk, "w_uk")?, bf16(&l.w_uv, "w_uv")?)),
                WeightForm::F32 => None,
            },
            w_kv_b: match form {
                WeightForm::Bf16 => Some(bf16(&kv_b(l, d), "kv_b")?),
                WeightForm::F32 => None,
            },
            w_o: lin(&l.w_o, (heads * d.v_head_dim, hid), "w_o")?,
            mlp_norm: up(&l.mlp_norm, "mlp_norm")?,
            w_gate: lin(&l.w_gate, (hid, inter), "w_gate")?,
            w_up: lin(&l.w_up, (hid, inter), "w_up")?,
            w_down: lin(&l.w_down, (inter, hid), "w_down")?,
        })
    }
}

/// `[H * (nope + v), kv_lora]`: row `h * (nope + v) + j` is column j of head h's
/// `w_uk` (`[kv_lora][nope]`) for j below nope, else column `j - nope` of its `w_uv`.
fn kv_b(l: &MlaLayer, d: &ModelDims) -> Vec<f32> {
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
    pub fn upload(dev: &GpuDevice, m: &TargetModel, form: WeightForm) -> Result<Self, GpuError> {
        let d = &m.dims;
        Ok(Self {
            embed_tokens: Buf::from_host(dev, &m.embed_tokens, "target embed_tokens")?,
            layers: m
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| LayerWeights::upload(dev, l, d, form, &format!("target layer {i}")))
                .collect::<Result<_, _>>()?,
            final_norm: Buf::from_host(dev, &m.final_norm, "target final_norm")?,
            lm_head: Linear::upload(
                dev,
                &m.lm_head,
                (d.hidden_size, d.vocab_size),
                form,
                "target lm_head",
            )?,
        })
    }
}

/// The drafter on the device.
pub struct DrafterWeights {
    pub embed_tokens: Buf<f32>,
    pub fc: Linear,
    pub fc_ctx: Linear,
    pub layer: LayerWeights,
    pub final_norm: Buf<f32>,
    pub lm_head: Linear,
}

impl DrafterWeights {
    pub fn upload(dev: &GpuDevice, m: &DrafterModel, form: WeightForm) -> Result<Self, GpuError> {
        let d = &m.dims;
        let hid = d.hidden_size;
        Ok(Self {
            embed_tokens: Buf::from_host(dev, &m.embed_tokens, "drafter embed_tokens")?,
            fc: Linear::upload(dev, &m.fc, (2 * hid, hid), form, "drafter fc")?,
            fc_ctx: Linear::upload(dev, &m.fc_ctx, (hid, hid), form, "drafter fc_ctx")?,
            layer: LayerWeights::upload(dev, &m.layer, d, form, "drafter layer")?,
            final_norm: Buf::from_host(dev, &m.final_norm, "drafter final_norm")?,
            lm_head: Linear::upload(
                dev,
                &m.lm_head,
                (hid, d.vocab_size),
                form,
                "drafter lm_head",
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// `kv_b`'s row for head h and output j holds, along the latent, column j of head h's
    /// `w_uk` (j below nope) or column j - nope of its `w_uv`: one GEMM by it gives the
    /// prefill kernel's `[k_nope | v]` per head.
    #[test]
    fn kv_b_holds_each_heads_key_then_value_columns() {
        let d = ModelDims::tiny();
        let l = MlaLayer::random(&d, &mut ChaCha8Rng::seed_from_u64(3));
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
