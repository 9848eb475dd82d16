//! Auditing one step an engine built against the rules the planner follows, from the
//! per-request facts the engine scheduled: its row order, its decode/prefill split and
//! its common metadata (`query_start_loc`, `seq_lens`) against vLLM's reorder and split
//! (`reorder.rs`), and, each only where the log carries it, its slot mapping, its
//! chunked-context metadata, its graph dispatch and its spec-decode metadata
//! (`parts.rs`). Violations carry the same rule names `sim` prints. [`StepLog`] is the
//! step-log schema `specmla.step/1`, one JSON object per step.

use serde::{Deserialize, Serialize};

use crate::config::{DrafterBatch, Planner};
use crate::invariants::{Rule, Violation};
use crate::reorder::{reorder, split, RowShape, SplitInput};

mod parts;
pub use parts::{
    chunked_context_log, drafter_passes, spec_decode_metadata, ChunkedContextLog, DFlashLog,
    DrafterPassLog, GraphLog, SpecDecodeLog,
};

/// The schema name a step log's every line carries.
pub const STEP_LOG_SCHEMA: &str = "specmla.step/1";

/// One engine step as its log states it. Per-request vectors are in the engine's input
/// order (before its reorder); `order[i]` is the input request at row `i` of what it
/// built, and every other vector (`query_start_loc`, `seq_lens`, `block_table`, the
/// optional parts) follows that row order, or the token order it implies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLog {
    /// `reorder_batch_threshold`: a row with at most this many tokens is a decode.
    pub decode_threshold: usize,
    #[serde(default)]
    pub require_uniform: bool,
    #[serde(default)]
    pub planner: Planner,
    /// K, the speculative tokens per request (0: none).
    #[serde(default)]
    pub num_spec_tokens: usize,
    /// Tokens per KV block; needed to audit `slot_mapping` and the chunked context.
    #[serde(default)]
    pub page_size: Option<usize>,
    /// The chunked-context workspace in tokens; needed to audit `chunked_context`.
    #[serde(default)]
    pub workspace_tokens: Option<usize>,
    /// The attention backends of the model's attention groups, by profile name
    /// (`BackendProfile::name`); where given, the threshold and `require_uniform` are
    /// audited against the backend matrix.
    #[serde(default)]
    pub attention_backends: Option<Vec<String>>,
    /// The graph capture sizes in tokens, ascending; needed to audit `graph`.
    #[serde(default)]
    pub capture_sizes: Option<Vec<usize>>,
    pub num_computed_tokens: Vec<usize>,
    pub num_scheduled_tokens: Vec<usize>,
    pub num_prompt_tokens: Vec<usize>,
    /// Draft tokens scheduled per request (input order); needed to audit `spec_decode`.
    #[serde(default)]
    pub num_draft_tokens: Option<Vec<usize>>,
    pub order: Vec<usize>,
    /// One more entry than rows; a graph step may carry its padding rows' entries too,
    /// which must repeat the last (q = 0).
    pub query_start_loc: Vec<usize>,
    /// One per row; a graph step may carry its padding rows' entries too, which must be
    /// 0 (the persistent buffer zeroed).
    pub seq_lens: Vec<usize>,
    /// Each row's request-state slot, padding rows included (-1: none); where given,
    /// padding rows must map to no request.
    #[serde(default)]
    pub idx_mapping: Option<Vec<i64>>,
    pub num_decodes: usize,
    pub num_decode_tokens: usize,
    pub num_prefills: usize,
    /// Each row's block ids (row order); with `slot_mapping` and `page_size`.
    #[serde(default)]
    pub block_table: Option<Vec<Vec<i64>>>,
    /// Each token's cache slot (token order; -1 for a padding token).
    #[serde(default)]
    pub slot_mapping: Option<Vec<i64>>,
    #[serde(default)]
    pub chunked_context: Option<ChunkedContextLog>,
    #[serde(default)]
    pub graph: Option<GraphLog>,
    #[serde(default)]
    pub spec_decode: Option<SpecDecodeLog>,
    /// Draft tokens each row's verification rejected (row order); with `drafter_passes`.
    #[serde(default)]
    pub num_rejected_tokens: Option<Vec<usize>>,
    /// How the drafter batches its first pass: padded (vLLM's default) or compacted.
    #[serde(default)]
    pub drafter_batch: Option<DrafterBatch>,
    /// The multi-step drafter's passes in order, each as its attention metadata states it.
    #[serde(default)]
    pub drafter_passes: Option<Vec<DrafterPassLog>>,
    /// The longest sequence the engine serves; with `dflash`.
    #[serde(default)]
    pub max_model_len: Option<usize>,
    /// The DFlash drafter's query blocks and the slots they write.
    #[serde(default)]
    pub dflash: Option<DFlashLog>,
}

