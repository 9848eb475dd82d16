//! The persistent input buffers a captured CUDA graph reads (RULES §7), kept as the
//! engines keep them: allocated once for the largest capture, written in place each
//! step, and read by a replay over the captured shape's whole row count. Whatever a step
//! does not write keeps what an earlier step (or the capture's dummy run) left there, so
//! a buffer region the engine forgets to write is read stale by the padding rows, or by
//! every row.
//!
//! What the engine writes each step, eager or replayed (vLLM's `gpu_model_runner.py`):
//! - `seq_lens`: the real rows', then 0 for the padding rows (`seq_lens[num_reqs:]` is
//!   filled with 0 in `_prepare_inputs` and in `_dummy_run`). F13 skips the fill.
//! - `query_start_loc`: the real rows' offsets, then the last one repeated, so the
//!   padding rows have q = 0 (`query_start_loc[num_reqs + 1:]` is filled).
//! - the block table: the real rows only (the block table commits the first `num_reqs`
//!   rows); a padding row's entries stay stale, harmless while its seq_len is 0.
//! - the split-KV schedule (each row's split length and count): recomputed from the
//!   current seq_lens and copied into the graph's buffer (vLLM #35175 for FlashMLA's FP8
//!   path). F12 leaves the buffer as the capture wrote it, the bug of vLLM #33638: the
//!   replay reads the capture-time schedule. Each row's mapped keys (the flash kernels'
//!   read bound) are recomputed from the buffer's block table on every replay, F12 or
//!   not: they belong to the table, which the kernels would otherwise read past.
//!
//! - `idx_mapping` (each row's request-state slot, through which draft sampling writes a
//!   row's draft logits): the real rows', then -1 for the padding rows (vLLM #47066, so
//!   sampling skips them). F11 leaves the padding rows' entries as an earlier step left
//!   them: a padding row then samples into a request's slot.
//!
//! The per-request block tables (`RequestStateTables`, indexed by `req_state_idx`) keep a
//! finished request's row until the slot's next owner writes it. An idle data-parallel
//! rank runs a dummy step whose drafter decode reads them (vLLM #56734): the fixed engine
//! maps every dummy row to -1, so nothing is written; F15 maps them to slots
//! `0..num_reqs`, and the drafter writes into the stale rows' blocks.
//!
//! The capture's dummy run writes `seq_lens = max_query_len` for the captured rows (vLLM
//! `_dummy_run`) and the schedule computed from them. With poison on, every region a step
//! does not write is filled with garbage first (valid-looking block ids and lengths from
//! a seeded stream), so a stale read shows up as a wrong output and not only as an
//! invariant.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::batch::ScheduledBatch;
use crate::block_pool::{slot_for, PAD_SLOT};
use crate::config::{EngineConfig, SpecMethod};
use crate::cudagraph::GraphShape;
use crate::fault::Fault;
use crate::plan::StepPlan;
use crate::rng::{keyed_rng, Stream};
use crate::split::SplitSchedule;

/// The buffers a replayed graph reads, `[max_rows]` (`[max_rows, width]` for the table).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphBuffers {
    width: usize,
    seq_lens: Vec<u32>,
    /// `[max_rows + 1]`.
    query_start_loc: Vec<u32>,
    block_table: Vec<u32>,
    /// The split-KV schedule's split lengths and counts (its mapped keys are computed
    /// from `block_table` when read).
    split_len_tokens: Vec<u32>,
    num_splits: Vec<u32>,
    idx_mapping: Vec<i64>,
}

impl GraphBuffers {
    /// Zeroed buffers for the largest of `shapes` (none without graphs: nothing would read
    /// them), then each capture's dummy run, in capture order (vLLM captures the largest
    /// size first). Rows past the largest capture are never read, so they are not kept.
    pub fn captured(cfg: &EngineConfig, shapes: &[GraphShape]) -> Self {
        let rows = shapes.iter().map(|s| s.num_rows).max().unwrap_or(0);
        let width = cfg.scheduler.max_blocks_per_seq();
        let mut b = Self {
            width,
            seq_lens: vec![0; rows],
            query_start_loc: vec![0; rows + 1],
            block_table: vec![0; rows * width],
            split_len_tokens: vec![0; rows],
            num_splits: vec![0; rows],
            // Never written is -1: only an earlier step's entries can be stale.
            idx_mapping: vec![-1; rows],
        };
        for s in shapes.iter().rev() {
            b.seq_lens[..s.num_rows].fill(s.max_query_len as u32);
            b.seq_lens[s.num_rows..].fill(0);
            b.write_schedule(cfg, s.num_rows);
        }
        b
    }

    /// The schedule of the first `rows` rows, recomputed from their current seq_lens.
    fn write_schedule(&mut self, cfg: &EngineConfig, rows: usize) {
        let policy = cfg.split_policy();
        for r in 0..rows {
            let (split, n) = policy.split_of(self.seq_lens[r] as usize);
            self.split_len_tokens[r] = split;
            self.num_splits[r] = n;
        }
    }

