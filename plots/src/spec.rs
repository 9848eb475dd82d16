//! Picture `spec_decode_vs_prefill`: on spec-step shapes (a (heads, batch, context) with
//! `decode` rows and prefill-path rows), kernel time against q_len for the decode kernel
//! and the prefill path, each decode point annotated with its speedup. The bf16 prefill
//! path (`prefill_flash_path`) is drawn where a shape has it, else the f32 one
//! (`prefill_path`): the honest peer first.

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::data::{kernel_label, Bench, DECODE_KERNEL, FLASH_PREFILL_PATH_KERNEL, PREFILL_KERNEL};
use crate::error::PlotError;
use crate::font::FAMILY;
use crate::render::{DrawResult, Picture};
use crate::style::{self, LegendEntry};
use crate::Plan;

/// A spec-step shape: everything but q_len.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpecShape {
    /// Query heads.
    pub heads: u32,
    /// Requests in the batch.
    pub batch: u32,
    /// KV tokens per request.
    pub context: u64,
}

/// Times for one shape, by q_len; the fastest row where several share a key.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecPanel {
    /// The shape.
    pub shape: SpecShape,
    /// The prefill path drawn: `prefill_flash_path` where measured, else `prefill_path`.
    pub prefill_kernel: &'static str,
    /// Its time by q_len.
    pub prefill_us: BTreeMap<u32, f64>,
    /// `decode` time by mode, then q_len.
    pub decode_us: BTreeMap<String, BTreeMap<u32, f64>>,
}

impl SpecPanel {
    /// (q_len, prefill time / decode time) where both were measured.
    pub fn speedups(&self, mode: &str) -> Vec<(u32, f64)> {
        let Some(decode) = self.decode_us.get(mode) else {
            return Vec::new();
        };
        decode
            .iter()
            .filter_map(|(q, d)| self.prefill_us.get(q).map(|p| (*q, p / d)))
            .collect()
    }
}

/// Every shape with both kernels measured (time_us > 0), in shape order.
pub fn spec_panels(bench: &Bench) -> Vec<SpecPanel> {
    let mut panels: BTreeMap<SpecShape, SpecPanel> = BTreeMap::new();
    // The f32 path's times, used where a shape has no bf16 path.
    let mut f32_path: BTreeMap<SpecShape, BTreeMap<u32, f64>> = BTreeMap::new();
    for row in bench.measurements() {
        let kernel = row.kernel.as_str();
        if row.time_us <= 0.0
            || ![DECODE_KERNEL, PREFILL_KERNEL, FLASH_PREFILL_PATH_KERNEL].contains(&kernel)
        {
            continue;
        }
        let shape = SpecShape {
            heads: row.heads,
            batch: row.batch,
            context: row.context,
        };
        let panel = panels.entry(shape).or_insert_with(|| SpecPanel {
            shape,
            prefill_kernel: FLASH_PREFILL_PATH_KERNEL,
            prefill_us: BTreeMap::new(),
            decode_us: BTreeMap::new(),
        });
        let times = match kernel {
            PREFILL_KERNEL => f32_path.entry(shape).or_default(),
            FLASH_PREFILL_PATH_KERNEL => &mut panel.prefill_us,
            _ => panel.decode_us.entry(row.mode.clone()).or_default(),
        };
        let best = times.entry(row.q_len).or_insert(row.time_us);
        *best = best.min(row.time_us);
    }
    for (shape, times) in f32_path {
        if let Some(p) = panels.get_mut(&shape).filter(|p| p.prefill_us.is_empty()) {
            p.prefill_kernel = PREFILL_KERNEL;
            p.prefill_us = times;
        }
    }
    panels
        .into_values()
        .filter(|p| !p.prefill_us.is_empty() && !p.decode_us.is_empty())
        .collect()
}

/// The picture, ready to draw.
pub struct SpecPicture {
    panels: Vec<SpecPanel>,
    title: String,
}

/// Panels per row of the grid.
const COLUMNS: usize = 3;
/// One panel's size, px.
const PANEL_PX: (u32, u32) = (480, 400);
/// The narrowest canvas, px, so the title fits when there is a single panel.
const MIN_WIDTH_PX: u32 = 1100;

