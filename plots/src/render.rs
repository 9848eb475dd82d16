//! Drawing one picture into both a PNG and an SVG file: pictures are written once,
//! generic over the plotters backend, and this module runs them on each.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::PlotError;

/// What drawing code returns: plotters' errors are generic over the backend, so they are
/// boxed here and turned into [`PlotError::Draw`] with the file name by [`write_png_and_svg`].
pub type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// A picture that can draw itself on any backend.
pub trait Picture {
    /// File stem: `NAME.png` and `NAME.svg`.
    fn name(&self) -> &'static str;
    /// Canvas size, px.
    fn size_px(&self) -> (u32, u32);
    /// Draws onto a white canvas of [`Picture::size_px`].
    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static;
}

/// Writes `OUT/NAME.png` and `OUT/NAME.svg`; returns both paths.
pub fn write_png_and_svg(
    picture: &impl Picture,
    out_dir: &Path,
) -> Result<Vec<PathBuf>, PlotError> {
    let size = picture.size_px();
    let png = out_dir.join(format!("{}.png", picture.name()));
    draw_on(picture, BitMapBackend::new(&png, size).into_drawing_area())
        .map_err(|e| draw_error(&png, e))?;
    let svg = out_dir.join(format!("{}.svg", picture.name()));
    draw_on(picture, SVGBackend::new(&svg, size).into_drawing_area())
        .map_err(|e| draw_error(&svg, e))?;
    Ok(vec![png, svg])
}

fn draw_on<DB>(picture: &impl Picture, root: DrawingArea<DB, Shift>) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    picture.draw(&root)?;
    // present() writes the file; without it errors would be lost in Drop.
    root.present()?;
    Ok(())
}

fn draw_error(path: &Path, e: Box<dyn std::error::Error>) -> PlotError {
    PlotError::Draw {
        path: path.to_path_buf(),
        message: e.to_string().replace('\n', " "),
    }
}
