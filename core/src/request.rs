//! Requests: their tokens, progress, drafts, blocks and grammar state.

use crate::grammar::RequestGrammar;

/// What a workload asks for: one request to admit at `arrival_step`.
#[derive(Clone, Debug)]
pub struct RequestSpec {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    pub arrival_step: u64,
    pub grammar: Option<RequestGrammar>,
}

/// Lifecycle of a request inside the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestStatus {
    Waiting,
    Running,
    Finished,
}

/// One sequence. Token at position i is `prompt ++ output` at i; the last output token
/// (the bonus) has no KV yet, so a decoding request has
/// `num_computed_tokens == num_tokens() - 1`.
#[derive(Clone, Debug)]
pub struct Request {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
    pub max_new_tokens: usize,
    pub num_computed_tokens: usize,
    /// Draft tokens proposed last step, verified this step.
    pub drafts: Vec<u32>,
    /// The drafter's probabilities for each draft (only with temperature > 0).
    pub draft_probs: Vec<Vec<f32>>,
    pub block_ids: Vec<u32>,
    pub grammar: Option<RequestGrammar>,
    pub status: RequestStatus,
    pub num_preemptions: u32,
}

impl Request {
    /// A waiting request built from its spec.
    pub fn new(spec: RequestSpec) -> Self {
        Self {
            id: spec.id,
            prompt: spec.prompt,
            output: Vec::new(),
            max_new_tokens: spec.max_new_tokens,
            num_computed_tokens: 0,
            drafts: Vec::new(),
            draft_probs: Vec::new(),
            block_ids: Vec::new(),
            grammar: spec.grammar,
            status: RequestStatus::Waiting,
            num_preemptions: 0,
        }
    }

    /// Prompt plus output tokens.
    pub fn num_tokens(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// Token at `pos` of `prompt ++ output`.
    pub fn token_at(&self, pos: usize) -> u32 {
        if pos < self.prompt.len() {
            self.prompt[pos]
        } else {
            self.output[pos - self.prompt.len()]
        }
    }

    /// Whether the request still has prompt (or recomputed) tokens to prefill beyond the
    /// single pending bonus token.
    pub fn is_prefilling(&self) -> bool {
        self.num_computed_tokens + 1 < self.num_tokens()
    }
}