    /// The schedule a replay of `rows` rows reads: the buffers' split lengths and counts
    /// as they stand, and mapped keys from the buffer's block table.
    fn read_schedule(&self, cfg: &EngineConfig, rows: usize) -> SplitSchedule {
        let page = cfg.scheduler.page_size;
        let w = self.width;
        SplitSchedule {
            split_len_tokens: self.split_len_tokens[..rows].to_vec(),
            num_splits: self.num_splits[..rows].to_vec(),
            mapped_kv_tokens: (0..rows)
                .map(|r| {
                    crate::split::mapped_kv_tokens(&self.block_table[r * w..(r + 1) * w], page)
                })
                .collect(),
        }
    }

    /// One step: with poison, garbage first in every region this step will not write;
    /// then the engine's writes, eager step or graph replay alike (the real rows'
    /// seq_lens, table rows and slots, the tail's zero seq_lens and -1 slots), each
    /// unless its fault is on. A replay also copies the recomputed schedule (unless F12),
    /// and `plan`'s padded rows and schedule become what it reads from the buffers; an
    /// eager step reads its real rows only, so its plan is left as built.
    pub fn write_step(&mut self, cfg: &EngineConfig, plan: &mut StepPlan, seed: u64) {
        let cap = self.seq_lens.len();
        let (n, w) = (plan.rows.len().min(cap), self.width);
        if cap == 0 {
            return;
        }
        let replayed = plan.cudagraph.map(|g| g.shape.num_rows);
        if cfg.poison_stale_buffers {
            self.poison(cfg, (plan.step, seed), n, replayed);
        }
        let c = &plan.common;
        self.seq_lens[..n].copy_from_slice(&c.seq_lens[..n]);
        // vLLM fills the tail with the last offset, so padding rows have q = 0.
        self.query_start_loc[..=n].copy_from_slice(&c.query_start_loc[..=n]);
        self.query_start_loc[n + 1..].fill(c.query_start_loc[n]);
        self.block_table[..n * w].copy_from_slice(&c.block_table[..n * w]);
        self.idx_mapping[..n].copy_from_slice(&plan.idx_mapping[..n]);
        if !cfg.faults.has(Fault::F13) {
            self.seq_lens[n..].fill(0);
        }
        if !cfg.faults.has(Fault::F11) {
            self.idx_mapping[n..].fill(-1);
        }
        let Some(g) = plan.cudagraph else { return };
        let rows = g.shape.num_rows;
        if !cfg.faults.has(Fault::F12) {
            self.write_schedule(cfg, rows);
        }
        plan.idx_mapping.clear();
        plan.idx_mapping
            .extend_from_slice(&self.idx_mapping[..rows]);
        let c = &mut plan.common;
        c.seq_lens.copy_from_slice(&self.seq_lens[..rows]);
        c.query_start_loc
            .copy_from_slice(&self.query_start_loc[..=rows]);
        c.block_table.copy_from_slice(&self.block_table[..rows * w]);
        c.max_seq_len = c.seq_lens.iter().max().map_or(0, |&s| s as usize);
        if let Some(d) = plan.mla.decode.as_mut() {
            d.plan_seq_lens.clone_from(&c.seq_lens);
            d.split = self.read_schedule(cfg, rows);
        }
    }

    /// Garbage in what a step of `n` real rows will not write: the tail's seq_lens when
    /// F13 skips their fill, the tail's block table, the tail's slots when F11 skips
    /// theirs, and the schedule wherever no copy lands (all of it on an eager step or
    /// under F12, past the replayed rows otherwise). Lengths up to `max_model_len`, block
    /// ids inside the pool and slots below `max_num_seqs`, so a stale read computes a
    /// wrong value rather than failing.
    fn poison(
        &mut self,
        cfg: &EngineConfig,
        (step, seed): (u64, u64),
        n: usize,
        replayed: Option<usize>,
    ) {
        let mut rng = keyed_rng(seed, Stream::Poison, 0, step);
        let s = &cfg.scheduler;
        if cfg.faults.has(Fault::F13) {
            for v in &mut self.seq_lens[n..] {
                *v = rng.gen_range(1..=s.max_model_len as u32);
            }
        }
        for v in &mut self.block_table[n * self.width..] {
            *v = rng.gen_range(0..s.num_gpu_blocks as u32);
        }
        if cfg.faults.has(Fault::F11) {
            for v in &mut self.idx_mapping[n..] {
                *v = rng.gen_range(0..s.max_num_seqs as i64);
            }
        }
        let copied = match replayed {
            Some(rows) if !cfg.faults.has(Fault::F12) => rows,
            _ => 0,
        };
        // Garbage that still looks like a schedule: a split length the policy gives some
        // length up to max_model_len, and a count up to the policy's cap.
        let policy = cfg.split_policy();
        for r in copied..self.num_splits.len() {
            let (split, _) = policy.split_of(rng.gen_range(0..=s.max_model_len));
            self.split_len_tokens[r] = split;
            self.num_splits[r] = rng.gen_range(1..=policy.max_splits as u32);
        }
    }
}

