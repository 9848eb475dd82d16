//! The CPU reference backend: executes core-built plans with exact f32 MLA math. Decode
//! rows take the absorbed form with split-KV at fixed absolute positions; prefill rows
//! take the materialized form (causal new tokens, then context chunks gathered from the
//! cache and merged by LSE). A replayed graph runs the shape frozen at capture.

use std::sync::Arc;

use specmla_core::backend::{
    row_digest, row_digests, Backend, Carries, DrafterOutput, TargetOutput, TargetTensors,
};
use specmla_core::config::EngineConfig;
use specmla_core::cudagraph::GraphShape;
use specmla_core::drafter::{DFlashPass, DrafterPass, HiddenSource};
use specmla_core::fault::Fault;
use specmla_core::plan::StepPlan;
use specmla_core::split::SplitSchedule;

use crate::attention::{
    absorbed_attention, materialized_attention, merge_attention_states, AttnOutput, Mask, MlaDims,
};
use crate::kv_cache::PagedLatentCache;
use crate::model::{DrafterModel, MlaLayer, TargetModel};

/// Errors of the CPU backend.
#[derive(Debug, thiserror::Error)]
pub enum CpuBackendError {
    #[error("step replays a graph of {0} tokens that was never captured")]
    GraphNotCaptured(usize),
    #[error("{0}")]
    StaleCarry(String),
}

/// The CPU backend: target and drafter weights, their paged caches, captured shapes.
pub struct CpuBackend {
    cfg: EngineConfig,
    target: Arc<TargetModel>,
    drafter: Arc<DrafterModel>,
    target_cache: PagedLatentCache,
    drafter_cache: PagedLatentCache,
    graphs: Vec<GraphShape>,
    dims: MlaDims,
    /// Whether forwards return their full tensors.
    full_outputs: bool,
    carries: Carries,
    /// The last target forward's hidden states, `[tokens][hidden]`, and the last drafter
    /// pass's, `[sampled][hidden]`: what the next drafter pass reads.
    target_hidden: Vec<Vec<f32>>,
    drafter_hidden: Vec<Vec<f32>>,
}

impl CpuBackend {
    /// A backend over shared weights, with fresh (poisoned) caches.
    pub fn new(cfg: &EngineConfig, target: Arc<TargetModel>, drafter: Arc<DrafterModel>) -> Self {
        let s = &cfg.scheduler;
        let d = &cfg.model;
        Self {
            cfg: cfg.clone(),
            target_cache: PagedLatentCache::new(
                d.num_layers,
                s.num_gpu_blocks,
                s.page_size,
                d.latent_dim(),
            ),
            drafter_cache: PagedLatentCache::new(1, s.num_gpu_blocks, s.page_size, d.latent_dim()),
            target,
            drafter,
            graphs: Vec::new(),
            dims: MlaDims::from(d),
            full_outputs: false,
            carries: Carries::default(),
            target_hidden: Vec::new(),
            drafter_hidden: Vec::new(),
        }
    }

    /// A freshly projected latent as the cache holds it: rounded to the cache's dtype
    /// where it is produced, so this step's prefill rows see the same values a later read
    /// of the cache does (`KvCacheDtype`).
    fn as_stored(&self, mut latent: Vec<f32>) -> Vec<f32> {
        let dtype = self.cfg.kv_cache_dtype;
        latent.iter_mut().for_each(|v| *v = dtype.round(*v));
        latent
    }

    fn page(&self) -> usize {
        self.cfg.scheduler.page_size
    }

    /// The carried hidden state a drafter token starts from (`prev` says whether the
    /// pass continues a previous one).
    fn hidden_source(&self, src: HiddenSource, prev: bool) -> Result<&[f32], CpuBackendError> {
        let (rows, i, what) = match src {
            HiddenSource::TargetToken(i) => (&self.target_hidden, i, "target token"),
            HiddenSource::DrafterRow(r) if prev => (&self.drafter_hidden, r, "drafter row"),
            HiddenSource::DrafterRow(_) => {
                return Err(CpuBackendError::StaleCarry(
                    "a later drafter pass without a previous one".into(),
                ))
            }
        };
        rows.get(i as usize).map(Vec::as_slice).ok_or_else(|| {
            CpuBackendError::StaleCarry(format!("{what} {i} outside the {} carried", rows.len()))
        })
    }

    /// Finishes a drafter output: digests, id, and `hidden` kept for the next pass.
    fn drafter_carry(&mut self, mut out: DrafterOutput, hidden: Vec<Vec<f32>>) -> DrafterOutput {
        out.hidden_digests = hidden.iter().map(|h| row_digest(h)).collect();
        out.forward_id = self.carries.new_drafter();
        self.drafter_hidden = hidden;
        out
    }
}

