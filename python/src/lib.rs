//! The `specmla` Python package's native module: the core's planning rules with vLLM's
//! names and semantics, so an engine's own tests can call the reference where their
//! metadata is built. Inputs are lists, tuples, numpy arrays or anything with
//! `.tolist()` (torch tensors), read without importing either library. Bad input raises
//! `ValueError` or `TypeError` naming the argument; every rule runs behind a panic guard,
//! so a Rust panic never crosses into Python.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBool;
use pyo3::types::{PyDict, PyList};
use specmla_core::audit::{
    audit as audit_log, ChunkedContextLog, DFlashLog, DrafterPassLog, GraphLog, SpecDecodeLog,
    StepLog,
};
use specmla_core::config::DrafterBatch;
use specmla_core::config::{BackendProfile, Planner, RowLayout};
use specmla_core::reorder::{reorder, split, RowShape, SplitInput};
use specmla_sim::plan_explain::{explain_batch, PlanOptions};

/// `obj` as a Python list of items: `.tolist()` first where it has one (numpy arrays,
/// torch tensors), then any sequence.
fn items<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let obj = if obj.hasattr("tolist")? {
        obj.call_method0("tolist")?
    } else {
        obj.clone()
    };
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(PyTypeError::new_err(format!(
            "{name}: expected a sequence of integers, got a string"
        )));
    }
    let seq = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name}: expected a sequence, got {}",
            type_name(&obj)
        ))
    })?;
    seq.collect()
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// A non-negative integer (not a bool, not a float), named `name` in errors.
fn count(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<pyo3::types::PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name}: expected an integer, got {}",
            type_name(obj)
        )));
    }
    let v: i128 = obj
        .extract()
        .map_err(|_| PyValueError::new_err(format!("{name}: an integer out of range")))?;
    if v < 0 {
        return Err(PyValueError::new_err(format!("{name}: {v} is negative")));
    }
    usize::try_from(v)
        .ok()
        .filter(|&n| n <= u32::MAX as usize)
        .ok_or_else(|| PyValueError::new_err(format!("{name}: {v} is out of range")))
}

/// [`count`] of `obj`, or `default` where it is None (an argument left out).
fn count_or(obj: Option<&Bound<'_, PyAny>>, name: &str, default: usize) -> PyResult<usize> {
    obj.filter(|o| !o.is_none())
        .map_or(Ok(default), |o| count(o, name))
}

/// A sequence of non-negative integers; element `i` is named `name[i]` in errors.
fn counts(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<usize>> {
    if let Some(v) = fast_ints(obj)? {
        if v.iter().all(|&x| (0..=u32::MAX as i64).contains(&x)) {
            return Ok(v.into_iter().map(|x| x as usize).collect());
        }
    }
    items(obj, name)?
        .iter()
        .enumerate()
        .map(|(i, x)| count(x, &format!("{name}[{i}]")))
        .collect()
}

/// The integers of `obj` read without a Python call per element, where it is a list of
/// plain ints (bools excluded) or a numpy-like array of an integer dtype (torch tensors
/// through `.numpy()`); `None` sends the caller to the element-by-element reader, whose
/// errors name the element.
fn fast_ints(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<i64>>> {
    if let Ok(list) = obj.downcast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for x in list.iter() {
            match x.downcast_exact::<pyo3::types::PyInt>() {
                Ok(i) => match i.extract::<i64>() {
                    Ok(v) => out.push(v),
                    Err(_) => return Ok(None),
                },
                Err(_) => return Ok(None),
            }
        }
        return Ok(Some(out));
    }
    Ok(array_ints(obj)?.map(|(v, _)| v))
}

/// A numpy-like integer array's values and shape, from its bytes (little-endian
/// machines; the dtype says the width). Torch tensors go through `.numpy()`.
fn array_ints(obj: &Bound<'_, PyAny>) -> PyResult<Option<(Vec<i64>, Vec<usize>)>> {
    let arr = if !obj.hasattr("dtype")? {
        return Ok(None);
    } else if obj.hasattr("tobytes")? {
        obj.clone()
    } else if obj.hasattr("numpy")? {
        match obj.call_method0("numpy") {
            Ok(a) if a.hasattr("tobytes")? => a,
            _ => return Ok(None),
        }
    } else {
        return Ok(None);
    };
    let dtype = arr.getattr("dtype")?;
    let kind: String = dtype.getattr("kind")?.extract()?;
    let size: usize = dtype.getattr("itemsize")?.extract()?;
    let order: String = dtype.getattr("byteorder")?.extract()?;
    if !matches!(kind.as_str(), "i" | "u") || order == ">" || !cfg!(target_endian = "little") {
        return Ok(None);
    }
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    let bytes = arr.call_method0("tobytes")?;
    let b = bytes.downcast::<pyo3::types::PyBytes>()?.as_bytes();
    fn le<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        b.chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks of N")))
            .collect()
    }
    let v: Option<Vec<i64>> = match (kind.as_str(), size) {
        ("i", 1) => Some(le(b, |c: [u8; 1]| i8::from_le_bytes(c) as i64)),
        ("i", 2) => Some(le(b, |c: [u8; 2]| i16::from_le_bytes(c) as i64)),
        ("i", 4) => Some(le(b, |c: [u8; 4]| i32::from_le_bytes(c) as i64)),
        ("i", 8) => Some(le(b, i64::from_le_bytes)),
        ("u", 1) => Some(le(b, |c: [u8; 1]| c[0] as i64)),
        ("u", 2) => Some(le(b, |c: [u8; 2]| u16::from_le_bytes(c) as i64)),
        ("u", 4) => Some(le(b, |c: [u8; 4]| u32::from_le_bytes(c) as i64)),
        // A u64 above i64::MAX is no count: the element reader names it.
        ("u", 8) => le(b, |c: [u8; 8]| i64::try_from(u64::from_le_bytes(c)).ok())
            .into_iter()
            .collect(),
        _ => None,
    };
    Ok(v.map(|v| (v, shape)))
}

