//! Shared helpers for the property tests in `tests/tests/`: validated config builders,
//! a batch builder that allocates consistent block tables, outcome builders, and the
//! deliberately simple reference functions (slots) the suites compare the core
//! against.
//!
//! proptest is a dev-dependency of this crate, so its strategies live in
//! `tests/tests/common/mod.rs`; everything here is plain, deterministic code.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use specmla_core::batch::{ScheduledBatch, ScheduledRow};
use specmla_core::config::{
    BackendProfile, DrafterBatch, EngineConfig, ModelDims, Planner, RowLayout, SchedulerConfig,
    SpecConfig, SpecMethod,
};
use specmla_core::cudagraph::capture_sizes;
use specmla_core::drafter::RowOutcome;
use specmla_core::plan::{build_step_plan, StepPlan};

/// `slot_mapping` PAD value, restated here so the tests do not trust the core's constant.
pub const PAD: i64 = -1;

/// A multi-step spec config with K drafts, or speculation off when `k == 0`.
pub fn spec_config(k: usize, parallel_drafting: bool) -> SpecConfig {
    SpecConfig {
        method: if k == 0 {
            SpecMethod::Off
        } else {
            SpecMethod::MultiStep
        },
        num_speculative_tokens: k,
        drafter_batch: DrafterBatch::Padded,
        parallel_drafting,
        temperature: 0.0,
    }
}

/// Panics with the validation message unless `cfg` is valid: every config a test uses
/// must be one the engine would accept at start-up.
pub fn validated(cfg: EngineConfig) -> EngineConfig {
    if let Err(e) = cfg.validate() {
        panic!("test config rejected: {e}\n{cfg:#?}");
    }
    cfg
}

/// A valid engine config with every field filled: one backend profile, K drafts
/// (multi-step, padded; off when 0), the given page size, and roomy limits
/// (max_model_len 4096, 64 rows, 8192 tokens, graphs off). Tests adjust fields and call
/// [`validated`] again.
pub fn engine_config(profile: BackendProfile, k: usize, page_size: usize) -> EngineConfig {
    let max_num_seqs = 64;
    let max_model_len: usize = 4096;
    let blocks_per_seq = max_model_len.div_ceil(page_size);
    validated(EngineConfig {
        model: ModelDims::tiny(),
        spec: spec_config(k, false),
        scheduler: SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 8192,
            max_model_len,
            page_size,
            num_gpu_blocks: 4 * blocks_per_seq,
            chunked_prefill: true,
            prefill_chunk_tokens: 512,
            mixed_batches: true,
            row_layout: RowLayout::DecodeFirst,
            planner: Planner::Vllm,
            workspace_tokens: 4 * max_num_seqs * page_size,
        },
        backends: vec![profile],
        cuda_graphs: false,
        max_capture_size_tokens: 512,
        // A positive multiple of the page size near 64 tokens.
        split_size_tokens: page_size * (64 / page_size).max(1),
        max_splits: 0,
        kv_cache_dtype: Default::default(),
        dp_peer_num_tokens: 0,
        faults: Default::default(),
        poison_stale_buffers: false,
        split_override: Default::default(),
    })
}

/// The reference slot of `pos` for a request holding `block_ids`: PAD at or past
/// `max_model_len` or past the allocated blocks, else `block * page + offset`.
pub fn ref_slot(block_ids: &[u32], pos: usize, page_size: usize, max_model_len: usize) -> i64 {
    if pos >= max_model_len {
        return PAD;
    }
    match block_ids.get(pos / page_size) {
        Some(&b) => b as i64 * page_size as i64 + (pos % page_size) as i64,
        None => PAD,
    }
}

/// The committed token of request `req` at `pos`: a fixed function so tests can check
/// which tokens a row carries without storing the prompt.
pub fn token_at(req: u64, pos: usize, vocab: usize) -> u32 {
    ((req.wrapping_mul(7919) + pos as u64 * 104_729 + 13) % vocab as u64) as u32
}

/// One row to build, before reorder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSpec {
    pub num_computed: usize,
    /// q_len, drafts included.
    pub q: usize,
    /// Draft tokens (the tail of the row); their count is `num_draft_tokens`.
    pub drafts: Vec<u32>,
    /// Whether the row ends at the request's last token (false: a partial prefill chunk).
    pub samples: bool,
    /// The request's prompt length: at most `num_computed` for a row past its prompt,
    /// beyond the chunk's end for a partial prefill.
    pub num_prompt_tokens: usize,
}

impl RowSpec {
    /// A verify row: one committed token after `num_computed`, then the drafts.
    pub fn verify(num_computed: usize, drafts: Vec<u32>) -> Self {
        Self {
            num_computed,
            q: 1 + drafts.len(),
            drafts,
            samples: true,
            num_prompt_tokens: num_computed.max(1),
        }
    }

