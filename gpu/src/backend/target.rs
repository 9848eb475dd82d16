//! The target forward outside graphs: token inputs, eager decode launches (uniform or
//! per row), and the prefill path with chunked context and the LSE merge.

use std::sync::Arc;

use specmla_core::backend::{TargetOutput, TargetTensors};
use specmla_core::block_pool::PAD_SLOT;
use specmla_core::fault::Fault;
use specmla_core::invariant_launch::largest_split_count;
use specmla_core::plan::StepPlan;

use super::{as_i32, AttendFn, CacheOf, DecodeLaunch, GpuBackend, Region, Result, SplitForm};
use crate::launch::{copy, DPtr};
use crate::ops::{ContextChunk, PagedContext, RowScratch, RowTokens, State};
use crate::weights::LayerWeights;
use crate::workspace::{PrefillScratch, Workspace};

impl GpuBackend {
    /// Embedding, every layer (attention by `attend`), and the residual into `ws.x`.
    pub(super) fn target_layers(
        &self,
        ws: &Workspace,
        n: usize,
        attend: &AttendFn<'_>,
    ) -> Result<()> {
        let (dev, k) = (self.dev(), &self.k);
        let hid = self.dims.hidden_size;
        // SAFETY: ws.ids holds only ids that passed check_tokens (write_token_inputs).
        unsafe {
            k.embed(
                dev,
                self.target.embed_tokens.ptr(),
                ws.ids.ptr(),
                ws.x.ptr(),
                n,
                hid,
            )
        }?;
        let hv = self.attn_width();
        for (l, w) in self.target.layers.iter().enumerate() {
            self.qkv(w, ws, n, true)?;
            // SAFETY: ws.slots holds only slots that passed check_slots (write_token_inputs).
            unsafe { self.write_latents(ws, CacheOf::Target(l), n) }?;
            let attn = ws.attn.ptr().range(l * ws.cap * hv, ws.cap * hv);
            k.fill(dev, attn, 0.0, n * hv)?;
            attend(self, l, w, attn)?;
            self.finish(w, ws, ws.x.ptr(), attn, n)?;
        }
        Ok(())
    }