/// A sequence of bools (Python bools or 0/1 integers, as a bool tensor's `.tolist()`).
fn flags(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<bool>> {
    items(obj, name)?
        .iter()
        .enumerate()
        .map(|(i, x)| {
            if x.is_instance_of::<PyBool>() {
                return x.extract();
            }
            match count(x, &format!("{name}[{i}]"))? {
                0 => Ok(false),
                1 => Ok(true),
                v => Err(PyValueError::new_err(format!(
                    "{name}[{i}]: {v} is not a bool"
                ))),
            }
        })
        .collect()
}

fn same_len(name: &str, len: usize, other: &str, n: usize) -> PyResult<()> {
    if len == n {
        Ok(())
    } else {
        Err(PyValueError::new_err(format!(
            "{name}: {len} entries, but {other} has {n}"
        )))
    }
}

/// The per-request triple `(num_computed_tokens, num_scheduled_tokens,
/// num_prompt_tokens)`, each checked, all of one length.
fn requests(v: [&Bound<'_, PyAny>; 3]) -> PyResult<[Vec<usize>; 3]> {
    const NAMES: [&str; 3] = [
        "num_computed_tokens",
        "num_scheduled_tokens",
        "num_prompt_tokens",
    ];
    let [c, s, p] = [0, 1, 2].map(|i| counts(v[i], NAMES[i]));
    let out = [c?, s?, p?];
    for i in 1..3 {
        same_len(NAMES[i], out[i].len(), NAMES[0], out[0].len())?;
    }
    Ok(out)
}

/// A planner by name ("vllm", "vllm-3region").
fn planner_of(name: &str) -> PyResult<Planner> {
    Planner::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "planner: {name:?} is not one of {:?}",
            Planner::ALL.map(|p| p.name())
        ))
    })
}

/// Runs a core rule; a panic (a bug: inputs were checked) becomes a RuntimeError.
fn guarded<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> PyResult<T> {
    std::panic::catch_unwind(f)
        .map_err(|_| PyRuntimeError::new_err("specmla internal error (please report it)"))
}

