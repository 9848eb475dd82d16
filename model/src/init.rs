//! Weight initialization by a counter-based hash. Every weight is a pure function of
//! (seed, stream, tensor, element index), not a position in a sequential random stream, so
//! the CUDA backend fills each tensor on the device in whatever layout its kernels read
//! (transposed, bf16, DeepSeek's fused `kv_b_proj`) while the host computes the same bits
//! for the CPU backend and the oracle. The device kernel (`gpu/kernels/dense.cu`,
//! `init_weights`) mirrors [`mix64`], [`unit`] and [`Init::value`] operation for operation:
//! integer mixing, an exact integer-to-float conversion, then one rounded multiply (and for
//! norm gains one rounded add), so the two sides agree bit for bit.

use specmla_core::config::ModelDims;

/// The golden-ratio increment of SplitMix64.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: a bijective 64-bit mix.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Element `index` of the tensor keyed `key`, as a value on the grid `k / 2^23` in
/// `[-1, 1)`: the hash's top 24 bits, converted exactly.
pub fn unit(key: u64, index: u64) -> f32 {
    let h = mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)));
    ((h >> 40) as i32 - (1 << 23)) as f32 * (1.0 / 8_388_608.0)
}

/// How a tensor's unit values become weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Uniform in `[-half_width, half_width)`: `unit * half_width`.
    Uniform { half_width: f32 },
    /// An RMSNorm gain near one: `1 + 0.1 * unit`.
    NormGain,
}

impl Init {
    /// The weight for unit value `u`; each operation rounds once (the device uses the
    /// `_rn` intrinsics so nothing is contracted into an FMA).
    pub fn value(self, u: f32) -> f32 {
        match self {
            Init::Uniform { half_width } => u * half_width,
            Init::NormGain => 1.0 + 0.1 * u,
        }
    }

    /// Uniform, fan-in scaled: unit-variance inputs give unit-variance outputs.
    pub fn fan_in(in_dim: usize) -> Self {
        Init::Uniform {
            half_width: (3.0 / in_dim as f32).sqrt(),
        }
    }
}

/// One tensor's recipe: its hash key, its init and its element count (in its logical
/// row-major layout, the one `specmla-model` stores).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorInit {
    pub key: u64,
    pub init: Init,
    pub len: usize,
}

impl TensorInit {
    /// Tensor `slot` of `stream` under `seed`.
    pub fn new(seed: u64, stream: u64, slot: u64, init: Init, len: usize) -> Self {
        let key = mix64(seed ^ mix64(stream.wrapping_mul(GOLDEN) ^ slot));
        Self { key, init, len }
    }

    /// Element `index` of the tensor.
    pub fn value(&self, index: u64) -> f32 {
        self.init.value(unit(self.key, index))
    }

    /// The whole tensor, on the host.
    pub fn host(&self) -> Vec<f32> {
        (0..self.len as u64).map(|i| self.value(i)).collect()
    }
}

/// Tensor slots outside the layers.
const EMBED: u64 = 0;
const FINAL_NORM: u64 = 1;
const LM_HEAD: u64 = 2;
const FC: u64 = 3;
const FC_CTX: u64 = 4;
const MASK_EMBEDDING: u64 = 5;
/// Layer `l`'s tensors take slots `LAYER_BASE + LAYER_SLOTS * l + field`.
const LAYER_BASE: u64 = 16;
const LAYER_SLOTS: u64 = 16;

/// Gain on the LM head's init range. Unit-variance logits leave argmax margins so thin that
/// f32 and f64 would disagree too often; 3x gives logits with a std of about 3.
pub const LM_HEAD_GAIN: f32 = 3.0;
/// Half-width of the uniform init of token and mask embeddings.
pub const EMBED_SCALE: f32 = 1.0;

/// The recipes of one MLA layer's tensors (layouts as in [`crate::MlaLayer`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerInit {
    pub attn_norm: TensorInit,
    /// `(w_q_a, q_a_norm)` where the model compresses its query.
    pub q_lora: Option<(TensorInit, TensorInit)>,
    pub w_q: TensorInit,
    pub w_dkv: TensorInit,
    pub kv_norm: TensorInit,
    pub w_uk: TensorInit,
    pub w_uv: TensorInit,
    pub w_o: TensorInit,
    pub mlp_norm: TensorInit,
    pub w_gate: TensorInit,
    pub w_up: TensorInit,
    pub w_down: TensorInit,
}

impl LayerInit {
    /// Layer `layer` of `stream`.
    pub fn new(dims: &ModelDims, seed: u64, stream: u64, layer: usize) -> Self {
        let (d, h) = (dims.hidden_size, dims.num_heads);
        let (lora, nope, v) = (dims.kv_lora_rank, dims.qk_nope_head_dim, dims.v_head_dim);
        let inter = dims.intermediate_size;
        let base = LAYER_BASE + LAYER_SLOTS * layer as u64;
        let t = |field: u64, init, len| TensorInit::new(seed, stream, base + field, init, len);
        let r = dims.q_lora_rank;
        let q_in = crate::q_in_dim(dims);
        Self {
            attn_norm: t(0, Init::NormGain, d),
            q_lora: (r > 0).then(|| (t(1, Init::fan_in(d), d * r), t(2, Init::NormGain, r))),
            w_q: t(3, Init::fan_in(q_in), q_in * h * dims.qk_head_dim()),
            w_dkv: t(4, Init::fan_in(d), d * dims.latent_dim()),
            kv_norm: t(5, Init::NormGain, lora),
            w_uk: t(6, Init::fan_in(lora), h * lora * nope),
            w_uv: t(7, Init::fan_in(lora), h * lora * v),
            w_o: t(8, Init::fan_in(h * v), h * v * d),
            mlp_norm: t(9, Init::NormGain, d),
            w_gate: t(10, Init::fan_in(d), d * inter),
            w_up: t(11, Init::fan_in(d), d * inter),
            w_down: t(12, Init::fan_in(inter), inter * d),
        }
    }
}

