//! The scheduler's output: which requests run this step and with how many tokens.
//! Plain data; the plan builder turns it into metadata.

use serde::{Deserialize, Serialize};

/// One scheduled request row, before reorder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledRow {
    pub req_id: u64,
    pub num_computed_tokens: usize,
    /// The request's prompt length (vLLM's `num_prompt_tokens`): the four-region reorder
    /// and graph dispatch tell a finished prompt from a chunked prefill by it.
    pub num_prompt_tokens: usize,
    /// This step's q_len (committed tokens plus drafts).
    pub num_scheduled_tokens: usize,
    /// The q_len tokens: committed tokens from `num_computed_tokens`, then drafts.
    pub token_ids: Vec<u32>,
    /// How many of the tokens (the tail) are draft tokens to verify.
    pub num_draft_tokens: usize,
    /// Whether the row ends at the request's last token, so it samples.
    pub samples: bool,
    /// The next prompt token after this chunk when the row does not sample (a partial
    /// prefill chunk); the drafter's shifted input needs it.
    pub next_prompt_token: Option<u32>,
    /// The request's block ids (target and drafter caches share them).
    pub block_ids: Vec<u32>,
    /// The request's slot in the worker's persistent per-request state (vLLM's
    /// `req_state_idx`): the scheduler's slot, taken when the request arrives, kept
    /// across preemption (vLLM frees it there), given back when it finishes, reused by
    /// the next arrival. Per-slot tables keep what the last owner left (`graph_buffers`).
    pub req_state_idx: usize,
}

impl ScheduledRow {
    /// `seq_len = num_computed_tokens + q_len`.
    pub fn seq_len(&self) -> usize {
        self.num_computed_tokens + self.num_scheduled_tokens
    }

    /// What the reorder reads of this row.
    pub fn shape(&self) -> crate::reorder::RowShape {
        crate::reorder::RowShape {
            num_computed_tokens: self.num_computed_tokens,
            num_scheduled_tokens: self.num_scheduled_tokens,
            num_prompt_tokens: self.num_prompt_tokens,
        }
    }
}

/// Everything scheduled for one step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledBatch {
    pub step: u64,
    pub rows: Vec<ScheduledRow>,
    /// Requests preempted (recompute) while scheduling this step.
    pub preempted: Vec<u64>,
}

impl ScheduledBatch {
    /// Sum of q_len over rows.
    pub fn num_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.num_scheduled_tokens).sum()
    }
}
