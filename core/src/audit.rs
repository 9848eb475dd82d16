//! Auditing one step an engine built: its row order, its decode/prefill split and its
//! common metadata (`query_start_loc`, `seq_lens`) against the rules the planner follows
//! (vLLM's reorder and split, `reorder.rs`), from the per-request facts the engine
//! scheduled. Violations carry the same rule names `sim` prints. This is the part of a
//! step log every engine has; the optional parts (chunked context, graph dispatch, spec
//! decode and drafter metadata) are not audited yet.

use crate::config::Planner;
use crate::invariants::{Rule, Violation};
use crate::reorder::{reorder, split, RowShape, SplitInput};

/// One engine step as its log states it. Per-request vectors are in the engine's input
/// order (before its reorder); `order[i]` is the input request at row `i` of what it
/// built, and `query_start_loc` / `seq_lens` follow that row order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepLog {
    pub decode_threshold: usize,
    pub require_uniform: bool,
    pub planner: Planner,
    pub num_computed_tokens: Vec<usize>,
    pub num_scheduled_tokens: Vec<usize>,
    pub num_prompt_tokens: Vec<usize>,
    pub order: Vec<usize>,
    pub query_start_loc: Vec<usize>,
    pub seq_lens: Vec<usize>,
    pub num_decodes: usize,
    pub num_decode_tokens: usize,
    pub num_prefills: usize,
}

/// The rules `log` breaks, in rule order; empty when the engine planned as vLLM does.
/// `log`'s per-request vectors must have one entry per request (the caller checks).
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
    out
}

fn is_permutation(order: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order
            .iter()
            .all(|&i| i < n && !std::mem::replace(&mut seen[i], true))
}

/// The split of the engine's own row order against its counts.
fn audit_split(log: &StepLog, qs: &[usize]) -> Option<String> {
    let none = vec![false; qs.len()];
    let c = split(SplitInput {
        query_lens: qs,
        num_actual_tokens: qs.iter().sum(),
        decode_threshold: log.decode_threshold,
        require_uniform: log.require_uniform,
        treat_short_extends_as_decodes: true,
        is_prefilling: &none,
    });
    let got = (log.num_decodes, log.num_decode_tokens, log.num_prefills);
    let want = (c.num_decodes, c.num_decode_tokens, c.num_prefills);
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
