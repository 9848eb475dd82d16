//! One step's launches on a rank of a [`CostTarget`], priced by a [`Calibration`]. The
//! shapes come from what the core planned (the step's rows and its drafter passes), so
//! the model prices exactly the batches the scheduler built, at any model size.
//!
//! Bytes and flops are counted as `gpu-bench --calibrate` counts them when it times the
//! same launches: bf16 operands (2 bytes), weights read once per launch; the decode's
//! flops over its query rows padded to 64 (the kernel's row group), and its CTAs (row
//! groups times the plan's splits).

use super::{nearest_heads, Calibration, CostTarget};
use crate::drafter::DrafterPass;
use crate::engine::StepOutcome;
use crate::plan::StepPlan;

/// Rows per decode CTA: a request's `q_len * heads` query rows are padded to it.
pub const DECODE_ROW_GROUP: usize = 64;
/// Latent row width (`kv_lora + rope`) and value width (`kv_lora`) the decode reads.
const LATENT: f64 = 576.0;
const KV_LORA: f64 = 512.0;
const BF16: f64 = 2.0;
const FP8: f64 = 1.0;

/// What one step costs, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCost {
    pub attention_us: f64,
    pub gemm_us: f64,
    pub comm_us: f64,
    /// What no kernel class prices: the host's share and the small kernels
    /// ([`super::Overhead`]).
    pub host_us: f64,
}

impl StepCost {
    pub fn total_us(&self) -> f64 {
        self.attention_us + self.gemm_us + self.comm_us + self.host_us
    }

    pub fn add(&mut self, o: &StepCost) {
        self.attention_us += o.attention_us;
        self.gemm_us += o.gemm_us;
        self.comm_us += o.comm_us;
        self.host_us += o.host_us;
    }
}

/// Output tiles a GEMM's CTA computes (128 x 128) and the SMs one wave fills: a pinned
/// algorithm without split-K walks the whole K in each tile, so a narrow GEMM (few
/// tiles) takes K steps however small its M.
const GEMM_TILE: usize = 128;
const GEMM_WAVE_CTAS: usize = 132;

/// The bytes, flops and serial work units of `batch` GEMMs `[m, k] x [k, n]` in bf16 in
/// one launch: the units are waves of tiles times K in steps of 64 (what a CTA walks).
pub fn gemm_size(m: usize, k: usize, n: usize, batch: usize) -> (f64, f64, f64) {
    let (mf, kf, nf, b) = (m as f64, k as f64, n as f64, batch as f64);
    let tiles = m.div_ceil(GEMM_TILE) * n.div_ceil(GEMM_TILE) * batch;
    let units = tiles.div_ceil(GEMM_WAVE_CTAS) * k.div_ceil(64);
    (
        b * (mf * kf + kf * nf + mf * nf) * BF16,
        b * 2.0 * mf * kf * nf,
        units as f64,
    )
}

/// The bytes, flops and CTAs of one decode launch over rows of `(q_len, seq_len, splits)`
/// at `heads`: a row's query rows go in groups of 64, each group once per split.
pub fn decode_size(heads: usize, rows: &[(usize, usize, usize)]) -> (f64, f64, f64) {
    rows.iter()
        .fold((0.0, 0.0, 0.0), |(b, f, c), &(q, l, splits)| {
            let groups = (q * heads).div_ceil(DECODE_ROW_GROUP);
            let l = l as f64;
            (
                b + l * LATENT * BF16 + (q * heads) as f64 * (LATENT + KV_LORA) * BF16,
                f + 2.0 * (groups * DECODE_ROW_GROUP) as f64 * l * (LATENT + KV_LORA),
                c + (groups * splits.max(1)) as f64,
            )
        })
}

