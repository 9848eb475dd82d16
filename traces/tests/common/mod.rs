//! Shared fixtures for the trace tests: deterministic sample traces, proptest
//! strategies for every trace type, and an outcome summary of reading arbitrary bytes.
#![allow(dead_code)] // each test binary uses a different subset

use proptest::collection::vec;
use proptest::prelude::*;
use specmla_traces::{
    ForcedDraft, LayerDigest, RowPath, StepRecord, StepTensors, TraceError, TraceHeader,
    TraceReader, TraceRequest, TraceRow, TraceViolation, TraceWriter, FORMAT_VERSION,
};

/// A small fixed header.
pub fn sample_header() -> TraceHeader {
    TraceHeader {
        format_version: FORMAT_VERSION,
        tool_version: "0.1.0".into(),
        scenario: "mixed_mtp".into(),
        seed: 7,
        config_json: r#"{"k":3,"page":16}"#.into(),
        faults: vec!["F1".into()],
        acceptance_rates: vec![0.75],
        trace_tensors: true,
        workload: vec![TraceRequest {
            id: 0,
            prompt: vec![1, 2, 3, 4],
            max_new_tokens: 8,
            arrival_step: 0,
            grammar_seed: Some(3),
        }],
        backend: "cpu".into(),
        kernels: "CPU reference (f32)".into(),
        digest_scheme: specmla_traces::DIGEST_SCHEME,
        bf16_compute: false,
    }
}

/// A small fixed record whose contents depend on `step`.
pub fn sample_record(step: u64) -> StepRecord {
    let s = step as u32;
    StepRecord {
        step,
        rows: vec![TraceRow {
            req_id: step % 3,
            num_computed_tokens: step * 4,
            num_prompt_tokens: 3 + step % 7,
            num_scheduled_tokens: 4,
            token_ids: vec![s, s + 1, s + 2, s + 3],
            num_draft_tokens: 3,
            samples: true,
            next_prompt_token: None,
            block_ids: vec![s, 9],
            req_state_idx: s % 3,
            grammar_state: Some(s % 5),
            path: if step & 1 == 0 {
                RowPath::Decode
            } else {
                RowPath::Prefill
            },
        }],
        order: vec![0],
        preempted: vec![],
        metadata_digest: step.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        sampled: vec![vec![s, s + 7]],
        num_accepted: vec![1],
        new_tokens: vec![vec![s + 7]],
        proposals: vec![vec![1, 2, 3]],
        forced_drafts: vec![ForcedDraft {
            req_id: 0,
            position: step,
            token: 42,
        }],
        logits_digest: step ^ 0xabcd,
        hidden_digest: step ^ 0x1234,
        layers: vec![LayerDigest {
            layer: 0,
            decode_rows: 1,
            prefill_rows: 0,
            per_row: vec![step],
        }],
        drafter_digest: 5,
        tensors: Some(StepTensors {
            attn_outputs: vec![vec![step as f32, -0.5, 1e-3]],
            logits: vec![0.25, -(step as f32)],
        }),
        violations: if step == 1 {
            vec![TraceViolation {
                rule: "split_schedule".into(),
                row: Some(0),
                detail: "a stale schedule".into(),
            }]
        } else {
            vec![]
        },
    }
}

/// `n` sample records.
pub fn sample_records(n: u64) -> Vec<StepRecord> {
    (0..n).map(sample_record).collect()
}

/// A complete trace in memory, with the byte offset where each block ends:
/// `ends[0]` is the end of the header, `ends[i + 1]` the end of record `i`.
pub fn encode(header: &TraceHeader, records: &[StepRecord]) -> (Vec<u8>, Vec<usize>) {
    let mut w = TraceWriter::new(Vec::new(), header).expect("header encodes");
    let mut ends = vec![w.get_ref().len()];
    for r in records {
        w.write_step(r).expect("record encodes");
        ends.push(w.get_ref().len());
    }
    (w.finish().expect("footer encodes"), ends)
}

/// What reading a byte string gave.
#[derive(Debug)]
pub struct Outcome {
    /// The header, if it validated.
    pub header: Option<TraceHeader>,
    /// Records returned before the end or the error.
    pub records: Vec<StepRecord>,
    /// The error that stopped reading, if any.
    pub error: Option<TraceError>,
    /// Whether the reader reported truncation.
    pub truncated: bool,
}

/// Reads `bytes` with the streaming reader; `known_len` passes the length on.
pub fn read_outcome(bytes: &[u8], known_len: bool) -> Outcome {
    let total = known_len.then_some(bytes.len() as u64);
    let mut reader = match TraceReader::new(bytes, total) {
        Ok(r) => r,
        Err(e) => {
            return Outcome {
                header: None,
                records: vec![],
                error: Some(e),
                truncated: false,
            }
        }
    };
    let mut records = vec![];
    let mut error = None;
    loop {
        match reader.next_step() {
            Ok(Some(r)) => records.push(r),
            Ok(None) => break,
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    // A finished reader stays finished.
    assert!(matches!(reader.next_step(), Ok(None)));
    Outcome {
        header: Some(reader.header().clone()),
        records,
        error,
        truncated: reader.is_truncated(),
    }
}

/// Arbitrary finite f64 (NaN is tested separately: it is not `PartialEq` to itself).
fn finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(-0.0), Just(1.0), -1e9f64..1e9]
}

