//! The `replay` binary's contract: exit 0 identical, 1 diverged, 2 bad input with one
//! clear line and never a panic, whatever the file holds.

use std::path::PathBuf;
use std::process::{Command, Output};

use specmla_core::fault::{Fault, Faults};
use specmla_traces::FORMAT_VERSION;

fn bin(name: &str, args: &[&str]) -> Output {
    assert_eq!(name, "replay");
    Command::new(env!("CARGO_BIN_EXE_replay"))
        .args(args)
        .output()
        .expect("runs")
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("specmla-replay-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A trace of mixed_mtp with 6 requests, written through the library, once: tests run
/// in parallel, and none may read it half written.
fn trace() -> PathBuf {
    static TRACE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TRACE
        .get_or_init(|| {
            let p = dir().join("t.bin");
            let mut s = specmla_sim::scenarios::by_name("mixed_mtp").unwrap();
            s.workload.num_requests = 6;
            let mut sink =
                specmla_sim::record::TraceSink::new(std::fs::File::create(&p).unwrap(), false);
            let cpu = specmla_cpu::cpu_backend;
            specmla_sim::runner::run_with(&s, 0, cpu, Some(&mut sink), |_| {}).unwrap();
            p
        })
        .clone()
}

fn assert_exit2(args: &[&str], needle: &str) {
    let o = bin("replay", args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {needle:?} not in {err:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn identical_then_diverged_exit_codes() {
    let t = trace();
    let o = bin("replay", &[t.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = bin("replay", &[t.to_str().unwrap(), "--fault", "F1", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["divergence"]["first_layer"], 0);
}

/// A fault switched on for a replay is counted; one that never fires in the steps
/// replayed makes the replay exit 1, not a clean "identical".
#[test]
fn a_replay_fault_that_never_fires_is_no_clean_result() {
    let t = trace();
    let o = bin("replay", &[t.to_str().unwrap(), "--fault", "F14"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("faults on replay: F14 fired in 0 steps"),
        "{out}"
    );
    assert!(
        out.contains("NOT EXERCISED: fault F14 never fired"),
        "{out}"
    );
    let o = bin("replay", &[t.to_str().unwrap(), "--fault", "F1"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("faults on replay: F1 fired in 1 step"),
        "{out}"
    );
}

/// A recorded step prints as `sim plan` input: the batch's rows with the config's page
/// size, and the matching flags on stderr.
#[test]
fn a_step_prints_as_sim_plan_input() {
    let t = trace();
    let o = bin(
        "replay",
        &[
            "show",
            t.to_str().unwrap(),
            "--step",
            "8",
            "--as-plan-input",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["page_size"], 16);
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        for key in [
            "num_computed_tokens",
            "num_scheduled_tokens",
            "num_prompt_tokens",
        ] {
            assert!(r[key].is_u64(), "{r}");
        }
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("sim plan --batch - --profile flashmla --num-spec-tokens 3"),
        "{err}"
    );
    // --as-plan-input needs a step.
    let o = bin("replay", &["show", t.to_str().unwrap(), "--as-plan-input"]);
    assert_eq!(o.status.code(), Some(2));
}

/// Two traces are one line naming the extra one, not clap's talk of a subcommand.
#[test]
fn one_trace_at_a_time() {
    let t = trace();
    let t = t.to_str().unwrap();
    assert_exit2(&[t, t], "replay takes one trace; also got");
}

/// A bisect stopped by Ctrl-C during its first replay, before any divergence was
/// found, says so and exits 130: it never reports "no divergence" with exit 0.
#[cfg(unix)]
#[test]
fn an_interrupted_bisect_is_not_a_clean_one() {
    // The graphs scenario, 300 requests over 600 steps: a first replay of seconds.
    let t = dir().join("long.bin");
    let mut s = specmla_sim::scenarios::by_name("graphs").unwrap();
    s.workload.num_requests = 300;
    s.max_steps = 600;
    let file = std::fs::File::create(&t).unwrap();
    let mut sink = specmla_sim::record::TraceSink::new(file, false);
    let cpu = specmla_cpu::cpu_backend;
    specmla_sim::runner::run_with(&s, 0, cpu, Some(&mut sink), |_| {}).unwrap();
    drop(sink);
    let min = dir().join("long-min.bin");
    let child = Command::new(env!("CARGO_BIN_EXE_replay"))
        .args(["--bisect", t.to_str().unwrap(), "-o", min.to_str().unwrap()])
        .args(["--fault", "F11"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(130), "{out}");
    assert!(!out.contains("does not diverge"), "{out}");
    assert!(
        out.contains("INTERRUPTED") || out.contains("interrupted"),
        "{out}"
    );
}

#[test]
fn show_prints_steps_and_json() {
    let t = trace();
    let o = bin("replay", &["show", t.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("step     0:"), "{out}");
    let format = format!("format {FORMAT_VERSION}, written by specmla");
    assert!(out.contains(&format), "{out}");
    assert!(
        out.contains("on the cpu backend (CPU reference (f32)),"),
        "{out}"
    );
    let o = bin(
        "replay",
        &["show", t.to_str().unwrap(), "--step", "3", "--json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["steps"][0]["step"], 3);
    assert_eq!(v["header"]["backend"], "cpu");
    assert_eq!(v["header"]["config"]["spec"]["num_speculative_tokens"], 3);
    // Paths are spelled as in the text and in `sim plan`: lowercase.
    let o = bin("replay", &["show", t.to_str().unwrap(), "--json"]);
    let all = String::from_utf8_lossy(&o.stdout);
    assert!(all.contains("\"path\": \"decode\""), "{all}");
    assert!(
        !all.contains("\"Decode\"") && !all.contains("\"Prefill\""),
        "{all}"
    );
    assert_exit2(
        &["show", t.to_str().unwrap(), "--step", "99999"],
        "no such step",
    );
}

#[test]
fn bisect_writes_a_smaller_trace() {
    let t = trace();
    let min = dir().join("min.bin");
    let o = bin(
        "replay",
        &[
            "--bisect",
            t.to_str().unwrap(),
            "-o",
            min.to_str().unwrap(),
            "--fault",
            "F1",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("before:") && out.contains("after:"), "{out}");
    assert!(std::fs::metadata(&min).unwrap().len() < std::fs::metadata(&t).unwrap().len());
    assert_eq!(
        bin("replay", &[min.to_str().unwrap()]).status.code(),
        Some(0)
    );
    // Progress shows during the first replay too, before any candidate is tried.
    let o = Command::new(env!("CARGO_BIN_EXE_replay"))
        .args(["--bisect", t.to_str().unwrap(), "-o", min.to_str().unwrap()])
        .args(["--fault", "F1"])
        .env("SPECMLA_PROGRESS_SECS", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bisect: 0/") && err.contains("first replay, step 1 of"),
        "{err}"
    );
}

#[test]
fn damaged_files_are_one_line_errors() {
    let t = trace();
    let bytes = std::fs::read(&t).unwrap();
    let d = dir();
    let write = |name: &str, b: &[u8]| {
        let p = d.join(name);
        std::fs::write(&p, b).unwrap();
        p.to_string_lossy().into_owned()
    };
    assert_exit2(
        &[&write("magic.bin", b"NOTATRACE-at-all-padding")],
        "not a specmla trace",
    );
    // A version-1 trace (before the header named its backend) and a future one.
    let future = FORMAT_VERSION as u8 + 1;
    for (v, name) in [(1u8, "v1.bin"), (future, "future.bin")] {
        let mut old = bytes.clone();
        old[8] = v;
        assert_exit2(
            &[&write(name, &old)],
            &format!("written by format {v}, this reads {FORMAT_VERSION}"),
        );
    }
    let mut flip = bytes.clone();
    let mid = bytes.len() / 2;
    flip[mid] ^= 0x10;
    let o = bin("replay", &[&write("flip.bin", &flip)]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_exit2(&["/nonexistent/trace.bin"], "/nonexistent/trace.bin");
    assert_exit2(&[&write("empty.bin", b"")], "");
    // A truncated trace replays its complete prefix.
    let o = bin(
        "replay",
        &[&write("cut.bin", &bytes[..bytes.len() * 2 / 3])],
    );
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("truncated after"));
}

#[test]
fn random_bytes_never_panic() {
    let d = dir();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let header = std::fs::read(trace()).unwrap();
    for i in 0..40 {
        let len = (x % 4096) as usize;
        let mut b: Vec<u8> = if i % 2 == 0 {
            header[..header.len().min(40)].to_vec()
        } else {
            Vec::new()
        };
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.push(x as u8);
        }
        let p = d.join(format!("rand{i}.bin"));
        std::fs::write(&p, &b).unwrap();
        let o = bin("replay", &[p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert!(matches!(o.status.code(), Some(0) | Some(2)), "{err}");
    }
}

/// Records edited by hand (valid checksums, impossible contents) are one-line errors.
#[test]
fn hand_edited_records_are_errors_not_panics() {
    let (header, records, _) = specmla_traces::read_all(trace()).unwrap();
    type Edit = (&'static str, fn(&mut specmla_traces::StepRecord));
    let edits: [Edit; 5] = [
        ("block", |r| r.rows[0].block_ids[0] = u32::MAX - 1),
        ("token", |r| r.rows[0].token_ids[0] = 1 << 30),
        ("next", |r| r.rows[0].next_prompt_token = Some(1 << 30)),
        ("grammar", |r| r.rows[0].grammar_state = Some(7)),
        ("q", |r| r.rows[0].num_scheduled_tokens += 1),
    ];
    for (name, edit) in edits {
        let mut recs = records.clone();
        let i = recs.iter().position(|r| !r.rows.is_empty()).unwrap();
        edit(&mut recs[i]);
        let mut w = specmla_traces::TraceWriter::new(Vec::new(), &header).unwrap();
        for r in &recs {
            w.write_step(r).unwrap();
        }
        let p = dir().join(format!("edited-{name}.bin"));
        std::fs::write(&p, w.finish().unwrap()).unwrap();
        assert_exit2(&[p.to_str().unwrap()], "step");
    }
    // Two rows sharing a request-state slot; and a slot as large as a u32 goes, which
    // must cost nothing (the per-slot tables are sparse): it replays. The tables are
    // only kept on a data-parallel rank, so the huge slot's replay runs as one (the
    // padding changes no output).
    let i = records.iter().position(|r| r.rows.len() >= 2).unwrap();
    let mut dp_header = header.clone();
    let key = "\"dp_peer_num_tokens\":0";
    assert!(
        dp_header.config_json.contains(key),
        "{}",
        dp_header.config_json
    );
    dp_header.config_json = dp_header
        .config_json
        .replace(key, "\"dp_peer_num_tokens\":4");
    for (name, dup) in [("slot-dup", true), ("slot-huge", false)] {
        let mut recs = records.clone();
        let slot = recs[i].rows[0].req_state_idx;
        recs[i].rows[1].req_state_idx = if dup { slot } else { u32::MAX };
        let h = if dup { &header } else { &dp_header };
        let mut w = specmla_traces::TraceWriter::new(Vec::new(), h).unwrap();
        for r in &recs {
            w.write_step(r).unwrap();
        }
        let p = dir().join(format!("edited-{name}.bin"));
        std::fs::write(&p, w.finish().unwrap()).unwrap();
        if dup {
            assert_exit2(&[p.to_str().unwrap()], "request-state slot");
        } else {
            let o = bin("replay", &[p.to_str().unwrap()]);
            assert_eq!(o.status.code(), Some(0), "{o:?}");
        }
    }
}

#[test]
fn gpu_replay_without_a_gpu_is_one_line_and_exit_2() {
    let t = trace();
    let t = t.to_string_lossy();
    for flags in [&["--gpu"][..], &["--backend", "gpu"]] {
        let args: Vec<&str> = flags.iter().copied().chain([&*t]).collect();
        let o = bin("replay", &args);
        if o.status.code() == Some(0) {
            // A machine with a GPU replayed the CPU trace across backends.
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("replayed on gpu"), "{out}");
            assert!(out.contains("cross-backend"), "{out}");
        } else {
            assert_exit2(&args, "error: --backend gpu: ");
        }
    }
    assert_exit2(
        &["--gpu", "--bisect", "-o", "/tmp/never.bin", &t],
        "--bisect runs on the CPU backend only",
    );
    assert!(!std::path::Path::new("/tmp/never.bin").exists());
}

/// The report says how it compared: bit for bit on the recording's backend kind, within
/// the printed tolerances on another (a CPU trace relabelled "gpu" replays on the CPU
/// exactly as a GPU trace would).
#[test]
fn the_report_states_the_comparison_mode_and_tolerances() {
    let o = bin("replay", &[trace().to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mode"], "bitwise (same backend)");
    assert_eq!(
        (v["recorded_on"].as_str(), v["replayed_on"].as_str()),
        (Some("cpu"), Some("cpu"))
    );
    assert!(v["tolerances"].is_null() && v["device"].is_string(), "{v}");

    let (mut header, records, _) = specmla_traces::read_all(trace()).unwrap();
    header.backend = "gpu".into();
    let mut w = specmla_traces::TraceWriter::new(Vec::new(), &header).unwrap();
    for r in &records {
        w.write_step(r).unwrap();
    }
    let p = dir().join("gpu-labelled.bin");
    std::fs::write(&p, w.finish().unwrap()).unwrap();
    let o = bin("replay", &[p.to_str().unwrap(), "--json"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mode = v["mode"].as_str().unwrap();
    assert!(mode.starts_with("cross-backend"), "{mode}");
    assert!(mode.contains("no tensors"), "{mode}");
    assert_eq!(v["tolerances"]["atol"], 1e-3);
    assert_eq!(v["tolerances"]["rtol"], 1e-3);
    assert_eq!(v["tolerances"]["near_tie_margin"], 1e-3);
    let o = bin("replay", &[p.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("recorded on gpu, replayed on cpu"), "{out}");
    assert!(
        out.contains("only metadata and tokens are compared"),
        "{out}"
    );
    assert!(out.contains("MATCHED:"), "{out}");
}

/// `-` reads the trace from stdin; a directory is one line naming its cause once.
#[test]
fn stdin_traces_and_causes_said_once() {
    use std::io::Write as _;
    let bytes = std::fs::read(trace()).unwrap();
    for args in [vec!["-"], vec!["show", "-"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_replay"))
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{args:?}");
    }
    let d = dir();
    let o = bin("replay", &[d.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(err.matches("os error").count(), 1, "{err}");
}

/// A trace is user input: one whose model the CUDA kernels cannot take is refused in one
/// line before any device is touched (it once panicked inside a launch).
#[cfg(feature = "gpu")]
#[test]
fn dimensions_the_gpu_kernels_cannot_take_are_refused() {
    for (field, value, needle) in [
        ("kv_lora_rank", 2048, "kv_lora_rank 2048 is above"),
        ("v_head_dim", 512, "v_head_dim 512 is above"),
    ] {
        let (mut header, records, _) = specmla_traces::read_all(trace()).unwrap();
        let mut cfg: serde_json::Value = serde_json::from_str(&header.config_json).unwrap();
        cfg["model"][field] = value.into();
        header.config_json = cfg.to_string();
        let p = dir().join(format!("wide-{field}.bin"));
        let file = std::fs::File::create(&p).unwrap();
        let mut w = specmla_traces::TraceWriter::new(file, &header).unwrap();
        for r in &records {
            w.write_step(r).unwrap();
        }
        w.finish().unwrap();
        assert_exit2(&[p.to_str().unwrap(), "--gpu"], needle);
    }
}

/// The invariant violations a run found are in its trace, and `replay show` lists them
/// (issue 22, defect 6): F3 captures sizes that are not multiples of 1 + K.
#[test]
fn show_lists_the_violations_a_run_recorded() {
    let p = dir().join("f3.bin");
    let mut s = specmla_sim::scenarios::by_name("mixed_mtp").unwrap();
    s.workload.num_requests = 2;
    s.cfg.faults = Faults::none().with(Fault::F3);
    let mut sink = specmla_sim::record::TraceSink::new(std::fs::File::create(&p).unwrap(), false);
    let sum =
        specmla_sim::runner::run_with(&s, 1, specmla_cpu::cpu_backend, Some(&mut sink), |_| {})
            .unwrap();
    sink.into_inner().unwrap();
    assert!(!sum.passed());
    let out = bin("replay", &["show", p.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line = text
        .lines()
        .find(|l| l.ends_with("invariants violated"))
        .unwrap_or_else(|| panic!("no step lists violations:\n{text}"));
    let step = line["step".len()..].split(':').next().unwrap().trim();
    let out = bin("replay", &["show", p.to_str().unwrap(), "--step", step]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("  violated: cuda-graph: capture size"),
        "{text}"
    );
}

/// `replay audit` of an engine's step log (JSON Lines): a correct step passes, a step
/// with the rows in the wrong order is named, bad input exits 2 with one line.
#[test]
fn audit_checks_an_engine_step_log() {
    let good = r#"{"schema": "specmla.step/1", "step": 7, "decode_threshold": 1, "num_computed_tokens": [100, 10, 200, 20], "num_scheduled_tokens": [100, 1, 200, 1], "num_prompt_tokens": [100, 10, 200, 20], "order": [3, 1, 2, 0], "query_start_loc": [0, 1, 2, 202, 302], "seq_lens": [21, 11, 400, 200], "num_decodes": 2, "num_decode_tokens": 2, "num_prefills": 2, "extra_engine_field": 1}"#;
    let bad = good
        .replace("\"step\": 7", "\"step\": 8")
        .replace("[3, 1, 2, 0]", "[1, 3, 2, 0]")
        .replace("[21, 11, 400, 200]", "[11, 21, 400, 200]");
    let d = dir();
    let clean = d.join("clean.jsonl");
    std::fs::write(&clean, format!("{good}\n")).unwrap();
    let o = bin("replay", &["audit", clean.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(out.trim(), "PASS: 1 step audited, 0 violations");
    let mixed = d.join("mixed.jsonl");
    std::fs::write(&mixed, format!("{good}\n\n{bad}\n")).unwrap();
    let o = bin("replay", &["audit", mixed.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.starts_with("line 3 step 8 row 0: reorder: row 0 holds request 1"),
        "{out}"
    );
    assert!(
        out.ends_with("FAIL: 2 steps audited, 1 violation\n"),
        "{out}"
    );
    let o = bin("replay", &["audit", mixed.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["steps"], 2);
    assert_eq!(v["violations"][0]["invariant"], "reorder");
    let empty = d.join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    assert_exit2(&["audit", empty.to_str().unwrap()], "no steps in the log");
    let broken = d.join("broken.jsonl");
    std::fs::write(&broken, format!("{good}\n{{\"order\": [1]}}\n")).unwrap();
    assert_exit2(
        &["audit", broken.to_str().unwrap()],
        "line 2: missing field",
    );
    let other = d.join("other.jsonl");
    std::fs::write(&other, good.replace("specmla.step/1", "specmla.step/2")).unwrap();
    assert_exit2(
        &["audit", other.to_str().unwrap()],
        "line 1: schema \"specmla.step/2\", this build reads \"specmla.step/1\"",
    );
    let short = d.join("short.jsonl");
    std::fs::write(
        &short,
        good.replace(
            "\"num_prompt_tokens\": [100, 10, 200, 20]",
            "\"num_prompt_tokens\": [100]",
        ),
    )
    .unwrap();
    assert_exit2(
        &["audit", short.to_str().unwrap()],
        "line 1: num_prompt_tokens has 1 entries",
    );
}
