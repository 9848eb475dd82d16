//! End-to-end properties of the CPU reference backend driven by the core: on random
//! configs every check passes (spec == greedy, f64 oracle agreement, padded == compacted,
//! decode-first == extend-first, invariants); the checks do fail when a backend lies;
//! and the same seed gives the same run.

use std::sync::Arc;

use proptest::prelude::*;
use specmla_core::backend::{Backend, DrafterOutput, TargetOutput};
use specmla_core::config::*;
use specmla_core::cudagraph::GraphShape;
use specmla_core::drafter::{DFlashPass, DrafterPass};
use specmla_core::engine::{Engine, EngineOptions};
use specmla_core::plan::StepPlan;
use specmla_cpu::{CpuBackend, CpuBackendError};
use specmla_sim::acceptance::AcceptanceRates;
use specmla_sim::checks::{CheckKind, SimChecker};
use specmla_sim::oracle::Oracle;
use specmla_sim::scenarios::{self, generate_workload, Scenario, WorkloadShape};
use specmla_tests::run;

/// A lie a wrapped backend tells.
#[derive(Clone, Copy, Debug)]
enum Lie {
    /// Adds `delta` to one logit of the first sampled token of the first step that
    /// samples anything (once).
    Logit { token: usize, delta: f32 },
    /// Perturbs hidden states by the row's position in the batch (layout-dependent math).
    RowDependentHidden,
    /// Perturbs the padded drafter's later passes only.
    PaddedDrafter,
}

struct Liar {
    inner: CpuBackend,
    lie: Lie,
    step: u64,
    /// The step the logit lie was told at.
    lied_at: Option<u64>,
}

impl Backend for Liar {
    type Error = CpuBackendError;
    const KIND: &'static str = "cpu";
    fn device_name(&self) -> String {
        format!("{} telling a {:?} lie", self.inner.device_name(), self.lie)
    }
    fn is_environment(_: &CpuBackendError) -> bool {
        false
    }
    fn set_full_outputs(&mut self, on: bool) {
        self.inner.set_full_outputs(on)
    }
    fn capture_graphs(&mut self, shapes: &[GraphShape]) -> Result<(), Self::Error> {
        self.inner.capture_graphs(shapes)
    }
    fn forward_target(&mut self, plan: &StepPlan) -> Result<TargetOutput, Self::Error> {
        let mut out = self.inner.forward_target(plan)?;
        match self.lie {
            Lie::Logit { token, delta } if self.lied_at.is_none() && !out.logits.is_empty() => {
                out.logits[token] += delta;
                self.lied_at = Some(plan.step);
            }
            Lie::RowDependentHidden if plan.layout == RowLayout::ExtendFirst => {
                // One bit of the first token's hidden state: its digest changes.
                if let Some(h) = out.hidden_digests.first_mut() {
                    *h ^= 1;
                }
            }
            _ => {}
        }
        self.step = plan.step;
        Ok(out)
    }
    fn forward_drafter(
        &mut self,
        pass: &DrafterPass,
        t: &TargetOutput,
        prev: Option<&DrafterOutput>,
    ) -> Result<DrafterOutput, Self::Error> {
        let mut out = self.inner.forward_drafter(pass, t, prev)?;
        if matches!(self.lie, Lie::PaddedDrafter)
            && pass.mode == DrafterBatch::Padded
            && pass.pass > 0
        {
            for r in 0..pass.num_rows() {
                let row = &mut out.logits[r * out.vocab_size..(r + 1) * out.vocab_size];
                row[(r + self.step as usize) % out.vocab_size] += 100.0;
            }
        }
        Ok(out)
    }
    fn forward_dflash(
        &mut self,
        pass: &DFlashPass,
        t: &TargetOutput,
    ) -> Result<DrafterOutput, Self::Error> {
        self.inner.forward_dflash(pass, t)
    }
}