/// Per-token activations of one layer.
struct LayerIo<'a> {
    q: &'a [Vec<f32>],
    latent: &'a [Vec<f32>],
    attn: &'a mut [Vec<f32>],
}

/// The factory of the CPU backend, in the shape the harness's `run_with` and replay take.
pub fn cpu_backend(
    cfg: &EngineConfig,
    target: Arc<TargetModel>,
    drafter: Arc<DrafterModel>,
) -> Result<CpuBackend, CpuBackendError> {
    Ok(CpuBackend::new(cfg, target, drafter))
}

/// The CPU backend's kernel fingerprint (and device name): one f32 implementation,
/// whatever the host.
pub const CPU_KERNELS: &str = "CPU reference (f32)";

impl Backend for CpuBackend {
    type Error = CpuBackendError;
    const KIND: &'static str = "cpu";

    fn device_name(&self) -> String {
        CPU_KERNELS.to_string()
    }

    fn kernels(&self) -> String {
        CPU_KERNELS.to_string()
    }

    /// Every CPU backend error is the engine's: the CPU is always there.
    fn is_environment(_: &CpuBackendError) -> bool {
        false
    }

    /// Both latent caches live in host memory.
    fn host_allocations(cfg: &EngineConfig) -> Vec<specmla_core::memory::Allocation> {
        specmla_core::memory::allocations(cfg).split_off(2)
    }

    fn set_full_outputs(&mut self, on: bool) {
        self.full_outputs = on;
    }

    fn capture_graphs(&mut self, shapes: &[GraphShape]) -> Result<(), Self::Error> {
        // The core hands over the shapes as the capture froze them (F2 included).
        self.graphs = shapes.to_vec();
        Ok(())
    }

    fn forward_target(&mut self, plan: &StepPlan) -> Result<TargetOutput, Self::Error> {
        let graph = match &plan.cudagraph {
            Some(g) => Some(
                *self
                    .graphs
                    .iter()
                    .find(|s| s.num_tokens == g.shape.num_tokens)
                    .ok_or(CpuBackendError::GraphNotCaptured(g.shape.num_tokens))?,
            ),
            None => None,
        };
        let model = Arc::clone(&self.target);
        let dims = model.dims.clone();
        let n = plan.num_tokens();
        let c = &plan.common;
        let mut x: Vec<Vec<f32>> = plan.token_ids[..n]
            .iter()
            .map(|&t| model.embed(t))
            .collect();
        let mut attn_outputs = Vec::with_capacity(dims.num_layers);
        for (l, layer) in model.layers.iter().enumerate() {
            let (q, latent): (Vec<_>, Vec<_>) = (0..n)
                .map(|t| {
                    let (q, latent) = layer.qkv(&dims, &x[t], c.positions[t] as usize);
                    (q, self.as_stored(latent))
                })
                .unzip();
            for t in 0..n {
                self.target_cache.write(l, c.slot_mapping[t], &latent[t]);
            }
            let mut attn = vec![vec![0.0; dims.num_heads * dims.v_head_dim]; n];
            let mut io = LayerIo {
                q: &q,
                latent: &latent,
                attn: &mut attn,
            };
            self.run_decode_rows(plan, graph, l, layer, &mut io);
            self.run_prefill_rows(plan, l, layer, &mut io);
            for t in 0..n {
                x[t] = layer.finish(&dims, &x[t], &attn[t]);
            }
            attn_outputs.push(attn.concat());
        }
        let logits = plan
            .logits_indices
            .iter()
            .flat_map(|&i| model.logits(&x[i as usize]))
            .collect();
        let width = dims.num_heads * dims.v_head_dim;
        let out = TargetOutput {
            logits,
            hidden_digests: x.iter().map(|h| row_digest(h)).collect(),
            attn_digests: attn_outputs.iter().map(|a| row_digests(a, width)).collect(),
            tensors: self.full_outputs.then(|| TargetTensors {
                hidden: x.concat(),
                attn_outputs,
                hidden_size: dims.hidden_size,
            }),
            forward_id: self.carries.new_target(),
            vocab_size: dims.vocab_size,
        };
        self.target_hidden = x;
        Ok(out)
    }

