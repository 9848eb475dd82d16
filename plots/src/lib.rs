//! specmla-plots: draws the pictures of a `gpu-bench` CSV (throughput, bandwidth,
//! spec-step decode vs prefill, roofline) as PNG and SVG with an embedded font.
//!
//! [`run`] plans every picture first, so bad input fails before any file is written,
//! then draws the planned ones. A picture without rows, or without the ceiling it is
//! measured against, is skipped with a note; the pictures that do not need that ceiling
//! are still drawn.

#![forbid(unsafe_code)]

pub mod data;
pub mod error;
pub mod font;
pub mod render;
pub mod roofline;
pub mod spec;
pub mod style;
pub mod sweep;
pub mod throughput;

use std::path::{Path, PathBuf};

pub use error::PlotError;

use render::Picture;

/// Whether a picture is drawn, or why not.
pub enum Plan<P> {
    /// Draw it.
    Draw(P),
    /// Skip it; the note says which rows are missing.
    Skip(String),
}

/// What [`run`] did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Files written, PNG then SVG per picture.
    pub written: Vec<PathBuf>,
    /// (picture, note) for each picture skipped for lack of rows.
    pub skipped: Vec<(&'static str, String)>,
}

/// Parses `csv`, then writes every picture it has rows for into `out_dir` (created if
/// missing). `title` is appended to every picture's title (device, date).
pub fn run(csv: &Path, out_dir: &Path, title: Option<&str>) -> Result<Outcome, PlotError> {
    font::register()?;
    let bench = data::Bench::load(csv)?;

    use throughput::Metric;
    let throughput = or_skip(throughput::plan(&bench, Metric::Tflops, title))?;
    let bandwidth = or_skip(throughput::plan(&bench, Metric::Gbps, title))?;
    let prefill = or_skip(throughput::plan(&bench, Metric::Prefill, title))?;
    let spec = or_skip(spec::plan(&bench, title))?;
    let roofline = or_skip(roofline::plan(&bench, title))?;

    std::fs::create_dir_all(out_dir).map_err(|source| PlotError::OutDir {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut outcome = Outcome::default();
    draw(throughput, "throughput", out_dir, &mut outcome)?;
    draw(bandwidth, "bandwidth", out_dir, &mut outcome)?;
    draw(prefill, "prefill", out_dir, &mut outcome)?;
    draw(spec, "spec_decode_vs_prefill", out_dir, &mut outcome)?;
    draw(roofline, "roofline", out_dir, &mut outcome)?;
    Ok(outcome)
}

/// Parses a `sim sweep` CSV and writes its pictures (`sweep_throughput`,
/// `sweep_speedup`, `sweep_best_k`, `sweep_speedup_acceptance`, `sweep_breakdown`) into
/// `out_dir`; a picture with no series (no speculating rows for the speedup) is skipped
/// with a note.
pub fn run_sweep(csv: &Path, out_dir: &Path, title: Option<&str>) -> Result<Outcome, PlotError> {
    font::register()?;
    let points = sweep::load(csv)?;
    let pictures = sweep::plans(&points, title);
    std::fs::create_dir_all(out_dir).map_err(|source| PlotError::OutDir {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut outcome = Outcome::default();
    for kind in sweep::Kind::ALL {
        match pictures.iter().find(|p| p.kind == kind) {
            Some(p) => outcome
                .written
                .extend(render::write_png_and_svg(p, out_dir)?),
            None => outcome.skipped.push((
                kind.name(),
                "no rows for it (a speedup needs speculating rows and their `off` rows; a \
                 breakdown needs a sweep run with --cost-model or --backend gpu)"
                    .into(),
            )),
        }
    }
    Ok(outcome)
}

/// A picture whose ceiling row is missing is skipped with the error as its note: the
/// other pictures do not need that ceiling.
fn or_skip<P>(plan: Result<Plan<P>, PlotError>) -> Result<Plan<P>, PlotError> {
    match plan {
        Err(e @ PlotError::MissingCeiling { .. }) => Ok(Plan::Skip(e.to_string())),
        other => other,
    }
}

fn draw<P: Picture>(
    plan: Plan<P>,
    name: &'static str,
    out_dir: &Path,
    outcome: &mut Outcome,
) -> Result<(), PlotError> {
    match plan {
        Plan::Draw(picture) => outcome
            .written
            .extend(render::write_png_and_svg(&picture, out_dir)?),
        Plan::Skip(note) => outcome.skipped.push((name, note)),
    }
    Ok(())
}
