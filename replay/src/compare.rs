//! Comparison of a replayed step with its record: bit for bit through the digests, and
//! when they differ, where: the first divergent layer, the rows and tokens that differ,
//! and which path they took (decode rows, prefill rows, the context-chunk merge, the
//! drafter).

use serde::Serialize;
use specmla_traces::{RowPath, StepRecord};

/// One row whose outputs differ.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DivergentRow {
    /// Planned (execution-order) row.
    pub row: usize,
    pub req_id: u64,
    /// "decode", "prefill" or "prefill+context" (the context-chunk LSE merge ran).
    pub path: String,
    pub q_len: u64,
    pub context_len: u64,
}

/// Where inside a step the replay first differs from the record.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Divergence {
    pub step: u64,
    /// The plan's metadata (split, slots, chunks, graph, masks) differs.
    pub metadata_differs: bool,
    /// First layer whose attention output differs, and the rows that differ there.
    pub first_layer: Option<u32>,
    pub layer_rows: Vec<DivergentRow>,
    /// Rows whose sampled or accepted tokens differ: (row, recorded, replayed).
    pub token_rows: Vec<(usize, Vec<u32>, Vec<u32>)>,
    /// The drafter's inputs or proposals differ.
    pub drafter_differs: bool,
    /// Requests whose proposals differ.
    pub drafter_requests: Vec<u64>,
    /// With stored tensors: the largest |difference| in the first divergent layer.
    pub max_abs_diff: Option<f32>,
    /// Invariants the replayed step violated (rule: detail).
    pub violations: Vec<String>,
    /// Shadow-run mismatches (row layouts, drafter batch modes).
    pub cross_checks: Vec<String>,
}

impl Divergence {
    /// A step whose outputs match but whose replay broke an invariant.
    pub fn invariants_only(step: u64) -> Self {
        Self {
            step,
            metadata_differs: false,
            first_layer: None,
            layer_rows: Vec::new(),
            token_rows: Vec::new(),
            drafter_differs: false,
            drafter_requests: Vec::new(),
            max_abs_diff: None,
            violations: Vec::new(),
            cross_checks: Vec::new(),
        }
    }

