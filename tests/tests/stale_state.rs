//! The stale-state faults (F11-F16): persistent graph buffers, padding rows, dummy steps
//! and data-parallel padding. Each switch makes a whole run fail; proptest shrinks the
//! run to about the engine thread's trigger, and that case is frozen as a named test
//! that fails with the fault and passes without it. Poison mode never fails a clean run.

mod common;

use common::shrunk;
use specmla_core::config::*;
use specmla_core::fault::{Fault, Faults};
use specmla_sim::acceptance::AcceptanceRates;
use specmla_sim::runner::RunSummary;
use specmla_sim::scenarios::{self, Scenario, WorkloadShape};
use specmla_tests::{engine_config, run, validated};

/// What proptest shrinks: K, requests, longest prompt, most new tokens, arrival spread.
type Case = (usize, usize, usize, usize, u64);

/// A small run on `profile` with graphs (sizes up to 16 tokens), page 4, splits of 8
/// tokens, `fault` on. Prompt and output lengths are drawn per request from `1..=p` and
/// `1..=new`, so requests finish at different steps and later batches are smaller.
fn scenario(profile: BackendProfile, spec: SpecConfig, fault: Option<Fault>, c: Case) -> Scenario {
    let (_, n, p, new, spread) = c;
    let mut cfg = engine_config(profile, spec.k(), 4);
    cfg.spec = spec;
    cfg.scheduler.max_model_len = 64;
    cfg.scheduler.num_gpu_blocks = 96;
    cfg.scheduler.workspace_tokens = cfg.scheduler.max_num_seqs * 4;
    cfg.cuda_graphs = true;
    cfg.max_capture_size_tokens = 16;
    cfg.split_size_tokens = 8;
    let mut cfg = validated(cfg);
    cfg.faults = fault.map_or(Faults::none(), |f| Faults::none().with(f));
    Scenario {
        name: "stale".into(),
        description: "shrinking".into(),
        cfg,
        workload: WorkloadShape {
            num_requests: n,
            prompt_len: (1, p),
            max_new_tokens: (1, new),
            arrival_steps: spread,
            grammar_fraction: 0.0,
        },
        acceptance_rate: AcceptanceRates::uniform(1.0),
        max_steps: 500,
        check_layouts: false,
        check_drafter_batches: false,
    }
}

fn mtp(k: usize) -> SpecConfig {
    SpecConfig::multi_step(k, DrafterBatch::Padded)
}

fn passes(s: &Scenario) -> bool {
    run(s, 0, |_| {}).is_ok_and(|sum| sum.passed())
}

fn summary(s: &Scenario) -> RunSummary {
    run(s, 0, |_| {}).expect("the run completes")
}

/// The first failure's text, for the frozen tests' messages.
fn first_failure(sum: &RunSummary) -> String {
    sum.failures
        .first()
        .map_or_else(String::new, |f| f.detail.clone())
}

/// Shrinks `make(case)` with the fault on; every case also passes without it, so the
/// failure is the fault's. K in 1..=3, 1..=6 requests, prompts up to 24, outputs up to
/// 12, arrivals over up to 24 steps.
fn shrink(make: impl Fn(Case, Option<Fault>) -> Scenario, fault: Fault) -> Case {
    let strategy = (1usize..=3, 1usize..=6, 1usize..=24, 1usize..=12, 1u64..=24);
    shrunk(strategy, |&c| {
        !passes(&make(c, None)) || passes(&make(c, Some(fault)))
    })
}

/// Asserts `case` fails with `fault`, passes without it, and one of its failures says
/// `needle`; returns the faulted run's summary.
fn frozen(make: impl Fn(Option<Fault>) -> Scenario, fault: Fault, needle: &str) -> RunSummary {
    assert!(
        passes(&make(None)),
        "{fault:?} case fails without the fault"
    );
    let sum = summary(&make(Some(fault)));
    assert!(!sum.passed(), "{fault:?} went unnoticed");
    // The switch fired (changed what the engine computed) in the case that catches it.
    assert!(
        sum.faults.len() == 1 && sum.faults[0].fired_steps > 0,
        "{fault:?} caught but counted as never fired: {:?}",
        sum.faults
    );
    assert!(
        sum.failures.iter().any(|f| f.detail.contains(needle)),
        "{fault:?}: {}",
        first_failure(&sum)
    );
    sum
}

