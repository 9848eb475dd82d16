//! `sim run` (part of the binary, so anyhow stays out of the library): flags that override a scenario, the progress bar, and the summary table
//! or JSON at the end.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use specmla_core::config::{
    BackendProfile, DrafterBatch, KvCacheDtype, ModelDims, Planner, RowLayout, SpecMethod,
    MODEL_NAMES,
};
use specmla_core::fault::Fault;

use std::sync::Arc;

use anyhow::Context;
use specmla_core::backend::Backend;
use specmla_core::config::EngineConfig;
use specmla_cpu::cpu_backend;
use specmla_sim::acceptance::AcceptanceRates;
use specmla_sim::cli::{count, whole};
use specmla_sim::config_file::RunConfig;
use specmla_sim::model::{DrafterModel, TargetModel};
use specmla_sim::progress::{
    estimate_secs_left, install_interrupt_handler, progress_secs, Progress,
};
use specmla_sim::record::TraceSink;
use specmla_sim::runner::{run_with, RunStats, RunSummary, SpecDecodingMetrics, StepSink};
use specmla_sim::scenarios::{self, Scenario};
use specmla_sim::step_log::{StepLogSink, Tee};

/// Drafter batch mode on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DrafterBatchArg {
    Padded,
    Compacted,
}

/// Device backend on the command line.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum DeviceArg {
    /// The CPU reference backend.
    #[default]
    Cpu,
    /// The CUDA backend on GPU 0.
    Gpu,
}

/// How the GPU backend's GEMMs choose their algorithm (`--gemm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GemmArg {
    /// One pinned algorithm per shape, split-K off: a row's bits never depend on M.
    Invariant,
    /// cuBLASLt's heuristic choice per M: an engine's default, not batch-invariant.
    Heuristic,
}

/// A backend factory, as [`run_with`] takes it (a plain `fn`, so a determinism check
/// can build the backend twice).
pub(crate) type Factory<B> = fn(
    &EngineConfig,
    Arc<TargetModel>,
    Arc<DrafterModel>,
) -> Result<B, <B as specmla_core::backend::Backend>::Error>;

/// Row layout on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LayoutArg {
    DecodeFirst,
    ExtendFirst,
}

/// Reorder-and-split rule on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PlannerArg {
    /// vLLM after PR #37303: decode, short_extend, long_extend, prefill.
    Vllm,
    /// vLLM before PR #37303: decode, extend, prefill.
    #[value(name = "vllm-3region")]
    Vllm3Region,
}

impl PlannerArg {
    pub fn planner(self) -> Planner {
        match self {
            PlannerArg::Vllm => Planner::Vllm,
            PlannerArg::Vllm3Region => Planner::Vllm3Region,
        }
    }
}

/// Latent KV cache element type on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KvCacheDtypeArg {
    F32,
    Bf16,
}

impl KvCacheDtypeArg {
    pub fn dtype(self) -> KvCacheDtype {
        match self {
            KvCacheDtypeArg::F32 => KvCacheDtype::F32,
            KvCacheDtypeArg::Bf16 => KvCacheDtype::Bf16,
        }
    }
}

impl LayoutArg {
    pub fn layout(self) -> RowLayout {
        match self {
            LayoutArg::DecodeFirst => RowLayout::DecodeFirst,
            LayoutArg::ExtendFirst => RowLayout::ExtendFirst,
        }
    }
}

