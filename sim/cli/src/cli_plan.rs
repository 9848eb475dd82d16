//! `sim plan` (part of the binary): reads the batch and the flags, prints what
//! `specmla_sim::plan_explain` makes of them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use specmla_core::config::BackendProfile;
use specmla_sim::plan_explain::{explain_parsed, parse_batch, PlanOptions};

use crate::cli_run::{LayoutArg, PlannerArg};

/// Flags of `sim plan`.
#[derive(Args, Clone, Debug)]
pub struct PlanArgs {
    /// JSON batch (`-` reads stdin): {"page_size": 64, "rows": [{"num_computed_tokens":
    /// 100, "num_scheduled_tokens": 4, "num_prompt_tokens": 90}, ...]}
    #[arg(long)]
    pub batch: PathBuf,
    /// Attention backend profile (see `sim list`).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(BackendProfile::ALL.map(|p| p.name())))]
    pub profile: String,
    /// K, the number of speculative tokens (0: speculation off).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=16))]
    pub num_spec_tokens: u64,
    /// Reorder-and-split rule.
    #[arg(long, value_enum, default_value = "vllm")]
    pub planner: PlannerArg,
    /// Use this decode threshold instead of the profile's (vLLM's
    /// `reorder_batch_threshold`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub reorder_batch_threshold: Option<u64>,
    /// Use this instead of the profile's `require_uniform`.
    #[arg(long, value_parser = clap::builder::BoolishValueParser::new(), value_name = "true|false")]
    pub require_uniform: Option<bool>,
    /// Context workspace in tokens (vLLM caps its workspace at 64k tokens).
    #[arg(long, default_value_t = 65_536)]
    pub workspace_tokens: usize,
    /// Largest captured graph, in tokens.
    #[arg(long, default_value_t = 512)]
    pub max_capture_size: usize,
    /// Row layout: decode rows first (vLLM) or last (TokenSpeed).
    #[arg(long, value_enum, default_value = "decode-first")]
    pub layout: LayoutArg,
}

impl PlanArgs {
    fn options(&self) -> PlanOptions {
        PlanOptions {
            profile: self.profile.clone(),
            num_spec_tokens: self.num_spec_tokens,
            planner: self.planner.planner(),
            reorder_batch_threshold: self.reorder_batch_threshold,
            require_uniform: self.require_uniform,
            workspace_tokens: self.workspace_tokens,
            max_capture_size: self.max_capture_size,
            layout: self.layout.layout(),
        }
    }
}

/// Reads the batch (a file, or stdin for `-`), plans it, prints the explanation.
pub fn run_plan(a: &PlanArgs) -> Result<ExitCode> {
    let name = a.batch.display().to_string();
    let text = if name == "-" {
        std::io::read_to_string(std::io::stdin()).context("--batch -: reading stdin")?
    } else {
        std::fs::read_to_string(&a.batch).with_context(|| format!("--batch {name}"))?
    };
    let f = parse_batch(&text).with_context(|| format!("--batch {name}"))?;
    let out = explain_parsed(&f, &a.options())?;
    say!("{out}");
    Ok(ExitCode::SUCCESS)
}