fn graph_run(c: Case, f: Option<Fault>) -> Scenario {
    scenario(BackendProfile::FlashMla, mtp(c.0), f, c)
}

#[test]
fn f11_shrinks_to_four_rows_then_three_padded_to_four() {
    let (k, n, ..) = shrink(graph_run, Fault::F11);
    // K 1 captures graphs of 1, 2, 4 and 8 rows: a padding row an earlier step wrote
    // needs a step of at least 4 rows, then 3 on the 4-row graph.
    assert_eq!(k, 1);
    assert!((4..=5).contains(&n), "{n} requests");
}

/// F11 frozen: K 1, four requests of different lengths; once one finishes, three rows
/// replay the 4-row graph and the padding row's slot is the finished request's or a
/// live one's. Postmortem: the speculator wrote `idx_mapping[:num_reqs]` only.
#[test]
fn f11_frozen_four_requests_then_three() {
    let c = |f| graph_run((1, 4, 6, 6, 1), f);
    frozen(
        c,
        Fault::F11,
        "padding row samples drafts into request-state slot",
    );
}

#[test]
fn f12_shrinks_to_one_request_past_one_split() {
    let (k, n, p, new, _) = shrink(graph_run, Fault::F12);
    // Lengths are drawn per request: one or two requests, long enough that a graph
    // replays past the 8-token split.
    assert_eq!(k, 1);
    assert!(n <= 2, "{n} requests");
    assert!(
        p + new > 8,
        "the graph must replay past the 8-token split: {p} + {new}"
    );
}

/// F12 frozen: one request, K 1 (prompt up to 8, up to 12 new tokens): its graph
/// replays run past the 8-token split, and the capture-time schedule gives them one
/// split. The capture's dummy run wrote `seq_lens = max_query_len` (1 + K = 2, as
/// vLLM's `_dummy_run`), whose schedule is one split of one 8-key unit: exactly what the
/// replay reads. Postmortem: the FP8 FlashMLA path computed the schedule into fresh
/// tensors.
#[test]
fn f12_frozen_one_request_past_the_capture_schedule() {
    let c = |f| graph_run((1, 1, 8, 12, 1), f);
    let sum = frozen(
        c,
        Fault::F12,
        "replay reads a schedule of Some(1) splits of Some(8) keys",
    );
    // The stale schedule truncates the keys: the logits are wrong too.
    assert!(sum.max_logit_error > 1e-2, "{}", sum.max_logit_error);
}

#[test]
fn f13_shrinks_to_four_rows_then_three_padded_to_four() {
    let (k, n, ..) = shrink(graph_run, Fault::F13);
    assert_eq!(k, 1);
    assert!((4..=5).contains(&n), "{n} requests (as F11)");
}

/// F13 frozen: as F11's case, the padding row's seq_len left from the 4-row step.
/// Postmortem: only the device copy's tail was zeroed; the metadata read the host's.
#[test]
fn f13_frozen_four_requests_then_three() {
    let c = |f| graph_run((1, 4, 6, 6, 1), f);
    frozen(c, Fault::F13, "padding row reads seq_len");
}

fn triton_dflash(c: Case, f: Option<Fault>) -> Scenario {
    let mut s = scenario(BackendProfile::TritonMla, SpecConfig::dflash(c.0), f, c);
    s.cfg.cuda_graphs = false;
    s
}

#[test]
fn f14_shrinks_to_one_request_with_k_1() {
    let (k, n, ..) = shrink(triton_dflash, Fault::F14);
    assert_eq!((k, n), (1, 1), "R 1, K 1: 2 query rows against 1 table row");
}