impl StepLog {
    /// Why this log cannot be audited: per-request vectors of different lengths, or a
    /// count above `u32::MAX` (as an engine's never is, so no sum can overflow). Names
    /// the field.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.num_computed_tokens.len();
        let per_request = [
            ("num_scheduled_tokens", self.num_scheduled_tokens.len()),
            ("num_prompt_tokens", self.num_prompt_tokens.len()),
            (
                "num_draft_tokens",
                self.num_draft_tokens.as_ref().map_or(n, Vec::len),
            ),
        ];
        if let Some((name, len)) = per_request.iter().find(|(_, len)| *len != n) {
            return Err(format!(
                "{name} has {len} entries, num_computed_tokens has {n}"
            ));
        }
        let big = |v: usize| v > u32::MAX as usize;
        let vectors: [(&str, &[usize]); 7] = [
            ("num_computed_tokens", &self.num_computed_tokens),
            ("num_scheduled_tokens", &self.num_scheduled_tokens),
            ("num_prompt_tokens", &self.num_prompt_tokens),
            ("order", &self.order),
            ("query_start_loc", &self.query_start_loc),
            ("seq_lens", &self.seq_lens),
            (
                "num_draft_tokens",
                self.num_draft_tokens.as_deref().unwrap_or(&[]),
            ),
        ];
        if let Some((name, _)) = vectors.iter().find(|(_, v)| v.iter().any(|&x| big(x))) {
            return Err(format!("{name} holds a value above {}", u32::MAX));
        }
        let scalars = [
            ("decode_threshold", self.decode_threshold),
            ("num_spec_tokens", self.num_spec_tokens),
            ("num_decodes", self.num_decodes),
            ("num_decode_tokens", self.num_decode_tokens),
            ("num_prefills", self.num_prefills),
            ("page_size", self.page_size.unwrap_or(1)),
            ("workspace_tokens", self.workspace_tokens.unwrap_or(0)),
        ];
        if let Some((name, v)) = scalars.iter().find(|(_, v)| big(*v)) {
            return Err(format!("{name} is {v}, above {}", u32::MAX));
        }
        if self.page_size == Some(0) {
            return Err("page_size is 0".into());
        }
        // A row verifies at most the drafts it schedules (and the audit then never
        // builds more logits indices than the step has tokens).
        let drafts = self.num_draft_tokens.as_deref().unwrap_or(&[]);
        let q = &self.num_scheduled_tokens;
        if let Some(i) = (0..drafts.len()).find(|&i| drafts[i] > q[i]) {
            return Err(format!(
                "num_draft_tokens[{i}] = {}, more than the {} tokens request {i} schedules",
                drafts[i], q[i]
            ));
        }
        parts::validate(self)
    }
}

