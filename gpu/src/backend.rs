//! The CUDA `Backend`: executes core-built plans on the device with the same weights and
//! the same paged latent cache layout as the CPU backend. Decode rows take the absorbed
//! split-KV kernel; prefill rows take the materialized path (causal new tokens, context
//! chunks gathered from the cache, LSE merge). Every kernel reduces each token on its
//! own in a fixed order, so the backend is batch-invariant by construction: a request's
//! bits do not depend on the rest of the batch, its row, padding rows, or graph vs eager.
//! Uniform decode steps on a captured size replay a CUDA graph of the whole forward.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use specmla_core::backend::{Backend, DrafterOutput, TargetOutput};
use specmla_core::block_pool::{NO_BLOCK, PAD_SLOT};
use specmla_core::config::{EngineConfig, ModelDims};
use specmla_core::cudagraph::GraphShape;
use specmla_core::drafter::{DFlashPass, DrafterPass, HiddenSource};
use specmla_core::fault::Fault;
use specmla_core::plan::StepPlan;
use specmla_model::{DrafterModel, TargetModel, RMS_EPS};

use crate::device::{GpuDevice, GpuError};
use crate::launch::{copy, Buf, DPtr};
use crate::ops::{DecodeBufs, DecodeShape, Kernels, KeyBufs, MlaDims, State};
use crate::weights::{DrafterWeights, LayerWeights, TargetWeights};
use crate::workspace::{PrefillScratch, Workspace};

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum GpuBackendError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("step replays a graph of {0} tokens that was never captured")]
    GraphNotCaptured(usize),
    #[error("plan rejected by the GPU backend: {0}")]
    BadPlan(String),
}

impl GpuBackendError {
    /// Whether the error is the environment's (no GPU, no driver, compile failure, out of
    /// memory): bad input or environment exits 2, an engine failure exits 1.
    pub fn is_environment(&self) -> bool {
        matches!(self, GpuBackendError::Gpu(_))
    }
}

type Result<T> = std::result::Result<T, GpuBackendError>;

/// The attention of one layer: `(backend, layer, weights, attention output)`.
type AttendFn<'a> = dyn Fn(&GpuBackend, usize, &LayerWeights, DPtr<f32>) -> Result<()> + 'a;

/// One captured uniform-decode graph and the workspace its kernels address.
struct CapturedGraph {
    shape: GraphShape,
    ws: Workspace,
    graph: CudaGraph,
}

/// How the decode rows of one launch are laid out.
#[derive(Clone, Copy, Debug)]
struct DecodeLaunch {
    /// First token of the launch in the step's token order.
    token_start: usize,
    rows: usize,
    q_len: usize,
    split_size: usize,
    block_table: DPtr<i32>,
    width: usize,
    seq_lens: DPtr<i32>,
    num_splits: DPtr<i32>,
}

/// The CUDA backend.
pub struct GpuBackend {
    dev: Arc<GpuDevice>,
    k: Kernels,
    cfg: EngineConfig,
    dims: ModelDims,
    md: MlaDims,
    target: TargetWeights,
    drafter: DrafterWeights,
    drafter_host: Arc<DrafterModel>,
    /// `[layers, slots, latent]`, NaN-poisoned.
    target_cache: Buf<f32>,
    /// `[slots, latent]`, NaN-poisoned.
    drafter_cache: Buf<f32>,
    num_slots: usize,
    eager: Option<Workspace>,
    scratch: Option<PrefillScratch>,
    graphs: Vec<CapturedGraph>,
}

impl GpuBackend {
    /// Opens device 0, compiles the kernels, uploads the weights and allocates caches.
    pub fn new(
        cfg: &EngineConfig,
        target: Arc<TargetModel>,
        drafter: Arc<DrafterModel>,
    ) -> Result<Self> {
        let dev = Arc::new(GpuDevice::open(0)?);
        Self::on_device(dev, cfg, target, drafter)
    }

    /// [`Self::new`] on an already open device.
    pub fn on_device(
        dev: Arc<GpuDevice>,
        cfg: &EngineConfig,
        target: Arc<TargetModel>,
        drafter: Arc<DrafterModel>,
    ) -> Result<Self> {
        let k = Kernels::load(&dev)?;
        let d = cfg.model.clone();
        let num_slots = cfg.scheduler.num_gpu_blocks * cfg.scheduler.page_size;
        let latent = d.latent_dim();
        let target_cache = Buf::uninit(&dev, d.num_layers * num_slots * latent, "target KV cache")?;
        let drafter_cache = Buf::uninit(&dev, num_slots * latent, "drafter KV cache")?;
        // Unwritten slots read as NaN, as on the CPU, so a stale read cannot pass.
        k.fill(&dev, target_cache.ptr(), f32::NAN, target_cache.len())?;
        k.fill(&dev, drafter_cache.ptr(), f32::NAN, drafter_cache.len())?;
        Ok(Self {
            target: TargetWeights::upload(&dev, &target)?,
            drafter: DrafterWeights::upload(&dev, &drafter)?,
            drafter_host: drafter,
            md: MlaDims::from(&d),
            dims: d,
            cfg: cfg.clone(),
            target_cache,
            drafter_cache,
            num_slots,
            eager: None,
            scratch: None,
            graphs: Vec::new(),
            k,
            dev,
        })
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    fn dev(&self) -> &GpuDevice {
        &self.dev
    }

    fn layer_cache(&self, l: usize) -> DPtr<f32> {
        let per = self.num_slots * self.dims.latent_dim();
        self.target_cache.ptr().range(l * per, per)
    }

    fn attn_width(&self) -> usize {
        self.dims.num_heads * self.dims.v_head_dim
    }
}

// Host-side validation: kernels index with these values, so they are checked before
// they reach the device instead of faulting there.
impl GpuBackend {
    fn check_tokens(&self, ids: &[u32]) -> Result<Vec<i32>> {
        ids.iter()
            .map(|&t| {
                if (t as usize) < self.dims.vocab_size {
                    Ok(t as i32)
                } else {
                    Err(GpuBackendError::BadPlan(format!(
                        "token {t} outside the vocabulary"
                    )))
                }
            })
            .collect()
    }

