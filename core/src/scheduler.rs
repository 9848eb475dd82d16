//! The scheduler: admits requests, builds mixed batches with chunked prefill under the
//! token, row and block budgets, preempts by recompute when blocks run out, and commits
//! verified tokens back (rolling back the blocks of rejected ones).

use std::collections::{BTreeMap, VecDeque};

use crate::batch::{ScheduledBatch, ScheduledRow};
use crate::block_pool::BlockPool;
use crate::config::EngineConfig;
use crate::request::{Request, RequestSpec, RequestStatus};

/// A request's result once it finishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedRequest {
    pub id: u64,
    pub prompt_len: usize,
    pub output: Vec<u32>,
    pub num_preemptions: u32,
}

/// Owns every live request and the block pool. Requests live in a slab so the per-row
/// scheduling path indexes directly; ids map to slots only at the API boundary.
#[derive(Clone, Debug)]
pub struct Scheduler {
    cfg: EngineConfig,
    pool: BlockPool,
    /// Not yet arrived, sorted by arrival step (stable by id).
    pending: VecDeque<RequestSpec>,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    slab: Vec<Option<Request>>,
    free_slots: Vec<usize>,
    index: BTreeMap<u64, usize>,
    finished: Vec<FinishedRequest>,
    step: u64,
    /// Tokens scheduled so far in the step being built (re-summing the batch per row
    /// made scheduling quadratic).
    step_tokens: usize,
}

/// Tokens committed to a request by verification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    pub req_id: u64,
    /// q_len of the row as scheduled.
    pub num_scheduled_tokens: usize,
    pub num_draft_tokens: usize,
    /// Accepted drafts followed by the bonus token; empty for a partial prefill chunk.
    pub new_tokens: Vec<u32>,
}

