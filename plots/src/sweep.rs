//! Pictures of a `sim sweep` CSV, measured and simulated on one picture:
//! - `sweep_throughput`: generated tokens/s against batch;
//! - `sweep_speedup`: speedup over no speculation (same profile, graphs, batch and source)
//!   against batch, a line at 1 where speculation stops paying;
//! - `sweep_speedup_acceptance`: the same speedup against the run's mean acceptance
//!   length (1 + accepted drafts per verify row), a line per batch and K;
//! - `sweep_best_k`: the K with the most tokens/s at each batch (0: no speculation);
//! - `sweep_breakdown`: where each configuration's step time goes (attention, GEMMs,
//!   graph replays, all-reduce, overhead), a stacked bar per batch, configuration and
//!   source, where the CSV has the shares (simulated: a sweep run with `--cost-model`;
//!   measured: a `--backend gpu` sweep, whose graph replays hold their attention and
//!   GEMMs).
//!
//! A series is one configuration (spec, acceptance rate, profile, drafter batch, graphs)
//! from one source: measured throughput (`tokens_per_s`, a `--backend gpu` sweep) solid
//! with filled markers, simulated (`simulated_tokens_per_s`, `--cost-model`) dashed with
//! hollow ones. Color follows K, the marker the acceptance rate. Rows that failed their
//! checks are left out: a throughput from a wrong run is worthless.

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::PlotError;
use crate::font::FAMILY;
use crate::render::{DrawResult, Picture};
use crate::style::{self, LegendEntry, Marker, SeriesStyle};

/// The columns read, by name (the sweep CSV has more).
const COLUMNS: [&str; 9] = [
    "batch",
    "spec",
    "profile",
    "drafter_batch",
    "graphs",
    "acceptance_rate",
    "checks_passed",
    "tokens_per_s",
    "simulated_tokens_per_s",
];

/// Where a throughput comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Measured,
    Simulated,
}

/// The optional share columns of a simulated row.
const SIMULATED_SHARE_COLUMNS: [&str; 4] = [
    "simulated_attention_share",
    "simulated_gemm_share",
    "simulated_comm_share",
    "simulated_overhead_share",
];
/// The optional share columns of a measured row (the rest is overhead).
const MEASURED_SHARE_COLUMNS: [&str; 3] = [
    "measured_attention_share",
    "measured_gemm_share",
    "measured_graph_share",
];
/// The optional mean acceptance length column.
const ACCEPTANCE_LENGTH_COLUMN: &str = "mean_acceptance_length";
/// The shares' legend labels, in drawing order ([`Shares`]).
const SHARE_LABELS: [&str; 5] = [
    "attention",
    "GEMMs",
    "graph replays (measured)",
    "all-reduce (simulated)",
    "overhead (host, small kernels)",
];

/// Shares of a step's time, in [`SHARE_LABELS`]' order.
pub type Shares = [f64; 5];

/// One configuration at one batch, from one source.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub batch: u32,
    /// `off`, `mtp1`, `dflash8`, ...
    pub spec: String,
    /// K (0 for `off`).
    pub k: u32,
    pub acceptance: String,
    /// Profile, drafter batch, graphs.
    pub setup: String,
    /// Profile and graphs: what a speculating row's `off` row shares with it.
    pub base_setup: String,
    pub source: Source,
    pub tokens_per_s: f64,
    /// Where the step time goes ([`SHARE_LABELS`]), where the row says.
    pub shares: Option<Shares>,
    /// The run's mean acceptance length, where it speculated.
    pub mean_acceptance_length: Option<f64>,
}

