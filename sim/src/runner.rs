//! Runs a scenario end to end on the CPU or the CUDA backend: builds models, engine and
//! checker, steps to completion, and summarizes what happened and which checks passed.
//! The checks are the same on both backends.

use std::sync::Arc;

use serde::Serialize;
use specmla_core::backend::Backend;
use specmla_core::config::EngineConfig;
use specmla_core::engine::{Engine, EngineError, EngineOptions, StepOutcome};
use specmla_core::request::RequestSpec;
use specmla_core::scheduler::{validate_workload, WorkloadError};
use specmla_gpu::{GpuBackend, GpuBackendError};

use crate::backend::{CpuBackend, CpuBackendError};
use crate::checks::{CheckFailure, CheckKind, NearTie, SimChecker, Tally, Tolerances};
use crate::model::{DrafterModel, TargetModel};
use crate::oracle::Oracle;
use crate::record::trace_header;
use crate::scenarios::{generate_workload, Scenario};
use specmla_traces::TraceHeader;

/// Why a run could not start or continue (bad input or environment: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] specmla_core::error::ConfigError),
    #[error("invalid workload: {0}")]
    Workload(#[from] WorkloadError),
    #[error("the KV caches and weights would need {0} bytes (limit {CACHE_LIMIT_BYTES}); lower --max-model-len or the block count")]
    CacheTooLarge(u64),
    /// The engine failed mid-run (a failed run: exit 1).
    #[error("{0}")]
    Engine(String),
    /// The backend could not be used (no GPU, no driver, out of memory: exit 2).
    #[error("{0}")]
    Environment(String),
    #[error("trace: {0}")]
    Trace(#[from] specmla_traces::TraceError),
}

/// Which device executes a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum DeviceBackend {
    /// The CPU reference backend.
    #[default]
    Cpu,
    /// The CUDA backend on GPU 0.
    Gpu,
}

impl DeviceBackend {
    /// The kind recorded in trace headers.
    pub fn name(self) -> &'static str {
        match self {
            DeviceBackend::Cpu => "cpu",
            DeviceBackend::Gpu => "gpu",
        }
    }

    /// The kind named `name` ("cpu" or "gpu").
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "cpu" => Some(DeviceBackend::Cpu),
            "gpu" => Some(DeviceBackend::Gpu),
            _ => None,
        }
    }
}

/// Whether a backend error is the environment's (exit 2) rather than the engine's.
pub trait BackendErrorKind {
    fn is_environment(&self) -> bool;
}

impl BackendErrorKind for CpuBackendError {
    fn is_environment(&self) -> bool {
        false
    }
}

impl BackendErrorKind for GpuBackendError {
    fn is_environment(&self) -> bool {
        GpuBackendError::is_environment(self)
    }
}

impl<E: std::error::Error + BackendErrorKind + 'static> From<EngineError<E>> for RunError {
    fn from(e: EngineError<E>) -> Self {
        match &e {
            EngineError::Backend(b) if b.is_environment() => RunError::Environment(e.to_string()),
            _ => RunError::Engine(e.to_string()),
        }
    }
}

/// Receives every step of a run (a trace writer, a determinism check).
pub trait StepSink {
    /// Called once before the first step.
    fn begin(&mut self, header: TraceHeader) -> Result<(), RunError>;
    /// Called after every step with the drafts the acceptance controller forced.
    fn step(&mut self, o: &StepOutcome, forced: &[(u64, usize, u32)]) -> Result<(), RunError>;
    /// Called once after the last step.
    fn end(&mut self) -> Result<(), RunError>;
}

/// Largest cache the CPU backend allocates, so no flag can make it abort on memory.
pub const CACHE_LIMIT_BYTES: u64 = 4 << 30;

/// Bytes of the target and drafter weights under `cfg` (f32), an upper estimate.
pub fn weight_bytes(cfg: &specmla_core::config::EngineConfig) -> u64 {
    let m = &cfg.model;
    let (h, heads) = (m.hidden_size as u64, m.num_heads as u64);
    let per_layer = h * heads * m.qk_head_dim() as u64
        + h * m.latent_dim() as u64
        + heads * m.kv_lora_rank as u64 * (m.qk_nope_head_dim + m.v_head_dim) as u64
        + heads * m.v_head_dim as u64 * h
        + 3 * h * m.intermediate_size as u64;
    let embeddings = 2 * m.vocab_size as u64 * h;
    // The drafter: one layer, its own embeddings and head, and the input fusions.
    ((m.num_layers as u64 + 1) * per_layer + 2 * embeddings + 3 * h * h) * 4
}