    /// Uploads the step's token inputs into `ws` (padded to `n_pad` with PAD slots).
    pub(super) fn write_token_inputs(
        &self,
        ws: &mut Workspace,
        plan: &StepPlan,
        n_pad: usize,
    ) -> Result<()> {
        let n = plan.num_tokens();
        let c = &plan.common;
        let mut ids = self.check_tokens(&plan.token_ids[..n])?;
        ids.resize(n_pad, 0);
        let mut pos = as_i32(&c.positions[..c.positions.len().min(n_pad)]);
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

    /// The output of a forward whose `n` real tokens sit in `ws`: the logits of `rows`
    /// (indices into `ws.logits`), the row digests of the hidden states and attention
    /// outputs (the tensors themselves only when asked for), and the hidden states
    /// copied into the target carry. The caller sets the forward id.
    pub(super) fn read_target(
        &self,
        ws: &Workspace,
        n: usize,
        rows: &[usize],
    ) -> Result<TargetOutput> {
        let dev = self.dev();
        let (hid, vocab, hv) = (
            self.dims.hidden_size,
            self.dims.vocab_size,
            self.attn_width(),
        );
        let layers = self.dims.num_layers;
        let digests = ws.digests.ptr();
        self.k
            .row_digest(dev, ws.x.ptr(), digests, (1, n, hid), n * hid)?;
        let attn_digests = digests.offset(n);
        self.k.row_digest(
            dev,
            ws.attn.ptr(),
            attn_digests,
            (layers, n, hv),
            ws.cap * hv,
        )?;
        copy(dev, ws.x.ptr(), self.carry.target_ptr(), n * hid)?;
        let all = ws.digests.read(dev, (1 + layers) * n)?;
        let all_logits = ws
            .logits
            .read(dev, rows.iter().map(|r| r + 1).max().unwrap_or(0) * vocab)?;
        // A graph step samples every token's row in order (a uniform verify batch), so
        // the rows read are the answer; otherwise pick them, in one allocation.
        let logits = match rows.iter().enumerate().all(|(i, &r)| i == r) {
            true => all_logits,
            false => {
                let mut picked = Vec::with_capacity(rows.len() * vocab);
                for &r in rows {
                    picked.extend_from_slice(&all_logits[r * vocab..(r + 1) * vocab]);
                }
                picked
            }
        };
        let tensors = match self.full_outputs {
            true => Some(TargetTensors {
                hidden: ws.x.read(dev, n * hid)?,
                attn_outputs: (0..layers)
                    .map(|l| ws.attn.read_at(dev, l * ws.cap * hv, n * hv))
                    .collect::<std::result::Result<_, _>>()?,
                hidden_size: hid,
            }),
            false => None,
        };
        Ok(TargetOutput {
            logits,
            hidden_digests: all[..n].to_vec(),
            attn_digests: (0..layers)
                .map(|l| all[(1 + l) * n..(2 + l) * n].to_vec())
                .collect(),
            tensors,
            forward_id: 0,
            vocab_size: vocab,
        })
    }

    pub(super) fn ensure_eager(&mut self, cap: usize, rows: usize, width: usize) -> Result<()> {
        if !self
            .eager
            .as_ref()
            .is_some_and(|w| w.fits(cap, rows, width))
        {
            let old = self.eager.take();
            let (c0, r0) = old.map_or((0, 0), |w| (w.cap, w.rows_cap));
            let dims = (cap.max(c0).max(16), rows.max(r0).max(4), width);
            self.eager = Some(self.new_workspace(dims)?);
        }
        Ok(())
    }

    pub(super) fn ensure_scratch(&mut self, cap: usize) -> Result<()> {
        // Of this size and of this path's kind (the portable prefill can be set later).
        let flash = self.prefill_on_flash();
        let fits = matches!(&self.scratch, Some(s) if s.cap >= cap && s.flash.is_some() == flash);
        if !fits {
            let old = self.scratch.take().map_or(0, |s| s.cap);
            self.scratch = Some(PrefillScratch::new(
                &self.dev,
                &self.dims,
                cap.max(old).max(64),
                self.prefill_on_flash(),
            )?);
        }
        Ok(())
    }

    pub(super) fn forward_eager(&mut self, plan: &StepPlan) -> Result<TargetOutput> {
        let n = plan.num_tokens();
        let c = &plan.common;
        let width = c.block_table_width;
        // A uniform launch may address past the real tokens (F10) and a single-token
        // kernel past the metadata's rows (F14); give both room.
        let decode_end = plan
            .mla
            .decode
            .as_ref()
            .map_or(0, |d| match d.uniform_query_len {
                Some(q) => d.tokens.start + d.kernel_rows * q,
                None => 0,
            });
        self.ensure_eager(n.max(decode_end).max(1), kernel_table_rows(plan), width)?;
        let scratch_need = match self.prefill_on_flash() {
            true => Self::flash_prefill_tokens(plan),
            false => prefill_scratch_tokens(plan),
        };
        self.ensure_scratch(scratch_need)?;
        if self.prefill_on_flash() {
            self.write_prefill_index(plan)?;
        }
        let mut ws = self.eager.take().expect("ensured above");
        let res = self.eager_body(&mut ws, plan);
        self.eager = Some(ws);
        res
    }

    pub(super) fn eager_body(&self, ws: &mut Workspace, plan: &StepPlan) -> Result<TargetOutput> {
        let n = plan.num_tokens();
        let c = &plan.common;
        self.write_token_inputs(ws, plan, n)?;
        let dev = Arc::clone(&self.dev);
        // Rows a kernel reads past the metadata's hold seq_len 0 and no block.
        let rows = kernel_table_rows(plan);
        let mut table = self.block_ids(&c.block_table)?;
        table.resize(rows * c.block_table_width, -1);
        ws.block_table.write(&dev, &table)?;
        let mut seq: Vec<i32> = c.seq_lens.iter().map(|&s| s as i32).collect();
        seq.resize(rows, 0);
        ws.seq_lens.write(&dev, &seq)?;
        let mut uniform_splits = SplitForm::Cap;
        if let Some(d) = &plan.mla.decode {
            let [lens, counts, mapped] = self.split_schedule(&d.split, d.kernel_rows)?;
            ws.split_lens.write(&dev, &lens)?;
            ws.num_splits.write(&dev, &counts)?;
            ws.mapped_kv.write(&dev, &mapped)?;
            if let (Some(q), Some(_)) = (d.uniform_query_len, &self.flash) {
                uniform_splits = self.eager_split_form(ws, d, q)?;
            }
        }
        let idx: Vec<i32> = plan.logits_indices.iter().map(|&i| i as i32).collect();
        self.set_gather_rows(ws, &idx, n)?;
        let ws_ref: &Workspace = ws;
        self.target_layers(ws_ref, n, &|me, l, w, attn| {
            me.eager_decode(ws_ref, plan, (l, uniform_splits), w, attn)?;
            match me.prefill_on_flash() {
                true => me.prefill_flash(ws_ref, plan, (l, w), attn),
                false => me.timed(Region::Attention, || {
                    me.prefill_rows(ws_ref, plan, l, w, attn)
                }),
            }
        })?;
        let hid = self.dims.hidden_size;
        self.gather(ws, ws.x.ptr(), ws.xs.ptr(), idx.len(), hid)?;
        self.lm_head(ws, &self.target.final_norm, &self.target.lm_head, idx.len())?;
        let rows: Vec<usize> = (0..idx.len()).collect();
        self.read_target(ws, n, &rows)
    }

    /// Decode rows of an eager step: one uniform launch (its splits run as `uniform`,
    /// [`GpuBackend::eager_split_form`]), or, when the plan's decode rows are not uniform,
    /// one launch per run of rows with equal query lengths ([`equal_runs`]), each at its
    /// rows' token start on a grid of its largest split count.
    pub(super) fn eager_decode(
        &self,
        ws: &Workspace,
        plan: &StepPlan,
        (l, uniform): (usize, SplitForm),
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
            rows: d.kernel_rows,
            q_len: 1,
            block_table: ws.block_table.ptr().offset(d.rows.start * width),
            width,
            seq_lens: ws.seq_lens.ptr().offset(d.rows.start),
            split_lens: ws.split_lens.ptr(),
            num_splits: ws.num_splits.ptr(),
            mapped_kv: ws.mapped_kv.ptr(),
            splits: uniform,
        };
        let n = plan.num_tokens();
        if let Some(q) = d.uniform_query_len {
            return self.decode(
                w,
                ws,
                CacheOf::Target(l),
                DecodeLaunch { q_len: q, ..base },
                n,
                attn,
            );
        }
        let q_lens: Vec<usize> = d.rows.clone().map(|r| c.query_len(r)).collect();
        for (i, run) in equal_runs(&q_lens) {
            let r = d.rows.start + i;
            let launch = DecodeLaunch {
                token_start: c.query_start_loc[r] as usize,
                rows: run,
                q_len: q_lens[i],
                block_table: ws.block_table.ptr().offset(r * width),
                seq_lens: ws.seq_lens.ptr().offset(r),
                split_lens: ws.split_lens.ptr().offset(i),
                num_splits: ws.num_splits.ptr().offset(i),
                mapped_kv: ws.mapped_kv.ptr().offset(i),
                splits: run_grid(&d.split.num_splits[i..i + run]),
                ..base
            };
            if launch.q_len > 0 {
                self.decode(w, ws, CacheOf::Target(l), launch, n, attn)?;
            }
        }
        Ok(())
    }

