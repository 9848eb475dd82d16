//! specmla-model: the tiny MLA transformer both backends run (RULES §10). It owns
//! the weights, a pure function of the seed ([`init`]: a counter-based hash, so the CUDA
//! backend generates them on the device), and the f32 building blocks
//! the CPU backend computes with (RMSNorm, RoPE, SwiGLU, row-major mat-vec): one MLA
//! layer's projections around attention, the target model and the one-layer drafter.
//! The CUDA backend fills the same weights on the device and mirrors these blocks in its
//! kernels.
//!
//! Attention itself lives in the backends: a layer only produces a token's query and the
//! latent row it caches, and consumes the attention output. All matrices are row-major
//! `[in, out]` (`y = x @ W`).
#![forbid(unsafe_code)]

pub mod init;

use init::{DrafterInit, LayerInit, TargetInit};
use specmla_core::config::ModelDims;

pub use init::{EMBED_SCALE, LM_HEAD_GAIN};

/// Hash stream of the target model's weights.
pub const TARGET_STREAM: u64 = specmla_core::rng::Stream::TargetWeights as u64;
/// Hash stream of the drafter's weights, so a drafter built from the same seed as the
/// target shares no weights with it.
pub const DRAFTER_STREAM: u64 = specmla_core::rng::Stream::DrafterWeights as u64;
/// RMSNorm epsilon.
pub const RMS_EPS: f32 = 1e-6;

/// RMSNorm with a learned gain (`RMS_EPS` inside the root).
pub fn rms_norm(x: &[f32], weight: &[f32]) -> Vec<f32> {
    debug_assert_eq!(x.len(), weight.len());
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (mean_sq + RMS_EPS).sqrt();
    x.iter().zip(weight).map(|(v, w)| v * inv * w).collect()
}

