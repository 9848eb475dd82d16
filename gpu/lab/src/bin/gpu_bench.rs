//! `gpu-bench`: measures the ceilings (device-to-device copy, bf16 cuBLAS GEMM), then our
//! MLA decode kernels at the RULES §12 shapes (or the shapes given on the command
//! line), and writes a table and a CSV. Exit 2 without a usable GPU (one line).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use specmla_core::balanced::{fast_decode_plan, BalancedPolicy, FastPlan};
use specmla_core::invariant_launch::{
    invariant_launch, largest_split_count, splits_of, InvariantLaunch,
};
use specmla_core::split::{equal_split_plan, fast_split_plan, invariant_split_plan};
use specmla_gpu::ops::{FlashKernels, Kernels, WideKernel, FLASH_ROWS};
use specmla_gpu::{GpuDevice, GpuError};
use specmla_gpu_lab::bench::{
    bench_baseline_decode, bench_flash, bench_prefill_path, ceilings, BenchShape, Ceilings,
    DecodeInputs, FlashVariant, L2Scrub, Measurement, ScrubKind, CSV_HEADER,
};
use specmla_gpu_lab::bench_prefill::{bench_flash_prefill, bench_prefill_spec_step, PrefillCase};
use specmla_gpu_lab::bench_step::{bench_prefill_step, bench_verify_step};
use specmla_gpu_lab::clock::ClockWatch;
use specmla_gpu_lab::trace::seesaw_timeline;
use specmla_sim::step_bench::VerifyBench;

/// Benchmarks of the MLA decode kernels against measured ceilings.
#[derive(Parser)]
#[command(name = "gpu-bench", version)]
struct Cli {
    /// A short sweep (a few shapes, fewer repetitions, smaller ceilings).
    #[arg(long)]
    quick: bool,
    /// Heads (repeatable; default 128 and 16).
    #[arg(long, value_parser = positive)]
    heads: Vec<usize>,
    /// q_len (repeatable; default 1, 2, 4).
    #[arg(long = "q-len", value_parser = positive)]
    q_len: Vec<usize>,
    /// Batch (repeatable; default 32, 64, 128).
    #[arg(long, value_parser = positive)]
    batch: Vec<usize>,
    /// Context length in tokens (repeatable; default 4096, 8192, 16384).
    #[arg(long, value_parser = positive)]
    context: Vec<usize>,
    /// A decode shape `HEADS,Q_LEN,BATCH,CONTEXT` (repeatable): these shapes instead of the
    /// product of `--heads`, `--q-len`, `--batch` and `--context`.
    #[arg(long, value_name = "H,Q,B,L")]
    shape: Vec<String>,
    /// Only the decode kernels: no prefill and no spec-step comparison, with the full
    /// repetitions and ceilings (`--quick` cuts both).
    #[arg(long, conflicts_with_all = ["prefill", "prefill_only", "spec"])]
    decode_only: bool,
    /// Instead of timing, record the default decode kernel's timeline at each shape (fast
    /// plan; needs `SPECMLA_FLASH_DEFINES=FS_TRACE`): where one CTA's steady iteration goes,
    /// per warpgroup, printed, and `timeline-H-Q-B-L.csv` under this directory.
    #[arg(long, value_name = "DIR")]
    timeline: Option<std::path::PathBuf>,
    /// Page size in tokens.
    #[arg(long, default_value_t = 64, value_parser = positive)]
    page: usize,
    /// Timed repetitions per point (the median is reported).
    #[arg(long, default_value_t = 20, value_parser = positive)]
    reps: usize,
    /// Also time the spec-step comparison: the decode path against the bf16 prefill path
    /// (gather, up-projection, attention) at B 16, L 2048 and B 64, L 8192, q 2..4, and
    /// against our f32 prefill path at the small shape.
    #[arg(long)]
    spec: bool,
    /// Also time the bf16 prefill attention at the prefill shapes (causal B 1 x 4096,
    /// B 1 x 8192, B 4 x 2048; non-causal 64 queries over 2048 keys) and a sweep around
    /// them (causal 1024 to 16384 tokens; 64 and 2048 queries over up to 16384 keys), at
    /// `--heads` (by default 128 and 16).
    #[arg(long)]
    prefill: bool,
    /// Only the prefill shapes (no decode sweep).
    #[arg(long)]
    prefill_only: bool,
    /// Instead of the two plans, time the default kernel at 1, 2, 3, 4, 6 and 8 splits
    /// per request (mode `splits=N`) and, on the seesaw kernel, the balanced schedule with a
    /// fixed cost of 2, 5 and 8 tiles a piece (`balanced-2`, `balanced`, `balanced-8`):
    /// the data the plans are chosen from.
    #[arg(long)]
    sweep_splits: bool,
    /// Also time the fast launch a second time in the same rounds, as mode `fast-twin`:
    /// two identical launches whose ratio is the noise floor of a comparison within a call.
    /// Only where the fast launch is timed: refused beside the modes that time none.
    #[arg(
        long,
        conflicts_with_all = ["sweep_splits", "timeline", "prefill_only", "verify_step", "prefill_step", "calibrate"]
    )]
    twin: bool,
    /// Instead of the kernels, time whole real-width steps through the engine: 64 rows of
    /// 1 + 3 tokens at 4096 keys (`--batch`, `--context` and `--q-len` (1 + K) change
    /// them), GEMMs pinned vs heuristic, graphs on vs off (with `--quick`, graphs on only).
    #[arg(long)]
    verify_step: bool,
    /// Instead of the kernels, time whole real-width prefill steps: the verify-step
    /// workload with its prompts in chunks of this many tokens (above FlashMLA's
    /// threshold of 128, so they take the prefill path, each after the first with its
    /// context in chunks), on the TMA prefill and on the portable f32 prefill, graphs on,
    /// GEMMs pinned.
    #[arg(long, value_parser = positive)]
    prefill_step: Option<usize>,
    /// Instead of the kernels, measure what `sim --cost-model` prices steps with (the
    /// decode, prefill and GEMM classes over their grids, the overhead of whole engine
    /// steps) and write the calibration file here (JSON).
    #[arg(long, value_name = "FILE", requires = "commit")]
    calibrate: Option<std::path::PathBuf>,
    /// The commit this binary was built from, recorded in the calibration file.
    #[arg(long, value_name = "SHA", requires = "calibrate")]
    commit: Option<String>,
    /// How the L2 is cleared before each timed launch: `read` (a 128 MiB buffer read, the
    /// L2 left holding clean lines) or `write` (the buffer overwritten, dirty lines left, as
    /// FlashMLA's harness clears it with a memset).
    #[arg(long, value_enum, default_value_t = ScrubKind::Read)]
    scrub: ScrubKind,
    /// Write the CSV here.
    #[arg(long, default_value = "gpu-bench.csv")]
    csv: std::path::PathBuf,
}

