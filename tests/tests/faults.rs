//! The known-bug catalog (RULES §9): with each fault switch on, a property that
//! holds on the clean code fails, and proptest shrinks the failure to a case about as
//! small as the catalog's minimal trigger. Each trigger is then frozen as a named test
//! that fails with the fault and passes without it.

mod common;

use common::shrunk;

use proptest::prelude::*;
use specmla_core::config::*;
use specmla_core::cudagraph::capture_sizes;
use specmla_core::drafter::{dflash_pass, first_pass, next_pass};
use specmla_core::fault::{Fault, Faults};
use specmla_core::grammar::{GrammarState, TokenAutomaton};
use specmla_core::invariants::{
    check_dflash, check_drafter_pass, check_grammar_masks, check_plan, Rule, Violation,
};
use specmla_core::plan::build_step_plan;
use specmla_sim::acceptance::AcceptanceRates;
use specmla_sim::scenarios::{Scenario, WorkloadShape};
use specmla_tests::run;
use specmla_tests::{build_batch, engine_config, outcomes_for, validated, RowResult, RowSpec};

fn with_fault(mut cfg: EngineConfig, f: Fault) -> EngineConfig {
    cfg.faults = Faults::none().with(f);
    cfg
}

/// The shared test config with graphs on (graph faults need captured sizes).
fn graph_config(profile: BackendProfile, k: usize) -> EngineConfig {
    let mut cfg = engine_config(profile, k, 16);
    cfg.cuda_graphs = true;
    validated(cfg)
}

/// A random step: K, layout and 1..=6 mixed rows.
fn step_case() -> impl Strategy<Value = (usize, RowLayout, Vec<RowSpec>)> {
    (1usize..=3, common::layout()).prop_flat_map(|(k, layout)| {
        (
            Just(k),
            Just(layout),
            prop::collection::vec(common::mixed_row(k, 120, 512), 1..=6),
        )
    })
}

/// Plan-level violations of `rows` under `cfg`, with every request constrained by one
/// grammar so mask faults show.
fn plan_violations(cfg: &EngineConfig, layout: RowLayout, rows: &[RowSpec]) -> Vec<Violation> {
    let batch = build_batch(cfg, rows, cfg.spec.k() + 1, 3);
    let sizes = capture_sizes(cfg);
    let automaton = TokenAutomaton::random(4, cfg.model.vocab_size, 0.5, 9);
    let lookup = |_: u64| Some((&automaton, GrammarState::Live(0)));
    let plan = build_step_plan(cfg, &batch, &sizes, layout, &lookup).unwrap();
    let mut v = check_plan(cfg, &batch, &plan, &sizes);
    v.extend(check_grammar_masks(&batch, &plan, &lookup));
    v
}

fn has_rule(v: &[Violation], rule: Rule) -> bool {
    v.iter().any(|x| x.rule == rule)
}

/// Shrinks a plan-level fault; returns (K, rows) of the minimal case.
fn shrink_plan_fault(profile: BackendProfile, fault: Fault) -> (usize, RowLayout, Vec<RowSpec>) {
    shrunk(step_case(), |(k, layout, rows)| {
        let cfg = with_fault(graph_config(profile, *k), fault);
        plan_violations(&cfg, *layout, rows).is_empty()
    })
}

#[test]
fn f3_capture_sizes_shrink_to_the_smallest_k() {
    let k = shrunk(1usize..=8, |&k| {
        let cfg = with_fault(graph_config(BackendProfile::FlashMla, k), Fault::F3);
        capture_sizes(&cfg).iter().all(|s| s % (1 + k) == 0)
    });
    assert_eq!(k, 1, "K = 1 already leaves size 1 unrounded");
}

/// F3 frozen: K = 2 captures 8 tokens, a [3, 3, 2] dummy batch.
#[test]
fn f3_frozen_k2_captures_8_tokens() {
    let clean = graph_config(BackendProfile::FlashMla, 2);
    assert!(!capture_sizes(&clean).contains(&8));
    let faulty = with_fault(clean, Fault::F3);
    assert!(capture_sizes(&faulty).contains(&8));
}

#[test]
fn f7_shrinks_to_a_lone_fresh_prompt_of_1_plus_k_tokens() {
    let (k, _, rows) = shrink_plan_fault(BackendProfile::FlashMla, Fault::F7);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].num_computed, rows[0].q), (0, 1 + k));
}

