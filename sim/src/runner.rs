//! Runs a scenario end to end on any backend: builds models, engine and checker, steps
//! to completion, and summarizes what happened and which checks passed. The caller
//! passes a factory for the backend ([`run_with`]); the checks are the same on every
//! backend. This library names no backend: the `sim` binary resolves `--backend
//! cpu|gpu` to a factory.

use std::sync::Arc;

use serde::Serialize;
use specmla_core::backend::{Backend, StepTime};
use specmla_core::config::{EngineConfig, KvCacheDtype};
use specmla_core::engine::{Engine, EngineError, EngineOptions, StepOutcome};
use specmla_core::memory::{self, Allocation};
use specmla_core::scheduler::{validate_workload, WorkloadError};

use crate::checks::{CheckFailure, CheckKind, NearTie, SimChecker, Tolerances};
use crate::config_file::RunConfig;
use crate::model::{DrafterModel, TargetModel};
use crate::oracle::Oracle;
use crate::record::trace_header;
use crate::scenarios::{generate_workload, Scenario};
use crate::step_time::{step_kind, StepKindTime, StepTimes};
use specmla_traces::TraceHeader;

/// Why a run could not start or continue. [`RunError::Engine`] is a failed run (exit 1);
/// everything else is bad input or the environment (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] specmla_core::error::ConfigError),
    #[error("invalid workload: {0}")]
    Workload(WorkloadError),
    /// A scenario setting outside the engine config is out of range
    /// ([`Scenario::validate`]).
    #[error("invalid configuration: {0}")]
    Scenario(String),
    /// The run would not fit in host memory (the message names the allocations).
    #[error("{0}")]
    TooLarge(String),
    /// The engine failed mid-run: a stall, or a backend error that is not the
    /// environment's.
    #[error("{0}")]
    Engine(String),
    /// The backend could not be created (no GPU, no driver, out of memory), or failed
    /// mid-run because of the environment. The message names the backend:
    /// `--backend gpu: no CUDA driver: ...`.
    #[error("{0}")]
    Environment(String),
    #[error("trace: {0}")]
    Trace(specmla_traces::TraceError),
    /// Writing an output other than the trace (the step log) failed.
    #[error("step log: {0}")]
    Output(String),
}

// The causes above are part of each message, not a `source`, so a CLI printing the
// error chain says them once.
impl From<WorkloadError> for RunError {
    fn from(e: WorkloadError) -> Self {
        RunError::Workload(e)
    }
}

impl From<specmla_traces::TraceError> for RunError {
    fn from(e: specmla_traces::TraceError) -> Self {
        RunError::Trace(e)
    }
}

/// An engine error of a run on `B`: the environment's (exit 2) or the engine's (exit 1).
pub fn engine_error<B: Backend>(e: EngineError<B::Error>) -> RunError {
    match &e {
        EngineError::Backend(b) if B::is_environment(b) => {
            RunError::Environment(format!("--backend {}: {e}", B::KIND))
        }
        _ => RunError::Engine(e.to_string()),
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
    /// Whether the sink stores full tensors, so the backend must return them.
    fn wants_tensors(&self) -> bool {
        false
    }
    /// Called after [`Self::step`] with the step's measured time, on a backend that
    /// times itself.
    fn measured(&mut self, _o: &StepOutcome, _t: &StepTime) {}
}

/// The most host memory a run may take (the harness's models and oracle, and a
/// backend's host allocations), so no flag can make it abort on memory.
pub const HOST_LIMIT_BYTES: u64 = 16 << 30;

/// What a run on backend `B` allocates in host memory: the f32 models the harness draws
/// (`core::memory`), the f64 oracle's copy of the target (twice its f32 bytes), and what
/// `B` keeps on the host (the CPU backend's caches).
pub fn host_allocations<B: Backend>(cfg: &EngineConfig) -> Vec<Allocation> {
    let mut a = specmla_core::memory::allocations(cfg);
    a.truncate(2);
    a.push(Allocation {
        what: "f64 oracle",
        bytes: 2 * a[0].bytes,
    });
    a.extend(B::host_allocations(cfg));
    a
}

/// The target and drafter `cfg` runs, drawn from `seed`: with a bf16 cache
/// (`--kv-cache-dtype bf16`) the weights are bf16 too, as an engine serving a bf16
/// checkpoint holds them, so the bf16 GPU path and the CPU reference share every weight
/// bit for bit.
pub fn models(cfg: &EngineConfig, seed: u64) -> (Arc<TargetModel>, Arc<DrafterModel>) {
    let target = TargetModel::from_seed(&cfg.model, seed);
    let drafter = DrafterModel::from_seed(&cfg.model, seed);
    match cfg.kv_cache_dtype {
        KvCacheDtype::Bf16 => (
            Arc::new(target.with_bf16_weights()),
            Arc::new(drafter.with_bf16_weights()),
        ),
        KvCacheDtype::F32 => (Arc::new(target), Arc::new(drafter)),
    }
}

/// Refuses a run whose host allocations pass [`HOST_LIMIT_BYTES`], naming them.
pub fn check_host_memory<B: Backend>(cfg: &EngineConfig) -> Result<(), String> {
    let a = host_allocations::<B>(cfg);
    let total = memory::total_bytes(&a);
    if total <= HOST_LIMIT_BYTES {
        return Ok(());
    }
    Err(format!(
        "the run needs {} of host memory ({}), above the limit of {}; lower --num-layers, \
         --num-gpu-blocks or --max-model-len, or raise --tp",
        memory::gib(total),
        memory::describe(&a),
        memory::gib(HOST_LIMIT_BYTES)
    ))
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
    /// Accepted drafts by draft position (vLLM's `num_accepted_tokens_per_pos`).
    pub accepted_per_pos: Vec<u64>,
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
                if self.accepted_per_pos.len() < row.num_draft_tokens {
                    self.accepted_per_pos.resize(row.num_draft_tokens, 0);
                }
                for n in &mut self.accepted_per_pos[..v.num_accepted] {
                    *n += 1;
                }
            }
        }
    }
}