/// Flags of `sim run`; every one overrides the scenario's (or the config file's) own
/// setting.
#[derive(Args, Clone, Debug, Default)]
pub struct RunArgs {
    /// Scenario to run (see `sim list`; default mixed_mtp).
    #[arg(long, value_parser = scenario_names(), conflicts_with = "config")]
    pub scenario: Option<String>,
    /// Run the configuration in this TOML file (`sim config` prints one to start from).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Seed of weights, workload and every random decision (default 0, or the file's).
    #[arg(long, value_parser = parse_u64)]
    pub seed: Option<u64>,
    /// Number of requests in the workload.
    #[arg(long, value_parser = whole(1, 100_000))]
    pub requests: Option<u64>,
    /// Stop after this many steps.
    #[arg(long, value_parser = whole(1, u64::MAX))]
    pub steps: Option<u64>,
    /// Prompt lengths in tokens: N, or MIN..MAX drawn uniformly.
    #[arg(long, value_name = "MIN..MAX", value_parser = parse_range)]
    pub prompt_len: Option<(usize, usize)>,
    /// Generation budget per request in tokens: N, or MIN..MAX drawn uniformly.
    #[arg(long, value_name = "MIN..MAX", value_parser = parse_range)]
    pub max_new_tokens: Option<(usize, usize)>,
    /// Most requests in one step (vLLM's max_num_seqs).
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Token budget of one step (vLLM's max_num_batched_tokens).
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// KV blocks in the pool, shared by the target and drafter caches.
    #[arg(long)]
    pub num_gpu_blocks: Option<usize>,
    /// K, the number of speculative tokens.
    #[arg(long)]
    pub num_spec_tokens: Option<usize>,
    /// Attention backend profile (see `sim list`).
    #[arg(long, value_parser = backend_names())]
    pub profile: Option<String>,
    /// Model (see `sim list`): `tiny` (the default of every scenario) or
    /// `deepseek-v3-attn` (DeepSeek-V3's attention widths, 2 small layers).
    #[arg(long, value_parser = model_names())]
    pub model: Option<String>,
    /// Tensor parallelism: run the slice of the model's heads one of N ranks holds.
    #[arg(long, value_name = "N", value_parser = whole(1, 1024))]
    pub tp: Option<u64>,
    /// Target model layers (the model's own by default).
    #[arg(long, value_parser = whole(1, 1024))]
    pub num_layers: Option<u64>,
    /// Most split-KV splits a decode row takes; longer rows take longer splits (0: no cap).
    #[arg(long)]
    pub max_splits: Option<usize>,
    /// Device that executes the run: the CPU reference or the CUDA backend on GPU 0.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub backend: DeviceArg,
    /// How the GPU's bf16 projections pick their cuBLASLt algorithm: pinned per shape,
    /// batch-invariant (the default), or cuBLAS's heuristic per row count, to measure
    /// what the invariance costs (`--backend gpu` on the bf16 path only).
    #[arg(long, value_enum)]
    pub gemm: Option<GemmArg>,
    /// Probability that a draft position proposes the oracle's greedy token: one rate
    /// (0.7), or one per draft position (0.9/0.8/0.6; the last repeats).
    #[arg(long)]
    pub acceptance_rate: Option<String>,
    /// Drafter batch mode.
    #[arg(long, value_enum)]
    pub drafter_batch: Option<DrafterBatchArg>,
    /// Row layout of the target batch.
    #[arg(long, value_enum)]
    pub layout: Option<LayoutArg>,
    /// Reorder-and-split rule (vLLM's current four-region one by default).
    #[arg(long, value_enum)]
    pub planner: Option<PlannerArg>,
    /// Data parallelism: the busiest other rank's token count each step; DP sync pads
    /// this rank's drafter passes to it (0: one rank).
    #[arg(long, value_name = "TOKENS")]
    pub dp_peer_tokens: Option<usize>,
    /// Element type of the latent KV cache (f32 by default).
    #[arg(long, value_enum)]
    pub kv_cache_dtype: Option<KvCacheDtypeArg>,
    /// Sampling temperature (0 = greedy verification).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// KV page size in tokens.
    #[arg(long)]
    pub page_size: Option<usize>,
    /// Context workspace in tokens for chunked-context prefill.
    #[arg(long)]
    pub workspace_tokens: Option<usize>,
    /// Maximum tokens per request.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Disable mixed prefill/decode batches.
    #[arg(long)]
    pub no_mixed: bool,
    /// Disable (emulated) CUDA graphs.
    #[arg(long)]
    pub no_graphs: bool,
    /// Fill what each step leaves unwritten in the graphs' persistent buffers with
    /// garbage, so a stale read gives a wrong output (every check still passes).
    #[arg(long)]
    pub poison: bool,
    /// Turn on a known-bug switch (F1..F16 as modelled, repeatable; see README).
    #[arg(long = "fault", value_name = "ID", value_parser = fault_ids())]
    pub faults: Vec<String>,
    /// Record every step into a trace file (replay it with `replay`).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    /// Also store every layer's full attention outputs and the logits in the trace (a
    /// replay on the other backend compares them within tolerances).
    #[arg(long, requires = "trace")]
    pub trace_tensors: bool,
    /// Write every step as an engine's step log (JSON Lines, schema `specmla.step/1`;
    /// check it with `replay audit`).
    #[arg(long, value_name = "FILE.jsonl")]
    pub step_log: Option<std::path::PathBuf>,
    /// Run twice and name the first step whose trace record differs.
    #[arg(long, conflicts_with_all = ["trace", "step_log", "cost_model"])]
    pub check_determinism: bool,
    /// Price every step the run plans with a calibrated cost model (a file
    /// `gpu-bench --calibrate` wrote) and report the simulated step times and throughput.
    #[arg(long, value_name = "FILE")]
    pub cost_model: Option<std::path::PathBuf>,
    /// What the cost model prices: `engine` (the run's own model on one device),
    /// `deepseek-v3:TP` (one rank of full-depth DeepSeek-V3, 61 layers with its MoE, at
    /// tensor parallelism TP, bf16 weights) or `deepseek-v3-fp8:TP` (the same with FP8
    /// projection and expert weights, scaled from the bf16 calibration).
    #[arg(
        long,
        value_name = "TARGET",
        default_value = "engine",
        requires = "cost_model"
    )]
    pub cost_target: String,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    pub json: bool,
}

