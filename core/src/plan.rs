//! The step plan: everything a backend needs to run one target forward, built from the
//! scheduled batch by reorder, split, metadata, chunked context, graph dispatch, the
//! logits indices and the grammar masks. Backends execute it; they never re-derive it.

use serde::{Deserialize, Serialize};

use crate::batch::ScheduledBatch;
use crate::block_pool::{slot_for, NO_BLOCK, PAD_SLOT};
use crate::chunked_context::{plan_context_chunks, ChunkError};
use crate::config::{EngineConfig, Planner, RowLayout};
use crate::cudagraph::{dispatch, GraphDispatch};
use crate::fault::Fault;
use crate::grammar::{GrammarState, TokenAutomaton, TokenMask};
use crate::metadata::{
    CommonAttentionMetadata, MlaDecodeMetadata, MlaMetadata, MlaPrefillMetadata,
};
use crate::reorder::{reorder_and_split, PlanRules, Region, ReorderSplit, RowShape};

/// One real row of the plan, in execution order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedRow {
    pub req_id: u64,
    pub num_computed_tokens: usize,
    pub num_prompt_tokens: usize,
    pub query_len: usize,
    pub num_draft_tokens: usize,
    pub samples: bool,
    pub next_prompt_token: Option<u32>,
    pub region: Region,
    /// Whether the decode kernel runs this row.
    pub is_decode: bool,
}

/// A fully built target step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepPlan {
    pub step: u64,
    pub threshold: usize,
    pub require_uniform: bool,
    pub planner: Planner,
    pub layout: RowLayout,
    /// Whether vLLM's reorder moved any row.
    pub reordered: bool,
    /// Scheduled-row index of each planned row.
    pub order: Vec<usize>,
    pub rows: Vec<PlannedRow>,
    /// Token ids, padded to the graph size when a graph replays.
    pub token_ids: Vec<u32>,
    pub common: CommonAttentionMetadata,
    /// Each row's request-state slot (vLLM's `idx_mapping`), through which draft sampling
    /// writes the row's draft logits; -1 for a padding row. A replayed graph's entries are
    /// what its persistent buffer holds (`graph_buffers`).
    pub idx_mapping: Vec<i64>,
    pub mla: MlaMetadata,
    pub cudagraph: Option<GraphDispatch>,
    /// Flat token indices whose logits are sampled (the last 1 + drafts of each
    /// sampling row).
    pub logits_indices: Vec<u32>,
    /// Per row, the start of its entries in `logits_indices` (`rows + 1` entries).
    pub sample_start: Vec<u32>,
    /// Grammar mask per logits index (None: unconstrained).
    pub grammar_masks: Vec<Option<TokenMask>>,
}

impl StepPlan {
    /// Number of real tokens.
    pub fn num_tokens(&self) -> usize {
        self.common.num_actual_tokens
    }

    /// Logits entries of real row `r`.
    pub fn row_samples(&self, r: usize) -> std::ops::Range<usize> {
        self.sample_start[r] as usize..self.sample_start[r + 1] as usize
    }
}

/// Why a step cannot be planned (only reachable from hand-written batches).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Chunk(#[from] ChunkError),
}