/// F14 frozen: TritonMLA, DFlash K 1, one request. Postmortem: the SingleOnly builder
/// re-derived the threshold for a non-causal group; verify rows met a single-token
/// kernel that indexes seq_lens and the table by query row.
#[test]
fn f14_frozen_one_verify_row_on_the_single_token_kernel() {
    let c = |f| triton_dflash((1, 1, 4, 4, 1), f);
    let sum = frozen(c, Fault::F14, "threshold");
    assert!(
        sum.failures
            .iter()
            .any(|f| f.detail.contains("2 query rows") && f.detail.contains("1 block-table")),
        "{:?}",
        sum.failures
    );
    assert!(sum.max_logit_error > 1e-2, "{}", sum.max_logit_error);
}

/// A data-parallel rank whose busiest peer runs 4 tokens a step.
fn dp_run(c: Case, f: Option<Fault>) -> Scenario {
    let mut s = graph_run(c, f);
    s.cfg.dp_peer_num_tokens = 4;
    s
}

#[test]
fn f15_shrinks_to_a_request_then_an_idle_step() {
    let (k, n, ..) = shrink(dp_run, Fault::F15);
    assert_eq!(k, 2, "K 2: one drafter decode pass");
    assert_eq!(
        n, 2,
        "one request runs and finishes, the rank idles, another arrives"
    );
}

/// F15 frozen: K 2, two requests arriving over 20 steps; the first finishes before the
/// second arrives, and the idle step's dummy drafter writes into the first's block.
/// Postmortem: the dummy batch's `idx_mapping` was `arange(num_reqs)`.
#[test]
fn f15_frozen_idle_step_after_a_finished_request() {
    let c = |f| dp_run((2, 2, 3, 2, 20), f);
    frozen(c, Fault::F15, "dummy step");
}

#[test]
fn f16_shrinks_to_one_request_with_k_2() {
    let (k, n, ..) = shrink(dp_run, Fault::F16);
    assert_eq!((k, n), (2, 1), "one local token against the peer's 4, K 2");
}

/// F16 frozen: K 2, one request, the peer rank at 4 tokens. Postmortem: the draft
/// decode passed the DP-padded count as `num_actual_tokens`.
#[test]
fn f16_frozen_one_request_against_a_busier_rank() {
    let c = |f| dp_run((2, 1, 3, 3, 1), f);
    frozen(c, Fault::F16, "attention metadata counts 4 tokens");
}

/// Poison mode: every scenario, data-parallel padding on, passes every check, so no
/// clean path reads a region the step left unwritten.
#[test]
fn every_scenario_passes_with_poisoned_buffers() {
    for s in scenarios::all() {
        let mut s = s.clone();
        s.workload.num_requests = s.workload.num_requests.min(8);
        s.cfg.poison_stale_buffers = true;
        s.cfg.dp_peer_num_tokens = 5;
        let sum = summary(&s);
        assert!(sum.passed(), "{}: {:?}", s.name, sum.failures);
    }
}

/// Poison makes F12's stale schedule garbage: still caught (the graph-buffers invariant),
/// but the logits are not what the capture-time schedule made them (the replay read what
/// poison wrote; a garbage schedule that happens to cover every key gives near-right
/// logits, one that does not, wrong ones).
#[test]
fn poison_turns_a_stale_schedule_into_garbage() {
    let mut s = graph_run((1, 1, 8, 12, 1), Some(Fault::F12));
    let stale = summary(&s);
    s.cfg.poison_stale_buffers = true;
    let sum = summary(&s);
    assert!(!stale.passed() && stale.max_logit_error > 1e-2);
    assert!(!sum.passed());
    assert_ne!(
        sum.max_logit_error.to_bits(),
        stale.max_logit_error.to_bits(),
        "poison left the schedule the replay read as the capture wrote it"
    );
}