/// Bytes the CPU backend's target and drafter caches take under `cfg`.
pub fn cache_bytes(cfg: &specmla_core::config::EngineConfig) -> u64 {
    let m = &cfg.model;
    let slots =
        (cfg.scheduler.num_gpu_blocks as u64).saturating_mul(cfg.scheduler.page_size as u64);
    (m.num_layers as u64 + 1)
        .saturating_mul(slots)
        .saturating_mul(m.latent_dim() as u64 * 4)
}

impl RunError {
    /// Whether the error is the engine's own fault (a failed run: exit 1) rather than
    /// bad input (exit 2).
    pub fn is_engine_failure(&self) -> bool {
        matches!(self, RunError::Engine(_))
    }
}

/// Counters of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunStats {
    pub steps: u64,
    pub requests: usize,
    pub finished: usize,
    pub scheduled_tokens: u64,
    pub generated_tokens: u64,
    pub verify_rows: u64,
    pub accepted_drafts: u64,
    pub proposed_drafts: u64,
    pub mixed_steps: u64,
    pub graph_steps: u64,
    pub padding_rows: u64,
    pub preemptions: u64,
    pub chunked_context_steps: u64,
    /// Drafter writes skipped because their position is at or past max_model_len.
    pub drafter_pad_slots: u64,
}

impl RunStats {
    /// Mean tokens emitted per verify row (1 + accepted drafts).
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.verify_rows == 0 {
            return 0.0;
        }
        (self.verify_rows + self.accepted_drafts) as f64 / self.verify_rows as f64
    }

    fn absorb(&mut self, o: &StepOutcome) {
        self.steps += 1;
        self.scheduled_tokens += o.plan.num_tokens() as u64;
        self.finished += o.finished.len();
        self.preemptions += o.batch.preempted.len() as u64;
        let m = &o.plan.mla;
        self.mixed_steps += (m.num_decodes > 0 && m.num_prefills > 0) as u64;
        if let Some(g) = &o.plan.cudagraph {
            self.graph_steps += 1;
            self.padding_rows += g.num_padding_rows as u64;
        }
        self.chunked_context_steps +=
            m.prefill
                .as_ref()
                .is_some_and(|p| p.chunked_context.is_some()) as u64;
        let pad = specmla_core::block_pool::PAD_SLOT;
        self.drafter_pad_slots += o
            .drafter_passes
            .iter()
            .flat_map(|p| &p.slot_mapping)
            .filter(|&&s| s == pad)
            .count() as u64;
        self.drafter_pad_slots += o
            .dflash
            .iter()
            .flat_map(|d| &d.block_slots)
            .filter(|&&s| s == pad)
            .count() as u64;
        for (row, v) in o.plan.rows.iter().zip(&o.verifies) {
            let Some(v) = v else { continue };
            self.generated_tokens += v.new_tokens.len() as u64;
            if row.num_draft_tokens > 0 {
                self.verify_rows += 1;
                self.accepted_drafts += v.num_accepted as u64;
                self.proposed_drafts += row.num_draft_tokens as u64;
            }
        }
    }
}

/// Everything `sim` reports at the end.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub scenario: String,
    /// "cpu" or "gpu".
    pub backend: String,
    pub seed: u64,
    pub stats: RunStats,
    pub mean_acceptance_length: f64,
    pub checks: Vec<(CheckKind, Tally)>,
    pub num_failures: u64,
    pub failures: Vec<CheckFailure>,
    pub near_ties: Vec<NearTie>,
    pub max_logit_error: f64,
    pub tolerances: Tolerances,
    /// True when the step limit stopped the run before every request finished.
    pub hit_step_limit: bool,
}

impl RunSummary {
    pub fn passed(&self) -> bool {
        self.num_failures == 0
    }
}

/// Runs `scenario` with `seed`, calling `on_step` after every step (progress bars).
pub fn run(
    scenario: &Scenario,
    seed: u64,
    on_step: impl FnMut(&RunStats),
) -> Result<RunSummary, RunError> {
    run_with(scenario, seed, None, on_step)
}

