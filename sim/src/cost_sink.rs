//! `sim --cost-model`: every step a run plans, priced by a calibrated cost model
//! (`specmla_core::cost`) for a chosen target (the run's own model on one device, or a
//! rank of full-depth DeepSeek-V3), summed into simulated step times and throughput. It
//! is a [`StepSink`]: the run executes on whatever backend it names (the CPU reference by
//! default), and the simulated times are a function of the plans alone.

use serde::Serialize;
use specmla_core::backend::StepTime;
use specmla_core::config::ModelDims;
use specmla_core::cost::{step_cost, Calibration, CostTarget, StepCost};
use specmla_core::engine::StepOutcome;
use specmla_traces::TraceHeader;

use crate::runner::{RunError, StepSink};
use crate::step_time::step_kind;

/// Collects each step's simulated cost.
pub struct CostSink {
    calibration: Calibration,
    target: CostTarget,
    steps: Vec<(&'static str, StepCost)>,
    /// Per priced step (same order), its measured wall time where the backend timed it.
    measured_us: Vec<Option<f64>>,
    /// Tokens the decode-only steps emitted.
    decode_tokens: u64,
}

/// Per step kind, as the measured step times are reported.
#[derive(Clone, Debug, Serialize)]
pub struct SimulatedKind {
    pub kind: &'static str,
    pub steps: usize,
    pub median_us: f64,
    pub total_us: f64,
}

/// What a run's steps would have cost on the calibrated device and target.
#[derive(Clone, Debug, Serialize)]
pub struct SimulatedTime {
    /// The calibration's device and commit.
    pub device: String,
    pub calibration_commit: String,
    pub target: String,
    pub steps: usize,
    pub total_us: f64,
    pub attention_us: f64,
    pub gemm_us: f64,
    pub comm_us: f64,
    pub host_us: f64,
    /// The decode-only steps: their simulated time and the tokens they emitted (1 +
    /// accepted per verifying row), the steady state that published speedups (TPOT)
    /// measure.
    pub decode_us: f64,
    pub decode_tokens: u64,
    pub kinds: Vec<SimulatedKind>,
    /// On a backend that times itself: the measured wall time of the same steps, and
    /// the simulated total of the steps it timed (to compare like with like).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredComparison>,
}

/// Simulated against measured, over the steps the backend timed.
#[derive(Clone, Debug, Serialize)]
pub struct MeasuredComparison {
    pub steps: usize,
    pub measured_us: f64,
    pub simulated_us: f64,
    /// `simulated / measured - 1`.
    pub error: f64,
}

impl SimulatedTime {
    /// Generated tokens per second of simulated time.
    pub fn tokens_per_s(&self, generated_tokens: u64) -> f64 {
        match self.total_us > 0.0 {
            true => generated_tokens as f64 / (self.total_us * 1e-6),
            false => 0.0,
        }
    }

    /// Tokens emitted per second of simulated decode-only steps (0 without any).
    pub fn decode_tokens_per_s(&self) -> f64 {
        match self.decode_us > 0.0 {
            true => self.decode_tokens as f64 / (self.decode_us * 1e-6),
            false => 0.0,
        }
    }
}

impl CostSink {
    pub fn new(calibration: Calibration, target: CostTarget) -> Self {
        Self {
            calibration,
            target,
            steps: Vec::new(),
            measured_us: Vec::new(),
            decode_tokens: 0,
        }
    }

    /// The priced steps so far.
    pub fn summary(&self) -> SimulatedTime {
        let mut total = StepCost::default();
        let mut kinds: Vec<(&'static str, Vec<f64>)> = Vec::new();
        for (kind, c) in &self.steps {
            total.add(c);
            match kinds.iter_mut().find(|(k, _)| k == kind) {
                Some((_, v)) => v.push(c.total_us()),
                None => kinds.push((kind, vec![c.total_us()])),
            }
        }
        let timed: Vec<(f64, f64)> = self
            .steps
            .iter()
            .zip(&self.measured_us)
            .filter_map(|((_, c), m)| m.map(|m| (c.total_us(), m)))
            .collect();
        let measured = (!timed.is_empty()).then(|| {
            let simulated_us: f64 = timed.iter().map(|t| t.0).sum();
            let measured_us: f64 = timed.iter().map(|t| t.1).sum();
            MeasuredComparison {
                steps: timed.len(),
                measured_us,
                simulated_us,
                error: simulated_us / measured_us - 1.0,
            }
        });
        SimulatedTime {
            measured,
            device: self.calibration.device.clone(),
            calibration_commit: self.calibration.commit.clone(),
            target: self.target.name.clone(),
            steps: self.steps.len(),
            total_us: total.total_us(),
            attention_us: total.attention_us,
            gemm_us: total.gemm_us,
            comm_us: total.comm_us,
            host_us: total.host_us,
            decode_us: (self.steps.iter())
                .filter(|(kind, _)| kind.starts_with("decode-only"))
                .map(|(_, c)| c.total_us())
                .sum(),
            decode_tokens: self.decode_tokens,
            kinds: kinds
                .into_iter()
                .map(|(kind, mut v)| {
                    v.sort_by(f64::total_cmp);
                    SimulatedKind {
                        kind,
                        steps: v.len(),
                        median_us: v[v.len() / 2],
                        total_us: v.iter().sum(),
                    }
                })
                .collect(),
        }
    }
}

impl StepSink for CostSink {
    fn begin(&mut self, _header: TraceHeader) -> Result<(), RunError> {
        Ok(())
    }

