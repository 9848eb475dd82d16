//! A calibrated cost model of engine steps (`sim --cost-model`). A calibration file holds
//! what `gpu-bench --calibrate` measured on one device: the decode and prefill attention
//! kernels over shape grids, the GEMMs at DeepSeek-V3's shapes (the MoE experts' included)
//! and the host's share of a step, each kernel class fitted to an additive roofline
//! ([`fit`]). [`step`] turns one step the core planned (its rows, its drafter passes) into
//! the launches a rank of a [`CostTarget`] makes and prices them. Pure: no I/O, the file
//! is parsed by the caller.
//!
//! How a rank is modelled: attention, `q_b` and `o_proj` by head (`heads / tp`); `q_a` and
//! `kv_a` replicated; the dense MLP, the shared experts and the LM head sharded `tp` ways;
//! the routed experts spread over the ranks (expert parallel), routing uniform; two
//! all-reduces of the hidden states per layer, priced from the calibration's
//! `allreduce` line (an assumption the file states: one GPU cannot measure it). Launches
//! run back to back on one stream; what no class prices (the host's share, the small
//! kernels) is added per step as the fitted residual of whole measured engine steps.

pub mod fit;
pub mod step;

use serde::{Deserialize, Serialize};

use crate::config::ModelDims;
use crate::error::ConfigError;
pub use fit::{Fit, Sample};
pub use step::{drafter_passes, step_cost, StepCost};

/// The calibration format this build reads.
pub const CALIBRATION_FORMAT: u32 = 1;

/// One kernel class: its measured samples and their fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelClass {
    pub fit: Fit,
    pub samples: Vec<Sample>,
}

impl KernelClass {
    /// Fits `samples`.
    pub fn fitted(samples: Vec<Sample>) -> Result<Self, String> {
        Ok(Self {
            fit: Fit::of(&samples)?,
            samples,
        })
    }

    /// Median and largest relative error of the fit over its own samples.
    pub fn fit_errors(&self) -> (f64, f64) {
        fit::median_and_max_abs(&self.fit.rel_errors(&self.samples))
    }

    /// The time of a GEMM `[m, k] x [k, n]` from the samples timed at the same `(k, n)`,
    /// piecewise linear in M between them (a pinned algorithm's time is flat in M while
    /// its tiles fit one wave, then grows with the waves, which one additive fit cannot
    /// follow across shapes: it misses narrow GEMMs by 40%). Below the smallest M timed,
    /// that M's time; above the largest, its time scaled by the fit's ratio. `None` where
    /// the calibration did not time the shape: the caller falls back on the fit. An M
    /// timed twice keeps its smaller time.
    pub fn gemm_table_us(&self, m: usize, k: usize, n: usize) -> Option<f64> {
        let mut pts: Vec<(usize, f64)> = self
            .samples
            .iter()
            .filter_map(|s| match s.gemm_mkn {
                Some([sm, sk, sn]) if sk == k && sn == n => Some((sm, s.us)),
                _ => None,
            })
            .collect();
        pts.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        pts.dedup_by_key(|p| p.0);
        let (&(m0, t0), &(m1, t1)) = (pts.first()?, pts.last()?);
        if m <= m0 {
            return Some(t0);
        }
        if m >= m1 {
            let fit_at = |m: usize| {
                let (b, f, u) = step::gemm_size(m, k, n, 1);
                self.fit.us(b, f, u)
            };
            return Some(t1 * fit_at(m) / fit_at(m1));
        }
        let i = pts.partition_point(|p| p.0 <= m);
        let ((ma, ta), (mb, tb)) = (pts[i - 1], pts[i]);
        Some(ta + (tb - ta) * (m - ma) as f64 / (mb - ma) as f64)
    }
}

/// A kernel class measured at one head count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadsClass {
    pub heads: usize,
    pub class: KernelClass,
}

/// The class measured nearest `heads` (by ratio; a tie takes the larger count).
pub fn nearest_heads(classes: &[HeadsClass], heads: usize) -> &KernelClass {
    let dist = |h: &HeadsClass| ((h.heads as f64) / (heads.max(1) as f64)).ln().abs();
    let best = classes
        .iter()
        .min_by(|a, b| dist(a).total_cmp(&dist(b)).then(b.heads.cmp(&a.heads)))
        .expect("a calibration has a class per kernel");
    &best.class
}

