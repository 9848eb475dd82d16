//! Drafter inputs (RULES §6): the padded and compacted multi-step drafter passes
//! (MTP/EAGLE) and the DFlash block pass, built from the target plan and what
//! verification settled for each row.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::block_pool::{slot_for, NO_BLOCK, PAD_SLOT};
use crate::config::{DrafterBatch, EngineConfig};
use crate::fault::{Fault, Faults};
use crate::plan::StepPlan;
use crate::split::SplitSchedule;

/// What this step settled for one planned row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowOutcome {
    /// Tokens of the row now committed: 1 + accepted for a verify row, q for a prefill.
    pub valid: usize,
    /// The bonus token, or the next prompt token for a partial prefill chunk.
    pub next_token: u32,
    /// `n_rej = drafts + 1 - valid` for a row that had drafts, else 0.
    pub num_rejected: usize,
}

/// Where a drafter token's input hidden state comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HiddenSource {
    /// The target's final hidden state at this flat token index.
    TargetToken(u32),
    /// The previous drafter pass's hidden state at its sampled token of this row.
    DrafterRow(u32),
}

/// One multi-step drafter pass over its own paged cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrafterPass {
    /// 0 for the pass over the target's layout, then 1..K-1.
    pub pass: usize,
    pub mode: DrafterBatch,
    pub req_ids: Vec<u64>,
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub slot_mapping: Vec<i64>,
    pub hidden: Vec<HiddenSource>,
    pub query_start_loc: Vec<u32>,
    pub seq_lens: Vec<u32>,
    /// Shared by every pass of a step (rows never change between passes).
    pub block_table: Arc<Vec<u32>>,
    pub block_table_width: usize,
    pub token_indices_to_sample: Vec<u32>,
    /// Rejected tokens still in each row (padded mode, pass 0 only).
    pub num_rejected: Vec<u32>,
    /// Keys each row's sampled token attends to, derived as the engine's attention
    /// metadata does from `seq_lens`: the row's seq_len less the row's tokens after the
    /// sampled one, capped at `max_model_len` (nothing past it was ever written).
    pub kv_lens: Vec<u32>,
    /// The drafter's split-KV schedule over `kv_lens`, under the target's policy.
    pub split: SplitSchedule,
    /// Input rows after data-parallel padding: this pass's tokens, or the busiest
    /// rank's count if larger (`dp_peer_num_tokens`). The rows past the tokens are
    /// padding: no slot, no sample.
    pub num_padded_tokens: usize,
    /// The attention metadata's token count: `query_start_loc`'s last entry, never the
    /// padded count (F16 uses the padded count).
    pub num_actual_tokens: usize,
}

impl DrafterPass {
    pub fn num_rows(&self) -> usize {
        self.req_ids.len()
    }

    /// Fills `kv_lens` and the split plan from `seq_lens`, `query_start_loc` and the
    /// sampled indices, as the drafter's attention metadata builder does, then the
    /// data-parallel padded and actual token counts.
    fn plan_keys(&mut self, cfg: &EngineConfig) {
        let max_len = cfg.scheduler.max_model_len;
        self.kv_lens = (0..self.num_rows())
            .map(|r| {
                let end = self.query_start_loc[r + 1] as usize;
                let after = end - 1 - self.token_indices_to_sample[r] as usize;
                (self.seq_lens[r] as usize)
                    .saturating_sub(after)
                    .min(max_len) as u32
            })
            .collect();
        self.split = cfg.split_policy().schedule(
            &self.kv_lens,
            &self.block_table,
            self.block_table_width,
            cfg.scheduler.page_size,
        );
        self.pad_for_data_parallel(cfg);
    }

    /// DP sync pads the pass's input rows to the busiest rank's token count. The
    /// attention metadata keeps the real count: vLLM #55458 fixed the draft decode
    /// passes (1..K-1), which took the padded count; F16 brings that back.
    fn pad_for_data_parallel(&mut self, cfg: &EngineConfig) {
        let tokens = self.token_ids.len();
        self.num_padded_tokens = tokens.max(cfg.dp_peer_num_tokens);
        let leak = self.pass > 0 && cfg.faults.has(Fault::F16);
        self.num_actual_tokens = if leak { self.num_padded_tokens } else { tokens };
    }
    pub fn block_row(&self, r: usize) -> &[u32] {
        &self.block_table[r * self.block_table_width..(r + 1) * self.block_table_width]
    }
}