/// Arbitrary finite f32.
fn finite_f32() -> impl Strategy<Value = f32> {
    prop_oneof![Just(-0.0f32), Just(f32::MIN_POSITIVE / 2.0), -1e30f32..1e30]
}

/// Arbitrary short strings, including non-ASCII ones.
fn short_string() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_\\-{}\":,é😀]{0,24}"
}

fn small_u32s() -> impl Strategy<Value = Vec<u32>> {
    vec(any::<u32>(), 0..6)
}

fn request() -> impl Strategy<Value = TraceRequest> {
    (
        any::<u64>(),
        small_u32s(),
        any::<u64>(),
        any::<u64>(),
        any::<Option<u64>>(),
    )
        .prop_map(
            |(id, prompt, max_new_tokens, arrival_step, grammar_seed)| TraceRequest {
                id,
                prompt,
                max_new_tokens,
                arrival_step,
                grammar_seed,
            },
        )
}

/// Arbitrary headers (with the current format version, which the writer stamps).
pub fn header() -> impl Strategy<Value = TraceHeader> {
    (
        short_string(),
        short_string(),
        any::<u64>(),
        short_string(),
        vec(short_string(), 0..3),
        finite_f64(),
        any::<bool>(),
        vec(request(), 0..4),
        prop_oneof![Just("cpu".to_string()), Just("gpu".to_string())],
        short_string(),
        any::<bool>(),
    )
        .prop_map(
            |(
                tool_version,
                scenario,
                seed,
                config_json,
                faults,
                rate,
                tensors,
                workload,
                backend,
                kernels,
                bf16_compute,
            )| {
                TraceHeader {
                    format_version: FORMAT_VERSION,
                    tool_version,
                    scenario,
                    seed,
                    config_json,
                    faults,
                    acceptance_rates: vec![rate],
                    trace_tensors: tensors,
                    workload,
                    backend,
                    kernels,
                    digest_scheme: specmla_traces::DIGEST_SCHEME,
                    bf16_compute,
                }
            },
        )
}

fn row() -> impl Strategy<Value = TraceRow> {
    (
        (any::<u64>(), any::<u64>(), any::<u64>()),
        small_u32s(),
        any::<u64>(),
        any::<bool>(),
        any::<Option<u32>>(),
        small_u32s(),
        any::<Option<u32>>(),
        prop_oneof![Just(RowPath::Decode), Just(RowPath::Prefill)],
    )
        .prop_map(
            |((req_id, computed, scheduled), token_ids, drafts, samples, next, blocks, g, path)| {
                TraceRow {
                    req_id,
                    num_computed_tokens: computed,
                    num_prompt_tokens: computed ^ scheduled,
                    num_scheduled_tokens: scheduled,
                    token_ids,
                    num_draft_tokens: drafts,
                    samples,
                    next_prompt_token: next,
                    block_ids: blocks,
                    req_state_idx: req_id as u32,
                    grammar_state: g,
                    path,
                }
            },
        )
}

fn layer() -> impl Strategy<Value = LayerDigest> {
    (
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        vec(any::<u64>(), 0..4),
    )
        .prop_map(|(layer, decode_rows, prefill_rows, per_row)| LayerDigest {
            layer,
            decode_rows,
            prefill_rows,
            per_row,
        })
}

fn forced() -> impl Strategy<Value = ForcedDraft> {
    (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(req_id, position, token)| ForcedDraft {
        req_id,
        position,
        token,
    })
}

/// Arbitrary step records.
pub fn record() -> impl Strategy<Value = StepRecord> {
    let nested = || vec(small_u32s(), 0..3);
    (
        (
            any::<u64>(),
            vec(row(), 0..3),
            small_u32s(),
            vec(any::<u64>(), 0..3),
        ),
        (any::<u64>(), nested(), small_u32s(), nested(), nested()),
        (vec(forced(), 0..3), any::<u64>(), any::<u64>()),
        (vec(layer(), 0..3), any::<u64>()),
        proptest::option::of(
            (vec(vec(finite_f32(), 0..8), 0..3), vec(finite_f32(), 0..8)).prop_map(
                |(attn_outputs, logits)| StepTensors {
                    attn_outputs,
                    logits,
                },
            ),
        ),
        vec(violation(), 0..3),
    )
        .prop_map(
            |(
                (step, rows, order, preempted),
                (metadata_digest, sampled, num_accepted, new_tokens, proposals),
                (forced_drafts, logits_digest, hidden_digest),
                (layers, drafter_digest),
                tensors,
                violations,
            )| StepRecord {
                step,
                rows,
                order,
                preempted,
                metadata_digest,
                sampled,
                num_accepted,
                new_tokens,
                proposals,
                forced_drafts,
                logits_digest,
                hidden_digest,
                layers,
                drafter_digest,
                tensors,
                violations,
            },
        )
}

fn violation() -> impl Strategy<Value = TraceViolation> {
    (
        "[a-z_]{1,12}",
        proptest::option::of(any::<u32>()),
        ".{0,24}",
    )
        .prop_map(|(rule, row, detail)| TraceViolation { rule, row, detail })
}
