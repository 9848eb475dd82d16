//! The embedded font. plotters is built without system-font support (no font-kit, no
//! fontconfig), so every picture's text goes through ab_glyph and the DejaVu Sans bytes
//! compiled into the binary: pictures render the same on a machine with no fonts at all.

use std::sync::OnceLock;

use plotters::style::FontStyle;

use crate::error::PlotError;

/// The family name every picture asks for; [`register`] maps it to DejaVu Sans.
pub const FAMILY: &str = "sans-serif";

/// DejaVu Sans (see `assets/README.md` for its license).
static DEJAVU_SANS: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Registers the embedded font under [`FAMILY`] (normal style; plotters falls back to it
/// for bold and italic). Safe to call more than once; only the first call registers.
pub fn register() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, DEJAVU_SANS).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

#[cfg(test)]
mod tests {
    use plotters::prelude::*;

    use super::*;

    /// The PNG path really rasterizes glyphs: text drawn into a white buffer leaves dark
    /// pixels. Without a registered font plotters fails this draw (FontUnavailable).
    #[test]
    fn embedded_font_rasterizes_text() {
        register().unwrap();
        let (w, h) = (160u32, 40u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            root.draw_text("TFLOP/s", &(FAMILY, 24).into_text_style(&root), (4, 4))
                .unwrap();
            root.present().unwrap();
        }
        let dark = buf
            .chunks(3)
            .filter(|px| px.iter().all(|c| *c < 128))
            .count();
        assert!(dark > 50, "only {dark} dark pixels: no glyphs were drawn");
    }
}
