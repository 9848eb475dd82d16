//! Attention metadata: the common per-batch tensors (query_start_loc, seq_lens,
//! block_table, slot_mapping) and the MLA split into a decode part and a prefill part
//! with its chunked context. Plain data, built once per step by the plan builder.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::chunked_context::ChunkedContext;
use crate::split::SplitSchedule;

/// Per-batch tensors every attention backend reads. Rows include q = 0 padding rows
/// when the step replays a graph; tokens include padding tokens (slot PAD).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommonAttentionMetadata {
    /// Prefix sums of q_len, `num_rows + 1` entries.
    pub query_start_loc: Vec<u32>,
    pub seq_lens: Vec<u32>,
    pub num_computed_tokens: Vec<u32>,
    /// Row-major `[num_rows, block_table_width]`; unused entries are `NO_BLOCK`.
    pub block_table: Vec<u32>,
    pub block_table_width: usize,
    /// One slot per token; -1 (PAD) means "do not write".
    pub slot_mapping: Vec<i64>,
    pub positions: Vec<u32>,
    pub max_query_len: usize,
    pub max_seq_len: usize,
    /// Real rows (excluding padding).
    pub num_reqs: usize,
    /// Real tokens (excluding padding).
    pub num_actual_tokens: usize,
}

impl CommonAttentionMetadata {
    /// Rows including padding rows.
    pub fn num_rows(&self) -> usize {
        self.seq_lens.len()
    }

    /// q_len of row `r`.
    pub fn query_len(&self, r: usize) -> usize {
        (self.query_start_loc[r + 1] - self.query_start_loc[r]) as usize
    }

    /// Token range of row `r`.
    pub fn row_tokens(&self, r: usize) -> Range<usize> {
        self.query_start_loc[r] as usize..self.query_start_loc[r + 1] as usize
    }

    /// Block-table row `r`.
    pub fn block_row(&self, r: usize) -> &[u32] {
        &self.block_table[r * self.block_table_width..(r + 1) * self.block_table_width]
    }
}

/// What the decode (absorbed) kernel runs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlaDecodeMetadata {
    /// Rows of the common metadata the kernel reads (q, block table, seq_lens).
    pub rows: Range<usize>,
    pub tokens: Range<usize>,
    /// The uniform q_len the kernel is launched with; `None` for a varlen kernel.
    pub uniform_query_len: Option<usize>,
    /// Rows the kernel launches over, `uniform_query_len` tokens each, reading row
    /// `rows.start + i`'s seq_len and block table for its row `i`: the decode rows, or
    /// every decode token for a single-token kernel (one row per token, as vLLM's Triton
    /// MLA decode indexes them). Past the metadata's rows a kernel row reads seq_len 0.
    pub kernel_rows: usize,
    /// seq_lens the split planner was built from, one per kernel row.
    pub plan_seq_lens: Vec<u32>,
    /// The split-KV schedule the kernel reads, one entry per kernel row: split length and
    /// count from `plan_seq_lens` under the config's policy, mapped keys from the row's
    /// block table.
    pub split: SplitSchedule,
}

/// What the prefill (materialized) path runs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlaPrefillMetadata {
    pub rows: Range<usize>,
    pub tokens: Range<usize>,
    /// Relative prefix sums over the prefill rows.
    pub query_start_loc: Vec<u32>,
    pub max_query_len: usize,
    /// Present when some prefill row has cached context.
    pub chunked_context: Option<ChunkedContext>,
}

/// The MLA split of one step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlaMetadata {
    pub num_decodes: usize,
    pub num_decode_tokens: usize,
    pub num_prefills: usize,
    pub num_prefill_tokens: usize,
    pub decode: Option<MlaDecodeMetadata>,
    pub prefill: Option<MlaPrefillMetadata>,
}
