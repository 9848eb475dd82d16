//! The `plots` binary end to end: every picture written from a synthetic CSV, bad input
//! as one `error:` line with exit 2, pictures without rows skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HEADER: &str =
    "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm";

/// Ceilings, decode in both modes over contexts (a toy roofline model: 2.5 TB/s,
/// 600 TFLOP/s, `invariant` 20% slower), a prefill path 2.5× slower than `decode/fast`
/// on two spec shapes, and a hand-typed peer row.
fn full_csv() -> String {
    let mut csv = format!("{HEADER}\n");
    csv += "copy,,0,0,0,0,0,0,0,0,3000,0,0,0\n";
    csv += "gemm_bf16,,0,0,0,0,0,0,0,0,0,750,0,0\n";
    let (heads, batch) = (128.0, 64.0);
    for (mode, slowdown) in [("fast", 1.0), ("invariant", 1.25)] {
        for q_len in [2u32, 4] {
            for context in [1024u64, 4096, 16384, 65536] {
                let q = f64::from(q_len);
                // MLA: 576 bf16 values of KV per token; 2 * (576 + 512) FLOP per query row per token.
                let bytes = batch * context as f64 * 576.0 * 2.0;
                let flops = batch * q * heads * context as f64 * 2.0 * 1088.0;
                let time_us = (bytes / 2.5e6).max(flops / 6e8) * slowdown + 5.0;
                let gbps = bytes / time_us / 1e3;
                let tflops = flops / time_us / 1e6;
                csv += &format!(
                    "decode,{mode},128,{q_len},64,{context},64,{time_us},{bytes},{flops},{gbps},{tflops},{},{}\n",
                    gbps / 30.0,
                    tflops / 7.5
                );
                if mode == "fast" && (context == 4096 || context == 16384) {
                    csv += &format!(
                        "prefill_path,,128,{q_len},64,{context},64,{},{},{},{},{},0,0\n",
                        time_us * 2.5,
                        bytes * 1.5,
                        flops,
                        bytes * 1.5 / (time_us * 2.5) / 1e3,
                        flops / (time_us * 2.5) / 1e6
                    );
                }
            }
        }
    }
    csv += "triton_peer,,128,4,64,4096,64,250,3e8,2.9e11,1200,116,40,15\n";
    // The prefill attention: causal rows (q = keys) and a non-causal one.
    for (keys, tflops) in [(2048u32, 180.0), (4096, 200.0), (8192, 215.0)] {
        csv += &format!(
            "prefill_flash,causal/tma,128,{keys},1,{keys},0,1000,1e8,1e11,100,{tflops},3,25\n"
        );
    }
    csv += "prefill_flash,noncausal/tma,128,64,1,2048,0,80,2e8,1e10,2000,130,60,17\n";
    // Its peer, as gpu/tools/sdpa_peer.py --csv writes it (no ceiling percentages).
    for (keys, tflops) in [(4096u32, 190.0), (8192, 205.0)] {
        csv += &format!(
            "prefill_sdpa_cudnn,causal,128,{keys},1,{keys},0,1100,1e8,1e11,90,{tflops},0,0\n"
        );
    }
    csv
}

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("plots-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn plots(csv_text: &str, dir: &Path, extra: &[&str]) -> Output {
    let csv = dir.join("bench.csv");
    std::fs::write(&csv, csv_text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_plots"))
        .arg("--csv")
        .arg(&csv)
        .arg("--out")
        .arg(dir.join("out"))
        .args(extra)
        .output()
        .unwrap()
}

/// Asserts exit 2 with exactly one stderr line, `error: ...` containing `needle`.
fn assert_one_line_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
}

