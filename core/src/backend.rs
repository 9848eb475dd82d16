//! The `Backend` trait both backends implement, and the outputs they return. A backend
//! executes plans built by the core; it never re-derives a scheduling decision.

use crate::cudagraph::GraphShape;
use crate::drafter::{DFlashPass, DrafterPass};
use crate::plan::StepPlan;

/// What one target forward returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetOutput {
    /// `[plan.logits_indices.len(), vocab]`.
    pub logits: Vec<f32>,
    /// Final hidden state (before the final norm) of every real token, `[tokens, hidden]`.
    pub hidden: Vec<f32>,
    /// Attention output of every real token per layer, `[layers][tokens, heads * v]`.
    pub attn_outputs: Vec<Vec<f32>>,
    pub vocab_size: usize,
    pub hidden_size: usize,
}

impl TargetOutput {
    /// Logits of entry `i` of `logits_indices`.
    pub fn logits_row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab_size..(i + 1) * self.vocab_size]
    }
    /// Hidden state of real token `t`.
    pub fn hidden_row(&self, t: usize) -> &[f32] {
        &self.hidden[t * self.hidden_size..(t + 1) * self.hidden_size]
    }
}

/// What one drafter pass returns: per sampled token (one per row for a multi-step pass,
/// K per row for DFlash), logits and hidden state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DrafterOutput {
    pub logits: Vec<f32>,
    pub hidden: Vec<f32>,
    pub vocab_size: usize,
    pub hidden_size: usize,
}

impl DrafterOutput {
    pub fn logits_row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab_size..(i + 1) * self.vocab_size]
    }
    pub fn hidden_row(&self, i: usize) -> &[f32] {
        &self.hidden[i * self.hidden_size..(i + 1) * self.hidden_size]
    }
}

/// Where one step's time went on a backend that times itself (the GPU's), in
/// microseconds: the host wall time of the step's forwards (target and drafters; the
/// engine's check-only re-runs left out), the device time from the first to the last
/// of each forward's device work, and the share of it inside attention launches, inside
/// GEMMs and inside replayed CUDA graphs (whose attention and GEMMs are not split).
/// Measured, so never recorded in a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTime {
    pub wall_us: f64,
    pub device_us: f64,
    pub attention_us: f64,
    pub gemm_us: f64,
    pub graph_us: f64,
}

impl StepTime {
    /// Adds `o`'s times to these.
    pub fn add(&mut self, o: &StepTime) {
        self.wall_us += o.wall_us;
        self.device_us += o.device_us;
        self.attention_us += o.attention_us;
        self.gemm_us += o.gemm_us;
        self.graph_us += o.graph_us;
    }
}

/// A device that runs target and drafter forwards from core-built plans. Besides the
/// forwards, a backend states the device contract the harness and replay rely on: the
/// kind a trace records, the device a report names, and which of its errors are the
/// environment's.
pub trait Backend {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The kind recorded in trace headers: `"cpu"` or `"gpu"`. Only the kind, so traces
    /// of one seed from two machines of the same kind compare bit for bit.
    const KIND: &'static str;

    /// The device, for reports (never recorded in a trace).
    fn device_name(&self) -> String;

    /// The fingerprint of the kernel family that decides this backend's bits (the
    /// device's architecture and attention path; never the device's name). A trace
    /// records it, and a replay promises bit-for-bit equality only where it matches.
    fn kernels(&self) -> String {
        Self::KIND.to_string()
    }

    /// Whether `e` is the environment's (no GPU, no driver, no compiler, out of device
    /// memory: exit 2) rather than the engine's (a failed run: exit 1).
    fn is_environment(e: &Self::Error) -> bool;

    /// Whether this backend's kernels take these model dimensions. Callers check before
    /// building the backend, so a config or a trace beyond them is refused in one line
    /// (exit 2) rather than failing inside a kernel launch.
    fn check_dims(_dims: &crate::config::ModelDims) -> Result<(), String> {
        Ok(())
    }

    /// Whether this backend computes in bf16 as a production engine does: attention that
    /// rounds its queries and softmax probabilities to bf16 (FlashMLA's P·V product is a
    /// bf16 GEMM) and projections that take bf16 activations. The harness then widens its
    /// tolerances (`Tolerances::for_run`).
    fn bf16_compute(&self) -> bool {
        false
    }

    /// What this backend keeps in host memory for `cfg` (the CPU backend: its caches); a
    /// device backend checks its device allocations against the device's free memory
    /// when it is built.
    fn host_allocations(_cfg: &crate::config::EngineConfig) -> Vec<crate::memory::Allocation> {
        Vec::new()
    }

    /// The engine calls this with `true` before the forwards it runs only to check a
    /// property (the other row layout, the other drafter batch mode) and with `false`
    /// after, so a backend that times its steps leaves them out.
    fn set_check_forwards(&mut self, _on: bool) {}

    /// The time of the forwards since the last call (see [`StepTime`]), on a backend
    /// that measures it; `None` on one that does not (the CPU's).
    fn take_step_time(&mut self) -> Option<StepTime> {
        None
    }

    /// Captures (or emulates capturing) uniform-decode graphs of these shapes.
    fn capture_graphs(&mut self, shapes: &[GraphShape]) -> Result<(), Self::Error>;

    /// Writes latent KV for every token at its slot, runs decode rows through the decode
    /// path and prefill rows through the prefill path, returns logits and hidden states.
    fn forward_target(&mut self, plan: &StepPlan) -> Result<TargetOutput, Self::Error>;

    /// Runs one multi-step drafter pass over the drafter cache. `prev` is the previous
    /// pass's output (hidden sources `DrafterRow`).
    fn forward_drafter(
        &mut self,
        pass: &DrafterPass,
        target: &TargetOutput,
        prev: Option<&DrafterOutput>,
    ) -> Result<DrafterOutput, Self::Error>;

    /// Runs the DFlash block pass; returns K sampled positions per row (offsets 1..=K).
    fn forward_dflash(
        &mut self,
        pass: &DFlashPass,
        target: &TargetOutput,
    ) -> Result<DrafterOutput, Self::Error>;
}
