//! The drafter passes: the multi-step (EAGLE/MTP) pass over the drafter cache and the
//! DFlash block pass with non-causal block attention.

use std::sync::Arc;

use specmla_core::backend::DrafterOutput;
use specmla_core::drafter::{DFlashPass, DrafterPass, HiddenSource};

use super::{as_i32, CacheOf, DecodeLaunch, GpuBackend, Region, Result, SplitForm};
use crate::launch::{copy, Buf, DPtr};
use crate::ops::{DecodeBufs, DecodeShape};
use crate::workspace::Workspace;

/// The shape a multi-step pass's kernels run at: what a captured drafter graph
/// freezes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DraftShape {
    pub tokens: usize,
    pub rows: usize,
    pub width: usize,
}

impl GpuBackend {
    /// Writes the `n` latents in `ws.latent` into the drafter cache at `slots`, checked
    /// on the host first: the one place the drafter's unchecked kernel write happens.
    fn cache_drafter_latents(&self, ws: &mut Workspace, slots: &[i64], n: usize) -> Result<()> {
        self.check_slots(slots)?;
        ws.slots.write(&self.dev, slots)?;
        // SAFETY: every slot just passed check_slots.
        unsafe { self.write_latents(ws, CacheOf::Drafter, n) }
    }

    /// Uploads one multi-step pass's inputs into `ws`, each checked on the host: tokens,
    /// positions, hidden sources (`sources`, from [`Self::carried_rows`]), slots, the
    /// sampled rows, and their keys' block table, lengths and split schedule.
    pub(super) fn drafter_inputs(
        &self,
        ws: &mut Workspace,
        pass: &DrafterPass,
        sources: &[i32],
    ) -> Result<DraftShape> {
        let dev = Arc::clone(&self.dev);
        let n = pass.token_ids.len();
        ws.ids.write(&dev, &self.check_tokens(&pass.token_ids)?)?;
        ws.positions.write(&dev, &as_i32(&pass.positions))?;
        self.upload_carried(ws, sources)?;
        self.check_slots(&pass.slot_mapping)?;
        ws.slots.write(&dev, &pass.slot_mapping)?;
        let sample = as_i32(&pass.token_indices_to_sample);
        self.set_gather_rows(ws, &sample, n)?;
        let rows = sample.len();
        ws.block_table
            .write(&dev, &self.block_ids(&pass.block_table)?)?;
        ws.seq_lens.write(&dev, &as_i32(&pass.kv_lens))?;
        let [lens, counts, mapped] = self.split_schedule(&pass.split, rows)?;
        ws.split_lens.write(&dev, &lens)?;
        ws.num_splits.write(&dev, &counts)?;
        ws.mapped_kv.write(&dev, &mapped)?;
        Ok(DraftShape {
            tokens: n,
            rows,
            width: pass.block_table_width,
        })
    }