/// F7 frozen: K = 3, a fresh prompt of 4 tokens.
#[test]
fn f7_frozen_fresh_4_token_prompt_replays_on_the_verify_graph() {
    let rows = [RowSpec::chunk(0, 4, true)];
    let clean = graph_config(BackendProfile::FlashMla, 3);
    assert!(plan_violations(&clean, RowLayout::DecodeFirst, &rows).is_empty());
    let v = plan_violations(&with_fault(clean, Fault::F7), RowLayout::DecodeFirst, &rows);
    assert!(has_rule(&v, Rule::CudaGraph), "{v:?}");
}

/// F7 with vLLM's split: next to two q = 4 verify rows on FlashMLA, a fresh 4-token
/// prompt is a decode row (the split reads query lengths only), yet the fixed engine
/// keeps the batch off the verify graph because that row is still prefilling. With F7
/// the shape alone dispatches it and the graph invariant names the row.
#[test]
fn f7_a_fresh_prompt_is_a_decode_row_but_never_a_graph_row() {
    let rows = [
        RowSpec::verify(40, vec![1, 2, 3]),
        RowSpec::chunk(0, 4, true),
        RowSpec::verify(70, vec![4, 5, 6]),
    ];
    let clean = graph_config(BackendProfile::FlashMla, 3);
    let batch = build_batch(&clean, &rows, 4, 3);
    let sizes = capture_sizes(&clean);
    let plan = build_step_plan(&clean, &batch, &sizes, RowLayout::DecodeFirst, &|_| None).unwrap();
    assert_eq!(
        plan.mla.num_decodes, 3,
        "all three rows take the decode kernel"
    );
    assert_eq!(plan.cudagraph, None);
    assert!(plan_violations(&clean, RowLayout::DecodeFirst, &rows).is_empty());
    let v = plan_violations(&with_fault(clean, Fault::F7), RowLayout::DecodeFirst, &rows);
    assert!(
        v.iter()
            .any(|x| x.rule == Rule::CudaGraph && x.detail.contains("past its prompt")),
        "{v:?}"
    );
}

#[test]
fn f8_shrinks_to_two_rows() {
    let (_, _, rows) = shrink_plan_fault(BackendProfile::FlashMla, Fault::F8);
    assert!(rows.len() <= 2, "{rows:?}");
}

/// F8 frozen: 1 extend row + 2 verify rows, extend-first (TokenSpeed) layout.
#[test]
fn f8_frozen_extend_plus_two_verify_rows() {
    let rows = [
        RowSpec::chunk(40, 200, false),
        RowSpec::verify(30, vec![1, 2, 3]),
        RowSpec::verify(90, vec![4, 5, 6]),
    ];
    let clean = engine_config(BackendProfile::FlashMla, 3, 16);
    assert!(plan_violations(&clean, RowLayout::ExtendFirst, &rows).is_empty());
    let v = plan_violations(&with_fault(clean, Fault::F8), RowLayout::ExtendFirst, &rows);
    assert!(has_rule(&v, Rule::DecodeRows), "{v:?}");
}

#[test]
fn f9_shrinks_to_a_two_row_mixed_batch() {
    let (_, _, rows) = shrink_plan_fault(BackendProfile::FlashInferMla, Fault::F9);
    assert!(rows.len() <= 3, "{rows:?}");
    assert!(
        rows.iter().any(|r| !r.drafts.is_empty()),
        "a verify row carries the drafts: {rows:?}"
    );
}

/// F9 frozen: a prefill chunk then a constrained verify row, extend-first.
#[test]
fn f9_frozen_mixed_batch_with_a_constrained_request() {
    let rows = [
        RowSpec::chunk(0, 7, true),
        RowSpec::verify(20, vec![11, 12, 13]),
    ];
    let clean = engine_config(BackendProfile::FlashInferMla, 3, 16);
    assert!(plan_violations(&clean, RowLayout::ExtendFirst, &rows).is_empty());
    let v = plan_violations(&with_fault(clean, Fault::F9), RowLayout::ExtendFirst, &rows);
    assert!(has_rule(&v, Rule::Sampling), "{v:?}");
}

#[test]
fn f10_shrinks_to_two_non_uniform_decode_rows() {
    let (_, _, rows) = shrink_plan_fault(BackendProfile::FlashInferMla, Fault::F10);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter().all(|r| r.num_computed > 0) && rows[0].q != rows[1].q,
        "{rows:?}"
    );
}

/// F10 frozen: rows q = [2, 4] on a uniform backend.
#[test]
fn f10_frozen_q2_and_q4_on_a_uniform_kernel() {
    let rows = [
        RowSpec::verify(10, vec![1]),
        RowSpec::verify(20, vec![1, 2, 3]),
    ];
    let clean = engine_config(BackendProfile::FlashInferMla, 3, 16);
    assert!(plan_violations(&clean, RowLayout::DecodeFirst, &rows).is_empty());
    let v = plan_violations(
        &with_fault(clean, Fault::F10),
        RowLayout::DecodeFirst,
        &rows,
    );
    assert!(
        has_rule(&v, Rule::Split) && has_rule(&v, Rule::DecodeRows),
        "{v:?}"
    );
}

