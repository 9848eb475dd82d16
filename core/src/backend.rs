//! The `Backend` trait both backends implement, and the outputs they return. A backend
//! executes plans built by the core; it never re-derives a scheduling decision.

use crate::cudagraph::GraphShape;
use crate::drafter::{DFlashPass, DrafterPass};
use crate::plan::StepPlan;

/// What one target forward returns. The full tensors stay on the backend's device
/// unless the engine asked for them ([`Backend::set_full_outputs`]); what every step
/// needs on the host is small: the sampled rows' logits and one [`row_digest`] per
/// token, which the checks compare bit for bit and traces record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetOutput {
    /// `[plan.logits_indices.len(), vocab]`.
    pub logits: Vec<f32>,
    /// Per real token, the [`row_digest`] of its final hidden state (before the final
    /// norm).
    pub hidden_digests: Vec<u64>,
    /// Per layer, per real token, the [`row_digest`] of its attention output.
    pub attn_digests: Vec<Vec<u64>>,
    /// The full tensors, present when the engine asked for them.
    pub tensors: Option<TargetTensors>,
    /// Which forward of this backend produced the output: a drafter pass names it to
    /// say whose hidden states it continues from (see [`Backend::forward_drafter`]).
    pub forward_id: u64,
    pub vocab_size: usize,
}

/// The full tensors of one target forward.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetTensors {
    /// Final hidden state of every real token, `[tokens, hidden]`.
    pub hidden: Vec<f32>,
    /// Attention output of every real token per layer, `[layers][tokens, heads * v]`.
    pub attn_outputs: Vec<Vec<f32>>,
    pub hidden_size: usize,
}

impl TargetOutput {
    /// Logits of entry `i` of `logits_indices`.
    pub fn logits_row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab_size..(i + 1) * self.vocab_size]
    }
}

impl TargetTensors {
    /// Hidden state of real token `t`.
    pub fn hidden_row(&self, t: usize) -> &[f32] {
        &self.hidden[t * self.hidden_size..(t + 1) * self.hidden_size]
    }
}

/// What one drafter pass returns: per sampled token (one per row for a multi-step pass,
/// K per row for DFlash), logits and the [`row_digest`] of its hidden state. The hidden
/// states themselves stay with the backend, which carries them to the next pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DrafterOutput {
    pub logits: Vec<f32>,
    pub hidden_digests: Vec<u64>,
    /// Which forward produced it (see [`TargetOutput::forward_id`]).
    pub forward_id: u64,
    pub vocab_size: usize,
}

impl DrafterOutput {
    pub fn logits_row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab_size..(i + 1) * self.vocab_size]
    }
}

/// The digest of one row of f32 values, computable in parallel on a device and equal
/// bit for bit on every backend: each value's bits, tagged with its index, go through
/// SplitMix64's finalizer; the terms add modulo 2^64 (so any reduction order gives the
/// same sum), and the sum, xored with the row's width, is finalized once more. Exact
/// bits matter (0.0 and -0.0, NaN payloads). Two rows that differ in any bit collide
/// with probability about 2^-64: a check comparing digests compares bits.
pub fn row_digest(xs: &[f32]) -> u64 {
    let sum = xs.iter().enumerate().fold(0u64, |acc, (i, x)| {
        let tagged = ((i as u64) << 32) | x.to_bits() as u64;
        acc.wrapping_add(splitmix_finalize(tagged ^ ROW_DIGEST_SALT))
    });
    splitmix_finalize(sum ^ xs.len() as u64)
}

/// [`row_digest`] of each `width`-value row of `xs`.
pub fn row_digests(xs: &[f32], width: usize) -> Vec<u64> {
    if width == 0 {
        return Vec::new();
    }
    xs.chunks(width).map(row_digest).collect()
}

/// The golden-ratio constant SplitMix64 adds per draw; here it keeps an all-zero input
/// from mapping to zero.
pub const ROW_DIGEST_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function (Steele, Lea and Flood, 2014).
pub const fn splitmix_finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The forward ids a backend hands out and the two carries it keeps on its device: the
/// last target forward's hidden states (which every drafter pass of the step reads) and
/// the last drafter pass's (which the next pass reads). A pass naming any other output
/// is refused, so a carry can never be read stale.
#[derive(Clone, Copy, Debug, Default)]
pub struct Carries {
    next_id: u64,
    target: Option<u64>,
    drafter: Option<u64>,
}

