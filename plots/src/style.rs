//! Shared look of the pictures: kernel colors and markers, the side legend, tick-label
//! formats and titles. Only styling knows kernel names; any kernel still gets drawn.

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::data::{
    DECODE_KERNEL, DECODE_PEER_KERNEL, FLASH_PREFILL_PATH_KERNEL, PREFILL_KERNEL,
    PREFILL_PEER_KERNEL,
};
use crate::font::FAMILY;
use crate::render::DrawResult;

/// Title text size, px.
pub const TITLE_PX: u32 = 26;
/// Axis description text size, px.
pub const AXIS_DESC_PX: u32 = 18;
/// Tick label and legend text size, px.
pub const LABEL_PX: u32 = 15;
/// Width of the legend column to the right of the chart, px.
pub const LEGEND_WIDTH_PX: u32 = 340;

/// A qualitative palette (Tableau 10): distinct on screen and in print.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Color of the ceiling and roof lines.
pub const CEILING_COLOR: RGBColor = RGBColor(40, 40, 40);

/// The `i`-th palette color, cycling.
pub fn palette(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// A point marker shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// Filled or hollow circle.
    Circle,
    /// Square.
    Square,
    /// Triangle.
    Triangle,
    /// X-shaped cross.
    Cross,
}

/// How a series is drawn: the same style in the chart and in the legend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeriesStyle {
    /// Line and marker color.
    pub color: RGBColor,
    /// Marker at each measured point, if any.
    pub marker: Option<Marker>,
    /// Whether markers are filled.
    pub filled: bool,
    /// Whether the connecting line is dashed; `None` draws no line.
    pub dashed: Option<bool>,
    /// Line width, px.
    pub width_px: u32,
}

/// The marker that tells kernels apart: ours are round or square, peers triangles.
pub fn kernel_marker(kernel: &str) -> Marker {
    match kernel {
        DECODE_KERNEL => Marker::Circle,
        PREFILL_KERNEL | FLASH_PREFILL_PATH_KERNEL => Marker::Square,
        k if k.contains("peer") || k == PREFILL_PEER_KERNEL || k == DECODE_PEER_KERNEL => {
            Marker::Triangle
        }
        _ => Marker::Cross,
    }
}

/// The style of a (kernel, mode) series with the given color. The `invariant` mode
/// (batch-invariant reductions) is dashed and hollow so it reads apart from `fast`.
pub fn series_style(kernel: &str, mode: &str, color: RGBColor) -> SeriesStyle {
    let invariant = mode == "invariant";
    SeriesStyle {
        color,
        marker: Some(kernel_marker(kernel)),
        filled: !invariant,
        dashed: Some(invariant),
        width_px: 2,
    }
}

/// Colors for a sorted list of kernel names: our two kernels keep fixed colors across
/// pictures, every other kernel takes the next free palette color.
pub fn kernel_colors(kernels: &[String]) -> Vec<RGBColor> {
    let mut next = 2; // palette 0 and 1 belong to decode and prefill_path
    kernels
        .iter()
        .map(|k| match k.as_str() {
            DECODE_KERNEL => palette(0),
            PREFILL_KERNEL | FLASH_PREFILL_PATH_KERNEL => palette(1),
            _ => {
                next += 1;
                palette(next - 1)
            }
        })
        .collect()
}

/// Draws `marker` at `at` in any coordinate system (data or pixel).
pub fn draw_marker<DB, CT>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    marker: Marker,
    color: RGBColor,
    filled: bool,
) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
    CT::From: Clone + 'static,
{
    let style = ShapeStyle {
        color: color.to_rgba(),
        filled,
        stroke_width: 2,
    };
    match marker {
        Marker::Circle => area.draw(&Circle::new(at, 4, style))?,
        Marker::Square => {
            area.draw(&(EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], style)))?
        }
        Marker::Triangle => area.draw(&TriangleMarker::new(at, 5, style))?,
        Marker::Cross => area.draw(&Cross::new(at, 4, style))?,
    }
    Ok(())
}

/// Draws a polyline in data coordinates with the series' line style.
pub fn draw_line<DB, CT>(
    area: &DrawingArea<DB, CT>,
    points: &[CT::From],
    style: &SeriesStyle,
) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
    CT::From: Clone + 'static,
{
    let line = style.color.stroke_width(style.width_px);
    match style.dashed {
        None => {}
        Some(false) => area.draw(&PathElement::new(points.to_vec(), line))?,
        Some(true) => area.draw(&DashedPathElement::new(points.iter().cloned(), 8, 5, line))?,
    }
    Ok(())
}

