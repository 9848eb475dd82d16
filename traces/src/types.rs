//! The serializable trace types: one header, one record per engine step, one footer.
//!
//! These mirror engine state but are owned here, not borrowed from specmla-core, so the
//! on-disk format only changes when this file does. Any change to a field (added,
//! removed, reordered, retyped) changes the postcard encoding and must bump
//! [`crate::FORMAT_VERSION`].

use serde::{Deserialize, Serialize};

/// What a run was: everything needed to replay it from scratch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Format version of the file; the writer stamps [`crate::FORMAT_VERSION`].
    pub format_version: u32,
    /// specmla version that wrote the trace (informational, never checked).
    pub tool_version: String,
    /// Scenario name the run used.
    pub scenario: String,
    /// Seed of the run.
    pub seed: u64,
    /// The full engine config as JSON; opaque to this crate.
    pub config_json: String,
    /// Fault switch ids that were on while recording, e.g. `["F1"]`.
    pub faults: Vec<String>,
    /// The acceptance controller's rate per draft position (the last repeats).
    pub acceptance_rates: Vec<f64>,
    /// Whether records carry full per-layer attention outputs in [`StepRecord::tensors`].
    pub trace_tensors: bool,
    /// The requests of the run, in submission order.
    pub workload: Vec<TraceRequest>,
    /// The backend that executed the run: "cpu" or "gpu" (the kind only, so traces of
    /// one seed from two GPUs compare). A replay on the same kind compares bit for bit,
    /// on the other kind within stated tolerances.
    pub backend: String,
    /// The kernel family that decided the bits (version 5): the device's architecture and
    /// the attention path on the GPU (`"sm_90a; bf16 flash decode (flash_decode_seesaw,
    /// running max raised past 2^8); cuBLASLt bf16 GEMMs (...)"`),
    /// `"CPU reference (f32)"` on the CPU. A replay compares bit for bit only where both
    /// the kind and this match.
    pub kernels: String,
    /// The digest scheme every digest of the file follows (version 6):
    /// [`crate::DIGEST_SCHEME`] is FNV-1a-64 as `FORMAT.md` defines it. A reader refuses
    /// another, so a changed digest can never read as a divergence.
    pub digest_scheme: u32,
    /// Whether the recording computed in bf16 (the flash decode's queries and
    /// probabilities, the projections' activations), which widens a cross-kernel
    /// comparison's tolerances (version 5).
    pub bf16_compute: bool,
}

/// One request of the workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Request id.
    pub id: u64,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation budget.
    pub max_new_tokens: u64,
    /// Engine step at which the request arrives.
    pub arrival_step: u64,
    /// Seed of the request's grammar, if it is constrained.
    pub grammar_seed: Option<u64>,
}

/// Which attention kernel path a row took. JSON spells it as everywhere else, `"decode"`
/// or `"prefill"` (a trace stores the variant's index, so the spelling is not recorded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowPath {
    /// Absorbed decode path (split-KV).
    Decode,
    /// Materialized prefill path (causal plus chunked context).
    Prefill,
}

/// One scheduled row of a step's batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRow {
    /// Request id.
    pub req_id: u64,
    /// Tokens already in the KV cache before this step.
    pub num_computed_tokens: u64,
    /// The request's prompt length (the four-region reorder and graph dispatch read it).
    pub num_prompt_tokens: u64,
    /// Tokens scheduled this step (`q_len`).
    pub num_scheduled_tokens: u64,
    /// The scheduled token ids.
    pub token_ids: Vec<u32>,
    /// How many of the scheduled tokens are drafts.
    pub num_draft_tokens: u64,
    /// Whether the row samples this step.
    pub samples: bool,
    /// Next prompt token for a chunked prefill row that does not sample.
    pub next_prompt_token: Option<u32>,
    /// The row's KV block ids.
    pub block_ids: Vec<u32>,
    /// The request's slot in the worker's per-request state (`req_state_idx`).
    pub req_state_idx: u32,
    /// Committed grammar state before this step (`None`: unconstrained or dead).
    pub grammar_state: Option<u32>,
    /// Which kernel path the row took.
    pub path: RowPath,
}

/// Digests of one layer's attention outputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerDigest {
    /// Layer index.
    pub layer: u32,
    /// Rows that took the decode path.
    pub decode_rows: u64,
    /// Rows that took the prefill path.
    pub prefill_rows: u64,
    /// [`crate::digest_f32`] of each planned row's attention output.
    pub per_row: Vec<u64>,
}

/// A draft token the acceptance controller forced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForcedDraft {
    /// Request id.
    pub req_id: u64,
    /// Token position the draft is for.
    pub position: u64,
    /// The forced token.
    pub token: u32,
}

/// Everything observable about one engine step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Engine step index.
    pub step: u64,
    /// The batch as scheduled (scheduler order).
    pub rows: Vec<TraceRow>,
    /// Planned row -> scheduled row index.
    pub order: Vec<u32>,
    /// Requests preempted this step.
    pub preempted: Vec<u64>,
    /// Hash of the plan's metadata.
    pub metadata_digest: u64,
    /// Sampled tokens per planned row (empty for non-sampling rows).
    pub sampled: Vec<Vec<u32>>,
    /// Accepted drafts per planned row.
    pub num_accepted: Vec<u32>,
    /// Tokens committed per planned row.
    pub new_tokens: Vec<Vec<u32>>,
    /// Drafts proposed for the next step, per planned row.
    pub proposals: Vec<Vec<u32>>,
    /// What the acceptance controller forced this step.
    pub forced_drafts: Vec<ForcedDraft>,
    /// Digest of the target logits.
    pub logits_digest: u64,
    /// Digest of the target hidden states.
    pub hidden_digest: u64,
    /// Per-layer attention digests.
    pub layers: Vec<LayerDigest>,
    /// Digest of the drafter's inputs (primary passes) and its proposals.
    pub drafter_digest: u64,
    /// With `trace_tensors`: the step's full attention outputs and logits.
    pub tensors: Option<StepTensors>,
    /// The engine invariants this step's plan violated (version 6), as the run found
    /// them.
    pub violations: Vec<TraceViolation>,
}

/// One invariant a step violated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceViolation {
    /// The invariant's name, as `sim` prints it.
    pub rule: String,
    /// The planned row, when the invariant is about one row.
    pub row: Option<u32>,
    /// What was wrong.
    pub detail: String,
}

/// The full tensors of one step, stored when the header says `trace_tensors`, so a
/// replay on another backend can compare values within a tolerance where digests of
/// exact bits cannot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTensors {
    /// Per layer, the attention output `[tokens, heads * v_head_dim]` flattened
    /// row-major, tokens in plan order (planned row 0's tokens first).
    pub attn_outputs: Vec<Vec<f32>>,
    /// The target logits `[samples, vocab]` flattened row-major: for each planned row
    /// that samples, in plan order, one row per sampled position (1 + its drafts).
    pub logits: Vec<f32>,
}

/// Closes a complete trace; its absence means the run was cut short.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceFooter {
    /// Number of record blocks in the file.
    pub num_records: u64,
    /// FNV-1a-64 over the concatenated postcard payloads of all record blocks.
    pub records_digest: u64,
}
