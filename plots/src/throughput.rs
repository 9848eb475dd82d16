//! Pictures `throughput` (TFLOP/s) and `bandwidth` (GB/s) against context length, one
//! series per (kernel, mode, q_len, heads, batch) of the decode-like kernels, with the
//! GEMM or copy ceiling as a horizontal line.

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::data::{Bench, Row, COPY_KERNEL, GEMM_KERNEL, PREFILL_KERNEL};
use crate::error::PlotError;
use crate::font::FAMILY;
use crate::render::{DrawResult, Picture};
use crate::style::{self, LegendEntry, SeriesStyle};
use crate::Plan;

/// Which rate is drawn against context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// `tflop_per_s` against the bf16 GEMM ceiling.
    Tflops,
    /// `gb_per_s` against the copy ceiling.
    Gbps,
}

impl Metric {
    fn value(self, row: &Row) -> f64 {
        match self {
            Metric::Tflops => row.tflop_per_s,
            Metric::Gbps => row.gb_per_s,
        }
    }

    /// The picture's file stem.
    pub fn picture_name(self) -> &'static str {
        match self {
            Metric::Tflops => "throughput",
            Metric::Gbps => "bandwidth",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Metric::Tflops => "TFLOP/s",
            Metric::Gbps => "GB/s",
        }
    }
}

/// Identifies one line of the picture.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeriesKey {
    /// Kernel name.
    pub kernel: String,
    /// Kernel mode (may be empty).
    pub mode: String,
    /// Query tokens per request.
    pub q_len: u32,
    /// Query heads.
    pub heads: u32,
    /// Requests in the batch.
    pub batch: u32,
}

impl SeriesKey {
    fn label(&self) -> String {
        format!(
            "{} q={} h={} b={}",
            crate::data::kernel_label(&self.kernel, &self.mode),
            self.q_len,
            self.heads,
            self.batch
        )
    }
}

/// One line: (context tokens, rate) points in context order.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextSeries {
    /// Which line.
    pub key: SeriesKey,
    /// (context, rate), ascending context.
    pub points: Vec<(f64, f64)>,
}

/// Decode-like kernels are measured against context; the prefill path is a different
/// kind of work and has its own picture (`spec_decode_vs_prefill`).
pub fn is_decode_like(row: &Row) -> bool {
    !row.is_ceiling() && row.kernel != PREFILL_KERNEL
}

/// The series of decode-like rows with a positive context and rate. Where several rows
/// share a series and context (page sizes, repeats), the best rate is kept.
pub fn context_series(bench: &Bench, metric: Metric) -> Vec<ContextSeries> {
    let mut series: BTreeMap<SeriesKey, BTreeMap<u64, f64>> = BTreeMap::new();
    for row in bench.rows.iter().filter(|r| is_decode_like(r)) {
        let value = metric.value(row);
        if row.context == 0 || value <= 0.0 {
            continue;
        }
        let key = SeriesKey {
            kernel: row.kernel.clone(),
            mode: row.mode.clone(),
            q_len: row.q_len,
            heads: row.heads,
            batch: row.batch,
        };
        let best = series
            .entry(key)
            .or_default()
            .entry(row.context)
            .or_insert(value);
        *best = best.max(value);
    }
    series
        .into_iter()
        .map(|(key, points)| ContextSeries {
            key,
            points: points.into_iter().map(|(c, v)| (c as f64, v)).collect(),
        })
        .collect()
}

/// The `throughput` or `bandwidth` picture, ready to draw.
pub struct ContextPicture {
    metric: Metric,
    series: Vec<ContextSeries>,
    ceiling: f64,
    title: String,
}

/// Plans the picture: skipped without rows, an error without its ceiling.
pub fn plan(
    bench: &Bench,
    metric: Metric,
    title: Option<&str>,
) -> Result<Plan<ContextPicture>, PlotError> {
    let series = context_series(bench, metric);
    if series.is_empty() {
        return Ok(Plan::Skip(format!(
            "no decode-like rows with context > 0 and {} > 0",
            match metric {
                Metric::Tflops => "tflop_per_s",
                Metric::Gbps => "gb_per_s",
            }
        )));
    }
    let ceilings = bench.ceilings();
    let (ceiling, missing) = match metric {
        Metric::Tflops => (
            ceilings.gemm_tflop_per_s,
            ("bf16 GEMM ceiling", GEMM_KERNEL, "tflop_per_s"),
        ),
        Metric::Gbps => (
            ceilings.copy_gb_per_s,
            ("copy ceiling", COPY_KERNEL, "gb_per_s"),
        ),
    };
    let Some(ceiling) = ceiling else {
        return Err(PlotError::MissingCeiling {
            picture: metric.picture_name(),
            what: missing.0,
            path: bench.path.clone(),
            kernel: missing.1,
            field: missing.2,
        });
    };
    let base = match metric {
        Metric::Tflops => "MLA decode throughput vs context",
        Metric::Gbps => "MLA decode bandwidth vs context",
    };
    Ok(Plan::Draw(ContextPicture {
        metric,
        series,
        ceiling,
        title: style::title(base, title),
    }))
}

