//! `plots`: draw the pictures of a `gpu-bench` CSV into a directory.
//!
//! Exit codes: 0 pictures written (some may be skipped with a note), 2 bad input or
//! environment, reported as one `error: ...` line on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Draw gpu-bench results: throughput.{png,svg}, bandwidth.{png,svg}, prefill.{png,svg},
/// spec_decode_vs_prefill.{png,svg} and roofline.{png,svg}; or, with --sweep, a `sim
/// sweep` CSV's sweep_throughput, sweep_speedup and sweep_best_k (measured and simulated
/// on one picture).
///
/// A picture whose rows, or whose ceiling row, are absent from the CSV is skipped with a
/// note; the others are drawn.
#[derive(Parser)]
#[command(name = "plots", version)]
struct Cli {
    /// The CSV written by gpu-bench.
    #[arg(long, required_unless_present = "sweep", conflicts_with = "sweep")]
    csv: Option<PathBuf>,
    /// A CSV written by `sim sweep` (measured with --backend gpu, simulated with
    /// --cost-model, or both).
    #[arg(long)]
    sweep: Option<PathBuf>,
    /// Directory for the pictures (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Appended to every title, e.g. "H100 SXM, 2026-05-01".
    #[arg(long)]
    title: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let title = cli.title.as_deref();
    let result = match (&cli.csv, &cli.sweep) {
        (Some(csv), _) => specmla_plots::run(csv, &cli.out, title),
        (None, Some(sweep)) => specmla_plots::run_sweep(sweep, &cli.out, title),
        (None, None) => unreachable!("clap requires one of --csv and --sweep"),
    };
    match result {
        Ok(outcome) => {
            for (picture, note) in &outcome.skipped {
                println!("skipped {picture}: {note}");
            }
            for path in &outcome.written {
                println!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Messages are one line by construction; this keeps it so for wrapped errors.
            eprintln!("error: {}", e.to_string().replace('\n', " "));
            ExitCode::from(2)
        }
    }
}