/// Runs `s` on a lying backend; returns the checker and the step of a logit lie.
fn run_with_lie(s: &Scenario, seed: u64, lie: Lie) -> (SimChecker, Option<u64>) {
    let cfg = s.cfg.clone();
    let workload = generate_workload(&s.workload, &cfg, seed);
    let (target, drafter) = specmla_sim::runner::models(&cfg, seed);
    let oracle = Arc::new(Oracle::new(&target, cfg.kv_cache_dtype));
    // Acceptance 0: drafts come from the drafter itself, so a drafter lie changes them.
    let rate = if matches!(lie, Lie::PaddedDrafter) {
        AcceptanceRates::uniform(0.0)
    } else {
        s.acceptance_rate.clone()
    };
    let mut checker = SimChecker::new(oracle, &workload, seed, rate, 0.0);
    let opts = EngineOptions {
        check_layouts: s.check_layouts,
        check_drafter_batches: s.check_drafter_batches,
        seed,
        full_outputs: false,
    };
    let backend = Liar {
        inner: CpuBackend::new(&cfg, target, drafter),
        lie,
        step: 0,
        lied_at: None,
    };
    let mut engine = Engine::new(cfg, opts, workload, backend).unwrap();
    while let Some(o) = engine.step(&mut checker).unwrap() {
        checker.check_step(&o, opts.check_layouts, opts.check_drafter_batches);
    }
    let lied_at = engine.backend().lied_at;
    (checker, lied_at)
}

fn failed(c: &SimChecker, kind: CheckKind) -> bool {
    c.tallies.get(&kind).is_some_and(|t| t.passed < t.run)
}

fn small(name: &str, n: usize) -> Scenario {
    let mut s = scenarios::by_name(name).unwrap();
    s.workload.num_requests = n;
    s
}

/// The scenario sweep: every scenario, under both planners (vLLM's current four-region
/// rule and the three-region rule before PR #37303), two seeds each.
#[test]
fn every_scenario_passes_every_check_under_both_planners() {
    for s in scenarios::all() {
        for (planner, seed) in [
            (Planner::Vllm, 1),
            (Planner::Vllm, 2),
            (Planner::Vllm3Region, 1),
        ] {
            let mut s = s.clone();
            s.workload.num_requests = s.workload.num_requests.min(8);
            s.cfg.scheduler.planner = planner;
            let sum = run(&s, seed, |_| {}).unwrap();
            let what = format!("{} {planner:?} seed {seed}", s.name);
            assert!(sum.passed(), "{what}: {:?}", sum.failures);
            assert!(!sum.hit_step_limit, "{what} did not finish");
            assert!(
                sum.checks.iter().all(|t| t.run > 0),
                "{what}: a check never ran: {:?}",
                sum.checks
            );
        }
    }
}

/// The cache dtype is part of the math, not a label: with a bf16 cache (latents rounded
/// where produced, by the backend and by the oracle alike) every scenario passes every
/// check, and its logits sit much further from the f64 oracle than the f32 run's do.
#[test]
fn a_bf16_cache_passes_every_check_and_moves_the_logits() {
    for s in scenarios::all() {
        let mut s = s.clone();
        s.workload.num_requests = s.workload.num_requests.min(6);
        let f32_run = run(&s, 1, |_| {}).unwrap();
        s.cfg.kv_cache_dtype = KvCacheDtype::Bf16;
        let bf16_run = run(&s, 1, |_| {}).unwrap();
        assert!(bf16_run.passed(), "{}: {:?}", s.name, bf16_run.failures);
        assert!(!bf16_run.hit_step_limit, "{} did not finish", s.name);
        assert_eq!(
            bf16_run.tolerances.logit_abs,
            specmla_sim::checks::BF16_LOGIT_ABS_TOLERANCE
        );
        assert!(
            bf16_run.max_logit_error > 10.0 * f32_run.max_logit_error,
            "{}: bf16 {:e} vs f32 {:e}",
            s.name,
            bf16_run.max_logit_error,
            f32_run.max_logit_error
        );
    }
}

#[test]
fn a_perturbed_logit_fails_oracle_agreement_and_spec_equals_greedy() {
    let mut s = small("mixed_mtp", 4);
    // The shadow layout forward runs first; keep it off so the lie hits the primary.
    s.check_layouts = false;
    // +50 makes token 3 the argmax of the first sampled position.
    let (c, lied_at) = run_with_lie(
        &s,
        0,
        Lie::Logit {
            token: 3,
            delta: 50.0,
        },
    );
    assert!(failed(&c, CheckKind::OracleAgreement), "{:?}", c.tallies);
    assert!(failed(&c, CheckKind::SpecEqualsGreedy), "{:?}", c.tallies);
    let f = &c.failures[0];
    assert_eq!(
        Some(f.step),
        lied_at,
        "the first failure names the step of the lie: {f:?}"
    );
    // A perturbation far below the tolerance passes: the tolerance is not zero-width.
    let (c, _) = run_with_lie(
        &s,
        0,
        Lie::Logit {
            token: 3,
            delta: 1e-4,
        },
    );
    assert!(!failed(&c, CheckKind::OracleAgreement));
}