#[test]
fn draws_every_picture_as_png_and_svg_with_text() {
    let dir = scratch("all");
    let out = plots(&full_csv(), &dir, &["--title", "H100 test, 2026-01-01"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (picture, an axis label it must show, a title or legend text it must show)
    let expected = [
        (
            "throughput",
            "context (KV tokens per request, log2 scale)",
            "bf16 GEMM 750 TFLOP/s",
        ),
        ("bandwidth", "bandwidth (GB/s)", "copy 3000 GB/s"),
        (
            "spec_decode_vs_prefill",
            "q_len (query tokens per request)",
            "2.5×",
        ),
        (
            "roofline",
            "arithmetic intensity (FLOP/byte, log scale)",
            "ridge 250 FLOP/B",
        ),
        (
            "prefill",
            "keys per row (log2 scale)",
            "causal (queries = keys)",
        ),
        (
            "prefill",
            // One line style for causal/tma and noncausal/tma: the panel tells them apart.
            "prefill_flash/tma h=128",
            "prefill_sdpa_cudnn h=128",
        ),
    ];
    for (name, axis_label, other_text) in expected {
        let png = dir.join("out").join(format!("{name}.png"));
        let svg = dir.join("out").join(format!("{name}.svg"));
        let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{name}.png is not a PNG"
        );
        assert!(bytes.len() > 10_000, "{name}.png is suspiciously small");
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg"), "{name}.svg has no <svg");
        assert!(
            text.contains(axis_label),
            "{name}.svg lacks axis label `{axis_label}`"
        );
        assert!(text.contains(other_text), "{name}.svg lacks `{other_text}`");
        assert!(
            text.contains("H100 test, 2026-01-01"),
            "{name}.svg lacks the --title suffix"
        );
        assert!(
            stdout.contains(&format!("wrote {}", png.display())),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("wrote {}", svg.display())),
            "{stdout}"
        );
    }
    assert!(!stdout.contains("skipped"), "{stdout}");
}

/// `plots` on `csv`, which must succeed; its stdout.
fn plots_ok(csv: &str, dir: &Path) -> String {
    let out = plots(csv, dir, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// [`full_csv`] without the rows of kernel `kernel`.
fn full_csv_without(kernel: &str) -> String {
    full_csv()
        .lines()
        .filter(|l| !l.starts_with(kernel))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn pictures_without_rows_are_skipped_with_a_note() {
    let dir = scratch("skip");
    // Decode rows only, with their ceilings: no prefill path, so no spec picture.
    let csv = full_csv_without("prefill_path");
    let stdout = plots_ok(&csv, &dir);
    assert!(
        stdout.contains("skipped spec_decode_vs_prefill: "),
        "{stdout}"
    );
    assert!(!dir.join("out/spec_decode_vs_prefill.png").exists());
    assert!(dir.join("out/roofline.svg").exists());
}

#[test]
fn unparsable_field_names_line_and_column() {
    let dir = scratch("bad-field");
    let csv = format!("{HEADER}\ncopy,,0,0,0,0,0,0,0,0,3000,0,0,0\ndecode,fast,128,four,64,4096,64,1,1,1,1,1,1,1\n");
    let out = plots(&csv, &dir, &[]);
    assert_one_line_error(
        &out,
        "line 3, column 4 (q_len): `four` is not a non-negative integer",
    );
    assert!(!dir.join("out").exists(), "nothing is written on bad input");
}

#[test]
fn short_line_bad_header_and_missing_file_exit_2() {
    let dir = scratch("bad-input");
    let out = plots(&format!("{HEADER}\ndecode,fast,128\n"), &dir, &[]);
    assert_one_line_error(&out, "line 2: 3 fields, expected 14");
    let out = plots("kernel,mode,time\n", &dir, &[]);
    assert_one_line_error(
        &out,
        "line 1: header is `kernel,mode,time`: missing column(s) heads, q_len",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_plots"))
        .args(["--csv", "/nonexistent/bench.csv", "--out"])
        .arg(dir.join("out"))
        .output()
        .unwrap();
    assert_one_line_error(&out, "cannot read /nonexistent/bench.csv");
}

/// Without the GEMM ceiling row, the pictures measured against it are skipped with a
/// note naming the missing row, and the others (bandwidth, against the copy ceiling) are
/// still drawn: a missing ceiling no longer aborts every picture.
#[test]
fn a_missing_ceiling_skips_only_the_pictures_that_need_it() {
    let dir = scratch("no-ceiling");
    let csv = full_csv_without("gemm_bf16");
    let stdout = plots_ok(&csv, &dir);
    assert!(
        stdout.contains("skipped throughput: picture `throughput` needs the bf16 GEMM ceiling: "),
        "{stdout}"
    );
    assert!(stdout.contains("skipped roofline: "), "{stdout}");
    assert!(!dir.join("out/throughput.png").exists());
    assert!(dir.join("out/bandwidth.png").exists());
}
