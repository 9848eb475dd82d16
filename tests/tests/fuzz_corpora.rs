//! Replays every committed fuzz corpus (`fuzz/corpus/<target>/`) through the fuzz
//! targets' own bodies, so CI re-checks on every run what the fuzzing campaign found
//! and kept, without the fuzzer: each input must run to the end without a panic.

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "{}: an empty corpus checks nothing",
        dir.display()
    );
    files
}

fn replay(target: &str, body: fn(&[u8])) {
    for f in corpus(target) {
        let data = std::fs::read(&f).unwrap();
        let r = std::panic::catch_unwind(|| body(&data));
        assert!(r.is_ok(), "{target}: {} panicked", f.display());
    }
}

#[test]
fn trace_reader_corpus() {
    replay("trace_reader", specmla_traces::fuzzing::read_any);
}

#[test]
fn replay_show_corpus() {
    replay("replay_show", specmla_replay::show::fuzz_one);
}

#[test]
fn sim_plan_corpus() {
    replay("sim_plan", specmla_sim::plan_explain::fuzz_one);
}

#[test]
fn run_config_corpus() {
    replay("run_config", specmla_sim::config_file::fuzz_one);
}

#[test]
fn step_log_corpus() {
    replay("step_log", specmla_replay::audit_log::fuzz_one);
}