    /// One line naming where it diverged.
    pub fn headline(&self) -> String {
        let mut parts = Vec::new();
        if self.metadata_differs {
            parts.push("metadata".to_string());
        }
        if let Some(l) = self.first_layer {
            let paths: Vec<&str> = self
                .layer_rows
                .iter()
                .map(|r| r.path.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            parts.push(format!(
                "layer {l} ({} rows: {})",
                self.layer_rows.len(),
                paths.join(", ")
            ));
        }
        if !self.token_rows.is_empty() {
            parts.push(format!("tokens of {} rows", self.token_rows.len()));
        }
        if self.drafter_differs {
            parts.push("drafter".to_string());
        }
        if let Some(v) = self.violations.first() {
            parts.push(format!("invariant {}", v.split(':').next().unwrap_or(v)));
        }
        if !self.cross_checks.is_empty() {
            parts.push("cross-check".to_string());
        }
        if parts.is_empty() {
            parts.push("logits or hidden states".to_string());
        }
        format!("step {}: {}", self.step, parts.join("; "))
    }
}

/// The first difference between a recorded step and its replay, or `None` if they are
/// identical bit for bit.
pub fn compare_step(rec: &StepRecord, got: &StepRecord) -> Option<Divergence> {
    let metadata_differs = rec.metadata_digest != got.metadata_digest || rec.order != got.order;
    let (first_layer, layer_rows) = first_layer(rec, got);
    let token_rows: Vec<(usize, Vec<u32>, Vec<u32>)> =
        (0..rec.new_tokens.len().max(got.new_tokens.len()))
            .filter(|&r| {
                rec.new_tokens.get(r) != got.new_tokens.get(r)
                    || rec.sampled.get(r) != got.sampled.get(r)
            })
            .map(|r| {
                (
                    r,
                    rec.new_tokens.get(r).cloned().unwrap_or_default(),
                    got.new_tokens.get(r).cloned().unwrap_or_default(),
                )
            })
            .collect();
    let drafter_differs =
        rec.drafter_digest != got.drafter_digest || rec.proposals != got.proposals;
    let drafter_requests = planned_req_ids(rec)
        .into_iter()
        .enumerate()
        .filter(|&(r, _)| rec.proposals.get(r) != got.proposals.get(r))
        .map(|(_, id)| id)
        .collect();
    let outputs_same =
        rec.logits_digest == got.logits_digest && rec.hidden_digest == got.hidden_digest;
    if !metadata_differs
        && first_layer.is_none()
        && token_rows.is_empty()
        && !drafter_differs
        && outputs_same
    {
        return None;
    }
    let max_abs_diff = first_layer.and_then(|l| max_abs_diff(rec, got, l as usize));
    Some(Divergence {
        step: rec.step,
        metadata_differs,
        first_layer,
        layer_rows,
        token_rows,
        drafter_differs,
        drafter_requests,
        max_abs_diff,
        violations: Vec::new(),
        cross_checks: Vec::new(),
    })
}

fn planned_req_ids(rec: &StepRecord) -> Vec<u64> {
    rec.order
        .iter()
        .filter_map(|&i| rec.rows.get(i as usize).map(|r| r.req_id))
        .collect()
}

fn first_layer(rec: &StepRecord, got: &StepRecord) -> (Option<u32>, Vec<DivergentRow>) {
    for (a, b) in rec.layers.iter().zip(&got.layers) {
        let rows: Vec<DivergentRow> = (0..a.per_row.len().max(b.per_row.len()))
            .filter(|&r| a.per_row.get(r) != b.per_row.get(r))
            .filter_map(|r| divergent_row(rec, got, r))
            .collect();
        if !rows.is_empty() {
            return (Some(a.layer), rows);
        }
    }
    (None, Vec::new())
}

fn row_path(rec: &StepRecord, r: usize) -> Option<(&specmla_traces::TraceRow, &'static str)> {
    let row = rec.rows.get(*rec.order.get(r)? as usize)?;
    let path = match row.path {
        RowPath::Decode => "decode",
        RowPath::Prefill if row.num_computed_tokens > 0 => "prefill+context",
        RowPath::Prefill => "prefill",
    };
    Some((row, path))
}

/// A divergent row labelled with the path it took in the replay, and the recorded path
/// too when a fault moved it (F10 sends rows to another kernel).
fn divergent_row(rec: &StepRecord, got: &StepRecord, r: usize) -> Option<DivergentRow> {
    let (row, recorded) = row_path(rec, r)?;
    let replayed = row_path(got, r).map_or(recorded, |(_, p)| p);
    let path = if replayed == recorded {
        replayed.to_string()
    } else {
        format!("{replayed} (recorded: {recorded})")
    };
    Some(DivergentRow {
        row: r,
        req_id: row.req_id,
        path,
        q_len: row.num_scheduled_tokens,
        context_len: row.num_computed_tokens,
    })
}

fn max_abs_diff(rec: &StepRecord, got: &StepRecord, layer: usize) -> Option<f32> {
    let (a, b) = (
        rec.tensors.as_ref()?.get(layer)?,
        got.tensors.as_ref()?.get(layer)?,
    );
    Some(
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max),
    )
}

/// Absolute tolerance on attention outputs when replaying on the other backend (f32 on
/// both; the two reduce in different orders, and observed differences are about 1e-6).
pub const CROSS_ATOL: f32 = 1e-3;
/// Relative tolerance on attention outputs when replaying on the other backend.
pub const CROSS_RTOL: f32 = 1e-3;

/// A token that differs across backends where the replayed logits are a near-tie.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CrossNearTie {
    pub step: u64,
    pub req_id: u64,
    /// Sample index within the row (target) or draft index (drafter).
    pub position: usize,
    pub recorded: u32,
    pub replayed: u32,
    /// |logit(recorded) - logit(replayed)| in the replay.
    pub margin: f32,
    pub drafter: bool,
}

/// How a replayed token that differs from its record is judged across backends.
fn judge(
    logits: Option<&Vec<f32>>,
    (recorded, replayed): (u32, u32),
    near_tie: f64,
) -> Option<f32> {
    let l = logits?;
    let (a, b) = (*l.get(recorded as usize)?, *l.get(replayed as usize)?);
    let margin = (a - b).abs();
    (f64::from(margin) < near_tie).then_some(margin)
}

