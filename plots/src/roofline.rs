//! Picture `roofline`: every measured point at (arithmetic intensity, TFLOP/s) on log-log
//! axes, colored by kernel, under the roof min(GEMM rate, copy bandwidth × intensity).

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::data::{kernel_label, Bench, COPY_KERNEL, GEMM_KERNEL};
use crate::error::PlotError;
use crate::font::FAMILY;
use crate::render::{DrawResult, Picture};
use crate::style::{self, LegendEntry, SeriesStyle};
use crate::Plan;

/// The roof at `ai_flop_per_byte`, TFLOP/s. GB/s × FLOP/B is GFLOP/s, hence the 1000.
pub fn roof_tflop_per_s(ai_flop_per_byte: f64, gemm_tflop_per_s: f64, copy_gb_per_s: f64) -> f64 {
    gemm_tflop_per_s.min(copy_gb_per_s * ai_flop_per_byte / 1000.0)
}

/// The intensity where the memory roof meets the compute roof, FLOP/byte.
pub fn ridge_flop_per_byte(gemm_tflop_per_s: f64, copy_gb_per_s: f64) -> f64 {
    gemm_tflop_per_s * 1000.0 / copy_gb_per_s
}

/// The measured points of one (kernel, mode).
#[derive(Debug, Clone, PartialEq)]
pub struct RoofSeries {
    /// Kernel name.
    pub kernel: String,
    /// Kernel mode (may be empty).
    pub mode: String,
    /// (FLOP/byte, TFLOP/s) for every row that has both, in file order.
    pub points: Vec<(f64, f64)>,
}

/// Every measurement row with flops, bytes and rate all positive, by (kernel, mode).
pub fn roofline_series(bench: &Bench) -> Vec<RoofSeries> {
    let mut by_kernel: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
    for row in bench.measurements() {
        if let Some(ai) = row.arithmetic_intensity() {
            if row.tflop_per_s > 0.0 {
                by_kernel
                    .entry((row.kernel.clone(), row.mode.clone()))
                    .or_default()
                    .push((ai, row.tflop_per_s));
            }
        }
    }
    by_kernel
        .into_iter()
        .map(|((kernel, mode), points)| RoofSeries {
            kernel,
            mode,
            points,
        })
        .collect()
}

/// The picture, ready to draw.
pub struct RooflinePicture {
    series: Vec<RoofSeries>,
    gemm_tflop_per_s: f64,
    copy_gb_per_s: f64,
    title: String,
}

/// Plans the picture: skipped without points, an error without both ceilings.
pub fn plan(bench: &Bench, title: Option<&str>) -> Result<Plan<RooflinePicture>, PlotError> {
    let series = roofline_series(bench);
    if series.is_empty() {
        return Ok(Plan::Skip(
            "no measurement rows with flops, bytes and tflop_per_s all > 0".to_string(),
        ));
    }
    let ceilings = bench.ceilings();
    let missing = |what, kernel, field| PlotError::MissingCeiling {
        picture: "roofline",
        what,
        path: bench.path.clone(),
        kernel,
        field,
    };
    let gemm = ceilings
        .gemm_tflop_per_s
        .ok_or_else(|| missing("bf16 GEMM ceiling", GEMM_KERNEL, "tflop_per_s"))?;
    let copy = ceilings
        .copy_gb_per_s
        .ok_or_else(|| missing("copy ceiling", COPY_KERNEL, "gb_per_s"))?;
    Ok(Plan::Draw(RooflinePicture {
        series,
        gemm_tflop_per_s: gemm,
        copy_gb_per_s: copy,
        title: style::title("Roofline", title),
    }))
}

