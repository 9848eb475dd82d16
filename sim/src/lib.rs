//! specmla-sim: the CPU reference backend (exact MLA math in f32, judged against an f64
//! oracle, with simulated acceptance), the scenarios and the `sim` CLI (SPEC section 10).

pub mod attention;
pub mod model;
pub mod oracle;
