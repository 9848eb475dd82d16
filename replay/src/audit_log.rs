//! `replay audit LOG`: an engine's step log, one JSON object per line (JSON Lines), each
//! step checked by `specmla_core::audit` (row order, split counts, `query_start_loc`,
//! `seq_lens`). The fields are the Python `specmla.audit(step)`'s; fields the audit does
//! not read yet (an engine may log more) are ignored.

use serde::Deserialize;
use serde_json::json;
use specmla_core::audit::{audit, StepLog};
use specmla_core::config::Planner;

/// One line of a step log.
#[derive(Debug, Deserialize)]
struct LogLine {
    #[serde(default)]
    step: Option<u64>,
    decode_threshold: usize,
    #[serde(default)]
    require_uniform: bool,
    #[serde(default)]
    planner: Option<String>,
    num_computed_tokens: Vec<usize>,
    num_scheduled_tokens: Vec<usize>,
    num_prompt_tokens: Vec<usize>,
    order: Vec<usize>,
    query_start_loc: Vec<usize>,
    seq_lens: Vec<usize>,
    num_decodes: usize,
    num_decode_tokens: usize,
    num_prefills: usize,
}

/// A violation found in the log: the step (its `step` field, else its line's index),
/// the invariant, the row and what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub step: u64,
    pub invariant: &'static str,
    pub row: Option<usize>,
    pub detail: String,
}

/// Audits every line of `text`; an unreadable line is an error naming its number.
pub fn audit_log(text: &str) -> Result<(usize, Vec<Finding>), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut findings = Vec::new();
    let mut steps = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let l: LogLine = serde_json::from_str(line)
            .map_err(|e| format!("line {}: {}", i + 1, e.to_string().replace('\n', " ")))?;
        let log = to_step_log(&l, i + 1)?;
        steps += 1;
        let step = l.step.unwrap_or(i as u64);
        findings.extend(audit(&log).into_iter().map(|v| Finding {
            step,
            invariant: v.rule.name(),
            row: v.row,
            detail: v.detail,
        }));
    }
    if steps == 0 {
        return Err("no steps in the log (a log that checks nothing is not a pass)".into());
    }
    Ok((steps, findings))
}

/// The audit's input from one line (`line` numbers the errors). Counts are at most
/// `u32::MAX`, as an engine's are, so no sum of them can overflow.
fn to_step_log(l: &LogLine, line: usize) -> Result<StepLog, String> {
    let fields: [(&str, &[usize]); 6] = [
        ("num_computed_tokens", &l.num_computed_tokens),
        ("num_scheduled_tokens", &l.num_scheduled_tokens),
        ("num_prompt_tokens", &l.num_prompt_tokens),
        ("order", &l.order),
        ("query_start_loc", &l.query_start_loc),
        ("seq_lens", &l.seq_lens),
    ];
    let scalars = [
        l.decode_threshold,
        l.num_decodes,
        l.num_decode_tokens,
        l.num_prefills,
    ];
    let too_big = |v: &usize| *v > u32::MAX as usize;
    if let Some((name, _)) = fields.iter().find(|(_, v)| v.iter().any(too_big)) {
        return Err(format!(
            "line {line}: {name} holds a value above {}",
            u32::MAX
        ));
    }
    if scalars.iter().any(too_big) {
        return Err(format!("line {line}: a count above {}", u32::MAX));
    }
    let n = l.num_computed_tokens.len();
    for (name, len) in [
        ("num_scheduled_tokens", l.num_scheduled_tokens.len()),
        ("num_prompt_tokens", l.num_prompt_tokens.len()),
    ] {
        if len != n {
            return Err(format!(
                "line {line}: {name} has {len} entries, num_computed_tokens has {n}"
            ));
        }
    }
    let planner = match l.planner.as_deref() {
        None => Planner::Vllm,
        Some(p) => Planner::from_name(p).ok_or_else(|| {
            format!(
                "line {line}: planner {p:?} is not one of {:?}",
                Planner::ALL.map(|p| p.name())
            )
        })?,
    };
    Ok(StepLog {
        decode_threshold: l.decode_threshold,
        require_uniform: l.require_uniform,
        planner,
        num_computed_tokens: l.num_computed_tokens.clone(),
        num_scheduled_tokens: l.num_scheduled_tokens.clone(),
        num_prompt_tokens: l.num_prompt_tokens.clone(),
        order: l.order.clone(),
        query_start_loc: l.query_start_loc.clone(),
        seq_lens: l.seq_lens.clone(),
        num_decodes: l.num_decodes,
        num_decode_tokens: l.num_decode_tokens,
        num_prefills: l.num_prefills,
    })
}

/// The findings as `--json` prints them.
pub fn findings_json(steps: usize, findings: &[Finding]) -> serde_json::Value {
    json!({
        "steps": steps,
        "violations": findings.iter().map(|f| json!({
            "step": f.step, "invariant": f.invariant, "row": f.row, "detail": f.detail,
        })).collect::<Vec<_>>(),
    })
}

/// The `step_log` fuzz target's body: `data` as a step log, audited. Errors are fine (one
/// line each); a panic is a bug.
pub fn fuzz_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = audit_log(text) {
        assert!(!e.contains('\n'), "a multi-line error: {e}");
    }
}