/// Draws a series: its line, then a marker at every point.
pub fn draw_series<DB, CT>(
    area: &DrawingArea<DB, CT>,
    points: &[CT::From],
    style: &SeriesStyle,
) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
    CT::From: Clone + 'static,
{
    draw_line(area, points, style)?;
    if let Some(marker) = style.marker {
        for p in points {
            draw_marker(area, p.clone(), marker, style.color, style.filled)?;
        }
    }
    Ok(())
}

/// One line of the legend: a style sample (or none, for a note) and its text.
pub struct LegendEntry {
    /// Text.
    pub label: String,
    /// Sample to draw; `None` for a plain note.
    pub style: Option<SeriesStyle>,
}

/// Draws the legend column top-down; entries that do not fit become "... N more".
pub fn draw_legend<DB>(area: &DrawingArea<DB, Shift>, entries: &[LegendEntry]) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    const ROW_PX: i32 = 22;
    const TOP_PX: i32 = 50;
    let text = (FAMILY, LABEL_PX).into_font().color(&BLACK);
    let fit = ((area.dim_in_pixel().1 as i32 - TOP_PX) / ROW_PX).max(1) as usize;
    let shown = if entries.len() > fit {
        fit - 1
    } else {
        entries.len()
    };
    for (i, entry) in entries.iter().take(shown).enumerate() {
        let y = TOP_PX + i as i32 * ROW_PX;
        if let Some(style) = &entry.style {
            draw_line(area, &[(6, y), (36, y)], style)?;
            if let Some(marker) = style.marker {
                draw_marker(area, (21, y), marker, style.color, style.filled)?;
            }
        }
        area.draw(&Text::new(
            entry.label.clone(),
            (44, y),
            text.pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    if shown < entries.len() {
        let y = TOP_PX + shown as i32 * ROW_PX;
        area.draw(&Text::new(
            format!("... {} more", entries.len() - shown),
            (44, y),
            text.pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    Ok(())
}

/// A canvas width, px, that holds `title` at [`TITLE_PX`] with a margin: DejaVu Sans
/// averages under 0.6 of the font size a character.
pub fn title_width_px(title: &str) -> u32 {
    (title.chars().count() as u32 * TITLE_PX * 3).div_ceil(5) + 2 * TITLE_PX
}

/// `base`, or `base — suffix` when `--title` was given.
pub fn title(base: &str, suffix: Option<&str>) -> String {
    match suffix {
        Some(s) if !s.is_empty() => format!("{base} — {s}"),
        _ => base.to_string(),
    }
}

/// A token count the way engineers say it: 512, 4K, 128K, 1M (powers of 1024).
pub fn fmt_tokens(tokens: f64) -> String {
    let t = tokens.round() as u64;
    if t >= 1 << 20 && t.trailing_zeros() >= 20 {
        format!("{}M", t >> 20)
    } else if t >= 1 << 10 && t.trailing_zeros() >= 10 {
        format!("{}K", t >> 10)
    } else {
        t.to_string()
    }
}

/// A value with three significant digits and no trailing zeros (tick labels, notes).
pub fn fmt_sig(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let magnitude = v.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A log-axis tick label: only 1, 2 and 5 times a power of ten are labelled, so the
/// minor ticks plotters places at every multiple do not print on top of each other.
pub fn fmt_log_tick(v: f64) -> String {
    if v <= 0.0 || !v.is_finite() {
        return String::new();
    }
    let mantissa = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 1e-6)
    {
        fmt_sig(v)
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
        assert_eq!(fmt_tokens(512.0), "512");
        assert_eq!(fmt_tokens(4096.0), "4K");
        assert_eq!(fmt_tokens(131072.0), "128K");
        assert_eq!(fmt_tokens(1048576.0), "1M");
        assert_eq!(fmt_tokens(1000.0), "1000");
        assert_eq!(fmt_sig(989.4), "989");
        assert_eq!(fmt_sig(3.35), "3.35");
        assert_eq!(fmt_sig(2.0), "2");
        assert_eq!(fmt_sig(0.0123), "0.0123");
        assert_eq!(fmt_sig(12000.0), "12000");
        assert_eq!(fmt_log_tick(200.0), "200");
        assert_eq!(fmt_log_tick(0.05), "0.05");
        assert_eq!(fmt_log_tick(1000.0), "1000");
        assert_eq!(fmt_log_tick(900.0), "");
        assert_eq!(
            title("Roofline", Some("H100, 2026-05-01")),
            "Roofline — H100, 2026-05-01"
        );
        assert_eq!(title("Roofline", None), "Roofline");
    }

    #[test]
    fn our_kernels_keep_their_colors() {
        let kernels: Vec<String> = ["decode", "foo", "prefill_path", "triton_peer"]
            .map(String::from)
            .into();
        let colors = kernel_colors(&kernels);
        assert_eq!(colors[0], palette(0));
        assert_eq!(colors[2], palette(1));
        assert_eq!(colors[1], palette(2));
        assert_eq!(colors[3], palette(3));
    }
}