/// SiLU (swish) activation.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Inner product of two equal-length vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += alpha * x`.
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    debug_assert_eq!(y.len(), x.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `x @ w` for `w` stored `[in_dim, out_dim]`. Accumulating whole rows keeps the inner loop
/// over contiguous memory, which the compiler vectorizes.
pub fn matvec(x: &[f32], w: &[f32], in_dim: usize, out_dim: usize) -> Vec<f32> {
    assert!(
        x.len() == in_dim && w.len() == in_dim * out_dim,
        "matvec shape"
    );
    let mut y = vec![0.0; out_dim];
    for (xi, row) in x.iter().zip(w.chunks_exact(out_dim)) {
        axpy(&mut y, *xi, row);
    }
    y
}

/// Rotation angle of pair `pair` of a `len`-wide RoPE vector at position `pos`, in f64 so
/// the f32 model and the f64 oracle rotate by the same angle.
pub fn rope_angle(pos: usize, pair: usize, len: usize, theta: f64) -> f64 {
    pos as f64 * theta.powf(-((2 * pair) as f64) / len as f64)
}

/// Rotates the interleaved pairs `(x[2i], x[2i+1])` in place for position `pos`.
pub fn apply_rope(x: &mut [f32], pos: usize, theta: f64) {
    let len = x.len();
    debug_assert_eq!(len % 2, 0, "RoPE needs an even width");
    for (i, pair) in x.chunks_exact_mut(2).enumerate() {
        let (sin, cos) = rope_angle(pos, i, len, theta).sin_cos();
        let (s, c) = (sin as f32, cos as f32);
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

/// Width of the query projection's input: the compressed query's (`q_lora_rank`) where
/// the model compresses it, else the hidden state's.
pub fn q_in_dim(dims: &ModelDims) -> usize {
    match dims.q_lora_rank {
        0 => dims.hidden_size,
        r => r,
    }
}

/// Index of the largest logit; the lowest index wins a tie, so greedy decoding is a
/// function of the logits alone.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Row `token` of a `[vocab, width]` table. Token ids come from the model's own vocabulary,
/// so an out-of-range id is a caller bug.
fn table_row(table: &[f32], token: u32, width: usize) -> Vec<f32> {
    let start = token as usize * width;
    assert!(
        start + width <= table.len(),
        "token {token} outside the vocabulary"
    );
    table[start..start + width].to_vec()
}

/// The query's low-rank compression, DeepSeek-V2/V3's `q_a_proj` and `q_a_layernorm`
/// (a model with `q_lora_rank` 0 has none).
#[derive(Clone, Debug, PartialEq)]
pub struct QLora {
    /// `[hidden, q_lora]`.
    pub w_q_a: Vec<f32>,
    /// RMSNorm gain on the compressed query, `[q_lora]`.
    pub q_a_norm: Vec<f32>,
}

/// One transformer layer with multi-head latent attention and a SwiGLU MLP.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaLayer {
    /// RMSNorm gain before attention, `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// The query's compression, where `q_lora_rank` > 0.
    pub q_lora: Option<QLora>,
    /// Query projection `[q_in, H*(nope+rope)]` (each head its nope part, then its rope
    /// part) from the normed hidden state, or with `q_lora` from the normed compressed
    /// query (DeepSeek's `q_b_proj`): `q_in` is [`q_in_dim`].
    pub w_q: Vec<f32>,
    /// KV down-projection `[hidden, kv_lora + rope]`: `c_kv` then the shared `k_rope`.
    pub w_dkv: Vec<f32>,
    /// RMSNorm gain applied to `c_kv` before it is cached, `[kv_lora]`.
    pub kv_norm: Vec<f32>,
    /// Key up-projection, `[H][kv_lora][nope]`.
    pub w_uk: Vec<f32>,
    /// Value up-projection, `[H][kv_lora][v]`.
    pub w_uv: Vec<f32>,
    /// Output projection `[H*v, hidden]`.
    pub w_o: Vec<f32>,
    /// RMSNorm gain before the MLP, `[hidden]`.
    pub mlp_norm: Vec<f32>,
    /// MLP gate projection `[hidden, inter]`.
    pub w_gate: Vec<f32>,
    /// MLP up projection `[hidden, inter]`.
    pub w_up: Vec<f32>,
    /// MLP down projection `[inter, hidden]`.
    pub w_down: Vec<f32>,
}

/// Rounds each value to the nearest bf16 (ties to even), kept as f32.
fn round_all(v: &mut [f32]) {
    for x in v {
        *x = half::bf16::from_f32(*x).to_f32();
    }
}

impl MlaLayer {
    /// Rounds every weight of the layer to bf16 (kept as f32).
    fn round_to_bf16(&mut self) {
        if let Some(q) = &mut self.q_lora {
            round_all(&mut q.w_q_a);
            round_all(&mut q.q_a_norm);
        }
        for w in [
            &mut self.attn_norm,
            &mut self.w_q,
            &mut self.w_dkv,
            &mut self.kv_norm,
            &mut self.w_uk,
            &mut self.w_uv,
            &mut self.w_o,
            &mut self.mlp_norm,
            &mut self.w_gate,
            &mut self.w_up,
            &mut self.w_down,
        ] {
            round_all(w);
        }
    }

    /// The layer's weights computed on the host from their recipes.
    pub fn from_init(i: &LayerInit) -> Self {
        Self {
            attn_norm: i.attn_norm.host(),
            q_lora: i.q_lora.map(|(a, n)| QLora {
                w_q_a: a.host(),
                q_a_norm: n.host(),
            }),
            w_q: i.w_q.host(),
            w_dkv: i.w_dkv.host(),
            kv_norm: i.kv_norm.host(),
            w_uk: i.w_uk.host(),
            w_uv: i.w_uv.host(),
            w_o: i.w_o.host(),
            mlp_norm: i.mlp_norm.host(),
            w_gate: i.w_gate.host(),
            w_up: i.w_up.host(),
            w_down: i.w_down.host(),
        }
    }

    /// Layer `layer` of the target drawn from `seed` (for tests of one layer).
    pub fn from_seed(dims: &ModelDims, seed: u64, layer: usize) -> Self {
        Self::from_init(&LayerInit::new(dims, seed, TARGET_STREAM, layer))
    }

    /// The token's query `[H*(nope+rope)]` (RoPE applied at `pos`) and its latent row
    /// `[kv_lora + rope]`, the values the KV cache stores for this token and layer.
    pub fn qkv(&self, dims: &ModelDims, x: &[f32], pos: usize) -> (Vec<f32>, Vec<f32>) {
        let h = rms_norm(x, &self.attn_norm);
        let qk = dims.qk_head_dim();
        let q_in = match &self.q_lora {
            Some(l) => {
                let c_q = matvec(&h, &l.w_q_a, dims.hidden_size, dims.q_lora_rank);
                rms_norm(&c_q, &l.q_a_norm)
            }
            None => h.clone(),
        };
        let mut q = matvec(&q_in, &self.w_q, q_in_dim(dims), dims.num_heads * qk);
        for head in q.chunks_exact_mut(qk) {
            apply_rope(&mut head[dims.qk_nope_head_dim..], pos, dims.rope_theta);
        }
        (q, self.latent_from_normed(dims, &h, pos))
    }

    /// The latent row of [`Self::qkv`] alone (drafter context rows need no query).
    pub fn latent_only(&self, dims: &ModelDims, x: &[f32], pos: usize) -> Vec<f32> {
        self.latent_from_normed(dims, &rms_norm(x, &self.attn_norm), pos)
    }

    fn latent_from_normed(&self, dims: &ModelDims, h: &[f32], pos: usize) -> Vec<f32> {
        let lora = dims.kv_lora_rank;
        let mut latent = matvec(h, &self.w_dkv, dims.hidden_size, dims.latent_dim());
        let c_kv = rms_norm(&latent[..lora], &self.kv_norm);
        latent[..lora].copy_from_slice(&c_kv);
        apply_rope(&mut latent[lora..], pos, dims.rope_theta);
        latent
    }

    /// The residual after this layer, given its input `x` and the attention output
    /// `[H*v]`: output projection, residual add, then the SwiGLU MLP block.
    pub fn finish(&self, dims: &ModelDims, x: &[f32], attn_out: &[f32]) -> Vec<f32> {
        let d = dims.hidden_size;
        let proj = matvec(attn_out, &self.w_o, dims.num_heads * dims.v_head_dim, d);
        let x1: Vec<f32> = x.iter().zip(&proj).map(|(a, b)| a + b).collect();
        let h = rms_norm(&x1, &self.mlp_norm);
        let inter = dims.intermediate_size;
        let gate = matvec(&h, &self.w_gate, d, inter);
        let up = matvec(&h, &self.w_up, d, inter);
        let act: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
        let down = matvec(&act, &self.w_down, inter, d);
        x1.iter().zip(&down).map(|(a, b)| a + b).collect()
    }
}

/// The target model: embedding, `num_layers` MLA layers, final norm and LM head. Its
/// "hidden state" (what drafters consume) is the residual after the last layer, before
/// the final norm.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetModel {
    /// Shapes the weights were drawn for.
    pub dims: ModelDims,
    /// The seed the weights are a function of ([`TargetInit`]): a device backend
    /// regenerates them from it rather than uploading these vectors.
    pub seed: u64,
    /// Whether every weight was rounded to bf16 ([`Self::with_bf16_weights`]).
    pub bf16_weights: bool,
    /// Token embedding `[vocab, hidden]`.
    pub embed_tokens: Vec<f32>,
    /// The transformer layers.
    pub layers: Vec<MlaLayer>,
    /// RMSNorm gain before the LM head, `[hidden]`.
    pub final_norm: Vec<f32>,
    /// LM head `[hidden, vocab]`.
    pub lm_head: Vec<f32>,
}

impl TargetModel {
    /// The target's weights for `seed` ([`TargetInit`], on [`TARGET_STREAM`]).
    pub fn from_seed(dims: &ModelDims, seed: u64) -> Self {
        let i = TargetInit::new(dims, seed);
        Self {
            dims: dims.clone(),
            seed,
            bf16_weights: false,
            embed_tokens: i.embed_tokens.host(),
            layers: i.layers.iter().map(MlaLayer::from_init).collect(),
            final_norm: i.final_norm.host(),
            lm_head: i.lm_head.host(),
        }
    }

    /// The same model with every weight rounded to bf16 (to nearest even, kept as f32):
    /// the values a bf16 checkpoint holds, so a bf16 GPU path and the f32 CPU reference
    /// compute with the same weights.
    pub fn with_bf16_weights(mut self) -> Self {
        self.bf16_weights = true;
        round_all(&mut self.embed_tokens);
        self.layers.iter_mut().for_each(MlaLayer::round_to_bf16);
        round_all(&mut self.final_norm);
        round_all(&mut self.lm_head);
        self
    }

    /// The residual-stream input of `token`.
    pub fn embed(&self, token: u32) -> Vec<f32> {
        table_row(&self.embed_tokens, token, self.dims.hidden_size)
    }

    /// Next-token logits `[vocab]` from a final hidden state.
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        let h = rms_norm(x, &self.final_norm);
        matvec(
            &h,
            &self.lm_head,
            self.dims.hidden_size,
            self.dims.vocab_size,
        )
    }
}