    /// The portable prefill path of layer `l` (the tensor-core one is `prefill.rs`): per
    /// row, causal attention over its new tokens,
    /// then each context chunk gathered from the cache and merged by LSE into the
    /// row's slice of `attn`, and finally the new tokens merged in.
    pub(super) fn prefill_rows(
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
        let scratch = RowScratch {
            keys: sc.keys.ptr(),
            k_nope: sc.k_nope.ptr(),
            v: sc.v.ptr(),
            new: State {
                out: sc.new_out.ptr(),
                lse: sc.new_lse.ptr(),
            },
            part: State {
                out: sc.part_out.ptr(),
                lse: sc.part_lse.ptr(),
            },
        };
        for (j, r) in p.rows.clone().enumerate() {
            let toks = c.row_tokens(r);
            let m = toks.len();
            if m == 0 {
                continue;
            }
            let row = RowTokens {
                q: ws.q.ptr().offset(toks.start * md.heads * md.qk()),
                latent: ws.latent.ptr().offset(toks.start * md.latent()),
                m,
            };
            let ctx = PagedContext {
                cache: self.layer_cache(l),
                row_table: ws.block_table.ptr().range(r * width, width),
                page: self.cfg.scheduler.page_size,
            };
            let chunks: Vec<ContextChunk> = p
                .chunked_context
                .iter()
                .flat_map(|cc| &cc.chunks)
                .map(|ch| ContextChunk {
                    start: ch.starts[j],
                    len: ch.lens[j],
                })
                .collect();
            let acc = State {
                out: attn.range(toks.start * md.heads * md.v, m * md.heads * md.v),
                lse: sc.ctx_lse.ptr(),
            };
            // SAFETY: the block table was written through block_ids, which refuses
            // blocks outside the pool.
            unsafe {
                k.chunked_prefill_row(
                    dev,
                    md,
                    (w.w_uk.ptr(), w.w_uv.ptr()),
                    row,
                    (ctx, &chunks),
                    scratch,
                    acc,
                    f1,
                )
            }?;
        }
        Ok(())
    }
}