/// The recipes of the target model's tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetInit {
    pub embed_tokens: TensorInit,
    pub layers: Vec<LayerInit>,
    pub final_norm: TensorInit,
    pub lm_head: TensorInit,
}

impl TargetInit {
    pub fn new(dims: &ModelDims, seed: u64) -> Self {
        let (d, vocab, s) = (dims.hidden_size, dims.vocab_size, crate::TARGET_STREAM);
        Self {
            embed_tokens: embed(seed, s, vocab * d),
            layers: (0..dims.num_layers)
                .map(|l| LayerInit::new(dims, seed, s, l))
                .collect(),
            final_norm: TensorInit::new(seed, s, FINAL_NORM, Init::NormGain, d),
            lm_head: lm_head(seed, s, d, vocab),
        }
    }
}

/// The recipes of the drafter's tensors (one layer).
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterInit {
    pub embed_tokens: TensorInit,
    pub fc: TensorInit,
    pub fc_ctx: TensorInit,
    pub mask_embedding: TensorInit,
    pub layer: LayerInit,
    pub final_norm: TensorInit,
    pub lm_head: TensorInit,
}

impl DrafterInit {
    pub fn new(dims: &ModelDims, seed: u64) -> Self {
        let (d, vocab, s) = (dims.hidden_size, dims.vocab_size, crate::DRAFTER_STREAM);
        Self {
            embed_tokens: embed(seed, s, vocab * d),
            fc: TensorInit::new(seed, s, FC, Init::fan_in(2 * d), 2 * d * d),
            fc_ctx: TensorInit::new(seed, s, FC_CTX, Init::fan_in(d), d * d),
            mask_embedding: TensorInit::new(seed, s, MASK_EMBEDDING, embed_init(), d),
            layer: LayerInit::new(dims, seed, s, 0),
            final_norm: TensorInit::new(seed, s, FINAL_NORM, Init::NormGain, d),
            lm_head: lm_head(seed, s, d, vocab),
        }
    }
}

fn embed_init() -> Init {
    Init::Uniform {
        half_width: EMBED_SCALE,
    }
}

fn embed(seed: u64, stream: u64, len: usize) -> TensorInit {
    TensorInit::new(seed, stream, EMBED, embed_init(), len)
}

fn lm_head(seed: u64, stream: u64, d: usize, vocab: usize) -> TensorInit {
    let half_width = LM_HEAD_GAIN * (3.0 / d as f32).sqrt();
    TensorInit::new(
        seed,
        stream,
        LM_HEAD,
        Init::Uniform { half_width },
        d * vocab,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_exact_grid_points_spread_over_the_range() {
        let key = TensorInit::new(7, 1, 3, Init::NormGain, 0).key;
        let us: Vec<f32> = (0..20_000).map(|i| unit(key, i)).collect();
        assert!(us.iter().all(|u| (-1.0..1.0).contains(u)));
        assert!(us.iter().all(|u| (u * 8_388_608.0).fract() == 0.0));
        let mean = us.iter().sum::<f32>() / us.len() as f32;
        let var = us.iter().map(|u| u * u).sum::<f32>() / us.len() as f32;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0 / 3.0).abs() < 0.01, "variance {var}");
    }

    #[test]
    fn tensors_streams_and_seeds_get_distinct_keys() {
        let dims = ModelDims::tiny();
        let t = TargetInit::new(&dims, 5);
        let d = DrafterInit::new(&dims, 5);
        let mut keys = vec![t.embed_tokens.key, t.final_norm.key, t.lm_head.key];
        keys.extend([
            d.embed_tokens.key,
            d.fc.key,
            d.mask_embedding.key,
            d.layer.w_o.key,
        ]);
        keys.extend(
            t.layers
                .iter()
                .flat_map(|l| [l.w_q.key, l.w_uk.key, l.w_down.key]),
        );
        keys.push(TargetInit::new(&dims, 6).embed_tokens.key);
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len());
    }

    /// Pins the hash: the device kernel is checked against these host values in
    /// `gpu-test`, and a change here changes every model.
    #[test]
    fn pinned_values() {
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161D_100B_05E5);
        let t = TensorInit::new(0, 0, 0, Init::NormGain, 3);
        let u0 = unit(t.key, 0);
        assert_eq!(t.value(0), 1.0 + 0.1 * u0);
        let w = TensorInit::new(0, 0, 0, Init::fan_in(3), 1);
        assert_eq!(w.value(0), u0);
    }
}