/// The first drafter pass. Inputs are shifted by one (position p consumes token p + 1
/// and the target's hidden state at p) with the next token written at the last valid
/// index. Padded keeps rejected tokens and samples at `query_start_loc[r+1] - 1 - n_rej`;
/// compacted drops them and recomputes slots.
pub fn first_pass(
    cfg: &EngineConfig,
    plan: &StepPlan,
    outcomes: &[RowOutcome],
    mode: DrafterBatch,
) -> DrafterPass {
    let c = &plan.common;
    let n = plan.rows.len();
    let width = c.block_table_width;
    let mut p = DrafterPass {
        pass: 0,
        mode,
        req_ids: plan.rows.iter().map(|r| r.req_id).collect(),
        token_ids: Vec::with_capacity(c.num_actual_tokens),
        positions: Vec::with_capacity(c.num_actual_tokens),
        slot_mapping: Vec::with_capacity(c.num_actual_tokens),
        hidden: Vec::with_capacity(c.num_actual_tokens),
        query_start_loc: Vec::with_capacity(n + 1),
        seq_lens: Vec::with_capacity(n),
        block_table: Arc::new(c.block_table[..n * width].to_vec()),
        block_table_width: width,
        token_indices_to_sample: Vec::with_capacity(n),
        num_rejected: Vec::with_capacity(n),
        kv_lens: Vec::new(),
        split: SplitSchedule::default(),
        num_padded_tokens: 0,
        num_actual_tokens: 0,
    };
    p.query_start_loc.push(0);
    for (r, o) in outcomes.iter().enumerate() {
        let toks = c.row_tokens(r);
        let q = match mode {
            DrafterBatch::Padded => toks.len(),
            DrafterBatch::Compacted => o.valid,
        };
        for i in 0..q {
            let t = toks.start + i;
            let token = if i + 1 == o.valid {
                o.next_token
            } else if i + 1 < toks.len() {
                plan.token_ids[t + 1]
            } else {
                o.next_token
            };
            p.token_ids.push(token);
            p.positions.push(c.positions[t]);
            p.slot_mapping.push(match mode {
                DrafterBatch::Padded => c.slot_mapping[t],
                DrafterBatch::Compacted => slot_for(
                    c.block_row(r),
                    c.positions[t] as usize,
                    cfg.scheduler.page_size,
                    cfg.scheduler.max_model_len,
                ),
            });
            p.hidden.push(HiddenSource::TargetToken(t as u32));
        }
        let start = *p.query_start_loc.last().expect("starts with 0");
        p.query_start_loc.push(start + q as u32);
        p.seq_lens.push(c.num_computed_tokens[r] + q as u32);
        let n_rej = if mode == DrafterBatch::Padded {
            o.num_rejected
        } else {
            0
        };
        p.token_indices_to_sample
            .push(start + q as u32 - 1 - n_rej as u32);
        p.num_rejected.push(n_rej as u32);
    }
    p.plan_keys(cfg);
    p
}

/// The next single-token pass: each row feeds its proposal at the sampled position + 1.
/// `seq_len -= n_rej` is applied once, on the first of these passes (forgetting it is
/// bug F4), then `seq_len += 1`; a position at or past `max_model_len` gets PAD.
pub fn next_pass(cfg: &EngineConfig, prev: &DrafterPass, proposals: &[u32]) -> DrafterPass {
    let n = prev.num_rows();
    let mut p = DrafterPass {
        pass: prev.pass + 1,
        mode: prev.mode,
        req_ids: prev.req_ids.clone(),
        token_ids: proposals.to_vec(),
        positions: Vec::with_capacity(n),
        slot_mapping: Vec::with_capacity(n),
        hidden: (0..n as u32).map(HiddenSource::DrafterRow).collect(),
        query_start_loc: (0..=n as u32).collect(),
        seq_lens: Vec::with_capacity(n),
        block_table: Arc::clone(&prev.block_table),
        block_table_width: prev.block_table_width,
        token_indices_to_sample: (0..n as u32).collect(),
        num_rejected: vec![0; n],
        kv_lens: Vec::new(),
        split: SplitSchedule::default(),
        num_padded_tokens: 0,
        num_actual_tokens: 0,
    };
    for r in 0..n {
        let pos = prev.positions[prev.token_indices_to_sample[r] as usize] + 1;
        let n_rej = if cfg.faults.has(Fault::F4) {
            0
        } else {
            prev.num_rejected[r]
        };
        let seq_len = prev.seq_lens[r] - n_rej + 1;
        p.positions.push(pos);
        p.seq_lens.push(seq_len);
        p.slot_mapping.push(slot_for(
            prev.block_row(r),
            pos as usize,
            cfg.scheduler.page_size,
            cfg.scheduler.max_model_len,
        ));
    }
    p.plan_keys(cfg);
    p
}