#[test]
fn layout_dependent_math_fails_the_layout_check() {
    let (c, _) = run_with_lie(&small("mixed_mtp", 4), 0, Lie::RowDependentHidden);
    assert!(failed(&c, CheckKind::Layouts), "{:?}", c.tallies);
}

#[test]
fn a_padded_only_drafter_difference_fails_padded_equals_compacted() {
    let (c, _) = run_with_lie(&small("padded_eagle", 4), 0, Lie::PaddedDrafter);
    assert!(failed(&c, CheckKind::DrafterBatches), "{:?}", c.tallies);
    // Spec output is still the greedy output: bad drafts only lower acceptance.
    assert!(!failed(&c, CheckKind::SpecEqualsGreedy), "{:?}", c.failures);
}

#[test]
fn same_seed_same_run_different_seed_different_run() {
    let s = small("grammar_mixed", 6);
    let a = serde_json::to_string(&run(&s, 5, |_| {}).unwrap()).unwrap();
    let b = serde_json::to_string(&run(&s, 5, |_| {}).unwrap()).unwrap();
    let c = serde_json::to_string(&run(&s, 6, |_| {}).unwrap()).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn acceptance_rate_controls_acceptance_length() {
    let mut s = small("mixed_mtp", 6);
    let mut lens = Vec::new();
    for rate in [0.0, 0.5, 1.0] {
        s.acceptance_rate = AcceptanceRates::uniform(rate);
        let sum = run(&s, 3, |_| {}).unwrap();
        assert!(sum.passed(), "{:?}", sum.failures);
        lens.push(sum.spec_decoding.mean_acceptance_length);
    }
    assert!(lens[0] < lens[1] && lens[1] < lens[2], "{lens:?}");
    // Rate 1 proposes the oracle's greedy chain: every draft is accepted (barring near-ties).
    assert!(lens[2] > 3.9, "{lens:?}");
}

#[test]
fn temperature_sampling_runs_with_rejection_sampling() {
    let mut s = small("mixed_mtp", 4);
    s.cfg.spec.temperature = 0.8;
    let sum = run(&s, 1, |_| {}).unwrap();
    assert!(sum.passed(), "{:?}", sum.failures);
    assert!(sum
        .checks
        .iter()
        .all(|t| t.check != CheckKind::SpecEqualsGreedy));
    assert!(sum.stats.accepted_drafts > 0);
}

/// Per-position rates: draft i is forced with the i-th rate (given the drafts before it),
/// so vLLM's per-position rate (accepted at i over rows drafted) is the product of the
/// rates up to i, and the mean acceptance length is 1 plus their sum (the analytic
/// expectation), give or take the drafter's own lucky matches.
#[test]
fn per_position_rates_control_each_position() {
    let mut s = small("mixed_mtp", 24);
    let rates = [0.9, 0.5, 0.2];
    s.acceptance_rate = AcceptanceRates::per_position(rates.to_vec()).unwrap();
    assert_eq!(
        s.cfg.spec.num_speculative_tokens, 3,
        "the scenario drafts three positions"
    );
    let sum = run(&s, 9, |_| {}).unwrap();
    assert!(sum.passed(), "{:?}", sum.failures);
    let m = &sum.spec_decoding;
    let mut reach = 1.0;
    for (i, r) in rates.iter().enumerate() {
        reach *= r;
        let got = m.per_position_acceptance_rate[i];
        assert!(
            (got - reach).abs() < 0.08,
            "position {}: accepted at {got}, expected about {reach}",
            i + 1
        );
    }
    let expected = s.acceptance_rate.expected_acceptance_length(3);
    assert!((expected - 2.44).abs() < 1e-12);
    let got = m.mean_acceptance_length;
    assert!(
        (got - expected).abs() < 0.15,
        "mean acceptance length {got}, expected about {expected}"
    );
}

/// Postmortem (issue 22, defect 4): under temperature > 0 the acceptance rate did
/// nothing (4 of 3,153 drafts accepted at rate 0.7). A forced draft is now a draw from
/// the oracle's distribution, verified as the target's own, so the per-position
/// acceptance follows the rate: position i is accepted with about rate^i, and the mean
/// acceptance length is about 1 + sum over i of rate^i (plus the drafter's own small
/// chance).
#[test]
fn acceptance_rate_controls_acceptance_under_temperature() {
    let mut s = small("mixed_mtp", 16);
    s.cfg.spec.temperature = 0.7;
    for rate in [0.0, 0.5, 0.9] {
        s.acceptance_rate = AcceptanceRates::uniform(rate);
        let sum = run(&s, 5, |_| {}).unwrap();
        assert!(sum.passed(), "{:?}", sum.failures);
        let m = &sum.spec_decoding;
        let expected: f64 = 1.0 + (1..=3).map(|i| rate.powi(i)).sum::<f64>();
        let got = m.mean_acceptance_length;
        assert!(
            got >= expected - 0.15 && got <= expected + 0.25,
            "rate {rate}: mean acceptance length {got}, expected about {expected}"
        );
        let first = m.per_position_acceptance_rate[0];
        assert!(
            (first - rate).abs() < 0.08,
            "rate {rate}: position 1 accepted at {first}"
        );
    }
}

fn profile() -> impl Strategy<Value = BackendProfile> {
    prop::sample::select(BackendProfile::ALL.to_vec())
}

prop_compose! {
    /// A random small but complete scenario.
    fn random_scenario()(
        profile in profile(), k in 1usize..=5, dflash in any::<bool>(), padded in any::<bool>(),
        extend_first in any::<bool>(), page in prop::sample::select(vec![1usize, 4, 16]),
        mixed in any::<bool>(), graphs in any::<bool>(), chunk in prop::sample::select(vec![8usize, 32]),
        rate in 0.0f64..=1.0, requests in 2usize..6, max_len in 48usize..128,
        planner in prop::sample::select(Planner::ALL.to_vec()),
        // 0: uncapped; 1..=3: longer rows take longer splits (the policy's cap).
        max_splits in 0usize..=3,
    ) -> Scenario {
        let non_causal = profile.capabilities().non_causal;
        let spec = if dflash && non_causal { SpecConfig::dflash(k) } else {
            SpecConfig::multi_step(k, if padded { DrafterBatch::Padded } else { DrafterBatch::Compacted })
        };
        let max_num_seqs = 4;
        let cfg = EngineConfig {
            model: ModelDims::tiny(),
            spec,
            scheduler: SchedulerConfig {
                max_num_seqs,
                max_num_batched_tokens: 40,
                max_model_len: max_len,
                page_size: page,
                num_gpu_blocks: 3 * max_len.div_ceil(page),
                chunked_prefill: true,
                prefill_chunk_tokens: chunk,
                mixed_batches: mixed,
                row_layout: if extend_first { RowLayout::ExtendFirst } else { RowLayout::DecodeFirst },
                planner,
                workspace_tokens: max_num_seqs * page * 2,
            },
            backends: vec![profile],
            cuda_graphs: graphs,
            max_capture_size_tokens: 24,
            split_size_tokens: 16usize.div_ceil(page) * page,
            max_splits,
            kv_cache_dtype: Default::default(),
            dp_peer_num_tokens: 0,
            faults: Default::default(),
            poison_stale_buffers: false,
            split_override: Default::default(),
        };
        Scenario {
            name: "random".into(),
            description: "proptest".into(),
            cfg,
            workload: WorkloadShape { num_requests: requests, prompt_len: (1, 60.min(max_len - 1)), max_new_tokens: (1, 40), arrival_steps: 6, grammar_fraction: 0.3 },
            acceptance_rate: AcceptanceRates::uniform(rate),
            max_steps: 5_000,
            check_layouts: true,
            check_drafter_batches: true,
        }
    }
}

proptest! {
    // 48 cases in CI; SPECMLA_E2E_CASES=N hunts longer.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("SPECMLA_E2E_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)
    ))]

    /// The headline property: whatever the profile, K, page size, layout, drafter batch,
    /// graphs and mixing, every check passes on the reference backend.
    #[test]
    fn every_check_passes_on_random_configs(s in random_scenario(), seed in 0u64..1000) {
        s.cfg.validate().unwrap();
        let sum = run(&s, seed, |_| {}).unwrap();
        prop_assert!(sum.passed(), "{:?}", sum.failures);
        prop_assert!(!sum.hit_step_limit);
    }
}