/// Looks up a request's grammar and committed state.
pub type GrammarLookup<'a> = &'a dyn Fn(u64) -> Option<(&'a TokenAutomaton, GrammarState)>;

/// Builds the plan of one step.
pub fn build_step_plan(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    capture_sizes: &[usize],
    layout: RowLayout,
    grammar: GrammarLookup<'_>,
) -> Result<StepPlan, PlanError> {
    let threshold = cfg.reorder_batch_threshold();
    let uniform = cfg.require_uniform();
    let shapes: Vec<RowShape> = batch.rows.iter().map(|r| r.shape()).collect();
    // F10: the split ignores uniformity while the kernel stays uniform.
    let rules = PlanRules {
        planner: cfg.scheduler.planner,
        threshold,
        require_uniform: uniform && !cfg.faults.has(Fault::F10),
        layout,
    };
    let split = reorder_and_split(&shapes, rules);
    let ordered: Vec<RowShape> = split.order.iter().map(|&i| shapes[i]).collect();
    let cudagraph = dispatch(cfg, &ordered, capture_sizes);
    let rows: Vec<PlannedRow> = split
        .order
        .iter()
        .enumerate()
        .map(|(out, &i)| {
            let r = &batch.rows[i];
            PlannedRow {
                req_id: r.req_id,
                num_computed_tokens: r.num_computed_tokens,
                num_prompt_tokens: r.num_prompt_tokens,
                query_len: r.num_scheduled_tokens,
                num_draft_tokens: r.num_draft_tokens,
                samples: r.samples,
                next_prompt_token: r.next_prompt_token,
                region: split.regions[out],
                is_decode: split.decode_rows.contains(&out),
            }
        })
        .collect();
    let (common, token_ids) = build_common(cfg, batch, &split.order, cudagraph.as_ref());
    let mla = build_mla(cfg, &common, &split, cudagraph.as_ref(), uniform)?;
    let (logits_indices, sample_start) = logits_layout(&rows, &common);
    let idx_mapping = split
        .order
        .iter()
        .map(|&i| batch.rows[i].req_state_idx as i64)
        .chain(std::iter::repeat_n(-1, common.num_rows() - rows.len()))
        .collect();
    let decode_layout_q = cfg
        .faults
        .has(Fault::F9)
        .then(|| cfg.spec.uniform_decode_query_len());
    let grammar_masks = grammar_masks(&rows, &common, &token_ids, grammar, decode_layout_q);
    Ok(StepPlan {
        step: batch.step,
        threshold,
        require_uniform: uniform,
        planner: cfg.scheduler.planner,
        layout,
        reordered: split.modified,
        order: split.order,
        rows,
        token_ids,
        common,
        idx_mapping,
        mla,
        cudagraph,
        logits_indices,
        sample_start,
        grammar_masks,
    })
}

fn build_common(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    order: &[usize],
    graph: Option<&GraphDispatch>,
) -> (CommonAttentionMetadata, Vec<u32>) {
    let s = &cfg.scheduler;
    let width = s.max_blocks_per_seq();
    let pad_rows = graph.map_or(0, |g| g.num_padding_rows);
    let pad_tokens = graph.map_or(0, |g| g.num_padding_tokens);
    let n = order.len() + pad_rows;
    let num_tokens = batch.num_tokens();
    let mut m = CommonAttentionMetadata {
        query_start_loc: Vec::with_capacity(n + 1),
        seq_lens: Vec::with_capacity(n),
        num_computed_tokens: Vec::with_capacity(n),
        block_table: vec![NO_BLOCK; n * width],
        block_table_width: width,
        slot_mapping: Vec::with_capacity(num_tokens + pad_tokens),
        positions: Vec::with_capacity(num_tokens + pad_tokens),
        max_query_len: 0,
        max_seq_len: 0,
        num_reqs: order.len(),
        num_actual_tokens: num_tokens,
    };
    let mut token_ids = Vec::with_capacity(num_tokens + pad_tokens);
    m.query_start_loc.push(0);
    for (out, &i) in order.iter().enumerate() {
        let r = &batch.rows[i];
        let q = r.num_scheduled_tokens;
        let blocks = &r.block_ids[..r.block_ids.len().min(width)];
        m.block_table[out * width..][..blocks.len()].copy_from_slice(blocks);
        for pos in r.num_computed_tokens..r.seq_len() {
            m.positions.push(pos as u32);
            m.slot_mapping
                .push(slot_for(blocks, pos, s.page_size, s.max_model_len));
        }
        token_ids.extend_from_slice(&r.token_ids);
        m.query_start_loc.push(m.query_start_loc[out] + q as u32);
        m.seq_lens.push(r.seq_len() as u32);
        m.num_computed_tokens.push(r.num_computed_tokens as u32);
        m.max_query_len = m.max_query_len.max(q);
        m.max_seq_len = m.max_seq_len.max(r.seq_len());
    }
    for _ in 0..pad_rows {
        m.query_start_loc.push(num_tokens as u32);
        m.seq_lens.push(0);
        m.num_computed_tokens.push(0);
    }
    for _ in 0..pad_tokens {
        m.positions.push(0);
        m.slot_mapping.push(PAD_SLOT);
        token_ids.push(0);
    }
    (m, token_ids)
}

fn build_mla(
    cfg: &EngineConfig,
    common: &CommonAttentionMetadata,
    split: &ReorderSplit,
    graph: Option<&GraphDispatch>,
    uniform: bool,
) -> Result<MlaMetadata, PlanError> {
    let qsl = &common.query_start_loc;
    let n_rows = common.num_rows();
    let dec = split.decode_rows.clone();
    let pre = split.prefill_rows.clone();
    // A replayed graph runs every row, padding included, through the decode kernel.
    let dec_rows = if graph.is_some() {
        0..n_rows
    } else {
        dec.clone()
    };
    let decode = (!dec_rows.is_empty()).then(|| {
        let tokens = qsl[dec_rows.start] as usize..qsl[dec_rows.end] as usize;
        // A single-token kernel runs a row per token; a verify row reaches it only under
        // F14, unexpanded, so its tokens read the rows after it.
        let single = cfg.single_token_decode_kernel() && graph.is_none();
        let kernel_rows = if single { tokens.len() } else { dec_rows.len() };
        // F8: the split planner sees every row's seq_len, not the decode rows'.
        let planned = if cfg.faults.has(Fault::F8) {
            0..n_rows
        } else {
            dec_rows.start..dec_rows.start + kernel_rows
        };
        let plan_seq_lens: Vec<u32> = planned
            .map(|r| common.seq_lens.get(r).copied().unwrap_or(0))
            .collect();
        // Kernel row i reads table row `rows.start + i` (none past the metadata's rows).
        let width = common.block_table_width;
        let tables = common
            .block_table
            .get(dec_rows.start * width..)
            .unwrap_or(&[]);
        MlaDecodeMetadata {
            tokens,
            uniform_query_len: if single {
                Some(1)
            } else {
                uniform.then(|| common.query_len(dec_rows.start))
            },
            kernel_rows,
            split: cfg.split_policy().schedule(
                &plan_seq_lens,
                tables,
                width,
                cfg.scheduler.page_size,
            ),
            plan_seq_lens,
            rows: dec_rows.clone(),
        }
    });
    let prefill = if pre.is_empty() {
        None
    } else {
        let base = qsl[pre.start];
        let ctx: Vec<usize> = pre
            .clone()
            .map(|r| common.num_computed_tokens[r] as usize)
            .collect();
        Some(MlaPrefillMetadata {
            tokens: base as usize..qsl[pre.end] as usize,
            query_start_loc: qsl[pre.start..=pre.end].iter().map(|&x| x - base).collect(),
            max_query_len: pre.clone().map(|r| common.query_len(r)).max().unwrap_or(0),
            chunked_context: plan_context_chunks(
                &ctx,
                cfg.scheduler.workspace_tokens,
                cfg.scheduler.page_size,
            )?,
            rows: pre.clone(),
        })
    };
    let num_decode_tokens = (qsl[dec.end] - qsl[dec.start]) as usize;
    Ok(MlaMetadata {
        num_decodes: dec.len(),
        num_decode_tokens,
        num_prefills: pre.len(),
        num_prefill_tokens: common.num_actual_tokens - num_decode_tokens,
        decode,
        prefill,
    })
}

fn logits_layout(rows: &[PlannedRow], common: &CommonAttentionMetadata) -> (Vec<u32>, Vec<u32>) {
    let mut indices = Vec::new();
    let mut start = Vec::with_capacity(rows.len() + 1);
    start.push(0);
    for (r, row) in rows.iter().enumerate() {
        if row.samples {
            let end = common.query_start_loc[r + 1];
            let first = end - 1 - row.num_draft_tokens as u32;
            indices.extend(first..end);
        }
        start.push(indices.len() as u32);
    }
    (indices, start)
}

/// Masks derive from each row's own draft tokens, located through query_start_loc, so
/// they are right for any row layout (mixed batches included).
fn grammar_masks(
    rows: &[PlannedRow],
    common: &CommonAttentionMetadata,
    token_ids: &[u32],
    lookup: GrammarLookup<'_>,
    decode_layout_q: Option<usize>,
) -> Vec<Option<TokenMask>> {
    let mut out = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        if !row.samples {
            continue;
        }
        let end = match decode_layout_q {
            // F9: row r assumed at [r * (1 + K), (r + 1) * (1 + K)), as in a pure decode batch.
            Some(q) => ((r + 1) * q).clamp(row.num_draft_tokens, token_ids.len()),
            None => common.query_start_loc[r + 1] as usize,
        };
        let drafts = &token_ids[end - row.num_draft_tokens..end];
        match lookup(row.req_id) {
            Some((a, state)) => out.extend(a.verify_masks(state, drafts).into_iter().map(Some)),
            None => out.extend(std::iter::repeat_n(None, drafts.len() + 1)),
        }
    }
    out
}