/// What a step costs beyond the launches the kernel classes price: the host's share
/// (wall time the device idles), and the small kernels (norms, RoPE, conversions, copies,
/// sampling) no class covers. Measured as the residual of whole engine steps, wall time
/// less the kernel classes' price of the same step, and fitted per step kind as
/// `step_us + layer_us * layers + pass_us * drafter passes + token_us * tokens` (the
/// target's scheduled tokens: the host builds, uploads and verifies per token).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    /// Target forwards replayed from CUDA graphs.
    pub graph: OverheadFit,
    /// Eager target forwards.
    pub eager: OverheadFit,
    /// The medians the fits were made from, one per measured configuration and kind.
    pub samples: Vec<OverheadSample>,
}

/// `step_us + layer_us * layers + pass_us * passes + token_us * tokens`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OverheadFit {
    pub step_us: f64,
    pub layer_us: f64,
    pub pass_us: f64,
    pub token_us: f64,
}

impl OverheadFit {
    pub fn us(&self, layers: usize, passes: usize, tokens: usize) -> f64 {
        self.step_us
            + self.layer_us * layers as f64
            + self.pass_us * passes as f64
            + self.token_us * tokens as f64
    }

    /// The non-negative fit over `samples` (all of one kind); zero where there are none
    /// or no residual is positive.
    pub fn of(samples: &[&OverheadSample]) -> Self {
        let rows: Vec<([f64; 4], f64)> = samples
            .iter()
            .filter(|s| s.us > 0.0)
            .map(|s| {
                let x = [1.0, s.layers as f64, s.passes as f64, s.tokens as f64];
                (x, s.us)
            })
            .collect();
        match fit::nonneg_relative_lsq(&rows) {
            Some(c) => Self {
                step_us: c[0],
                layer_us: c[1],
                pass_us: c[2],
                token_us: c[3],
            },
            None => Self::default(),
        }
    }
}

/// One measured configuration's median residual for one step kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OverheadSample {
    pub label: String,
    pub graph: bool,
    pub layers: usize,
    pub passes: usize,
    /// The target's scheduled tokens (the median step's).
    pub tokens: usize,
    /// Median over the configuration's steps of this kind of wall time less the kernel
    /// classes' price (may be negative where the classes over-price).
    pub us: f64,
    pub steps: usize,
}

impl Overhead {
    /// Fits both kinds from `samples`.
    pub fn fitted(samples: Vec<OverheadSample>) -> Self {
        let of = |graph: bool| {
            let v: Vec<&OverheadSample> = samples.iter().filter(|s| s.graph == graph).collect();
            OverheadFit::of(&v)
        };
        Self {
            graph: of(true),
            eager: of(false),
            samples,
        }
    }
}

/// The all-reduce between tensor-parallel ranks: `latency_us + 2 (tp - 1) / tp * bytes /
/// bus bandwidth` (the ring all-reduce's bus traffic).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllReduce {
    pub latency_us: f64,
    pub bus_gb_per_s: f64,
    /// Where the numbers come from (measured, or an assumption and its source).
    pub source: String,
}

/// What `gpu-bench --calibrate` measured on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub format: u32,
    /// The device, as the backend names it.
    pub device: String,
    /// The commit the calibrating binary was built from.
    pub commit: String,
    /// The flash decode (one launch per layer over the decode rows), by head count (the
    /// kernel family and its row padding change with it).
    pub decode: Vec<HeadsClass>,
    /// The TMA prefill (causal over new tokens, non-causal over context), by head count.
    pub prefill: Vec<HeadsClass>,
    /// The cuBLASLt GEMMs (pinned algorithms), bf16.
    pub gemm: KernelClass,
    /// The f32-to-bf16 conversion of a GEMM's input (bytes read and written), which this
    /// engine runs before each projection (its activations are f32).
    pub convert: KernelClass,
    pub overhead: Overhead,
    pub allreduce: AllReduce,
}

