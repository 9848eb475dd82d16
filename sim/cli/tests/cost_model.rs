//! `sim --cost-model` end to end on the CPU backend, from the committed H200 calibration:
//! the simulated report, its JSON, the DeepSeek-V3 target, and bad input (one line, exit 2).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .output()
        .expect("sim runs")
}

/// The calibration the README shows (`gpu-bench --calibrate` on an H200).
fn calibration() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../plots/results/2026-11-26-h200-calibration-3/calibration.json")
}

const SMALL: [&str; 6] = [
    "--requests",
    "4",
    "--prompt-len",
    "8..24",
    "--max-new-tokens",
    "6..10",
];

fn run(extra: &[&str]) -> Output {
    let cal = calibration();
    let mut args = vec!["--cost-model", cal.to_str().unwrap()];
    args.extend(SMALL);
    args.extend(extra);
    sim(&args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn one_line_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(2), "{}", stdout(o));
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(needle), "{err}");
}

#[test]
fn prices_every_step_on_the_calibrated_device() {
    let o = run(&[]);
    assert!(o.status.success(), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(out.contains("simulated on NVIDIA H200 (calibrated at 00ceb12), the run's model"));
    assert!(out.contains("generated tokens/s"), "{out}");
    assert!(out.contains("decode-only, graph"), "{out}");
}

#[test]
fn json_carries_the_simulated_time_and_it_is_deterministic() {
    let a = run(&["--json"]);
    assert!(a.status.success());
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    let sim = &v["simulated"];
    let total = sim["total_us"].as_f64().unwrap();
    let parts: f64 = ["attention_us", "gemm_us", "comm_us", "host_us"]
        .iter()
        .map(|k| sim[k].as_f64().unwrap())
        .sum();
    assert!(total > 0.0 && (parts - total).abs() < 1e-6 * total, "{sim}");
    assert_eq!(
        sim["comm_us"].as_f64(),
        Some(0.0),
        "one device: no all-reduce"
    );
    let steps: u64 = sim["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["steps"].as_u64().unwrap())
        .sum();
    assert_eq!(Some(steps), sim["steps"].as_u64());
    // The CPU backend times nothing: no measured comparison.
    assert!(sim.get("measured").is_none());
    assert_eq!(stdout(&run(&["--json"])), stdout(&a));
    // The decode-only steps: their time is that kind's total, and they emitted more
    // tokens than they ran steps (K 3 verify rows accept some drafts) but fewer than the
    // run generated (prompt steps emit the first token of each request).
    let decode_kinds: Vec<&serde_json::Value> = sim["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["kind"].as_str().unwrap().starts_with("decode-only"))
        .collect();
    let decode_us: f64 = decode_kinds
        .iter()
        .map(|k| k["total_us"].as_f64().unwrap())
        .sum();
    let decode_steps: u64 = decode_kinds
        .iter()
        .map(|k| k["steps"].as_u64().unwrap())
        .sum();
    assert!((sim["decode_us"].as_f64().unwrap() - decode_us).abs() < 1e-6 * decode_us);
    let tokens = sim["decode_tokens"].as_u64().unwrap();
    let generated = v["stats"]["generated_tokens"].as_u64().unwrap();
    assert!(
        tokens > decode_steps && tokens < generated,
        "{tokens} {decode_steps} {generated}"
    );
}

#[test]
fn a_deepseek_v3_rank_costs_more_and_all_reduces() {
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["--json"];
        args.extend(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", stdout(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["simulated"].clone()
    };
    let engine = json(&[]);
    let tp8 = json(&["--cost-target", "deepseek-v3:8"]);
    let tp16 = json(&["--cost-target", "deepseek-v3:16"]);
    assert!(tp8["target"]
        .as_str()
        .unwrap()
        .contains("61 layers, one rank of tp 8"));
    let total = |v: &serde_json::Value| v["total_us"].as_f64().unwrap();
    assert!(total(&tp8) > 10.0 * total(&engine));
    assert!(tp8["comm_us"].as_f64().unwrap() > 0.0);
    // Half the heads and experts per rank: a tp 16 rank's step is cheaper.
    assert!(total(&tp16) < total(&tp8));
    // FP8 weights halve the weight bytes of the projections and experts, not the LM
    // head, the attention or the all-reduces: cheaper, but by less than half.
    let fp8 = json(&["--cost-target", "deepseek-v3-fp8:8"]);
    assert!(fp8["target"].as_str().unwrap().contains("FP8 weights"));
    let gemm = |v: &serde_json::Value| v["gemm_us"].as_f64().unwrap();
    assert!(gemm(&fp8) < 0.9 * gemm(&tp8) && gemm(&fp8) > 0.4 * gemm(&tp8));
    assert_eq!(fp8["attention_us"], tp8["attention_us"]);
    assert_eq!(fp8["comm_us"], tp8["comm_us"]);
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    one_line_error(
        &sim(&["--cost-model", "/nonexistent/cal.json"]),
        "--cost-model /nonexistent/cal.json",
    );
    let dir = std::env::temp_dir().join(format!("specmla-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.json");
    std::fs::write(&garbage, "{\"format\": 1}").unwrap();
    one_line_error(
        &sim(&["--cost-model", garbage.to_str().unwrap()]),
        "not a calibration file",
    );
    // A fit edited by hand no longer matches its samples.
    let text = std::fs::read_to_string(calibration()).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let o = v["gemm"]["fit"]["overhead_us"].as_f64().unwrap();
    v["gemm"]["fit"]["overhead_us"] = serde_json::json!(o * 0.5);
    let edited = dir.join("edited.json");
    std::fs::write(&edited, v.to_string()).unwrap();
    one_line_error(
        &sim(&["--cost-model", edited.to_str().unwrap()]),
        "gemm: the fit does not match its samples",
    );
    one_line_error(
        &run(&["--cost-target", "deepseek-v3:3"]),
        "--cost-target deepseek-v3:3",
    );
    one_line_error(&run(&["--cost-target", "llama"]), "expected `engine`");
    let o = sim(&["--cost-target", "engine"]);
    assert_eq!(o.status.code(), Some(2), "--cost-target needs --cost-model");
    let _ = std::fs::remove_dir_all(&dir);
}