/// The sweep's points that passed their checks, one per row and source.
pub fn load(path: &std::path::Path) -> Result<Vec<Point>, PlotError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PlotError::Read {
        path: p.clone(),
        source,
    })?;
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| PlotError::Csv {
            path: p.clone(),
            message: e.to_string(),
        })?
        .clone();
    let at: Vec<usize> = COLUMNS
        .iter()
        .map(|c| header.iter().position(|h| h == *c))
        .collect::<Option<_>>()
        .ok_or_else(|| PlotError::Header {
            path: p.clone(),
            line: 1,
            found: header.iter().collect::<Vec<_>>().join(","),
            problem: format!("a sim sweep CSV has the columns {}", COLUMNS.join(", ")),
        })?;
    let column = |c: &str| header.iter().position(|h| h == c);
    let simulated_at: Vec<Option<usize>> =
        SIMULATED_SHARE_COLUMNS.iter().map(|c| column(c)).collect();
    let measured_at: Vec<Option<usize>> =
        MEASURED_SHARE_COLUMNS.iter().map(|c| column(c)).collect();
    let length_at = column(ACCEPTANCE_LENGTH_COLUMN);
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let r = record.map_err(|e| PlotError::Csv {
            path: p.clone(),
            message: e.to_string(),
        })?;
        let line = i as u64 + 2;
        let field = |c: usize| r.get(at[c]).unwrap_or("");
        let bad = |c: usize, reason: &str| PlotError::Field {
            path: p.clone(),
            line,
            column: at[c] + 1,
            name: COLUMNS[c],
            reason: reason.to_string(),
        };
        if field(6) != "true" {
            continue;
        }
        let batch: u32 = field(0).parse().map_err(|_| bad(0, "not a whole number"))?;
        let spec = field(1).to_string();
        let k = spec_k(&spec).ok_or_else(|| bad(1, "not off, mtpK or dflashK"))?;
        for (c, source) in [(7, Source::Measured), (8, Source::Simulated)] {
            if field(c).is_empty() {
                continue;
            }
            let tokens_per_s: f64 = field(c).parse().map_err(|_| bad(c, "not a number"))?;
            let shares = match source {
                Source::Simulated => shares_of(&r, &simulated_at)
                    .map(|[att, gemm, comm, over]| [att, gemm, 0.0, comm, over]),
                // Overlapping timed regions can sum past 1: the rest is never negative.
                Source::Measured => shares_of(&r, &measured_at).map(|[att, gemm, graph]| {
                    [att, gemm, graph, 0.0, (1.0 - att - gemm - graph).max(0.0)]
                }),
            };
            let mean_acceptance_length = length_at
                .and_then(|a| r.get(a))
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|_| k > 0);
            out.push(Point {
                batch,
                spec: spec.clone(),
                k,
                acceptance: field(5).to_string(),
                setup: format!("{} {} graphs {}", field(2), field(3), field(4)),
                base_setup: format!("{} graphs {}", field(2), field(4)),
                source,
                tokens_per_s,
                shares,
                mean_acceptance_length,
            });
        }
    }
    if out.is_empty() {
        return Err(PlotError::NoRows { path: p });
    }
    Ok(out)
}

/// The `N` shares of a row, where every column is present and parses.
fn shares_of<const N: usize>(r: &csv::StringRecord, at: &[Option<usize>]) -> Option<[f64; N]> {
    let mut out = [0.0; N];
    for (o, a) in out.iter_mut().zip(at) {
        *o = r.get((*a)?)?.parse().ok()?;
    }
    Some(out)
}

fn spec_k(spec: &str) -> Option<u32> {
    match spec {
        "off" => Some(0),
        s => s
            .strip_prefix("mtp")
            .or_else(|| s.strip_prefix("dflash"))?
            .parse()
            .ok(),
    }
}

/// Which picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Throughput,
    Speedup,
    BestK,
    SpeedupAcceptance,
    Breakdown,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Throughput,
        Kind::Speedup,
        Kind::BestK,
        Kind::SpeedupAcceptance,
        Kind::Breakdown,
    ];

    /// The picture's file stem.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Throughput => "sweep_throughput",
            Kind::Speedup => "sweep_speedup",
            Kind::BestK => "sweep_best_k",
            Kind::SpeedupAcceptance => "sweep_speedup_acceptance",
            Kind::Breakdown => "sweep_breakdown",
        }
    }
}

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub k: u32,
    /// Index of the acceptance rate among the sweep's (the marker).
    pub rate: usize,
    pub source: Source,
    /// `(batch, value)`, by batch.
    pub points: Vec<(f64, f64)>,
}