impl Carries {
    /// A new target forward: its id, now the target carry.
    pub fn new_target(&mut self) -> u64 {
        self.next_id += 1;
        self.target = Some(self.next_id);
        self.next_id
    }

    /// A new drafter pass: its id, now the drafter carry.
    pub fn new_drafter(&mut self) -> u64 {
        self.next_id += 1;
        self.drafter = Some(self.next_id);
        self.next_id
    }

    /// Whether a pass given `target` (and `prev`) reads the carries this backend holds.
    pub fn check(&self, target: u64, prev: Option<u64>) -> Result<(), String> {
        if self.target != Some(target) {
            return Err(format!(
                "a drafter pass given target forward {target}, but the hidden states carried                  are forward {:?}'s",
                self.target
            ));
        }
        match prev {
            Some(p) if self.drafter != Some(p) => Err(format!(
                "a drafter pass given drafter forward {p}, but the hidden states carried are                  forward {:?}'s",
                self.drafter
            )),
            _ => Ok(()),
        }
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

    /// Whether forwards return their full tensors ([`TargetOutput::tensors`]): traces
    /// that store tensors ask for them; otherwise they stay on the device.
    fn set_full_outputs(&mut self, on: bool);

    /// Captures (or emulates capturing) uniform-decode graphs of these shapes.
    fn capture_graphs(&mut self, shapes: &[GraphShape]) -> Result<(), Self::Error>;

    /// Writes latent KV for every token at its slot, runs decode rows through the decode
    /// path and prefill rows through the prefill path, returns logits and hidden states.
    fn forward_target(&mut self, plan: &StepPlan) -> Result<TargetOutput, Self::Error>;

    /// Runs one multi-step drafter pass over the drafter cache. Its hidden inputs come
    /// from the backend's carries: `target`'s hidden states (sources `TargetToken`) and
    /// `prev`'s, the previous pass's (sources `DrafterRow`). Both must be the latest of
    /// their kind this backend produced ([`Carries`]), or the pass is refused.
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

#[cfg(test)]
mod tests {
    use super::*;

    // Computed independently (Python: struct.pack("<f") bits, the same finalizer).
    #[test]
    fn row_digest_known_answers_are_pinned() {
        assert_eq!(row_digest(&[]), 0);
        assert_eq!(row_digest(&[1.0, -2.5, 0.0]), 0x7598_82af_e6bb_6cb1);
        assert_eq!(row_digest(&[-0.0]), 0x428a_4ad8_05aa_cbff);
    }

    #[test]
    fn row_digest_sees_every_bit_and_every_position() {
        assert_ne!(row_digest(&[0.0]), row_digest(&[-0.0]));
        let (a, b) = (f32::from_bits(0x7fc0_0000), f32::from_bits(0x7fc0_0001));
        assert_ne!(row_digest(&[a]), row_digest(&[b]));
        assert_ne!(row_digest(&[1.0, 2.0]), row_digest(&[2.0, 1.0]));
        assert_ne!(row_digest(&[0.0]), row_digest(&[0.0, 0.0]));
        let row: Vec<f32> = (0..512).map(|i| i as f32 * 0.37).collect();
        for i in [0, 17, 511] {
            let mut other = row.clone();
            other[i] = f32::from_bits(other[i].to_bits() ^ 1);
            assert_ne!(row_digest(&row), row_digest(&other), "bit 0 of value {i}");
        }
    }

    #[test]
    fn carries_refuse_a_stale_output() {
        let mut c = Carries::default();
        let t1 = c.new_target();
        let t2 = c.new_target();
        assert!(c.check(t1, None).is_err());
        assert!(c.check(t2, None).is_ok());
        let d1 = c.new_drafter();
        let d2 = c.new_drafter();
        assert!(c.check(t2, Some(d1)).is_err());
        assert!(c.check(t2, Some(d2)).is_ok());
    }
}
