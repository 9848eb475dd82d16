//! Comparison of a replayed step with its record: bit for bit through the digests, and
//! when they differ, where: the first divergent layer, the rows and tokens that differ,
//! and which path they took (decode rows, prefill rows, the context-chunk merge, the
//! drafter).

use serde::Serialize;
use specmla_core::config::KvCacheDtype;
use specmla_sim::cli::count;
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
    /// Cross-backend with stored tensors: rows whose logits are beyond tolerance, and
    /// the largest |difference| among all logits.
    pub logit_rows: Vec<DivergentRow>,
    pub logits_max_abs_diff: Option<f32>,
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
            logit_rows: Vec::new(),
            logits_max_abs_diff: None,
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
                "layer {l} ({}: {})",
                count(self.layer_rows.len(), "row"),
                paths.join(", ")
            ));
        }
        if !self.logit_rows.is_empty() {
            parts.push(format!("logits of {}", count(self.logit_rows.len(), "row")));
        }
        if !self.token_rows.is_empty() {
            parts.push(format!("tokens of {}", count(self.token_rows.len(), "row")));
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
        logit_rows: Vec::new(),
        logits_max_abs_diff: None,
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
        rec.tensors.as_ref()?.attn_outputs.get(layer)?,
        got.tensors.as_ref()?.attn_outputs.get(layer)?,
    );
    Some(largest_diff(a, b))
}

/// The largest |a - b| (NaN differences are left out).
fn largest_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

// ---------------------------------------------------------------------------------------
// Cross-backend comparison. Its tolerances live here, and only here.
// ---------------------------------------------------------------------------------------

/// Absolute tolerance on stored tensors (attention outputs and logits) when a trace
/// replays on the other backend. Both backends compute in f32 but reduce in different
/// orders: the CPU and an H100 agree to about 1e-5 on logits and 1e-6 on attention
/// outputs, while a real kernel bug (F1) moves attention outputs by about 0.8.
pub const CROSS_ATOL: f64 = 1e-3;
/// Relative tolerance on stored tensors across backends: `|got - recorded| <= CROSS_ATOL
/// + CROSS_RTOL * |recorded|`.
pub const CROSS_RTOL: f64 = 1e-3;

/// The tolerances of a cross-backend replay, as one value the report prints.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CrossTolerances {
    /// Absolute tolerance on attention outputs and logits.
    pub atol: f64,
    /// Relative tolerance on attention outputs and logits.
    pub rtol: f64,
    /// A differing token whose replayed logits are closer than this to the recorded
    /// token's is a near-tie: reported, not a divergence. It is `sim`'s own near-tie
    /// margin ([`specmla_sim::checks::NEAR_TIE_MARGIN`]).
    pub near_tie_margin: f64,
}

/// The tolerances every cross-backend replay uses.
pub const CROSS_TOLERANCES: CrossTolerances = CrossTolerances {
    atol: CROSS_ATOL,
    rtol: CROSS_RTOL,
    near_tie_margin: specmla_sim::checks::NEAR_TIE_MARGIN,
};

/// [`CROSS_TOLERANCES`] for a bf16 cache: each backend rounds its own f32 latent to bf16,
/// and where the two sit either side of a rounding midpoint they differ by one bf16 step
/// on that element. `sim`'s bf16 tolerances ([`specmla_sim::checks::BF16_LOGIT_ABS_TOLERANCE`]),
/// still about 80 times below what F1 moves.
pub const BF16_CROSS_TOLERANCES: CrossTolerances = CrossTolerances {
    atol: specmla_sim::checks::BF16_LOGIT_ABS_TOLERANCE,
    rtol: CROSS_RTOL,
    near_tie_margin: specmla_sim::checks::BF16_NEAR_TIE_MARGIN,
};

/// [`CROSS_TOLERANCES`] where either side's attention rounded queries and probabilities
/// to bf16 (the GPU's flash decode): `sim`'s tolerances for it
/// ([`specmla_sim::checks::BF16_COMPUTE_LOGIT_ABS_TOLERANCE`]). Seen: a DeepSeek-V3-width
/// trace of the flash path replayed on the CPU differed by 1.1e-2 on logits.
pub const BF16_COMPUTE_CROSS_TOLERANCES: CrossTolerances = CrossTolerances {
    atol: specmla_sim::checks::BF16_COMPUTE_LOGIT_ABS_TOLERANCE,
    rtol: CROSS_RTOL,
    near_tie_margin: specmla_sim::checks::BF16_COMPUTE_NEAR_TIE_MARGIN,
};

/// The cross-backend tolerances of a trace whose latent cache holds `dtype`, where
/// either side computed in bf16 or neither did.
pub fn cross_tolerances(dtype: KvCacheDtype, bf16_compute: bool) -> CrossTolerances {
    match (dtype, bf16_compute) {
        (_, true) => BF16_COMPUTE_CROSS_TOLERANCES,
        (KvCacheDtype::F32, false) => CROSS_TOLERANCES,
        (KvCacheDtype::Bf16, false) => BF16_CROSS_TOLERANCES,
    }
}