    fn check_slots(&self, slots: &[i64]) -> Result<()> {
        match slots
            .iter()
            .find(|&&s| s != PAD_SLOT && (s < 0 || s as usize >= self.num_slots))
        {
            Some(s) => Err(GpuBackendError::BadPlan(format!(
                "slot {s} outside the cache of {} slots",
                self.num_slots
            ))),
            None => Ok(()),
        }
    }

    /// Block ids as the kernels take them: NO_BLOCK becomes -1 (reads as NaN).
    fn block_ids(&self, table: &[u32]) -> Result<Vec<i32>> {
        let blocks = self.cfg.scheduler.num_gpu_blocks;
        table
            .iter()
            .map(|&b| match b {
                NO_BLOCK => Ok(-1),
                b if (b as usize) < blocks => Ok(b as i32),
                b => Err(GpuBackendError::BadPlan(format!(
                    "block {b} outside the pool of {blocks}"
                ))),
            })
            .collect()
    }
}

/// Positions as i32 (bounded by max_model_len, which config validation caps).
fn positions_i32(p: &[u32]) -> Vec<i32> {
    p.iter().map(|&x| x as i32).collect()
}

// The dense layer body shared by the target and the drafter.
impl GpuBackend {
    /// `h = norm(x)`, `q = rope(h W_q)`, `latent = [norm(c_kv) | rope(k_rope)]`.
    fn qkv(&self, w: &LayerWeights, ws: &Workspace, n: usize, with_q: bool) -> Result<()> {
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
            k.matmul(
                dev,
                ws.h.ptr(),
                hid,
                w.w_q.ptr(),
                None,
                ws.q.ptr(),
                (n, hid, heads * qk),
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
        Ok(())
    }

    /// `x += attn W_o`, then `x += W_down(silu(norm(x) W_gate) * norm(x) W_up)`.
    fn finish(
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
    fn lm_head(&self, ws: &Workspace, norm: &Buf<f32>, head: &Buf<f32>, n: usize) -> Result<()> {
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

    /// Absorbed decode of one uniform launch; writes the attention output of tokens
    /// below `n_real` into `attn` (the rest belong to padding and are dropped).
    fn decode(
        &self,
        w: &LayerWeights,
        ws: &Workspace,
        cache: DPtr<f32>,
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
        let shape = DecodeShape {
            num_rows: dl.rows,
            q_len: dl.q_len,
            heads: md.heads,
            dim: md.latent(),
            dv: md.kv_lora,
            page: self.cfg.scheduler.page_size,
            width: dl.width,
            split_size: dl.split_size,
        };
        let bufs = DecodeBufs {
            q: q_lat,
            cache,
            block_table: dl.block_table,
            seq_lens: dl.seq_lens,
            num_splits: dl.num_splits,
            out: o_lat,
            lse: ws.lse.ptr(),
        };
        k.decode(dev, shape, bufs, md.scale())?;
        let keep = tokens.min(n_real.saturating_sub(s));
        k.apply_uv(
            dev,
            md,
            o_lat,
            w.w_uv.ptr(),
            attn.offset(s * md.heads * md.dv),
            keep,
        )?;
        Ok(())
    }
}

// The target forward.
impl GpuBackend {
    /// Embedding, every layer (attention by `attend`), and the residual into `ws.x`.
    fn target_layers(&self, ws: &Workspace, n: usize, attend: &AttendFn<'_>) -> Result<()> {
        let (dev, k) = (self.dev(), &self.k);
        let hid = self.dims.hidden_size;
        k.embed(
            dev,
            self.target.embed_tokens.ptr(),
            ws.ids.ptr(),
            ws.x.ptr(),
            n,
            hid,
        )?;
        let hv = self.attn_width();
        for (l, w) in self.target.layers.iter().enumerate() {
            self.qkv(w, ws, n, true)?;
            k.kv_write(
                dev,
                ws.latent.ptr(),
                ws.slots.ptr(),
                self.layer_cache(l),
                n,
                self.dims.latent_dim(),
            )?;
            let attn = ws.attn.ptr().range(l * ws.cap * hv, ws.cap * hv);
            k.fill(dev, attn, 0.0, n * hv)?;
            attend(self, l, w, attn)?;
            self.finish(w, ws, ws.x.ptr(), attn, n)?;
        }
        Ok(())
    }

    /// Uploads the step's token inputs into `ws` (padded to `n_pad` with PAD slots).
    fn write_token_inputs(&self, ws: &mut Workspace, plan: &StepPlan, n_pad: usize) -> Result<()> {
        let n = plan.num_tokens();
        let c = &plan.common;
        let mut ids = self.check_tokens(&plan.token_ids[..n])?;
        ids.resize(n_pad, 0);
        let mut pos = positions_i32(&c.positions[..c.positions.len().min(n_pad)]);
        pos.resize(n_pad, 0);
        let mut slots = c.slot_mapping[..c.slot_mapping.len().min(n_pad)].to_vec();
        self.check_slots(&slots)?;
        slots.resize(n_pad, PAD_SLOT);
        let dev = Arc::clone(&self.dev);
        ws.ids.write(&dev, &ids)?;
        ws.positions.write(&dev, &pos)?;
        ws.slots.write(&dev, &slots)?;
        Ok(())
    }

    /// Reads hidden states and attention outputs of the `n` real tokens and the logits
    /// of `rows` (indices into `ws.logits`).
    fn read_target(&self, ws: &Workspace, n: usize, rows: &[usize]) -> Result<TargetOutput> {
        let dev = self.dev();
        let (hid, vocab, hv) = (
            self.dims.hidden_size,
            self.dims.vocab_size,
            self.attn_width(),
        );
        let hidden = ws.x.read(dev, n * hid)?;
        let all_logits = ws
            .logits
            .read(dev, rows.iter().map(|r| r + 1).max().unwrap_or(0) * vocab)?;
        let logits = rows
            .iter()
            .flat_map(|&r| all_logits[r * vocab..(r + 1) * vocab].iter().copied())
            .collect();
        let attn_outputs = (0..self.dims.num_layers)
            .map(|l| ws.attn.read_at(dev, l * ws.cap * hv, n * hv))
            .collect::<std::result::Result<_, _>>()?;
        Ok(TargetOutput {
            logits,
            hidden,
            attn_outputs,
            vocab_size: vocab,
            hidden_size: hid,
        })
    }

    fn ensure_eager(&mut self, cap: usize, rows: usize, width: usize) -> Result<()> {
        if !self
            .eager
            .as_ref()
            .is_some_and(|w| w.fits(cap, rows, width))
        {
            let old = self.eager.take();
            let (c0, r0) = old.map_or((0, 0), |w| (w.cap, w.rows_cap));
            let dims = (cap.max(c0).max(16), rows.max(r0).max(4), width);
            self.eager = Some(Workspace::new(
                &self.dev,
                &self.dims,
                self.dims.num_layers,
                dims,
            )?);
        }
        Ok(())
    }

    fn ensure_scratch(&mut self, cap: usize) -> Result<()> {
        let fits = matches!(&self.scratch, Some(s) if s.cap >= cap);
        if !fits {
            let old = self.scratch.take().map_or(0, |s| s.cap);
            self.scratch = Some(PrefillScratch::new(
                &self.dev,
                &self.dims,
                cap.max(old).max(64),
            )?);
        }
        Ok(())
    }

    fn forward_eager(&mut self, plan: &StepPlan) -> Result<TargetOutput> {
        let n = plan.num_tokens();
        let c = &plan.common;
        let width = c.block_table_width;
        // A uniform launch may address past the real tokens (F10); give it room.
        let decode_end = plan
            .mla
            .decode
            .as_ref()
            .map_or(0, |d| match d.uniform_query_len {
                Some(q) => d.tokens.start + d.rows.len() * q,
                None => 0,
            });
        self.ensure_eager(n.max(decode_end).max(1), c.num_rows().max(1), width)?;
        let scratch_need = prefill_scratch_tokens(plan);
        self.ensure_scratch(scratch_need)?;
        let mut ws = self.eager.take().expect("ensured above");
        let res = self.eager_body(&mut ws, plan);
        self.eager = Some(ws);
        res
    }

    fn eager_body(&self, ws: &mut Workspace, plan: &StepPlan) -> Result<TargetOutput> {
        let n = plan.num_tokens();
        let c = &plan.common;
        self.write_token_inputs(ws, plan, n)?;
        let dev = Arc::clone(&self.dev);
        ws.block_table
            .write(&dev, &self.block_ids(&c.block_table)?)?;
        let seq: Vec<i32> = c.seq_lens.iter().map(|&s| s as i32).collect();
        ws.seq_lens.write(&dev, &seq)?;
        if let Some(d) = &plan.mla.decode {
            let splits: Vec<i32> = (0..d.rows.len())
                .map(|i| d.num_splits.get(i).copied().unwrap_or(1) as i32)
                .collect();
            ws.num_splits.write(&dev, &splits)?;
        }
        let idx: Vec<i32> = plan.logits_indices.iter().map(|&i| i as i32).collect();
        if idx.iter().any(|&i| i as usize >= n.max(1)) {
            return Err(GpuBackendError::BadPlan(
                "logits index past the tokens".into(),
            ));
        }
        ws.logits_idx.write(&dev, &idx)?;
        let ws_ref: &Workspace = ws;
        self.target_layers(ws_ref, n, &|me, l, w, attn| {
            me.eager_decode(ws_ref, plan, l, w, attn)?;
            me.prefill_rows(ws_ref, plan, l, w, attn)
        })?;
        let k = &self.k;
        let hid = self.dims.hidden_size;
        k.gather_rows(
            &dev,
            ws.x.ptr(),
            ws.logits_idx.ptr(),
            ws.xs.ptr(),
            idx.len(),
            hid,
        )?;
        self.lm_head(ws, &self.target.final_norm, &self.target.lm_head, idx.len())?;
        let rows: Vec<usize> = (0..idx.len()).collect();
        self.read_target(ws, n, &rows)
    }

    /// Decode rows of an eager step: one uniform launch, or one launch per row when the
    /// plan's decode rows are not uniform (the kernel then reads query_start_loc).
    fn eager_decode(
        &self,
        ws: &Workspace,
        plan: &StepPlan,
        l: usize,
        w: &LayerWeights,
        attn: DPtr<f32>,
    ) -> Result<()> {
        let Some(d) = &plan.mla.decode else {
            return Ok(());
        };
        let c = &plan.common;
        let width = c.block_table_width;
        let base = DecodeLaunch {
            token_start: d.tokens.start,
            rows: d.rows.len(),
            q_len: 1,
            split_size: d.split_size_tokens,
            block_table: ws.block_table.ptr().offset(d.rows.start * width),
            width,
            seq_lens: ws.seq_lens.ptr().offset(d.rows.start),
            num_splits: ws.num_splits.ptr(),
        };
        let n = plan.num_tokens();
        if let Some(q) = d.uniform_query_len {
            return self.decode(
                w,
                ws,
                self.layer_cache(l),
                DecodeLaunch { q_len: q, ..base },
                n,
                attn,
            );
        }
        for (i, r) in d.rows.clone().enumerate() {
            let one = DecodeLaunch {
                token_start: c.query_start_loc[r] as usize,
                rows: 1,
                q_len: c.query_len(r),
                block_table: ws.block_table.ptr().offset(r * width),
                seq_lens: ws.seq_lens.ptr().offset(r),
                num_splits: ws.num_splits.ptr().offset(i),
                ..base
            };
            if one.q_len > 0 {
                self.decode(w, ws, self.layer_cache(l), one, n, attn)?;
            }
        }
        Ok(())
    }

    /// The prefill path of layer `l`: per row, causal attention over its new tokens,
    /// then each context chunk gathered from the cache and merged by LSE into the
    /// row's slice of `attn`, and finally the new tokens merged in.
    fn prefill_rows(
        &self,
        ws: &Workspace,
        plan: &StepPlan,
        l: usize,
        w: &LayerWeights,
        attn: DPtr<f32>,
    ) -> Result<()> {
        let Some(p) = &plan.mla.prefill else {
            return Ok(());
        };
        let (dev, k, md) = (self.dev(), &self.k, self.md);
        let sc = self.scratch.as_ref().expect("ensured before the forward");
        let c = &plan.common;
        let width = c.block_table_width;
        let f1 = self.cfg.faults.has(Fault::F1);
        for (j, r) in p.rows.clone().enumerate() {
            let toks = c.row_tokens(r);
            let m = toks.len();
            if m == 0 {
                continue;
            }
            let q = ws.q.ptr().offset(toks.start * md.heads * md.qk());
            let new_lat = ws.latent.ptr().offset(toks.start * md.latent());
            let new = State {
                out: sc.new_out.ptr(),
                lse: sc.new_lse.ptr(),
            };
            k.expand(
                dev,
                md,
                new_lat,
                w.w_uk.ptr(),
                w.w_uv.ptr(),
                sc.k_nope.ptr(),
                sc.v.ptr(),
                m,
            )?;
            let keys = KeyBufs {
                k_nope: sc.k_nope.ptr(),
                latent: new_lat,
                v: sc.v.ptr(),
                n: m,
            };
            k.attend(dev, md, q, m, keys, true, new)?;
            let acc = State {
                out: attn.range(toks.start * md.heads * md.dv, m * md.heads * md.dv),
                lse: sc.ctx_lse.ptr(),
            };
            k.fill(dev, acc.out, 0.0, m * md.heads * md.dv)?;
            k.fill(dev, acc.lse, f32::NEG_INFINITY, m * md.heads)?;
            let row_table = ws.block_table.ptr().range(r * width, width);
            for chunk in p.chunked_context.iter().flat_map(|cc| &cc.chunks) {
                let (start, len) = (chunk.starts[j], chunk.lens[j]);
                if len == 0 {
                    continue;
                }
                let page = self.cfg.scheduler.page_size;
                k.gather_context(
                    dev,
                    self.layer_cache(l),
                    row_table,
                    sc.keys.ptr(),
                    start,
                    len,
                    page,
                    md.latent(),
                )?;
                k.expand(
                    dev,
                    md,
                    sc.keys.ptr(),
                    w.w_uk.ptr(),
                    w.w_uv.ptr(),
                    sc.k_nope.ptr(),
                    sc.v.ptr(),
                    len,
                )?;
                let keys = KeyBufs {
                    k_nope: sc.k_nope.ptr(),
                    latent: sc.keys.ptr(),
                    v: sc.v.ptr(),
                    n: len,
                };
                let part = State {
                    out: sc.part_out.ptr(),
                    lse: sc.part_lse.ptr(),
                };
                k.attend(dev, md, q, m, keys, false, part)?;
                k.merge(dev, md, acc, part, m, false)?;
            }
            k.merge(dev, md, acc, new, m, f1)?;
        }
        Ok(())
    }
}

/// Largest number of keys or queries one prefill attention call of `plan` handles.
fn prefill_scratch_tokens(plan: &StepPlan) -> usize {
    let Some(p) = &plan.mla.prefill else { return 0 };
    let c = &plan.common;
    let rows = p.rows.clone().map(|r| c.query_len(r)).max().unwrap_or(0);
    let chunks = p
        .chunked_context
        .iter()
        .flat_map(|cc| &cc.chunks)
        .flat_map(|ch| ch.lens.iter().copied())
        .max()
        .unwrap_or(0);
    rows.max(chunks)
}

// CUDA graphs of uniform decode steps.
impl GpuBackend {
    fn graph_launch(&self, ws: &Workspace, shape: GraphShape) -> DecodeLaunch {
        DecodeLaunch {
            token_start: 0,
            rows: shape.num_rows,
            q_len: shape.query_len,
            split_size: self.cfg.decode_split_tokens,
            block_table: ws.block_table.ptr(),
            width: ws.width,
            seq_lens: ws.seq_lens.ptr(),
            num_splits: ws.num_splits.ptr(),
        }
    }

    /// The kernels one graph replays: the whole target forward of `shape.num_tokens`
    /// tokens, logits for every token (padding included).
    fn graph_body(&self, ws: &Workspace, shape: GraphShape) -> Result<()> {
        let n = shape.num_tokens;
        let dl = self.graph_launch(ws, shape);
        self.target_layers(ws, n, &|me, l, w, attn| {
            me.decode(w, ws, me.layer_cache(l), dl, n, attn)
        })?;
        copy(
            self.dev(),
            ws.x.ptr(),
            ws.xs.ptr(),
            n * self.dims.hidden_size,
        )?;
        self.lm_head(ws, &self.target.final_norm, &self.target.lm_head, n)
    }

    fn capture(&self, shape: GraphShape) -> Result<CapturedGraph> {
        let width = self.cfg.scheduler.max_blocks_per_seq();
        let ws = Workspace::new(
            &self.dev,
            &self.dims,
            self.dims.num_layers,
            (shape.num_tokens, shape.num_rows, width),
        )?;
        let stream = &self.dev.stream;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(GpuError::driver("beginning a graph capture"))?;
        let body = self.graph_body(&ws, shape);
        // End the capture whatever happened, so the stream is usable again.
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        body?;
        let graph = graph
            .map_err(GpuError::driver("instantiating a captured graph"))?
            .ok_or_else(|| {
                GpuBackendError::BadPlan(format!("capture of {shape:?} recorded nothing"))
            })?;
        Ok(CapturedGraph { shape, ws, graph })
    }

    fn replay(&mut self, plan: &StepPlan, idx: usize) -> Result<TargetOutput> {
        let mut g = self.graphs.swap_remove(idx);
        let res = self.replay_body(&mut g, plan);
        self.graphs.push(g);
        res
    }

    fn replay_body(&self, g: &mut CapturedGraph, plan: &StepPlan) -> Result<TargetOutput> {
        let s = g.shape;
        let c = &plan.common;
        let d = plan.mla.decode.as_ref();
        if d.is_some_and(|d| d.split_size_tokens != self.cfg.decode_split_tokens) {
            return Err(GpuBackendError::BadPlan(
                "split size differs from the captured one".into(),
            ));
        }
        self.write_token_inputs(&mut g.ws, plan, s.num_tokens)?;
        // Rows past the plan's are padding: seq_len 0 and no blocks, so they see no key.
        let width = g.ws.width;
        let mut table = vec![-1i32; s.num_rows * width];
        let mut seq = vec![0i32; s.num_rows];
        let mut splits = vec![1i32; s.num_rows];
        for r in 0..s.num_rows.min(c.num_rows()) {
            let row = self.block_ids(c.block_row(r))?;
            table[r * width..r * width + row.len().min(width)]
                .copy_from_slice(&row[..row.len().min(width)]);
            seq[r] = c.seq_lens[r] as i32;
            if let Some(n) = d.and_then(|d| d.num_splits.get(r)) {
                splits[r] = *n as i32;
            }
        }
        let dev = Arc::clone(&self.dev);
        g.ws.block_table.write(&dev, &table)?;
        g.ws.seq_lens.write(&dev, &seq)?;
        g.ws.num_splits.write(&dev, &splits)?;
        g.graph
            .launch()
            .map_err(GpuError::driver("launching a captured graph"))?;
        let rows: Vec<usize> = plan.logits_indices.iter().map(|&i| i as usize).collect();
        self.read_target(&g.ws, plan.num_tokens(), &rows)
    }
}

impl Backend for GpuBackend {
    type Error = GpuBackendError;

    fn capture_graphs(&mut self, shapes: &[GraphShape]) -> Result<()> {
        // F2: capture builds decode-only metadata with max_query_len 1, so the frozen
        // graph runs one token per row whatever q the step has.
        let q1 = self.cfg.faults.has(Fault::F2);
        self.graphs.clear();
        for &s in shapes {
            let s = if q1 {
                GraphShape {
                    num_rows: s.num_tokens,
                    query_len: 1,
                    max_query_len: 1,
                    ..s
                }
            } else {
                s
            };
            let g = self.capture(s)?;
            self.graphs.push(g);
        }
        Ok(())
    }

    fn forward_target(&mut self, plan: &StepPlan) -> Result<TargetOutput> {
        match &plan.cudagraph {
            Some(gd) => {
                let n = gd.shape.num_tokens;
                let idx = self
                    .graphs
                    .iter()
                    .position(|g| g.shape.num_tokens == n)
                    .ok_or(GpuBackendError::GraphNotCaptured(n))?;
                self.replay(plan, idx)
            }
            None => self.forward_eager(plan),
        }
    }

    fn forward_drafter(
        &mut self,
        pass: &DrafterPass,
        target: &TargetOutput,
        prev: Option<&DrafterOutput>,
    ) -> Result<DrafterOutput> {
        let n = pass.token_ids.len();
        let hid = self.dims.hidden_size;
        let mut hidden_in = Vec::with_capacity(n * hid);
        for src in &pass.hidden {
            let row = match *src {
                HiddenSource::TargetToken(i) => target.hidden_row(i as usize),
                HiddenSource::DrafterRow(r) => prev
                    .ok_or_else(|| {
                        GpuBackendError::BadPlan("a later pass without a previous one".into())
                    })?
                    .hidden_row(r as usize),
            };
            hidden_in.extend_from_slice(row);
        }
        let rows = pass.num_rows();
        self.ensure_eager(n.max(1), rows.max(1), pass.block_table_width)?;
        let mut ws = self.eager.take().expect("ensured above");
        let res = self.drafter_body(&mut ws, pass, &hidden_in);
        self.eager = Some(ws);
        res
    }

    fn forward_dflash(
        &mut self,
        pass: &DFlashPass,
        target: &TargetOutput,
    ) -> Result<DrafterOutput> {
        let (e, b) = (pass.context_token_indices.len(), pass.block_len);
        let nb = pass.block_tokens.len();
        let rows = pass.req_ids.len();
        let max_keys = pass
            .context_lens
            .iter()
            .map(|&c| c as usize + b)
            .max()
            .unwrap_or(0);
        self.ensure_eager(
            e.max(nb).max(1),
            rows.max(b).max(1),
            pass.block_table_width.max(1),
        )?;
        self.ensure_scratch(max_keys)?;
        let mut ws = self.eager.take().expect("ensured above");
        let res = self.dflash_body(&mut ws, pass, target);
        self.eager = Some(ws);
        res
    }
}

// The drafter passes.
impl GpuBackend {
    fn drafter_body(
        &self,
        ws: &mut Workspace,
        pass: &DrafterPass,
        hidden_in: &[f32],
    ) -> Result<DrafterOutput> {
        let dev = Arc::clone(&self.dev);
        let (k, d) = (&self.k, &self.dims);
        let (n, hid) = (pass.token_ids.len(), d.hidden_size);
        let w = &self.drafter.layer;
        ws.ids.write(&dev, &self.check_tokens(&pass.token_ids)?)?;
        ws.positions.write(&dev, &positions_i32(&pass.positions))?;
        self.check_slots(&pass.slot_mapping)?;
        ws.slots.write(&dev, &pass.slot_mapping)?;
        // x = concat(embed(token), hidden_in) @ fc, built in xs/h/x.
        k.embed(
            &dev,
            self.drafter.embed_tokens.ptr(),
            ws.ids.ptr(),
            ws.h.ptr(),
            n,
            hid,
        )?;
        ws.xs.write(&dev, hidden_in)?;
        let cat = ws.tmp.ptr();
        k.concat_rows(&dev, ws.h.ptr(), ws.xs.ptr(), cat, n, hid, hid)?;
        k.matmul(
            &dev,
            cat,
            2 * hid,
            self.drafter.fc.ptr(),
            None,
            ws.x.ptr(),
            (n, 2 * hid, hid),
        )?;
        self.qkv(w, ws, n, true)?;
        k.kv_write(
            &dev,
            ws.latent.ptr(),
            ws.slots.ptr(),
            self.drafter_cache.ptr(),
            n,
            d.latent_dim(),
        )?;
        // Sampled tokens only: each sees keys below its own position + 1, capped by
        // seq_len and max_model_len, with one split covering them all.
        let rows = pass.num_rows();
        let mut sample = Vec::with_capacity(rows);
        let mut visible = Vec::with_capacity(rows);
        for r in 0..rows {
            let t = pass.token_indices_to_sample[r] as usize;
            let q_start = pass.query_start_loc[r] as usize;
            let q_len = pass.query_start_loc[r + 1] as usize - q_start;
            let v = (pass.seq_lens[r] as usize + t + 1 - q_start)
                .saturating_sub(q_len)
                .min(self.cfg.scheduler.max_model_len);
            sample.push(t as i32);
            visible.push(v as i32);
        }
        self.sampled_attention(
            ws,
            w,
            &sample,
            &visible,
            &pass.block_table,
            pass.block_table_width,
        )
    }

    /// Attention, finish and logits of the sampled drafter tokens `sample` (indices into
    /// this pass's tokens, whose q and x sit in `ws`).
    fn sampled_attention(
        &self,
        ws: &mut Workspace,
        w: &LayerWeights,
        sample: &[i32],
        visible: &[i32],
        table: &[u32],
        width: usize,
    ) -> Result<DrafterOutput> {
        let dev = Arc::clone(&self.dev);
        let (k, d, md) = (&self.k, &self.dims, self.md);
        let (rows, hid) = (sample.len(), d.hidden_size);
        let qw = md.heads * md.qk();
        // Compact the sampled rows of q and x to the front.
        ws.logits_idx.write(&dev, sample)?;
        let hv = self.attn_width();
        let attn = ws.attn.ptr().range(0, rows * hv);
        let xs = ws.xs.ptr();
        k.gather_rows(&dev, ws.x.ptr(), ws.logits_idx.ptr(), xs, rows, hid)?;
        k.gather_rows(
            &dev,
            ws.q.ptr(),
            ws.logits_idx.ptr(),
            ws.tmp.ptr(),
            rows,
            qw,
        )?;
        copy(&dev, ws.tmp.ptr(), ws.q.ptr(), rows * qw)?;
        ws.block_table.write(&dev, &self.block_ids(table)?)?;
        ws.seq_lens.write(&dev, visible)?;
        ws.num_splits.write(&dev, &vec![1; rows])?;
        let dl = DecodeLaunch {
            token_start: 0,
            rows,
            q_len: 1,
            split_size: self.cfg.scheduler.max_model_len.max(1),
            block_table: ws.block_table.ptr(),
            width,
            seq_lens: ws.seq_lens.ptr(),
            num_splits: ws.num_splits.ptr(),
        };
        k.fill(&dev, attn, 0.0, rows * hv)?;
        self.decode(w, ws, self.drafter_cache.ptr(), dl, rows, attn)?;
        // The residual of the sampled rows now lives in xs; finish it there.
        self.finish(w, ws, xs, attn, rows)?;
        copy(&dev, xs, ws.x.ptr(), rows * hid)?;
        self.lm_head(ws, &self.drafter.final_norm, &self.drafter.lm_head, rows)?;
        Ok(DrafterOutput {
            logits: ws.logits.read(&dev, rows * d.vocab_size)?,
            hidden: ws.x.read(&dev, rows * hid)?,
            vocab_size: d.vocab_size,
            hidden_size: hid,
        })
    }

    fn dflash_body(
        &self,
        ws: &mut Workspace,
        pass: &DFlashPass,
        target: &TargetOutput,
    ) -> Result<DrafterOutput> {
        let dev = Arc::clone(&self.dev);
        let (k, d) = (&self.k, &self.dims);
        let hid = d.hidden_size;
        let w = &self.drafter.layer;
        // Context: target hidden states projected by fc_ctx, written to the drafter cache.
        let e = pass.context_token_indices.len();
        let mut ctx_hidden = Vec::with_capacity(e * hid);
        for &i in &pass.context_token_indices {
            ctx_hidden.extend_from_slice(target.hidden_row(i as usize));
        }
        ws.xs.write(&dev, &ctx_hidden)?;
        k.matmul(
            &dev,
            ws.xs.ptr(),
            hid,
            self.drafter.fc_ctx.ptr(),
            None,
            ws.x.ptr(),
            (e, hid, hid),
        )?;
        ws.positions
            .write(&dev, &positions_i32(&pass.context_positions))?;
        self.check_slots(&pass.context_slots)?;
        ws.slots.write(&dev, &pass.context_slots)?;
        self.qkv(w, ws, e, false)?;
        k.kv_write(
            &dev,
            ws.latent.ptr(),
            ws.slots.ptr(),
            self.drafter_cache.ptr(),
            e,
            d.latent_dim(),
        )?;
        // The query block: token or mask embeddings, every position's latent cached.
        let nb = pass.block_tokens.len();
        let block_x: Vec<f32> = pass
            .block_tokens
            .iter()
            .flat_map(|t| self.drafter_host.block_x(*t))
            .collect();
        ws.x.write(&dev, &block_x)?;
        ws.positions
            .write(&dev, &positions_i32(&pass.block_positions))?;
        self.check_slots(&pass.block_slots)?;
        ws.slots.write(&dev, &pass.block_slots)?;
        self.qkv(w, ws, nb, true)?;
        k.kv_write(
            &dev,
            ws.latent.ptr(),
            ws.slots.ptr(),
            self.drafter_cache.ptr(),
            nb,
            d.latent_dim(),
        )?;
        let hv = self.attn_width();
        let attn = ws.attn.ptr().range(0, nb * hv);
        k.fill(&dev, attn, 0.0, nb * hv)?;
        self.dflash_attention(ws, pass, attn)?;
        // Finish every block position, then keep offsets 1..=K of each row.
        self.finish(w, ws, ws.x.ptr(), attn, nb)?;
        let b = pass.block_len;
        let keep: Vec<i32> = (0..pass.req_ids.len())
            .flat_map(|r| (1..b).map(move |j| (r * b + j) as i32))
            .collect();
        ws.logits_idx.write(&dev, &keep)?;
        k.gather_rows(
            &dev,
            ws.x.ptr(),
            ws.logits_idx.ptr(),
            ws.xs.ptr(),
            keep.len(),
            hid,
        )?;
        copy(&dev, ws.xs.ptr(), ws.h.ptr(), keep.len() * hid)?;
        self.lm_head(
            ws,
            &self.drafter.final_norm,
            &self.drafter.lm_head,
            keep.len(),
        )?;
        Ok(DrafterOutput {
            logits: ws.logits.read(&dev, keep.len() * d.vocab_size)?,
            hidden: ws.h.read(&dev, keep.len() * hid)?,
            vocab_size: d.vocab_size,
            hidden_size: hid,
        })
    }

    /// Non-causal block attention: positions 1..=K of each row see the row's context
    /// (from the drafter cache) and the whole block (this pass's latents).
    fn dflash_attention(&self, ws: &Workspace, pass: &DFlashPass, attn: DPtr<f32>) -> Result<()> {
        let (dev, k, md) = (self.dev(), &self.k, self.md);
        let sc = self.scratch.as_ref().expect("ensured before the pass");
        let b = pass.block_len;
        let page = self.cfg.scheduler.page_size;
        let width = pass.block_table_width;
        let table = self.block_ids(&pass.block_table)?;
        let table_buf = Buf::from_host(dev, &table, "dflash block table")?;
        let w = &self.drafter.layer;
        let lat = md.latent();
        for r in 0..pass.req_ids.len() {
            let ctx = pass.context_lens[r] as usize;
            let row_table = table_buf.ptr().range(r * width, width);
            k.gather_context(
                dev,
                self.drafter_cache.ptr(),
                row_table,
                sc.keys.ptr(),
                0,
                ctx,
                page,
                lat,
            )?;
            copy(
                dev,
                ws.latent.ptr().offset(r * b * lat),
                sc.keys.ptr().offset(ctx * lat),
                b * lat,
            )?;
            // The keys are contiguous, so an identity block table over them with a page
            // of one position lets the decode kernel read them in place, one query per
            // "row", all K rows seeing all ctx + K keys.
            let n_keys = ctx + b;
            let seq = Buf::from_host(dev, &vec![n_keys as i32; b - 1], "dflash seq_lens")?;
            let splits = Buf::from_host(dev, &vec![1i32; b - 1], "dflash splits")?;
            let table_rows: Vec<i32> = (0..b - 1).flat_map(|_| 0..n_keys as i32).collect();
            let ident = Buf::from_host(dev, &table_rows, "dflash identity table")?;
            let shape = DecodeShape {
                num_rows: b - 1,
                q_len: 1,
                heads: md.heads,
                dim: lat,
                dv: md.kv_lora,
                page: 1,
                width: n_keys,
                split_size: n_keys.max(1),
            };
            let first = r * b + 1;
            let q_lat = ws.q_lat.ptr().offset(first * md.heads * lat);
            let o_lat = ws.o_lat.ptr().offset(first * md.heads * md.kv_lora);
            k.absorb_q(
                dev,
                md,
                ws.q.ptr().offset(first * md.heads * md.qk()),
                w.w_uk.ptr(),
                q_lat,
                b - 1,
            )?;
            let bufs = DecodeBufs {
                q: q_lat,
                cache: sc.keys.ptr(),
                block_table: ident.ptr(),
                seq_lens: seq.ptr(),
                num_splits: splits.ptr(),
                out: o_lat,
                lse: ws.lse.ptr(),
            };
            k.decode(dev, shape, bufs, md.scale())?;
            k.apply_uv(
                dev,
                md,
                o_lat,
                w.w_uv.ptr(),
                attn.offset(first * md.heads * md.dv),
                b - 1,
            )?;
        }
        Ok(())
    }
}
