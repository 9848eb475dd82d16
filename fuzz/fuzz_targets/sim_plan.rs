#![no_main]
//! Fuzz target `sim_plan`: the body is `specmla_sim::plan_explain::fuzz_one`, which the corpus replay test
//! (`tests/tests/fuzz_corpora.rs`) also runs over the committed corpus.

libfuzzer_sys::fuzz_target!(|data: &[u8]| specmla_sim::plan_explain::fuzz_one(data));