/// vLLM's `split_decodes_and_prefills` over the query lengths of a batch already
/// reordered: `(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)`.
/// The decodes are a prefix found from query lengths alone (`is_prefilling` is read
/// only when `treat_short_extends_as_decodes` is False). `num_actual_tokens` defaults
/// to the sum of the query lengths (a graph-padded count may be larger).
#[pyfunction]
#[pyo3(signature = (query_lens, decode_threshold, require_uniform=false, treat_short_extends_as_decodes=true, is_prefilling=None, num_actual_tokens=None))]
fn split_decodes_and_prefills(
    query_lens: &Bound<'_, PyAny>,
    decode_threshold: &Bound<'_, PyAny>,
    require_uniform: bool,
    treat_short_extends_as_decodes: bool,
    is_prefilling: Option<&Bound<'_, PyAny>>,
    num_actual_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<(usize, usize, usize, usize)> {
    let qs = counts(query_lens, "query_lens")?;
    let thr = count(decode_threshold, "decode_threshold")?;
    let n = qs.len();
    let prefilling = match is_prefilling {
        Some(p) => {
            let p = flags(p, "is_prefilling")?;
            same_len("is_prefilling", p.len(), "query_lens", n)?;
            p
        }
        None if !treat_short_extends_as_decodes => {
            return Err(PyValueError::new_err(
                "is_prefilling: required when treat_short_extends_as_decodes is False",
            ))
        }
        None => vec![false; n],
    };
    let sum: usize = qs.iter().sum();
    let total = match num_actual_tokens {
        Some(t) => count(t, "num_actual_tokens")?,
        None => sum,
    };
    if total < sum {
        return Err(PyValueError::new_err(format!(
            "num_actual_tokens: {total} is below the {sum} tokens of query_lens"
        )));
    }
    let c = guarded(|| {
        split(SplitInput {
            query_lens: &qs,
            num_actual_tokens: total,
            decode_threshold: thr,
            require_uniform,
            treat_short_extends_as_decodes,
            is_prefilling: &prefilling,
        })
    })?;
    Ok((
        c.num_decodes,
        c.num_prefills,
        c.num_decode_tokens,
        c.num_prefill_tokens,
    ))
}

/// vLLM's `reorder_batch_to_split_decodes_and_prefills`: `(order, modified)`, where
/// `order[i]` is the input row placed at position `i` and `modified` says whether any
/// row moved. `planner` is "vllm" (the four-region rule: decode, short_extend,
/// long_extend, prefill) or "vllm-3region" (decode, extend, prefill).
#[pyfunction]
#[pyo3(signature = (num_computed_tokens, num_scheduled_tokens, num_prompt_tokens, decode_threshold, planner="vllm"))]
fn reorder_batch(
    num_computed_tokens: &Bound<'_, PyAny>,
    num_scheduled_tokens: &Bound<'_, PyAny>,
    num_prompt_tokens: &Bound<'_, PyAny>,
    decode_threshold: &Bound<'_, PyAny>,
    planner: &str,
) -> PyResult<(Vec<usize>, bool)> {
    let [computed, scheduled, prompt] =
        requests([num_computed_tokens, num_scheduled_tokens, num_prompt_tokens])?;
    let n = computed.len();
    let thr = count(decode_threshold, "decode_threshold")?;
    let planner = planner_of(planner)?;
    let rows: Vec<RowShape> = (0..n)
        .map(|i| RowShape {
            num_computed_tokens: computed[i],
            num_scheduled_tokens: scheduled[i],
            num_prompt_tokens: prompt[i],
        })
        .collect();
    guarded(|| reorder(planner, &rows, thr))
}

/// The whole `sim plan` result for one batch, as a dict (the JSON `sim plan` prints):
/// the reorder (`order`, `reordered`, each row's region and path), the split counts,
/// `query_start_loc`, `seq_lens`, the context chunks, the graph dispatch and the logits
/// indices, for the batch of rows `(num_computed_tokens[i], num_scheduled_tokens[i],
/// num_prompt_tokens[i])` under `profile` (an attention backend profile: "flashmla",
/// "flashinfer-mla", "cutlass-mla", "flashattn-mla", "triton-mla") with K =
/// `num_spec_tokens`. Left out: pages of 16, vLLM's thresholds for the profile, a
/// workspace of 65,536 tokens, graphs captured up to 512 tokens, decode-first.
#[pyfunction]
#[pyo3(signature = (num_computed_tokens, num_scheduled_tokens, num_prompt_tokens, profile, num_spec_tokens, page_size=None, planner="vllm", reorder_batch_threshold=None, require_uniform=None, workspace_tokens=None, max_capture_size=None, layout="decode-first"))]
#[allow(clippy::too_many_arguments)]
fn plan_batch<'py>(
    py: Python<'py>,
    num_computed_tokens: &Bound<'py, PyAny>,
    num_scheduled_tokens: &Bound<'py, PyAny>,
    num_prompt_tokens: &Bound<'py, PyAny>,
    profile: &str,
    num_spec_tokens: &Bound<'py, PyAny>,
    page_size: Option<&Bound<'py, PyAny>>,
    planner: &str,
    reorder_batch_threshold: Option<&Bound<'py, PyAny>>,
    require_uniform: Option<bool>,
    workspace_tokens: Option<&Bound<'py, PyAny>>,
    max_capture_size: Option<&Bound<'py, PyAny>>,
    layout: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let [computed, scheduled, prompt] =
        requests([num_computed_tokens, num_scheduled_tokens, num_prompt_tokens])?;
    let n = computed.len();
    if BackendProfile::from_name(profile).is_none() {
        return Err(PyValueError::new_err(format!(
            "profile: {profile:?} is not one of {:?}",
            BackendProfile::ALL.map(|p| p.name())
        )));
    }
    let k = count(num_spec_tokens, "num_spec_tokens")?;
    if k > 16 {
        return Err(PyValueError::new_err(format!(
            "num_spec_tokens: {k} is above 16"
        )));
    }
    let o = PlanOptions {
        profile: profile.to_string(),
        num_spec_tokens: k as u64,
        planner: planner_of(planner)?,
        reorder_batch_threshold: reorder_batch_threshold
            .map(|t| count(t, "reorder_batch_threshold").map(|t| t as u64))
            .transpose()?,
        require_uniform,
        workspace_tokens: count_or(workspace_tokens, "workspace_tokens", 65_536)?,
        max_capture_size: count_or(max_capture_size, "max_capture_size", 512)?,
        layout: match layout {
            "decode-first" => RowLayout::DecodeFirst,
            "extend-first" => RowLayout::ExtendFirst,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "layout: {layout:?} is not \"decode-first\" or \"extend-first\""
                )))
            }
        },
    };
    // The batch file `sim plan` reads, from checked integers.
    let rows: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "{{\"num_computed_tokens\": {}, \"num_scheduled_tokens\": {}, \"num_prompt_tokens\": {}}}",
                computed[i], scheduled[i], prompt[i]
            )
        })
        .collect();
    let page = count_or(page_size, "page_size", 16)?;
    let text = format!("{{\"page_size\": {page}, \"rows\": [{}]}}", rows.join(", "));
    let json = guarded(|| explain_batch(&text, &o))?
        .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
    py.import("json")?.call_method1("loads", (json,))
}

