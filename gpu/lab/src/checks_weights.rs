//! Weights generated on the device against the host's copy (`specmla-model`), bit for bit:
//! every tensor of the target and the drafter, in both forms (f32 for the portable kernels,
//! bf16 transposed for the GEMMs, DeepSeek's fused `kv_b_proj`), with and without bf16
//! rounding of the f32 tensors.

use specmla_core::config::ModelDims;
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::launch::Buf;
use specmla_gpu::ops::Kernels;
use specmla_gpu::weights::{kv_b, DrafterWeights, LayerWeights, Linear, TargetWeights, WeightForm};
use specmla_model::{DrafterModel, MlaLayer, TargetModel};

use crate::checks::CaseResult;

/// Host values as the device holds them: bf16 bits widened to f32's.
fn bf16_bits(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|&x| (half::bf16::from_f32(x).to_bits() as u32) << 16)
        .collect()
}

fn transposed(w: &[f32], (k, n): (usize, usize)) -> Vec<f32> {
    (0..k * n).map(|s| w[(s % k) * n + s / k]).collect()
}

/// Collects every mismatching tensor's name and first bad index.
struct Compare<'a> {
    dev: &'a GpuDevice,
    bad: Vec<String>,
    tensors: usize,
}

impl Compare<'_> {
    fn bits(&mut self, what: &str, got: Vec<u32>, want: Vec<u32>) {
        self.tensors += 1;
        if got.len() != want.len() {
            self.bad
                .push(format!("{what}: {} values, want {}", got.len(), want.len()));
        } else if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            self.bad.push(format!("{what}[{i}]"));
        }
    }

    fn f32(&mut self, what: &str, got: &Buf<f32>, want: &[f32]) -> Result<(), GpuError> {
        let g = got.read(self.dev, want.len())?;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        self.bits(what, bits(&g), bits(want));
        Ok(())
    }

    fn bf16(&mut self, what: &str, got: &Buf<u16>, want: &[f32]) -> Result<(), GpuError> {
        let g = got.read(self.dev, want.len())?;
        self.bits(
            what,
            g.iter().map(|&b| (b as u32) << 16).collect(),
            bf16_bits(want),
        );
        Ok(())
    }

    fn linear(&mut self, what: &str, got: &Linear, want: &[f32]) -> Result<(), GpuError> {
        match (&got.f32, &got.bf16_t) {
            (Some(f), _) => self.f32(what, f, want),
            (None, Some(b)) => self.bf16(what, b, &transposed(want, (got.k, got.n))),
            (None, None) => unreachable!("a Linear holds one form"),
        }
    }

    fn layer(
        &mut self,
        name: &str,
        got: &LayerWeights,
        l: &MlaLayer,
        d: &ModelDims,
    ) -> Result<(), GpuError> {
        let n = |w: &str| format!("{name}.{w}");
        self.f32(&n("attn_norm"), &got.attn_norm, &l.attn_norm)?;
        if let (Some((a, g)), Some(q)) = (&got.q_lora, &l.q_lora) {
            self.linear(&n("w_q_a"), a, &q.w_q_a)?;
            self.f32(&n("q_a_norm"), g, &q.q_a_norm)?;
        }
        self.linear(&n("w_q"), &got.w_q, &l.w_q)?;
        self.linear(&n("w_dkv"), &got.w_dkv, &l.w_dkv)?;
        self.f32(&n("kv_norm"), &got.kv_norm, &l.kv_norm)?;
        self.f32(&n("w_uk"), &got.w_uk, &l.w_uk)?;
        self.f32(&n("w_uv"), &got.w_uv, &l.w_uv)?;
        if let Some((uk, uv)) = &got.w_uk_uv_bf16 {
            self.bf16(&n("w_uk bf16"), uk, &l.w_uk)?;
            self.bf16(&n("w_uv bf16"), uv, &l.w_uv)?;
        }
        if let Some(b) = &got.w_kv_b {
            self.bf16(&n("kv_b"), b, &kv_b(l, d))?;
        }
        self.linear(&n("w_o"), &got.w_o, &l.w_o)?;
        self.f32(&n("mlp_norm"), &got.mlp_norm, &l.mlp_norm)?;
        self.linear(&n("w_gate"), &got.w_gate, &l.w_gate)?;
        self.linear(&n("w_up"), &got.w_up, &l.w_up)?;
        self.linear(&n("w_down"), &got.w_down, &l.w_down)
    }
}

/// One model configuration: generate both models on the device, compare every tensor.
fn check_one(
    dev: &GpuDevice,
    k: &Kernels,
    (label, dims): (&str, &ModelDims),
    form: WeightForm,
    bf16_weights: bool,
) -> Result<CaseResult, GpuError> {
    let (mut t, mut dr) = (
        TargetModel::from_seed(dims, 91),
        DrafterModel::from_seed(dims, 91),
    );
    if bf16_weights {
        (t, dr) = (t.with_bf16_weights(), dr.with_bf16_weights());
    }
    let tw = TargetWeights::generate(dev, k, &t, form)?;
    let dw = DrafterWeights::generate(dev, k, &dr, form)?;
    let mut c = Compare {
        dev,
        bad: Vec::new(),
        tensors: 0,
    };
    c.f32("target embed_tokens", &tw.embed_tokens, &t.embed_tokens)?;
    for (i, (g, l)) in tw.layers.iter().zip(&t.layers).enumerate() {
        c.layer(&format!("target layer {i}"), g, l, dims)?;
    }
    c.f32("target final_norm", &tw.final_norm, &t.final_norm)?;
    c.linear("target lm_head", &tw.lm_head, &t.lm_head)?;
    let mut table = dr.embed_tokens.clone();
    table.extend_from_slice(&dr.mask_embedding);
    c.f32("drafter embed_tokens + mask row", &dw.embed_tokens, &table)?;
    c.linear("drafter fc", &dw.fc, &dr.fc)?;
    c.linear("drafter fc_ctx", &dw.fc_ctx, &dr.fc_ctx)?;
    c.layer("drafter layer", &dw.layer, &dr.layer, dims)?;
    c.f32("drafter final_norm", &dw.final_norm, &dr.final_norm)?;
    c.linear("drafter lm_head", &dw.lm_head, &dr.lm_head)?;
    let passed = c.bad.is_empty() && c.tensors > 20;
    Ok(CaseResult {
        kernel: "init_weights",
        case: format!(
            "{label}, {form:?}{}: {} tensors equal the host's bit for bit{}",
            if bf16_weights { ", bf16-rounded" } else { "" },
            c.tensors - c.bad.len(),
            match c.bad.is_empty() {
                true => String::new(),
                false => format!("; differ: {}", c.bad.join(", ")),
            }
        ),
        max_rel_err: if passed { 0.0 } else { f64::INFINITY },
        passed,
    })
}

/// The tiny model in both forms, and DeepSeek-V3's attention widths (one tensor-parallel
/// rank of 16) in the flash path's form.
pub fn run_weights(dev: &GpuDevice, k: &Kernels) -> Result<Vec<CaseResult>, GpuError> {
    let tiny = ModelDims::tiny();
    let dsv3 = ModelDims::deepseek_v3_attn()
        .tensor_parallel(16)
        .expect("16 divides 128 heads");
    Ok(vec![
        check_one(dev, k, ("tiny", &tiny), WeightForm::F32, false)?,
        check_one(dev, k, ("tiny", &tiny), WeightForm::Bf16, true)?,
        check_one(
            dev,
            k,
            ("deepseek-v3-attn tp16", &dsv3),
            WeightForm::Bf16,
            true,
        )?,
    ])
}
