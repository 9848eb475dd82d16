//! specmla-sim: the harness. It runs a scenario on any backend (`runner`), checks every
//! step against an f64 oracle and the planning invariants (`checks`, `oracle`), builds
//! workloads and run configurations (`scenarios`, `config_file`), records traces
//! (`record`), lays out throughput sweeps (`sweep`), and shares the command-line conventions of `sim` and `replay` (`cli`,
//! `progress`). It names no backend: callers pass a factory of one.
#![forbid(unsafe_code)]

pub mod acceptance;
pub mod checks;
pub mod cli;
pub mod config_file;
pub mod cost_sink;
pub mod invariance;
/// The model both backends run lives in its own crate; re-exported under its old path.
pub use specmla_model as model;
pub mod oracle;
pub mod plan_explain;
pub mod progress;
pub mod record;
pub mod runner;
pub mod scenarios;
pub mod step_bench;
pub mod step_log;
pub mod step_time;
pub mod sweep;