/// The DFlash block pass: this step's committed tokens become drafter context (their
/// target hidden states written straight into the drafter cache), and each row's query
/// block `[next token, mask x K]` at positions `last_valid + 1 ..= last_valid + 1 + K`
/// attends non-causally to the context and the whole block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DFlashPass {
    pub req_ids: Vec<u64>,
    pub context_token_indices: Vec<u32>,
    pub context_positions: Vec<u32>,
    pub context_slots: Vec<i64>,
    /// Per row prefix sums into the context arrays.
    pub context_start_loc: Vec<u32>,
    /// Cached context each row attends to: `last_valid + 1`.
    pub context_lens: Vec<u32>,
    /// 1 + K.
    pub block_len: usize,
    /// `[rows * block_len]`: Some(next token) at offset 0, None (mask) after.
    pub block_tokens: Vec<Option<u32>>,
    pub block_positions: Vec<u32>,
    pub block_slots: Vec<i64>,
    /// Block-table index each block position was looked up at (must be < width).
    pub block_indices: Vec<u32>,
    pub block_table: Vec<u32>,
    pub block_table_width: usize,
    /// Flat block positions (`row * block_len + offset`) whose logits the pass returns,
    /// in order: offsets 1..=K of every row (offset 0 holds the known next token).
    pub sample_indices: Vec<u32>,
    /// Keys each row's block attends to: its cached context plus the whole block.
    pub kv_lens: Vec<u32>,
    /// The split-KV schedule of the block attention over `kv_lens`, under the target's
    /// policy.
    pub split: SplitSchedule,
}

/// The DFlash slot rule: PAD at or past `max_model_len`; otherwise the block index is
/// clamped to the table width (an unclamped index reads past the row: bug F5).
pub fn dflash_slot(block_row: &[u32], pos: usize, page_size: usize, max_model_len: usize) -> i64 {
    if pos >= max_model_len {
        return PAD_SLOT;
    }
    let block = (pos / page_size).min(block_row.len() - 1);
    match block_row[block] {
        NO_BLOCK => PAD_SLOT,
        b => b as i64 * page_size as i64 + (pos % page_size) as i64,
    }
}

/// The slot lookup as the DFlash kernel does it, over the flat `[rows, width]` table:
/// returns the block index it read and the slot. Without faults it equals
/// [`dflash_slot`] on the row. F5 drops the clamp, so the index runs past the row into
/// the next one; F6 drops the PAD rule at or past `max_model_len`.
#[allow(clippy::too_many_arguments)]
pub fn dflash_lookup(
    table: &[u32],
    width: usize,
    row: usize,
    pos: usize,
    page_size: usize,
    max_model_len: usize,
    faults: Faults,
) -> (u32, i64) {
    let mut block = pos / page_size;
    if !faults.has(Fault::F5) {
        block = block.min(width - 1);
    }
    if pos >= max_model_len && !faults.has(Fault::F6) {
        return (block as u32, PAD_SLOT);
    }
    match table.get(row * width + block) {
        Some(&b) if b != NO_BLOCK => (
            block as u32,
            b as i64 * page_size as i64 + (pos % page_size) as i64,
        ),
        _ => (block as u32, PAD_SLOT),
    }
}

/// Builds the DFlash pass for every planned row.
pub fn dflash_pass(cfg: &EngineConfig, plan: &StepPlan, outcomes: &[RowOutcome]) -> DFlashPass {
    let c = &plan.common;
    let n = plan.rows.len();
    let k = cfg.spec.k();
    let width = c.block_table_width;
    let mut p = DFlashPass {
        req_ids: plan.rows.iter().map(|r| r.req_id).collect(),
        context_token_indices: Vec::new(),
        context_positions: Vec::new(),
        context_slots: Vec::new(),
        context_start_loc: vec![0],
        context_lens: Vec::with_capacity(n),
        block_len: 1 + k,
        block_tokens: Vec::with_capacity(n * (1 + k)),
        block_positions: Vec::with_capacity(n * (1 + k)),
        block_slots: Vec::with_capacity(n * (1 + k)),
        block_indices: Vec::with_capacity(n * (1 + k)),
        block_table: c.block_table[..n * width].to_vec(),
        block_table_width: width,
        sample_indices: Vec::with_capacity(n * k),
        kv_lens: Vec::with_capacity(n),
        split: SplitSchedule::default(),
    };
    for (r, o) in outcomes.iter().enumerate() {
        let toks = c.row_tokens(r);
        for t in toks.start..toks.start + o.valid {
            p.context_token_indices.push(t as u32);
            p.context_positions.push(c.positions[t]);
            p.context_slots.push(c.slot_mapping[t]);
        }
        p.context_start_loc
            .push(p.context_token_indices.len() as u32);
        let last_valid = c.num_computed_tokens[r] as usize + o.valid - 1;
        p.context_lens.push(last_valid as u32 + 1);
        p.kv_lens.push((last_valid + 1 + 1 + k) as u32);
        p.sample_indices
            .extend((1..=k).map(|i| (r * (1 + k) + i) as u32));
        for i in 0..=k {
            let pos = last_valid + 1 + i;
            p.block_tokens.push((i == 0).then_some(o.next_token));
            p.block_positions.push(pos as u32);
            let (block, slot) = dflash_lookup(
                &c.block_table,
                width,
                r,
                pos,
                cfg.scheduler.page_size,
                cfg.scheduler.max_model_len,
                cfg.faults,
            );
            p.block_indices.push(block);
            p.block_slots.push(slot);
        }
    }
    p.split =
        cfg.split_policy()
            .schedule(&p.kv_lens, &p.block_table, width, cfg.scheduler.page_size);
    p
}
