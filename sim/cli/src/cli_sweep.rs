//! `sim sweep`: runs every point of a grid (`specmla_sim::sweep`) on the chosen backend,
//! each a full checked run, appending one CSV row per finished point; a restarted sweep
//! skips the points its CSV already holds, `--shard i/n` takes every n-th point, and
//! `--merge` joins shard CSVs.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use specmla_core::backend::Backend;
use specmla_core::config::{BackendProfile, DrafterBatch};
use specmla_cpu::cpu_backend;
use specmla_sim::acceptance::AcceptanceRates;
use specmla_sim::progress::{install_interrupt_handler, interrupted, progress_secs, Progress};
use specmla_sim::runner::run_with;
use specmla_sim::scenarios::Scenario;
use specmla_sim::sweep::{
    csv_header, done_keys, in_shard, merge, parse_shard, schedule, tune, SpecChoice, SweepAxes,
    SweepPoint,
};

use crate::cli_run::{read_input, resolve_scenario, DeviceArg, Factory, RunArgs};

/// `sim sweep`: the grid's axes (comma-separated lists), where its rows go, and the
/// base run every point starts from (any `sim` flag but those the grid sets).
#[derive(Args)]
pub struct SweepArgs {
    /// Requests arriving together at step 0, one value per point.
    #[arg(long = "batch", value_delimiter = ',', default_values_t = [1usize, 8, 32])]
    pub batches: Vec<usize>,
    /// Speculation settings: off, mtpK (multi-step, K tokens), dflashK.
    #[arg(long = "spec", value_delimiter = ',', default_values = ["off", "mtp1", "mtp2", "mtp3"])]
    pub specs: Vec<String>,
    /// Backend profiles (default: the base scenario's).
    #[arg(long = "profiles", value_delimiter = ',')]
    pub profiles: Vec<String>,
    /// Drafter batch modes of multi-step settings: padded, compacted.
    #[arg(long = "drafter-batches", value_delimiter = ',', default_values = ["padded"])]
    pub drafter_batches: Vec<String>,
    /// CUDA graphs: on, off.
    #[arg(long = "graphs", value_delimiter = ',', default_values = ["on"])]
    pub graphs: Vec<String>,
    /// Acceptance rates of the controller (a draft position's chance of proposing the
    /// oracle's token), comma-separated; each one rate (0.7) or one per draft position
    /// (0.9/0.8/0.6; the last repeats).
    #[arg(long = "acceptance", value_delimiter = ',', default_values = ["0.7"])]
    pub acceptance_rates: Vec<String>,
    /// The CSV the rows are appended to (created with its header).
    #[arg(long, default_value = "sweep.csv")]
    pub out: PathBuf,
    /// Run only every n-th point from i: `i/n`.
    #[arg(long)]
    pub shard: Option<String>,
    /// Instead of running, merge these sweep CSVs into `--out`.
    #[arg(long, num_args = 1.., value_name = "CSV")]
    pub merge: Vec<PathBuf>,
    /// Instead of running, print the best K per batch size of a timed sweep CSV, as a
    /// table and as vLLM's `num_speculative_tokens_per_batch_size`.
    #[arg(long, value_name = "CSV", conflicts_with = "merge")]
    pub tune: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The base-run flags the grid sets itself, refused by name.
fn refuse_grid_flags(a: &RunArgs) -> Result<()> {
    let set = [
        (a.requests.is_some(), "--requests (the grid's --batch)"),
        (
            a.num_spec_tokens.is_some(),
            "--num-spec-tokens (the grid's --spec)",
        ),
        (a.profile.is_some(), "--profile (the grid's --profiles)"),
        (
            a.drafter_batch.is_some(),
            "--drafter-batch (the grid's --drafter-batches)",
        ),
        (
            a.acceptance_rate.is_some(),
            "--acceptance-rate (the grid's --acceptance)",
        ),
        (a.no_graphs, "--no-graphs (the grid's --graphs)"),
        (
            !a.faults.is_empty(),
            "--fault (a sweep measures clean runs)",
        ),
        (a.trace.is_some(), "--trace"),
        (a.step_log.is_some(), "--step-log"),
        (a.check_determinism, "--check-determinism"),
    ];
    match set.iter().find(|(on, _)| *on) {
        Some((_, flag)) => bail!("{flag} cannot be given to sim sweep"),
        None => Ok(()),
    }
}

/// The axes the flags name, each value checked.
fn axes(a: &SweepArgs, base: &Scenario) -> Result<SweepAxes> {
    let list = |v: &[String], what: &str| -> Result<()> {
        match v.is_empty() {
            true => bail!("{what}: give at least one value"),
            false => Ok(()),
        }
    };
    list(&a.specs, "--spec")?;
    let specs = a
        .specs
        .iter()
        .map(|s| SpecChoice::parse(s).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    let profiles = match a.profiles.is_empty() {
        true => base.cfg.backends.clone(),
        false => a
            .profiles
            .iter()
            .map(|p| {
                BackendProfile::from_name(p).with_context(|| {
                    let names: Vec<&str> = BackendProfile::ALL.iter().map(|b| b.name()).collect();
                    format!("--profiles: unknown profile {p:?} ({})", names.join(", "))
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    list(&a.drafter_batches, "--drafter-batches")?;
    let drafter_batches = a
        .drafter_batches
        .iter()
        .map(|b| match b.as_str() {
            "padded" => Ok(DrafterBatch::Padded),
            "compacted" => Ok(DrafterBatch::Compacted),
            _ => bail!("--drafter-batches: unknown mode {b:?} (padded, compacted)"),
        })
        .collect::<Result<Vec<_>>>()?;
    list(&a.graphs, "--graphs")?;
    let graphs = a
        .graphs
        .iter()
        .map(|g| match g.as_str() {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => bail!("--graphs: expected on or off, got {g:?}"),
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(b) = a.batches.iter().find(|&&b| b == 0 || b > 100_000) {
        bail!("--batch: a batch must be from 1 to 100000 requests, got {b}");
    }
    Ok(SweepAxes {
        batches: a.batches.clone(),
        specs,
        profiles,
        drafter_batches,
        graphs,
        acceptance_rates: a
            .acceptance_rates
            .iter()
            .map(|r| r.parse::<AcceptanceRates>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("--acceptance: {e}"))?,
    })
}

/// `sim sweep`: merge, or run the grid's points this shard takes and the CSV lacks.
/// Exit 0 when every point ran and passed its checks, 1 when one failed (its row says
/// so), 2 on bad input (an invalid point's configuration included: nothing runs).
pub fn run_sweep(a: &SweepArgs) -> Result<ExitCode> {
    if !a.merge.is_empty() {
        return merge_files(a);
    }
    if let Some(path) = &a.tune {
        return tune_file(path);
    }
    refuse_grid_flags(&a.run)?;
    let (base, seed) = resolve_scenario(&a.run)?;
    let axes = axes(a, &base)?;
    let shard = match &a.shard {
        Some(s) => parse_shard(s).map_err(anyhow::Error::msg)?,
        None => (0, 1),
    };
    let points: Vec<SweepPoint> = axes
        .points()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| in_shard(*i, shard))
        .map(|(_, p)| p)
        .collect();
    // Every point's configuration is checked before any runs.
    for p in &points {
        let s = p.scenario(&base);
        let valid = s
            .validate()
            .and_then(|_| s.cfg.validate().map_err(|e| e.to_string()));
        valid.map_err(|e| anyhow::anyhow!("point {}: {e}", p.key()))?;
    }
    match a.run.backend {
        DeviceArg::Cpu => sweep_on(a, &base, seed, &points, cpu_backend),
        #[cfg(feature = "gpu")]
        DeviceArg::Gpu => sweep_on(a, &base, seed, &points, specmla_gpu::GpuBackend::new),
        #[cfg(not(feature = "gpu"))]
        DeviceArg::Gpu => bail!("--backend gpu: this sim was built without the `gpu` feature"),
    }
}

/// The CSV's finished keys, creating it with its header if it does not exist or is
/// empty. A last line without its newline is a row cut short by a killed sweep: it is
/// dropped (and said so), and its point runs again.
fn open_csv(path: &std::path::Path) -> Result<(std::fs::File, Vec<String>)> {
    let what = || format!("--out {}", path.display());
    let done = match std::fs::read_to_string(path) {
        Ok(text) if text.is_empty() => {
            std::fs::write(path, format!("{}\n", csv_header())).with_context(what)?;
            Vec::new()
        }
        Ok(mut text) => {
            if !text.ends_with('\n') {
                let keep = text.rfind('\n').map_or(0, |i| i + 1);
                eprintln!(
                    "sweep: dropping a row cut short at the end of {}: {:?}",
                    path.display(),
                    &text[keep..]
                );
                text.truncate(keep);
                std::fs::write(path, &text).with_context(what)?;
            }
            done_keys(&text).map_err(|e| anyhow::anyhow!("{}: {e}", what()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(path, format!("{}\n", csv_header())).with_context(what)?;
            Vec::new()
        }
        Err(e) => return Err(e).with_context(what),
    };
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(what)?;
    Ok((file, done))
}

fn sweep_on<B: Backend>(
    a: &SweepArgs,
    base: &Scenario,
    seed: u64,
    points: &[SweepPoint],
    make: Factory<B>,
) -> Result<ExitCode> {
    // Read before the CSV is opened: a bad file creates nothing.
    let model = crate::cli_run::cost_model(&a.run, base)?;
    let (csv, done) = open_csv(&a.out)?;
    let todo: Vec<&SweepPoint> = points.iter().filter(|p| !done.contains(&p.key())).collect();
    let every = progress_secs().map_err(anyhow::Error::msg)?;
    let mut bar = Progress::new("sweep", points.len() as u64, "points", every);
    let skipped = points.len() - todo.len();
    install_interrupt_handler();
    let mut failed = Vec::new();
    for (i, p) in todo.iter().enumerate() {
        bar.update((skipped + i) as u64, |_| format!("running {}", p.key()));
        let s = p.scenario(base);
        let out = |row: String| -> Result<()> {
            let path = || format!("--out {}", a.out.display());
            writeln!(&csv, "{row}").with_context(path)?;
            (&csv).flush().with_context(path)
        };
        let mut cost = model
            .clone()
            .map(|(c, t)| specmla_sim::cost_sink::CostSink::new(c, t));
        let sink = cost
            .as_mut()
            .map(|c| c as &mut dyn specmla_sim::runner::StepSink);
        let summary = match run_with(&s, seed, make, sink, |_| {}) {
            Ok(summary) => summary,
            // The engine failed mid-run: the point failed, and the sweep goes on.
            Err(e) if e.is_engine_failure() => {
                eprintln!("FAIL: point {}: {e}", p.key());
                failed.push(p.key());
                out(p.failed_row(B::KIND))?;
                continue;
            }
            Err(e) => return Err(anyhow::anyhow!("point {}: {e}", p.key())),
        };
        if summary.interrupted || interrupted() {
            bar.finish();
            eprintln!(
                "interrupted: point {} not written; run again to resume",
                p.key()
            );
            return Ok(ExitCode::from(130));
        }
        if !summary.passed() || summary.hit_step_limit {
            failed.push(p.key());
        }
        let simulated = cost.map(|c| c.summary());
        out(p.csv_row(&summary, simulated.as_ref()))?;
    }
    bar.finish();
    say!(
        "sweep: {} points ({} run now, {} already in {}), {} failed",
        points.len(),
        todo.len(),
        skipped,
        a.out.display(),
        failed.len()
    );
    for k in &failed {
        say!("  FAIL {k}");
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn merge_files(a: &SweepArgs) -> Result<ExitCode> {
    let inputs = a
        .merge
        .iter()
        .map(|p| {
            let text = read_input(p).with_context(|| format!("--merge {}", p.display()))?;
            Ok((p.display().to_string(), text))
        })
        .collect::<Result<Vec<_>>>()?;
    let merged = merge(&inputs).map_err(anyhow::Error::msg)?;
    std::fs::write(&a.out, &merged).with_context(|| format!("--out {}", a.out.display()))?;
    say!(
        "merged {} files: {} points into {}",
        inputs.len(),
        merged.lines().count() - 1,
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `sim sweep --tune CSV`: per speculating group, the best K at each measured batch.
fn tune_file(path: &std::path::Path) -> Result<ExitCode> {
    let text = read_input(path).with_context(|| format!("--tune {}", path.display()))?;
    let tuned = tune(&text).map_err(|e| anyhow::anyhow!("--tune {}: {e}", path.display()))?;
    for t in &tuned {
        say!(
            "{} (family, profile, drafter batch, graphs, acceptance rate)",
            t.group
        );
        say!(
            "  {:>6}  {:>6}  {:>10}  speedup over no speculation ({} throughput)",
            "batch",
            "best K",
            "tokens/s",
            t.source
        );
        for &(batch, k, tps, speedup) in &t.best {
            say!("  {batch:>6}  {k:>6}  {tps:>10.1}  {speedup:.2}x");
        }
        let ranges: Vec<String> = schedule(&t.best)
            .iter()
            .map(|[lo, hi, k]| format!("[{lo}, {hi}, {k}]"))
            .collect();
        say!(
            "  num_speculative_tokens_per_batch_size: [{}]",
            ranges.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