    fn step(&mut self, o: &StepOutcome, _forced: &[(u64, usize, u32)]) -> Result<(), RunError> {
        if let Some(kind) = step_kind(&o.plan) {
            let cost = step_cost(&self.calibration, &self.target, o);
            if kind.starts_with("decode-only") {
                // What the requests emitted (as `generated_tokens` counts it), not what
                // the rows committed: a recomputed prompt after preemption commits tokens
                // in a step that looks like a decode but emits nothing new.
                let emitted = o.verifies.iter().flatten().map(|v| v.new_tokens.len());
                self.decode_tokens += emitted.sum::<usize>() as u64;
            }
            self.steps.push((kind, cost));
            self.measured_us.push(None);
        }
        Ok(())
    }

    fn measured(&mut self, o: &StepOutcome, t: &StepTime) {
        if step_kind(&o.plan).is_some() {
            if let Some(m) = self.measured_us.last_mut() {
                *m = Some(t.wall_us);
            }
        }
    }

    fn end(&mut self) -> Result<(), RunError> {
        Ok(())
    }
}

/// `--cost-target`: `engine` (the run's model, `dims`) or `deepseek-v3:TP`.
pub fn parse_target(s: &str, dims: &ModelDims) -> Result<CostTarget, String> {
    match s.split_once(':') {
        None if s == "engine" => Ok(CostTarget::engine(dims)),
        None if s == "deepseek-v3" => CostTarget::deepseek_v3(1).map_err(|e| e.to_string()),
        None if s == "deepseek-v3-fp8" => CostTarget::deepseek_v3_fp8(1).map_err(|e| e.to_string()),
        Some((name @ ("deepseek-v3" | "deepseek-v3-fp8"), tp)) => {
            let tp: usize = tp
                .parse()
                .map_err(|_| format!("TP `{tp}` is not a positive integer"))?;
            let target = match name {
                "deepseek-v3" => CostTarget::deepseek_v3(tp),
                _ => CostTarget::deepseek_v3_fp8(tp),
            };
            target.map_err(|e| e.to_string())
        }
        _ => Err(
            "expected `engine`, `deepseek-v3[:TP]` or `deepseek-v3-fp8[:TP]` (FP8 weights)".into(),
        ),
    }
}

/// The summary's lines for a simulated run that generated `generated_tokens`.
pub fn lines(s: &SimulatedTime, generated_tokens: u64) -> Vec<String> {
    let share = |v: f64| match s.total_us > 0.0 {
        true => 100.0 * v / s.total_us,
        false => 0.0,
    };
    let mut out = vec![
        format!(
            "simulated on {} (calibrated at {}), {}:",
            s.device, s.calibration_commit, s.target
        ),
        format!(
            "  {} steps, {:.3} ms, {:.1} generated tokens/s",
            s.steps,
            s.total_us / 1e3,
            s.tokens_per_s(generated_tokens)
        ),
        format!(
            "  decode-only steps: {} tokens in {:.3} ms, {:.1} tokens/s",
            s.decode_tokens,
            s.decode_us / 1e3,
            s.decode_tokens_per_s()
        ),
        format!(
            "  attention {:.0}%, GEMMs {:.0}%, all-reduce {:.0}%, host {:.0}%",
            share(s.attention_us),
            share(s.gemm_us),
            share(s.comm_us),
            share(s.host_us)
        ),
    ];
    if let Some(m) = &s.measured {
        out.push(format!(
            "  measured {:.3} ms over the {} steps the backend timed; simulated {:.3} ms ({:+.1}%)",
            m.measured_us / 1e3,
            m.steps,
            m.simulated_us / 1e3,
            100.0 * m.error
        ));
    }
    for k in &s.kinds {
        out.push(format!(
            "  {:<22}{:>5} steps  median {:.3} ms",
            k.kind,
            k.steps,
            k.median_us / 1e3
        ));
    }
    out
}