/// Split counts of `--sweep-splits`, with their mode labels.
const SWEEP_SPLITS: [(usize, &str); 6] = [
    (1, "splits=1"),
    (2, "splits=2"),
    (3, "splits=3"),
    (4, "splits=4"),
    (6, "splits=6"),
    (8, "splits=8"),
];

/// A whole number of at least 1 (a zero page, batch or context has no meaning here).
fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a whole number of at least 1, got {s:?}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.verify_step || cli.prefill_step.is_some() {
        return verify_step(&cli);
    }
    if let Some(path) = &cli.calibrate {
        return calibrate(&cli, path);
    }
    let shapes = match shapes(&cli) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&cli, shapes) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--verify-step` / `--prefill-step`: exit 2 without a usable GPU, 1 when a step fails (a CUDA call
/// mid-run, a violated invariant), 0 with the times printed.
fn verify_step(cli: &Cli) -> ExitCode {
    let dev = match GpuDevice::open(0) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let bench = VerifyBench {
        rows: cli.batch.first().copied().unwrap_or(64),
        context_tokens: cli.context.first().copied().unwrap_or(4096),
        decode_steps: 16,
        // The verify rows' q_len is 1 + K (`--q-len`, default 4: MTP K = 3).
        num_spec_tokens: cli.q_len.first().copied().unwrap_or(4) - 1,
        cuda_graphs: true,
        prefill_chunk_tokens: None,
    };
    println!("device: {} ({})", dev.name, dev.arch);
    let res = match cli.prefill_step {
        Some(chunk) => bench_prefill_step(&dev, bench, chunk),
        None => bench_verify_step(&dev, bench, cli.quick),
    };
    match res {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: verify-step bench: {e}");
            ExitCode::from(1)
        }
    }
}

/// `--calibrate`: exit 2 without a usable GPU or a writable file, 1 when a measurement
/// fails, 0 with the file written and the fits printed.
fn calibrate(cli: &Cli, path: &std::path::Path) -> ExitCode {
    let dev = match GpuDevice::open(0) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let commit = cli.commit.as_deref().unwrap_or_default();
    let c = match specmla_gpu_lab::calibrate::calibrate(&dev, cli.quick, commit) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: calibration: {e}");
            return ExitCode::from(1);
        }
    };
    for l in specmla_gpu_lab::calibrate::report(&c) {
        println!("{l}");
    }
    if let Err(e) = std::fs::write(path, c.to_json()) {
        eprintln!("error: --calibrate {}: {e}", path.display());
        return ExitCode::from(2);
    }
    // Held-out configurations: simulated against measured.
    match specmla_gpu_lab::calibrate::validate(&dev, &c, cli.quick) {
        Ok(rows) => {
            println!("held out of the calibration, simulated against measured:");
            let mut errs: Vec<f64> = rows.iter().map(|r| r.error().abs()).collect();
            for r in &rows {
                println!(
                    "  {}: {} steps, measured {:.3} ms, simulated {:.3} ms ({:+.1}%)",
                    r.label,
                    r.steps,
                    r.measured_us / 1e3,
                    r.simulated_us / 1e3,
                    100.0 * r.error()
                );
                for k in &r.kinds {
                    let per = |v: f64| v / k.steps.max(1) as f64;
                    println!(
                        "    {}: {} steps, per step measured {:.1} us, simulated {:.1} us \
                         (attention {:.1} vs {:.1}, GEMMs {:.1} vs {:.1}, overhead {:.1})",
                        k.kind,
                        k.steps,
                        per(k.measured_us),
                        per(k.simulated_us),
                        per(k.measured_attention_us),
                        per(k.simulated_attention_us),
                        per(k.measured_gemm_us),
                        per(k.simulated_gemm_us),
                        per(k.simulated_overhead_us)
                    );
                }
            }
            errs.sort_by(f64::total_cmp);
            if let (Some(worst), false) = (errs.last(), errs.is_empty()) {
                println!(
                    "  median |error| {:.1}%, worst {:.1}%",
                    100.0 * errs[errs.len() / 2],
                    100.0 * worst
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: validation: {e}");
            ExitCode::from(1)
        }
    }
}

fn or(v: &[usize], d: &[usize]) -> Vec<usize> {
    if v.is_empty() {
        d.to_vec()
    } else {
        v.to_vec()
    }
}

/// `--shape` as `H,Q,B,L`, four whole numbers of at least 1.
fn parse_shape(v: &str, page: usize) -> Result<BenchShape, String> {
    let parts: Vec<&str> = v.split(',').map(str::trim).collect();
    let nums: Vec<usize> = parts
        .iter()
        .map(|p| positive(p))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--shape {v:?}: {e}"))?;
    match nums[..] {
        [heads, q_len, batch, context] => Ok(BenchShape {
            heads,
            q_len,
            batch,
            context,
            page,
        }),
        _ => Err(format!(
            "--shape {v:?}: expected HEADS,Q_LEN,BATCH,CONTEXT (four numbers), got {}",
            nums.len()
        )),
    }
}

/// The decode shapes: `--shape` when given, else the product of the per-axis flags (or
/// their defaults).
fn shapes(cli: &Cli) -> Result<Vec<BenchShape>, String> {
    if !cli.shape.is_empty() {
        return cli.shape.iter().map(|v| parse_shape(v, cli.page)).collect();
    }
    let q = if cli.quick { vec![128] } else { vec![128, 16] };
    let heads = or(&cli.heads, &q);
    let q_lens = or(&cli.q_len, &[1, 2, 4]);
    let batches = or(&cli.batch, if cli.quick { &[64] } else { &[32, 64, 128] });
    let contexts = or(
        &cli.context,
        if cli.quick {
            &[4096]
        } else {
            &[4096, 8192, 16384]
        },
    );
    let mut out = Vec::new();
    for &heads in &heads {
        for &q_len in &q_lens {
            for &batch in &batches {
                for &context in &contexts {
                    out.push(BenchShape {
                        heads,
                        q_len,
                        batch,
                        context,
                        page: cli.page,
                    });
                }
            }
        }
    }
    Ok(out)
}

fn run(cli: &Cli, decode_shapes: Vec<BenchShape>) -> Result<(), GpuError> {
    let dev = Arc::new(GpuDevice::open(0)?);

    let sms = dev.sms;
    let k = Kernels::load(&dev)?;
    let fk = FlashKernels::load(&dev)?;
    let c = ceilings(&dev, cli.quick)?;
    let mut clock = ClockWatch::new(&dev);
    let ceiling_mhz = clock.stamp(&dev, &k, "the ceilings", &mut []);
    println!(
        "device: {} ({}, {sms} SMs); wide rows on {}, decode rows in {} (SPECMLA_FLASH_OUT); flash_decode {:?}",
        dev.name,
        dev.arch,
        fk.wide.function(),
        fk.out.label(),
        fk.flash
    );
    println!(
        "ceilings: copy {:.0} GB/s (read + write), bf16 GEMM {:.1} TFLOP/s; SM clock after them {} (maximum {} MHz)",
        c.copy_gb_per_s,
        c.gemm_tflop_per_s,
        ceiling_mhz.map_or("not read".into(), |m| format!("{m:.0} MHz")),
        dev.boost_clock_mhz
    );
    // Groups of n split CTAs resident at once, n = 0..=256 (index 0 unused); the driver
    // counts clusters, which must fit in a GPC.
    let mut resident = vec![sms];
    for n in 1..=256 {
        resident.push(fk.resident_split_groups(&dev, sms, n)?);
    }
    println!(
        "resident split groups (n: count): {}",
        (1..=8)
            .map(|n| format!("{n}: {}", resident[n]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let resident = |n: usize| resident[n.min(resident.len() - 1)];
    let fast_plan = |s: &BenchShape| -> (usize, usize) {
        let groups = s.batch * (s.q_len * s.heads).div_ceil(FLASH_ROWS);
        fast_split_plan(groups, s.context, &resident, 64, FlashKernels::CTA_OVERHEAD).into()
    };
    if let Some(dir) = &cli.timeline {
        return timelines(&dev, (&k, &fk), &decode_shapes, &fast_plan, dir);
    }
    let scrub = L2Scrub::with_kind(&dev, &k, cli.scrub)?;
    // The CSV does not carry it: a peer's times compare only with rows of the same scrub.
    let scrub_name = cli
        .scrub
        .to_possible_value()
        .expect("every scrub kind has a name");
    println!(
        "L2 scrub before each timed launch: {}",
        scrub_name.get_name()
    );
    let mut rows: Vec<Measurement> = Vec::new();
    println!(
        "{:<20} {:<9} {:>4} {:>2} {:>4} {:>6} {:>10} {:>8} {:>8} {:>6} {:>6}",
        "kernel", "mode", "H", "q", "B", "L", "time us", "GB/s", "TFLOP/s", "%copy", "%gemm"
    );
    let reps = if cli.quick {
        cli.reps.min(10)
    } else {
        cli.reps
    };
    let invariant = |s: &BenchShape| invariant_split_plan(s.q_len * s.heads, FLASH_ROWS).into();
    // The extra comparisons a full run adds (prefill shapes, the spec step) unless the
    // run asks for less.
    let extras = !cli.quick && !cli.sweep_splits && !cli.decode_only;
    if cli.prefill || cli.prefill_only || extras {
        for heads in or(&cli.heads, &[128, 16]) {
            let cases = PrefillCase::standard(heads).into_iter();
            for case in cases.chain(PrefillCase::sweep(heads)) {
                let mut got = bench_flash_prefill(&dev, &k, &fk, case, reps, None)?;
                clock.stamp(&dev, &k, &format!("prefill {case:?}"), &mut got);
                for m in got {
                    print_row(&m, &c);
                    rows.push(m);
                }
            }
        }
    }
    let decode_shapes = if cli.prefill_only {
        Vec::new()
    } else {
        decode_shapes
    };
    for s in decode_shapes {
        let inp = DecodeInputs::new(&dev, &k, s, 11)?;
        let v = FlashVariant::split;
        let row_blocks = (s.q_len * s.heads).div_ceil(FLASH_ROWS);
        let parts = BalancedPolicy::for_device(sms, row_blocks);
        // FlashMLA's parts, with a fixed cost of `fixed` tiles (FlashMLA's is 5).
        let balanced = |fixed: usize, mode| FlashVariant {
            balanced: Some(BalancedPolicy {
                fixed_tiles: fixed,
                ..parts
            }),
            ..v(fk.wide, (64, 1), mode)
        };
        // `plan`'s splits, cut nowhere else, on the persistent kernel
        // (`invariant_balanced_schedule`): batch-invariant like the split grid.
        let persistent = |plan: (usize, usize), mode| FlashVariant {
            balanced: Some(parts),
            invariant: true,
            ..v(fk.wide, plan, mode)
        };
        let mut variants = Vec::new();
        if cli.sweep_splits {
            for (n, mode) in SWEEP_SPLITS {
                let plan: (usize, usize) = equal_split_plan(s.context, n, 64).into();
                if n == 1 || plan.0 >= 256 {
                    variants.push(v(fk.wide, plan, mode));
                }
            }
            if fk.wide == WideKernel::Seesaw {
                for (fixed, mode) in [(2, "balanced-2"), (5, "balanced"), (8, "balanced-8")] {
                    variants.push(balanced(fixed, mode));
                }
                for (n, mode) in [(1, "persist=1"), (2, "persist=2"), (4, "persist=4")] {
                    variants.push(persistent(equal_split_plan(s.context, n, 64).into(), mode));
                }
            }
        } else {
            let fast = fast_plan(&s);
            // The invariant mode as its plan launches it (`invariant_launch`: the grid of the
            // batch's largest split count, or the persistent kernel), then the two it picks
            // between: the grid of the policy's cap (as a graph launches it) and the
            // persistent kernel on the same splits.
            let lens = vec![s.context as u32; s.batch];
            let policy = invariant_split_plan(s.q_len * s.heads, FLASH_ROWS);
            let splits = splits_of(&lens, policy);
            let largest = largest_split_count(splits.iter().map(|&(_, n)| n));
            let picked = match invariant_launch(&splits, row_blocks, sms, &resident) {
                InvariantLaunch::Persistent(p) if fk.wide == WideKernel::Seesaw => FlashVariant {
                    balanced: Some(p),
                    invariant: true,
                    ..v(fk.wide, policy.into(), "invariant")
                },
                InvariantLaunch::Grid { max_splits } => FlashVariant {
                    grid_splits: Some(max_splits),
                    ..v(fk.wide, policy.into(), "invariant")
                },
                // Off the seesaw kernel there is no persistent launch: the grid of the
                // largest split count, as the engine's eager launches take it.
                InvariantLaunch::Persistent(_) => FlashVariant {
                    grid_splits: Some(largest),
                    ..v(fk.wide, policy.into(), "invariant")
                },
            };
            variants.push(picked);
            variants.push(v(fk.wide, invariant(&s), "inv-graph"));
            if fk.wide == WideKernel::Seesaw {
                variants.push(persistent(invariant(&s), "inv-persist"));
            }
            // The fast mode: the split plan, or on the seesaw kernel a balanced schedule
            // where the cost model prices it lower.
            let shape = (s.batch, row_blocks, s.context);
            let plan = fast_decode_plan(shape, sms, &resident, FlashKernels::CTA_OVERHEAD);
            let fast_variant = match plan {
                FastPlan::Balanced(p) if fk.wide == WideKernel::Seesaw => FlashVariant {
                    balanced: Some(p),
                    ..v(fk.wide, (64, 1), "fast")
                },
                FastPlan::Split(p) => v(fk.wide, p.into(), "fast"),
                // Off the seesaw kernel: the split plan.
                FastPlan::Balanced(_) => v(fk.wide, fast, "fast"),
            };
            variants.push(fast_variant);
            if cli.twin {
                variants.push(FlashVariant {
                    mode: "fast-twin",
                    ..fast_variant
                });
            }
            // On Hopper the peers in the same rounds: the first wgmma kernel (both
            // warpgroups on every tile) on the fast plan, and the mma.sync kernels (wide or
            // narrow) on the invariant one.
            if fk.wide.hopper() {
                variants.push(v(WideKernel::Wgmma, fast, "fast"));
                variants.push(v(WideKernel::Mma, invariant(&s), "invariant"));
            }
        }
        let mut got = bench_flash(&dev, &fk, &inp, &variants, reps, &scrub)?;
        let what = format!("H {} q {} B {} L {}", s.heads, s.q_len, s.batch, s.context);
        clock.stamp(&dev, &k, &what, &mut got);
        for m in got {
            print_row(&m, &c);
            rows.push(m);
        }
    }
    if !cli.prefill_only && (cli.spec || extras) {
        // The decode path against the prefill paths a SingleOnly backend would take: the
        // bf16 one (gather, up-projection, flash_prefill) at both shapes, our f32 one at
        // the small shape only (it takes seconds at the large one).
        for (batch, context) in [(16, 2048), (64, 8192)] {
            for q_len in 2..=4 {
                let s = BenchShape {
                    heads: 128,
                    q_len,
                    batch,
                    context,
                    page: cli.page,
                };
                let inp = DecodeInputs::new(&dev, &k, s, 12)?;
                let inv = FlashVariant::split(fk.wide, invariant(&s), "invariant");
                let d = bench_flash(&dev, &fk, &inp, &[inv], reps, &scrub)?.remove(0);
                let b = bench_prefill_spec_step(&dev, (&k, &fk), &inp, reps.min(10))?;
                drop(inp);
                println!(
                    "spec step B {batch} L {context} q {q_len}: decode {:.1} us, bf16 prefill path {:.1} us ({:.1}x)",
                    d.time_us,
                    b.time_us,
                    b.time_us / d.time_us
                );
                let mut got = vec![d, b];
                if batch == 16 {
                    let p = bench_prefill_path(&dev, &k, s, 3)?;
                    println!("  f32 prefill path {:.1} us", p.time_us);
                    got.push(p);
                }
                let what = format!("the spec step B {batch} L {context} q {q_len}");
                clock.stamp(&dev, &k, &what, &mut got);
                for m in got {
                    print_row(&m, &c);
                    rows.push(m);
                }
            }
        }
        let s = BenchShape {
            heads: 128,
            q_len: 1,
            batch: 32,
            context: 4096,
            page: cli.page,
        };
        let mut m = bench_baseline_decode(&dev, &k, s, 3)?;
        clock.stamp(
            &dev,
            &k,
            "the baseline decode",
            std::slice::from_mut(&mut m),
        );
        print_row(&m, &c);
        rows.push(m);
    }
    println!("{}", clock.summary());
    write_csv(&cli.csv, &c, ceiling_mhz, &rows)
        .map_err(|e| GpuError::NoDevice(format!("writing {}: {e}", cli.csv.display())))?;
    println!("wrote {}", cli.csv.display());
    Ok(())
}

fn print_row(m: &Measurement, c: &Ceilings) {
    let s = m.shape.expect("kernel rows have shapes");
    println!(
        "{:<20} {:<9} {:>4} {:>2} {:>4} {:>6} {:>10.1} {:>8.0} {:>8.1} {:>5.1}% {:>5.1}%",
        m.kernel,
        m.mode,
        s.heads,
        s.q_len,
        s.batch,
        s.context,
        m.time_us,
        m.gb_per_s(),
        m.tflop_per_s(),
        100.0 * m.gb_per_s() / c.copy_gb_per_s,
        100.0 * m.tflop_per_s() / c.gemm_tflop_per_s
    );
}

/// `--timeline`: each shape's timeline on the fast plan, printed and written under `dir`.
fn timelines(
    dev: &GpuDevice,
    (k, fk): (&Kernels, &FlashKernels),
    shapes: &[BenchShape],
    fast_plan: &dyn Fn(&BenchShape) -> (usize, usize),
    dir: &std::path::Path,
) -> Result<(), GpuError> {
    let io = |e: std::io::Error| GpuError::NoDevice(format!("--timeline {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    for &s in shapes {
        let inp = DecodeInputs::new(dev, k, s, 11)?;
        let Some(t) = seesaw_timeline(dev, fk, &inp, fast_plan(&s))? else {
            return Err(GpuError::NoDevice(
                "--timeline: no timeline (the seesaw kernel records it on sm_90a with SPECMLA_FLASH_DEFINES=FS_TRACE, where no global split merge writes over it)"
                    .into(),
            ));
        };
        println!("H {} q {} B {} L {}:", s.heads, s.q_len, s.batch, s.context);
        for l in t.report() {
            println!("  {l}");
        }
        let name = format!(
            "timeline-{}-{}-{}-{}.csv",
            s.heads, s.q_len, s.batch, s.context
        );
        std::fs::write(dir.join(name), t.to_csv()).map_err(io)?;
    }
    Ok(())
}

/// The CSV: the ceilings (with the clock read right after them, empty if unread), then
/// `rows`.
fn write_csv(
    path: &std::path::Path,
    c: &Ceilings,
    ceiling_mhz: Option<f64>,
    rows: &[Measurement],
) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mhz = ceiling_mhz.map_or(String::new(), |m| format!("{m:.0}"));
    writeln!(f, "{CSV_HEADER}")?;
    writeln!(
        f,
        "copy,ceiling,0,0,0,0,0,0,0,0,{:.2},0,100,0,{mhz}",
        c.copy_gb_per_s
    )?;
    writeln!(
        f,
        "gemm_bf16,ceiling,0,0,0,0,0,0,0,0,0,{:.3},0,100,{mhz}",
        c.gemm_tflop_per_s
    )?;
    for m in rows {
        writeln!(f, "{}", m.csv(c))?;
    }
    f.flush()
}