/// The one-layer drafter, with input fusions for both drafter families: EAGLE/MTP
/// (token embedding + previous hidden state) and DFlash (target hidden states as context,
/// a query block of a token and mask embeddings).
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterModel {
    /// Shapes the weights were drawn for (`num_layers` is ignored: always one layer).
    pub dims: ModelDims,
    /// The seed the weights are a function of ([`DrafterInit`]).
    pub seed: u64,
    /// Whether every weight was rounded to bf16 ([`Self::with_bf16_weights`]).
    pub bf16_weights: bool,
    /// Token embedding `[vocab, hidden]`.
    pub embed_tokens: Vec<f32>,
    /// EAGLE/MTP input fusion `[2*hidden, hidden]` over `concat(embedding, hidden)`.
    pub fc: Vec<f32>,
    /// DFlash context projection of target hidden states, `[hidden, hidden]`.
    pub fc_ctx: Vec<f32>,
    /// Input of the masked positions of a DFlash query block, `[hidden]`.
    pub mask_embedding: Vec<f32>,
    /// The drafter's single layer.
    pub layer: MlaLayer,
    /// RMSNorm gain before the LM head, `[hidden]`.
    pub final_norm: Vec<f32>,
    /// LM head `[hidden, vocab]`.
    pub lm_head: Vec<f32>,
}