fn fault_ids() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(Fault::ALL.map(|f| f.id()))
}

/// A non-negative integer, with a message that says so.
fn parse_u64(v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("expected a non-negative integer below 2^64, got {v:?}"))
}

/// `N` or `MIN..MAX` (inclusive), MIN <= MAX, both positive.
fn parse_range(v: &str) -> Result<(usize, usize), String> {
    let num = |x: &str| {
        x.trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("expected N or MIN..MAX of positive integers, got {v:?}"))
    };
    let (lo, hi) = match v.split_once("..") {
        Some((a, b)) => (num(a)?, num(b)?),
        None => (num(v)?, num(v)?),
    };
    if lo > hi {
        return Err(format!("{v:?}: MIN is above MAX"));
    }
    Ok((lo, hi))
}

fn scenario_names() -> clap::builder::PossibleValuesParser {
    let names: Vec<String> = scenarios::all().into_iter().map(|s| s.name).collect();
    clap::builder::PossibleValuesParser::new(names)
}

fn model_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(MODEL_NAMES.map(|(name, _)| name))
}

fn backend_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(BackendProfile::ALL.map(|p| p.name()))
}

/// The scenario and seed the flags name: a built-in scenario (or the `--config` file),
/// with every flag applied over it.
pub fn resolve_scenario(a: &RunArgs) -> Result<(Scenario, u64)> {
    let (mut s, file_seed) = match &a.config {
        Some(path) => load_config(path)?,
        None => {
            let name = a.scenario.as_deref().unwrap_or("mixed_mtp");
            let Some(s) = scenarios::by_name(name) else {
                bail!("unknown scenario {name:?}");
            };
            (s, 0)
        }
    };
    let seed = a.seed.unwrap_or(file_seed);
    apply_flags(a, &mut s)?;
    Ok((s, seed))
}

/// `sim config`: prints the resolved configuration as commented TOML, noting where a
/// value differs from the built-in scenario of the same name.
pub fn print_config(a: &RunArgs) -> Result<ExitCode> {
    let (s, seed) = resolve_scenario(a)?;
    let defaults = scenarios::by_name(&s.name).map(|d| RunConfig::of(&d, 0));
    let cfg = RunConfig::of(&s, seed);
    if a.json {
        say!("{}", serde_json::to_string_pretty(&cfg)?);
        return Ok(ExitCode::SUCCESS);
    }
    let text = cfg.to_commented_toml(defaults.as_ref());
    say!("{}", text.trim_end());
    Ok(ExitCode::SUCCESS)
}

/// Reads a config file: one line naming the file and the key or line on any error.
fn load_config(path: &std::path::Path) -> Result<(Scenario, u64)> {
    let text = read_input(path).with_context(|| format!("--config {}", path.display()))?;
    let cfg =
        RunConfig::parse(&text).map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
    Ok(cfg.into_scenario())
}

/// A file's text, or stdin's for `-`.
pub fn read_input(path: &std::path::Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
}

