//! `sim sweep` end to end on the CPU backend: a small grid written as CSV, a resumed
//! sweep that runs nothing twice, shards that merge into the whole, and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .output()
        .expect("sim runs")
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("specmla-sweep-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A grid of 2 batches x (off + mtp1 + mtp2 at two rates) on a short workload: 10 points.
const GRID: [&str; 10] = [
    "--batch",
    "1,3",
    "--spec",
    "off,mtp1,mtp2",
    "--acceptance",
    "0.5,0.9",
    "--prompt-len",
    "8..16",
    "--max-new-tokens",
    "6..8",
];

fn sweep(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["sweep", "--out", out.to_str().unwrap()];
    args.extend(GRID);
    args.extend(extra);
    sim(&args)
}

/// Data rows without their timing columns (empty on the CPU backend anyway) and the
/// device: what two runs of one point share.
fn rows(csv: &str) -> Vec<String> {
    csv.lines().skip(1).map(str::to_string).collect()
}

#[test]
fn a_grid_runs_every_point_once_and_a_resumed_sweep_runs_nothing_again() {
    let d = dir("resume");
    let out = d.join("sweep.csv");
    let o = sweep(&out, &[]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("sweep: 10 points (10 run now, 0 already in"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(&out).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    assert_eq!(
        header[..6],
        [
            "batch",
            "spec",
            "profile",
            "drafter_batch",
            "graphs",
            "acceptance_rate"
        ]
    );
    let rows = rows(&csv);
    assert_eq!(rows.len(), 10);
    assert!(rows[0].starts_with("1,off,flashmla,-,on,-,"), "{}", rows[0]);
    // Every run passed its checks; a speculating point measured an acceptance length at
    // least the controller's analytic one, to within the drafter's own lucky matches.
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    for r in &rows {
        let f: Vec<&str> = r.split(',').collect();
        assert_eq!(f[col("checks_passed")], "true", "{r}");
        if f[1] != "off" {
            let measured: f64 = f[col("mean_acceptance_length")].parse().unwrap();
            let analytic: f64 = f[col("analytic_acceptance_length")].parse().unwrap();
            assert!(measured > 1.0 && measured + 0.35 >= analytic, "{r}");
            // vLLM's identity: the mean acceptance length is 1 + the per-position rates.
            let per_pos: f64 = f[col("acceptance_per_pos")]
                .split('/')
                .map(|x| x.parse::<f64>().unwrap())
                .sum();
            assert!((1.0 + per_pos - measured).abs() < 2e-3, "{r}");
        }
    }
    let again = sweep(&out, &[]);
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert!(stdout.contains("(0 run now, 10 already in"), "{stdout}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), csv);
}

#[test]
fn shards_merge_into_the_whole_grid() {
    let d = dir("shards");
    let whole = d.join("whole.csv");
    assert_eq!(sweep(&whole, &[]).status.code(), Some(0));
    let mut parts = Vec::new();
    for i in 0..3 {
        let p = d.join(format!("part{i}.csv"));
        let shard = format!("{i}/3");
        let o = sweep(&p, &["--shard", &shard]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        parts.push(p);
    }
    let merged = d.join("merged.csv");
    let mut args = vec!["sweep", "--out", merged.to_str().unwrap(), "--merge"];
    args.extend(parts.iter().map(|p| p.to_str().unwrap()));
    let o = sim(&args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut want = rows(&std::fs::read_to_string(&whole).unwrap());
    want.sort();
    assert_eq!(rows(&std::fs::read_to_string(&merged).unwrap()), want);
}

#[test]
fn bad_grids_are_one_line_and_exit_2() {
    let d = dir("bad");
    let out = d.join("x.csv");
    let out = out.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--spec", "mtp0"],
            "K must be a whole number from 1 to 16",
        ),
        (vec!["--spec", "eagle"], "unknown spec setting"),
        (
            vec!["--acceptance", "1.5"],
            "--acceptance: an acceptance rate must be within [0, 1], got 1.5",
        ),
        (vec!["--graphs", "maybe"], "--graphs: expected on or off"),
        (vec!["--profiles", "nope"], "--profiles: unknown profile"),
        (vec!["--shard", "3/3"], "--shard"),
        (
            vec!["--requests", "4"],
            "--requests (the grid's --batch) cannot be given",
        ),
        (
            vec!["--fault", "F1"],
            "--fault (a sweep measures clean runs)",
        ),
        // FlashMLA has no non-causal attention for DFlash: refused before anything runs.
        (vec!["--spec", "dflash2"], "point 1,dflash2,flashmla"),
    ] {
        let mut all = vec!["sweep", "--out", out, "--batch", "1"];
        all.extend(args.iter().copied());
        let o = sim(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle:?} not in {err:?}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    assert!(!Path::new(out).exists(), "a refused sweep wrote no CSV");
    std::fs::write(out, "batch,spec\n1,off\n").unwrap();
    let o = sim(&["sweep", "--out", out, "--batch", "1", "--spec", "off"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("its header is not this sweep's"), "{err}");
}

/// `--tune` on a timed CSV (as `--backend gpu` writes them; these rows are made up) gives
/// the best K per batch and vLLM's schedule; on a CPU sweep it says why it cannot.
#[test]
fn tune_prints_the_best_k_per_batch_and_vllms_schedule() {
    let d = dir("tune");
    let cpu = d.join("cpu.csv");
    let o = sim(&[
        "sweep",
        "--out",
        cpu.to_str().unwrap(),
        "--batch",
        "1",
        "--spec",
        "off,mtp1",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let header = std::fs::read_to_string(&cpu)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    let o = sim(&["sweep", "--tune", cpu.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no row has tokens_per_s"));
    let timed = d.join("timed.csv");
    let row = |key: &str, tps: f64| {
        format!("{key},10,20,5,2.0,2.0,,true,1.0,{tps},1.0,0.8,gpu,,,,,,,,,,,\n")
    };
    let text = format!(
        "{header}\n{}{}{}{}{}{}",
        row("1,off,flashmla,-,on,-", 100.0),
        row("1,mtp1,flashmla,padded,on,0.7", 150.0),
        row("1,mtp2,flashmla,padded,on,0.7", 170.0),
        row("16,off,flashmla,-,on,-", 1000.0),
        row("16,mtp1,flashmla,padded,on,0.7", 1100.0),
        row("16,mtp2,flashmla,padded,on,0.7", 900.0),
    );
    std::fs::write(&timed, text).unwrap();
    let o = sim(&["sweep", "--tune", timed.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("num_speculative_tokens_per_batch_size: [[1, 15, 2], [16, 16, 1]]"),
        "{out}"
    );
    assert!(out.contains("1.70x"), "{out}");
    assert!(out.contains("(measured throughput)"), "{out}");
}

/// `sim sweep --cost-model`: every row gets its simulated step time and throughput, and
/// `--tune` then compares the simulated curves (a CPU sweep measures none).
#[test]
fn a_simulated_sweep_tunes_from_its_cost_model() {
    let d = dir("simulated");
    let out = d.join("sim.csv");
    let cal = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../plots/results/2026-11-26-h200-calibration-3/calibration.json");
    let o = sim(&[
        "sweep",
        "--out",
        out.to_str().unwrap(),
        "--batch",
        "1,4",
        "--spec",
        "off,mtp1,mtp2",
        "--acceptance",
        "0.8",
        "--prompt-len",
        "8..16",
        "--max-new-tokens",
        "12..16",
        "--cost-model",
        cal.to_str().unwrap(),
        "--cost-target",
        "deepseek-v3:8",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|c| *c == name).unwrap();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let tps: f64 = f[at("simulated_tokens_per_s")].parse().unwrap();
        assert!(tps > 0.0, "{line}");
        assert!(
            f[at("tokens_per_s")].is_empty(),
            "the CPU measures nothing: {line}"
        );
        let shares: f64 = ["attention", "gemm", "comm", "overhead"]
            .iter()
            .map(|p| {
                f[at(&format!("simulated_{p}_share"))]
                    .parse::<f64>()
                    .unwrap()
            })
            .sum();
        assert!(
            (shares - 1.0).abs() < 0.01,
            "shares sum to {shares}: {line}"
        );
    }
    let o = sim(&["sweep", "--tune", out.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("(simulated throughput)"), "{stdout}");
    assert!(
        stdout.contains("num_speculative_tokens_per_batch_size"),
        "{stdout}"
    );
}

/// A sweep killed while writing leaves a row cut short: the next run drops it (and says
/// so) and runs that point again; an empty CSV gets its header.
#[test]
fn a_row_cut_short_is_dropped_and_its_point_runs_again() {
    let d = dir("torn");
    let out = d.join("s.csv");
    let grid = [
        "--batch",
        "1",
        "--spec",
        "off,mtp1",
        "--prompt-len",
        "8..12",
        "--max-new-tokens",
        "4..6",
    ];
    let run = |out: &Path| {
        let mut args = vec!["sweep", "--out", out.to_str().unwrap()];
        args.extend(grid);
        sim(&args)
    };
    assert_eq!(run(&out).status.code(), Some(0));
    let whole = std::fs::read_to_string(&out).unwrap();
    let cut = &whole[..whole.len() - 20];
    std::fs::write(&out, cut).unwrap();
    let o = run(&out);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("dropping a row cut short"), "{stderr}");
    assert!(stdout.contains("(1 run now, 1 already in"), "{stdout}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), whole);
    let empty = d.join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    assert_eq!(run(&empty).status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&empty).unwrap(), whole);
}
