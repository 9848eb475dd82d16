//! `sim`: run a built-in scenario on the CPU reference backend (or the CUDA one) with every check on,
//! list scenarios and profiles, or explain how one batch is planned.
//!
//! Exit codes: 0 all checks passed, 1 a check failed, 2 bad input or environment.

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

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use specmla_core::config::BackendProfile;
mod cli_plan;
mod cli_run;
mod cli_sweep;

use cli_plan::{run_plan, PlanArgs};
use cli_run::{run_scenario, RunArgs};
use cli_sweep::{run_sweep, SweepArgs};
use specmla_sim::scenarios;

/// Deterministic simulator for speculative decoding on MLA models.
///
/// With no subcommand, runs a scenario (default `mixed_mtp`) and checks, every step, all
/// metadata invariants, spec output == plain greedy, agreement with an f64 oracle,
/// padded == compacted drafter proposals and decode-first == extend-first outputs.
#[derive(Parser)]
#[command(
    name = "sim",
    version,
    args_conflicts_with_subcommands = true,
    allow_negative_numbers = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
    /// Print machine-readable JSON (every command that reports; before or after the
    /// subcommand).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario (the default when no subcommand is given).
    Run(RunArgs),
    /// List the built-in scenarios and the backend profiles.
    List(ListArgs),
    /// Explain how one batch is reordered, split, chunked and dispatched.
    Plan(PlanArgs),
    /// Print the full configuration of a run as TOML (every field, its unit, and the
    /// scenario's default where a flag changed it); `sim --config FILE` runs it.
    Config(RunArgs),
    /// Run a grid of spec-decoding configurations (batch, speculation, profile, drafter
    /// batch, graphs, acceptance rate), one checked run per point, one CSV row each;
    /// resumable, shardable, mergeable.
    Sweep(Box<SweepArgs>),
}

#[derive(Args)]
struct ListArgs {}

fn main() -> ExitCode {
    let subcommands = ["run", "list", "plan", "config", "sweep"];
    let cli = Cli::parse_from(specmla_sim::cli::args_with_json_last(&subcommands));
    let json = cli.json;
    let with_json = |mut a: RunArgs| {
        a.json = json;
        a
    };
    let result = match cli.command {
        None => run_scenario(&with_json(cli.run)),
        Some(Command::Run(args)) => run_scenario(&with_json(args)),
        Some(Command::List(_)) => list(json),
        // `sim plan` prints JSON either way.
        Some(Command::Plan(args)) => run_plan(&args),
        Some(Command::Config(args)) => cli_run::print_config(&with_json(args)),
        Some(Command::Sweep(args)) => run_sweep(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn list(json: bool) -> anyhow::Result<ExitCode> {
    let all = scenarios::all();
    if json {
        let v = serde_json::json!({
            "scenarios": all.iter().map(|s| serde_json::json!({
                "name": s.name, "description": s.description,
                "config": specmla_sim::config_file::RunConfig::of(s, 0),
            })).collect::<Vec<_>>(),
            "planners": specmla_core::config::Planner::ALL.map(|p| p.name()),
            "faults": specmla_core::fault::Fault::ALL.map(|f| serde_json::json!({
                "id": f.id(), "mirrors": f.mirrors(), "trigger": f.trigger(),
            })),
            "models": specmla_core::config::MODEL_NAMES.iter().map(|(name, what)| serde_json::json!({
                "name": name, "description": what,
                "dims": specmla_core::config::ModelDims::named(name),
            })).collect::<Vec<_>>(),
            "backends": BackendProfile::ALL.iter().map(|p| serde_json::json!({"name": p.name(), "capabilities": p.capabilities()})).collect::<Vec<_>>(),
        });
        say!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    say!("scenarios (`sim config --scenario NAME` prints every setting):");
    for s in &all {
        say!("  {:<14} {}", s.name, s.description);
        say!("  {:<14} {}", "", scenario_settings(s));
    }
    say!("\nbackend profiles:");
    say!(
        "  {:<16} {:<11} {:>9}  {:<25} non-causal",
        "name",
        "query len",
        "threshold",
        "cuda graph"
    );
    for p in BackendProfile::ALL {
        let c = p.capabilities();
        say!(
            "  {:<16} {:<11} {:>9}  {:<25} {}",
            p.name(),
            format!("{:?}", c.query_len_support),
            c.base_threshold,
            format!("{:?}", c.cuda_graph),
            if c.non_causal { "yes" } else { "no" }
        );
    }
    let planners = specmla_core::config::Planner::ALL.map(|p| p.name());
    say!(
        "\nplanners: {} (the first is the default)",
        planners.join(", ")
    );
    say!("\nfaults (`--fault ID`; the real bug each re-introduces, and what makes it fire):");
    for f in specmla_core::fault::Fault::ALL {
        say!("  {:<4} {}", f.id(), f.mirrors());
        say!("  {:<4} fires with: {}", "", f.trigger());
    }
    say!("\nmodels (`--model NAME`; `--tp N` keeps 1/N of the heads):");
    for (name, what) in specmla_core::config::MODEL_NAMES {
        say!("  {name:<17} {what}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The settings that tell scenarios apart, on one line.
fn scenario_settings(s: &scenarios::Scenario) -> String {
    let c = &s.cfg;
    let method = match c.spec.method {
        specmla_core::config::SpecMethod::Off => "no speculation".to_string(),
        specmla_core::config::SpecMethod::MultiStep => format!("multi-step K={}", c.spec.k()),
        specmla_core::config::SpecMethod::DFlash => format!("DFlash K={}", c.spec.k()),
    };
    let profiles: Vec<&str> = c.backends.iter().map(|p| p.name()).collect();
    format!(
        "{}, {method}, {} requests, page {}, max_model_len {}, {} KV blocks{}",
        profiles.join("+"),
        s.workload.num_requests,
        c.scheduler.page_size,
        c.scheduler.max_model_len,
        c.scheduler.num_gpu_blocks,
        if c.cuda_graphs { ", graphs" } else { "" }
    )
}
