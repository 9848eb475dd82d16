//! proptest strategies shared by the suites (proptest is a dev-dependency, so they
//! cannot live in `src/lib.rs`). Each suite uses a subset, hence the dead_code allow.
#![allow(dead_code)]

use std::fmt::Debug;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRng, TestRunner};
use specmla_core::config::{BackendProfile, RowLayout};
use specmla_tests::RowSpec;

pub fn profile() -> impl Strategy<Value = BackendProfile> {
    prop::sample::select(BackendProfile::ALL.to_vec())
}

/// Profiles that support non-causal attention (the DFlash drafter needs it).
pub fn non_causal_profile() -> impl Strategy<Value = BackendProfile> {
    prop::sample::select(vec![
        BackendProfile::FlashInferMla,
        BackendProfile::FlashAttnMla,
        BackendProfile::TritonMla,
    ])
}

pub fn layout() -> impl Strategy<Value = RowLayout> {
    prop::sample::select(vec![RowLayout::DecodeFirst, RowLayout::ExtendFirst])
}

/// A verify row with context in `1..max_ctx` and `0..=k` drafts (usually k) drawn from
/// `0..vocab`.
pub fn verify_row(k: usize, max_ctx: usize, vocab: u32) -> impl Strategy<Value = RowSpec> {
    let nd = prop_oneof![3 => Just(k), 1 => 0..=k];
    (1..max_ctx, nd)
        .prop_flat_map(move |(c, nd)| (Just(c), prop::collection::vec(0..vocab, nd)))
        .prop_map(|(c, drafts)| RowSpec::verify(c, drafts))
}

/// A fresh prompt chunk (no context), sampling or partial.
pub fn prefill_row(max_q: usize) -> impl Strategy<Value = RowSpec> {
    (1..=max_q, any::<bool>()).prop_map(|(q, samples)| RowSpec::chunk(0, q, samples))
}

/// A later prompt chunk (context > 0, q >= 2), sampling or partial.
pub fn extend_row(max_ctx: usize, max_q: usize) -> impl Strategy<Value = RowSpec> {
    (1..max_ctx, 2..=max_q, any::<bool>()).prop_map(|(c, q, samples)| RowSpec::chunk(c, q, samples))
}

/// A mixed row: prefill, extend, verify, or a fresh prompt of exactly 1 + K tokens.
pub fn mixed_row(k: usize, max_ctx: usize, vocab: u32) -> impl Strategy<Value = RowSpec> {
    prop_oneof![
        2 => prefill_row(40),
        2 => extend_row(max_ctx, 40),
        5 => verify_row(k, max_ctx, vocab),
        1 => Just(RowSpec::chunk(0, 1 + k, true)),
    ]
}

/// Runs `property` (true = holds) with proptest and returns the shrunk failing input;
/// panics if no case fails (the fault went unnoticed).
pub fn shrunk<S: Strategy>(strategy: S, property: impl Fn(&S::Value) -> bool) -> S::Value
where
    S::Value: Debug,
{
    let config = Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config.clone(),
        TestRng::deterministic_rng(config.rng_algorithm),
    );
    let result = runner.run(&strategy, |v| {
        prop_assert!(property(&v));
        Ok(())
    });
    match result {
        Err(TestError::Fail(_, v)) => {
            eprintln!("shrunk to {v:?}");
            v
        }
        other => panic!("the fault was not caught: {other:?}"),
    }
}