impl Scheduler {
    /// A scheduler over `workload`, which must be valid for `cfg` (see [`validate_workload`]).
    pub fn new(cfg: EngineConfig, mut workload: Vec<RequestSpec>) -> Self {
        workload.sort_by_key(|r| (r.arrival_step, r.id));
        let pool = BlockPool::new(cfg.scheduler.num_gpu_blocks);
        Self {
            cfg,
            pool,
            pending: workload.into(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            slab: Vec::new(),
            free_slots: Vec::new(),
            index: BTreeMap::new(),
            finished: Vec::new(),
            step: 0,
            step_tokens: 0,
        }
    }

    /// Whether every request has finished.
    pub fn is_done(&self) -> bool {
        self.pending.is_empty() && self.index.is_empty()
    }

    /// A live request by id.
    pub fn request(&self, id: u64) -> Option<&Request> {
        self.index.get(&id).map(|&s| self.req(s))
    }

    /// Live requests in id order.
    pub fn requests(&self) -> impl Iterator<Item = &Request> {
        self.index.values().map(|&s| self.req(s))
    }

    /// Free blocks in the pool.
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    /// Finished requests since the last call (keeps memory bounded on long runs).
    pub fn take_finished(&mut self) -> Vec<FinishedRequest> {
        std::mem::take(&mut self.finished)
    }

    fn req(&self, slot: usize) -> &Request {
        self.slab[slot].as_ref().expect("live slot")
    }

    fn req_mut(&mut self, slot: usize) -> &mut Request {
        self.slab[slot].as_mut().expect("live slot")
    }

    /// Positions past the scheduled tokens that the drafter writes this step: up to
    /// K + 1 (the DFlash block ends at `last_valid + 1 + K`).
    fn lookahead_tokens(&self) -> usize {
        if self.cfg.spec.enabled() {
            self.cfg.spec.k() + 1
        } else {
            0
        }
    }

    fn admit_arrivals(&mut self, step: u64) {
        while self.pending.front().is_some_and(|r| r.arrival_step <= step) {
            let spec = self.pending.pop_front().expect("front checked");
            let id = spec.id;
            let slot = match self.free_slots.pop() {
                Some(s) => s,
                None => {
                    self.slab.push(None);
                    self.slab.len() - 1
                }
            };
            self.slab[slot] = Some(Request::new(spec));
            self.index.insert(id, slot);
            self.waiting.push_back(slot);
        }
    }

    /// Schedules the next step.
    pub fn schedule(&mut self) -> ScheduledBatch {
        let step = self.step;
        self.step += 1;
        self.admit_arrivals(step);
        let mut batch = ScheduledBatch {
            step,
            ..Default::default()
        };
        self.step_tokens = 0;
        if self.cfg.scheduler.mixed_batches {
            self.schedule_running(&mut batch, |_| true);
            if batch.preempted.is_empty() {
                self.schedule_waiting(&mut batch);
            }
            return batch;
        }
        // Unmixed (SGLang-style prefill priority): a step is all prefill or all decode.
        self.schedule_running(&mut batch, |r| r.is_prefilling());
        if batch.preempted.is_empty() {
            self.schedule_waiting(&mut batch);
        }
        if batch.rows.is_empty() {
            self.schedule_running(&mut batch, |r| !r.is_prefilling());
        }
        batch
    }

    fn token_budget_left(&self) -> usize {
        self.cfg.scheduler.max_num_batched_tokens - self.step_tokens
    }

    fn schedule_running(
        &mut self,
        batch: &mut ScheduledBatch,
        eligible: impl Fn(&Request) -> bool,
    ) {
        let mut i = 0;
        while i < self.running.len() {
            let slot = self.running[i];
            let budget = self.token_budget_left();
            if budget == 0 || batch.rows.len() >= self.cfg.scheduler.max_num_seqs {
                break;
            }
            let req = self.req(slot);
            // The unmixed second pass takes non-prefilling requests only, and a request
            // scheduled in the first pass is still prefilling, so no row repeats.
            if !eligible(req) {
                i += 1;
                continue;
            }
            let (q, nd) = self.running_query_len(req, budget);
            if q == 0 {
                i += 1;
                continue;
            }
            if !self.reserve_blocks(slot, q, batch) {
                // The request preempted itself: it is no longer at index i.
                continue;
            }
            self.push_row(batch, slot, q, nd);
            i += 1;
        }
    }

    /// q_len and draft count for a running request under `budget` tokens.
    fn running_query_len(&self, req: &Request, budget: usize) -> (usize, usize) {
        let remaining = req.num_tokens() - req.num_computed_tokens;
        if req.is_prefilling() {
            return (self.prefill_chunk(remaining, budget), 0);
        }
        let nd = req.drafts.len().min(budget.saturating_sub(1));
        (1 + nd, nd)
    }

    fn prefill_chunk(&self, remaining: usize, budget: usize) -> usize {
        let s = &self.cfg.scheduler;
        if s.chunked_prefill {
            remaining.min(s.prefill_chunk_tokens).min(budget)
        } else if remaining <= budget {
            remaining
        } else {
            0
        }
    }

    /// Grows the blocks of the request in `slot` for q tokens plus drafter lookahead,
    /// preempting from the tail of the running list. Returns false if the request
    /// itself had to be preempted.
    fn reserve_blocks(&mut self, slot: usize, q: usize, batch: &mut ScheduledBatch) -> bool {
        let (page, max_len) = (
            self.cfg.scheduler.page_size,
            self.cfg.scheduler.max_model_len,
        );
        let lookahead = self.lookahead_tokens();
        loop {
            let req = self.slab[slot].as_mut().expect("running request is live");
            let need = (req.num_computed_tokens + q + lookahead).min(max_len);
            if self.pool.grow_to(&mut req.block_ids, need, page) {
                return true;
            }
            let victim = *self.running.last().expect("the request is running");
            batch.preempted.push(self.req(victim).id);
            self.preempt(victim);
            if victim == slot {
                return false;
            }
        }
    }

    fn preempt(&mut self, slot: usize) {
        let req = self.slab[slot].as_mut().expect("victim is live");
        self.pool.release(&mut req.block_ids);
        req.num_computed_tokens = 0;
        req.drafts.clear();
        req.draft_probs.clear();
        req.status = RequestStatus::Waiting;
        req.num_preemptions += 1;
        self.running.retain(|&r| r != slot);
        self.waiting.push_front(slot);
    }

    fn schedule_waiting(&mut self, batch: &mut ScheduledBatch) {
        let (page, max_len) = (
            self.cfg.scheduler.page_size,
            self.cfg.scheduler.max_model_len,
        );
        let lookahead = self.lookahead_tokens();
        while let Some(&slot) = self.waiting.front() {
            let budget = self.token_budget_left();
            if budget == 0 || batch.rows.len() >= self.cfg.scheduler.max_num_seqs {
                break;
            }
            let q = self.prefill_chunk(self.req(slot).num_tokens(), budget);
            if q == 0 {
                break;
            }
            let req = self.slab[slot].as_mut().expect("waiting request is live");
            if !self
                .pool
                .grow_to(&mut req.block_ids, (q + lookahead).min(max_len), page)
            {
                break;
            }
            req.status = RequestStatus::Running;
            self.waiting.pop_front();
            self.running.push(slot);
            self.push_row(batch, slot, q, 0);
        }
    }

    fn push_row(&mut self, batch: &mut ScheduledBatch, slot: usize, q: usize, nd: usize) {
        self.step_tokens += q;
        batch.rows.push(make_row(self.req(slot), slot, q, nd));
    }

    /// Applies verification results: advances progress, appends tokens, advances grammar
    /// state, finishes requests, and rolls back blocks that only held rejected tokens
    /// (keeping the drafter's lookahead).
    pub fn commit(&mut self, commits: &[Commit]) {
        let (page, max_len) = (
            self.cfg.scheduler.page_size,
            self.cfg.scheduler.max_model_len,
        );
        let k = self.lookahead_tokens();
        for c in commits {
            let Some(&slot) = self.index.get(&c.req_id) else {
                continue;
            };
            let req = self.slab[slot].as_mut().expect("indexed slot is live");
            let accepted = c.new_tokens.len().saturating_sub(1);
            req.num_computed_tokens += c.num_scheduled_tokens - c.num_draft_tokens + accepted;
            req.drafts.clear();
            req.draft_probs.clear();
            for &t in &c.new_tokens {
                if let Some(g) = req.grammar.as_mut() {
                    g.state = g.automaton.advance(g.state, t);
                }
                req.output.push(t);
            }
            if req.output.len() >= req.max_new_tokens || req.num_tokens() >= max_len {
                req.output.truncate(req.max_new_tokens);
                self.finish(slot);
            } else {
                let keep = (req.num_computed_tokens + k).min(max_len);
                self.pool.shrink_to(&mut req.block_ids, keep, page);
            }
        }
    }

    fn finish(&mut self, slot: usize) {
        let mut req = self.slab[slot].take().expect("finishing a live request");
        self.pool.release(&mut req.block_ids);
        self.running.retain(|&r| r != slot);
        self.index.remove(&req.id);
        self.free_slots.push(slot);
        self.finished.push(FinishedRequest {
            id: req.id,
            prompt_len: req.prompt.len(),
            output: req.output,
            num_preemptions: req.num_preemptions,
        });
    }

    /// Stores next step's drafts for a request, clipped so every draft position stays
    /// below `max_model_len`.
    pub fn set_drafts(&mut self, req_id: u64, mut drafts: Vec<u32>, mut probs: Vec<Vec<f32>>) {
        let max_len = self.cfg.scheduler.max_model_len;
        let Some(&slot) = self.index.get(&req_id) else {
            return;
        };
        let req = self.req_mut(slot);
        let room = max_len.saturating_sub(req.num_tokens() + 1);
        drafts.truncate(room);
        probs.truncate(room);
        req.drafts = drafts;
        req.draft_probs = probs;
    }
}

fn make_row(req: &Request, req_state_idx: usize, q: usize, nd: usize) -> ScheduledRow {
    let start = req.num_computed_tokens;
    let committed = q - nd;
    let mut token_ids = Vec::with_capacity(q);
    token_ids.extend((start..start + committed).map(|p| req.token_at(p)));
    token_ids.extend_from_slice(&req.drafts[..nd]);
    let end = start + committed;
    let samples = end == req.num_tokens();
    ScheduledRow {
        req_id: req.id,
        num_computed_tokens: start,
        num_prompt_tokens: req.prompt.len(),
        num_scheduled_tokens: q,
        token_ids,
        num_draft_tokens: nd,
        samples,
        next_prompt_token: (!samples).then(|| req.token_at(end)),
        block_ids: req.block_ids.clone(),
        req_state_idx,
    }
}

/// Why a workload cannot run under a config.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error("request ids must be unique (id {0} repeats)")]
    DuplicateId(u64),
    #[error("request {id} has a prompt of {len} tokens; it must be 1..={max} (max_model_len - 1)")]
    PromptLength { id: u64, len: usize, max: usize },
    #[error("request {0} asks for 0 new tokens")]
    NoNewTokens(u64),
    #[error("request {id} has token {token} outside the vocabulary of {vocab}")]
    TokenOutOfVocab { id: u64, token: u32, vocab: usize },
}

/// Checks a workload against a config: unique ids, non-empty prompts that leave room
/// for at least one output token, tokens inside the vocabulary.
pub fn validate_workload(
    cfg: &EngineConfig,
    workload: &[RequestSpec],
) -> Result<(), WorkloadError> {
    let mut ids: Vec<u64> = workload.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(WorkloadError::DuplicateId(w[0]));
    }
    let max = cfg.scheduler.max_model_len - 1;
    for r in workload {
        if r.prompt.is_empty() || r.prompt.len() > max {
            return Err(WorkloadError::PromptLength {
                id: r.id,
                len: r.prompt.len(),
                max,
            });
        }
        if r.max_new_tokens == 0 {
            return Err(WorkloadError::NoNewTokens(r.id));
        }
        let vocab = cfg.model.vocab_size;
        if let Some(&token) = r.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(WorkloadError::TokenOutOfVocab {
                id: r.id,
                token,
                vocab,
            });
        }
    }
    Ok(())
}