    /// The kernels of one multi-step pass over inputs [`Self::drafter_inputs`] wrote: the
    /// fused input projection, the latent cache write, the sampled rows' attention,
    /// finish and logits, their hidden states into the drafter carry and their digests
    /// into `ws.digests`. Launch parameters depend on `shape` alone, so a captured graph
    /// replays it for any pass of that shape.
    pub(super) fn drafter_kernels(&self, ws: &Workspace, shape: DraftShape) -> Result<()> {
        let dev = self.dev();
        let (k, d, md) = (&self.k, &self.dims, self.md);
        let (n, rows, hid) = (shape.tokens, shape.rows, d.hidden_size);
        let w = &self.drafter.layer;
        // x = concat(embed(token), hidden_in) @ fc, built in xs/h/x.
        // SAFETY: ws.ids holds only ids that passed check_tokens (drafter_inputs).
        unsafe {
            k.embed(
                dev,
                self.drafter.embed_tokens.ptr(),
                ws.ids.ptr(),
                ws.h.ptr(),
                n,
                hid,
            )
        }?;
        let xs = ws.xs.ptr();
        self.gather_carried(ws, n, xs)?;
        let cat = ws.tmp.ptr();
        k.concat_rows(dev, ws.h.ptr(), ws.xs.ptr(), cat, n, hid, hid)?;
        self.linear(ws, (cat, 2 * hid), &self.drafter.fc, ws.x.ptr(), false, n)?;
        self.qkv(w, ws, n, true)?;
        // SAFETY: ws.slots passed check_slots in drafter_inputs.
        unsafe { self.write_latents(ws, CacheOf::Drafter, n) }?;
        // Sampled tokens only (their rows compacted to the front), over the keys and
        // splits the core planned for each.
        let qw = md.heads * md.qk();
        let hv = self.attn_width();
        let attn = ws.attn.ptr().range(0, rows * hv);
        self.gather(ws, ws.x.ptr(), xs, rows, hid)?;
        self.gather(ws, ws.q.ptr(), ws.tmp.ptr(), rows, qw)?;
        copy(dev, ws.tmp.ptr(), ws.q.ptr(), rows * qw)?;
        let dl = DecodeLaunch {
            token_start: 0,
            rows,
            q_len: 1,
            block_table: ws.block_table.ptr(),
            width: shape.width,
            seq_lens: ws.seq_lens.ptr(),
            split_lens: ws.split_lens.ptr(),
            num_splits: ws.num_splits.ptr(),
            mapped_kv: ws.mapped_kv.ptr(),
            // The cap's grid, which a graph of the pass freezes; an eager pass runs the
            // same launch.
            splits: SplitForm::Cap,
        };
        k.fill(dev, attn, 0.0, rows * hv)?;
        self.decode(w, ws, CacheOf::Drafter, dl, rows, attn)?;
        // The residual of the sampled rows now lives in xs; finish it there.
        self.finish(w, ws, xs, attn, rows)?;
        copy(dev, xs, ws.x.ptr(), rows * hid)?;
        self.lm_head(ws, &self.drafter.final_norm, &self.drafter.lm_head, rows)?;
        self.carry_out(ws, ws.x.ptr(), rows)
    }

    /// What a multi-step pass returns once its kernels ran: `rows` logits and digests.
    pub(super) fn drafter_result(&self, ws: &Workspace, rows: usize) -> Result<DrafterOutput> {
        let (dev, d) = (self.dev(), &self.dims);
        Ok(DrafterOutput {
            hidden_digests: ws.digests.read(dev, rows)?,
            logits: ws.logits.read(dev, rows * d.vocab_size)?,
            forward_id: 0,
            vocab_size: d.vocab_size,
        })
    }

    /// A drafter pass's `rows` hidden states at `hidden`, copied into the drafter carry
    /// and digested into `ws.digests`: what [`Self::drafter_result`] reads.
    fn carry_out(&self, ws: &Workspace, hidden: DPtr<f32>, rows: usize) -> Result<()> {
        let (dev, hid) = (self.dev(), self.dims.hidden_size);
        copy(dev, hidden, self.carry.drafter_ptr(), rows * hid)?;
        let digests = ws.digests.ptr();
        self.k
            .row_digest(dev, hidden, digests, (1, rows, hid), rows * hid)?;
        Ok(())
    }