impl CrossTolerances {
    /// Whether `got` is within tolerance of `recorded`. Two NaNs (or two equal
    /// infinities) agree; a NaN against a number never does.
    pub fn within(&self, recorded: f32, got: f32) -> bool {
        let (a, b) = (f64::from(recorded), f64::from(got));
        a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= self.atol + self.rtol * a.abs()
    }
}

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

/// The replayed logits' margin between the recorded and the replayed token, when it is
/// a near-tie.
fn near_tie(logits: Option<&Vec<f32>>, recorded: u32, replayed: u32, margin: f64) -> Option<f32> {
    let l = logits?;
    let (a, b) = (*l.get(recorded as usize)?, *l.get(replayed as usize)?);
    let m = (a - b).abs();
    (f64::from(m) < margin).then_some(m)
}

/// Cross-backend comparison of a replayed step with its record:
///
/// - the metadata digest and row order exactly (the core is the same on both);
/// - sampled and committed tokens and proposals exactly, except a differing token whose
///   replayed logits put it within `tol.near_tie_margin` of the recorded one: that is a
///   near-tie (returned), not a divergence. What was computed from the other token in
///   the same step is not compared: the proposals of a row with a sampled near-tie, and
///   a multi-step row's drafts after a near-tie among them;
/// - with stored tensors, every layer's attention outputs and the logits within
///   `tol.atol + tol.rtol * |recorded|`; the first layer beyond it is localized to rows
///   and paths as [`compare_step`] does.
///
/// Digests of floating-point outputs (logits, hidden states, layers, drafter) are not
/// compared: across backends they are expected to differ.
pub fn compare_cross(
    rec: &StepRecord,
    got: &StepRecord,
    f: &crate::replayer::StepFindings,
    tol: &CrossTolerances,
) -> (Option<Divergence>, Vec<CrossNearTie>) {
    let metadata_differs = rec.metadata_digest != got.metadata_digest || rec.order != got.order;
    let ids = planned_req_ids(rec);
    let margin = tol.near_tie_margin;
    let mut ties = Vec::new();
    let mut token_rows = Vec::new();
    // Rows with a near-tie among their sampled tokens: the drafter started this step
    // from another token, so their proposals differ as a consequence.
    let mut tied_rows = Vec::new();
    for r in 0..rec.sampled.len().max(got.sampled.len()) {
        let req = ids.get(r).copied().unwrap_or(u64::MAX);
        let logits = |i: usize| f.target_logits.get(&(req, i));
        // Each sampled position verifies recorded input tokens: it stands alone.
        let (a, b) = (rec.sampled.get(r), got.sampled.get(r));
        let sampled = match_tokens(a, b, logits, margin, false);
        // Committed tokens follow from the sampled ones: they may differ only where a
        // sampled token did.
        let row_ties =
            sampled.filter(|t| !t.is_empty() || rec.new_tokens.get(r) == got.new_tokens.get(r));
        match row_ties {
            Some(t) => {
                if !t.is_empty() {
                    tied_rows.push(r);
                }
                ties.extend(t.into_iter().map(|t| t.at(rec.step, req, false)));
            }
            None => token_rows.push((
                r,
                rec.new_tokens.get(r).cloned().unwrap_or_default(),
                got.new_tokens.get(r).cloned().unwrap_or_default(),
            )),
        }
    }
    let mut drafter_requests = Vec::new();
    for r in 0..rec.proposals.len().max(got.proposals.len()) {
        let req = ids.get(r).copied().unwrap_or(u64::MAX);
        if tied_rows.contains(&r) {
            continue;
        }
        let logits = |k: usize| f.draft_logits.get(&(req, k));
        let (a, b) = (rec.proposals.get(r), got.proposals.get(r));
        match match_tokens(a, b, logits, margin, f.drafts_chain) {
            Some(t) => ties.extend(t.into_iter().map(|t| t.at(rec.step, req, true))),
            None => drafter_requests.push(req),
        }
    }
    let (first_layer, layer_rows, max_abs_diff) = first_layer_beyond(rec, got, tol);
    let (logit_rows, logits_max_abs_diff, logits_differ) = logits_beyond(rec, got, tol);
    let diverged = metadata_differs
        || first_layer.is_some()
        || logits_differ
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
        logit_rows,
        logits_max_abs_diff: logits_max_abs_diff.filter(|_| logits_differ),
        violations: Vec::new(),
        cross_checks: Vec::new(),
    });
    (d, ties)
}

/// A token excused as a near-tie, before it is placed in a step and request.
struct Tie {
    position: usize,
    recorded: u32,
    replayed: u32,
    margin: f32,
}