/// Plans the picture: skipped when no shape has both kernels. Needs no ceiling.
pub fn plan(bench: &Bench, title: Option<&str>) -> Result<Plan<SpecPicture>, PlotError> {
    let panels = spec_panels(bench);
    if panels.is_empty() {
        return Ok(Plan::Skip(format!(
            "no (heads, batch, context) has both `{DECODE_KERNEL}` and `{FLASH_PREFILL_PATH_KERNEL}` \
             or `{PREFILL_KERNEL}` rows"
        )));
    }
    Ok(Plan::Draw(SpecPicture {
        panels,
        title: style::title("Spec step: decode kernel vs prefill path", title),
    }))
}

impl SpecPicture {
    fn grid(&self) -> (usize, usize) {
        let cols = self.panels.len().min(COLUMNS);
        (self.panels.len().div_ceil(cols), cols)
    }
}

impl Picture for SpecPicture {
    fn name(&self) -> &'static str {
        "spec_decode_vs_prefill"
    }

    fn size_px(&self) -> (u32, u32) {
        let (rows, cols) = self.grid();
        (
            (PANEL_PX.0 * cols as u32 + style::LEGEND_WIDTH_PX)
                .max(MIN_WIDTH_PX)
                .max(style::title_width_px(&self.title)),
            60 + PANEL_PX.1 * rows as u32,
        )
    }

    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let root = root.titled(&self.title, (FAMILY, style::TITLE_PX))?;
        let width_px = root.dim_in_pixel().0;
        let (grid_area, legend_area) = root.split_horizontally(width_px - style::LEGEND_WIDTH_PX);
        let decode_color = style::palette(0);
        let prefill_style = |k: &str| style::series_style(k, "", style::palette(1));
        let mut modes: Vec<&String> = self
            .panels
            .iter()
            .flat_map(|p| p.decode_us.keys())
            .collect();
        modes.sort();
        modes.dedup();

        for (panel, area) in self.panels.iter().zip(grid_area.split_evenly(self.grid())) {
            let q_lens = panel
                .prefill_us
                .keys()
                .chain(panel.decode_us.values().flat_map(|t| t.keys()));
            let (q_min, q_max) = q_lens.fold((u32::MAX, 0), |(lo, hi), q| (lo.min(*q), hi.max(*q)));
            let (x_lo, x_hi) = (q_min as i32 - 1, q_max as i32 + 1);
            let times = || {
                panel
                    .prefill_us
                    .values()
                    .chain(panel.decode_us.values().flat_map(|t| t.values()))
            };
            let t_max = times().fold(0f64, |m, t| m.max(*t));
            let t_min = times().fold(f64::INFINITY, |m, t| m.min(*t));
            let shape = panel.shape;
            let mut chart = ChartBuilder::on(&area)
                .caption(
                    format!(
                        "heads {}, batch {}, context {}",
                        shape.heads,
                        shape.batch,
                        style::fmt_tokens(shape.context as f64)
                    ),
                    (FAMILY, style::AXIS_DESC_PX),
                )
                .margin(10)
                .x_label_area_size(45)
                .y_label_area_size(70)
                // A log axis: the decode times sit 1-2 decades below the prefill path's,
                // and a linear one squashed them to zero. Headroom for the speedup labels.
                .build_cartesian_2d(x_lo..x_hi, (t_min / 2.0..t_max * 2.5).log_scale())?;
            chart
                .configure_mesh()
                .x_desc("q_len (query tokens per request)")
                .y_desc("kernel time (µs)")
                .x_labels((x_hi - x_lo + 1) as usize)
                .y_label_formatter(&|v| style::fmt_sig(*v))
                .label_style((FAMILY, style::LABEL_PX))
                .axis_desc_style((FAMILY, style::LABEL_PX + 1))
                .draw()?;
            let plot = chart.plotting_area();
            let points = |times: &BTreeMap<u32, f64>| -> Vec<(i32, f64)> {
                times.iter().map(|(q, t)| (*q as i32, *t)).collect()
            };
            let path_style = prefill_style(panel.prefill_kernel);
            style::draw_series(plot, &points(&panel.prefill_us), &path_style)?;
            for (mode, times) in &panel.decode_us {
                let s = style::series_style(DECODE_KERNEL, mode, decode_color);
                style::draw_series(plot, &points(times), &s)?;
            }
            for (mode, times) in &panel.decode_us {
                for (q, speedup) in panel.speedups(mode) {
                    let t = times[&q];
                    // Where modes share a q_len, the slowest is labelled above its point,
                    // the fastest below and any other to the right, so labels do not
                    // collide with each other or with the neighbouring line.
                    let others = panel.decode_us.values().filter_map(|m| m.get(&q));
                    let (slower, faster) = others.fold((0, 0), |(s, f), o| {
                        (s + usize::from(*o > t), f + usize::from(*o < t))
                    });
                    let (offset, pos) = match (slower, faster) {
                        (0, _) => ((0, -8), Pos::new(HPos::Center, VPos::Bottom)),
                        (_, 0) => ((0, 8), Pos::new(HPos::Center, VPos::Top)),
                        _ => ((10, 0), Pos::new(HPos::Left, VPos::Center)),
                    };
                    plot.draw(
                        &(EmptyElement::at((q as i32, t))
                            + Text::new(
                                format!("{speedup:.1}×"),
                                offset,
                                (FAMILY, style::LABEL_PX)
                                    .into_font()
                                    .color(&decode_color)
                                    .pos(pos),
                            )),
                    )?;
                }
            }
        }

        let mut paths: Vec<&str> = self.panels.iter().map(|p| p.prefill_kernel).collect();
        paths.sort_unstable();
        paths.dedup();
        let mut legend: Vec<LegendEntry> = paths
            .iter()
            .map(|k| LegendEntry {
                label: prefill_label(k).to_string(),
                style: Some(prefill_style(k)),
            })
            .collect();
        for mode in modes {
            legend.push(LegendEntry {
                label: kernel_label(DECODE_KERNEL, mode),
                style: Some(style::series_style(DECODE_KERNEL, mode, decode_color)),
            });
        }
        legend.push(LegendEntry {
            label: "n× = prefill path time / decode time".to_string(),
            style: None,
        });
        style::draw_legend(&legend_area, &legend)
    }
}

