//! The prefill rows of a step on the tensor-core path, all rows of a layer in a few
//! launches, as vLLM's MLA prefill runs them (`vllm/v1/attention/backends/mla/common.py`,
//! `_forward_prefill` / `_compute_prefill_context`, v0.33.0 `4ba787ec9`):
//! - the new tokens' latents up-projected by `kv_b` (one cuBLASLt GEMM, bf16 out) and
//!   attended causally over themselves by the TMA prefill, varlen over the rows;
//! - where the plan has context chunks, each chunk's latents gathered from the bf16
//!   cache from the core's per-row chunk starts, up-projected, attended non-causally
//!   and merged by LSE into an accumulator over every prefill token;
//! - then the new tokens' state merged in (F1 reads its LSE transposed).
//!
//! DFlash's block attention takes the same kernels, non-causal: each row's block over its
//! context (gathered from the drafter's bf16 cache) and the block itself.
//!
//! The target's index arrays are the core's plan as given (`MlaPrefillMetadata::
//! query_start_loc`, `ChunkedContext`), uploaded once per step in one array. DFlash's
//! start locations are prefix sums of the pass's `block_len` and `kv_lens`, checked
//! against its `context_lens`; no scheduling decision is taken here.

use specmla_core::drafter::DFlashPass;
use specmla_core::fault::Fault;
use specmla_core::metadata::MlaPrefillMetadata;
use specmla_core::plan::StepPlan;

use super::{CacheOf, GpuBackend, GpuBackendError, Region, Result};
use crate::launch::{Buf, DPtr};
use crate::ops::{
    prefill_rows_valid, prefill_widths_fit, GemmShape, PrefillBufs, PrefillKeyLayout, PrefillShape,
    State, PREFILL_DQK,
};
use crate::weights::LayerWeights;
use crate::workspace::{FlashPrefillScratch, Workspace};

/// One context chunk's launch: where its index arrays sit in the step's index buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ChunkLaunch {
    /// Offset of its `k_start_loc` (`[rows + 1]`), then its per-row starts (`[rows]`).
    at: usize,
    total_keys: usize,
    max_keys: usize,
}

/// The step's prefill index arrays on the device: the rows' `query_start_loc`, then each
/// chunk's key start locations and per-row context starts.
pub(super) struct PrefillIndex {
    buf: Buf<i32>,
    chunks: Vec<ChunkLaunch>,
}

/// The host side of [`PrefillIndex`] for `p`, checked as the kernels trust it.
fn index_arrays(p: &MlaPrefillMetadata) -> Result<(Vec<i32>, Vec<ChunkLaunch>)> {
    let rows = p.rows.len();
    let bad = |what: String| Err(GpuBackendError::BadPlan(what));
    let i32s = |v: &mut dyn Iterator<Item = usize>| -> Result<Vec<i32>> {
        v.map(|x| i32::try_from(x).map_err(|_| GpuBackendError::BadPlan(format!("{x} > i32"))))
            .collect()
    };
    let q_loc = i32s(&mut p.query_start_loc.iter().map(|&x| x as usize))?;
    let total = p.tokens.len();
    let causal = PrefillShape {
        batch: rows,
        heads: 1,
        max_q_len: p.max_query_len,
        total_q: total,
        total_k: total,
        causal: true,
    };
    if !prefill_rows_valid(&causal, &q_loc, &q_loc) {
        return bad(format!(
            "prefill query_start_loc {:?} does not describe {rows} rows of {total} tokens",
            p.query_start_loc
        ));
    }
    let mut all = q_loc;
    let mut launches = Vec::new();
    for (c, chunk) in p
        .chunked_context
        .iter()
        .flat_map(|cc| &cc.chunks)
        .enumerate()
    {
        if chunk.lens.len() != rows || chunk.starts.len() != rows {
            return bad(format!(
                "context chunk {c} does not have one entry per prefill row"
            ));
        }
        let mut k_loc = vec![0usize];
        for &len in &chunk.lens {
            k_loc.push(k_loc[k_loc.len() - 1] + len);
        }
        let at = all.len();
        all.extend(i32s(&mut k_loc.iter().copied())?);
        all.extend(i32s(&mut chunk.starts.iter().copied())?);
        launches.push(ChunkLaunch {
            at,
            total_keys: k_loc[rows],
            max_keys: chunk.lens.iter().copied().max().unwrap_or(0),
        });
    }
    Ok((all, launches))
}