    /// A prefill/extend chunk of `q` prompt tokens with no drafts.
    pub fn chunk(num_computed: usize, q: usize, samples: bool) -> Self {
        Self {
            num_computed,
            q,
            drafts: Vec::new(),
            samples,
            num_prompt_tokens: num_computed + q + usize::from(!samples),
        }
    }
}

/// Request id of scheduled row `i` (distinct, not equal to the row index, so a test
/// that confuses the two fails).
pub fn req_id_of(i: usize) -> u64 {
    1000 + 17 * i as u64
}

/// Builds a scheduled batch from `rows`. Each row gets blocks for
/// `min(num_computed + q + lookahead, max_model_len)` tokens (the scheduler reserves
/// `K + 1` lookahead for the drafter), drawn from a shuffled id space so block ids are
/// distinct and not in row order.
pub fn build_batch(
    cfg: &EngineConfig,
    rows: &[RowSpec],
    lookahead: usize,
    seed: u64,
) -> ScheduledBatch {
    let s = &cfg.scheduler;
    let vocab = cfg.model.vocab_size;
    let need: Vec<usize> = rows
        .iter()
        .map(|r| {
            (r.num_computed + r.q + lookahead)
                .min(s.max_model_len)
                .div_ceil(s.page_size)
        })
        .collect();
    let total: usize = need.iter().sum();
    let mut ids: Vec<u32> = (0..(total + 8) as u32).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in (1..ids.len()).rev() {
        let j = rng.gen_range(0..=i);
        ids.swap(i, j);
    }
    let mut next = 0;
    let rows = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            assert!(r.q >= r.drafts.len() && r.q > 0, "bad row spec {r:?}");
            assert!(
                r.num_computed + r.q <= s.max_model_len,
                "row past max_model_len {r:?}"
            );
            let id = req_id_of(i);
            let committed = r.q - r.drafts.len();
            let mut token_ids: Vec<u32> = (r.num_computed..r.num_computed + committed)
                .map(|p| token_at(id, p, vocab))
                .collect();
            token_ids.extend_from_slice(&r.drafts);
            let block_ids = ids[next..next + need[i]].to_vec();
            next += need[i];
            ScheduledRow {
                req_id: id,
                num_computed_tokens: r.num_computed,
                num_prompt_tokens: r.num_prompt_tokens,
                num_scheduled_tokens: r.q,
                token_ids,
                num_draft_tokens: r.drafts.len(),
                samples: r.samples,
                next_prompt_token: (!r.samples)
                    .then(|| token_at(id, r.num_computed + committed, vocab)),
                block_ids,
                req_state_idx: i,
            }
        })
        .collect();
    ScheduledBatch {
        step: 7,
        rows,
        preempted: Vec::new(),
    }
}

/// Runs `scenario` with `seed` on the CPU reference backend (the harness names no
/// backend, so the tests pick one here).
pub fn run(
    scenario: &specmla_sim::scenarios::Scenario,
    seed: u64,
    on_step: impl FnMut(&specmla_sim::runner::RunStats),
) -> Result<specmla_sim::runner::RunSummary, specmla_sim::runner::RunError> {
    specmla_sim::runner::run_with(scenario, seed, specmla_cpu::cpu_backend, None, on_step)
}

/// Builds the plan of `batch` with no grammar, using the config's capture sizes.
pub fn plan_of(cfg: &EngineConfig, batch: &ScheduledBatch, layout: RowLayout) -> StepPlan {
    let sizes = capture_sizes(cfg);
    build_step_plan(cfg, batch, &sizes, layout, &|_| None).expect("plan builds")
}

/// What verification settled for one scheduled row (test input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowResult {
    /// Accepted drafts, `<= num_draft_tokens`.
    pub accepted: usize,
    /// The bonus token of a sampling row.
    pub bonus: u32,
}

/// Row outcomes in the plan's row order, from per-scheduled-row results: a sampling row
/// keeps `q - drafts + accepted` tokens and rejects `drafts - accepted`; a partial
/// prefill keeps all q and continues with its next prompt token.
pub fn outcomes_for(
    batch: &ScheduledBatch,
    plan: &StepPlan,
    results: &[RowResult],
) -> Vec<RowOutcome> {
    plan.order
        .iter()
        .map(|&i| {
            let b = &batch.rows[i];
            let res = results[i];
            if !b.samples {
                return RowOutcome {
                    valid: b.num_scheduled_tokens,
                    next_token: b.next_prompt_token.expect("partial chunk has a next token"),
                    num_rejected: 0,
                };
            }
            assert!(res.accepted <= b.num_draft_tokens);
            RowOutcome {
                valid: b.num_scheduled_tokens - b.num_draft_tokens + res.accepted,
                next_token: res.bonus,
                num_rejected: b.num_draft_tokens - res.accepted,
            }
        })
        .collect()
}

/// Index of the planned row holding request `req_id`.
pub fn planned_row(plan: &StepPlan, req_id: u64) -> usize {
    plan.rows
        .iter()
        .position(|r| r.req_id == req_id)
        .expect("request is planned")
}