    pub(super) fn dflash_body(
        &self,
        ws: &mut Workspace,
        pass: &DFlashPass,
    ) -> Result<DrafterOutput> {
        let dev = Arc::clone(&self.dev);
        let (k, d) = (&self.k, &self.dims);
        let hid = d.hidden_size;
        let w = &self.drafter.layer;
        // Context: target hidden states projected by fc_ctx, written to the drafter cache.
        let e = pass.context_token_indices.len();
        let sources: Vec<HiddenSource> = pass
            .context_token_indices
            .iter()
            .map(|&i| HiddenSource::TargetToken(i))
            .collect();
        let sources = self.carried_rows(&sources, false)?;
        self.upload_carried(ws, &sources)?;
        let xs = ws.xs.ptr();
        self.gather_carried(ws, sources.len(), xs)?;
        self.linear(
            ws,
            (ws.xs.ptr(), hid),
            &self.drafter.fc_ctx,
            ws.x.ptr(),
            false,
            e,
        )?;
        ws.positions.write(&dev, &as_i32(&pass.context_positions))?;
        self.qkv(w, ws, e, false)?;
        self.cache_drafter_latents(ws, &pass.context_slots, e)?;
        // The query block: token or mask embeddings, every position's latent cached.
        let nb = pass.block_tokens.len();
        let ids: Vec<u32> = pass.block_tokens.iter().map(|t| t.unwrap_or(0)).collect();
        let mut ids = self.check_tokens(&ids)?;
        for (id, t) in ids.iter_mut().zip(&pass.block_tokens) {
            if t.is_none() {
                *id = d.vocab_size as i32; // the mask embedding's row
            }
        }
        ws.ids.write(&dev, &ids)?;
        // SAFETY: every id is a checked token or the mask row `vocab`, and the drafter's
        // table has vocab + 1 rows (DrafterWeights).
        unsafe {
            k.embed(
                &dev,
                self.drafter.embed_tokens.ptr(),
                ws.ids.ptr(),
                ws.x.ptr(),
                nb,
                hid,
            )
        }?;
        ws.positions.write(&dev, &as_i32(&pass.block_positions))?;
        self.qkv(w, ws, nb, true)?;
        self.cache_drafter_latents(ws, &pass.block_slots, nb)?;
        let hv = self.attn_width();
        let attn = ws.attn.ptr().range(0, nb * hv);
        k.fill(&dev, attn, 0.0, nb * hv)?;
        match self.prefill_on_flash() {
            true => self.dflash_flash(ws, pass, attn)?,
            false => self.timed(Region::Attention, || self.dflash_attention(ws, pass, attn))?,
        }
        // Finish every block position, then keep offsets 1..=K of each row.
        self.finish(w, ws, ws.x.ptr(), attn, nb)?;
        let keep = as_i32(&pass.sample_indices);
        self.set_gather_rows(ws, &keep, nb)?;
        self.gather(ws, ws.x.ptr(), ws.xs.ptr(), keep.len(), hid)?;
        copy(&dev, ws.xs.ptr(), ws.h.ptr(), keep.len() * hid)?;
        self.lm_head(
            ws,
            &self.drafter.final_norm,
            &self.drafter.lm_head,
            keep.len(),
        )?;
        self.carry_out(ws, ws.h.ptr(), keep.len())?;
        self.drafter_result(ws, keep.len())
    }

    /// Non-causal block attention on the portable kernels (the tensor-core one is
    /// `prefill.rs`): positions 1..=K of each row see the row's context
    /// (from the drafter cache) and the whole block (this pass's latents).
    pub(super) fn dflash_attention(
        &self,
        ws: &Workspace,
        pass: &DFlashPass,
        attn: DPtr<f32>,
    ) -> Result<()> {
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
            // SAFETY: the table came through block_ids, which refuses blocks outside the pool.
            unsafe {
                k.gather_context(
                    dev,
                    self.drafter_cache.ptr(),
                    row_table,
                    sc.keys.ptr(),
                    0,
                    ctx,
                    page,
                    lat,
                )
            }?;
            copy(
                dev,
                ws.latent.ptr().offset(r * b * lat),
                sc.keys.ptr().offset(ctx * lat),
                b * lat,
            )?;
            // The keys are contiguous, so an identity block table over them with a page
            // of one position lets the decode kernel read them in place, one query per
            // "row", all K rows seeing all ctx + K keys.
            let n_keys = pass.kv_lens[r] as usize;
            let seq = Buf::from_host(dev, &vec![n_keys as i32; b - 1], "dflash seq_lens")?;
            let [len, count, _] = self.split_schedule(&pass.split, r + 1)?;
            let split_lens = Buf::from_host(dev, &vec![len[r]; b - 1], "dflash split lengths")?;
            let splits = Buf::from_host(dev, &vec![count[r]; b - 1], "dflash splits")?;
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
                split_lens: split_lens.ptr(),
                num_splits: splits.ptr(),
                out: o_lat,
                lse: ws.lse.ptr(),
            };
            // SAFETY: the identity table names key rows inside sc.keys: n_keys of them, each copied above.
            unsafe { k.decode(dev, shape, bufs, md.softmax_scale()) }?;
            k.apply_uv(
                dev,
                md,
                o_lat,
                w.w_uv.ptr(),
                attn.offset(first * md.heads * md.v),
                b - 1,
            )?;
        }
        Ok(())
    }
}
