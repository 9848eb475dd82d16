#![no_main]
//! Fuzz target `step_log`: the body is `specmla_replay::audit_log::fuzz_one`, which the
//! corpus replay test (`tests/tests/fuzz_corpora.rs`) also runs over the committed corpus.

libfuzzer_sys::fuzz_target!(|data: &[u8]| specmla_replay::audit_log::fuzz_one(data));
