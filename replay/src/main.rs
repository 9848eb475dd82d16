//! `replay`: re-execute a trace and compare it bit for bit, shrink a diverging trace, or
//! print one. Exit codes: 0 identical, 1 diverged, 2 bad input or environment.

/// `println!` that ends the process when stdout is gone (a closed pipe such as `| head`)
/// instead of panicking, with 141 (128 + SIGPIPE) as a shell would report, so a pipeline
/// under `pipefail` never mistakes a cut-off run for a pass.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(141);
        }
    }};
}

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use specmla_core::fault::{Fault, Faults};
use specmla_cpu::cpu_backend;
use specmla_replay::bisect::{bisect_with, BisectProgress, Trace};
use specmla_replay::compare::Divergence;
use specmla_replay::{replay_records, replay_records_on, ReplayReport};
use specmla_sim::cli::{count, fault_list};
use specmla_sim::progress::{
    estimate_secs_left, install_interrupt_handler, interrupted, progress_secs, Progress,
};
use specmla_traces::{read_all, read_all_from, Completeness, StepRecord, TraceWriter};

/// Re-executes a specmla trace (the recorded batches, not a new schedule) and compares
/// every step with its record: bit for bit on the backend kind that recorded it, within
/// stated tolerances on the other (`--gpu` for a CPU trace, or the CPU for a GPU trace).
/// On a divergence it names the first divergent step, then inside it the first divergent
/// layer, the rows and tokens that differ and the path they took (decode rows, prefill
/// rows, the context-chunk merge, the drafter).
#[derive(Parser)]
#[command(name = "replay", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
    /// Print machine-readable JSON (the report, `--bisect`'s result, or `show`).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Print a trace for people (or scripts, with --json).
    Show(ShowArgs),
    /// Check an engine's step log (JSON Lines, one step per line) against the planner's
    /// rules: row order, split counts, query_start_loc and seq_lens. Exit 0 clean, 1
    /// violations, 2 unreadable.
    Audit(AuditArgs),
}

#[derive(Args)]
struct AuditArgs {
    /// The step log (`-` reads stdin).
    log: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// The CPU reference backend.
    Cpu,
    /// The CUDA backend on GPU 0.
    Gpu,
}

#[derive(Args)]
struct RunArgs {
    /// The trace to replay (written by `sim --trace`; `-` reads stdin).
    trace: Option<PathBuf>,
    /// Anything after the trace: refused in one line (replay takes one trace).
    #[arg(hide = true)]
    extra: Vec<std::ffi::OsString>,
    /// Backend to re-execute on. A trace replays bit for bit on the backend that
    /// recorded it, and within stated tolerances on the other.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendArg,
    /// Shorthand for --backend gpu.
    #[arg(long, conflicts_with = "backend")]
    gpu: bool,
    /// Turn on a known-bug switch while replaying (F1..F16 as modelled, repeatable).
    #[arg(long = "fault", value_name = "ID", value_parser = clap::builder::PossibleValuesParser::new(Fault::ALL.map(|f| f.id())))]
    faults: Vec<String>,
    /// Shrink a diverging trace to a minimal reproducer (needs -o).
    #[arg(long, requires = "output")]
    bisect: bool,
    /// Where --bisect writes the minimal trace.
    #[arg(short = 'o', long, value_name = "MIN.bin")]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct ShowArgs {
    /// The trace to print (`-` reads stdin).
    trace: PathBuf,
    /// Print only this step, in detail.
    #[arg(long)]
    step: Option<u64>,
    /// Print the step as `sim plan` input (its batch, as JSON), and the `sim plan` flags
    /// of the trace's configuration on stderr.
    #[arg(long, requires = "step")]
    as_plan_input: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(specmla_sim::cli::args_with_json_last(&["show", "audit"]));
    let result = match cli.command {
        Some(Command::Show(a)) => show(&a, cli.json),
        Some(Command::Audit(a)) => audit(&a, cli.json),
        None => run(&cli.run, cli.json),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(2)
    })
}

/// Reads a trace from a file, or from stdin for `-`; also says whether it was cut short
/// (no footer), in which case its complete records are used.
fn load(path: &Path) -> Result<(Trace, bool)> {
    let name = path.display();
    let (header, records, completeness) = if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes).context("stdin")?;
        let len = bytes.len() as u64;
        read_all_from(&bytes[..], Some(len)).context("stdin")?
    } else {
        read_all(path).with_context(|| format!("{name}"))?
    };
    let truncated = matches!(completeness, Completeness::Truncated { .. });
    if let Completeness::Truncated { records } = completeness {
        eprintln!("note: {name} is truncated after {records} records; using that prefix");
    }
    Ok((Trace { header, records }, truncated))
}