    fn forward_drafter(
        &mut self,
        pass: &DrafterPass,
        target: &TargetOutput,
        prev: Option<&DrafterOutput>,
    ) -> Result<DrafterOutput, Self::Error> {
        let carry = self
            .carries
            .check(target.forward_id, prev.map(|p| p.forward_id));
        carry.map_err(CpuBackendError::StaleCarry)?;
        let dr = Arc::clone(&self.drafter);
        let layer = &dr.layer;
        let dims = &dr.dims;
        let n = pass.token_ids.len();
        let mut x = Vec::with_capacity(n);
        for t in 0..n {
            let hidden_in = self.hidden_source(pass.hidden[t], prev.is_some())?;
            let xt = dr.fuse(pass.token_ids[t], hidden_in);
            let latent = self.as_stored(layer.latent_only(dims, &xt, pass.positions[t] as usize));
            self.drafter_cache.write(0, pass.slot_mapping[t], &latent);
            x.push(xt);
        }
        let mut out = DrafterOutput {
            vocab_size: dims.vocab_size,
            ..Default::default()
        };
        let mut hidden = Vec::with_capacity(pass.num_rows());
        for r in 0..pass.num_rows() {
            let t = pass.token_indices_to_sample[r] as usize;
            let pos = pass.positions[t] as usize;
            let (q, _) = layer.qkv(dims, &x[t], pos);
            // The plan says how many keys the sampled token sees, and in which splits.
            let visible = pass.kv_lens[r] as usize;
            let keys = self
                .drafter_cache
                .gather(0, pass.block_row(r), self.page(), 0, visible);
            let a = self.split_kv_attention(layer, &q, &keys, visible, split_at(&pass.split, r));
            let h = layer.finish(dims, &x[t], &a);
            out.logits.extend(dr.logits(&h));
            hidden.push(h);
        }
        Ok(self.drafter_carry(out, hidden))
    }

    fn forward_dflash(
        &mut self,
        pass: &DFlashPass,
        target: &TargetOutput,
    ) -> Result<DrafterOutput, Self::Error> {
        let carry = self.carries.check(target.forward_id, None);
        carry.map_err(CpuBackendError::StaleCarry)?;
        let dr = Arc::clone(&self.drafter);
        let (layer, dims) = (&dr.layer, &dr.dims);
        for (e, &i) in pass.context_token_indices.iter().enumerate() {
            let source = HiddenSource::TargetToken(i);
            let xc = dr.context_x(self.hidden_source(source, false)?);
            let latent =
                self.as_stored(layer.latent_only(dims, &xc, pass.context_positions[e] as usize));
            self.drafter_cache.write(0, pass.context_slots[e], &latent);
        }
        let b = pass.block_len;
        let mut block = Vec::with_capacity(pass.block_tokens.len());
        for (j, tok) in pass.block_tokens.iter().enumerate() {
            let xb = dr.block_x(*tok);
            let (q, latent) = layer.qkv(dims, &xb, pass.block_positions[j] as usize);
            let latent = self.as_stored(latent);
            self.drafter_cache.write(0, pass.block_slots[j], &latent);
            block.push((xb, q, latent));
        }
        let mut out = DrafterOutput {
            vocab_size: dims.vocab_size,
            ..Default::default()
        };
        let mut hidden = Vec::with_capacity(pass.sample_indices.len());
        let mut samples = pass.sample_indices.iter().map(|&j| j as usize).peekable();
        for r in 0..pass.req_ids.len() {
            let ctx = pass.context_lens[r] as usize;
            let n_keys = pass.kv_lens[r] as usize;
            let mut keys = self
                .drafter_cache
                .gather(0, block_row(pass, r), self.page(), 0, ctx);
            for (_, _, latent) in &block[r * b..(r + 1) * b] {
                keys.extend_from_slice(latent);
            }
            // The plan names the block positions that produce logits.
            while let Some(j) = samples.next_if(|&j| j < (r + 1) * b) {
                let (xb, q, _) = &block[j];
                let a = self.split_kv_attention(layer, q, &keys, n_keys, split_at(&pass.split, r));
                let h = layer.finish(dims, xb, &a);
                out.logits.extend(dr.logits(&h));
                hidden.push(h);
            }
        }
        Ok(self.drafter_carry(out, hidden))
    }
}

/// F1: the new tokens' LSE, laid out `[heads, tokens]`, read as if it were
/// `[tokens, heads]` (the shape flash-attn's varlen path returned). With one token or
/// one head the two layouts coincide, and with no context the merge ignores the LSE,
/// which is why the bug needed a prefill row with context and q >= 2 to show.
fn transposed_lse(mut a: AttnOutput, m: usize, heads: usize) -> AttnOutput {
    let original = a.lse.clone();
    for h in 0..heads {
        for t in 0..m {
            a.lse[h * m + t] = original[t * heads + h];
        }
    }
    a
}

/// Row `r`'s `(split length, split count)` in a schedule; a row the schedule does not
/// reach (a kernel row past the metadata's) takes no split.
fn split_at(s: &SplitSchedule, r: usize) -> (usize, usize) {
    match (s.split_len_tokens.get(r), s.num_splits.get(r)) {
        (Some(&len), Some(&n)) => (len as usize, n as usize),
        _ => (0, 0),
    }
}