/// Per batch, the best K and its tokens/s.
type BestByBatch = BTreeMap<u32, (u32, f64)>;

/// A picture, ready to draw.
pub struct SweepPicture {
    pub kind: Kind,
    pub series: Vec<Series>,
    /// The breakdown's bars: label and shares, by batch then configuration.
    pub bars: Vec<(String, Shares)>,
    title: String,
}

/// Every picture of `points`.
pub fn plans(points: &[Point], title: Option<&str>) -> Vec<SweepPicture> {
    let rates: Vec<String> = {
        let mut r: Vec<String> = points.iter().map(|p| p.acceptance.clone()).collect();
        r.sort();
        r.dedup();
        r
    };
    let rate = |a: &str| rates.iter().position(|r| r == a).unwrap_or(0);
    // One setup (speculating rows' profile, drafter batch, graphs) goes unnamed.
    let one_setup = {
        let mut v: Vec<&str> = points
            .iter()
            .filter(|p| p.k > 0)
            .map(|p| p.setup.as_str())
            .collect();
        v.sort_unstable();
        v.dedup();
        v.len() <= 1
    };
    let base = |p: &Point| {
        points
            .iter()
            .find(|o| {
                o.k == 0
                    && o.batch == p.batch
                    && o.source == p.source
                    && o.base_setup == p.base_setup
            })
            .map(|o| o.tokens_per_s)
    };
    let src = |s: Source| match s {
        Source::Measured => "measured",
        Source::Simulated => "simulated",
    };
    let batches: Vec<u32> = {
        let mut b: Vec<u32> = points.iter().map(|p| p.batch).collect();
        b.sort_unstable();
        b.dedup();
        b
    };
    let mut lines: BTreeMap<(Source, String, String, u32), Series> = BTreeMap::new();
    let mut speedups: BTreeMap<(Source, String, String, u32), Series> = BTreeMap::new();
    let mut by_acceptance: BTreeMap<(Source, String, u32, u32), Series> = BTreeMap::new();
    for p in points {
        let key = (p.source, p.setup.clone(), p.acceptance.clone(), p.k);
        let setup = match one_setup {
            true => String::new(),
            false => format!(", {}", p.setup),
        };
        let label = match p.k {
            0 => format!("off{setup} ({})", src(p.source)),
            _ => format!("{} at {}{setup} ({})", p.spec, p.acceptance, src(p.source)),
        };
        let series = |label: String| Series {
            label,
            k: p.k,
            rate: rate(&p.acceptance),
            source: p.source,
            points: Vec::new(),
        };
        lines
            .entry(key.clone())
            .or_insert_with(|| series(label.clone()))
            .points
            .push((p.batch as f64, p.tokens_per_s));
        if let (true, Some(b)) = (p.k > 0, base(p)) {
            speedups
                .entry(key)
                .or_insert_with(|| series(label))
                .points
                .push((p.batch as f64, p.tokens_per_s / b));
            if let Some(len) = p.mean_acceptance_length {
                let label = format!("{} at batch {}{setup} ({})", p.spec, p.batch, src(p.source));
                by_acceptance
                    .entry((p.source, p.setup.clone(), p.batch, p.k))
                    .or_insert_with(|| Series {
                        rate: batches.iter().position(|&b| b == p.batch).unwrap_or(0),
                        ..series(label)
                    })
                    .points
                    .push((len, p.tokens_per_s / b));
            }
        }
    }
    // Best K: per (source, setup, acceptance), the K with the most tokens/s at a batch.
    let mut best: BTreeMap<(Source, String, String), BestByBatch> = BTreeMap::new();
    for p in points.iter().filter(|p| p.k > 0) {
        let at = best
            .entry((p.source, p.setup.clone(), p.acceptance.clone()))
            .or_default()
            .entry(p.batch)
            .or_insert((0, base(p).unwrap_or(0.0)));
        if p.tokens_per_s > at.1 {
            *at = (p.k, p.tokens_per_s);
        }
    }
    let best_k: Vec<Series> = best
        .into_iter()
        .map(|((source, setup, acceptance), by_batch)| Series {
            label: match one_setup {
                true => format!("at {acceptance} ({})", src(source)),
                false => format!("at {acceptance}, {setup} ({})", src(source)),
            },
            k: 1,
            rate: rate(&acceptance),
            source,
            points: by_batch
                .iter()
                .map(|(b, (k, _))| (*b as f64, *k as f64))
                .collect(),
        })
        .collect();
    fn sorted<K>(m: BTreeMap<K, Series>) -> Vec<Series> {
        m.into_values()
            .map(|mut s| {
                s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
                s
            })
            .collect()
    }
    let titles = [
        "Generated tokens/s against batch",
        "Speedup over no speculation against batch",
        "Best K against batch (0: no speculation)",
        "Speedup over no speculation against mean acceptance length",
    ];
    let all = [
        sorted(lines),
        sorted(speedups),
        best_k,
        sorted(by_acceptance),
    ];
    let mut out: Vec<SweepPicture> = Kind::ALL
        .into_iter()
        .zip(all)
        .zip(titles)
        .filter(|((_, s), _)| !s.is_empty())
        .map(|((kind, series), t)| SweepPicture {
            kind,
            series,
            bars: Vec::new(),
            title: style::title(t, title),
        })
        .collect();
    let bars = breakdown_bars(points, one_setup);
    if !bars.is_empty() {
        out.push(SweepPicture {
            kind: Kind::Breakdown,
            series: Vec::new(),
            bars,
            title: style::title("Where a step's time goes", title),
        });
    }
    out
}

