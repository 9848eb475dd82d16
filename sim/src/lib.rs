//! specmla-sim: the CPU reference backend (exact MLA math, simulated acceptance), the
//! f64 oracle, built-in scenarios and the checks `sim` runs every step.
#![forbid(unsafe_code)]

pub mod attention;
pub mod backend;
pub mod checks;
pub mod cli;
pub mod config_file;
pub mod kv_cache;
/// The model both backends run lives in its own crate; re-exported under its old path.
pub use specmla_model as model;
pub mod oracle;
pub mod progress;
pub mod record;
pub mod runner;
pub mod scenarios;