impl Tie {
    fn at(self, step: u64, req_id: u64, drafter: bool) -> CrossNearTie {
        CrossNearTie {
            step,
            req_id,
            position: self.position,
            recorded: self.recorded,
            replayed: self.replayed,
            margin: self.margin,
            drafter,
        }
    }
}

/// One row's tokens across backends: `Some(near-ties)` when they match, each differing
/// token excused by the replayed logits at its position (`logits(i)`) putting it within
/// `margin` of the recorded one; `None` when they do not. With `chain`, the tokens
/// after an excused one were computed from it and are not compared.
fn match_tokens<'a>(
    rec: Option<&Vec<u32>>,
    got: Option<&Vec<u32>>,
    logits: impl Fn(usize) -> Option<&'a Vec<f32>>,
    margin: f64,
    chain: bool,
) -> Option<Vec<Tie>> {
    let (Some(a), Some(b)) = (rec, got) else {
        return (rec == got).then(Vec::new);
    };
    if a.len() != b.len() {
        return None;
    }
    let mut ties = Vec::new();
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        if x == y {
            continue;
        }
        if chain && !ties.is_empty() {
            break;
        }
        ties.push(Tie {
            position: i,
            recorded: x,
            replayed: y,
            margin: near_tie(logits(i), x, y, margin)?,
        });
    }
    Some(ties)
}

/// Per planned row of a record (rows in execution order): `n` consecutive entries
/// each, `n` given by `count`. A record whose order names missing rows stops early.
fn planned_ranges(
    rec: &StepRecord,
    count: impl Fn(&specmla_traces::TraceRow) -> usize,
) -> Vec<std::ops::Range<usize>> {
    let mut start = 0;
    rec.order
        .iter()
        .map_while(|&i| rec.rows.get(i as usize))
        .map(|row| {
            let r = start..start + count(row);
            start = r.end;
            r
        })
        .collect()
}

/// Rows (of `ranges`, entries `width` wide) with any value beyond tolerance.
fn rows_beyond(
    rec: &StepRecord,
    got: &StepRecord,
    ranges: &[std::ops::Range<usize>],
    width: usize,
    (a, b): (&[f32], &[f32]),
    tol: &CrossTolerances,
) -> Vec<DivergentRow> {
    ranges
        .iter()
        .enumerate()
        .filter(|(_, t)| (t.start * width..t.end * width).any(|i| !tol.within(a[i], b[i])))
        .filter_map(|(r, _)| divergent_row(rec, got, r))
        .collect()
}

/// With tensors on both sides: the first layer where some row's attention output is
/// beyond tolerance, those rows, and the largest |difference| in that layer. A layer of
/// another size diverges with no rows to name.
fn first_layer_beyond(
    rec: &StepRecord,
    got: &StepRecord,
    tol: &CrossTolerances,
) -> (Option<u32>, Vec<DivergentRow>, Option<f32>) {
    let (Some(ta), Some(tb)) = (&rec.tensors, &got.tensors) else {
        return (None, Vec::new(), None);
    };
    let ranges = planned_ranges(rec, |row| row.num_scheduled_tokens as usize);
    let tokens = ranges.last().map_or(0, |r| r.end);
    let layers = ta.attn_outputs.len().max(tb.attn_outputs.len());
    for l in 0..layers {
        let (Some(a), Some(b)) = (ta.attn_outputs.get(l), tb.attn_outputs.get(l)) else {
            return (Some(l as u32), Vec::new(), None);
        };
        if a.len() != b.len() || (tokens > 0 && a.len() % tokens != 0) {
            return (Some(l as u32), Vec::new(), None);
        }
        if tokens == 0 {
            continue;
        }
        let rows = rows_beyond(rec, got, &ranges, a.len() / tokens, (a, b), tol);
        if !rows.is_empty() {
            return (Some(l as u32), rows, Some(largest_diff(a, b)));
        }
    }
    (None, Vec::new(), None)
}

/// With tensors on both sides: the rows whose logits are beyond tolerance, the largest
/// |difference| among all logits, and whether the logits differ at all (rows or shape).
fn logits_beyond(
    rec: &StepRecord,
    got: &StepRecord,
    tol: &CrossTolerances,
) -> (Vec<DivergentRow>, Option<f32>, bool) {
    let (Some(ta), Some(tb)) = (&rec.tensors, &got.tensors) else {
        return (Vec::new(), None, false);
    };
    let (a, b) = (&ta.logits, &tb.logits);
    let ranges = planned_ranges(rec, |row| {
        if row.samples {
            1 + row.num_draft_tokens as usize
        } else {
            0
        }
    });
    let samples = ranges.last().map_or(0, |r| r.end);
    if a.len() != b.len() || (samples > 0 && a.len() % samples != 0) {
        return (Vec::new(), None, true);
    }
    if samples == 0 {
        return (Vec::new(), None, false);
    }
    let rows = rows_beyond(rec, got, &ranges, a.len() / samples, (a, b), tol);
    let differ = !rows.is_empty();
    (rows, Some(largest_diff(a, b)), differ)
}