/// The points with shares, by batch, K, acceptance, setup and source.
fn breakdown_bars(points: &[Point], one_setup: bool) -> Vec<(String, Shares)> {
    let mut v: Vec<&Point> = points.iter().filter(|p| p.shares.is_some()).collect();
    v.sort_by(|a, b| {
        (a.batch, a.k, &a.acceptance, &a.setup, a.source).cmp(&(
            b.batch,
            b.k,
            &b.acceptance,
            &b.setup,
            b.source,
        ))
    });
    let sources = {
        let mut s: Vec<Source> = v.iter().map(|p| p.source).collect();
        s.dedup();
        s.sort();
        s.dedup();
        s.len()
    };
    v.into_iter()
        .map(|p| {
            let at = match p.k {
                0 => String::new(),
                _ => format!("@{}", p.acceptance),
            };
            let setup = match one_setup {
                true => String::new(),
                false => format!(" {}", p.setup),
            };
            let source = match (sources, p.source) {
                (1, _) => "",
                (_, Source::Measured) => " measured",
                (_, Source::Simulated) => " simulated",
            };
            let label = format!("b{} {}{at}{setup}{source}", p.batch, p.spec);
            (label, p.shares.expect("filtered"))
        })
        .collect()
}

impl Series {
    fn style(&self, kind: Kind) -> SeriesStyle {
        let markers = [
            Marker::Circle,
            Marker::Square,
            Marker::Triangle,
            Marker::Cross,
        ];
        SeriesStyle {
            color: match kind {
                Kind::BestK => style::palette(self.rate),
                _ => style::palette(self.k as usize),
            },
            marker: Some(markers[self.rate % markers.len()]),
            filled: self.source == Source::Measured,
            dashed: Some(self.source == Source::Simulated),
            width_px: 2,
        }
    }
}