/// Violations of the padded drafter's passes for verify rows that accepted `accepted`.
fn drafter_violations(cfg: &EngineConfig, rows: &[RowSpec], accepted: &[usize]) -> Vec<Violation> {
    let batch = build_batch(cfg, rows, cfg.spec.k() + 1, 5);
    let plan = specmla_tests::plan_of(cfg, &batch, RowLayout::DecodeFirst);
    let results: Vec<RowResult> = accepted
        .iter()
        .map(|&a| RowResult {
            accepted: a,
            bonus: 7,
        })
        .collect();
    let outcomes = outcomes_for(&batch, &plan, &results);
    let mut pass = first_pass(cfg, &plan, &outcomes, DrafterBatch::Padded);
    let mut v = check_drafter_pass(cfg, &batch, &plan, &outcomes, &pass);
    for _ in 1..cfg.spec.k() {
        pass = next_pass(cfg, &pass, &vec![3; pass.num_rows()]);
        v.extend(check_drafter_pass(cfg, &batch, &plan, &outcomes, &pass));
    }
    v
}

#[test]
fn f4_shrinks_to_one_row_with_a_rejection() {
    let case = (2usize..=4)
        .prop_flat_map(|k| (Just(k), prop::collection::vec((1usize..100, 0..=k), 1..=4)));
    let (k, rows) = shrunk(case, |(k, rows)| {
        let cfg = with_fault(engine_config(BackendProfile::FlashMla, *k, 16), Fault::F4);
        let specs: Vec<RowSpec> = rows
            .iter()
            .map(|&(c, _)| RowSpec::verify(c, vec![9; *k]))
            .collect();
        let acc: Vec<usize> = rows.iter().map(|&(_, a)| a).collect();
        drafter_violations(&cfg, &specs, &acc).is_empty()
    });
    assert_eq!((k, rows.len()), (2, 1), "{rows:?}");
    assert!(rows[0].1 < k, "a rejected draft: {rows:?}");
}

/// F4 frozen: K = 3, nothing accepted.
#[test]
fn f4_frozen_k3_nothing_accepted() {
    let rows = [RowSpec::verify(50, vec![1, 2, 3])];
    let clean = engine_config(BackendProfile::FlashMla, 3, 16);
    assert!(drafter_violations(&clean, &rows, &[0]).is_empty());
    let v = drafter_violations(&with_fault(clean, Fault::F4), &rows, &[0]);
    assert!(has_rule(&v, Rule::DrafterInputs), "{v:?}");
}

/// DFlash violations for one verify row at context `ctx` with `accepted` drafts, page 16,
/// max_model_len 64.
fn dflash_violations(faults: Faults, k: usize, ctx: usize, accepted: usize) -> Vec<Violation> {
    let mut cfg = engine_config(BackendProfile::FlashAttnMla, k, 16);
    cfg.spec = SpecConfig::dflash(k);
    cfg.scheduler.max_model_len = 64;
    let mut cfg = validated(cfg);
    cfg.faults = faults;
    // A second row after it, so an unclamped index reads a real neighbour block.
    let rows = [
        RowSpec::verify(ctx, vec![9; k]),
        RowSpec::verify(3, vec![9; k]),
    ];
    let batch = build_batch(&cfg, &rows, k + 1, 11);
    let plan = specmla_tests::plan_of(&cfg, &batch, RowLayout::DecodeFirst);
    let results = [
        RowResult { accepted, bonus: 7 },
        RowResult {
            accepted: 0,
            bonus: 7,
        },
    ];
    let outcomes = outcomes_for(&batch, &plan, &results);
    check_dflash(
        &cfg,
        &batch,
        &plan,
        &outcomes,
        &dflash_pass(&cfg, &plan, &outcomes),
    )
}

#[test]
fn f5_f6_shrink_to_a_block_crossing_max_model_len() {
    for f in [Fault::F5, Fault::F6] {
        let case = (1usize..=3).prop_flat_map(|k| (Just(k), 1usize..(64 - k - 1), 0..=k));
        let (k, ctx, accepted) = shrunk(case, |&(k, ctx, a)| {
            dflash_violations(Faults::none().with(f), k, ctx, a).is_empty()
        });
        let last_block_pos = ctx + accepted + 1 + k;
        assert!(
            last_block_pos >= 64,
            "{f:?}: the block must reach max_model_len: k={k} ctx={ctx} accepted={accepted}"
        );
    }
}