impl Calibration {
    /// Parses and checks a calibration file: the format this build reads, finite
    /// non-negative numbers, and each class's fit equal to a refit of its samples (a file
    /// edited by hand would otherwise price steps from numbers nobody measured).
    pub fn from_json(text: &str) -> Result<Self, String> {
        let c: Calibration =
            serde_json::from_str(text).map_err(|e| format!("not a calibration file: {e}"))?;
        if c.format != CALIBRATION_FORMAT {
            return Err(format!(
                "calibration format {} (this build reads {CALIBRATION_FORMAT})",
                c.format
            ));
        }
        if c.decode.is_empty() || c.prefill.is_empty() {
            return Err("no decode or prefill class".into());
        }
        let by_heads = |name: &str, v: &[HeadsClass]| {
            v.iter()
                .map(|h| (format!("{name} at {} heads", h.heads), h.class.clone()))
                .collect::<Vec<_>>()
        };
        let mut classes = by_heads("decode", &c.decode);
        classes.extend(by_heads("prefill", &c.prefill));
        classes.push(("gemm".into(), c.gemm.clone()));
        classes.push(("convert".into(), c.convert.clone()));
        for (name, k) in &classes {
            let refit = Fit::of(&k.samples).map_err(|e| format!("{name}: {e}"))?;
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1e-9);
            if !(close(refit.overhead_us, k.fit.overhead_us)
                && close(refit.us_per_gb, k.fit.us_per_gb)
                && close(refit.us_per_tflop, k.fit.us_per_tflop)
                && close(refit.us_per_kcta, k.fit.us_per_kcta))
            {
                return Err(format!("{name}: the fit does not match its samples"));
            }
        }
        if Overhead::fitted(c.overhead.samples.clone()) != c.overhead {
            return Err("overhead: the fits do not match their samples".into());
        }
        let a = &c.allreduce;
        if !(a.latency_us.is_finite() && a.latency_us >= 0.0 && a.bus_gb_per_s > 0.0) {
            return Err("all-reduce: latency must be non-negative and bandwidth positive".into());
        }
        Ok(c)
    }

    /// The file's text (pretty JSON).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a calibration serializes")
    }
}

/// DeepSeek-V3's mixture of experts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Moe {
    /// Layers before the first MoE layer (dense MLP of the model's `intermediate_size`).
    pub first_dense_layers: usize,
    pub routed_experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate: usize,
    pub shared_experts: usize,
}

impl Moe {
    /// DeepSeek-V3's (config.json: `first_k_dense_replace` 3, `n_routed_experts` 256,
    /// `num_experts_per_tok` 8, `moe_intermediate_size` 2048, `n_shared_experts` 1).
    pub fn deepseek_v3() -> Self {
        Self {
            first_dense_layers: 3,
            routed_experts: 256,
            experts_per_token: 8,
            expert_intermediate: 2048,
            shared_experts: 1,
        }
    }
}

/// The model one rank runs, priced per step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostTarget {
    pub name: String,
    /// One rank's widths: `num_heads` already divided by `tp`.
    pub rank_dims: ModelDims,
    /// Ranks: shard the dense MLP, the shared experts and the LM head, spread the routed
    /// experts, and all-reduce twice per layer (1: none of these).
    pub tp: usize,
    pub moe: Option<Moe>,
    /// Activations in f32, converted to bf16 before each projection (this engine); an
    /// engine serving DeepSeek-V3 keeps them bf16.
    pub f32_activations: bool,
    /// The projections' and experts' weights in FP8 (DeepSeek-V3's released format)
    /// instead of bf16: priced from the bf16 calibration by the additive fit's ratio at
    /// half the weight bytes and half the flops (FP8 tensor cores run twice as fast), an
    /// assumption no measurement here checks. The LM head and the absorbed per-head
    /// W_UK / W_UV stay bf16.
    #[serde(default)]
    pub fp8_weights: bool,
}

impl CostTarget {
    /// What a `sim` run executes on one device: its own model, `--tp` dividing the heads
    /// only (the engine runs one rank's attention and the whole small MLP, no all-reduce).
    pub fn engine(rank_dims: &ModelDims) -> Self {
        Self {
            name: "the run's model on one device".into(),
            rank_dims: rank_dims.clone(),
            tp: 1,
            moe: None,
            f32_activations: true,
            fp8_weights: false,
        }
    }

    /// One rank of full-depth DeepSeek-V3 (61 layers, MoE, vocabulary 129,280) at `tp`.
    pub fn deepseek_v3(tp: usize) -> Result<Self, ConfigError> {
        Ok(Self {
            name: format!("DeepSeek-V3, 61 layers, one rank of tp {tp}"),
            rank_dims: ModelDims::deepseek_v3().tensor_parallel(tp)?,
            tp,
            moe: Some(Moe::deepseek_v3()),
            f32_activations: false,
            fp8_weights: false,
        })
    }

    /// [`Self::deepseek_v3`] with FP8 projection and expert weights (see `fp8_weights`).
    pub fn deepseek_v3_fp8(tp: usize) -> Result<Self, ConfigError> {
        Ok(Self {
            name: format!("DeepSeek-V3 (FP8 weights), 61 layers, one rank of tp {tp}"),
            fp8_weights: true,
            ..Self::deepseek_v3(tp)?
        })
    }
}

#[cfg(test)]
mod tests;