impl Picture for SweepPicture {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn size_px(&self) -> (u32, u32) {
        (1280, 760)
    }

    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        match self.kind {
            Kind::Breakdown => return self.draw_breakdown(root),
            Kind::SpeedupAcceptance => return self.draw_by_acceptance(root),
            _ => {}
        }
        let all = || self.series.iter().flat_map(|s| s.points.iter().copied());
        let x_max = all().map(|p| p.0).fold(1.0, f64::max);
        let (x_lo, x_hi) = (0.7, x_max * 1.5);
        let root = root.titled(&self.title, (FAMILY, style::TITLE_PX))?;
        let width_px = root.dim_in_pixel().0;
        let (chart_area, legend_area) = root.split_horizontally(width_px - style::LEGEND_WIDTH_PX);
        let x = (x_lo..x_hi).log_scale();
        let desc = "batch (requests, log scale)";
        match self.kind {
            Kind::Throughput => {
                let y_min = all().map(|p| p.1).fold(f64::INFINITY, f64::min);
                let y_max = all().map(|p| p.1).fold(0.0, f64::max);
                let mut chart = ChartBuilder::on(&chart_area)
                    .margin(12)
                    .x_label_area_size(50)
                    .y_label_area_size(80)
                    .build_cartesian_2d(x, (y_min / 1.5..y_max * 1.5).log_scale())?;
                mesh(&mut chart, desc, "generated tokens/s (log scale)")?;
                self.draw_series(chart.plotting_area())?;
            }
            Kind::Breakdown | Kind::SpeedupAcceptance => unreachable!("drawn above"),
            Kind::Speedup | Kind::BestK => {
                let y_max = all().map(|p| p.1).fold(1.0, f64::max);
                let (y_lo, y_hi, what) = match self.kind {
                    Kind::Speedup => (0.0, y_max * 1.15, "speedup over no speculation"),
                    _ => (-0.3, y_max + 0.7, "best K (0: no speculation)"),
                };
                let mut chart = ChartBuilder::on(&chart_area)
                    .margin(12)
                    .x_label_area_size(50)
                    .y_label_area_size(80)
                    .build_cartesian_2d(x, y_lo..y_hi)?;
                mesh(&mut chart, desc, what)?;
                let plot = chart.plotting_area();
                if self.kind == Kind::Speedup {
                    draw_one(plot, x_lo, x_hi)?;
                }
                self.draw_series(plot)?;
            }
        }
        self.draw_legend(&legend_area, "solid: measured; dashed: simulated")
    }
}

/// The line at a speedup of 1, where speculation stops paying.
fn draw_one<DB, CT>(plot: &DrawingArea<DB, CT>, x_lo: f64, x_hi: f64) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let one = SeriesStyle {
        color: style::CEILING_COLOR,
        marker: None,
        filled: false,
        dashed: Some(false),
        width_px: 1,
    };
    style::draw_line(plot, &[(x_lo, 1.0), (x_hi, 1.0)], &one)
}

