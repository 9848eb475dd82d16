//! `sim plan`'s engine: explains how one hand-written batch is reordered, split, chunked
//! and dispatched onto a graph, as JSON. Input errors name the field and the reason. The
//! `sim` binary reads the batch and the flags; this module is a library so the batch
//! parser and the planner can be fuzzed as they run.

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use specmla_core::batch::{ScheduledBatch, ScheduledRow};
use specmla_core::config::{
    BackendProfile, DrafterBatch, EngineConfig, ModelDims, SchedulerConfig, SpecConfig,
    SplitOverride,
};

use specmla_core::config::{Planner, RowLayout};
use specmla_core::cudagraph::capture_sizes;
use specmla_core::plan::{build_step_plan, StepPlan};

/// Bounds the block table `sim plan` allocates, so no input can exhaust memory.
/// What `sim plan` plans a batch under (its flags, as plain data).
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// An attention backend profile's name (`BackendProfile::ALL`).
    pub profile: String,
    /// K, the speculative tokens (0: no speculation).
    pub num_spec_tokens: u64,
    pub planner: Planner,
    pub reorder_batch_threshold: Option<u64>,
    pub require_uniform: Option<bool>,
    pub workspace_tokens: usize,
    pub max_capture_size: usize,
    pub layout: RowLayout,
}

/// The explanation of the batch `text` (the batch file's JSON) under `o`, as the JSON
/// `sim plan` prints.
pub fn explain_batch(text: &str, o: &PlanOptions) -> Result<String> {
    explain_parsed(&parse_batch(text)?, o)
}

/// The explanation of a parsed batch under `o`.
pub fn explain_parsed(f: &BatchFile, o: &PlanOptions) -> Result<String> {
    let cfg = plan_config(o, f)?;
    let batch = synth_batch(&cfg, f);
    let sizes = capture_sizes(&cfg);
    let plan = build_step_plan(&cfg, &batch, &sizes, cfg.scheduler.row_layout, &|_| None)?;
    let mut out = String::new();
    write_json(&explain(&cfg, &plan, &sizes), 0, &mut out);
    Ok(out)
}

const MAX_TABLE_ENTRIES: usize = 1 << 26;

/// One row as an engine has it at hand.
#[derive(Clone, Copy, Debug)]
struct BatchRow {
    num_computed_tokens: usize,
    /// 0 for a padding row.
    num_scheduled_tokens: usize,
    num_prompt_tokens: usize,
}

impl BatchRow {
    fn seq_len(&self) -> usize {
        self.num_computed_tokens + self.num_scheduled_tokens
    }
}

/// A parsed batch file.
pub struct BatchFile {
    page_size: usize,
    rows: Vec<BatchRow>,
}

fn field_usize(v: &Value, path: &str, min: u64) -> Result<usize> {
    let n = v
        .as_u64()
        .ok_or_else(|| anyhow!("{path}: expected a non-negative integer, got {v}"))?;
    if n < min || n > i32::MAX as u64 {
        bail!("{path}: {n} is out of range ({min}..={})", i32::MAX);
    }
    Ok(n as usize)
}

const ROW_FIELDS: [&str; 3] = [
    "num_computed_tokens",
    "num_scheduled_tokens",
    "num_prompt_tokens",
];

/// Parses a batch file: `page_size` and `rows`, each field checked and named in errors.
pub fn parse_batch(text: &str) -> Result<BatchFile> {
    // A byte-order mark (editors on Windows write one) is not part of the JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let v: Value = serde_json::from_str(text).map_err(|e| anyhow!("not valid JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| anyhow!("top level: expected an object"))?;
    for key in obj.keys() {
        if key != "page_size" && key != "rows" {
            // Escaped: a key may hold a newline, and an error is one line.
            bail!(
                "{}: unknown field (expected page_size and rows)",
                key.escape_debug()
            );
        }
    }
    let page_size = field_usize(
        obj.get("page_size")
            .ok_or_else(|| anyhow!("page_size: missing"))?,
        "page_size",
        1,
    )?;
    let rows_v = obj.get("rows").ok_or_else(|| anyhow!("rows: missing"))?;
    let rows_a = rows_v
        .as_array()
        .ok_or_else(|| anyhow!("rows: expected an array"))?;
    if rows_a.is_empty() {
        bail!("rows: expected at least one row");
    }
    let rows = rows_a
        .iter()
        .enumerate()
        .map(|(i, r)| parse_row(i, r))
        .collect::<Result<Vec<_>>>()?;
    Ok(BatchFile { page_size, rows })
}

