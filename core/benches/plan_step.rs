//! Planning cost of one engine step: schedule, reorder, split, common + MLA metadata,
//! chunked context, graph dispatch, logits layout, and the padded drafter's inputs for
//! all K passes, on a 256-row mixed batch with K = 3 (FlashMLA profile).
// A benchmark reports on stderr: core/clippy.toml's no-printing rule is the library's.
#![allow(clippy::disallowed_macros)]

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use specmla_core::config::*;
use specmla_core::cudagraph::capture_sizes;
use specmla_core::drafter::{first_pass, next_pass, DrafterPass, RowOutcome};
use specmla_core::plan::build_step_plan;
use specmla_core::plan::StepPlan;
use specmla_core::request::RequestSpec;
use specmla_core::scheduler::{Commit, Scheduler};

fn config() -> EngineConfig {
    EngineConfig {
        model: ModelDims::deepseek_v3(),
        spec: SpecConfig::multi_step(3, DrafterBatch::Padded),
        scheduler: SchedulerConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 4096,
            page_size: 64,
            num_gpu_blocks: 256 * 64,
            chunked_prefill: true,
            prefill_chunk_tokens: 64,
            mixed_batches: true,
            row_layout: RowLayout::DecodeFirst,
            planner: Planner::Vllm,
            workspace_tokens: 65_536,
        },
        backends: vec![BackendProfile::FlashMla],
        cuda_graphs: true,
        max_capture_size_tokens: 1024,
        split_size_tokens: 512,
        max_splits: 0,
        kv_cache_dtype: Default::default(),
        dp_peer_num_tokens: 0,
        faults: Default::default(),
        poison_stale_buffers: false,
        split_override: Default::default(),
    }
}

/// Fabricated verification: accept the first draft, bonus = position-derived token.
fn fake_commit(s: &mut Scheduler, plan: &specmla_core::plan::StepPlan) -> Vec<RowOutcome> {
    let mut commits = Vec::new();
    let mut outcomes = Vec::new();
    for (r, row) in plan.rows.iter().enumerate() {
        let toks = plan.common.row_tokens(r);
        let drafts = &plan.token_ids[toks.end - row.num_draft_tokens..toks.end];
        let accepted = drafts.len().min(1);
        let mut new_tokens = drafts[..accepted].to_vec();
        new_tokens.push((toks.end % 1000) as u32);
        let new_tokens = if row.samples { new_tokens } else { Vec::new() };
        outcomes.push(RowOutcome {
            valid: if row.samples {
                row.query_len - row.num_draft_tokens + accepted
            } else {
                row.query_len
            },
            next_token: new_tokens.last().copied().unwrap_or(1),
            num_rejected: if row.samples {
                row.num_draft_tokens - accepted
            } else {
                0
            },
        });
        commits.push(Commit {
            req_id: row.req_id,
            num_scheduled_tokens: row.query_len,
            num_draft_tokens: row.num_draft_tokens,
            new_tokens,
        });
    }
    s.commit(&commits);
    for row in plan.rows.iter().filter(|r| r.samples) {
        s.set_drafts(row.req_id, vec![7, 8, 9], Vec::new());
    }
    outcomes
}

/// A scheduler whose next step is a mixed batch of ~240 verify rows and a few chunks.
fn steady_state(cfg: &EngineConfig) -> Scheduler {
    let workload: Vec<RequestSpec> = (0..256u64)
        .map(|id| RequestSpec {
            id,
            prompt: vec![
                1;
                if id % 16 == 15 {
                    3000
                } else {
                    600 + (id as usize * 7) % 400
                }
            ],
            max_new_tokens: 3000,
            arrival_step: 0,
            grammar: None,
        })
        .collect();
    let mut s = Scheduler::new(cfg.clone(), workload);
    let sizes = capture_sizes(cfg);
    for _ in 0..400 {
        let batch = s.schedule();
        let plan = build_step_plan(cfg, &batch, &sizes, RowLayout::DecodeFirst, &|_| None).unwrap();
        fake_commit(&mut s, &plan);
        let decodes = plan.mla.num_decodes;
        if decodes >= 240 && plan.mla.num_prefills > 0 {
            break;
        }
    }
    s
}

/// Outcomes where every row accepted at most one draft.
fn accept_one(plan: &StepPlan) -> Vec<RowOutcome> {
    plan.rows
        .iter()
        .map(|r| RowOutcome {
            valid: r.query_len.min(2),
            next_token: 5,
            num_rejected: r.num_draft_tokens.saturating_sub(1),
        })
        .collect()
}

/// The padded drafter's K = 3 passes.
fn drafter_passes(cfg: &EngineConfig, plan: &StepPlan, outcomes: &[RowOutcome]) -> DrafterPass {
    let p0 = first_pass(cfg, plan, outcomes, DrafterBatch::Padded);
    let p1 = next_pass(cfg, &p0, &vec![3; p0.num_rows()]);
    next_pass(cfg, &p1, &vec![4; p1.num_rows()])
}

fn bench(c: &mut Criterion) {
    let cfg = config();
    let sizes = capture_sizes(&cfg);
    let state = steady_state(&cfg);
    let probe = state.clone().schedule();
    eprintln!(
        "batch: {} rows, {} tokens",
        probe.rows.len(),
        probe.num_tokens()
    );
    c.bench_function("plan_step_256_rows_k3", |b| {
        b.iter_batched_ref(
            || state.clone(),
            |s| {
                let batch = s.schedule();
                let plan = build_step_plan(&cfg, &batch, &sizes, RowLayout::DecodeFirst, &|_| None)
                    .unwrap();
                let outcomes = accept_one(&plan);
                let passes = drafter_passes(&cfg, &plan, &outcomes);
                black_box((plan, passes));
            },
            BatchSize::LargeInput,
        )
    });
}

/// The same step, one part at a time, to see where the time goes.
fn bench_parts(c: &mut Criterion) {
    let cfg = config();
    let sizes = capture_sizes(&cfg);
    let state = steady_state(&cfg);
    let batch = state.clone().schedule();
    let plan = build_step_plan(&cfg, &batch, &sizes, RowLayout::DecodeFirst, &|_| None).unwrap();
    let outcomes = accept_one(&plan);
    c.bench_function("part_schedule", |b| {
        b.iter_batched_ref(|| state.clone(), |s| s.schedule(), BatchSize::LargeInput)
    });
    c.bench_function("part_build_step_plan", |b| {
        b.iter(|| {
            build_step_plan(
                &cfg,
                black_box(&batch),
                &sizes,
                RowLayout::DecodeFirst,
                &|_| None,
            )
            .unwrap()
        })
    });
    c.bench_function("part_drafter_inputs", |b| {
        b.iter(|| drafter_passes(&cfg, black_box(&plan), &outcomes))
    });
}

criterion_group!(benches, bench, bench_parts);
criterion_main!(benches);