fn block_row(pass: &DFlashPass, r: usize) -> &[u32] {
    &pass.block_table[r * pass.block_table_width..(r + 1) * pass.block_table_width]
}

impl CpuBackend {
    /// The decode kernel. A uniform kernel addresses row r's tokens at `r * q` from the
    /// start of the decode tokens (it never reads query_start_loc); a replayed graph uses
    /// the q and row count frozen at capture.
    fn run_decode_rows(
        &self,
        plan: &StepPlan,
        graph: Option<GraphShape>,
        l: usize,
        layer: &MlaLayer,
        io: &mut LayerIo<'_>,
    ) {
        let Some(d) = &plan.mla.decode else { return };
        let c = &plan.common;
        let n_real = plan.num_tokens();
        let rows = match graph {
            Some(g) => 0..g.num_rows,
            None => d.rows.start..d.rows.start + d.kernel_rows,
        };
        for (i, r) in rows.enumerate() {
            let (start, q_len) = match (graph, d.uniform_query_len) {
                (Some(g), _) => (i * g.query_len, g.query_len),
                (None, Some(q)) => (d.tokens.start + i * q, q),
                (None, None) => (c.query_start_loc[r] as usize, c.query_len(r)),
            };
            let seq_len = c.seq_lens.get(r).copied().unwrap_or(0) as usize;
            let split = split_at(&d.split, i);
            let block_row = if r < c.num_rows() {
                c.block_row(r)
            } else {
                &[][..]
            };
            for j in 0..q_len {
                let t = start + j;
                if t >= n_real {
                    continue; // a padding token: its output is discarded
                }
                let limit = (seq_len + j + 1).saturating_sub(q_len);
                let keys = self
                    .target_cache
                    .gather(l, block_row, self.page(), 0, limit);
                io.attn[t] = self.split_kv_attention(layer, &io.q[t], &keys, limit, split);
            }
        }
    }

    /// One query token over `keys[..n_keys]` (absolute positions from 0) in the
    /// schedule's splits: split i covers positions `[i * len, (i + 1) * len)`, each reduced
    /// on its own and merged in split order, as the decode kernels do. The schedule comes
    /// from the plan: keys past its splits (a stale schedule, F12) are never read.
    fn split_kv_attention(
        &self,
        layer: &MlaLayer,
        q: &[f32],
        keys: &[f32],
        n_keys: usize,
        (split, num_splits): (usize, usize),
    ) -> Vec<f32> {
        let width = self.dims.latent();
        let mut acc = AttnOutput::empty(1, &self.dims);
        for s in 0..num_splits {
            let from = (s * split).min(n_keys);
            let to = ((s + 1) * split).min(n_keys);
            if from == to {
                continue;
            }
            let part_keys = &keys[from * width..to * width];
            let part =
                absorbed_attention(&self.dims, layer, q, 1, part_keys, to - from, Mask::Full);
            acc = merge_attention_states(&acc, &part, 1, &self.dims);
        }
        acc.out
    }

    /// The prefill path: new tokens attend causally to themselves (from this step's
    /// latents); each context chunk is gathered from the cache and merged by LSE.
    fn run_prefill_rows(&self, plan: &StepPlan, l: usize, layer: &MlaLayer, io: &mut LayerIo<'_>) {
        let Some(p) = &plan.mla.prefill else { return };
        let c = &plan.common;
        for (j, r) in p.rows.clone().enumerate() {
            let toks = c.row_tokens(r);
            let m = toks.len();
            let q: Vec<f32> = io.q[toks.clone()].concat();
            let new_keys: Vec<f32> = io.latent[toks.clone()].concat();
            let new =
                materialized_attention(&self.dims, layer, &q, m, &new_keys, m, Mask::CausalTail);
            let mut ctx = AttnOutput::empty(m, &self.dims);
            for chunk in p.chunked_context.iter().flat_map(|cc| &cc.chunks) {
                let (start, len) = (chunk.starts[j], chunk.lens[j]);
                if len == 0 {
                    continue;
                }
                let keys =
                    self.target_cache
                        .gather(l, c.block_row(r), self.page(), start, start + len);
                let part = materialized_attention(&self.dims, layer, &q, m, &keys, len, Mask::Full);
                ctx = merge_attention_states(&ctx, &part, m, &self.dims);
            }
            let new = if self.cfg.faults.has(Fault::F1) {
                transposed_lse(new, m, self.dims.heads)
            } else {
                new
            };
            let merged = merge_attention_states(&ctx, &new, m, &self.dims);
            let width = self.dims.heads * self.dims.v;
            for (k, t) in toks.enumerate() {
                io.attn[t] = merged.out[k * width..(k + 1) * width].to_vec();
            }
        }
    }
}
