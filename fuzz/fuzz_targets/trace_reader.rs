#![no_main]
//! Fuzz target `trace_reader`: the body is `specmla_traces::fuzzing::read_any`, which the corpus replay test
//! (`tests/tests/fuzz_corpora.rs`) also runs over the committed corpus.

libfuzzer_sys::fuzz_target!(|data: &[u8]| specmla_traces::fuzzing::read_any(data));
