//! The `sim` binary's contract: exit 0 on success, 2 with one clear line on bad input
//! or impossible configs (never a panic), and the keys of `sim plan`'s JSON.

use std::path::PathBuf;
use std::process::{Command, Output};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .output()
        .expect("sim runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit 2, no panic, and the message mentions every `needle`.
fn assert_bad_input(args: &[&str], needles: &[&str]) {
    let o = sim(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "args {args:?}: stderr {err}");
    assert!(!err.contains("panicked"), "args {args:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "args {args:?}: {n:?} missing from {err:?}");
    }
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specmla-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn default_run_passes_and_summarizes() {
    let o = sim(&["--requests", "6"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    for key in [
        "scenario mixed_mtp",
        "backend cpu",
        "device                       CPU reference (f32)",
        "mean acceptance length",
        "draft acceptance rate",
        "per-position acceptance rate",
        "spec == greedy",
        "oracle agreement",
        "PASS",
    ] {
        assert!(out.contains(key), "{key:?} missing from summary:\n{out}");
    }
}

#[test]
fn json_summary_is_machine_readable() {
    let o = sim(&["--scenario", "graphs", "--requests", "5", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(v["scenario"], "graphs");
    assert_eq!(v["num_failures"], 0);
    assert_eq!(v["backend"], "cpu");
    assert_eq!(v["device"], "CPU reference (f32)");
    assert!(
        v["stats"]["graph_steps"].as_u64().unwrap() > 0,
        "graphs scenario replayed no graph"
    );
    // The config block, checks under their text names, vLLM's metric names.
    assert_eq!(v["config"]["workload"]["num_requests"], 5);
    assert_eq!(v["config"]["engine"]["backends"][0], "flashmla");
    assert_eq!(v["checks"][0]["check"], "invariants");
    let sd = &v["spec_decoding"];
    let per_pos = sd["num_accepted_tokens_per_pos"].as_array().unwrap();
    assert_eq!(per_pos.len(), 3, "K = 3 positions");
    let accepted: u64 = per_pos.iter().map(|x| x.as_u64().unwrap()).sum();
    assert_eq!(sd["num_accepted_tokens"].as_u64().unwrap(), accepted);
    let rate = sd["draft_acceptance_rate"].as_f64().unwrap();
    let want = accepted as f64 / sd["num_draft_tokens"].as_f64().unwrap();
    assert!((rate - want).abs() < 1e-12);
    let rates = sd["per_position_acceptance_rate"].as_array().unwrap();
    assert!(
        rates.windows(2).all(|w| w[0].as_f64() >= w[1].as_f64()),
        "{rates:?}"
    );
}

/// `sim config` prints a file `sim --config` runs to the same result; flags override
/// it; a bad key names itself; `--json` works before and after a subcommand.
#[test]
fn config_files_round_trip_and_json_is_everywhere() {
    let o = sim(&[
        "config",
        "--scenario",
        "graphs",
        "--max-num-seqs",
        "6",
        "--seed",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        text.contains(
            "# most requests in one step (vLLM's max_num_seqs) (default 16)\nmax_num_seqs = 6"
        ),
        "{text}"
    );
    let f = temp_file("run.toml", &text);
    let from_file = sim(&["--config", f.to_str().unwrap(), "--requests", "3", "--json"]);
    let direct = sim(&[
        "--scenario",
        "graphs",
        "--max-num-seqs",
        "6",
        "--seed",
        "3",
        "--requests",
        "3",
        "--json",
    ]);
    assert_eq!(from_file.status.code(), Some(0), "{}", stderr(&from_file));
    assert_eq!(
        from_file.stdout, direct.stdout,
        "the file runs what the flags run"
    );
    let bad = temp_file("bad.toml", &text.replace("max_num_seqs", "max_num_seq"));
    assert_bad_input(
        &["--config", bad.to_str().unwrap()],
        &["bad.toml", "max_num_seq"],
    );
    assert_bad_input(
        &["--config", f.to_str().unwrap(), "--scenario", "graphs"],
        &["--scenario"],
    );
    for args in [["--json", "list"], ["list", "--json"]] {
        let o = sim(&args);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert!(v["scenarios"].is_array());
    }
    let o = sim(&["--check-determinism", "--requests", "2", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["deterministic"], true);
}

/// Without a terminal, a long run still reports progress on stderr.
#[test]
fn progress_lines_without_a_terminal() {
    let o = Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(["--requests", "3"])
        .env("SPECMLA_PROGRESS_SECS", "0")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.starts_with("sim: ") && l.contains("/3 requests finished, step")),
        "{err}"
    );
}

/// Ctrl-C: the summary so far, exit 130, and a trace that reads back whole.
#[cfg(unix)]
#[test]
fn ctrl_c_prints_the_summary_so_far_and_closes_the_trace() {
    let t = std::env::temp_dir().join(format!("specmla-int-{}.bin", std::process::id()));
    let o = interrupted_sim(&["--requests", "2000", "--trace", t.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(130), "{out}{}", stderr(&o));
    assert!(out.contains("note: interrupted (Ctrl-C) after"), "{out}");
    // An interrupted run is never reported as a pass.
    assert!(
        out.contains("INTERRUPTED") && !out.contains("PASS"),
        "{out}"
    );
    let (_, records, completeness) = specmla_traces::read_all(&t).unwrap();
    assert_eq!(completeness, specmla_traces::Completeness::Complete);
    assert!(!records.is_empty());
}

/// `sim args`, sent Ctrl-C (SIGINT) after 1.5 s.
#[cfg(unix)]
fn interrupted_sim(args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = child.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status().unwrap();
    child.wait_with_output().unwrap()
}

/// `--check-determinism` stops on Ctrl-C too: two partial runs prove nothing, so it says
/// so and exits 130.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_a_determinism_check_without_a_verdict() {
    let o = interrupted_sim(&["--requests", "2000", "--check-determinism"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(130), "{out}{}", stderr(&o));
    assert!(
        out.contains("INTERRUPTED (Ctrl-C) during run 1 of 2"),
        "{out}"
    );
}

#[test]
fn list_names_scenarios_and_profiles() {
    let o = sim(&["list"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0));
    for name in [
        "mixed_mtp",
        "cutlass_mtp",
        "padded_eagle",
        "dflash",
        "graphs",
        "grammar_mixed",
    ] {
        assert!(out.contains(name), "{name} missing");
    }
    for name in [
        "flashmla",
        "flashinfer-mla",
        "cutlass-mla",
        "flashattn-mla",
        "triton-mla",
    ] {
        assert!(out.contains(name), "{name} missing");
    }
    // Each scenario's distinguishing settings, and the planners.
    assert!(
        out.contains("flashattn-mla, DFlash K=8, 10 requests, page 16"),
        "{out}"
    );
    assert!(out.contains("planners: vllm, vllm-3region"), "{out}");
    assert!(
        out.contains("deepseek-v3-attn  DeepSeek-V3's attention widths"),
        "{out}"
    );
    // Every fault, with the engine bug it mirrors and what makes it fire.
    for id in (1..=16).map(|i| format!("  F{i} ")) {
        assert!(out.contains(&id), "{id:?} missing from {out}");
    }
    assert_eq!(out.matches("fires with: ").count(), 16, "{out}");
    let o = sim(&["list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["scenarios"][3]["config"]["engine"]["spec"]["method"],
        "dflash"
    );
    assert_eq!(v["models"][1]["dims"]["q_lora_rank"], 1536);
    assert_eq!(v["faults"][11]["id"], "F12");
    assert!(v["faults"][0]["trigger"]
        .as_str()
        .unwrap()
        .contains("K = 1"));
}

/// DeepSeek-V3's attention widths, one tensor-parallel rank of 16 (8 heads): every check
/// passes on the CPU reference against the f64 oracle, and the summary names the widths.
#[test]
fn the_real_width_model_passes_on_one_tp_rank() {
    let args = [
        "--model",
        "deepseek-v3-attn",
        "--tp",
        "16",
        "--requests",
        "2",
        "--prompt-len",
        "8..24",
        "--max-new-tokens",
        "4..8",
    ];
    let o = sim(&args);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("hidden 7168, 8 heads, q_lora 1536, latent 512 + 64, nope 128, v 128, 2 layers, vocabulary 4096"), "{out}");
    assert!(out.contains("PASS: all checks passed"), "{out}");
}

/// A config file is checked as flags are, on the merged configuration: every bad value
/// is one line naming its key (exit 2), never a panic, and never a run that checks
/// nothing reported as a pass.
#[test]
fn config_files_are_checked_like_flags() {
    let o = sim(&["config"]);
    let base = String::from_utf8_lossy(&o.stdout).into_owned();
    let cases = [
        ("acceptance_rate", "2.0", "acceptance_rate"),
        ("grammar_fraction", "2.0", "grammar_fraction"),
        ("max_new_tokens", "[10, 5]", "max_new_tokens"),
        ("num_requests", "0", "num_requests"),
        ("num_requests", "100001", "at most 100000"),
        ("max_steps", "0", "max_steps"),
        ("rope_theta", "-1.0", "rope_theta"),
        ("rope_theta", "nan", "rope_theta"),
        ("prompt_len", "[0, 0]", "prompt_len"),
        ("prompt_len", "[10, 1000]", "max_model_len 384"),
    ];
    for (key, value, needle) in cases {
        let mut replaced = false;
        let text: String = base
            .lines()
            .map(|l| {
                if l.starts_with(&format!("{key} = ")) && !replaced {
                    replaced = true;
                    format!("{key} = {value}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        assert!(replaced, "no {key} line in `sim config`");
        let p = temp_file(&format!("bad-{key}.toml"), &text);
        assert_bad_input(&["--config", p.to_str().unwrap()], &[needle]);
        let err = stderr(&sim(&["--config", p.to_str().unwrap()]));
        assert_eq!(err.lines().count(), 1, "{key} = {value}: {err}");
    }
    // The same rules reach flags, and a prompt that cannot fit is refused, not truncated.
    assert_bad_input(
        &["--prompt-len", "1000"],
        &["--prompt-len", "max_model_len 384"],
    );
    assert_bad_input(
        &["--steps", "1", "--acceptance-rate", "nan"],
        &["acceptance"],
    );
}

/// A bad `SPECMLA_PROGRESS_SECS` is one line naming it (it used to panic), and a closed
/// stderr loses the progress lines without ending the run.
#[test]
fn progress_settings_and_a_closed_stderr_never_panic() {
    for v in ["-1", "nan", "inf", "1e20", "soon"] {
        let o = Command::new(env!("CARGO_BIN_EXE_sim"))
            .args(["--requests", "2"])
            .env("SPECMLA_PROGRESS_SECS", v)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{v}: {err}");
        assert!(
            err.contains("SPECMLA_PROGRESS_SECS") && err.lines().count() == 1,
            "{v}: {err}"
        );
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(["--requests", "20", "--steps", "40"])
        .env("SPECMLA_PROGRESS_SECS", "0.000001")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "a closed stderr ended the run: {status:?}"
    );
}

/// Small input defects of issue 22: each one clear line and exit 2, or accepted as meant.
#[test]
fn small_input_defects_are_one_line_or_understood() {
    assert_bad_input(
        &["--requests", "-5"],
        &["--requests", "whole number from 1 to 100000"],
    );
    assert_bad_input(&["--tp", "0"], &["--tp", "whole number from 1 to 1024"]);
    assert_bad_input(&["--requests", "2", "--trace", "-"], &["--trace -", "file"]);
    assert!(
        !std::path::Path::new("-").exists(),
        "--trace - wrote a file named -"
    );
    assert_bad_input(
        &["--dp-peer-tokens", "18446744073709551615"],
        &["dp_peer_num_tokens"],
    );
    // A byte-order mark before a batch file's JSON or a config file's TOML is not an error.
    let batch = temp_file(
        "bom-batch.json",
        "\u{feff}{\"page_size\": 16, \"rows\": [{\"num_computed_tokens\": 5, \"num_scheduled_tokens\": 2}]}",
    );
    let o = sim(&[
        "plan",
        "--batch",
        batch.to_str().unwrap(),
        "--profile",
        "flashmla",
        "--num-spec-tokens",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let config = String::from_utf8_lossy(&sim(&["config"]).stdout).into_owned();
    let p = temp_file("bom.toml", &format!("\u{feff}{config}"));
    let o = sim(&["config", "--config", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // `sim plan` refuses the page sizes `sim` refuses.
    let odd = temp_file(
        "page3.json",
        r#"{"page_size": 3, "rows": [{"num_computed_tokens": 5, "num_scheduled_tokens": 2}]}"#,
    );
    let odd = odd.to_str().unwrap();
    let plan = [
        "plan",
        "--batch",
        odd,
        "--profile",
        "flashmla",
        "--num-spec-tokens",
        "1",
    ];
    assert_bad_input(&plan, &["page size 3", "power of two"]);
}

/// An armed fault is counted: where it fires the summary says how often; where it never
/// fires the run is not a pass, and the line names a workload where it does.
#[test]
fn armed_faults_are_counted_and_an_unfired_one_is_no_pass() {
    let o = sim(&["--scenario", "graphs", "--fault", "F12", "--requests", "6"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("faults armed                 F12 fired in "),
        "{out}"
    );
    let o = sim(&["--fault", "F14", "--requests", "4"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("F14 fired in 0 steps"), "{out}");
    assert!(
        out.contains("NOT EXERCISED: fault F14 was armed but never fired on this run; it fires with: TritonMLA"),
        "{out}"
    );
    assert!(!out.contains("PASS"), "{out}");
    let o = sim(&["--fault", "F14", "--requests", "4", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["faults"][0]["id"], "F14");
    assert_eq!(v["faults"][0]["fired_steps"], 0);
}

#[test]
fn unknown_values_list_the_valid_ones() {
    assert_bad_input(&["--scenario", "nope"], &["mixed_mtp", "dflash"]);
    assert_bad_input(&["--profile", "nope"], &["flashmla", "triton-mla"]);
    assert_bad_input(&["--drafter-batch", "sideways"], &["padded", "compacted"]);
    assert_bad_input(&["--seed", "-3"], &["--seed"]);
    assert_bad_input(&["--frobnicate"], &["--frobnicate"]);
}

#[test]
fn impossible_configs_fail_at_start_up_with_one_line() {
    assert_bad_input(
        &["--scenario", "dflash", "--profile", "flashmla"],
        &["non-causal", "flashmla"],
    );
    assert_bad_input(
        &["--scenario", "dflash", "--drafter-batch", "padded"],
        &["compacted"],
    );
    assert_bad_input(&["--num-spec-tokens", "0"], &["num-spec-tokens", "0"]);
    assert_bad_input(&["--workspace-tokens", "8"], &["workspace", "page"]);
    assert_bad_input(&["--acceptance-rate", "1.5"], &["acceptance-rate"]);
    assert_bad_input(&["--temperature", "-1"], &["temperature"]);
    assert_bad_input(&["--page-size", "0"], &["page size"]);
    assert_bad_input(&["--page-size", "3"], &["page size 3", "power of two"]);
    assert_bad_input(&["--seed", "-1"], &["--seed", "non-negative integer"]);
    assert_bad_input(
        &["--prompt-len", "9..3"],
        &["--prompt-len", "MIN is above MAX"],
    );
    assert_bad_input(&["--max-num-seqs", "0"], &["max_num_seqs"]);
    assert_bad_input(&["--max-model-len", "1"], &["max_model_len"]);
    assert_bad_input(
        &["--num-gpu-blocks", "30000000"],
        &["of host memory (target KV cache", "--num-gpu-blocks"],
    );
    // A real-width model too deep for the host: refused before a weight is drawn.
    assert_bad_input(
        &["--model", "deepseek-v3-attn", "--num-layers", "40"],
        &[
            "needs",
            "target weights",
            "f64 oracle",
            "above the limit of 16.00 GiB",
            "--tp",
        ],
    );
    assert_bad_input(
        &["--model", "deepseek-v3-attn", "--tp", "3"],
        &["--tp 3", "128 heads"],
    );
    assert_bad_input(&["--model", "gpt-2"], &["tiny", "deepseek-v3-attn"]);
    assert_bad_input(&["--tp", "0"], &["--tp"]);
    assert_bad_input(
        &["--max-model-len", "100000000"],
        &["max_model_len", "above"],
    );
    let o = sim(&["--scenario", "dflash", "--profile", "cutlass-mla"]);
    assert_eq!(
        stderr(&o).lines().count(),
        1,
        "more than one line: {}",
        stderr(&o)
    );
}

#[test]
fn plan_explains_a_batch() {
    let f = temp_file(
        "batch.json",
        r#"{"page_size": 64, "rows": [
            {"num_computed_tokens": 0, "num_scheduled_tokens": 300},
            {"num_computed_tokens": 100, "num_scheduled_tokens": 4},
            {"num_computed_tokens": 900, "num_scheduled_tokens": 4},
            {"num_computed_tokens": 50, "num_scheduled_tokens": 2}]}"#,
    );
    let o = sim(&[
        "plan",
        "--batch",
        f.to_str().unwrap(),
        "--profile",
        "flashinfer-mla",
        "--num-spec-tokens",
        "3",
        "--workspace-tokens",
        "256",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for key in [
        "threshold",
        "require_uniform",
        "order",
        "num_decodes",
        "num_decode_tokens",
        "num_prefills",
        "query_start_loc",
        "seq_lens",
        "prefill_chunks",
        "cudagraph",
    ] {
        assert!(v.get(key).is_some(), "{key} missing");
    }
    assert_eq!(v["threshold"], 4);
    assert_eq!(v["planner"], "vllm");
    // vLLM's swaps: the prompt (slot 0) trades places with the q=2 row (slot 3); rows 1
    // and 2 are already in the decode region and stay.
    assert_eq!(v["order"], serde_json::json!([3, 1, 2, 0]));
    assert_eq!(v["reordered"], true);
    assert_eq!(
        v["num_decodes"], 1,
        "the leading q=2 row sets the uniform q; the q=4 rows end the decodes"
    );
    assert_eq!(v["num_decode_tokens"], 2);
    assert_eq!(v["query_start_loc"], serde_json::json!([0, 2, 6, 10, 310]));
    assert_eq!(v["rows"][3]["region"], "prefill");
    assert_eq!(v["rows"][1]["region"], "decode");
    assert_eq!(v["rows"][1]["path"], "prefill");
    // Two prefill-path rows with context: 256 / 2 = 128 tokens each per chunk.
    assert_eq!(v["prefill_chunks"]["chunk_size_tokens"], 128);
    assert_eq!(v["prefill_chunks"]["chunks"][0]["rows"][0]["input_row"], 1);
    assert_eq!(v["prefill_chunks"]["chunks"][0]["rows"][0]["len"], 100);
    assert!(v["cudagraph"]["graph"].is_null());
}

#[test]
fn plan_on_single_only_sends_verify_rows_to_prefill() {
    let f = temp_file(
        "verify.json",
        r#"{"page_size": 16, "rows": [{"num_computed_tokens": 40, "num_scheduled_tokens": 4}, {"num_computed_tokens": 70, "num_scheduled_tokens": 4}]}"#,
    );
    let o = sim(&[
        "plan",
        "--batch",
        f.to_str().unwrap(),
        "--profile",
        "cutlass-mla",
        "--num-spec-tokens",
        "3",
        "--workspace-tokens",
        "64",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["threshold"], 1);
    assert_eq!(v["num_decodes"], 0);
    assert_eq!(v["num_prefills"], 2);
    assert_eq!(v["prefill_chunks"]["chunk_size_tokens"], 32);
    assert_eq!(v["prefill_chunks"]["chunks"].as_array().unwrap().len(), 3);
}

#[test]
fn plan_dispatches_uniform_verify_batches_onto_graphs() {
    let f = temp_file(
        "graph.json",
        r#"{"page_size": 64, "rows": [{"num_computed_tokens": 40, "num_scheduled_tokens": 4}, {"num_computed_tokens": 70, "num_scheduled_tokens": 4}, {"num_computed_tokens": 9, "num_scheduled_tokens": 4}]}"#,
    );
    let o = sim(&[
        "plan",
        "--batch",
        f.to_str().unwrap(),
        "--profile",
        "flashmla",
        "--num-spec-tokens",
        "3",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cudagraph"]["graph"]["num_tokens"], 16);
    assert_eq!(v["cudagraph"]["padding_rows"], 1);
}

fn plan_json(args: &[&str], stdin: &str) -> serde_json::Value {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sim runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The README's example where the planners disagree: FlashMLA, K = 3, a 32-token chunk
/// of a prompt that is not done sits between two verify rows. The four-region planner
/// makes it a short extend and swaps the second verify row ahead of it (two decodes);
/// the three-region planner calls it a decode, keeps the order, and its q = 32 ends the
/// uniform q = 4 decodes after one row.
#[test]
fn plan_planners_disagree_on_a_short_extend() {
    let batch = r#"{"page_size": 64, "rows": [
        {"num_computed_tokens": 100, "num_scheduled_tokens": 4, "num_prompt_tokens": 90},
        {"num_computed_tokens": 64, "num_scheduled_tokens": 32, "num_prompt_tokens": 200},
        {"num_computed_tokens": 300, "num_scheduled_tokens": 4, "num_prompt_tokens": 250}]}"#;
    let args = |planner| {
        [
            "plan",
            "--batch",
            "-",
            "--profile",
            "flashmla",
            "--num-spec-tokens",
            "3",
            "--planner",
            planner,
        ]
    };
    let v = plan_json(&args("vllm"), batch);
    assert_eq!(v["order"], serde_json::json!([0, 2, 1]));
    assert_eq!(v["num_decodes"], 2);
    assert_eq!(v["rows"][2]["region"], "short_extend");
    let v = plan_json(&args("vllm-3region"), batch);
    assert_eq!(v["planner"], "vllm-3region");
    assert_eq!(v["order"], serde_json::json!([0, 1, 2]));
    assert_eq!(v["num_decodes"], 1);
    assert_eq!(v["rows"][1]["region"], "decode");
}

/// Raw split flags override the profile; a q = 0 padding row is a decode only in an
/// all-uniform batch, and a graph is never dispatched for a batch that carries one.
#[test]
fn plan_takes_raw_split_flags_and_padding_rows() {
    let batch = r#"{"page_size": 16, "rows": [
        {"num_computed_tokens": 10, "num_scheduled_tokens": 2},
        {"num_computed_tokens": 20, "num_scheduled_tokens": 2},
        {"num_computed_tokens": 0, "num_scheduled_tokens": 0, "num_prompt_tokens": 5}]}"#;
    let base = [
        "plan",
        "--batch",
        "-",
        "--profile",
        "flashattn-mla",
        "--num-spec-tokens",
        "1",
    ];
    let v = plan_json(&base, batch);
    assert_eq!(
        (v["threshold"].clone(), v["require_uniform"].clone()),
        (512.into(), false.into())
    );
    assert_eq!(
        v["num_decodes"], 3,
        "every q fits the threshold: the fast path"
    );
    let mut args = base.to_vec();
    args.extend([
        "--reorder-batch-threshold",
        "3",
        "--require-uniform",
        "true",
    ]);
    let v = plan_json(&args, batch);
    assert_eq!(v["threshold"], 3);
    assert_eq!(v["num_decodes"], 3, "q = 2, 2, 0: a padded uniform batch");
    assert!(v["cudagraph"]["reason"]
        .as_str()
        .unwrap()
        .contains("q_len 0"));
    let v = plan_json(
        &args,
        &batch.replace(
            r#""num_scheduled_tokens": 0"#,
            r#""num_scheduled_tokens": 1"#,
        ),
    );
    assert_eq!(
        v["num_decodes"], 2,
        "q = 1 differs from the first decode's q = 2"
    );
}

#[test]
fn malformed_batches_name_the_field() {
    let cases = [
        ("{", "not valid JSON"),
        (r#"{"rows": []}"#, "page_size"),
        (
            r#"{"page_size": 0, "rows": [{"num_computed_tokens": 1, "num_scheduled_tokens": 1}]}"#,
            "page_size",
        ),
        (r#"{"page_size": 16, "rows": []}"#, "rows"),
        (
            r#"{"page_size": 16, "rows": [{"num_computed_tokens": 1}]}"#,
            "rows[0].num_scheduled_tokens",
        ),
        (
            r#"{"page_size": 16, "rows": [{"num_computed_tokens": -1, "num_scheduled_tokens": 1}]}"#,
            "rows[0].num_computed_tokens",
        ),
        (
            r#"{"page_size": 16, "rows": [{"num_computed_tokens": 1, "num_scheduled_tokens": 1, "num_prompt_tokens": 0}]}"#,
            "rows[0].num_prompt_tokens",
        ),
        (
            r#"{"page_size": 16, "rows": [{"num_computed_tokens": 1, "num_scheduled_tokens": "4"}]}"#,
            "rows[0].num_scheduled_tokens",
        ),
        (
            r#"{"page_size": 16, "rows": [{"num_computed_tokens": 1, "num_scheduled_tokens": -2}]}"#,
            "rows[0].num_scheduled_tokens",
        ),
        (r#"{"page_size": 16, "rows": [4]}"#, "rows[0]"),
        (
            r#"{"page_size": 16, "rows": [{"num_computed_tokens": 1, "num_scheduled_tokens": 1, "x": 1}]}"#,
            "rows[0].x",
        ),
        (
            r#"{"page_size": 16, "rows": [{"num_computed_tokens": 99999999999, "num_scheduled_tokens": 1}]}"#,
            "out of range",
        ),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        let f = temp_file(&format!("bad{i}.json"), text);
        assert_bad_input(
            &[
                "plan",
                "--batch",
                f.to_str().unwrap(),
                "--profile",
                "flashmla",
                "--num-spec-tokens",
                "1",
            ],
            &[field],
        );
    }
    assert_bad_input(
        &[
            "plan",
            "--batch",
            "/nonexistent/x.json",
            "--profile",
            "flashmla",
            "--num-spec-tokens",
            "1",
        ],
        &["/nonexistent/x.json"],
    );
    let f = temp_file(
        "ws.json",
        r#"{"page_size": 64, "rows": [{"num_computed_tokens": 10, "num_scheduled_tokens": 5}, {"num_computed_tokens": 10, "num_scheduled_tokens": 5}]}"#,
    );
    assert_bad_input(
        &[
            "plan",
            "--batch",
            f.to_str().unwrap(),
            "--profile",
            "cutlass-mla",
            "--num-spec-tokens",
            "1",
            "--workspace-tokens",
            "64",
        ],
        &["workspace"],
    );
}

#[test]
fn trace_and_determinism_flags() {
    let dir = std::env::temp_dir().join(format!("specmla-cli-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("mixed_mtp.bin");
    let o = sim(&["--requests", "4", "--trace", t.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(std::fs::read(&t).unwrap().starts_with(b"SPECMLA\0"));
    let o = sim(&["--requests", "4", "--check-determinism"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("identical traces"));
    assert_bad_input(
        &["--trace", "/nonexistent/dir/t.bin"],
        &["/nonexistent/dir/t.bin"],
    );
    assert_bad_input(&["--trace-tensors"], &["--trace"]);
}

#[test]
fn gpu_backend_without_a_gpu_is_one_line_and_exit_2() {
    let dir = std::env::temp_dir().join(format!("specmla-cli-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("gpu.bin");
    let args = [
        "--backend",
        "gpu",
        "--steps",
        "2",
        "--trace",
        t.to_str().unwrap(),
    ];
    let o = sim(&args);
    if o.status.code() == Some(0) {
        // A machine with a GPU ran it; the device results are in BENCHMARKS.md.
        assert!(String::from_utf8_lossy(&o.stdout).contains("backend gpu"));
        let (h, _, _) = specmla_traces::read_all(&t).unwrap();
        assert_eq!(h.backend, "gpu");
        return;
    }
    for args in [&args[..], &["--backend", "gpu", "--check-determinism"]] {
        let o = sim(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.starts_with("error: --backend gpu: "), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A run that never started leaves no empty trace behind.
    assert!(!t.exists());
    assert_bad_input(&["--backend", "tpu"], &["cpu", "gpu"]);
}

/// `--step-log` writes one schema line per step; the extend-first layout is refused,
/// since the schema's rows follow vLLM's decode-first order.
#[test]
fn step_log_writes_one_line_per_step() {
    let path = temp_file("steps.jsonl", "");
    let o = sim(&[
        "--requests",
        "3",
        "--step-log",
        path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len() as u64,
        summary["stats"]["steps"].as_u64().unwrap()
    );
    assert!(lines.iter().all(|l| l["schema"] == "specmla.step/1"));
    assert_bad_input(
        &[
            "--scenario",
            "grammar_mixed",
            "--step-log",
            path.to_str().unwrap(),
        ],
        &["--step-log", "decode-first"],
    );
}