/// The bytes, flops and serial work units ([`prefill_units`]) of one prefill launch over
/// rows of `(queries, keys)` at `heads` (query and key width 192, value width 128);
/// `causal` counts the lower triangle.
pub fn prefill_size(heads: usize, rows: &[(usize, usize)], causal: bool) -> (f64, f64, f64) {
    let h = heads as f64;
    let (bytes, flops) = rows.iter().fold((0.0, 0.0), |(b, f), &(m, n)| {
        let (mf, nf) = (m as f64, n as f64);
        let pairs = match causal {
            true => mf * (mf + 1.0) / 2.0 + mf * (nf - mf).max(0.0),
            false => mf * nf,
        };
        (
            b + (mf * 192.0 + nf * (192.0 + 128.0) + mf * 128.0) * h * BF16,
            f + 2.0 * h * pairs * (192.0 + 128.0),
        )
    });
    (bytes, flops, prefill_units(heads, rows, causal))
}

/// Query rows of a prefill CTA and keys of one step of its loop.
const PREFILL_TILE_ROWS: usize = 64;
const PREFILL_TILE_KEYS: usize = 128;

/// The serial work of one prefill launch over `rows`: its waves of CTAs (one per query
/// tile, head and row, padded to the longest row's tiles as the grid is) over the SMs,
/// times the key tiles a CTA walks (the longest row's; half the triangle when causal).
/// A CTA walks its keys one tile after another, so a single row of 64 queries over 8k
/// keys takes 4x what its flops and bytes say (H100, `flash_prefill_tma`, 8 heads).
fn prefill_units(heads: usize, rows: &[(usize, usize)], causal: bool) -> f64 {
    let max_q = rows.iter().map(|r| r.0).max().unwrap_or(0);
    let max_steps = rows
        .iter()
        .map(|&(m, n)| match causal {
            true => n.saturating_sub(m / 2),
            false => n,
        })
        .max()
        .unwrap_or(0)
        .div_ceil(PREFILL_TILE_KEYS);
    let ctas = max_q.div_ceil(PREFILL_TILE_ROWS) * heads * rows.len();
    (ctas.div_ceil(GEMM_WAVE_CTAS) * max_steps) as f64
}

/// Prices launches on one calibration and target.
struct Pricer<'a> {
    c: &'a Calibration,
    t: &'a CostTarget,
    cost: StepCost,
}