/// One row. Without `num_prompt_tokens`, a row with context is taken as past its prompt
/// (a decode or verify row) and a row without context as a whole prompt.
fn parse_row(i: usize, r: &Value) -> Result<BatchRow> {
    let o = r
        .as_object()
        .ok_or_else(|| anyhow!("rows[{i}]: expected an object"))?;
    if let Some(key) = o.keys().find(|k| !ROW_FIELDS.contains(&k.as_str())) {
        bail!(
            "rows[{i}].{}: unknown field (expected {})",
            key.escape_debug(),
            ROW_FIELDS.join(", ")
        );
    }
    let get = |k: &str, min| -> Result<Option<usize>> {
        o.get(k)
            .map(|v| field_usize(v, &format!("rows[{i}].{k}"), min))
            .transpose()
    };
    let missing = |k: &str| anyhow!("rows[{i}].{k}: missing");
    let computed = get("num_computed_tokens", 0)?.ok_or_else(|| missing("num_computed_tokens"))?;
    let q = get("num_scheduled_tokens", 0)?.ok_or_else(|| missing("num_scheduled_tokens"))?;
    let prompt =
        get("num_prompt_tokens", 1)?.unwrap_or(if computed > 0 { computed } else { q.max(1) });
    Ok(BatchRow {
        num_computed_tokens: computed,
        num_scheduled_tokens: q,
        num_prompt_tokens: prompt,
    })
}

fn plan_config(a: &PlanOptions, f: &BatchFile) -> Result<EngineConfig> {
    let k = a.num_spec_tokens as usize;
    let spec = if k == 0 {
        SpecConfig::off()
    } else {
        SpecConfig::multi_step(k, DrafterBatch::Padded)
    };
    let max_seq = f.rows.iter().map(BatchRow::seq_len).max().unwrap_or(1);
    let max_model_len = (max_seq + k + 1).max(2);
    let page = f.page_size;
    crate::scenarios::check_page_size(page)
        .map_err(|e| anyhow!("invalid configuration: page_size: {e}"))?;
    if a.workspace_tokens < page {
        bail!("invalid configuration: workspace of {} tokens is smaller than one page ({page} tokens)", a.workspace_tokens);
    }
    let blocks: usize = f
        .rows
        .iter()
        .map(|r| (r.seq_len() + k + 1).div_ceil(page))
        .sum();
    let table_entries = f.rows.len().max(256) * max_model_len.div_ceil(page);
    if table_entries > MAX_TABLE_ENTRIES {
        bail!(
            "batch too large to plan: its block table would hold {table_entries} entries \
             (limit {MAX_TABLE_ENTRIES}); use a larger page_size or shorter rows"
        );
    }
    Ok(EngineConfig {
        model: ModelDims::deepseek_v3(),
        spec,
        scheduler: SchedulerConfig {
            // vLLM's default, so capture sizes are those an engine would capture.
            max_num_seqs: f.rows.len().max(256),
            max_num_batched_tokens: f
                .rows
                .iter()
                .map(|r| r.num_scheduled_tokens)
                .sum::<usize>()
                .max(1),
            max_model_len,
            page_size: page,
            num_gpu_blocks: blocks.max(max_model_len.div_ceil(page)),
            chunked_prefill: true,
            prefill_chunk_tokens: max_seq,
            mixed_batches: true,
            row_layout: a.layout,
            planner: a.planner,
            workspace_tokens: a.workspace_tokens,
        },
        backends: vec![BackendProfile::from_name(&a.profile)
            .ok_or_else(|| anyhow!("unknown profile {:?}", a.profile))?],
        cuda_graphs: true,
        max_capture_size_tokens: a.max_capture_size,
        split_size_tokens: page,
        max_splits: 0,
        // DeepSeek-V3 served as engines do by default: the cache in the model's bf16.
        kv_cache_dtype: specmla_core::config::KvCacheDtype::Bf16,
        dp_peer_num_tokens: 0,
        faults: Default::default(),
        poison_stale_buffers: false,
        split_override: SplitOverride {
            reorder_batch_threshold: a.reorder_batch_threshold.map(|t| t as usize),
            require_uniform: a.require_uniform,
        },
    })
}

