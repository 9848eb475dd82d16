//! The reorder and split rules (RULES §4): the threshold, the row order, the decode/prefill split.

use super::*;

pub(super) fn check_threshold(cfg: &EngineConfig, plan: &StepPlan, s: &mut Sink) {
    let k = cfg.spec.k();
    let verify_len = if cfg.spec.parallel_drafting {
        1 + 2 * k
    } else {
        1 + k
    };
    let spec = cfg.spec.enabled().then_some(verify_len);
    let (expect, uniform) = matrix_threshold(&cfg.backends, spec);
    let expect = cfg.split_override.reorder_batch_threshold.unwrap_or(expect);
    s.check(plan.threshold == expect, Rule::Threshold, None, || {
        format!("threshold {} != {expect}", plan.threshold)
    });
    let uniform = cfg.split_override.require_uniform.unwrap_or(uniform);
    s.check(
        plan.require_uniform == uniform,
        Rule::Threshold,
        None,
        || "require_uniform disagrees with the matrix".into(),
    );
}

/// The decode threshold and `require_uniform` the backend matrix gives attention
/// groups on `backends`, with verify rows of `verify_len` tokens when speculation is on:
/// a single-token kernel keeps 1, others raise their base threshold to the verify
/// length; the lowest over the groups wins, and any group that cannot take mixed query
/// lengths makes the split require uniform decodes.
pub fn matrix_threshold(
    backends: &[crate::config::BackendProfile],
    verify_len: Option<usize>,
) -> (usize, bool) {
    let threshold = backends
        .iter()
        .map(|p| {
            let c = p.capabilities();
            match (c.query_len_support, verify_len) {
                (QueryLenSupport::SingleOnly, _) => 1,
                (_, Some(v)) => c.base_threshold.max(v),
                (_, None) => c.base_threshold,
            }
        })
        .min()
        .unwrap_or(1);
    let uniform = backends
        .iter()
        .any(|p| p.capabilities().query_len_support != QueryLenSupport::Varlen);
    (threshold, uniform)
}

/// The region of a row, restated from vLLM's four booleans (has context, below the
/// threshold, done prefilling), independent of `reorder::region`.
pub(super) fn ref_region(
    planner: Planner,
    computed: usize,
    q: usize,
    prompt: usize,
    thr: usize,
) -> Region {
    let has_context = computed > 0;
    let below = q <= thr;
    let short_extend = planner == Planner::Vllm && computed < prompt;
    match (has_context, below, short_extend) {
        (false, _, _) => Region::Prefill,
        (true, false, _) => Region::LongExtend,
        (true, true, true) => Region::ShortExtend,
        (true, true, false) => Region::Decode,
    }
}

/// The plan's order with the layout undone: vLLM's decode-first order, whatever the
/// layout (extend-first keeps the decode rows at the end).
pub(super) fn decode_first_order(plan: &StepPlan) -> Vec<usize> {
    let mut order = plan.order.clone();
    if plan.layout == crate::config::RowLayout::ExtendFirst {
        let nd = plan.rows.iter().filter(|r| r.is_decode).count();
        let len = order.len();
        order.rotate_right(nd.min(len));
    }
    order
}