fn faults(ids: &[String]) -> Faults {
    ids.iter()
        .map(|id| Fault::from_id(id).expect("clap checked the id"))
        .collect()
}

fn run(a: &RunArgs, json: bool) -> Result<ExitCode> {
    if !a.extra.is_empty() {
        bail!(
            "replay takes one trace; also got {} (replay them one at a time)",
            a.extra
                .iter()
                .map(|e| e.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
    let Some(path) = &a.trace else {
        bail!("a trace to replay is required (see --help)")
    };
    let gpu = a.gpu || a.backend == BackendArg::Gpu;
    if a.bisect && gpu {
        bail!("--bisect runs on the CPU backend only (it re-records candidates there); drop --gpu");
    }
    let (t, truncated) = load(path)?;
    let f = faults(&a.faults);
    if a.bisect {
        return run_bisect(&t, f, a.output.as_deref().expect("clap requires -o"), json);
    }
    let (h, recs) = (&t.header, &t.records);
    install_interrupt_handler();
    let total = recs.len() as u64;
    let mut bar = Progress::new(
        "replay",
        total,
        "steps",
        progress_secs().map_err(anyhow::Error::msg)?,
    );
    let on_step = |n: usize| {
        bar.update(n as u64, |secs| {
            let left = estimate_secs_left(secs, (n as u64, total), (0, 0));
            format!(
                "{:.1} steps/s{}",
                n as f64 / secs.max(1e-9),
                left.map_or(String::new(), |l| format!(", about {l:.0} s left"))
            )
        })
    };
    let report = if gpu {
        #[cfg(feature = "gpu")]
        {
            replay_records_on(h, recs, f, specmla_gpu::GpuBackend::new, on_step)?
        }
        #[cfg(not(feature = "gpu"))]
        bail!("--backend gpu: this replay was built without the `gpu` feature")
    } else {
        replay_records_on(h, recs, f, cpu_backend, on_step)?
    };
    bar.finish();
    if json {
        let mut v = serde_json::to_value(&report)?;
        v["trace_truncated"] = truncated.into();
        say!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_report(path, &t, &a.faults, &report);
        if truncated {
            say!(
                "NOTE: the trace is truncated (no footer): only its complete records were compared"
            );
        }
    }
    if report.interrupted {
        return Ok(ExitCode::from(130));
    }
    // A replay whose fault never fired tested nothing of it: not a clean result.
    Ok(
        if report.divergence.is_some() || !report.unfired_faults().is_empty() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        },
    )
}

fn print_report(path: &Path, t: &Trace, fault_ids: &[String], r: &ReplayReport) {
    let h = &t.header;
    let faults = fault_list(fault_ids);
    let recorded = fault_list(&h.faults);
    say!(
        "replay {}: scenario {}, seed {}, {} steps, faults recorded: {recorded}, on replay: {faults}",
        path.display(),
        h.scenario,
        h.seed,
        r.steps_in_trace
    );
    say!(
        "recorded on {}, replayed on {} ({}): {}",
        r.recorded_on,
        r.replayed_on,
        r.device,
        r.mode
    );
    if !r.faults.is_empty() {
        say!(
            "faults on replay: {}",
            specmla_sim::cli::fault_counts(&r.faults)
        );
    }
    for t in &r.near_ties {
        say!(
            "near-tie at step {}: request {} {} {}: recorded {}, replayed {} (margin {:.1e})",
            t.step,
            t.req_id,
            if t.drafter { "draft" } else { "sample" },
            t.position,
            t.recorded,
            t.replayed,
            t.margin
        );
    }
    match &r.divergence {
        None if r.interrupted => say!(
            "INTERRUPTED (Ctrl-C) after {} of {}: no divergence so far",
            count(r.steps_replayed, "step"),
            r.steps_in_trace
        ),
        None if r.bitwise() => say!("IDENTICAL: {} steps replayed bit for bit", r.steps_replayed),
        None => say!(
            "MATCHED: {} steps replayed within the cross-backend comparison ({} near-ties)",
            r.steps_replayed,
            r.near_ties.len()
        ),
        Some(d) => print_divergence(d, r.steps_replayed),
    }
    for f in r.unfired_faults() {
        say!(
            "NOT EXERCISED: fault {} never fired in the steps replayed; it fires with: {}",
            f.id,
            f.trigger
        );
    }
}

fn print_divergence(d: &Divergence, replayed: usize) {
    say!(
        "DIVERGED at {} (after replaying {replayed} steps)",
        d.headline()
    );
    say!(
        "  metadata     {}",
        if d.metadata_differs {
            "differs (split, slots, chunks, graph or masks)"
        } else {
            "identical"
        }
    );
    match d.first_layer {
        Some(l) => {
            let n = d.layer_rows.len();
            let verb = if n == 1 { "differs" } else { "differ" };
            say!("  first layer  {l}: {} {verb}", count(n, "row"));
            for r in d.layer_rows.iter().take(8) {
                let via = if r.path == "prefill+context" {
                    "  <- context-chunk LSE merge"
                } else {
                    ""
                };
                say!(
                    "    row {:>3}  request {:>4}  {:<16} q {:>3}  context {:>4}{via}",
                    r.row,
                    r.req_id,
                    r.path,
                    r.q_len,
                    r.context_len
                );
            }
        }
        None => say!("  layers       identical"),
    }
    if let Some(m) = d.max_abs_diff {
        say!("  max |diff|   {m:.3e} in that layer");
    }
    if !d.logit_rows.is_empty() || d.logits_max_abs_diff.is_some() {
        let rows: Vec<String> = d
            .logit_rows
            .iter()
            .map(|r| format!("{} (request {}, {})", r.row, r.req_id, r.path))
            .collect();
        say!(
            "  logits       beyond tolerance in rows [{}]; max |diff| {:.3e}",
            rows.join(", "),
            d.logits_max_abs_diff.unwrap_or(f32::NAN)
        );
    }
    for (row, want, got) in d.token_rows.iter().take(4) {
        say!("  tokens       row {row}: recorded {want:?}, replayed {got:?}");
    }
    if d.drafter_differs && d.drafter_requests.is_empty() {
        say!("  drafter      inputs differ (no request's proposals changed)");
    } else if d.drafter_differs {
        say!(
            "  drafter      inputs or proposals differ (requests {:?})",
            d.drafter_requests
        );
    }
    for c in d.cross_checks.iter().take(3) {
        say!("  cross-check  {c}");
    }
    for v in d.violations.iter().take(3) {
        say!("  invariant    {v}");
    }
}

/// The size of a trace, as `--bisect` reports it before and after.
#[derive(serde::Serialize)]
struct TraceSize {
    steps: usize,
    requests: usize,
    rows: usize,
    bytes: usize,
}

impl TraceSize {
    fn of(t: &Trace, bytes: usize) -> Self {
        TraceSize {
            steps: t.records.len(),
            requests: t.requests().len(),
            rows: t.num_rows(),
            bytes,
        }
    }

    fn text(&self) -> String {
        format!(
            "{}, {}, {}, {} bytes",
            count(self.steps, "step"),
            count(self.requests, "request"),
            count(self.rows, "row"),
            self.bytes
        )
    }
}

fn run_bisect(t: &Trace, f: Faults, out: &Path, json: bool) -> Result<ExitCode> {
    let before = TraceSize::of(t, encode(t)?.len());
    install_interrupt_handler();
    let every = progress_secs().map_err(anyhow::Error::msg)?;
    let mut bar = Progress::new("bisect", before.requests as u64, "requests dropped", every);
    let min = bisect_with(t, f, |p| match p {
        BisectProgress::FirstReplay { done, steps } => {
            bar.update(0, |_| format!("first replay, step {done} of {steps}"))
        }
        BisectProgress::Kept(kept) => {
            bar.update((before.requests - kept) as u64, |_| format!("{kept} kept"))
        }
    })?;
    bar.finish();
    let Some(min) = min else {
        // Interrupted before a divergence was found is not "no divergence".
        let stopped = interrupted();
        if json {
            say!(
                "{}",
                serde_json::json!({"shrunk": false, "before": before, "interrupted": stopped})
            );
        } else if stopped {
            say!("INTERRUPTED (Ctrl-C) before a divergence was found; nothing written");
        } else {
            say!("the trace does not diverge under these faults; nothing to shrink");
        }
        return Ok(ExitCode::from(if stopped { 130 } else { 0 }));
    };
    // Found and shrunk: exit 1, as any command that finds a failure; 130 when Ctrl-C
    // stopped the shrinking (what was found so far is written all the same).
    let code = if interrupted() { 130 } else { 1 };
    let bytes = encode(&min)?;
    std::fs::write(out, &bytes).with_context(|| format!("-o {}", out.display()))?;
    let after = TraceSize::of(&min, bytes.len());
    let report = replay_records(&min.header, &min.records, f)?;
    if json {
        let v = serde_json::json!({
            "shrunk": true, "before": before, "after": after, "output": out,
            "interrupted": interrupted(), "report": report,
        });
        say!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::from(code));
    }
    say!("before: {}", before.text());
    say!("after:  {} -> {}", after.text(), out.display());
    if interrupted() {
        say!("note: interrupted (Ctrl-C): this is the smallest diverging trace found so far");
    }
    if let Some(d) = &report.divergence {
        print_divergence(d, report.steps_replayed);
    }
    Ok(ExitCode::from(code))
}

fn encode(t: &Trace) -> Result<Vec<u8>> {
    let mut w = TraceWriter::new(Vec::new(), &t.header)?;
    for r in &t.records {
        w.write_step(r)?;
    }
    Ok(w.finish()?)
}

/// One recorded step as `sim plan` input: the batch's rows as scheduled (before the
/// reorder), with the page size of the trace's configuration; the matching `sim plan`
/// flags go to stderr.
fn plan_input(t: &Trace, rec: &StepRecord) -> Result<ExitCode> {
    let cfg = specmla_replay::replayer::parse_config(&t.header)?;
    let rows: Vec<serde_json::Value> = rec
        .rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "num_computed_tokens": r.num_computed_tokens,
                "num_scheduled_tokens": r.num_scheduled_tokens,
                "num_prompt_tokens": r.num_prompt_tokens,
            })
        })
        .collect();
    let batch = serde_json::json!({"page_size": cfg.scheduler.page_size, "rows": rows});
    say!("{}", serde_json::to_string_pretty(&batch)?);
    let profile = cfg.backends.first().map_or("flashmla", |p| p.name());
    eprintln!(
        "sim plan --batch - --profile {profile} --num-spec-tokens {} --planner {} --workspace-tokens {}",
        cfg.spec.num_speculative_tokens,
        cfg.scheduler.planner.name(),
        cfg.scheduler.workspace_tokens
    );
    Ok(ExitCode::SUCCESS)
}