impl Picture for RooflinePicture {
    fn name(&self) -> &'static str {
        "roofline"
    }

    fn size_px(&self) -> (u32, u32) {
        (1280, 760)
    }

    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let (gemm, copy) = (self.gemm_tflop_per_s, self.copy_gb_per_s);
        let roof = |ai: f64| roof_tflop_per_s(ai, gemm, copy);
        let ridge = ridge_flop_per_byte(gemm, copy);
        let all = || self.series.iter().flat_map(|s| s.points.iter().copied());
        let ai_min = all().map(|p| p.0).fold(ridge, f64::min);
        let ai_max = all().map(|p| p.0).fold(ridge, f64::max);
        // Factors of 4 keep the ridge and the extreme points clear of the frame.
        let (x_lo, x_hi) = (ai_min / 4.0, ai_max * 4.0);
        let y_min = all().map(|p| p.1).fold(roof(x_lo), f64::min);
        let y_max = all().map(|p| p.1).fold(gemm, f64::max);
        let (y_lo, y_hi) = (y_min / 2.0, y_max * 2.0);

        let root = root.titled(&self.title, (FAMILY, style::TITLE_PX))?;
        let width_px = root.dim_in_pixel().0;
        let (chart_area, legend_area) = root.split_horizontally(width_px - style::LEGEND_WIDTH_PX);
        let mut chart = ChartBuilder::on(&chart_area)
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("arithmetic intensity (FLOP/byte, log scale)")
            .y_desc("compute rate (TFLOP/s, log scale)")
            .x_labels(10)
            .y_labels(10)
            .x_label_formatter(&|v| style::fmt_log_tick(*v))
            .y_label_formatter(&|v| style::fmt_log_tick(*v))
            .label_style((FAMILY, style::LABEL_PX))
            .axis_desc_style((FAMILY, style::AXIS_DESC_PX))
            .draw()?;

        let plot = chart.plotting_area();
        let roof_style = SeriesStyle {
            color: style::CEILING_COLOR,
            marker: None,
            filled: false,
            dashed: Some(false),
            width_px: 3,
        };
        style::draw_line(
            plot,
            &[(x_lo, roof(x_lo)), (ridge, gemm), (x_hi, gemm)],
            &roof_style,
        )?;
        let note = (FAMILY, style::LABEL_PX)
            .into_font()
            .color(&style::CEILING_COLOR);
        plot.draw(
            &(EmptyElement::at((x_hi, gemm))
                + Text::new(
                    format!("bf16 GEMM {} TFLOP/s", style::fmt_sig(gemm)),
                    (-8, -6),
                    note.pos(Pos::new(HPos::Right, VPos::Bottom)),
                )),
        )?;
        plot.draw(
            &(EmptyElement::at((ridge, gemm))
                + Text::new(
                    format!("ridge {} FLOP/B", style::fmt_sig(ridge)),
                    (0, 8),
                    note.pos(Pos::new(HPos::Left, VPos::Top)),
                )),
        )?;
        // Label the memory roof a little right of its start, below the rising line.
        let ai_note = x_lo * 1.5;
        plot.draw(
            &(EmptyElement::at((ai_note, roof(ai_note)))
                + Text::new(
                    format!("copy {} GB/s", style::fmt_sig(copy)),
                    (14, 6),
                    note.pos(Pos::new(HPos::Left, VPos::Top)),
                )),
        )?;

        let mut kernels: Vec<String> = self.series.iter().map(|s| s.kernel.clone()).collect();
        kernels.dedup(); // series are sorted by kernel
        let colors = style::kernel_colors(&kernels);
        let mut legend = vec![LegendEntry {
            label: "roof: min(GEMM, copy × intensity)".to_string(),
            style: Some(roof_style),
        }];
        for series in &self.series {
            let color = colors[kernels
                .iter()
                .position(|k| *k == series.kernel)
                .unwrap_or(0)];
            let s = SeriesStyle {
                dashed: None, // points only: rows of one kernel are not a curve
                ..style::series_style(&series.kernel, &series.mode, color)
            };
            style::draw_series(plot, &series.points, &s)?;
            legend.push(LegendEntry {
                label: format!(
                    "{} ({} point{})",
                    kernel_label(&series.kernel, &series.mode),
                    series.points.len(),
                    if series.points.len() == 1 { "" } else { "s" }
                ),
                style: Some(s),
            });
        }
        style::draw_legend(&legend_area, &legend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roof_is_the_min_of_memory_and_compute() {
        // 3000 GB/s and 900 TFLOP/s meet at 300 FLOP/B.
        assert_eq!(ridge_flop_per_byte(900.0, 3000.0), 300.0);
        assert_eq!(roof_tflop_per_s(100.0, 900.0, 3000.0), 300.0);
        assert_eq!(roof_tflop_per_s(300.0, 900.0, 3000.0), 900.0);
        assert_eq!(roof_tflop_per_s(1000.0, 900.0, 3000.0), 900.0);
    }

    #[test]
    fn every_point_with_intensity_is_kept() {
        let csv = "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm
copy,,0,0,0,0,0,0,0,0,3000,0,0,0
decode,fast,128,4,64,4096,64,10,100,5000,0,1.5,0,0
decode,fast,128,4,64,4096,16,10,100,5000,0,1.4,0,0
triton_peer,,128,4,64,4096,64,10,0,5000,0,1.0,0,0
";
        let bench = Bench::parse(csv.as_bytes(), "t.csv").unwrap();
        let series = roofline_series(&bench);
        // The copy row is a ceiling; the peer row has no byte count.
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].points, vec![(50.0, 1.5), (50.0, 1.4)]);
        let err = plan(&bench, None).err().unwrap().to_string();
        assert!(
            err.contains("no `gemm_bf16` row with tflop_per_s > 0"),
            "{err}"
        );
    }
}
