//! The README's `sim` examples, run as written and compared with the page.

#[path = "../../../tests/readme_harness.rs"]
mod readme_harness;

use std::process::Command;

use readme_harness::{assert_shown, examples, scratch};

fn run_block(name: &str) {
    let dir = scratch(name);
    let all = examples(name, &dir);
    assert!(!all.is_empty(), "block {name} has no command");
    for e in all {
        assert_eq!(e.argv[0], "sim", "block {name} runs only sim");
        let o = Command::new(env!("CARGO_BIN_EXE_sim"))
            .args(&e.argv[1..])
            .current_dir(&dir)
            .output()
            .expect("sim runs");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{}: {stderr}", e.argv.join(" "));
        assert_shown(&e, &String::from_utf8_lossy(&o.stdout));
    }
}

/// The summary of the default run, at the top of the README.
#[test]
fn readme_default_run() {
    run_block("sim-default");
}

/// The `sim plan` example where the two planners disagree.
#[test]
fn readme_sim_plan() {
    run_block("sim-plan");
}

/// `sim config` and a run of the file it printed.
#[test]
fn readme_sim_config() {
    run_block("sim-config");
}