/// `replay audit LOG`: every step's violations, one line each (or `--json`); exit 1 if
/// any.
fn audit(a: &AuditArgs, json: bool) -> Result<ExitCode> {
    let name = a.log.display().to_string();
    let text = if name == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the step log from stdin")?
    } else {
        std::fs::read_to_string(&a.log).with_context(|| format!("reading {name}"))?
    };
    let (steps, findings) =
        specmla_replay::audit_log::audit_log(&text).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    if json {
        let v = specmla_replay::audit_log::findings_json(steps, &findings);
        say!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for f in &findings {
            let row = f.row.map_or(String::new(), |r| format!(" row {r}"));
            say!(
                "line {} step {}{row}: {}: {}",
                f.line,
                f.step,
                f.invariant,
                f.detail
            );
        }
        say!(
            "{}: {} audited, {}",
            if findings.is_empty() { "PASS" } else { "FAIL" },
            count(steps, "step"),
            count(findings.len(), "violation")
        );
    }
    Ok(if findings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn show(a: &ShowArgs, json: bool) -> Result<ExitCode> {
    let (t, _) = load(&a.trace)?;
    let records: Vec<&StepRecord> = t
        .records
        .iter()
        .filter(|r| a.step.is_none_or(|s| r.step == s))
        .collect();
    if let Some(s) = a.step {
        if records.is_empty() {
            bail!(
                "--step {s}: the trace has no such step (steps {}..={})",
                t.records.first().map_or(0, |r| r.step),
                t.records.last().map_or(0, |r| r.step)
            );
        }
    }
    if a.as_plan_input {
        return plan_input(&t, records[0]);
    }
    if json {
        let mut header = serde_json::to_value(&t.header)?;
        header["config"] = serde_json::from_str(&t.header.config_json)?;
        say!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"header": header, "steps": records}))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let h = &t.header;
    say!(
        "trace: scenario {}, seed {}, format {}, written by specmla {} on the {} backend ({}){}, {}, {}, faults recorded: {}",
        h.scenario,
        h.seed,
        h.format_version,
        h.tool_version,
        h.backend,
        h.kernels,
        if h.trace_tensors { " with tensors" } else { "" },
        count(h.workload.len(), "request"),
        count(t.records.len(), "step"),
        fault_list(&h.faults)
    );
    for r in records {
        if a.step.is_some() {
            print_step_detail(r);
        } else {
            print_step_line(r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_step_line(r: &StepRecord) {
    say!("{}", specmla_replay::show::step_line(r));
}

fn print_step_detail(r: &StepRecord) {
    for l in specmla_replay::show::step_detail(r) {
        say!("{l}");
    }
}