fn apply_flags(a: &RunArgs, s: &mut Scenario) -> Result<()> {
    let sc = &mut s.cfg.scheduler;
    if let Some(n) = a.max_num_seqs {
        sc.max_num_seqs = n;
    }
    if let Some(n) = a.max_num_batched_tokens {
        sc.max_num_batched_tokens = n;
    }
    if let Some(n) = a.num_gpu_blocks {
        sc.num_gpu_blocks = n;
    }
    if let Some(r) = a.prompt_len {
        s.workload.prompt_len = r;
    }
    if let Some(r) = a.max_new_tokens {
        s.workload.max_new_tokens = r;
    }
    if let Some(n) = a.requests {
        s.workload.num_requests = n as usize;
    }
    if let Some(n) = a.steps {
        s.max_steps = n;
    }
    if let Some(k) = a.num_spec_tokens {
        if k == 0 && s.cfg.spec.method != SpecMethod::Off {
            bail!("invalid configuration: speculation is on but --num-spec-tokens is 0");
        }
        s.cfg.spec.num_speculative_tokens = k;
    }
    if let Some(b) = &a.profile {
        s.cfg.backends = vec![BackendProfile::from_name(b).expect("clap checked the name")];
    }
    if let Some(m) = &a.model {
        s.cfg.model = ModelDims::named(m).expect("clap checked the name");
    }
    if let Some(n) = a.num_layers {
        s.cfg.model.num_layers = n as usize;
    }
    if let Some(tp) = a.tp {
        s.cfg.model = s.cfg.model.tensor_parallel(tp as usize)?;
    }
    if let Some(n) = a.max_splits {
        s.cfg.max_splits = n;
    }
    // Checked with every other setting on the merged scenario (`Scenario::validate`).
    if let Some(r) = &a.acceptance_rate {
        s.acceptance_rate = r
            .parse::<AcceptanceRates>()
            .map_err(|e| anyhow::anyhow!("--acceptance-rate: {e}"))?;
    }
    if let Some(d) = a.drafter_batch {
        s.cfg.spec.drafter_batch = match d {
            DrafterBatchArg::Padded => DrafterBatch::Padded,
            DrafterBatchArg::Compacted => DrafterBatch::Compacted,
        };
    }
    if let Some(l) = a.layout {
        s.cfg.scheduler.row_layout = l.layout();
    }
    if let Some(p) = a.planner {
        s.cfg.scheduler.planner = p.planner();
    }
    if let Some(t) = a.dp_peer_tokens {
        s.cfg.dp_peer_num_tokens = t;
    }
    if let Some(d) = a.kv_cache_dtype {
        s.cfg.kv_cache_dtype = d.dtype();
    }
    if let Some(t) = a.temperature {
        s.cfg.spec.temperature = t;
    }
    if let Some(p) = a.page_size {
        s.cfg.scheduler.page_size = p;
        if p > 0 {
            s.cfg.split_size_tokens = s.cfg.split_size_tokens.div_ceil(p) * p;
        }
    }
    if let Some(w) = a.workspace_tokens {
        s.cfg.scheduler.workspace_tokens = w;
    }
    if let Some(m) = a.max_model_len {
        s.cfg.scheduler.max_model_len = m;
        let page = s.cfg.scheduler.page_size.max(1);
        if a.num_gpu_blocks.is_none() {
            s.cfg.scheduler.num_gpu_blocks = s.cfg.scheduler.num_gpu_blocks.max(m.div_ceil(page));
        }
    }
    for id in &a.faults {
        s.cfg.faults = s
            .cfg
            .faults
            .with(Fault::from_id(id).expect("clap checked the id"));
    }
    s.cfg.scheduler.mixed_batches &= !a.no_mixed;
    s.cfg.cuda_graphs &= !a.no_graphs;
    s.cfg.poison_stale_buffers |= a.poison;
    Ok(())
}

/// Runs the scenario on the `--backend` device; exit 0 when every check passed, 1
/// otherwise.
pub fn run_scenario(a: &RunArgs) -> Result<ExitCode> {
    let (s, seed) = resolve_scenario(a)?;
    match a.backend {
        DeviceArg::Cpu if a.gemm.is_some() => {
            bail!("--gemm: the CPU backend has no GEMM algorithms to choose (use --backend gpu)")
        }
        DeviceArg::Cpu => run_on(a, &s, seed, cpu_backend),
        #[cfg(feature = "gpu")]
        DeviceArg::Gpu => match a.gemm {
            Some(GemmArg::Heuristic) => run_on(a, &s, seed, gpu_heuristic_gemms),
            _ => run_on(a, &s, seed, specmla_gpu::GpuBackend::new),
        },
        #[cfg(not(feature = "gpu"))]
        DeviceArg::Gpu => {
            bail!("--backend gpu: this sim was built without the `gpu` feature")
        }
    }
}

