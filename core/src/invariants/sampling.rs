//! Sampling (RULES §8): logits indices and grammar masks.

use super::*;

pub(super) fn check_sampling(batch: &ScheduledBatch, plan: &StepPlan, s: &mut Sink) {
    let c = &plan.common;
    let mut k = 0;
    for (r, row) in plan.rows.iter().enumerate() {
        let b = &batch.rows[plan.order[r]];
        let n = if b.samples { b.num_draft_tokens + 1 } else { 0 };
        let got = plan.row_samples(r);
        s.check(got.len() == n, Rule::Sampling, Some(r), || {
            format!("{} logits entries, expected {n}", got.len())
        });
        let end = c.query_start_loc[r + 1];
        for (j, i) in got.enumerate() {
            let expect = end - n as u32 + j as u32;
            s.check(
                plan.logits_indices.get(i) == Some(&expect),
                Rule::Sampling,
                Some(r),
                || format!("logits index {i} is not token {expect}"),
            );
        }
        k += n;
        let _ = row;
    }
    s.check(
        plan.logits_indices.len() == k && plan.grammar_masks.len() == k,
        Rule::Sampling,
        None,
        || "logits indices and masks disagree in length".into(),
    );
}

/// Checks the grammar masks against each row's own drafts, read from the batch.
pub fn check_grammar_masks(
    batch: &ScheduledBatch,
    plan: &StepPlan,
    lookup: crate::plan::GrammarLookup<'_>,
) -> Vec<Violation> {
    let mut s = Sink {
        step: plan.step,
        out: Vec::new(),
    };
    for (r, row) in plan.rows.iter().enumerate() {
        let b = &batch.rows[plan.order[r]];
        let Some((a, state)) = lookup(row.req_id).filter(|_| b.samples) else {
            continue;
        };
        let drafts = &b.token_ids[b.token_ids.len() - b.num_draft_tokens..];
        let want = a.verify_masks(state, drafts);
        for (j, i) in plan.row_samples(r).enumerate() {
            s.check(
                plan.grammar_masks[i].as_ref() == Some(&want[j]),
                Rule::Sampling,
                Some(r),
                || format!("grammar mask of verify position {j} does not follow the row's drafts"),
            );
        }
    }
    s.out
}