/// Cross-backend comparison: metadata and order exactly (the core is the same), tokens
/// exactly except near-ties (returned, not divergent), attention outputs within
/// [`CROSS_ATOL`] + [`CROSS_RTOL`] when the trace stores tensors. Digests of floating
/// point outputs are not compared: they are expected to differ.
pub fn compare_cross(
    rec: &StepRecord,
    got: &StepRecord,
    f: &crate::replayer::StepFindings,
    near_tie: f64,
) -> (Option<Divergence>, Vec<CrossNearTie>) {
    let metadata_differs = rec.metadata_digest != got.metadata_digest || rec.order != got.order;
    let ids = planned_req_ids(rec);
    let mut ties = Vec::new();
    let mut token_rows = Vec::new();
    for r in 0..rec.sampled.len().max(got.sampled.len()) {
        let (a, b) = (rec.sampled.get(r), got.sampled.get(r));
        let req = ids.get(r).copied().unwrap_or(u64::MAX);
        let excused = match (a, b) {
            (Some(a), Some(b)) if a.len() == b.len() => {
                a.iter().zip(b).enumerate().all(|(i, (&x, &y))| {
                    x == y
                        || judge(f.target_logits.get(&(req, i)), (x, y), near_tie).is_some_and(
                            |m| {
                                ties.push(CrossNearTie {
                                    step: rec.step,
                                    req_id: req,
                                    position: i,
                                    recorded: x,
                                    replayed: y,
                                    margin: m,
                                    drafter: false,
                                });
                                true
                            },
                        )
                })
            }
            _ => a == b,
        };
        let new_same = rec.new_tokens.get(r) == got.new_tokens.get(r);
        if !excused || (!new_same && a == b) {
            token_rows.push((
                r,
                rec.new_tokens.get(r).cloned().unwrap_or_default(),
                got.new_tokens.get(r).cloned().unwrap_or_default(),
            ));
        }
    }
    let mut drafter_requests = Vec::new();
    for (r, &req) in ids.iter().enumerate() {
        let (a, b) = (rec.proposals.get(r), got.proposals.get(r));
        let ok = match (a, b) {
            (Some(a), Some(b)) if a.len() == b.len() => {
                a.iter().zip(b).enumerate().all(|(k, (&x, &y))| {
                    x == y
                        || judge(f.draft_logits.get(&(req, k)), (x, y), near_tie).is_some_and(|m| {
                            ties.push(CrossNearTie {
                                step: rec.step,
                                req_id: req,
                                position: k,
                                recorded: x,
                                replayed: y,
                                margin: m,
                                drafter: true,
                            });
                            true
                        })
                })
            }
            _ => a == b,
        };
        if !ok {
            drafter_requests.push(req);
        }
    }
    let (first_layer, layer_rows, max_abs_diff) = first_layer_beyond_tolerance(rec, got);
    let diverged = metadata_differs
        || first_layer.is_some()
        || !token_rows.is_empty()
        || !drafter_requests.is_empty();
    let d = diverged.then(|| Divergence {
        step: rec.step,
        metadata_differs,
        first_layer,
        layer_rows,
        token_rows,
        drafter_differs: !drafter_requests.is_empty(),
        drafter_requests,
        max_abs_diff,
        violations: Vec::new(),
        cross_checks: Vec::new(),
    });
    (d, ties)
}

/// Token ranges of the planned rows of a record (rows in execution order).
fn planned_token_ranges(rec: &StepRecord) -> Vec<std::ops::Range<usize>> {
    let mut start = 0;
    rec.order
        .iter()
        .filter_map(|&i| rec.rows.get(i as usize))
        .map(|row| {
            let r = start..start + row.num_scheduled_tokens as usize;
            start = r.end;
            r
        })
        .collect()
}

/// With tensors on both sides: the first layer where some row's attention output is
/// beyond tolerance, those rows, and the largest |difference| in that layer.
fn first_layer_beyond_tolerance(
    rec: &StepRecord,
    got: &StepRecord,
) -> (Option<u32>, Vec<DivergentRow>, Option<f32>) {
    let (Some(ta), Some(tb)) = (&rec.tensors, &got.tensors) else {
        return (None, Vec::new(), None);
    };
    let ranges = planned_token_ranges(rec);
    for (l, (a, b)) in ta.iter().zip(tb).enumerate() {
        let tokens: usize = ranges.last().map_or(0, |r| r.end);
        if a.len() != b.len() || tokens == 0 {
            if a.len() != b.len() {
                return (Some(l as u32), Vec::new(), None);
            }
            continue;
        }
        let width = a.len() / tokens;
        // NaN on either side is beyond any tolerance.
        let beyond = |x: f32, y: f32| {
            let d = (x - y).abs();
            d.is_nan() || d > CROSS_ATOL + CROSS_RTOL * x.abs()
        };
        let rows: Vec<DivergentRow> = ranges
            .iter()
            .enumerate()
            .filter(|(_, t)| (t.start * width..t.end * width).any(|i| beyond(a[i], b[i])))
            .filter_map(|(r, _)| divergent_row(rec, got, r))
            .collect();
        if !rows.is_empty() {
            let worst = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            return (Some(l as u32), rows, Some(worst));
        }
    }
    (None, Vec::new(), None)
}