/// The rules `log` breaks, in rule order; empty when the engine planned as vLLM does.
/// `log` must pass [`StepLog::validate`] (the callers check).
pub fn audit(log: &StepLog) -> Vec<Violation> {
    let n = log.num_computed_tokens.len();
    let rows: Vec<RowShape> = (0..n)
        .map(|i| RowShape {
            num_computed_tokens: log.num_computed_tokens[i],
            num_scheduled_tokens: log.num_scheduled_tokens[i],
            num_prompt_tokens: log.num_prompt_tokens[i],
        })
        .collect();
    let mut out = Vec::new();
    let violation = |rule, row: Option<usize>, detail: String| Violation {
        rule,
        step: 0,
        row,
        detail,
    };
    let (want, _) = reorder(log.planner, &rows, log.decode_threshold);
    if !is_permutation(&log.order, n) {
        out.push(violation(
            Rule::Reorder,
            None,
            format!("order {:?} is not a permutation of {n} requests", log.order),
        ));
        return out;
    }
    if let Some(i) = (0..n).find(|&i| log.order[i] != want[i]) {
        out.push(violation(
            Rule::Reorder,
            Some(i),
            format!(
                "row {i} holds request {}, vLLM's reorder puts request {} there (order {:?}, expected {:?})",
                log.order[i], want[i], log.order, want
            ),
        ));
    }
    let qs: Vec<usize> = log
        .order
        .iter()
        .map(|&r| rows[r].num_scheduled_tokens)
        .collect();
    out.extend(audit_split(log, &qs).map(|d| violation(Rule::Split, None, d)));
    out.extend(audit_common(log, &rows).map(|(row, d)| violation(Rule::CommonMetadata, row, d)));
    out.extend(parts::audit_parts(log, &rows));
    out
}

fn is_permutation(order: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order
            .iter()
            .all(|&i| i < n && !std::mem::replace(&mut seen[i], true))
}

/// vLLM's split of rows of `qs` tokens (the engine's row order) under the log's
/// threshold: `(num_decodes, num_decode_tokens, num_prefills)`.
fn rule_split(log: &StepLog, qs: &[usize]) -> (usize, usize, usize) {
    let none = vec![false; qs.len()];
    let c = split(SplitInput {
        query_lens: qs,
        num_actual_tokens: qs.iter().sum(),
        decode_threshold: log.decode_threshold,
        require_uniform: log.require_uniform,
        treat_short_extends_as_decodes: true,
        is_prefilling: &none,
    });
    (c.num_decodes, c.num_decode_tokens, c.num_prefills)
}

/// The split of the engine's own row order against its counts.
fn audit_split(log: &StepLog, qs: &[usize]) -> Option<String> {
    let got = (log.num_decodes, log.num_decode_tokens, log.num_prefills);
    let want = rule_split(log, qs);
    (got != want).then(|| {
        format!(
            "(num_decodes, num_decode_tokens, num_prefills) = {got:?}, vLLM's split of these rows gives {want:?}"
        )
    })
}