impl Pricer<'_> {
    fn gemm(&mut self, m: usize, k: usize, n: usize) {
        self.gemm_weights(m, k, n, self.t.fp8_weights);
    }

    /// A projection of `m` tokens through a `[k, n]` weight, FP8 where `fp8`.
    fn gemm_weights(&mut self, m: usize, k: usize, n: usize, fp8: bool) {
        if m > 0 && n > 0 {
            let bf16 = self.gemm_bf16_us(m, k, n);
            self.cost.gemm_us += self.weights_us(bf16, gemm_size(m, k, n, 1), k * n, fp8);
            self.convert(m * k);
        }
    }

    /// A bf16 weight's GEMM: from its timed shape where the calibration has it.
    fn gemm_bf16_us(&self, m: usize, k: usize, n: usize) -> f64 {
        let (b, f, u) = gemm_size(m, k, n, 1);
        (self.c.gemm.gemm_table_us(m, k, n)).unwrap_or_else(|| self.c.gemm.fit.us(b, f, u))
    }

    /// A launch of `(bytes, flops, units)` priced `bf16_us` with bf16 weights, priced
    /// with its `weights` values in FP8 where `fp8`: scaled by the fit's time at 1 byte
    /// a weight and FP8 flops (twice as fast) over its time in bf16.
    fn weights_us(
        &self,
        bf16_us: f64,
        (b, f, u): (f64, f64, f64),
        weights: usize,
        fp8: bool,
    ) -> f64 {
        if !fp8 {
            return bf16_us;
        }
        let fit = &self.c.gemm.fit;
        let fp8_us = fit.us(b - weights as f64 * (BF16 - FP8), f / 2.0, u);
        bf16_us * fp8_us / fit.us(b, f, u)
    }

    /// The f32-to-bf16 conversion of `values` GEMM inputs, where the target has f32
    /// activations.
    fn convert(&mut self, values: usize) {
        if self.t.f32_activations && values > 0 {
            let bytes = values as f64 * (4.0 + BF16);
            self.cost.gemm_us += self.c.convert.fit.us(bytes, 0.0, 0.0);
        }
    }

    fn decode(&mut self, rows: &[(usize, usize, usize)]) {
        if !rows.is_empty() {
            let heads = self.t.rank_dims.num_heads;
            let (b, f, c) = decode_size(heads, rows);
            self.cost.attention_us += nearest_heads(&self.c.decode, heads).fit.us(b, f, c);
        }
    }

    fn prefill(&mut self, rows: &[(usize, usize)], causal: bool) {
        if rows.iter().any(|r| r.0 > 0 && r.1 > 0) {
            let heads = self.t.rank_dims.num_heads;
            let (b, f, u) = prefill_size(heads, rows, causal);
            self.cost.attention_us += nearest_heads(&self.c.prefill, heads).fit.us(b, f, u);
        }
    }

    /// A memory-bound helper launch of `bytes` (a gather, a merge, a fill, a conversion)
    /// in the attention path, priced by the conversion class.
    fn elementwise(&mut self, bytes: f64) {
        if bytes > 0.0 {
            self.cost.attention_us += self.c.convert.fit.us(bytes, 0.0, 0.0);
        }
    }

    /// The prefill path of one layer as the engine runs it: the new tokens causal, then
    /// each of the core's context chunks (the context shared out evenly) gathered from
    /// the cache, attended and merged by LSE, then the new tokens merged in; queries and
    /// latents converted to bf16 first where activations are f32.
    fn prefill_rows(&mut self, new: &[(usize, usize)], ctx: &[(usize, usize)], chunks: usize) {
        let total: usize = new.iter().map(|r| r.0).sum();
        if total == 0 {
            return;
        }
        let d = &self.t.rank_dims;
        let (heads, latent) = (d.num_heads as f64, d.latent_dim() as f64);
        let t = total as f64;
        // One output row of every head, f32, and its LSE: what a merge reads twice and
        // writes once, and a fill writes.
        let state = t * heads * (d.v_head_dim as f64 + 1.0) * 4.0;
        if self.t.f32_activations {
            self.elementwise(t * heads * d.qk_head_dim() as f64 * (4.0 + BF16));
            self.elementwise(t * latent * (4.0 + BF16));
        }
        self.prefill(new, true);
        if chunks == 0 {
            return;
        }
        self.elementwise(state);
        for _ in 0..chunks {
            let share: Vec<(usize, usize)> =
                ctx.iter().map(|&(m, n)| (m, n.div_ceil(chunks))).collect();
            let keys: usize = share.iter().map(|r| r.1).sum();
            self.elementwise(keys as f64 * latent * BF16 * 2.0);
            self.prefill(&share, false);
            self.elementwise(3.0 * state);
        }
        self.elementwise(3.0 * state);
    }

    fn all_reduce(&mut self, tokens: usize) {
        let tp = self.t.tp as f64;
        if self.t.tp > 1 && tokens > 0 {
            let a = &self.c.allreduce;
            let bytes = (tokens * self.t.rank_dims.hidden_size) as f64 * BF16;
            self.cost.comm_us +=
                a.latency_us + 2.0 * (tp - 1.0) / tp * bytes / (a.bus_gb_per_s * 1e3);
        }
    }

    /// One layer's projections around attention for `tokens` (the latent path) of which
    /// `query_tokens` need queries and outputs, `absorbed` of them decode tokens.
    fn attention_projections(&mut self, tokens: usize, query_tokens: usize, absorbed: usize) {
        let d = &self.t.rank_dims;
        let (hid, heads) = (d.hidden_size, d.num_heads);
        if d.q_lora_rank > 0 {
            self.gemm(query_tokens, hid, d.q_lora_rank);
        }
        self.gemm(tokens, hid, d.latent_dim());
        let q_in = if d.q_lora_rank > 0 {
            d.q_lora_rank
        } else {
            hid
        };
        self.gemm(query_tokens, q_in, heads * d.qk_head_dim());
        // The absorbed W_UK and W_UV: one batched GEMM per head each.
        for (k, n) in [
            (d.qk_nope_head_dim, d.kv_lora_rank),
            (d.kv_lora_rank, d.v_head_dim),
        ] {
            if absorbed > 0 {
                let (b, f, u) = gemm_size(absorbed, k, n, heads);
                self.cost.gemm_us += self.c.gemm.fit.us(b, f, u);
                self.convert(absorbed * k * heads);
            }
        }
        self.gemm(query_tokens, heads * d.v_head_dim, hid);
    }

    /// Layer `l`'s MLP for `tokens`: dense (sharded), or the MoE's router, shared experts
    /// (sharded) and this rank's routed experts as one grouped launch.
    fn mlp(&mut self, l: usize, tokens: usize) {
        let (d, tp) = (&self.t.rank_dims, self.t.tp);
        let hid = d.hidden_size;
        let moe = self.t.moe.clone().filter(|m| l >= m.first_dense_layers);
        let Some(m) = moe else {
            let inter = d.intermediate_size.div_ceil(tp);
            self.gemm(tokens, hid, 2 * inter);
            self.gemm(tokens, inter, hid);
            return;
        };
        if tokens == 0 {
            return;
        }
        // The router's gate stays bf16 in DeepSeek-V3's FP8 release.
        self.gemm_weights(tokens, hid, m.routed_experts, false);
        let shared = (m.shared_experts * m.expert_intermediate).div_ceil(tp);
        self.gemm(tokens, hid, 2 * shared);
        self.gemm(tokens, shared, hid);
        // Expected distinct experts this rank activates, uniform routing.
        let local = (m.routed_experts / tp).max(1) as f64;
        let p_pick = m.experts_per_token as f64 / m.routed_experts as f64;
        let active = local * (1.0 - (1.0 - p_pick).powf(tokens as f64));
        let pairs = tokens as f64 * m.experts_per_token as f64 / tp as f64;
        let (h, i) = (hid as f64, m.expert_intermediate as f64);
        let bytes = (active * 3.0 * h * i + pairs * (h + 2.0 * i + i + h)) * BF16;
        let flops = 2.0 * pairs * 3.0 * h * i;
        // The grouped launch's tiles: each active expert's rows, gate+up then down.
        let rows = (pairs / active.max(1.0)).ceil() as usize;
        let experts = active.ceil() as usize;
        let (_, _, up) = gemm_size(rows, hid, 2 * m.expert_intermediate, experts);
        let (_, _, down) = gemm_size(rows, m.expert_intermediate, hid, experts);
        let bf16 = self.c.gemm.fit.us(bytes, flops, up + down);
        let weights = (active * 3.0 * h * i) as usize;
        let launch = (bytes, flops, up + down);
        self.cost.gemm_us += self.weights_us(bf16, launch, weights, self.t.fp8_weights);
        self.convert(tokens * hid);
    }

    fn lm_head(&mut self, rows: usize) {
        let d = &self.t.rank_dims;
        // The LM head stays bf16 in an FP8 deployment.
        self.gemm_weights(rows, d.hidden_size, d.vocab_size.div_ceil(self.t.tp), false);
    }
}