impl SweepPicture {
    /// Speedup against mean acceptance length: linear axes, a line at 1.
    fn draw_by_acceptance<DB>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let all = || self.series.iter().flat_map(|s| s.points.iter().copied());
        let x_max = all().map(|p| p.0).fold(1.0, f64::max);
        let y_max = all().map(|p| p.1).fold(1.0, f64::max);
        let root = root.titled(&self.title, (FAMILY, style::TITLE_PX))?;
        let width_px = root.dim_in_pixel().0;
        let (chart_area, legend_area) = root.split_horizontally(width_px - style::LEGEND_WIDTH_PX);
        let (x_lo, x_hi) = (1.0, x_max + 0.3);
        let mut chart = ChartBuilder::on(&chart_area)
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(x_lo..x_hi, 0.0..y_max * 1.15)?;
        chart
            .configure_mesh()
            .x_desc("mean acceptance length (tokens per verify row)")
            .y_desc("speedup over no speculation")
            .label_style((FAMILY, style::LABEL_PX))
            .axis_desc_style((FAMILY, style::AXIS_DESC_PX))
            .draw()?;
        let plot = chart.plotting_area();
        draw_one(plot, x_lo, x_hi)?;
        self.draw_series(plot)?;
        self.draw_legend(
            &legend_area,
            "color: K; marker: batch; solid: measured; dashed: simulated",
        )
    }

    /// A legend entry per series, then `note`.
    fn draw_legend<DB>(&self, area: &DrawingArea<DB, Shift>, note: &str) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let mut legend: Vec<LegendEntry> = self
            .series
            .iter()
            .map(|s| LegendEntry {
                label: s.label.clone(),
                style: Some(s.style(self.kind)),
            })
            .collect();
        legend.push(LegendEntry {
            label: note.into(),
            style: None,
        });
        style::draw_legend(area, &legend)
    }

    /// A stacked bar per (batch, configuration): its shares of step time.
    fn draw_breakdown<DB>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let n = self.bars.len();
        let root = root.titled(&self.title, (FAMILY, style::TITLE_PX))?;
        let width_px = root.dim_in_pixel().0;
        let (chart_area, legend_area) = root.split_horizontally(width_px - style::LEGEND_WIDTH_PX);
        // Each batch's first bar is labelled with the batch; the legend gives the order
        // of the configurations within a batch.
        let batch_of = |l: &str| l.split(' ').next().unwrap_or("").to_string();
        let labels: Vec<String> = self
            .bars
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let first = i == 0 || batch_of(&self.bars[i - 1].0) != batch_of(&b.0);
                match first {
                    true => format!("batch {}", batch_of(&b.0).trim_start_matches('b')),
                    false => String::new(),
                }
            })
            .collect();
        let mut chart = ChartBuilder::on(&chart_area)
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..1.0)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|v| {
                let i = v.round();
                match (i - v).abs() < 0.01 && i >= 0.0 {
                    true => labels.get(i as usize).cloned().unwrap_or_default(),
                    false => String::new(),
                }
            })
            .y_desc("share of step time")
            .label_style((FAMILY, style::LABEL_PX))
            .axis_desc_style((FAMILY, style::AXIS_DESC_PX))
            .draw()?;
        let colors: Vec<RGBColor> = (0..SHARE_LABELS.len()).map(style::palette).collect();
        for (i, (_, shares)) in self.bars.iter().enumerate() {
            let mut y = 0.0;
            for (share, color) in shares.iter().zip(&colors) {
                let x = i as f64;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x - 0.35, y), (x + 0.35, y + share)],
                    color.filled(),
                )))?;
                y += share;
            }
        }
        let legend: Vec<LegendEntry> = SHARE_LABELS
            .iter()
            .zip(&colors)
            .map(|(label, &color)| LegendEntry {
                label: (*label).to_string(),
                style: Some(SeriesStyle {
                    color,
                    marker: Some(Marker::Square),
                    filled: true,
                    dashed: Some(false),
                    width_px: 8,
                }),
            })
            .collect();
        let mut legend = legend;
        let first = batch_of(&self.bars[0].0);
        legend.push(LegendEntry {
            label: "bars within a batch, left to right:".into(),
            style: None,
        });
        legend.extend(
            self.bars
                .iter()
                .take_while(|b| batch_of(&b.0) == first)
                .map(|b| LegendEntry {
                    label: format!("  {}", b.0.split_once(' ').map_or("", |x| x.1)),
                    style: None,
                }),
        );
        style::draw_legend(&legend_area, &legend)
    }

    fn draw_series<DB, CT>(&self, plot: &DrawingArea<DB, CT>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
        CT: CoordTranslate<From = (f64, f64)>,
    {
        for s in &self.series {
            style::draw_series(plot, &s.points, &s.style(self.kind))?;
        }
        Ok(())
    }
}

