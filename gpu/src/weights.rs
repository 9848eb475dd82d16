//! The tiny model's weights on the device: the same `specmla-model` tensors the CPU
//! backend computes with, uploaded once.

use specmla_model::{DrafterModel, MlaLayer, TargetModel};

use crate::device::{GpuDevice, GpuError};
use crate::launch::Buf;

/// One MLA layer's weights (layouts as in [`MlaLayer`]).
pub struct LayerWeights {
    pub attn_norm: Buf<f32>,
    /// The query's compression `(w_q_a, q_a_norm)`, where the model has one.
    pub q_lora: Option<(Buf<f32>, Buf<f32>)>,
    pub w_q: Buf<f32>,
    pub w_dkv: Buf<f32>,
    pub kv_norm: Buf<f32>,
    pub w_uk: Buf<f32>,
    pub w_uv: Buf<f32>,
    pub w_o: Buf<f32>,
    pub mlp_norm: Buf<f32>,
    pub w_gate: Buf<f32>,
    pub w_up: Buf<f32>,
    pub w_down: Buf<f32>,
}

impl LayerWeights {
    pub fn upload(dev: &GpuDevice, l: &MlaLayer, name: &str) -> Result<Self, GpuError> {
        let up = |v: &[f32], w: &str| Buf::from_host(dev, v, &format!("{name}.{w}"));
        Ok(Self {
            attn_norm: up(&l.attn_norm, "attn_norm")?,
            q_lora: match &l.q_lora {
                Some(q) => Some((up(&q.w_q_a, "w_q_a")?, up(&q.q_a_norm, "q_a_norm")?)),
                None => None,
            },
            w_q: up(&l.w_q, "w_q")?,
            w_dkv: up(&l.w_dkv, "w_dkv")?,
            kv_norm: up(&l.kv_norm, "kv_norm")?,
            w_uk: up(&l.w_uk, "w_uk")?,
            w_uv: up(&l.w_uv, "w_uv")?,
            w_o: up(&l.w_o, "w_o")?,
            mlp_norm: up(&l.mlp_norm, "mlp_norm")?,
            w_gate: up(&l.w_gate, "w_gate")?,
            w_up: up(&l.w_up, "w_up")?,
            w_down: up(&l.w_down, "w_down")?,
        })
    }
}

/// The target model on the device.
pub struct TargetWeights {
    pub embed_tokens: Buf<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Buf<f32>,
    pub lm_head: Buf<f32>,
}

impl TargetWeights {
    pub fn upload(dev: &GpuDevice, m: &TargetModel) -> Result<Self, GpuError> {
        Ok(Self {
            embed_tokens: Buf::from_host(dev, &m.embed_tokens, "target embed_tokens")?,
            layers: m
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| LayerWeights::upload(dev, l, &format!("target layer {i}")))
                .collect::<Result<_, _>>()?,
            final_norm: Buf::from_host(dev, &m.final_norm, "target final_norm")?,
            lm_head: Buf::from_host(dev, &m.lm_head, "target lm_head")?,
        })
    }
}

/// The drafter on the device.
pub struct DrafterWeights {
    pub embed_tokens: Buf<f32>,
    pub fc: Buf<f32>,
    pub fc_ctx: Buf<f32>,
    pub layer: LayerWeights,
    pub final_norm: Buf<f32>,
    pub lm_head: Buf<f32>,
}

impl DrafterWeights {
    pub fn upload(dev: &GpuDevice, m: &DrafterModel) -> Result<Self, GpuError> {
        Ok(Self {
            embed_tokens: Buf::from_host(dev, &m.embed_tokens, "drafter embed_tokens")?,
            fc: Buf::from_host(dev, &m.fc, "drafter fc")?,
            fc_ctx: Buf::from_host(dev, &m.fc_ctx, "drafter fc_ctx")?,
            layer: LayerWeights::upload(dev, &m.layer, "drafter layer")?,
            final_norm: Buf::from_host(dev, &m.final_norm, "drafter final_norm")?,
            lm_head: Buf::from_host(dev, &m.lm_head, "drafter lm_head")?,
        })
    }
}