/// F5/F6 frozen: page 16, max_model_len 64, K = 3, last valid position 60.
#[test]
fn f5_f6_frozen_last_valid_position_60() {
    // ctx 57 + 1 committed + 3 accepted drafts: last valid position 60, block reaches 64.
    assert!(dflash_violations(Faults::none(), 3, 57, 3).is_empty());
    let v5 = dflash_violations(Faults::none().with(Fault::F5), 3, 57, 3);
    assert!(
        v5.iter().any(|v| v.detail.contains("past the width")),
        "{v5:?}"
    );
    let v6 = dflash_violations(Faults::none().with(Fault::F6), 3, 57, 3);
    assert!(
        v6.iter().any(|v| v.detail.contains("position 64")),
        "{v6:?}"
    );
}

/// A tiny scenario: the parameters proptest shrinks.
fn tiny_scenario(
    profile: BackendProfile,
    fault: Fault,
    k: usize,
    requests: usize,
    prompt: usize,
    new: usize,
) -> Scenario {
    let mut cfg = engine_config(profile, k, 4);
    cfg.scheduler.max_model_len = 64;
    cfg.scheduler.num_gpu_blocks = 64;
    cfg.scheduler.workspace_tokens = cfg.scheduler.max_num_seqs * 4;
    cfg.cuda_graphs = true;
    cfg.split_size_tokens = 8;
    let mut cfg = validated(cfg);
    cfg.faults = Faults::none().with(fault);
    Scenario {
        name: "fault".into(),
        description: "shrinking".into(),
        cfg,
        workload: WorkloadShape {
            num_requests: requests,
            prompt_len: (prompt, prompt),
            max_new_tokens: (new, new),
            arrival_steps: 1,
            grammar_fraction: 0.0,
        },
        acceptance_rate: AcceptanceRates::uniform(1.0),
        max_steps: 500,
        check_layouts: false,
        check_drafter_batches: false,
    }
}

fn shrink_backend_fault(profile: BackendProfile, fault: Fault) -> (usize, usize, usize, usize) {
    shrunk(
        (1usize..=3, 1usize..=3, 1usize..=24, 1usize..=8),
        |&(k, n, p, new)| {
            run(&tiny_scenario(profile, fault, k, n, p, new), 0, |_| {})
                .map(|s| s.passed())
                .unwrap_or(false)
        },
    )
}

#[test]
fn f1_shrinks_to_one_request_with_one_verify_step() {
    let (k, n, prompt, new) = shrink_backend_fault(BackendProfile::CutlassMla, Fault::F1);
    assert_eq!((k, n), (1, 1), "one request with K = 1 (q = 2) suffices");
    assert!(prompt <= 2 && new <= 3, "prompt {prompt} new {new}");
}

/// F1 frozen: one prefill row with context >= 1 and q = 2, 4 heads (the verify row of a
/// 1-token prompt on a SingleOnly backend).
#[test]
fn f1_frozen_one_prefill_row_with_context() {
    let s = tiny_scenario(BackendProfile::CutlassMla, Fault::F1, 1, 1, 1, 2);
    let mut clean = s.clone();
    clean.cfg.faults = Faults::none();
    assert!(run(&clean, 0, |_| {}).unwrap().passed());
    let sum = run(&s, 0, |_| {}).unwrap();
    assert!(!sum.passed());
    assert_eq!(
        sum.failures[0].step, 1,
        "the first verify step: {:?}",
        sum.failures[0]
    );
}

#[test]
fn f2_shrinks_to_one_request_on_a_graph() {
    let (k, n, _, _) = shrink_backend_fault(BackendProfile::FlashMla, Fault::F2);
    assert_eq!((k, n), (1, 1));
}

/// F2 frozen: K = 1, 2 rows x 2 tokens replayed on a graph frozen as 4 x 1.
#[test]
fn f2_frozen_two_rows_of_two_on_a_4x1_graph() {
    let s = tiny_scenario(BackendProfile::FlashMla, Fault::F2, 1, 2, 3, 4);
    let mut clean = s.clone();
    clean.cfg.faults = Faults::none();
    let ok = run(&clean, 0, |_| {}).unwrap();
    assert!(ok.passed() && ok.stats.graph_steps > 0, "{:?}", ok.stats);
    assert!(!run(&s, 0, |_| {}).unwrap().passed());
}

#[test]
fn every_fault_has_a_catalog_entry() {
    for f in Fault::ALL {
        assert_eq!(Fault::from_id(f.id()), Some(f));
        assert!(!f.mirrors().is_empty());
    }
}
