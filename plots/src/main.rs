//! `plots`: draw the pictures of a `gpu-bench` CSV into a directory.
//!
//! Exit codes: 0 pictures written (some may be skipped with a note), 2 bad input or
//! environment, reported as one `error: ...` line on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Draw gpu-bench results: throughput.{png,svg}, bandwidth.{png,svg}, prefill.{png,svg},
/// spec_decode_vs_prefill.{png,svg} and roofline.{png,svg}.
///
/// A picture whose rows, or whose ceiling row, are absent from the CSV is skipped with a
/// note; the others are drawn.
#[derive(Parser)]
#[command(name = "plots", version)]
struct Cli {
    /// The CSV written by gpu-bench.
    #[arg(long)]
    csv: PathBuf,
    /// Directory for the pictures (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Appended to every title, e.g. "H100 SXM, 2026-05-01".
    #[arg(long)]
    title: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match specmla_plots::run(&cli.csv, &cli.out, cli.title.as_deref()) {
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