impl GpuBackend {
    /// Whether this backend's prefill rows take the tensor-core path.
    pub(super) fn prefill_on_flash(&self) -> bool {
        self.flash.is_some() && prefill_widths_fit(&self.dims) && !self.portable_prefill
    }

    /// Uploads `plan`'s prefill index arrays (one copy for the whole step).
    pub(super) fn write_prefill_index(&mut self, plan: &StepPlan) -> Result<()> {
        let Some(p) = &plan.mla.prefill else {
            return Ok(());
        };
        let (host, chunks) = index_arrays(p)?;
        let dev = std::sync::Arc::clone(&self.dev);
        match &mut self.prefill_index {
            Some(ix) if ix.buf.len() >= host.len() => {
                ix.buf.write(&dev, &host)?;
                ix.chunks = chunks;
            }
            slot => {
                let buf = Buf::from_host(&dev, &host, "prefill index arrays")?;
                *slot = Some(PrefillIndex { buf, chunks });
            }
        }
        Ok(())
    }

    /// Largest number of queries or keys one launch of `plan`'s prefill takes: every
    /// prefill token at once, or a whole context chunk.
    pub(super) fn flash_prefill_tokens(plan: &StepPlan) -> usize {
        let Some(p) = &plan.mla.prefill else { return 0 };
        let chunks = p.chunked_context.iter().flat_map(|cc| &cc.chunks);
        chunks
            .map(|ch| ch.total_tokens())
            .fold(p.tokens.len(), usize::max)
    }

    /// Layer `l`'s prefill rows on the tensor-core path, into their tokens of `attn`.
    pub(super) fn prefill_flash(
        &self,
        ws: &Workspace,
        plan: &StepPlan,
        (l, w): (usize, &LayerWeights),
        attn: DPtr<f32>,
    ) -> Result<()> {
        let Some(p) = &plan.mla.prefill else {
            return Ok(());
        };
        let (total, rows) = (p.tokens.len(), p.rows.len());
        if total == 0 {
            return Ok(());
        }
        let (dev, k, md) = (self.dev(), &self.k, self.md);
        let sc = self.scratch.as_ref().expect("ensured before the forward");
        let fs = sc.flash.as_ref().expect("a flash backend's scratch");
        let ix = self
            .prefill_index
            .as_ref()
            .expect("written before the forward");
        let (t0, heads, lat) = (p.tokens.start, md.heads, md.latent());
        let q = fs.q.ptr().range(0, total * heads * PREFILL_DQK);
        let q_loc = ix.buf.ptr().range(0, rows + 1);
        let shape = PrefillShape {
            batch: rows,
            heads,
            max_q_len: p.max_query_len,
            total_q: total,
            total_k: total,
            causal: true,
        };
        self.timed(Region::Attention, || {
            let q_src = ws.q.ptr().offset(t0 * heads * PREFILL_DQK);
            k.to_bf16(dev, q_src, q, total * heads * PREFILL_DQK)?;
            let lat_src = ws.latent.ptr().offset(t0 * lat);
            Ok(k.to_bf16(dev, lat_src, fs.latent.ptr(), total * lat)?)
        })?;
        self.up_project(fs, w, total)?;
        let out = attn.range(t0 * heads * md.v, total * heads * md.v);
        let chunks = &ix.chunks;
        let new = State {
            out: if chunks.is_empty() {
                out
            } else {
                sc.new_out.ptr()
            },
            lse: sc.new_lse.ptr(),
        };
        self.timed(Region::Attention, || {
            self.tma_prefill(fs, shape, (q, q_loc, q_loc), new)
        })?;
        if chunks.is_empty() {
            return Ok(());
        }
        let acc = State {
            out,
            lse: sc.ctx_lse.ptr(),
        };
        self.timed(Region::Attention, || {
            k.fill(dev, acc.out, 0.0, total * heads * md.v)?;
            Ok(k.fill(dev, acc.lse, f32::NEG_INFINITY, total * heads)?)
        })?;
        let part = State {
            out: sc.part_out.ptr(),
            lse: sc.part_lse.ptr(),
        };
        for ch in chunks.iter().filter(|c| c.total_keys > 0) {
            self.timed(Region::Attention, || self.gather_chunk(plan, l, ws, ch))?;
            self.up_project(fs, w, ch.total_keys)?;
            let k_loc = ix.buf.ptr().range(ch.at, rows + 1);
            let s = PrefillShape {
                total_k: ch.total_keys,
                causal: false,
                ..shape
            };
            self.timed(Region::Attention, || {
                self.tma_prefill(fs, s, (q, q_loc, k_loc), part)?;
                Ok(k.merge(dev, md, acc, part, total, false)?)
            })?;
        }
        let f1 = self.cfg.faults.has(Fault::F1);
        self.timed(Region::Attention, || {
            Ok(k.merge(dev, md, acc, new, total, f1)?)
        })
    }

