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