/// What a prefill path is, in the legend: the f32 path is the correctness baseline, not
/// a fast kernel, and says so.
fn prefill_label(kernel: &str) -> &'static str {
    match kernel {
        PREFILL_KERNEL => "f32 prefill path (correctness baseline)",
        FLASH_PREFILL_PATH_KERNEL => "bf16 prefill path (flash_prefill)",
        _ => "prefill path",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_title_widens_the_canvas() {
        let csv = "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm
decode,invariant,128,4,16,2048,64,10,0,0,0,0,0,0
prefill_path,invariant,128,4,16,2048,64,40,0,0,0,0,0,0
";
        let bench = Bench::parse(csv.as_bytes(), "t.csv").unwrap();
        let width = |title| match plan(&bench, title).unwrap() {
            Plan::Draw(p) => p.size_px().0,
            Plan::Skip(why) => panic!("{why}"),
        };
        assert_eq!(width(None), MIN_WIDTH_PX);
        let long = "H100 SXM, seesaw kernel, commit b95cf92, 2026-11-23";
        let title = style::title("Spec step: decode kernel vs prefill path", Some(long));
        assert!(width(Some(long)) >= style::title_width_px(&title));
        assert!(width(Some(long)) > MIN_WIDTH_PX);
    }

    #[test]
    fn pairs_shapes_that_have_both_kernels() {
        let csv = "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm
decode,fast,128,4,64,4096,64,10,0,0,0,0,0,0
decode,fast,128,4,64,4096,16,8,0,0,0,0,0,0
decode,invariant,128,4,64,4096,64,12,0,0,0,0,0,0
decode,fast,128,2,64,4096,64,6,0,0,0,0,0,0
prefill_path,,128,4,64,4096,64,40,0,0,0,0,0,0
decode,fast,128,4,64,8192,64,20,0,0,0,0,0,0
prefill_path,,16,4,64,4096,64,40,0,0,0,0,0,0
";
        let bench = Bench::parse(csv.as_bytes(), "t.csv").unwrap();
        let panels = spec_panels(&bench);
        // Only (128, 64, 4096) has both kernels.
        assert_eq!(panels.len(), 1);
        let p = &panels[0];
        assert_eq!(
            p.shape,
            SpecShape {
                heads: 128,
                batch: 64,
                context: 4096
            }
        );
        assert_eq!(p.decode_us["fast"], BTreeMap::from([(2, 6.0), (4, 8.0)]));
        // q_len 2 has no prefill time, so only q_len 4 gets a speedup: 40 / 8.
        assert_eq!(p.speedups("fast"), vec![(4, 5.0)]);
        assert_eq!(p.speedups("invariant"), vec![(4, 40.0 / 12.0)]);
        assert!(p.speedups("other").is_empty());
    }
}