    /// DFlash's block attention on the tensor-core path, all rows in one launch: every
    /// block position over the row's context (from the drafter's bf16 cache) and its
    /// whole block (this pass's latents), non-causal. Position 0's output is computed
    /// too; the pass drops it with its row, as it does on the portable path.
    pub(super) fn dflash_flash(
        &self,
        ws: &Workspace,
        pass: &DFlashPass,
        attn: DPtr<f32>,
    ) -> Result<()> {
        let (dev, k, md) = (self.dev(), &self.k, self.md);
        let fp = self.flash.as_ref().expect("the flash path");
        let sc = self.scratch.as_ref().expect("ensured before the pass");
        let fs = sc.flash.as_ref().expect("a flash backend's scratch");
        let (host, shape) = dflash_index(pass, md.heads)?;
        let rows = shape.batch;
        let ix = Buf::from_host(dev, &host, "dflash index arrays")?;
        let table = self.block_ids(&pass.block_table)?;
        let table = Buf::from_host(dev, &table, "dflash block table")?;
        let (q_loc, k_loc) = (
            ix.ptr().range(0, rows + 1),
            ix.ptr().range(rows + 1, rows + 1),
        );
        let ctx = ix.ptr().range(2 * rows + 2, rows);
        let (nb, heads, lat) = (shape.total_q, md.heads, md.latent());
        let q = fs.q.ptr().range(0, nb * heads * PREFILL_DQK);
        let b = pass.block_len;
        self.timed(Region::Attention, || {
            k.to_bf16(dev, ws.q.ptr(), q, nb * heads * PREFILL_DQK)?;
            let max_ctx = pass.context_lens.iter().max().map_or(0, |&c| c as usize);
            let width = pass.block_table_width;
            let page = self.cfg.scheduler.page_size;
            // SAFETY: the key start locations are prefix sums of kv_lens, each a row's
            // context plus its block (dflash_index), so the context lengths stay below
            // them; the table came through block_ids (blocks inside the pool, or -1).
            unsafe {
                fp.fk.gather_latent_bf16(
                    dev,
                    fp.cache(CacheOf::Drafter),
                    table.ptr(),
                    (k_loc, None, Some(ctx)),
                    (rows, width, page, max_ctx),
                    fs.latent.ptr(),
                )
            }?;
            for r in 0..rows {
                let at = host[rows + 1 + r] as usize + pass.context_lens[r] as usize;
                let dst = fs.latent.ptr().range(at * lat, b * lat);
                k.to_bf16(dev, ws.latent.ptr().offset(r * b * lat), dst, b * lat)?;
            }
            Ok(())
        })?;
        self.up_project(fs, &self.drafter.layer, shape.total_k)?;
        let st = State {
            out: attn,
            lse: sc.new_lse.ptr(),
        };
        self.timed(Region::Attention, || {
            self.tma_prefill(fs, shape, (q, q_loc, k_loc), st)
        })
    }

    /// Context chunk `ch` of every prefill row of layer `l`, gathered into the scratch's
    /// latent rows at the chunk's key start locations.
    fn gather_chunk(
        &self,
        plan: &StepPlan,
        l: usize,
        ws: &Workspace,
        ch: &ChunkLaunch,
    ) -> Result<()> {
        let p = plan.mla.prefill.as_ref().expect("a step with prefill rows");
        let fp = self.flash.as_ref().expect("the flash path");
        let fs = self.scratch.as_ref().and_then(|s| s.flash.as_ref());
        let fs = fs.expect("a flash backend's scratch");
        let ix = self
            .prefill_index
            .as_ref()
            .expect("written before the forward");
        let rows = p.rows.len();
        let width = plan.common.block_table_width;
        let table = ws.block_table.ptr().offset(p.rows.start * width);
        let k_loc = ix.buf.ptr().range(ch.at, rows + 1);
        let starts = ix.buf.ptr().range(ch.at + rows + 1, rows);
        let page = self.cfg.scheduler.page_size;
        // SAFETY: the key start locations are the prefix sums of the chunk's lengths
        // (index_arrays), the longest is max_keys, and the block table was written
        // through block_ids (blocks inside the pool, or -1, which gathers NaN).
        unsafe {
            fp.fk.gather_latent_bf16(
                self.dev(),
                fp.cache(CacheOf::Target(l)),
                table,
                (k_loc, Some(starts), None),
                (rows, width, page, ch.max_keys),
                fs.latent.ptr(),
            )
        }?;
        Ok(())
    }

