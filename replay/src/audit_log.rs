//! `replay audit LOG`: an engine's step log, one JSON object per line (JSON Lines) in the
//! schema `specmla.step/1` (`specmla_core::audit::StepLog`, documented field by field in
//! the README), each step checked by `specmla_core::audit`. Fields the schema does not
//! name (an engine may log more) are ignored.

use serde::Deserialize;
use serde_json::json;
use specmla_core::audit::{audit, StepLog, STEP_LOG_SCHEMA};

/// One line of a step log: the schema, the step number, and the step.
#[derive(Debug, Deserialize)]
struct LogLine {
    schema: String,
    #[serde(default)]
    step: Option<u64>,
    #[serde(flatten)]
    log: StepLog,
}

/// A violation found in the log: its line (from 1), the step (its `step` field, else
/// its line's index), the invariant, the row and what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub line: usize,
    pub step: u64,
    pub invariant: &'static str,
    pub row: Option<usize>,
    pub detail: String,
}

/// Audits every line of `text`; an unreadable line is an error naming its number (and
/// the field, where one is at fault).
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
        if l.schema != STEP_LOG_SCHEMA {
            return Err(format!(
                "line {}: schema {:?}, this build reads {STEP_LOG_SCHEMA:?}",
                i + 1,
                l.schema.escape_debug().to_string()
            ));
        }
        l.log
            .validate()
            .map_err(|e| format!("line {}: {e}", i + 1))?;
        steps += 1;
        let step = l.step.unwrap_or(i as u64);
        findings.extend(audit(&l.log).into_iter().map(|v| Finding {
            line: i + 1,
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

/// The findings as `--json` prints them.
pub fn findings_json(steps: usize, findings: &[Finding]) -> serde_json::Value {
    json!({
        "steps": steps,
        "violations": findings.iter().map(|f| json!({
            "line": f.line, "step": f.step, "invariant": f.invariant, "row": f.row,
            "detail": f.detail,
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