impl DrafterModel {
    /// The drafter's weights for `seed` ([`DrafterInit`], on [`DRAFTER_STREAM`]).
    pub fn from_seed(dims: &ModelDims, seed: u64) -> Self {
        let i = DrafterInit::new(dims, seed);
        Self {
            dims: ModelDims {
                num_layers: 1,
                ..dims.clone()
            },
            seed,
            bf16_weights: false,
            embed_tokens: i.embed_tokens.host(),
            fc: i.fc.host(),
            fc_ctx: i.fc_ctx.host(),
            mask_embedding: i.mask_embedding.host(),
            layer: MlaLayer::from_init(&i.layer),
            final_norm: i.final_norm.host(),
            lm_head: i.lm_head.host(),
        }
    }

    /// The same drafter with every weight rounded to bf16, as
    /// [`TargetModel::with_bf16_weights`].
    pub fn with_bf16_weights(mut self) -> Self {
        self.bf16_weights = true;
        for w in [
            &mut self.embed_tokens,
            &mut self.fc,
            &mut self.fc_ctx,
            &mut self.mask_embedding,
            &mut self.final_norm,
            &mut self.lm_head,
        ] {
            round_all(w);
        }
        self.layer.round_to_bf16();
        self
    }

    /// EAGLE/MTP input: `concat(embed(token), hidden_in) @ fc`.
    pub fn fuse(&self, token: u32, hidden_in: &[f32]) -> Vec<f32> {
        let d = self.dims.hidden_size;
        let mut cat = table_row(&self.embed_tokens, token, d);
        cat.extend_from_slice(hidden_in);
        matvec(&cat, &self.fc, 2 * d, d)
    }

