#![no_main]
//! Fuzz target `run_config`: the body is `specmla_sim::config_file::fuzz_one`, which the corpus replay test
//! (`tests/tests/fuzz_corpora.rs`) also runs over the committed corpus.

libfuzzer_sys::fuzz_target!(|data: &[u8]| specmla_sim::config_file::fuzz_one(data));