/// [`run`] on the CPU backend, also feeding every step to `sink` (trace recording).
pub fn run_with(
    scenario: &Scenario,
    seed: u64,
    sink: Option<&mut dyn StepSink>,
    on_step: impl FnMut(&RunStats),
) -> Result<RunSummary, RunError> {
    run_on(DeviceBackend::Cpu, scenario, seed, sink, on_step)
}

/// [`run_with`] on the chosen device backend.
pub fn run_on(
    device: DeviceBackend,
    scenario: &Scenario,
    seed: u64,
    sink: Option<&mut dyn StepSink>,
    on_step: impl FnMut(&RunStats),
) -> Result<RunSummary, RunError> {
    let cfg = scenario.cfg.clone();
    cfg.validate()?;
    let workload = generate_workload(&scenario.workload, &cfg, seed);
    validate_workload(&cfg, &workload)?;
    let bytes = cache_bytes(&cfg).saturating_add(weight_bytes(&cfg));
    if bytes > CACHE_LIMIT_BYTES {
        return Err(RunError::CacheTooLarge(bytes));
    }
    let target = Arc::new(TargetModel::from_seed(&cfg.model, seed));
    let drafter = Arc::new(DrafterModel::from_seed(&cfg.model, seed));
    let run = Run {
        scenario,
        seed,
        device,
        cfg: &cfg,
        workload,
        oracle: Arc::new(Oracle::new(&target)),
    };
    match device {
        DeviceBackend::Cpu => run.drive(CpuBackend::new(&cfg, target, drafter), sink, on_step),
        DeviceBackend::Gpu => {
            let backend = GpuBackend::new(&cfg, target, drafter)
                .map_err(|e| RunError::Environment(format!("--backend gpu: {e}")))?;
            run.drive(backend, sink, on_step)
        }
    }
}

/// One run's inputs, shared by both backends.
struct Run<'a> {
    scenario: &'a Scenario,
    seed: u64,
    device: DeviceBackend,
    cfg: &'a EngineConfig,
    workload: Vec<RequestSpec>,
    oracle: Arc<Oracle>,
}

impl Run<'_> {
    fn drive<B>(
        self,
        backend: B,
        mut sink: Option<&mut dyn StepSink>,
        mut on_step: impl FnMut(&RunStats),
    ) -> Result<RunSummary, RunError>
    where
        B: Backend,
        B::Error: BackendErrorKind,
    {
        let (scenario, seed, cfg) = (self.scenario, self.seed, self.cfg);
        let greedy = cfg.spec.temperature == 0.0;
        let mut checker = SimChecker::new(
            self.oracle,
            &self.workload,
            seed,
            scenario.acceptance_rate,
            greedy,
        );
        let opts = EngineOptions {
            check_layouts: scenario.check_layouts,
            check_drafter_batches: scenario.check_drafter_batches
                && cfg.spec.method == specmla_core::config::SpecMethod::MultiStep,
            seed,
        };
        if let Some(sink) = sink.as_deref_mut() {
            let header = trace_header(
                scenario,
                cfg,
                seed,
                &self.workload,
                false,
                self.device.name(),
            );
            sink.begin(header)?;
        }
        let mut stats = RunStats {
            requests: self.workload.len(),
            ..Default::default()
        };
        let mut engine = Engine::new(cfg.clone(), opts, self.workload, backend)?;
        while stats.steps < scenario.max_steps {
            let Some(outcome) = engine.step(&mut checker)? else {
                break;
            };
            checker.check_step(&outcome, opts.check_layouts, opts.check_drafter_batches);
            let forced = std::mem::take(&mut checker.forced_log);
            if let Some(sink) = sink.as_deref_mut() {
                sink.step(&outcome, &forced)?;
            }
            stats.absorb(&outcome);
            on_step(&stats);
        }
        if let Some(sink) = sink {
            sink.end()?;
        }
        Ok(RunSummary {
            scenario: scenario.name.to_string(),
            backend: self.device.name().to_string(),
            seed,
            mean_acceptance_length: stats.mean_acceptance_length(),
            hit_step_limit: !engine.scheduler().is_done(),
            stats,
            checks: checker.tallies.iter().map(|(k, t)| (*k, *t)).collect(),
            num_failures: checker.num_failures,
            failures: checker.failures.clone(),
            near_ties: checker.near_ties.clone(),
            max_logit_error: checker.max_logit_error,
            tolerances: checker.tolerances(),
        })
    }
}