    /// DFlash context input: a target hidden state projected by `fc_ctx`.
    pub fn context_x(&self, target_hidden: &[f32]) -> Vec<f32> {
        let d = self.dims.hidden_size;
        matvec(target_hidden, &self.fc_ctx, d, d)
    }

    /// DFlash query-block input: the token's embedding, or the mask embedding for a
    /// position still to be drafted.
    pub fn block_x(&self, token: Option<u32>) -> Vec<f32> {
        match token {
            Some(t) => table_row(&self.embed_tokens, t, self.dims.hidden_size),
            None => self.mask_embedding.clone(),
        }
    }

    /// Draft logits `[vocab]` from the layer's output.
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        let h = rms_norm(x, &self.final_norm);
        matvec(
            &h,
            &self.lm_head,
            self.dims.hidden_size,
            self.dims.vocab_size,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_weights_other_seed_differs() {
        let dims = ModelDims::tiny();
        let a = TargetModel::from_seed(&dims, 7);
        assert!(a == TargetModel::from_seed(&dims, 7));
        let b = TargetModel::from_seed(&dims, 8);
        assert!(a.embed_tokens != b.embed_tokens && a.layers[1] != b.layers[1]);
        let d = DrafterModel::from_seed(&dims, 7);
        assert!(d == DrafterModel::from_seed(&dims, 7));
        assert!(d != DrafterModel::from_seed(&dims, 8));
        // Separate streams: the drafter must not replay the target's draws.
        assert!(d.embed_tokens != a.embed_tokens);
    }

    #[test]
    fn rope_preserves_pair_norms_and_is_relative() {
        let unit = init::Init::Uniform { half_width: 1.0 };
        let a = init::TensorInit::new(3, 9, 0, unit, 8).host();
        let b = init::TensorInit::new(3, 9, 1, unit, 8).host();
        let rotated = |v: &[f32], pos| {
            let mut v = v.to_vec();
            apply_rope(&mut v, pos, 10_000.0);
            v
        };
        let (ra, rb) = (rotated(&a, 5), rotated(&b, 5));
        assert!((dot(&ra, &ra) - dot(&a, &a)).abs() < 1e-5);
        // Scores depend only on the position difference.
        let (sa, sb) = (rotated(&a, 12), rotated(&b, 9));
        let (ta, tb) = (rotated(&a, 103), rotated(&b, 100));
        assert!((dot(&sa, &sb) - dot(&ta, &tb)).abs() < 1e-4);
        assert!((dot(&ra, &rb) - dot(&sa, &sb)).abs() > 1e-3);
    }

    #[test]
    fn latent_only_matches_qkv_and_matvec_is_row_major() {
        let dims = ModelDims::tiny();
        let model = TargetModel::from_seed(&dims, 11);
        let x = model.embed(17);
        let (_, latent) = model.layers[0].qkv(&dims, &x, 4);
        assert_eq!(latent, model.layers[0].latent_only(&dims, &x, 4));
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [2, 3]
        assert_eq!(matvec(&[1.0, -1.0], &w, 2, 3), vec![-3.0, -3.0, -3.0]);
    }
}
