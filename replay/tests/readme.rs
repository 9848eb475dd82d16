//! The README's `replay` examples (the F1 story: replay with the fault, bisect, show),
//! run as written and compared with the page. `sim --trace FILE` records through the
//! library, exactly as the `sim` binary does.

#[path = "../../tests/readme_harness.rs"]
mod readme_harness;

use std::process::Command;

use readme_harness::{assert_shown, examples, scratch};

fn record(path: &std::path::Path) {
    let s = specmla_sim::scenarios::by_name("mixed_mtp").unwrap();
    let out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut sink = specmla_sim::record::TraceSink::new(out, false);
    let cpu = specmla_cpu::cpu_backend;
    specmla_sim::runner::run_with(&s, 0, cpu, Some(&mut sink), |_| {}).unwrap();
}

#[test]
fn readme_f1_replay_bisect_show() {
    let dir = scratch("replay-f1");
    for e in examples("replay-f1", &dir) {
        let o = match e.argv[0].as_str() {
            "sim" => {
                assert_eq!(e.argv[1..], ["--trace".to_string(), "mixed_mtp.bin".into()]);
                record(&dir.join("mixed_mtp.bin"));
                continue;
            }
            "replay" => Command::new(env!("CARGO_BIN_EXE_replay"))
                .args(&e.argv[1..])
                .current_dir(&dir)
                .output()
                .expect("replay runs"),
            other => panic!("the block runs sim and replay, not {other}"),
        };
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{}: {stderr}",
            e.argv.join(" ")
        );
        assert_shown(&e, &String::from_utf8_lossy(&o.stdout));
    }
}

/// `sim --scenario NAME [--fault F] --step-log FILE`, run through the library as the
/// `sim` binary runs it.
fn write_step_log(argv: &[String], dir: &std::path::Path) {
    let mut s = None;
    let mut faults = specmla_core::fault::Faults::none();
    let mut path = None;
    let mut args = argv.iter();
    while let Some(a) = args.next() {
        let v = args.next().expect("each flag takes a value");
        match a.as_str() {
            "--scenario" => s = specmla_sim::scenarios::by_name(v),
            "--fault" => faults = faults.with(specmla_core::fault::Fault::from_id(v).unwrap()),
            "--step-log" => path = Some(dir.join(v)),
            other => panic!("the block's sim takes --scenario, --fault, --step-log, not {other}"),
        }
    }
    let mut s = s.expect("a scenario");
    s.cfg.faults = faults;
    let out = std::io::BufWriter::new(std::fs::File::create(path.unwrap()).unwrap());
    let mut sink = specmla_sim::step_log::StepLogSink::new(out, &s.cfg);
    let cpu = specmla_cpu::cpu_backend;
    let _ = specmla_sim::runner::run_with(&s, 0, cpu, Some(&mut sink), |_| {});
}

#[test]
fn readme_step_log_audit() {
    let dir = scratch("step-log");
    for e in examples("step-log", &dir) {
        if e.argv[0] == "sim" {
            write_step_log(&e.argv[1..], &dir);
            continue;
        }
        let o = Command::new(env!("CARGO_BIN_EXE_replay"))
            .args(&e.argv[1..])
            .current_dir(&dir)
            .output()
            .expect("replay runs");
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{}",
            e.argv.join(" ")
        );
        assert_shown(&e, &String::from_utf8_lossy(&o.stdout));
    }
}