    /// `kv[j] = latent[j, :kv_lora] kv_b^T` for `n` latent rows of the scratch: every
    /// head's k_nope and v, bf16.
    fn up_project(&self, fs: &FlashPrefillScratch, w: &LayerWeights, n: usize) -> Result<()> {
        let md = self.md;
        let kv_b = w.w_kv_b.as_ref().expect("bf16 weights on the flash path");
        let gemm = &self.flash.as_ref().expect("the flash path").gemm;
        let shape = GemmShape::linear(n, md.kv_lora, md.heads * (md.nope + md.v), md.latent());
        self.timed(Region::Gemm, || {
            Ok(gemm.run_bf16_out(self.dev(), shape, kv_b.ptr(), fs.latent.ptr(), fs.kv.ptr())?)
        })
    }

    /// One TMA prefill launch of `s` over the scratch's up-projected keys and latent
    /// rows, into `st`.
    fn tma_prefill(
        &self,
        fs: &FlashPrefillScratch,
        s: PrefillShape,
        (q, q_loc, k_loc): (DPtr<u16>, DPtr<i32>, DPtr<i32>),
        st: State,
    ) -> Result<()> {
        let fp = self.flash.as_ref().expect("the flash path");
        let kv = fs.kv.ptr();
        let bufs = PrefillBufs {
            q,
            k_nope: kv,
            k_rope: fs.latent.ptr().offset(self.md.kv_lora),
            v: kv.offset(self.md.nope),
            layout: PrefillKeyLayout::up_projected(s.heads),
            q_start_loc: q_loc,
            k_start_loc: k_loc,
            out: st.out,
            lse: st.lse,
        };
        // SAFETY: the start locations were checked by index_arrays (queries) or are the
        // prefix sums of the chunk's lengths (keys, non-causal).
        unsafe {
            fp.fk
                .flash_prefill(self.dev(), s, bufs, self.md.softmax_scale())
        }?;
        Ok(())
    }
}

/// DFlash's index arrays (query start locations, key start locations, context lengths)
/// and its launch shape, checked as the kernels trust them: each row's keys are its
/// context and its block (`kv_lens = context_lens + block_len`).
fn dflash_index(pass: &DFlashPass, heads: usize) -> Result<(Vec<i32>, PrefillShape)> {
    let (rows, b) = (pass.req_ids.len(), pass.block_len);
    let bad = |what: String| Err(GpuBackendError::BadPlan(what));
    if pass.context_lens.len() != rows || pass.kv_lens.len() != rows {
        return bad(format!(
            "DFlash pass of {rows} rows with other-sized lengths"
        ));
    }
    if pass.block_table.len() != rows * pass.block_table_width {
        return bad(format!(
            "DFlash pass of {rows} rows with a block table of {} entries at width {}",
            pass.block_table.len(),
            pass.block_table_width
        ));
    }
    if pass.block_tokens.len() != rows * b {
        return bad(format!(
            "DFlash pass of {rows} blocks of {b} with {} block tokens",
            pass.block_tokens.len()
        ));
    }
    let mut k_loc = vec![0i64];
    for (r, (&ctx, &kv)) in pass.context_lens.iter().zip(&pass.kv_lens).enumerate() {
        if kv as usize != ctx as usize + b {
            return bad(format!(
                "DFlash row {r}: kv_len {kv} is not context {ctx} + {b}"
            ));
        }
        k_loc.push(k_loc[r] + kv as i64);
    }
    let total_k = k_loc[rows];
    if total_k > i32::MAX as i64 {
        return bad(format!("DFlash pass of {total_k} keys"));
    }
    let q_loc: Vec<i32> = (0..=rows).map(|r| (r * b) as i32).collect();
    let k_loc: Vec<i32> = k_loc.iter().map(|&x| x as i32).collect();
    let shape = PrefillShape {
        batch: rows,
        heads,
        max_q_len: b,
        total_q: rows * b,
        total_k: total_k as usize,
        causal: false,
    };
    if !prefill_rows_valid(&shape, &q_loc, &k_loc) {
        return bad("DFlash start locations".into());
    }
    let ctx = pass.context_lens.iter().map(|&c| c as i32);
    Ok((q_loc.into_iter().chain(k_loc).chain(ctx).collect(), shape))
}