/// The batch an engine would have scheduled: distinct blocks per row, drafts on rows
/// past their prompt (up to K), sampling on rows that reach their prompt's end.
fn synth_batch(cfg: &EngineConfig, f: &BatchFile) -> ScheduledBatch {
    let mut next_block = 0u32;
    let k = cfg.spec.k();
    let rows = f
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (c, q) = (r.num_computed_tokens, r.num_scheduled_tokens);
            let n_blocks = (c + q + k + 1)
                .min(cfg.scheduler.max_model_len)
                .div_ceil(cfg.scheduler.page_size) as u32;
            let block_ids = (next_block..next_block + n_blocks).collect();
            next_block += n_blocks;
            let past_prompt = c >= r.num_prompt_tokens;
            let nd = if past_prompt && q > 0 {
                (q - 1).min(k)
            } else {
                0
            };
            let samples = q > 0 && c + q >= r.num_prompt_tokens;
            ScheduledRow {
                req_id: i as u64,
                num_computed_tokens: c,
                num_prompt_tokens: r.num_prompt_tokens,
                num_scheduled_tokens: q,
                token_ids: vec![0; q],
                num_draft_tokens: nd,
                samples,
                next_prompt_token: (!samples).then_some(0),
                block_ids,
                req_state_idx: i,
            }
        })
        .collect();
    ScheduledBatch {
        step: 0,
        rows,
        preempted: Vec::new(),
    }
}