/// The worker's per-request block tables, indexed by `req_state_idx` (vLLM Model Runner
/// V2's `BlockTables.block_tables`): a scheduled row rewrites its slot's row; nothing
/// clears a slot when its request finishes. Kept sparse, so a slot number from a trace
/// costs one row however large it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestStateTables {
    rows: std::collections::BTreeMap<usize, Vec<u32>>,
}

impl RequestStateTables {
    /// Each row of `batch` rewrites its slot's row with its block ids. With poison, every
    /// other slot's row becomes garbage first: no clean read reaches a slot whose
    /// request is not scheduled.
    pub fn write(&mut self, cfg: &EngineConfig, batch: &ScheduledBatch, seed: u64) {
        if cfg.poison_stale_buffers {
            let mut rng = keyed_rng(seed, Stream::Poison, 1, batch.step);
            let blocks = cfg.scheduler.num_gpu_blocks as u32;
            for row in self.rows.values_mut() {
                row.iter_mut().for_each(|b| *b = rng.gen_range(0..blocks));
            }
        }
        for r in &batch.rows {
            let row = self.rows.entry(r.req_state_idx).or_default();
            row.clone_from(&r.block_ids);
        }
    }

    /// Slot `slot`'s row (no block where never written).
    fn row(&self, slot: usize) -> &[u32] {
        self.rows.get(&slot).map_or(&[], Vec::as_slice)
    }
}

/// The dummy batch an idle data-parallel rank runs so the busy ranks' collectives
/// complete (vLLM's `InputBatch.make_dummy`: positions from 0, the target's slots PAD).
/// What matters here is where its drafter decode passes write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DummyStep {
    /// The request-state slot each dummy row reads: -1 (vLLM #56734), or its row index
    /// under F15 (`arange`). One dummy row per padded token, at most `max_num_seqs`
    /// (assumed: a decode-only dummy batch).
    pub idx_mapping: Vec<i64>,
    /// Per drafter decode pass (1..K-1), each dummy row's KV slot: PAD where its slot is
    /// -1, else the slot of its position in that request-state slot's (stale) table.
    pub drafter_slot_mapping: Vec<Vec<i64>>,
}

/// The dummy step of an idle rank, or `None` when it has nothing to write: a single rank,
/// or no drafter decode pass (a multi-step drafter with K >= 2 has them).
pub fn dummy_step(cfg: &EngineConfig, tables: &RequestStateTables) -> Option<DummyStep> {
    let k = cfg.spec.k();
    if cfg.dp_peer_num_tokens == 0 || cfg.spec.method != SpecMethod::MultiStep || k < 2 {
        return None;
    }
    let s = &cfg.scheduler;
    let num_reqs = cfg.dp_peer_num_tokens.min(s.max_num_seqs);
    let idx_mapping: Vec<i64> = (0..num_reqs as i64)
        .map(|i| if cfg.faults.has(Fault::F15) { i } else { -1 })
        .collect();
    let drafter_slot_mapping = (1..k)
        .map(|pos| {
            idx_mapping
                .iter()
                .map(|&i| match usize::try_from(i) {
                    Ok(slot) => slot_for(tables.row(slot), pos, s.page_size, s.max_model_len),
                    Err(_) => PAD_SLOT,
                })
                .collect()
        })
        .collect();
    Some(DummyStep {
        idx_mapping,
        drafter_slot_mapping,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendProfile, DrafterBatch, SpecConfig};

    /// Each capture's dummy run writes `seq_lens = max_query_len` for its rows and zeros
    /// the tail (vLLM's `_dummy_run`), then the schedule of its rows: what F12 leaves for
    /// a replay to read. Captures run largest first, so the last (one row) leaves one
    /// length of 4 and zeros, while every row's schedule is that of a 4-token row. With
    /// splits of one key, K = 3 (rows of 4 tokens) shows the value: four splits of one
    /// key, where a zero length would give one.
    #[test]
    fn the_capture_writes_max_query_len_and_its_schedule() {
        let mut cfg = EngineConfig::tiny(
            BackendProfile::FlashMla,
            SpecConfig::multi_step(3, DrafterBatch::Padded),
        );
        cfg.scheduler.page_size = 1;
        cfg.split_size_tokens = 1;
        let shapes = crate::cudagraph::graph_shapes(&cfg);
        let rows = shapes.iter().map(|s| s.num_rows).max().unwrap();
        assert!(shapes.iter().all(|s| s.max_query_len == 4), "{shapes:?}");
        let b = GraphBuffers::captured(&cfg, &shapes);
        let mut want = vec![0; rows];
        want[0] = 4;
        assert_eq!(b.seq_lens, want);
        assert_eq!(b.split_len_tokens, vec![1; rows]);
        assert_eq!(b.num_splits, vec![4; rows]);
    }
}