/// Speculative-decoding metrics under the names vLLM's `SpecDecodingLogging` and its
/// Prometheus counters use (`vllm/v1/spec_decode/metrics.py`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SpecDecodingMetrics {
    /// Verify rows that carried drafts.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// Per draft position, drafts accepted there.
    pub num_accepted_tokens_per_pos: Vec<u64>,
    /// `1 + num_accepted_tokens / num_drafts` (tokens emitted per verify row).
    pub mean_acceptance_length: f64,
    /// `num_accepted_tokens / num_draft_tokens` ("Avg Draft acceptance rate").
    pub draft_acceptance_rate: f64,
    /// `num_accepted_tokens_per_pos[i] / num_drafts`.
    pub per_position_acceptance_rate: Vec<f64>,
}

impl SpecDecodingMetrics {
    fn of(st: &RunStats) -> Self {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        SpecDecodingMetrics {
            num_drafts: st.verify_rows,
            num_draft_tokens: st.proposed_drafts,
            num_accepted_tokens: st.accepted_drafts,
            num_accepted_tokens_per_pos: st.accepted_per_pos.clone(),
            mean_acceptance_length: st.mean_acceptance_length(),
            draft_acceptance_rate: ratio(st.accepted_drafts, st.proposed_drafts),
            per_position_acceptance_rate: st
                .accepted_per_pos
                .iter()
                .map(|&n| ratio(n, st.verify_rows))
                .collect(),
        }
    }
}

/// One check's tally, named as the text summary names it.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CheckTally {
    pub check: CheckKind,
    pub run: u64,
    pub passed: u64,
}

/// Everything `sim` reports at the end.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub scenario: String,
    /// The backend kind, "cpu" or "gpu" (what a trace of the run records).
    pub backend: String,
    /// The device that ran it, e.g. "NVIDIA H100 80GB HBM3" (reported, never recorded).
    pub device: String,
    pub seed: u64,
    /// The run's whole configuration, as `sim config` prints it.
    pub config: RunConfig,
    pub stats: RunStats,
    pub spec_decoding: SpecDecodingMetrics,
    pub checks: Vec<CheckTally>,
    pub num_failures: u64,
    pub failures: Vec<CheckFailure>,
    pub near_ties: Vec<NearTie>,
    pub max_logit_error: f64,
    pub tolerances: Tolerances,
    /// True when the step limit stopped the run before every request finished.
    pub hit_step_limit: bool,
    /// True when Ctrl-C stopped the run: the summary covers the steps run so far.
    pub interrupted: bool,
    /// Each armed fault switch and the steps in which it fired, in catalog order.
    pub faults: Vec<FaultCount>,
    /// Where the steps' time went, per step kind, on a backend that times itself
    /// (empty on the CPU backend). Wall-clock numbers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub step_times: Vec<StepKindTime>,
}

/// How often an armed fault switch fired (`specmla_core::fired`).
#[derive(Clone, Debug, Serialize)]
pub struct FaultCount {
    pub id: &'static str,
    /// Steps in which the switch changed what the engine computed.
    pub fired_steps: u64,
    /// The smallest workload that makes it fire (`Fault::trigger`).
    pub trigger: &'static str,
}

impl RunSummary {
    pub fn passed(&self) -> bool {
        self.num_failures == 0
    }

    /// The armed faults that never fired: a run that armed them tested nothing of them.
    pub fn unfired_faults(&self) -> Vec<&FaultCount> {
        self.faults.iter().filter(|f| f.fired_steps == 0).collect()
    }
}

