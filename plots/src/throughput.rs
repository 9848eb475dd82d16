//! Pictures `throughput` (TFLOP/s) and `bandwidth` (GB/s) against context length: a row
//! of panels per head count and a panel per q_len, one series per (kernel, mode, batch)
//! of the decode-like kernels, the GEMM or copy ceiling as a horizontal line. A series'
//! color is its kernel's, its dash its mode's and its width its batch's, and the legend
//! names those parts once each, so a sweep of many kernels, modes and batches never
//! shares a color between kernels (a bench run has at most ten kernels).
//! Picture `prefill`: the prefill attention's TFLOP/s against keys per row, one panel for
//! causal rows (queries = keys) and one per q_len of the non-causal ones; a line per
//! (kernel, variant, heads, batch), colored by kernel and variant, dashed for the smaller
//! head counts, hollow for batches above 1.

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::data::{
    is_prefill, Bench, Row, COPY_KERNEL, FLASH_PREFILL_KERNEL, GEMM_KERNEL, PREFILL_PEER_KERNEL,
};
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
    /// The prefill attention's `tflop_per_s` against the bf16 GEMM ceiling.
    Prefill,
}

impl Metric {
    fn value(self, row: &Row) -> f64 {
        match self {
            Metric::Tflops | Metric::Prefill => row.tflop_per_s,
            Metric::Gbps => row.gb_per_s,
        }
    }