/// The runs of equal values in `q_lens`, as (first index, length): a non-uniform decode
/// region launches once per run of rows with the same query length, since a decode
/// launch takes one `q_len` (as FlashMLA's does). A row's bits do not depend on the
/// launch it is in (the kernels are batch-invariant), so this only saves launches.
fn equal_runs(q_lens: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, q) in q_lens.iter().enumerate() {
        match runs.last_mut() {
            Some((start, len)) if q_lens[*start] == *q => *len += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
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

/// Block-table and seq_len rows an eager step's kernels read: the metadata's, and for a
/// single-token decode kernel every kernel row (F14 runs more than the metadata has).
fn kernel_table_rows(plan: &StepPlan) -> usize {
    let c = &plan.common;
    let kernel = plan
        .mla
        .decode
        .as_ref()
        .map_or(0, |d| d.rows.start + d.kernel_rows);
    c.num_rows().max(kernel).max(1)
}

/// The grid of a run of decode rows whose split counts are `counts`: its largest count.
fn run_grid(counts: &[u32]) -> SplitForm {
    SplitForm::Grid(largest_split_count(counts.iter().copied()))
}

#[cfg(test)]
mod tests {
    use super::{equal_runs, run_grid, SplitForm};

    /// A run's grid is as wide as its most split row, never narrower than one split.
    #[test]
    fn a_runs_grid_takes_its_largest_split_count() {
        assert_eq!(run_grid(&[1, 3, 2]), SplitForm::Grid(3));
        assert_eq!(run_grid(&[0]), SplitForm::Grid(1));
        assert_eq!(run_grid(&[]), SplitForm::Grid(1));
    }

    #[test]
    fn runs_of_equal_query_lengths() {
        assert_eq!(equal_runs(&[]), vec![]);
        assert_eq!(equal_runs(&[4, 4, 4]), vec![(0, 3)]);
        assert_eq!(
            equal_runs(&[1, 4, 4, 2, 2, 4]),
            vec![(0, 1), (1, 2), (3, 2), (5, 1)]
        );
        assert_eq!(equal_runs(&[0, 3]), vec![(0, 1), (1, 1)]);
    }
}