pub(super) fn check_reorder(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    s: &mut Sink,
) {
    let n = batch.rows.len();
    let mut seen = vec![false; n];
    for &i in &plan.order {
        s.check(
            i < n && !std::mem::replace(&mut seen[i.min(n - 1)], true),
            Rule::Reorder,
            None,
            || format!("order {:?} is not a permutation of 0..{n}", plan.order),
        );
    }
    s.check(plan.order.len() == n, Rule::Reorder, None, || {
        "order length differs from the batch".into()
    });
    s.check(
        plan.planner == cfg.scheduler.planner,
        Rule::Reorder,
        None,
        || {
            format!(
                "planned by {:?}, configured {:?}",
                plan.planner, cfg.scheduler.planner
            )
        },
    );
    if plan.order.len() != n || seen.iter().any(|&x| !x) {
        return;
    }
    let regions: Vec<Region> = batch
        .rows
        .iter()
        .map(|b| {
            let (c, q, p) = (
                b.num_computed_tokens,
                b.num_scheduled_tokens,
                b.num_prompt_tokens,
            );
            ref_region(plan.planner, c, q, p, plan.threshold)
        })
        .collect();
    for (r, row) in plan.rows.iter().enumerate() {
        let expect = regions[plan.order[r]];
        s.check(row.region == expect, Rule::Reorder, Some(r), || {
            format!("region {:?}, expected {expect:?}", row.region)
        });
    }
    // vLLM's swaps: a row whose slot already wants its region stays; the others fill the
    // misplaced slots in index order, taken by (region, index).
    let mut target = regions.clone();
    target.sort();
    let misplaced: Vec<usize> = (0..n).filter(|&i| regions[i] != target[i]).collect();
    let mut movers = misplaced.clone();
    movers.sort_by_key(|&i| (regions[i], i));
    let mut expect: Vec<usize> = (0..n).collect();
    for (&slot, &row) in misplaced.iter().zip(&movers) {
        expect[slot] = row;
    }
    let got = decode_first_order(plan);
    if let Some(p) = (0..n).find(|&p| got[p] != expect[p]) {
        s.check(false, Rule::Reorder, Some(p), || {
            format!(
                "vLLM's reorder puts input row {} at position {p}, the plan has {} (order {got:?})",
                expect[p], got[p]
            )
        });
    }
    s.check(
        plan.reordered != misplaced.is_empty(),
        Rule::Reorder,
        None,
        || {
            format!(
                "reordered = {}, but {} rows were misplaced",
                plan.reordered,
                misplaced.len()
            )
        },
    );
}

/// vLLM's split read literally over the decode-first query lengths: the number of
/// leading rows the decode kernel takes.
pub(super) fn ref_num_decodes(qs: &[usize], thr: usize, uniform: bool) -> usize {
    let n = qs.len();
    if n == 0 || (qs.iter().all(|&q| q <= thr) && (!uniform || thr <= 1)) {
        return n;
    }
    if qs[0] > thr {
        return 0;
    }
    if uniform && qs.iter().all(|&q| q == qs[0] || q == 0) {
        return n;
    }
    let mut i = 0;
    while i < n
        && if uniform {
            qs[i] == qs[0]
        } else {
            qs[i] <= thr
        }
    {
        i += 1;
    }
    i
}

pub(super) fn check_split(plan: &StepPlan, s: &mut Sink) {
    let dec: Vec<usize> = (0..plan.rows.len())
        .filter(|&r| plan.rows[r].is_decode)
        .collect();
    if let (Some(&first), Some(&last)) = (dec.first(), dec.last()) {
        s.check(
            last - first + 1 == dec.len(),
            Rule::Split,
            Some(first),
            || "decode rows are not contiguous".into(),
        );
        let at_edge = match plan.layout {
            crate::config::RowLayout::DecodeFirst => first == 0,
            crate::config::RowLayout::ExtendFirst => last + 1 == plan.rows.len(),
        };
        s.check(at_edge, Rule::Split, Some(first), || {
            format!("decode rows not at the {:?} edge", plan.layout)
        });
    }
    let mut qs: Vec<usize> = plan.rows.iter().map(|r| r.query_len).collect();
    if plan.layout == crate::config::RowLayout::ExtendFirst {
        qs.rotate_right(dec.len());
    }
    let want = ref_num_decodes(&qs, plan.threshold, plan.require_uniform);
    s.check(dec.len() == want, Rule::Split, None, || {
        format!(
            "{} decode rows; vLLM's split of q {qs:?} (threshold {}, uniform {}) gives {want}",
            dec.len(),
            plan.threshold,
            plan.require_uniform
        )
    });
    let m = &plan.mla;
    s.check(m.num_decodes == dec.len(), Rule::Split, None, || {
        format!("num_decodes {} != {}", m.num_decodes, dec.len())
    });
    let dec_tokens: usize = dec.iter().map(|&r| plan.rows[r].query_len).sum();
    s.check(m.num_decode_tokens == dec_tokens, Rule::Split, None, || {
        format!("num_decode_tokens {} != {dec_tokens}", m.num_decode_tokens)
    });
    s.check(
        m.num_decodes + m.num_prefills == plan.rows.len(),
        Rule::Split,
        None,
        || "decodes + prefills != rows".into(),
    );
}