/// The GPU backend with cuBLAS's per-M heuristic GEMMs (`--gemm heuristic`).
#[cfg(feature = "gpu")]
fn gpu_heuristic_gemms(
    cfg: &EngineConfig,
    target: Arc<TargetModel>,
    drafter: Arc<DrafterModel>,
) -> std::result::Result<specmla_gpu::GpuBackend, specmla_gpu::GpuBackendError> {
    let mut b = specmla_gpu::GpuBackend::new(cfg, target, drafter)?;
    b.set_gemm_algo(specmla_gpu::ops::GemmAlgo::Heuristic)?;
    Ok(b)
}

fn run_on<B: Backend>(a: &RunArgs, s: &Scenario, seed: u64, make: Factory<B>) -> Result<ExitCode> {
    let every = progress_secs().map_err(anyhow::Error::msg)?;
    let total = s.workload.num_requests as u64;
    let mut bar = Progress::new("sim", total, "requests finished", every);
    let progress = |st: &RunStats| {
        bar.update(st.finished as u64, |secs| {
            // Whichever ends the run first: the requests, or the --steps cap.
            let left =
                estimate_secs_left(secs, (st.finished as u64, total), (st.steps, s.max_steps));
            format!(
                "step {}, {:.1} steps/s{}",
                st.steps,
                st.steps as f64 / secs.max(1e-9),
                left.map_or(String::new(), |l| format!(", about {l:.0} s left"))
            )
        });
    };
    if a.check_determinism {
        install_interrupt_handler();
        let verdict = check_determinism(s, seed, make, a.json, progress);
        bar.finish();
        return verdict;
    }
    let mut sink = match &a.trace {
        Some(path) if path.as_os_str() == "-" => {
            bail!("--trace -: a trace is binary and goes to a file; give it a name")
        }
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("--trace {}", path.display()))?;
            Some(TraceSink::new(
                std::io::BufWriter::new(file),
                a.trace_tensors,
            ))
        }
        None => None,
    };
    let mut log = step_log_sink(a, s)?;
    let mut cost = cost_sink(a, s)?;
    let mut sinks: Vec<&mut dyn StepSink> = Vec::new();
    if let Some(t) = sink.as_mut() {
        sinks.push(t);
    }
    if let Some(l) = log.as_mut() {
        sinks.push(l);
    }
    if let Some(c) = cost.as_mut() {
        sinks.push(c);
    }
    let mut tee = Tee(sinks);
    install_interrupt_handler();
    let result = run_with(s, seed, make, Some(&mut tee), progress);
    drop(tee);
    bar.finish();
    let summary = match result {
        Ok(summary) => summary,
        Err(e) if e.is_engine_failure() => {
            eprintln!("FAIL: {e}");
            return Ok(ExitCode::from(1));
        }
        Err(e) => {
            // A run that never started (no GPU, say) leaves no empty trace behind.
            if let Some(p) = &a.trace {
                drop(sink);
                if std::fs::metadata(p).is_ok_and(|m| m.len() == 0) {
                    let _ = std::fs::remove_file(p);
                }
            }
            return Err(e.into());
        }
    };
    let simulated = cost.map(|c| c.summary());
    if a.json {
        let mut v = serde_json::to_value(&summary)?;
        if let Some(sim) = &simulated {
            v["simulated"] = serde_json::to_value(sim)?;
        }
        say!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_summary(&summary);
        if let Some(sim) = &simulated {
            for l in specmla_sim::cost_sink::lines(sim, summary.stats.generated_tokens) {
                say!("{l}");
            }
        }
    }
    if summary.interrupted {
        return Ok(ExitCode::from(130));
    }
    Ok(if summary.passed() && summary.unfired_faults().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The `--cost-model` sink: the calibration file read and checked, the target parsed
/// (bad input: exit 2).
pub(crate) fn cost_sink(
    a: &RunArgs,
    s: &Scenario,
) -> Result<Option<specmla_sim::cost_sink::CostSink>> {
    Ok(cost_model(a, s)?.map(|(c, t)| specmla_sim::cost_sink::CostSink::new(c, t)))
}

/// `--cost-model` and `--cost-target`, read and checked once (a sweep prices every point
/// with them; its points share the base run's model).
pub(crate) fn cost_model(
    a: &RunArgs,
    s: &Scenario,
) -> Result<
    Option<(
        specmla_core::cost::Calibration,
        specmla_core::cost::CostTarget,
    )>,
> {
    let Some(path) = &a.cost_model else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--cost-model {}", path.display()))?;
    let calibration = specmla_core::cost::Calibration::from_json(&text)
        .map_err(|e| anyhow::anyhow!("--cost-model {}: {e}", path.display()))?;
    let target = specmla_sim::cost_sink::parse_target(&a.cost_target, &s.cfg.model)
        .map_err(|e| anyhow::anyhow!("--cost-target {}: {e}", a.cost_target))?;
    Ok(Some((calibration, target)))
}

fn print_summary(s: &RunSummary) {
    let st = &s.stats;
    let line = |label: &str, value: String| say!("  {label:<29}{value}");
    say!(
        "scenario {}  seed {}  backend {}",
        s.scenario,
        s.seed,
        s.backend
    );
    line("device", s.device.clone());
    line("model", s.config.engine.model.summary());
    line(
        "requests",
        format!("{} ({} finished)", st.requests, st.finished),
    );
    line(
        "steps",
        format!(
            "{} ({} mixed, {} on graphs with {} padding rows, {} with chunked context)",
            st.steps, st.mixed_steps, st.graph_steps, st.padding_rows, st.chunked_context_steps
        ),
    );
    line(
        "tokens",
        format!(
            "{} scheduled, {} generated",
            st.scheduled_tokens, st.generated_tokens
        ),
    );
    print_spec_decoding(&s.spec_decoding, &line);
    line("preemptions", st.preemptions.to_string());
    line(
        "drafter PAD slots",
        format!(
            "{} (positions at or past max_model_len)",
            st.drafter_pad_slots
        ),
    );
    line(
        "max |logit - f64|",
        format!(
            "{:.2e} (tolerance {})",
            s.max_logit_error,
            specmla_sim::cli::sci(s.tolerances.logit_abs)
        ),
    );
    if !s.faults.is_empty() {
        line("faults armed", specmla_sim::cli::fault_counts(&s.faults));
    }
    if !s.step_times.is_empty() {
        say!("  step time (wall clock; check-only forwards left out):");
        for l in specmla_sim::step_time::lines(&s.step_times) {
            say!("    {l}");
        }
    }
    say!("  checks:");
    for t in &s.checks {
        say!(
            "    {:<30} {:>7} run {:>7} passed",
            t.check.name(),
            t.run,
            t.passed
        );
    }
    if !s.near_ties.is_empty() {
        say!(
            "  near-ties (margin < {}, reported not failed): {}",
            specmla_sim::cli::sci(s.tolerances.near_tie_margin),
            s.near_ties.len()
        );
        for n in s.near_ties.iter().take(5) {
            say!(
                "    step {} request {} position {} margin {:.2e}",
                n.step,
                n.req_id,
                n.position,
                n.margin
            );
        }
    }
    if s.hit_step_limit {
        say!("  note: stopped at the step limit before every request finished");
    }
    if s.interrupted {
        say!(
            "  note: interrupted (Ctrl-C) after {}; the checks cover those steps",
            count(st.steps as usize, "step")
        );
    }
    // An interrupted run is never a pass, whatever its checks said so far.
    let verdict = if s.interrupted { "INTERRUPTED" } else { "FAIL" };
    // Nor is one whose armed fault never fired: it tested nothing of that fault.
    for f in s.unfired_faults() {
        say!(
            "NOT EXERCISED: fault {} was armed but never fired on this run; it fires with: {}",
            f.id,
            f.trigger
        );
    }
    if !s.unfired_faults().is_empty() && s.passed() && !s.interrupted {
        return;
    }
    if s.passed() {
        if s.interrupted {
            say!("INTERRUPTED: the checks of those steps passed; the run did not finish");
        } else {
            say!("PASS: all checks passed");
        }
        return;
    }
    say!("{verdict}: {} check failures", s.num_failures);
    for f in s.failures.iter().take(10) {
        let row = f.row.map_or(String::new(), |r| format!(" row {r}"));
        let req = f.req_id.map_or(String::new(), |r| format!(" request {r}"));
        say!(
            "  {} at step {}{row}{req}: {}",
            f.kind.name(),
            f.step,
            f.detail
        );
    }
}

/// vLLM's spec-decoding metrics, or why there are none.
fn print_spec_decoding(sd: &SpecDecodingMetrics, line: &dyn Fn(&str, String)) {
    if sd.num_drafts == 0 {
        line(
            "spec decoding",
            "none: no verify row carried a draft (speculation off, or every request ended \
             before one could be verified)"
                .into(),
        );
        return;
    }
    line(
        "spec decoding",
        format!(
            "{} drafts, {} draft tokens, {} accepted",
            sd.num_drafts, sd.num_draft_tokens, sd.num_accepted_tokens
        ),
    );
    line(
        "mean acceptance length",
        format!("{:.3}", sd.mean_acceptance_length),
    );
    line(
        "draft acceptance rate",
        format!("{:.1}%", 100.0 * sd.draft_acceptance_rate),
    );
    let per_pos: Vec<String> = sd
        .per_position_acceptance_rate
        .iter()
        .map(|r| format!("{r:.3}"))
        .collect();
    line("per-position acceptance rate", per_pos.join(", "));
}

/// Runs the scenario twice into memory and compares the traces record by record.
fn check_determinism<B: Backend>(
    s: &Scenario,
    seed: u64,
    make: Factory<B>,
    json: bool,
    mut progress: impl FnMut(&RunStats),
) -> Result<ExitCode> {
    let mut traces = Vec::new();
    for _ in 0..2 {
        let mut sink = TraceSink::new(Vec::new(), false);
        match run_with(s, seed, make, Some(&mut sink), &mut progress) {
            Err(e) if e.is_engine_failure() => {
                eprintln!("FAIL: {e}");
                return Ok(ExitCode::from(1));
            }
            Ok(sum) if sum.interrupted => {
                // Two partial runs prove nothing: say so, exit 130.
                say!(
                    "INTERRUPTED (Ctrl-C) during run {} of 2: determinism not established",
                    traces.len() + 1
                );
                return Ok(ExitCode::from(130));
            }
            other => {
                other?;
            }
        }
        traces.push(sink.into_inner().expect("the run ended"));
    }
    let verdict = compare_traces(&traces[0], &traces[1])?;
    if json {
        say!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        say!("{}", verdict.text());
    }
    Ok(if verdict.deterministic {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What `--check-determinism` found.
#[derive(serde::Serialize)]
struct Determinism {
    deterministic: bool,
    /// Bytes of the first run's trace.
    trace_bytes: usize,
    /// Where the runs first differ: "header", a step number, or "length".
    first_difference: Option<String>,
}

impl Determinism {
    fn text(&self) -> String {
        match self.first_difference.as_deref() {
            None => format!(
                "deterministic: two runs wrote identical traces ({} bytes)",
                self.trace_bytes
            ),
            Some("header") => "FAIL: the trace headers differ".into(),
            Some("length") => "FAIL: the runs differ in length".into(),
            Some(step) => format!("FAIL: the runs differ first at step {step}"),
        }
    }
}

fn compare_traces(a: &[u8], b: &[u8]) -> Result<Determinism> {
    let mut d = Determinism {
        deterministic: a == b,
        trace_bytes: a.len(),
        first_difference: None,
    };
    if d.deterministic {
        return Ok(d);
    }
    let read = |b: &[u8]| specmla_traces::read_all_from(b, Some(b.len() as u64));
    let (ha, ra, _) = read(a)?;
    let (hb, rb, _) = read(b)?;
    d.first_difference = Some(if ha != hb {
        "header".into()
    } else {
        match ra.iter().zip(&rb).position(|(x, y)| x != y) {
            Some(i) => ra[i].step.to_string(),
            None => "length".into(),
        }
    });
    Ok(d)
}

/// The `--step-log` sink, refused (exit 2) where the log could not be what vLLM's rules
/// describe: the schema's rows are in vLLM's decode-first layout.
fn step_log_sink(
    a: &RunArgs,
    s: &Scenario,
) -> Result<Option<StepLogSink<std::io::BufWriter<std::fs::File>>>> {
    let Some(path) = &a.step_log else {
        return Ok(None);
    };
    if s.cfg.scheduler.row_layout != RowLayout::DecodeFirst {
        bail!("--step-log: the step-log schema follows vLLM's decode-first row layout; drop --layout extend-first");
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("--step-log {}", path.display()))?;
    Ok(Some(StepLogSink::new(
        std::io::BufWriter::new(file),
        &s.cfg,
    )))
}
