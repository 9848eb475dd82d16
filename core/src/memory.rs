//! What a configuration allocates, by name: the weights and latent caches a backend
//! holds for it, so a run that cannot fit is refused before anything is allocated, in
//! one line that names the allocations (exit 2), instead of dying mid-allocation.
//! Counted as both backends store them today: f32 weights (the model's own tensors, the
//! drafter's included) and an f32 latent cache for the target and the drafter (a bf16
//! cache rounds its values but keeps f32 storage).

use crate::config::{EngineConfig, ModelDims};

/// One named allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub what: &'static str,
    pub bytes: u64,
}

const F32_BYTES: u64 = 4;

/// Values of one MLA layer's weights (norms, query path, latent projection, up-projections,
/// output projection, the SwiGLU MLP).
pub fn layer_values(m: &ModelDims) -> u64 {
    let (h, heads) = (m.hidden_size as u64, m.num_heads as u64);
    let qk = m.qk_head_dim() as u64;
    let query = match m.q_lora_rank as u64 {
        0 => h * heads * qk,
        r => h * r + r + r * heads * qk,
    };
    let latent = h * m.latent_dim() as u64 + m.kv_lora_rank as u64;
    let up = heads * m.kv_lora_rank as u64 * (m.qk_nope_head_dim + m.v_head_dim) as u64;
    let out = heads * m.v_head_dim as u64 * h;
    let mlp = 3 * h * m.intermediate_size as u64;
    2 * h + query + latent + up + out + mlp
}

/// The target's weights: embedding, layers, final norm, LM head.
pub fn target_weight_bytes(m: &ModelDims) -> u64 {
    let (h, vocab) = (m.hidden_size as u64, m.vocab_size as u64);
    (m.num_layers as u64 * layer_values(m) + 2 * vocab * h + h) * F32_BYTES
}

/// The one-layer drafter's weights: its layer, embedding and head, and the input fusions
/// (`fc`, `fc_ctx`, the mask embedding).
pub fn drafter_weight_bytes(m: &ModelDims) -> u64 {
    let (h, vocab) = (m.hidden_size as u64, m.vocab_size as u64);
    (layer_values(m) + 2 * vocab * h + 3 * h * h + 2 * h) * F32_BYTES
}

/// Every allocation a backend makes for `cfg` beyond its per-step workspaces: the weights
/// of both models and both latent caches (`num_gpu_blocks * page_size` slots each; the
/// target's per layer).
pub fn allocations(cfg: &EngineConfig) -> Vec<Allocation> {
    let m = &cfg.model;
    let slots =
        (cfg.scheduler.num_gpu_blocks as u64).saturating_mul(cfg.scheduler.page_size as u64);
    let per_layer = slots.saturating_mul(m.latent_dim() as u64 * F32_BYTES);
    vec![
        Allocation {
            what: "target weights",
            bytes: target_weight_bytes(m),
        },
        Allocation {
            what: "drafter weights",
            bytes: drafter_weight_bytes(m),
        },
        Allocation {
            what: "target KV cache",
            bytes: per_layer.saturating_mul(m.num_layers as u64),
        },
        Allocation {
            what: "drafter KV cache",
            bytes: per_layer,
        },
    ]
}

/// The sum of `allocs`.
pub fn total_bytes(allocs: &[Allocation]) -> u64 {
    allocs.iter().fold(0u64, |t, a| t.saturating_add(a.bytes))
}

/// `allocs` on one line, largest first: "target weights 2.1 GiB, ...".
pub fn describe(allocs: &[Allocation]) -> String {
    let mut sorted = allocs.to_vec();
    sorted.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.what.cmp(b.what)));
    sorted
        .iter()
        .map(|a| format!("{} {}", a.what, gib(a.bytes)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Bytes in GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendProfile, SpecConfig};

    /// The weights counted value by value for the tiny model (its tensors' lengths).
    #[test]
    fn the_tiny_model_counts_every_tensor() {
        let m = ModelDims::tiny();
        // norms 64 + 64 + 32, w_q 64 x 96, w_dkv 64 x 40, w_uk and w_uv 4 x 32 x 16 each,
        // w_o 64 x 64, MLP 3 x 64 x 128.
        let layer = 64 + 64 + 32 + 64 * 96 + 64 * 40 + 2 * 4 * 32 * 16 + 64 * 64 + 3 * 64 * 128;
        assert_eq!(layer_values(&m), layer);
        assert_eq!(target_weight_bytes(&m), (2 * layer + 2 * 512 * 64 + 64) * 4);
    }

    /// DeepSeek-V3's attention at two layers, 64 requests of 8192 tokens in pages of 64:
    /// what the README states.
    #[test]
    fn a_real_width_batch_of_64_requests_of_8k() {
        let mut cfg = EngineConfig::tiny(BackendProfile::FlashMla, SpecConfig::off());
        cfg.model = ModelDims::deepseek_v3_attn();
        cfg.scheduler.page_size = 64;
        cfg.scheduler.num_gpu_blocks = 64 * 8192 / 64;
        let a = allocations(&cfg);
        // q_a 7168 x 1536, q_b 1536 x 128 x 192, kv_a 7168 x 576, W_UK and W_UV
        // 128 x 512 x 128 each, o_proj 128 x 128 x 7168, MLP 3 x 7168 x 2048, norms.
        let layer: u64 = 7168 * 1536
            + 1536
            + 1536 * 128 * 192
            + 7168 * 576
            + 512
            + 2 * 128 * 512 * 128
            + 128 * 128 * 7168
            + 3 * 7168 * 2048
            + 2 * 7168;
        assert_eq!(layer_values(&cfg.model), layer);
        assert_eq!(a[2].bytes, 2 * 64 * 8192 * 576 * 4);
        assert_eq!(a[3].bytes, 64 * 8192 * 576 * 4);
        assert_eq!(gib(total_bytes(&a)), "6.97 GiB");
        assert_eq!(
            describe(&a),
            "target KV cache 2.25 GiB, target weights 1.94 GiB, drafter weights 1.65 GiB, \
             drafter KV cache 1.12 GiB"
        );
    }
}