    /// The picture's file stem.
    pub fn picture_name(self) -> &'static str {
        match self {
            Metric::Tflops => "throughput",
            Metric::Gbps => "bandwidth",
            Metric::Prefill => "prefill",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Metric::Tflops | Metric::Prefill => "TFLOP/s",
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
    /// The legend's label: everything but q_len, which names the panel.
    fn label(&self) -> String {
        format!(
            "{} h={} b={}",
            crate::data::kernel_label(&self.kernel, &self.mode),
            self.heads,
            self.batch
        )
    }

    /// What decides the color: the key without q_len.
    fn style_key(&self) -> (&str, &str, u32, u32) {
        (&self.kernel, &self.mode, self.heads, self.batch)
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

/// Decode-like kernels are measured against context; the prefill paths and the prefill
/// attention are a different kind of work with pictures of their own.
pub fn is_decode_like(row: &Row) -> bool {
    !row.is_ceiling() && !is_prefill(&row.kernel)
}

/// Whether `row` belongs to `metric`'s picture, and the panel it goes in: its q_len, or
/// 0 for a causal prefill row (whose queries are its keys).
fn panel_of(metric: Metric, row: &Row) -> Option<u32> {
    match metric {
        Metric::Prefill
            if [FLASH_PREFILL_KERNEL, PREFILL_PEER_KERNEL].contains(&row.kernel.as_str()) =>
        {
            Some(if row.mode.starts_with("causal") {
                0
            } else {
                row.q_len
            })
        }
        Metric::Prefill => None,
        _ => is_decode_like(row).then_some(row.q_len),
    }
}

/// A prefill row's variant: its mode without the causal / non-causal part, which the
/// panel shows (`causal/tma` and `noncausal/tma` are one line style, `tma`).
fn prefill_variant(mode: &str) -> &str {
    let rest = mode
        .strip_prefix("noncausal")
        .or_else(|| mode.strip_prefix("causal"))
        .unwrap_or(mode);
    rest.strip_prefix('/').unwrap_or(rest)
}

/// The prefill picture's styles for `keys`: a color per (kernel, variant), dashed below
/// the largest head count, hollow markers for batches above 1.
fn prefill_styles(keys: &[&SeriesKey]) -> Vec<SeriesStyle> {
    let mut kinds: Vec<(&str, &str)> = keys.iter().map(|k| (&*k.kernel, &*k.mode)).collect();
    kinds.dedup();
    let max_heads = keys.iter().map(|k| k.heads).max().unwrap_or(0);
    keys.iter()
        .map(|k| {
            let kind = kinds.iter().position(|&c| c == (&*k.kernel, &*k.mode));
            let color = style::palette(kind.expect("every key has its kind"));
            SeriesStyle {
                filled: k.batch <= 1,
                dashed: Some(k.heads < max_heads),
                ..style::series_style(&k.kernel, &k.mode, color)
            }
        })
        .collect()
}

/// The series of decode-like rows with a positive context and rate. Where several rows
/// share a series and context (page sizes, repeats), the best rate is kept.
pub fn context_series(bench: &Bench, metric: Metric) -> Vec<ContextSeries> {
    let mut series: BTreeMap<SeriesKey, BTreeMap<u64, f64>> = BTreeMap::new();
    for row in &bench.rows {
        let (Some(panel), value) = (panel_of(metric, row), metric.value(row)) else {
            continue;
        };
        if row.context == 0 || value <= 0.0 {
            continue;
        }
        let key = SeriesKey {
            kernel: row.kernel.clone(),
            mode: match metric {
                Metric::Prefill => prefill_variant(&row.mode).to_string(),
                _ => row.mode.clone(),
            },
            q_len: panel,
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

/// The q_len of each panel, ascending, and one style slot per distinct series key
/// without q_len (so a line keeps its color from panel to panel).
pub fn panels(series: &[ContextSeries]) -> (Vec<u32>, Vec<&SeriesKey>) {
    let mut q_lens: Vec<u32> = series.iter().map(|s| s.key.q_len).collect();
    q_lens.sort_unstable();
    q_lens.dedup();
    let mut keys: Vec<&SeriesKey> = Vec::new();
    for s in series {
        if !keys.iter().any(|k| k.style_key() == s.key.style_key()) {
            keys.push(&s.key);
        }
    }
    keys.sort_by(|a, b| a.style_key().cmp(&b.style_key()));
    (q_lens, keys)
}

/// Width of one q_len panel.
const PANEL_WIDTH_PX: u32 = 470;
/// Height of one row of panels (one head count).
const PANEL_HEIGHT_PX: u32 = 560;

/// The decode pictures' parts: head counts (rows of panels), kernels (colors), modes
/// (dash) and batches (line widths), each ascending.
#[derive(Debug, Clone, PartialEq)]
pub struct Facets {
    pub heads: Vec<u32>,
    pub kernels: Vec<String>,
    pub modes: Vec<String>,
    pub batches: Vec<u32>,
}

impl Facets {
    /// The parts `series` use.
    pub fn of(series: &[ContextSeries]) -> Self {
        fn sorted<T: Ord + Clone>(v: impl Iterator<Item = T>) -> Vec<T> {
            let mut v: Vec<T> = v.collect();
            v.sort();
            v.dedup();
            v
        }
        Self {
            heads: sorted(series.iter().map(|s| s.key.heads)),
            kernels: sorted(series.iter().map(|s| s.key.kernel.clone())),
            modes: sorted(series.iter().map(|s| s.key.mode.clone())),
            batches: sorted(series.iter().map(|s| s.key.batch)),
        }
    }

    /// A series' style: its kernel's color and marker, its mode's dash and fill, its
    /// batch's line width (1 px for the smallest batch, one more per larger one, at most
    /// 4).
    pub fn style(&self, key: &SeriesKey) -> SeriesStyle {
        let colors = style::kernel_colors(&self.kernels);
        let k = self
            .kernels
            .iter()
            .position(|k| *k == key.kernel)
            .unwrap_or(0);
        let b = self
            .batches
            .iter()
            .position(|&b| b == key.batch)
            .unwrap_or(0);
        SeriesStyle {
            width_px: 1 + b.min(3) as u32,
            ..style::series_style(&key.kernel, &key.mode, colors[k])
        }
    }

    /// The legend: the ceiling, then each kernel (its color), each mode (its dash) and
    /// each batch (its width) once.
    fn legend(&self, ceiling: &str) -> Vec<LegendEntry> {
        let gray = style::CEILING_COLOR;
        let colors = style::kernel_colors(&self.kernels);
        let mut out = vec![LegendEntry {
            label: ceiling.to_string(),
            style: Some(CEILING_STYLE),
        }];
        for (k, c) in self.kernels.iter().zip(colors) {
            out.push(LegendEntry {
                label: crate::data::kernel_label(k, ""),
                style: Some(SeriesStyle {
                    width_px: 2,
                    ..style::series_style(k, "", c)
                }),
            });
        }
        for m in self.modes.iter().filter(|m| !m.is_empty()) {
            out.push(LegendEntry {
                label: format!("mode {m}"),
                style: Some(SeriesStyle {
                    marker: None,
                    width_px: 2,
                    ..style::series_style("", m, gray)
                }),
            });
        }
        for (i, b) in self.batches.iter().enumerate() {
            out.push(LegendEntry {
                label: format!("batch {b}"),
                style: Some(SeriesStyle {
                    color: gray,
                    marker: None,
                    filled: true,
                    dashed: Some(false),
                    width_px: 1 + i.min(3) as u32,
                }),
            });
        }
        out
    }
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
        return Ok(Plan::Skip(match metric {
            Metric::Tflops => "no decode-like rows with context > 0 and tflop_per_s > 0".into(),
            Metric::Gbps => "no decode-like rows with context > 0 and gb_per_s > 0".into(),
            Metric::Prefill => format!("no `{FLASH_PREFILL_KERNEL}` rows with tflop_per_s > 0"),
        }));
    }
    let ceilings = bench.ceilings();
    let (ceiling, missing) = match metric {
        Metric::Tflops | Metric::Prefill => (
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
        Metric::Prefill => "MLA prefill attention throughput vs keys",
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
        let panels = panels(&self.series).0.len() as u32;
        let rows = match self.metric {
            Metric::Prefill => 1,
            _ => Facets::of(&self.series).heads.len() as u32,
        };
        let height = (rows * PANEL_HEIGHT_PX + 160).max(720);
        (
            panels * PANEL_WIDTH_PX + style::LEGEND_WIDTH_PX + 20,
            height,
        )
    }

    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let root = root.titled(&self.title, (FAMILY, style::TITLE_PX))?;
        let width_px = root.dim_in_pixel().0;
        let (charts, legend_area) = root.split_horizontally(width_px - style::LEGEND_WIDTH_PX);
        let (q_lens, keys) = panels(&self.series);
        if self.metric != Metric::Prefill {
            return self.draw_decode(&charts, &legend_area, &q_lens);
        }
        let styles: Vec<SeriesStyle> = prefill_styles(&keys);
        let style_of = |key: &SeriesKey| {
            let i = keys.iter().position(|k| k.style_key() == key.style_key());
            styles[i.expect("every series has a style slot")]
        };
        let areas = charts.split_evenly((1, q_lens.len()));
        for (area, &q_len) in areas.iter().zip(&q_lens) {
            let series: Vec<&ContextSeries> = self
                .series
                .iter()
                .filter(|s| s.key.q_len == q_len)
                .collect();
            self.draw_panel(area, (q_len, None), &series, &style_of)?;
        }
        let mut legend = vec![LegendEntry {
            label: self.ceiling_name().to_string(),
            style: Some(CEILING_STYLE),
        }];
        for (key, s) in keys.iter().zip(&styles) {
            legend.push(LegendEntry {
                label: key.label(),
                style: Some(*s),
            });
        }
        style::draw_legend(&legend_area, &legend)
    }
}

const CEILING_STYLE: SeriesStyle = SeriesStyle {
    color: style::CEILING_COLOR,
    marker: None,
    filled: false,
    dashed: Some(false),
    width_px: 3,
};

impl ContextPicture {
    /// The decode pictures: a row of q_len panels per head count, styled by [`Facets`].
    fn draw_decode<DB>(
        &self,
        charts: &DrawingArea<DB, Shift>,
        legend_area: &DrawingArea<DB, Shift>,
        q_lens: &[u32],
    ) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let facets = Facets::of(&self.series);
        let style_of = |key: &SeriesKey| facets.style(key);
        let areas = charts.split_evenly((facets.heads.len(), q_lens.len()));
        let cells = facets
            .heads
            .iter()
            .flat_map(|&h| q_lens.iter().map(move |&q| (h, q)));
        for (area, (heads, q_len)) in areas.iter().zip(cells) {
            let series: Vec<&ContextSeries> = self
                .series
                .iter()
                .filter(|s| s.key.q_len == q_len && s.key.heads == heads)
                .collect();
            self.draw_panel(area, (q_len, Some(heads)), &series, &style_of)?;
        }
        style::draw_legend(legend_area, &facets.legend(self.ceiling_name()))
    }

    fn ceiling_name(&self) -> &'static str {
        match self.metric {
            Metric::Tflops | Metric::Prefill => "bf16 GEMM ceiling",
            Metric::Gbps => "copy ceiling",
        }
    }

    /// One q_len's chart (of one head count in the decode pictures): every panel shares
    /// the context and rate ranges.
    fn draw_panel<DB>(
        &self,
        area: &DrawingArea<DB, Shift>,
        (q_len, heads): (u32, Option<u32>),
        series: &[&ContextSeries],
        style_of: &dyn Fn(&SeriesKey) -> SeriesStyle,
    ) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
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
        let mut chart = ChartBuilder::on(area)
            .caption(
                match (self.metric, q_len, heads) {
                    (Metric::Prefill, 0, _) => "causal (queries = keys)".to_string(),
                    (Metric::Prefill, q, _) => format!("non-causal, {q} queries"),
                    (_, q, Some(h)) => format!("{h} heads, q_len {q}"),
                    (_, q, None) => format!("q_len {q}"),
                },
                (FAMILY, style::AXIS_DESC_PX),
            )
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d((x_lo..x_hi).log_scale().base(2.0), 0.0..y_hi)?;
        chart
            .configure_mesh()
            .x_desc(if self.metric == Metric::Prefill {
                "keys per row (log2 scale)"
            } else {
                "context (KV tokens per request, log2 scale)"
            })
            .y_desc(match self.metric {
                Metric::Prefill => format!("throughput ({unit})"),
                _ => format!("{} ({unit})", self.metric.picture_name()),
            })
            // Asking for at least one label per doubling keeps plotters at powers of two.
            .x_labels(doublings + 1)
            .x_label_formatter(&|v| style::fmt_tokens(*v))
            .y_label_formatter(&|v| style::fmt_sig(*v))
            .label_style((FAMILY, style::LABEL_PX))
            .axis_desc_style((FAMILY, style::AXIS_DESC_PX))
            .draw()?;

        let plot = chart.plotting_area();
        let ceiling_label = match self.metric {
            Metric::Tflops | Metric::Prefill => {
                format!("bf16 GEMM {} TFLOP/s", style::fmt_sig(self.ceiling))
            }
            Metric::Gbps => format!("copy {} GB/s (read + write)", style::fmt_sig(self.ceiling)),
        };
        style::draw_line(
            plot,
            &[(x_lo, self.ceiling), (x_hi, self.ceiling)],
            &CEILING_STYLE,
        )?;
        plot.draw(
            &(EmptyElement::at((x_hi, self.ceiling))
                + Text::new(
                    ceiling_label,
                    (-8, -6),
                    (FAMILY, style::LABEL_PX)
                        .into_font()
                        .color(&style::CEILING_COLOR)
                        .pos(Pos::new(HPos::Right, VPos::Bottom)),
                )),
        )?;
        for s in series {
            style::draw_series(plot, &s.points, &style_of(&s.key))?;
        }
        Ok(())
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
    fn one_panel_per_q_len_and_one_color_per_line_across_them() {
        let csv = format!("{CSV}decode,fast,128,1,64,4096,64,10,1,1,1000,100,0,0\n");
        let bench = Bench::parse(csv.as_bytes(), "t.csv").unwrap();
        let series = context_series(&bench, Metric::Tflops);
        assert_eq!(series.len(), 3);
        let (q_lens, keys) = panels(&series);
        assert_eq!(q_lens, vec![1, 4]);
        // decode/fast at q 1 and q 4 share one slot; decode/invariant has its own.
        let labels: Vec<String> = keys.iter().map(|k| k.label()).collect();
        assert_eq!(
            labels,
            vec!["decode/fast h=128 b=64", "decode/invariant h=128 b=64"]
        );
    }

    /// The decode peer draws like the prefill one: its own series beside ours in every
    /// decode picture, a triangle, a color of its own.
    #[test]
    fn flashmla_rows_are_a_decode_peer_series() {
        use crate::data::DECODE_PEER_KERNEL;
        let csv = format!("{CSV}flashmla,splitkv,128,4,64,4096,64,8,1,1,1200,120,0,0\n");
        let bench = Bench::parse(csv.as_bytes(), "t.csv").unwrap();
        let series = context_series(&bench, Metric::Tflops);
        let peer: Vec<&ContextSeries> = series
            .iter()
            .filter(|s| s.key.kernel == DECODE_PEER_KERNEL)
            .collect();
        assert_eq!(peer.len(), 1);
        assert_eq!(peer[0].points, vec![(4096.0, 120.0)]);
        let facets = Facets::of(&series);
        let ours = facets.style(&series[0].key);
        let theirs = facets.style(&peer[0].key);
        assert_eq!(theirs.marker, Some(style::Marker::Triangle));
        assert_ne!(theirs.color, ours.color);
    }

    /// Postmortem (issue 22, item 7): a sweep's 27 series shared 10 colors, so two
    /// kernels could look the same. Colors now follow kernels only; modes, heads and
    /// batches are told apart by dash, panel row and width, each named once.
    #[test]
    fn a_big_sweep_gives_each_kernel_its_own_color_and_a_short_legend() {
        let mut csv = String::from(
            "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm\ngemm_bf16,,0,0,0,0,0,0,0,0,0,700,0,0\n",
        );
        let kernels = ["decode", "decode_wgmma", "decode_mma"];
        for k in kernels {
            for m in ["fast", "invariant"] {
                for h in [16, 128] {
                    for b in [32, 64, 128] {
                        csv += &format!("{k},{m},{h},4,{b},4096,64,1,1,1,1,100,0,0\n");
                    }
                }
            }
        }
        let bench = Bench::parse(csv.as_bytes(), "t.csv").unwrap();
        let series = context_series(&bench, Metric::Tflops);
        assert_eq!(series.len(), 36);
        let f = Facets::of(&series);
        assert_eq!(f.heads, vec![16, 128]);
        assert_eq!(f.batches, vec![32, 64, 128]);
        let colors: Vec<RGBColor> = kernels
            .iter()
            .map(|k| {
                series
                    .iter()
                    .find(|s| s.key.kernel == *k)
                    .map(|s| f.style(&s.key).color)
                    .unwrap()
            })
            .collect();
        assert!(colors[0] != colors[1] && colors[1] != colors[2] && colors[0] != colors[2]);
        // One color per kernel whatever the mode, heads or batch.
        for s in &series {
            let k = kernels.iter().position(|k| *k == s.key.kernel).unwrap();
            assert_eq!(f.style(&s.key).color, colors[k]);
        }
        let widths: Vec<u32> = [32, 64, 128]
            .iter()
            .map(|&b| {
                f.style(&SeriesKey {
                    batch: b,
                    ..series[0].key.clone()
                })
                .width_px
            })
            .collect();
        assert_eq!(widths, vec![1, 2, 3]);
        // Ceiling, 3 kernels, 2 modes, 3 batches.
        let legend = f.legend("bf16 GEMM ceiling");
        assert_eq!(legend.len(), 1 + 3 + 2 + 3);
        assert_eq!(legend[4].label, "mode fast");
        assert_eq!(legend[6].label, "batch 32");
    }

    #[test]
    fn prefill_lines_join_causal_and_noncausal_variants_and_style_by_kind() {
        let csv = "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm
prefill_flash,causal/tma,128,4096,1,4096,0,1,1,1,1,600,0,0
prefill_flash,causal/tma,16,4096,1,4096,0,1,1,1,1,500,0,0
prefill_flash,causal/tma,128,2048,4,2048,0,1,1,1,1,550,0,0
prefill_flash,noncausal/tma,128,64,1,2048,0,1,1,1,1,170,0,0
prefill_flash,causal,128,4096,1,4096,0,1,1,1,1,200,0,0
prefill_sdpa_cudnn,causal,128,4096,1,4096,0,1,1,1,1,560,0,0
";
        let bench = Bench::parse(csv.as_bytes(), "t.csv").unwrap();
        let series = context_series(&bench, Metric::Prefill);
        let (q_lens, keys) = panels(&series);
        assert_eq!(q_lens, vec![0, 64]);
        let labels: Vec<String> = keys.iter().map(|k| k.label()).collect();
        // The non-causal tma row shares the causal one's line style (one legend entry).
        assert_eq!(
            labels,
            vec![
                "prefill_flash h=128 b=1",
                "prefill_flash/tma h=16 b=1",
                "prefill_flash/tma h=128 b=1",
                "prefill_flash/tma h=128 b=4",
                "prefill_sdpa_cudnn h=128 b=1",
            ]
        );
        let st = prefill_styles(&keys);
        // One color per (kernel, variant): three kinds.
        assert_ne!(st[0].color, st[1].color);
        assert_eq!(st[1].color, st[2].color);
        assert_eq!(st[2].color, st[3].color);
        assert_ne!(st[3].color, st[4].color);
        // 16 heads dashed, batch 4 hollow.
        assert_eq!(
            st.iter().map(|s| s.dashed).collect::<Vec<_>>(),
            vec![
                Some(false),
                Some(true),
                Some(false),
                Some(false),
                Some(false)
            ]
        );
        assert_eq!(
            st.iter().map(|s| s.filled).collect::<Vec<_>>(),
            vec![true, true, true, false, true]
        );
        assert_eq!(prefill_variant("noncausal/wide"), "wide");
        assert_eq!(prefill_variant("causal"), "");
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
        // A CSV with only ceiling rows has no kernel rows for this picture: a skip.
        let ceilings_only: String = CSV
            .lines()
            .filter(|l| !l.starts_with("decode"))
            .map(|l| format!("{l}\n"))
            .collect();
        let no_kernels = Bench::parse(ceilings_only.as_bytes(), "t.csv").unwrap();
        assert!(matches!(
            plan(&no_kernels, Metric::Tflops, None),
            Ok(Plan::Skip(_))
        ));
    }
}
