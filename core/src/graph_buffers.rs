//! The persistent input buffers a captured CUDA graph reads (RULES §7), kept as the
//! engines keep them: allocated once for the largest capture, written in place each
//! step, and read by a replay over the captured shape's whole row count. Whatever a step
//! does not write keeps what an earlier step (or the capture's dummy run) left there, so
//! a buffer region the engine forgets to write is read stale by the padding rows, or by
//! every row.
//!
//! What the engine writes each graph step (vLLM's `gpu_model_runner.py`):
//! - `seq_lens`: the real rows', then 0 for the padding rows (`seq_lens[num_reqs:]` is
//!   filled with 0 in `_prepare_inputs` and in `_dummy_run`). F13 skips the fill.
//! - the block table: the real rows only (the block table commits the first `num_reqs`
//!   rows); a padding row's entries stay stale, harmless while its seq_len is 0.
//! - the split-KV schedule: recomputed from the current seq_lens and copied into the
//!   graph's buffer (vLLM #35175 for FlashMLA's FP8 path). F12 leaves the buffer as the
//!   capture wrote it, the bug of vLLM #33638: the replay reads the capture-time schedule.
//!
//! The capture's dummy run writes `seq_lens = max_query_len` for the captured rows (vLLM
//! `_dummy_run`) and the schedule computed from them. With poison on, every region a step
//! does not write is filled with garbage first (valid-looking block ids and lengths from
//! a seeded stream), so a stale read shows up as a wrong output and not only as an
//! invariant.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::config::EngineConfig;
use crate::cudagraph::GraphShape;
use crate::fault::Fault;
use crate::metadata::decode_split_plan;
use crate::plan::StepPlan;
use crate::rng::{keyed_rng, Stream};

/// The buffers a replayed graph reads, `[max_rows]` (`[max_rows, width]` for the table).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphBuffers {
    width: usize,
    seq_lens: Vec<u32>,
    block_table: Vec<u32>,
    num_splits: Vec<u32>,
}

impl GraphBuffers {
    /// Zeroed buffers for the largest of `shapes`, then each capture's dummy run, in
    /// capture order (vLLM captures the largest size first).
    pub fn captured(cfg: &EngineConfig, shapes: &[GraphShape]) -> Self {
        let rows = shapes.iter().map(|s| s.num_rows).max().unwrap_or(0);
        let width = cfg.scheduler.max_blocks_per_seq();
        let mut b = Self {
            width,
            seq_lens: vec![0; rows],
            block_table: vec![0; rows * width],
            num_splits: vec![0; rows],
        };
        for s in shapes.iter().rev() {
            b.seq_lens[..s.num_rows].fill(s.max_query_len as u32);
            b.seq_lens[s.num_rows..].fill(0);
            let plan = decode_split_plan(&b.seq_lens[..s.num_rows], cfg.split_size_tokens);
            b.num_splits[..s.num_rows].copy_from_slice(&plan);
        }
        b
    }

    /// One replayed step: with poison, garbage first in every region this step will not
    /// write; then the engine's writes (what `plan` holds for its real rows, the padding
    /// rows' zero seq_lens, the recomputed schedule), each unless its fault is on; then
    /// `plan`'s padded rows and schedule become what the replay reads from the buffers.
    pub fn replay(&mut self, cfg: &EngineConfig, plan: &mut StepPlan, seed: u64) {
        let Some(g) = plan.cudagraph else { return };
        let (n, rows, w) = (plan.rows.len(), g.shape.num_rows, self.width);
        let c = &mut plan.common;
        if cfg.poison_stale_buffers {
            self.poison(cfg, plan.step, seed, n, rows);
        }
        self.seq_lens[..n].copy_from_slice(&c.seq_lens[..n]);
        if !cfg.faults.has(Fault::F13) {
            self.seq_lens[n..rows].fill(0);
        }
        self.block_table[..n * w].copy_from_slice(&c.block_table[..n * w]);
        let fresh = decode_split_plan(&self.seq_lens[..rows], cfg.split_size_tokens);
        if !cfg.faults.has(Fault::F12) {
            self.num_splits[..rows].copy_from_slice(&fresh);
        }
        c.seq_lens.copy_from_slice(&self.seq_lens[..rows]);
        c.block_table.copy_from_slice(&self.block_table[..rows * w]);
        c.max_seq_len = c.seq_lens.iter().max().map_or(0, |&s| s as usize);
        if let Some(d) = plan.mla.decode.as_mut() {
            d.plan_seq_lens = c.seq_lens.clone();
            d.num_splits = self.num_splits[..rows].to_vec();
        }
    }

    /// Garbage in what a step of `n` real rows padded to `rows` will not write: the
    /// padding rows' seq_lens when F13 skips their fill, the padding rows' block table,
    /// and the schedule when F12 skips its copy. Lengths up to `max_model_len` and block
    /// ids inside the pool, so a stale read computes a wrong value rather than failing.
    fn poison(&mut self, cfg: &EngineConfig, step: u64, seed: u64, n: usize, rows: usize) {
        let mut rng = keyed_rng(seed, Stream::Poison, 0, step);
        let s = &cfg.scheduler;
        let w = self.width;
        if cfg.faults.has(Fault::F13) {
            for v in &mut self.seq_lens[n..rows] {
                *v = rng.gen_range(1..=s.max_model_len as u32);
            }
        }
        for v in &mut self.block_table[n * w..rows * w] {
            *v = rng.gen_range(0..s.num_gpu_blocks as u32);
        }
        if cfg.faults.has(Fault::F12) {
            for v in &mut self.num_splits[..rows] {
                *v = rng.gen_range(1..=s.max_model_len.div_ceil(cfg.split_size_tokens) as u32);
            }
        }
    }
}