/// Field `key` of a step: a dict's item or an object's attribute; `None` when absent.
fn field<'py>(step: &Bound<'py, PyAny>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    let v = match step.downcast::<PyDict>() {
        Ok(d) => d.get_item(key)?,
        Err(_) => step.getattr(key).ok(),
    };
    Ok(v.filter(|v| !v.is_none()))
}

/// An integer of either sign (a block id or slot, where -1 means none).
fn signed(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<pyo3::types::PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name}: expected an integer, got {}",
            type_name(obj)
        )));
    }
    obj.extract()
        .map_err(|_| PyValueError::new_err(format!("{name}: an integer out of range")))
}

/// A sequence of rows, each read by `row` (named `name[i]`).
fn rows_of<T>(
    obj: &Bound<'_, PyAny>,
    name: &str,
    row: impl Fn(&Bound<'_, PyAny>, &str) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    items(obj, name)?
        .iter()
        .enumerate()
        .map(|(i, x)| row(x, &format!("{name}[{i}]")))
        .collect()
}

fn signeds(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<i64>> {
    match fast_ints(obj)? {
        Some(v) => Ok(v),
        None => rows_of(obj, name, signed),
    }
}

/// A table of integers (a block table): a 2-D array read at once, or rows read by
/// [`signeds`].
fn signed_rows(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<Vec<i64>>> {
    if let Some((v, shape)) = array_ints(obj)? {
        if let [rows, width] = shape[..] {
            if rows * width == v.len() && width > 0 {
                return Ok(v.chunks(width).map(<[i64]>::to_vec).collect());
            }
        }
    }
    rows_of(obj, name, signeds)
}

/// `key` of `step` read by `read` where present (named `key` in errors).
fn optional<T>(
    step: &Bound<'_, PyAny>,
    key: &str,
    read: impl Fn(&Bound<'_, PyAny>, &str) -> PyResult<T>,
) -> PyResult<Option<T>> {
    field(step, key)?.map(|v| read(&v, key)).transpose()
}

fn a_bool(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    obj.extract()
        .map_err(|_| PyTypeError::new_err(format!("{name}: expected a bool")))
}

fn chunked_context(c: &Bound<'_, PyAny>, name: &str) -> PyResult<ChunkedContextLog> {
    let sub = |k: &str| required(c, k).map_err(|_| missing_in(name, k));
    let named = |k: &str| format!("{name}.{k}");
    Ok(ChunkedContextLog {
        cu_seq_lens: rows_of(&sub("cu_seq_lens")?, &named("cu_seq_lens"), counts)?,
        starts: rows_of(&sub("starts")?, &named("starts"), counts)?,
        seq_tot: counts(&sub("seq_tot")?, &named("seq_tot"))?,
        max_seq_lens: counts(&sub("max_seq_lens")?, &named("max_seq_lens"))?,
    })
}

fn graph(g: &Bound<'_, PyAny>, name: &str) -> PyResult<GraphLog> {
    let sub = |k: &str| required(g, k).map_err(|_| missing_in(name, k));
    Ok(GraphLog {
        num_tokens: count(&sub("num_tokens")?, &format!("{name}.num_tokens"))?,
        uniform: a_bool(&sub("uniform")?, &format!("{name}.uniform"))?,
        num_reqs: optional(g, "num_reqs", |v, _| count(v, &format!("{name}.num_reqs")))?,
    })
}

fn spec_decode(m: &Bound<'_, PyAny>, name: &str) -> PyResult<SpecDecodeLog> {
    let list = |k: &str| {
        let v = required(m, k).map_err(|_| missing_in(name, k))?;
        counts(&v, &format!("{name}.{k}"))
    };
    Ok(SpecDecodeLog {
        cu_num_draft_tokens: list("cu_num_draft_tokens")?,
        logits_indices: list("logits_indices")?,
        target_logits_indices: list("target_logits_indices")?,
        bonus_logits_indices: list("bonus_logits_indices")?,
    })
}

fn strings(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<String>> {
    rows_of(obj, name, |x, n| {
        x.extract()
            .map_err(|_| PyTypeError::new_err(format!("{n}: expected a string")))
    })
}

fn drafter_batch(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<DrafterBatch> {
    let s: String = obj
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{name}: expected a string")))?;
    match s.as_str() {
        "padded" => Ok(DrafterBatch::Padded),
        "compacted" => Ok(DrafterBatch::Compacted),
        _ => Err(PyValueError::new_err(format!(
            "{name}: {s:?} is not \"padded\" or \"compacted\""
        ))),
    }
}

fn drafter_pass(p: &Bound<'_, PyAny>, name: &str) -> PyResult<DrafterPassLog> {
    let sub = |k: &str| required(p, k).map_err(|_| missing_in(name, k));
    let named = |k: &str| format!("{name}.{k}");
    Ok(DrafterPassLog {
        query_start_loc: counts(&sub("query_start_loc")?, &named("query_start_loc"))?,
        seq_lens: counts(&sub("seq_lens")?, &named("seq_lens"))?,
        num_actual_tokens: count(&sub("num_actual_tokens")?, &named("num_actual_tokens"))?,
        token_indices_to_sample: counts(
            &sub("token_indices_to_sample")?,
            &named("token_indices_to_sample"),
        )?,
    })
}

fn dflash(d: &Bound<'_, PyAny>, name: &str) -> PyResult<DFlashLog> {
    let sub = |k: &str| required(d, k).map_err(|_| missing_in(name, k));
    let named = |k: &str| format!("{name}.{k}");
    Ok(DFlashLog {
        block_len: count(&sub("block_len")?, &named("block_len"))?,
        block_table: signed_rows(&sub("block_table")?, &named("block_table"))?,
        block_positions: counts(&sub("block_positions")?, &named("block_positions"))?,
        block_slots: signeds(&sub("block_slots")?, &named("block_slots"))?,
        block_indices: optional(d, "block_indices", |v, _| {
            counts(v, &named("block_indices"))
        })?,
    })
}

fn missing_in(part: &str, key: &str) -> PyErr {
    PyValueError::new_err(format!("{part}.{key}: missing from the step"))
}

fn required<'py>(step: &Bound<'py, PyAny>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    field(step, key)?.ok_or_else(|| PyValueError::new_err(format!("{key}: missing from the step")))
}

/// Checks one engine step against the planner's rules. `step` is a dict (or an object
/// with these attributes) in the step-log schema `specmla.step/1`, documented field by
/// field in the README ("The step log"): the configuration (`decode_threshold`,
/// `require_uniform`, `planner`, `num_spec_tokens`, ...), per request in the engine's
/// input order `num_computed_tokens`, `num_scheduled_tokens`, `num_prompt_tokens`, what
/// the engine built (`order`, `query_start_loc`, `seq_lens`, `num_decodes`,
/// `num_decode_tokens`, `num_prefills`), and optional parts, each audited only where
/// present (`block_table` + `slot_mapping`, `chunked_context`, `graph`, `idx_mapping`,
/// `spec_decode`, `drafter_passes`, `dflash`). Returns the violations as dicts
/// `{"invariant", "row", "detail"}` with `sim`'s invariant names; empty when the step is
/// what the rules give.
#[pyfunction]
fn audit<'py>(py: Python<'py>, step: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let list = |k: &str| counts(&required(step, k)?, k);
    let one = |k: &str| count(&required(step, k)?, k);
    let computed = list("num_computed_tokens")?;
    let n = computed.len();
    let per_request = |k: &str| -> PyResult<Vec<usize>> {
        let v = list(k)?;
        same_len(k, v.len(), "num_computed_tokens", n)?;
        Ok(v)
    };
    let planner = match field(step, "planner")? {
        None => Planner::Vllm,
        Some(p) => {
            let p: String = p
                .extract()
                .map_err(|_| PyTypeError::new_err("planner: expected a string"))?;
            planner_of(&p)?
        }
    };
    let require_uniform = match field(step, "require_uniform")? {
        None => false,
        Some(b) => b
            .extract()
            .map_err(|_| PyTypeError::new_err("require_uniform: expected a bool"))?,
    };
    let log = StepLog {
        decode_threshold: one("decode_threshold")?,
        require_uniform,
        planner,
        num_spec_tokens: optional(step, "num_spec_tokens", count)?.unwrap_or(0),
        page_size: optional(step, "page_size", count)?,
        workspace_tokens: optional(step, "workspace_tokens", count)?,
        capture_sizes: optional(step, "capture_sizes", counts)?,
        num_scheduled_tokens: per_request("num_scheduled_tokens")?,
        num_prompt_tokens: per_request("num_prompt_tokens")?,
        num_draft_tokens: optional(step, "num_draft_tokens", counts)?,
        num_computed_tokens: computed,
        order: list("order")?,
        query_start_loc: list("query_start_loc")?,
        seq_lens: list("seq_lens")?,
        num_decodes: one("num_decodes")?,
        num_decode_tokens: one("num_decode_tokens")?,
        num_prefills: one("num_prefills")?,
        block_table: optional(step, "block_table", signed_rows)?,
        slot_mapping: optional(step, "slot_mapping", signeds)?,
        chunked_context: optional(step, "chunked_context", chunked_context)?,
        graph: optional(step, "graph", graph)?,
        spec_decode: optional(step, "spec_decode", spec_decode)?,
        attention_backends: optional(step, "attention_backends", strings)?,
        idx_mapping: optional(step, "idx_mapping", signeds)?,
        num_rejected_tokens: optional(step, "num_rejected_tokens", counts)?,
        drafter_batch: optional(step, "drafter_batch", drafter_batch)?,
        drafter_passes: optional(step, "drafter_passes", |v, k| rows_of(v, k, drafter_pass))?,
        max_model_len: optional(step, "max_model_len", count)?,
        dflash: optional(step, "dflash", dflash)?,
    };
    log.validate().map_err(PyValueError::new_err)?;
    let found = guarded(|| audit_log(&log))?;
    let out = PyList::empty(py);
    for v in found {
        let d = PyDict::new(py);
        d.set_item("invariant", v.rule.name())?;
        d.set_item("row", v.row)?;
        d.set_item("detail", v.detail)?;
        out.append(d)?;
    }
    Ok(out)
}

/// The native module behind `specmla`.
#[pymodule]
fn _specmla(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(split_decodes_and_prefills, m)?)?;
    m.add_function(wrap_pyfunction!(reorder_batch, m)?)?;
    m.add_function(wrap_pyfunction!(plan_batch, m)?)?;
    m.add_function(wrap_pyfunction!(audit, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