/// `query_start_loc` (one more entry than rows) and `seq_lens` in the engine's order.
fn audit_common(log: &StepLog, rows: &[RowShape]) -> Option<(Option<usize>, String)> {
    let n = rows.len();
    let mut loc = vec![0];
    for &r in &log.order {
        loc.push(loc.last().copied().unwrap_or(0) + rows[r].num_scheduled_tokens);
    }
    if log.query_start_loc.len() < n + 1 || log.query_start_loc[..=n] != loc[..] {
        let at = (0..=n).find(|&i| log.query_start_loc.get(i) != Some(&loc[i]));
        return Some((
            at.map(|i| i.saturating_sub(1)),
            format!(
                "query_start_loc {:?}, the rows give {loc:?}",
                log.query_start_loc
            ),
        ));
    }
    let seq: Vec<usize> = log
        .order
        .iter()
        .map(|&r| rows[r].num_computed_tokens + rows[r].num_scheduled_tokens)
        .collect();
    (0..n)
        .find(|&i| log.seq_lens.get(i) != Some(&seq[i]))
        .map(|i| {
            let detail = format!(
                "seq_lens[{i}] = {:?}, num_computed_tokens + num_scheduled_tokens gives {}",
                log.seq_lens.get(i),
                seq[i]
            );
            (Some(i), detail)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's "mixed_decodes_long_extends" batch, as a correct engine logs it.
    fn good() -> StepLog {
        StepLog {
            decode_threshold: 1,
            require_uniform: false,
            planner: Planner::Vllm,
            num_computed_tokens: vec![100, 10, 200, 20],
            num_scheduled_tokens: vec![100, 1, 200, 1],
            num_prompt_tokens: vec![100, 10, 200, 20],
            order: vec![3, 1, 2, 0],
            query_start_loc: vec![0, 1, 2, 202, 302],
            seq_lens: vec![21, 11, 400, 200],
            num_decodes: 2,
            num_decode_tokens: 2,
            num_prefills: 2,
            ..StepLog::default()
        }
    }

    fn rules(log: &StepLog) -> Vec<&'static str> {
        audit(log).iter().map(|v| v.rule.name()).collect()
    }

    #[test]
    fn a_correct_step_passes() {
        assert!(audit(&good()).is_empty(), "{:?}", audit(&good()));
    }

    /// Each kind of engine mistake is named by its rule.
    #[test]
    fn each_mistake_names_its_rule() {
        let mut l = good();
        l.order = vec![1, 3, 2, 0];
        l.seq_lens = vec![11, 21, 400, 200];
        assert_eq!(rules(&l), vec!["reorder"]);
        let mut l = good();
        l.num_decodes = 3;
        assert_eq!(rules(&l), vec!["split"]);
        let mut l = good();
        l.query_start_loc[2] = 3;
        assert_eq!(rules(&l), vec!["common-metadata"]);
        let mut l = good();
        l.seq_lens[2] = 399;
        let v = audit(&l);
        assert_eq!((v[0].rule, v[0].row), (Rule::CommonMetadata, Some(2)));
        let mut l = good();
        l.order = vec![0, 0, 1, 2];
        assert_eq!(rules(&l), vec!["reorder"]);
        assert!(audit(&l)[0].detail.contains("not a permutation"));
    }

    /// Postmortem of a review: a log's counts (up to u32::MAX each) could make the audit
    /// build billions of expected chunks or logits indices. Sizes are compared first,
    /// and more drafts than scheduled tokens is malformed; each answers at once.
    #[test]
    fn huge_counts_are_answered_without_building_them() {
        let big = StepLog {
            decode_threshold: 1,
            num_computed_tokens: vec![2_000_000_000],
            num_scheduled_tokens: vec![2_000_000_000],
            num_prompt_tokens: vec![1],
            order: vec![0],
            query_start_loc: vec![0, 2_000_000_000],
            seq_lens: vec![4_000_000_000],
            num_prefills: 1,
            page_size: Some(1),
            workspace_tokens: Some(1),
            num_draft_tokens: Some(vec![1_999_999_999]),
            chunked_context: Some(ChunkedContextLog::default()),
            spec_decode: Some(SpecDecodeLog::default()),
            ..StepLog::default()
        };
        let v = audit(&big);
        assert!(v
            .iter()
            .any(|v| v.rule == Rule::ChunkedContext && v.detail.contains("give 2000000000")));
        assert!(v
            .iter()
            .any(|v| v.rule == Rule::Sampling && v.detail.contains("entries")));
        assert!(big.validate().is_ok());
        let mut over = big;
        over.num_draft_tokens = Some(vec![2_000_000_001]);
        assert!(over.validate().unwrap_err().contains("num_draft_tokens[0]"));
    }

    /// The three-region rule keeps a short extend among the decodes, where the
    /// four-region rule moves it: the same log passes one planner and not the other.
    #[test]
    fn the_planner_decides_what_is_right() {
        let l = StepLog {
            decode_threshold: 1,
            planner: Planner::Vllm3Region,
            num_computed_tokens: vec![50, 100],
            num_scheduled_tokens: vec![1, 1],
            num_prompt_tokens: vec![100, 100],
            order: vec![0, 1],
            query_start_loc: vec![0, 1, 2],
            seq_lens: vec![51, 101],
            num_decodes: 2,
            num_decode_tokens: 2,
            num_prefills: 0,
            ..StepLog::default()
        };
        assert!(audit(&l).is_empty());
        let four = StepLog {
            planner: Planner::Vllm,
            ..l
        };
        assert_eq!(rules(&four), vec!["reorder"]);
    }
}