#[cfg(test)]
mod tests {
    use super::*;
    use specmla_core::chunked_context::{ChunkedContext, ContextChunk};

    fn meta(q_loc: Vec<u32>, chunks: Vec<ContextChunk>) -> MlaPrefillMetadata {
        let rows = q_loc.len() - 1;
        let total = q_loc[rows] as usize;
        let max_q = q_loc.windows(2).map(|w| w[1].saturating_sub(w[0]) as usize);
        let max_q = max_q.max().unwrap_or(0);
        MlaPrefillMetadata {
            rows: 3..3 + rows,
            tokens: 8..8 + total,
            query_start_loc: q_loc,
            max_query_len: max_q,
            chunked_context: (!chunks.is_empty()).then_some(ChunkedContext {
                workspace_tokens: 64,
                chunk_size_tokens: 32,
                chunks,
            }),
        }
    }

    #[test]
    fn the_index_holds_queries_then_each_chunks_key_locations_and_starts() {
        let chunks = vec![
            ContextChunk {
                starts: vec![0, 0],
                lens: vec![32, 5],
            },
            ContextChunk {
                starts: vec![32, 5],
                lens: vec![7, 0],
            },
        ];
        let (host, launches) = index_arrays(&meta(vec![0, 4, 9], chunks)).unwrap();
        assert_eq!(host, [0, 4, 9, 0, 32, 37, 0, 0, 0, 7, 7, 32, 5]);
        let want = [(3, 37, 32), (8, 7, 7)].map(|(at, total_keys, max_keys)| ChunkLaunch {
            at,
            total_keys,
            max_keys,
        });
        assert_eq!(launches, want);
    }

    fn dflash(context_lens: Vec<u32>, kv_lens: Vec<u32>, block_len: usize) -> DFlashPass {
        let rows = context_lens.len();
        DFlashPass {
            req_ids: (0..rows as u64).collect(),
            context_token_indices: vec![],
            context_positions: vec![],
            context_slots: vec![],
            context_start_loc: vec![],
            context_lens,
            block_len,
            block_tokens: vec![None; rows * block_len],
            block_positions: vec![],
            block_slots: vec![],
            block_indices: vec![],
            block_table: vec![0; rows],
            block_table_width: 1,
            sample_indices: vec![],
            kv_lens,
            split: Default::default(),
        }
    }

    #[test]
    fn a_dflash_row_attends_its_context_then_its_block() {
        let (host, shape) = dflash_index(&dflash(vec![5, 0, 12], vec![9, 4, 16], 4), 8).unwrap();
        assert_eq!(host, [0, 4, 8, 12, 0, 9, 13, 29, 5, 0, 12]);
        assert_eq!((shape.total_q, shape.total_k, shape.max_q_len), (12, 29, 4));
        assert!(!shape.causal);
        // kv_len must be the context plus the block; the table must be rows x width.
        assert!(dflash_index(&dflash(vec![5], vec![8], 4), 8).is_err());
        let mut short = dflash(vec![5, 2], vec![9, 6], 4);
        short.block_table.pop();
        assert!(dflash_index(&short, 8).is_err());
    }

    #[test]
    fn query_locations_that_do_not_fit_the_tokens_are_refused() {
        let mut m = meta(vec![0, 4, 9], vec![]);
        m.tokens = 8..16;
        assert!(index_arrays(&m).is_err());
        let m = meta(vec![0, 5, 4], vec![]);
        assert!(index_arrays(&m).is_err());
        let ragged = ContextChunk {
            starts: vec![0],
            lens: vec![3],
        };
        assert!(index_arrays(&meta(vec![0, 4, 9], vec![ragged])).is_err());
    }
}