/// Runs `scenario` with `seed` on the backend `make` builds (after the config, workload and cache size are
/// validated, from the config and the seed's weights), also feeding every step to
/// `sink` (trace recording). A backend that cannot be created is
/// [`RunError::Environment`], `--backend KIND: reason`.
pub fn run_with<B, F>(
    scenario: &Scenario,
    seed: u64,
    make: F,
    mut sink: Option<&mut dyn StepSink>,
    mut on_step: impl FnMut(&RunStats),
) -> Result<RunSummary, RunError>
where
    B: Backend,
    F: FnOnce(&EngineConfig, Arc<TargetModel>, Arc<DrafterModel>) -> Result<B, B::Error>,
{
    let cfg = scenario.cfg.clone();
    scenario.validate().map_err(RunError::Scenario)?;
    cfg.validate()?;
    let workload = generate_workload(&scenario.workload, &cfg, seed);
    validate_workload(&cfg, &workload)?;
    check_host_memory::<B>(&cfg).map_err(RunError::TooLarge)?;
    B::check_dims(&cfg.model)
        .map_err(|e| RunError::Environment(format!("--backend {}: {e}", B::KIND)))?;
    let (target, drafter) = models(&cfg, seed);
    let oracle = Arc::new(Oracle::new(&target, cfg.kv_cache_dtype));
    // Bad input or the environment either way: the run never started.
    let backend = make(&cfg, target, drafter)
        .map_err(|e| RunError::Environment(format!("--backend {}: {e}", B::KIND)))?;
    let device = backend.device_name();
    let temperature = cfg.spec.temperature;
    let mut checker = SimChecker::new(
        oracle,
        &workload,
        seed,
        scenario.acceptance_rate.clone(),
        temperature,
    );
    checker.set_tolerances(Tolerances::for_run(
        cfg.kv_cache_dtype,
        backend.bf16_compute(),
    ));
    let opts = EngineOptions {
        check_layouts: scenario.check_layouts,
        check_drafter_batches: scenario.check_drafter_batches
            && cfg.spec.method == specmla_core::config::SpecMethod::MultiStep,
        seed,
        full_outputs: sink.as_deref().is_some_and(|s| s.wants_tensors()),
    };
    if let Some(sink) = sink.as_deref_mut() {
        sink.begin(trace_header(
            scenario, &cfg, seed, &workload, false, &backend,
        ))?;
    }
    let mut stats = RunStats {
        requests: workload.len(),
        ..Default::default()
    };
    let mut fired_steps = vec![0u64; cfg.faults.iter().count()];
    let mut engine =
        Engine::new(cfg.clone(), opts, workload, backend).map_err(engine_error::<B>)?;
    let mut interrupted = false;
    let mut step_times = StepTimes::default();
    while stats.steps < scenario.max_steps {
        if crate::progress::interrupted() {
            interrupted = true;
            break;
        }
        let Some(outcome) = engine.step(&mut checker).map_err(engine_error::<B>)? else {
            break;
        };
        checker.check_step(&outcome, opts.check_layouts, opts.check_drafter_batches);
        let forced = std::mem::take(&mut checker.forced_log);
        if let Some(sink) = sink.as_deref_mut() {
            sink.step(&outcome, &forced)?;
        }
        let time = engine.backend_mut().take_step_time();
        if let (Some(t), Some(sink)) = (&time, sink.as_deref_mut()) {
            sink.measured(&outcome, t);
        }
        if let (Some(t), Some(kind)) = (time, step_kind(&outcome.plan)) {
            step_times.push(kind, t);
        }
        stats.absorb(&outcome);
        for (f, count) in cfg.faults.iter().zip(&mut fired_steps) {
            *count += outcome.faults_fired.has(f) as u64;
        }
        on_step(&stats);
    }
    if let Some(sink) = sink {
        sink.end()?;
    }
    Ok(RunSummary {
        scenario: scenario.name.to_string(),
        backend: B::KIND.to_string(),
        device,
        seed,
        config: RunConfig::of(scenario, seed),
        spec_decoding: SpecDecodingMetrics::of(&stats),
        hit_step_limit: !interrupted && !engine.scheduler().is_done(),
        interrupted,
        stats,
        checks: checker
            .tallies
            .iter()
            .map(|(&check, t)| CheckTally {
                check,
                run: t.run,
                passed: t.passed,
            })
            .collect(),
        num_failures: checker.num_failures,
        failures: checker.failures.clone(),
        near_ties: checker.near_ties.clone(),
        max_logit_error: checker.max_logit_error,
        tolerances: checker.tolerances(),
        faults: cfg
            .faults
            .iter()
            .zip(fired_steps)
            .map(|(f, fired_steps)| FaultCount {
                id: f.id(),
                fired_steps,
                trigger: f.trigger(),
            })
            .collect(),
        step_times: step_times.summary(),
    })
}