impl Picture for ContextPicture {
    fn name(&self) -> &'static str {
        self.metric.picture_name()
    }

    fn size_px(&self) -> (u32, u32) {
        (1280, 720)
    }

    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let root = root.titled(&self.title, (FAMILY, style::TITLE_PX))?;
        let width_px = root.dim_in_pixel().0;
        let (chart_area, legend_area) = root.split_horizontally(width_px - style::LEGEND_WIDTH_PX);

        let contexts = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let (min_ctx, max_ctx) =
            contexts.fold((f64::MAX, 0f64), |(lo, hi), c| (lo.min(c), hi.max(c)));
        // Half a doubling of air on each side so end points are not on the frame.
        let (x_lo, x_hi) = (min_ctx / 1.5, max_ctx * 1.5);
        let max_value = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(self.ceiling, f64::max);
        let y_hi = max_value * 1.12;
        let doublings = (x_hi / x_lo).log2().ceil() as usize;

        let unit = self.metric.unit();
        let mut chart = ChartBuilder::on(&chart_area)
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d((x_lo..x_hi).log_scale().base(2.0), 0.0..y_hi)?;
        chart
            .configure_mesh()
            .x_desc("context (KV tokens per request, log2 scale)")
            .y_desc(format!("{} ({unit})", self.metric.picture_name()))
            // Asking for at least one label per doubling keeps plotters at powers of two.
            .x_labels(doublings + 1)
            .x_label_formatter(&|v| style::fmt_tokens(*v))
            .y_label_formatter(&|v| style::fmt_sig(*v))
            .label_style((FAMILY, style::LABEL_PX))
            .axis_desc_style((FAMILY, style::AXIS_DESC_PX))
            .draw()?;

        let area = chart.plotting_area();
        let ceiling_style = SeriesStyle {
            color: style::CEILING_COLOR,
            marker: None,
            filled: false,
            dashed: Some(false),
            width_px: 3,
        };
        let (ceiling_label, ceiling_name) = match self.metric {
            Metric::Tflops => (
                format!("bf16 GEMM {} TFLOP/s", style::fmt_sig(self.ceiling)),
                "bf16 GEMM ceiling",
            ),
            Metric::Gbps => (
                format!("copy {} GB/s (read + write)", style::fmt_sig(self.ceiling)),
                "copy ceiling",
            ),
        };
        style::draw_line(
            area,
            &[(x_lo, self.ceiling), (x_hi, self.ceiling)],
            &ceiling_style,
        )?;
        area.draw(
            &(EmptyElement::at((x_hi, self.ceiling))
                + Text::new(
                    ceiling_label.clone(),
                    (-8, -6),
                    (FAMILY, style::LABEL_PX)
                        .into_font()
                        .color(&style::CEILING_COLOR)
                        .pos(Pos::new(HPos::Right, VPos::Bottom)),
                )),
        )?;

        let mut legend = vec![LegendEntry {
            label: ceiling_name.to_string(),
            style: Some(ceiling_style),
        }];
        for (i, series) in self.series.iter().enumerate() {
            let s = style::series_style(&series.key.kernel, &series.key.mode, style::palette(i));
            style::draw_series(area, &series.points, &s)?;
            legend.push(LegendEntry {
                label: series.key.label(),
                style: Some(s),
            });
        }
        style::draw_legend(&legend_area, &legend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm
gemm_bf16,,0,0,0,0,0,0,0,0,0,700,0,0
decode,fast,128,4,64,4096,64,10,1,1,1000,100,0,0
decode,fast,128,4,64,4096,16,10,1,1,1100,90,0,0
decode,fast,128,4,64,1024,64,10,1,1,500,50,0,0
decode,invariant,128,4,64,1024,64,10,1,1,400,40,0,0
prefill_path,,128,4,64,1024,64,10,1,1,400,40,0,0
triton_peer,,128,1,64,0,64,10,1,1,400,40,0,0
";

    #[test]
    fn series_group_by_key_and_keep_the_best_point() {
        let bench = Bench::parse(CSV.as_bytes(), "t.csv").unwrap();
        let series = context_series(&bench, Metric::Tflops);
        // prefill_path is not decode-like; the peer row has no context.
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].key.mode, "fast");
        assert_eq!(series[0].points, vec![(1024.0, 50.0), (4096.0, 100.0)]);
        assert_eq!(series[1].key.mode, "invariant");
        let gbps = context_series(&bench, Metric::Gbps);
        assert_eq!(gbps[0].points, vec![(1024.0, 500.0), (4096.0, 1100.0)]);
    }

    #[test]
    fn missing_ceiling_is_an_error_and_no_rows_a_skip() {
        let bench = Bench::parse(CSV.as_bytes(), "t.csv").unwrap();
        assert!(matches!(
            plan(&bench, Metric::Tflops, None),
            Ok(Plan::Draw(_))
        ));
        let err = plan(&bench, Metric::Gbps, None).err().unwrap();
        assert_eq!(
            err.to_string(),
            "picture `bandwidth` needs the copy ceiling: t.csv has no `copy` row with gb_per_s > 0"
        );
        let header_only = CSV.lines().next().unwrap();
        let empty = Bench::parse(header_only.as_bytes(), "t.csv").unwrap();
        assert!(matches!(
            plan(&empty, Metric::Gbps, None),
            Ok(Plan::Skip(_))
        ));
    }
}