fn mesh<DB, Y>(
    chart: &mut ChartContext<DB, Cartesian2d<plotters::coord::combinators::LogCoord<f64>, Y>>,
    x_desc: &str,
    y_desc: &str,
) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(8)
        .y_labels(10)
        .x_label_formatter(&|v| style::fmt_sig(*v))
        .label_style((FAMILY, style::LABEL_PX))
        .axis_desc_style((FAMILY, style::AXIS_DESC_PX))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(batch: u32, spec: &str, source: Source, tps: f64) -> Point {
        Point {
            batch,
            spec: spec.into(),
            k: spec_k(spec).unwrap(),
            acceptance: if spec == "off" {
                "-".into()
            } else {
                "0.8".into()
            },
            setup: match spec {
                "off" => "flashmla - graphs on".into(),
                _ => "flashmla padded graphs on".into(),
            },
            base_setup: "flashmla graphs on".into(),
            source,
            tokens_per_s: tps,
            shares: None,
            mean_acceptance_length: (spec != "off").then_some(1.5),
        }
    }

    #[test]
    fn speedups_and_best_k_compare_within_a_source() {
        use Source::*;
        let pts = vec![
            point(1, "off", Measured, 100.0),
            point(1, "mtp1", Measured, 150.0),
            point(8, "off", Measured, 800.0),
            point(8, "mtp1", Measured, 700.0),
            point(1, "off", Simulated, 110.0),
            point(1, "mtp1", Simulated, 220.0),
        ];
        let pics = plans(&pts, None);
        assert_eq!(pics.len(), 4, "no shares: no breakdown");
        let speed = &pics[1].series;
        let m = speed.iter().find(|s| s.source == Measured).unwrap();
        assert_eq!(m.points, vec![(1.0, 1.5), (8.0, 0.875)]);
        let s = speed.iter().find(|s| s.source == Simulated).unwrap();
        assert_eq!(s.points, vec![(1.0, 2.0)]);
        let best = &pics[2].series;
        let m = best.iter().find(|s| s.source == Measured).unwrap();
        // Speculation loses at batch 8: K 0.
        assert_eq!(m.points, vec![(1.0, 1.0), (8.0, 0.0)]);
    }

    #[test]
    fn the_breakdown_has_a_bar_per_simulated_point_with_shares() {
        let mut pts = vec![
            point(4, "mtp1", Source::Simulated, 200.0),
            point(1, "off", Source::Simulated, 100.0),
            point(1, "off", Source::Measured, 90.0),
        ];
        pts[0].shares = Some([0.1, 0.6, 0.0, 0.0, 0.3]);
        pts[1].shares = Some([0.2, 0.5, 0.0, 0.0, 0.3]);
        let pics = plans(&pts, None);
        let b = pics.iter().find(|p| p.kind == Kind::Breakdown).unwrap();
        let labels: Vec<&str> = b.bars.iter().map(|b| b.0.as_str()).collect();
        assert_eq!(labels, ["b1 off", "b4 mtp1@0.8"]);
        // A measured point with shares gets its bar beside the simulated one, each named.
        pts[2].shares = Some([0.3, 0.2, 0.4, 0.0, 0.1]);
        let pics = plans(&pts, None);
        let b = pics.iter().find(|p| p.kind == Kind::Breakdown).unwrap();
        let labels: Vec<&str> = b.bars.iter().map(|b| b.0.as_str()).collect();
        assert_eq!(
            labels,
            [
                "b1 off measured",
                "b1 off simulated",
                "b4 mtp1@0.8 simulated"
            ]
        );
    }

    #[test]
    fn speedup_against_acceptance_length_is_a_line_per_batch_and_k() {
        use Source::*;
        let mut pts = vec![
            point(4, "off", Simulated, 100.0),
            point(4, "mtp2", Simulated, 150.0),
            point(4, "mtp2", Simulated, 180.0),
            point(16, "off", Simulated, 400.0),
            point(16, "mtp2", Simulated, 300.0),
        ];
        pts[2].acceptance = "0.9".into();
        pts[2].mean_acceptance_length = Some(2.5);
        let pics = plans(&pts, None);
        let a = pics
            .iter()
            .find(|p| p.kind == Kind::SpeedupAcceptance)
            .unwrap();
        assert_eq!(a.series.len(), 2);
        assert_eq!(a.series[0].points, vec![(1.5, 1.5), (2.5, 1.8)]);
        assert_eq!(a.series[1].points, vec![(1.5, 0.75)]);
        assert_ne!(a.series[0].rate, a.series[1].rate, "a marker per batch");
    }

    #[test]
    fn spec_names() {
        assert_eq!(spec_k("off"), Some(0));
        assert_eq!(spec_k("mtp3"), Some(3));
        assert_eq!(spec_k("dflash8"), Some(8));
        assert_eq!(spec_k("eagle"), None);
    }
}