/// The target forward of `plan`.
fn target_forward(p: &mut Pricer, plan: &StepPlan) {
    let c = &plan.common;
    let tokens = plan.num_tokens();
    let decode: Vec<(usize, usize, usize)> = plan.mla.decode.as_ref().map_or(Vec::new(), |d| {
        d.rows
            .clone()
            .enumerate()
            .map(|(i, r)| {
                let splits = d.split.num_splits.get(i).map_or(1, |&n| n as usize);
                (c.query_len(r), c.seq_lens[r] as usize, splits)
            })
            .collect()
    });
    let (mut new, mut ctx) = (Vec::new(), Vec::new());
    if let Some(pf) = &plan.mla.prefill {
        for r in pf.rows.clone() {
            let m = c.query_len(r);
            new.push((m, m));
            ctx.push((m, c.seq_lens[r] as usize - m));
        }
    }
    let chunks = plan
        .mla
        .prefill
        .as_ref()
        .and_then(|pf| pf.chunked_context.as_ref())
        .map_or(0, |cc| cc.chunks.len());
    let decode_tokens: usize = decode.iter().map(|r| r.0).sum();
    let expand_keys: usize = new.iter().chain(&ctx).map(|r| r.1).sum();
    let d = p.t.rank_dims.clone();
    for l in 0..d.num_layers {
        p.attention_projections(tokens, tokens, decode_tokens);
        p.gemm(
            expand_keys,
            d.kv_lora_rank,
            d.num_heads * (d.qk_nope_head_dim + d.v_head_dim),
        );
        p.decode(&decode);
        p.prefill_rows(&new, &ctx, chunks);
        p.all_reduce(tokens);
        p.mlp(l, tokens);
        p.all_reduce(tokens);
    }
    p.lm_head(plan.logits_indices.len());
}