/// Pretty JSON with every array or object of scalars on one line (a plan's `order`,
/// `query_start_loc` and each row read at a glance), keys sorted.
fn write_json(v: &Value, indent: usize, out: &mut String) {
    let pad = |n: usize| "  ".repeat(n);
    let scalar = |x: &Value| !x.is_array() && !x.is_object();
    match v {
        Value::Array(a) if a.iter().all(scalar) => {
            out.push_str(&serde_json::to_string(v).expect("a JSON value prints"));
        }
        Value::Object(o) if o.values().all(scalar) => {
            let fields: Vec<String> = o
                .iter()
                .map(|(k, x)| format!("{}: {x}", Value::from(k.as_str())))
                .collect();
            out.push_str(&format!("{{{}}}", fields.join(", ")));
        }
        Value::Array(a) => {
            out.push_str("[\n");
            for (i, x) in a.iter().enumerate() {
                out.push_str(&pad(indent + 1));
                write_json(x, indent + 1, out);
                out.push_str(if i + 1 < a.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(indent));
            out.push(']');
        }
        Value::Object(o) => {
            out.push_str("{\n");
            for (i, (k, x)) in o.iter().enumerate() {
                out.push_str(&format!("{}{}: ", pad(indent + 1), Value::from(k.as_str())));
                write_json(x, indent + 1, out);
                out.push_str(if i + 1 < o.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(indent));
            out.push('}');
        }
        _ => out.push_str(&serde_json::to_string(v).expect("a JSON value prints")),
    }
}

fn explain(cfg: &EngineConfig, plan: &StepPlan, sizes: &[usize]) -> Value {
    let c = &plan.common;
    let m = &plan.mla;
    let rows: Vec<Value> = plan
        .rows
        .iter()
        .zip(&plan.order)
        .map(|(r, &i)| {
            json!({"input_row": i, "region": r.region.name(),
                   "path": if r.is_decode { "decode" } else { "prefill" },
                   "q_len": r.query_len, "context_len": r.num_computed_tokens,
                   "num_prompt_tokens": r.num_prompt_tokens})
        })
        .collect();
    let chunks = m.prefill.as_ref().and_then(|p| p.chunked_context.as_ref()).map(|cc| {
        let pre_rows: Vec<usize> = m.prefill.as_ref().map(|p| p.rows.clone().collect()).unwrap_or_default();
        json!({
            "chunk_size_tokens": cc.chunk_size_tokens,
            "workspace_tokens": cc.workspace_tokens,
            "chunks": cc.chunks.iter().map(|ch| json!({
                "total_tokens": ch.total_tokens(),
                "rows": pre_rows.iter().enumerate().map(|(j, &r)| json!({
                    "input_row": plan.order[r], "start": ch.starts[j], "len": ch.lens[j]})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    });
    json!({
        "backend": cfg.backends[0].name(),
        "num_spec_tokens": cfg.spec.k(),
        "planner": plan.planner.name(),
        "threshold": plan.threshold,
        "require_uniform": plan.require_uniform,
        "order": plan.order,
        "reordered": plan.reordered,
        "num_decodes": m.num_decodes,
        "num_decode_tokens": m.num_decode_tokens,
        "num_prefills": m.num_prefills,
        "num_prefill_tokens": m.num_prefill_tokens,
        "query_start_loc": c.query_start_loc[..=plan.rows.len()],
        "seq_lens": c.seq_lens[..plan.rows.len()],
        "rows": rows,
        "prefill_chunks": chunks,
        "cudagraph": graph_json(cfg, plan, sizes),
        "logits_indices": plan.logits_indices,
    })
}

fn graph_json(cfg: &EngineConfig, plan: &StepPlan, sizes: &[usize]) -> Value {
    let q = cfg.spec.uniform_decode_query_len();
    if let Some(g) = &plan.cudagraph {
        return json!({"graph": {"num_tokens": g.shape.num_tokens, "num_rows": g.shape.num_rows, "query_len": g.shape.query_len},
                      "padding_rows": g.num_padding_rows, "padding_tokens": g.num_padding_tokens, "capture_sizes": sizes});
    }
    let input_row = |pred: &dyn Fn(&specmla_core::plan::PlannedRow) -> bool| {
        plan.rows.iter().position(pred).map(|r| plan.order[r])
    };
    let reason = if sizes.is_empty() {
        format!("{} captures no graph for q_len {q}", cfg.backends[0].name())
    } else if let Some(i) = input_row(&|r| r.query_len == 0) {
        format!(
            "eager: input row {i} has q_len 0; q = 0 padding rows are added by the dispatch, \
             not given to it"
        )
    } else if let Some(i) = input_row(&|r| r.query_len != q) {
        format!("eager: input row {i} is not a q_len {q} row")
    } else if let Some(i) = input_row(&|r| r.num_computed_tokens < r.num_prompt_tokens) {
        format!(
            "eager: input row {i} is still prefilling; a graph replays only rows past their \
             prompt (the fix of vLLM #49918)"
        )
    } else {
        format!(
            "eager: {} tokens exceed the largest capture size {}",
            plan.num_tokens(),
            sizes.last().unwrap_or(&0)
        )
    };
    json!({"graph": null, "reason": reason, "capture_sizes": sizes})
}

/// The fuzz target's body (`fuzz/fuzz_targets/sim_plan.rs`): the first byte picks the
/// profile, the second K (0..=4) and the layout and planner; the rest is the batch file.
/// Errors are fine (one line each); a panic is a bug.
pub fn fuzz_one(data: &[u8]) {
    let [p, k, rest @ ..] = data else { return };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let profiles = BackendProfile::ALL;
    let o = PlanOptions {
        profile: profiles[*p as usize % profiles.len()].name().to_string(),
        num_spec_tokens: u64::from(k % 5),
        planner: if k & 0x40 == 0 {
            Planner::Vllm
        } else {
            Planner::Vllm3Region
        },
        reorder_batch_threshold: None,
        require_uniform: None,
        workspace_tokens: 65_536,
        max_capture_size: 512,
        layout: if k & 0x80 == 0 {
            RowLayout::DecodeFirst
        } else {
            RowLayout::ExtendFirst
        },
    };
    if let Err(e) = explain_batch(text, &o) {
        let msg = format!("{e:#}");
        assert!(!msg.contains('\n'), "a multi-line error: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Postmortem (fuzzing, issue 22): a batch key holding an escaped newline made the
    /// unknown-field error two lines; keys are now printed escaped.
    #[test]
    fn an_unknown_key_with_a_newline_is_named_on_one_line() {
        let e = parse_batch(r#"{"pag\nx": 1}"#).err().unwrap().to_string();
        assert_eq!(e, r"pag\nx: unknown field (expected page_size and rows)");
        let e = parse_batch(r#"{"page_size": 16, "rows": [{"a\nb": 1}]}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with(r"rows[0].a\nb: unknown field"), "{e}");
    }
}