/// One multi-step drafter pass: the drafter layer over its tokens, attention and the
/// rest of the layer for the sampled rows only, as the engine runs it.
fn drafter_pass(p: &mut Pricer, pass: &DrafterPass) {
    let d = p.t.rank_dims.clone();
    let n = pass.num_padded_tokens;
    let rows: Vec<(usize, usize, usize)> = pass
        .kv_lens
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let splits = pass.split.num_splits.get(i).map_or(1, |&n| n as usize);
            (1, l as usize, splits)
        })
        .collect();
    let sampled = rows.len();
    p.gemm(n, 2 * d.hidden_size, d.hidden_size);
    p.attention_projections(n, sampled, sampled);
    p.decode(&rows);
    p.all_reduce(sampled);
    // DeepSeek-V3's MTP layer is a MoE layer: index it past the dense ones.
    p.mlp(d.num_layers, sampled);
    p.all_reduce(sampled);
    p.lm_head(sampled);
}

/// What `o` (one step the engine ran) costs on a rank of `t`, by `c`.
pub fn step_cost(c: &Calibration, t: &CostTarget, o: &StepOutcome) -> StepCost {
    let mut p = Pricer {
        c,
        t,
        cost: StepCost::default(),
    };
    if o.plan.num_tokens() == 0 {
        return p.cost;
    }
    target_forward(&mut p, &o.plan);
    for pass in &o.drafter_passes {
        drafter_pass(&mut p, pass);
    }
    if let Some(df) = &o.dflash {
        let d = p.t.rank_dims.clone();
        let ctx_tokens = df.context_token_indices.len();
        let block = df.block_tokens.len();
        p.gemm(ctx_tokens, d.hidden_size, d.hidden_size);
        p.attention_projections(ctx_tokens + block, block, 0);
        let rows: Vec<(usize, usize)> = df
            .context_lens
            .iter()
            .map(|&l| (df.block_len, l as usize + df.block_len))
            .collect();
        let expand: usize = rows.iter().map(|r| r.1).sum();
        p.gemm(
            expand,
            d.kv_lora_rank,
            d.num_heads * (d.qk_nope_head_dim + d.v_head_dim),
        );
        p.prefill(&rows, false);
        p.mlp(d.num_layers, block);
        p.lm_head(block);
    }
    let fit = match o.plan.cudagraph.is_some() {
        true => &c.overhead.graph,
        false => &c.overhead.eager,
    };
    p.cost.host_us = fit.us(
        t.rank_dims.num_layers,
        drafter_passes(o),
        o.plan.num_tokens(),
    );
    p.cost
}

/// Drafter passes of a step: its multi-step passes, or its DFlash block.
pub fn drafter_passes(o: &StepOutcome) -> usize {
    o.drafter_passes.len() + o.dflash.is_some() as usize
}
