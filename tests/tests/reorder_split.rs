//! Reorder and split as vLLM computes them: vLLM's own unit-test cases as table tests
//! (tests/v1/attention/test_batch_reordering.py, four-region and three-region, and
//! tests/v1/attention/test_attention_splitting.py; the inputs and expected outputs are
//! restated here), then properties against references written independently of the
//! core: the reorder simulated as vLLM's swap loop, and the split read literally.

mod common;

use proptest::prelude::*;
use specmla_core::config::{BackendProfile, Planner, QueryLenSupport, RowLayout};
use specmla_core::reorder::{
    profile_threshold, reorder, reorder_and_split, reorder_batch_threshold, require_uniform, split,
    PlanRules, Region, RowShape, SplitCounts, SplitInput,
};
use specmla_tests::{build_batch, engine_config, plan_of, spec_config, RowSpec};

/// The capability table, restated: (profile, support, base threshold).
const TABLE: [(BackendProfile, QueryLenSupport, usize); 5] = [
    (BackendProfile::FlashMla, QueryLenSupport::Uniform, 128),
    (BackendProfile::FlashInferMla, QueryLenSupport::Uniform, 1),
    (BackendProfile::CutlassMla, QueryLenSupport::SingleOnly, 1),
    (BackendProfile::FlashAttnMla, QueryLenSupport::Varlen, 512),
    (BackendProfile::TritonMla, QueryLenSupport::SingleOnly, 1),
];

/// Reference threshold of one profile (vLLM's `_init_reorder_batch_threshold`).
fn ref_threshold(support: QueryLenSupport, base: usize, k: usize, parallel: bool) -> usize {
    match support {
        QueryLenSupport::SingleOnly => 1,
        _ if k == 0 => base,
        _ => base.max(if parallel { 1 + 2 * k } else { 1 + k }),
    }
}

fn shape(q: usize, computed: usize, prompt: usize) -> RowShape {
    RowShape {
        num_computed_tokens: computed,
        num_scheduled_tokens: q,
        num_prompt_tokens: prompt,
    }
}

// ---------------------------------------------------------------------------------------
// vLLM's reorder test cases.

/// One case of test_batch_reordering.py: rows as (num_scheduled, num_computed,
/// num_prompt), the expected order (input index at each position) and `modified`.
struct ReorderCase {
    name: &'static str,
    rows: &'static [(usize, usize, usize)],
    expected_order: &'static [usize],
    expected_modified: bool,
    threshold: usize,
}

const fn case(
    name: &'static str,
    rows: &'static [(usize, usize, usize)],
    expected_order: &'static [usize],
    expected_modified: bool,
    threshold: usize,
) -> ReorderCase {
    ReorderCase {
        name,
        rows,
        expected_order,
        expected_modified,
        threshold,
    }
}

/// vLLM main after PR #37303 (the four-region rule).
const FOUR_REGION_CASES: &[ReorderCase] = &[
    case(
        "all_decodes",
        &[(1, 10, 10), (1, 20, 20), (1, 30, 30)],
        &[0, 1, 2],
        false,
        1,
    ),
    case(
        "all_long_extends",
        &[(100, 100, 100), (200, 200, 200), (300, 300, 300)],
        &[0, 1, 2],
        false,
        1,
    ),
    case(
        "mixed_decodes_long_extends",
        &[(100, 100, 100), (1, 10, 10), (200, 200, 200), (1, 20, 20)],
        &[3, 1, 2, 0],
        true,
        1,
    ),
    case(
        "already_ordered",
        &[(1, 10, 10), (1, 20, 20), (100, 100, 100), (200, 0, 200)],
        &[0, 1, 2, 3],
        false,
        1,
    ),
    case("single_request", &[(1, 10, 10)], &[0], false, 1),
    case(
        "higher_threshold",
        &[(2, 10, 10), (3, 20, 20), (5, 30, 30), (6, 40, 40)],
        &[0, 1, 2, 3],
        false,
        4,
    ),
    case(
        "decodes_at_end",
        &[(100, 100, 100), (200, 200, 200), (1, 10, 10), (1, 20, 20)],
        &[2, 3, 0, 1],
        true,
        1,
    ),
    case(
        "decode_long_extend_prefill",
        &[(100, 0, 100), (10, 50, 50), (1, 10, 10)],
        &[2, 1, 0],
        true,
        1,
    ),
    case(
        "long_extend_prefill_only",
        &[(100, 0, 100), (10, 50, 50), (200, 0, 200), (20, 75, 75)],
        &[3, 1, 2, 0],
        true,
        1,
    ),
    case(
        "complicated_mixed",
        &[
            (1, 20, 20),
            (1, 50, 50),
            (374, 0, 374),
            (300, 20, 20),
            (1, 20, 20),
            (256, 0, 256),
            (1, 5, 5),
            (27, 0, 27),
            (1, 4, 4),
        ],
        &[0, 1, 6, 8, 4, 3, 2, 7, 5],
        true,
        1,
    ),
    case(
        "new_request_single_token_prefill",
        &[(100, 0, 100), (1, 0, 1), (50, 100, 100), (1, 10, 10)],
        &[3, 2, 0, 1],
        true,
        1,
    ),
    case(
        "multiple_new_requests_single_token_prefill",
        &[(1, 0, 1), (1, 0, 1), (1, 50, 50), (200, 0, 200)],
        &[2, 1, 0, 3],
        true,
        1,
    ),
    case(
        "four_way_already_ordered",
        &[(1, 100, 100), (1, 50, 100), (10, 50, 100), (100, 0, 100)],
        &[0, 1, 2, 3],
        false,
        1,
    ),
    case(
        "four_way_needs_reorder",
        &[(100, 0, 100), (1, 50, 100), (1, 100, 100), (10, 50, 100)],
        &[2, 1, 3, 0],
        true,
        1,
    ),
    case(
        "four_way_multiple_short_extends",
        &[(2, 100, 100), (2, 50, 200), (2, 75, 150), (2, 200, 200)],
        &[0, 3, 2, 1],
        true,
        2,
    ),
    case(
        "four_way_spec_decode_threshold",
        &[(5, 100, 100), (5, 50, 100), (5, 0, 100), (10, 50, 100)],
        &[0, 1, 3, 2],
        true,
        5,
    ),
];

/// vLLM before PR #37303 (three regions; the file at vllm-project/vllm
/// 9cf03a302752072f38d441eb2d415f37bbbac098 has no prompt lengths, so they are unused
/// here and set to the computed count).
const THREE_REGION_CASES: &[ReorderCase] = &[
    case(
        "all_decodes",
        &[(1, 10, 0), (1, 20, 0), (1, 30, 0)],
        &[0, 1, 2],
        false,
        1,
    ),
    case(
        "all_prefills",
        &[(100, 100, 0), (200, 200, 0), (300, 300, 0)],
        &[0, 1, 2],
        false,
        1,
    ),
    case(
        "mixed_interleaved",
        &[(100, 100, 0), (1, 10, 0), (200, 200, 0), (1, 20, 0)],
        &[3, 1, 2, 0],
        true,
        1,
    ),
    case(
        "already_ordered",
        &[(1, 10, 0), (1, 20, 0), (100, 100, 0), (200, 0, 0)],
        &[0, 1, 2, 3],
        false,
        1,
    ),
    case("single_request", &[(1, 10, 0)], &[0], false, 1),
    case(
        "higher_threshold",
        &[(2, 10, 0), (3, 20, 0), (5, 30, 0), (6, 40, 0)],
        &[0, 1, 2, 3],
        false,
        4,
    ),
    case(
        "decodes_at_end",
        &[(100, 100, 0), (200, 200, 0), (1, 10, 0), (1, 20, 0)],
        &[2, 3, 0, 1],
        true,
        1,
    ),
    case(
        "decode_extend_prefill",
        &[(100, 0, 0), (10, 50, 0), (1, 10, 0)],
        &[2, 1, 0],
        true,
        1,
    ),
    case(
        "extend_prefill_only",
        &[(100, 0, 0), (10, 50, 0), (200, 0, 0), (20, 75, 0)],
        &[3, 1, 2, 0],
        true,
        1,
    ),
    case(
        "complicated_mixed_interleaved",
        &[
            (1, 20, 0),
            (1, 50, 0),
            (374, 0, 0),
            (300, 20, 0),
            (1, 20, 0),
            (256, 0, 0),
            (1, 5, 0),
            (27, 0, 0),
            (1, 4, 0),
        ],
        &[0, 1, 6, 8, 4, 3, 2, 7, 5],
        true,
        1,
    ),
    case(
        "new_request_single_token_prefill",
        &[(100, 0, 0), (1, 0, 0), (50, 100, 0), (1, 10, 0)],
        &[3, 2, 0, 1],
        true,
        1,
    ),
    case(
        "multiple_new_requests_single_token_prefill",
        &[(1, 0, 0), (1, 0, 0), (1, 50, 0), (200, 0, 0)],
        &[2, 1, 0, 3],
        true,
        1,
    ),
];

fn run_reorder_cases(planner: Planner, cases: &[ReorderCase]) {
    for c in cases {
        let rows: Vec<RowShape> = c
            .rows
            .iter()
            .map(|&(q, comp, p)| shape(q, comp, p))
            .collect();
        let (order, modified) = reorder(planner, &rows, c.threshold);
        assert_eq!(order, c.expected_order, "{planner:?} {}", c.name);
        assert_eq!(
            modified, c.expected_modified,
            "{planner:?} {}: modified",
            c.name
        );
    }
}

#[test]
fn vllm_reorder_cases_four_region() {
    run_reorder_cases(Planner::Vllm, FOUR_REGION_CASES);
}

#[test]
fn vllm_reorder_cases_three_region() {
    run_reorder_cases(Planner::Vllm3Region, THREE_REGION_CASES);
}

/// PR #37303 changed only rows that have context, fit the threshold and are still
/// prefilling. The four-region cases without such a row come out the same under the
/// older rule; of the ones with one, only `four_way_multiple_short_extends` moves a row
/// (the old rule saw four decodes already in place).
#[test]
fn the_planners_differ_only_on_short_extends() {
    let mut differ = Vec::new();
    for c in FOUR_REGION_CASES {
        let rows: Vec<RowShape> = c
            .rows
            .iter()
            .map(|&(q, comp, p)| shape(q, comp, p))
            .collect();
        let has_short = rows.iter().any(|r| {
            r.num_computed_tokens > 0 && r.num_scheduled_tokens <= c.threshold && r.is_prefilling()
        });
        let (old, _) = reorder(Planner::Vllm3Region, &rows, c.threshold);
        if old != c.expected_order {
            assert!(has_short, "{} differs without a short extend", c.name);
            differ.push(c.name);
        }
    }
    assert_eq!(differ, ["four_way_multiple_short_extends"]);
}

// ---------------------------------------------------------------------------------------
// vLLM's split test cases (test_attention_splitting.py).

fn split_of(qs: &[usize], thr: usize, uniform: bool, padded_tokens: Option<usize>) -> SplitCounts {
    let none = vec![false; qs.len()];
    split(SplitInput {
        query_lens: qs,
        num_actual_tokens: padded_tokens.unwrap_or(qs.iter().sum()),
        decode_threshold: thr,
        require_uniform: uniform,
        treat_short_extends_as_decodes: true,
        is_prefilling: &none,
    })
}

fn counts(d: usize, p: usize, dt: usize, pt: usize) -> SplitCounts {
    SplitCounts {
        num_decodes: d,
        num_prefills: p,
        num_decode_tokens: dt,
        num_prefill_tokens: pt,
    }
}

/// One case of test_attention_splitting.py: name, query lengths, threshold,
/// require_uniform, padded token count, expected counts.
type SplitCase = (
    &'static str,
    &'static [usize],
    usize,
    bool,
    Option<usize>,
    SplitCounts,
);

#[test]
fn vllm_split_cases() {
    #[rustfmt::skip]
    let cases: [SplitCase; 9] = [
        ("nonuniform_all_ones", &[1, 1, 1], 1, false, None, counts(3, 0, 3, 0)),
        ("nonuniform_all_short_decodes", &[1, 2, 1, 3, 2, 1, 2], 3, false, None, counts(7, 0, 12, 0)),
        ("nonuniform_all_prefills", &[4, 5, 6, 7], 3, false, None, counts(0, 4, 0, 22)),
        ("nonuniform_mixed_batch", &[2, 1, 3, 4, 5, 6, 7, 8], 4, false, None, counts(4, 4, 10, 26)),
        ("uniform_all_ones", &[1, 1, 1], 1, true, None, counts(3, 0, 3, 0)),
        ("uniform_all_short_decodes", &[2, 2, 1, 3, 2, 1, 2], 3, true, None, counts(2, 5, 4, 9)),
        ("uniform_all_prefills", &[4, 5, 6, 7], 3, true, None, counts(0, 4, 0, 22)),
        ("uniform_mixed_batch_all_uniform_decodes", &[2, 2, 2, 4, 5, 6, 7, 8], 4, true, None, counts(3, 5, 6, 30)),
        ("uniform_mixed_batch_non_uniform_decodes", &[2, 1, 2, 4, 5, 6, 7, 8], 4, true, None, counts(1, 7, 2, 33)),
    ];
    for (name, qs, thr, uniform, padded, want) in cases {
        assert_eq!(split_of(qs, thr, uniform, padded), want, "{name}");
    }
    // uniform_padded_batch_all_same: q = 0 padding rows of a graph-padded batch count
    // as decodes and the padded token count is the decode token count.
    assert_eq!(
        split_of(&[2, 2, 2, 0], 3, true, Some(8)),
        counts(4, 0, 8, 0)
    );
}

/// `treat_short_extends_as_decodes = false` (vLLM's Mamba builders; the MLA builders
/// keep the default): a still-prefilling row ends the decodes.
#[test]
fn short_extends_end_the_decodes_when_not_treated_as_decodes() {
    let qs = [1, 1, 5];
    let prefilling = [false, true, true];
    let c = split(SplitInput {
        query_lens: &qs,
        num_actual_tokens: 7,
        decode_threshold: 1,
        require_uniform: false,
        treat_short_extends_as_decodes: false,
        is_prefilling: &prefilling,
    });
    assert_eq!(c, counts(1, 2, 1, 6));
}

// ---------------------------------------------------------------------------------------
// References for the properties.

/// vLLM's reorder simulated literally: regions, target regions, the misplaced rows
/// sorted stably by region as sources, the misplaced slots as destinations, and the
/// dict-ordered cycle of swaps on a list of request indices.
fn ref_reorder(planner: Planner, rows: &[RowShape], thr: usize) -> (Vec<usize>, bool) {
    let reg = |r: &RowShape| -> u8 {
        let below = r.num_scheduled_tokens <= thr;
        let done = r.num_computed_tokens >= r.num_prompt_tokens;
        if r.num_computed_tokens == 0 {
            3
        } else if !below {
            2
        } else if planner == Planner::Vllm && !done {
            1
        } else {
            0
        }
    };
    let regions: Vec<u8> = rows.iter().map(reg).collect();
    let mut counts = [0usize; 4];
    for &r in &regions {
        counts[r as usize] += 1;
    }
    let target: Vec<u8> = (0u8..4)
        .flat_map(|r| std::iter::repeat_n(r, counts[r as usize]))
        .collect();
    let orig: Vec<usize> = (0..rows.len())
        .filter(|&i| regions[i] != target[i])
        .collect();
    if orig.is_empty() {
        return ((0..rows.len()).collect(), false);
    }
    let mut src = orig.clone();
    src.sort_by_key(|&i| regions[i]);
    // The map keeps insertion order, as a Python dict does.
    let mut map: Vec<(usize, usize)> = src.iter().copied().zip(orig.iter().copied()).collect();
    let mut batch: Vec<usize> = (0..rows.len()).collect();
    for k in 0..map.len() {
        let src = map[k].0;
        let mut dst = map[k].1;
        while src != dst {
            batch.swap(src, dst);
            let next = map.iter().find(|e| e.0 == dst).map_or(dst, |e| e.1);
            if let Some(e) = map.iter_mut().find(|e| e.0 == dst) {
                e.1 = dst;
            }
            dst = next;
        }
    }
    (batch, true)
}

/// vLLM's split read literally: the decodes are the leading rows before the first row
/// that ends them, with the fast paths first.
fn ref_num_decodes(qs: &[usize], thr: usize, uniform: bool) -> usize {
    let n = qs.len();
    let max = qs.iter().copied().max().unwrap_or(0);
    if max <= thr && (!uniform || thr <= 1) {
        return n;
    }
    if qs[0] > thr {
        return 0;
    }
    if uniform && qs.iter().all(|&q| q == qs[0] || q == 0) {
        return n;
    }
    let ends = |q: usize| if uniform { q != qs[0] } else { q > thr };
    qs.iter().position(|&q| ends(q)).unwrap_or(n)
}

fn planner_strategy() -> impl Strategy<Value = Planner> {
    prop::sample::select(Planner::ALL.to_vec())
}

/// Rows with computed 0..50 (0 = fresh), q 0..20 (0 = padding) and a prompt that is
/// either done or not.
fn rows_strategy() -> impl Strategy<Value = Vec<RowShape>> {
    let row = (0usize..50, 0usize..20, 0usize..3).prop_map(|(c, q, p)| {
        let prompt = match p {
            0 => c.max(1),       // past the prompt
            1 => c + q.max(1),   // this chunk ends the prompt
            _ => c + q + 1 + 17, // more prompt after this chunk
        };
        shape(q, c, prompt)
    });
    prop::collection::vec(row, 0..16)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// The reorder is a permutation, moves only misplaced rows, lays regions out in
    /// order, equals vLLM's swap loop simulated step by step, and is idempotent.
    #[test]
    fn reorder_is_vllms(rows in rows_strategy(), thr in 1usize..=130, planner in planner_strategy()) {
        let n = rows.len();
        let (order, modified) = reorder(planner, &rows, thr);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());

        let region = |i: usize| specmla_core::reorder::region(planner, rows[i], thr);
        let mut target: Vec<Region> = (0..n).map(region).collect();
        target.sort();
        for p in 0..n {
            if region(p) == target[p] {
                prop_assert_eq!(order[p], p, "row {} was in its region yet moved", p);
            }
            prop_assert_eq!(region(order[p]), target[p], "position {} holds the wrong region", p);
        }
        prop_assert_eq!((order.clone(), modified), ref_reorder(planner, &rows, thr));

        let again: Vec<RowShape> = order.iter().map(|&i| rows[i]).collect();
        prop_assert_eq!(reorder(planner, &again, thr), ((0..n).collect::<Vec<_>>(), false));
    }

    /// The split equals a literal reading of vLLM's rule, and its counts add up.
    #[test]
    fn split_is_vllms(
        qs in prop::collection::vec(0usize..20, 1..16),
        thr in 1usize..=20,
        uniform in any::<bool>(),
    ) {
        let c = split_of(&qs, thr, uniform, None);
        let nd = ref_num_decodes(&qs, thr, uniform);
        let total: usize = qs.iter().sum();
        prop_assert_eq!(c.num_decodes, nd);
        prop_assert_eq!(c.num_prefills, qs.len() - nd);
        prop_assert_eq!(c.num_decode_tokens, qs[..nd].iter().sum::<usize>());
        prop_assert_eq!(c.num_decode_tokens + c.num_prefill_tokens, total);
    }

    /// reorder_and_split = vLLM's reorder then vLLM's split; extend-first moves the
    /// same decode rows to the end.
    #[test]
    fn reorder_and_split_composes_the_two(
        rows in rows_strategy(),
        thr in 1usize..=130,
        uniform in any::<bool>(),
        planner in planner_strategy(),
        layout in common::layout(),
    ) {
        let n = rows.len();
        let rules = PlanRules { planner, threshold: thr, require_uniform: uniform, layout };
        let s = reorder_and_split(&rows, rules);
        let (order, modified) = ref_reorder(planner, &rows, thr);
        prop_assert_eq!(s.modified, modified);
        let qs: Vec<usize> = order.iter().map(|&i| rows[i].num_scheduled_tokens).collect();
        let nd = if n == 0 { 0 } else { ref_num_decodes(&qs, thr, uniform) };
        prop_assert_eq!(s.num_decodes(), nd);
        let mut want = order.clone();
        match layout {
            RowLayout::DecodeFirst => prop_assert_eq!(s.decode_rows.clone(), 0..nd),
            RowLayout::ExtendFirst => {
                want.rotate_left(nd);
                prop_assert_eq!(s.decode_rows.clone(), n - nd..n);
            }
        }
        prop_assert_eq!(&s.order, &want);
        for (p, &i) in s.order.iter().enumerate() {
            prop_assert_eq!(s.regions[p], specmla_core::reorder::region(planner, rows[i], thr));
        }
    }

    /// Threshold and require_uniform for every non-empty set of attention groups.
    #[test]
    fn batch_threshold_is_the_minimum_over_groups(mask in 1u32..32, k in 0usize..=8, parallel in any::<bool>()) {
        let spec = spec_config(k, parallel);
        let groups: Vec<usize> = (0..5).filter(|b| mask >> b & 1 == 1).collect();
        let profiles: Vec<BackendProfile> = groups.iter().map(|&g| TABLE[g].0).collect();
        let want = groups.iter().map(|&g| ref_threshold(TABLE[g].1, TABLE[g].2, k, parallel)).min().unwrap();
        prop_assert_eq!(reorder_batch_threshold(&profiles, &spec), want);
        let want_uniform = groups.iter().any(|&g| TABLE[g].1 != QueryLenSupport::Varlen);
        prop_assert_eq!(require_uniform(&profiles), want_uniform);
    }

    /// SingleOnly profiles: every verify row (q = 1 + K >= 2, context > 0) runs on the
    /// prefill path, with a chunk plan covering its context.
    #[test]
    fn single_only_profiles_send_verify_rows_to_prefill(
        single_only in prop::sample::select(vec![BackendProfile::CutlassMla, BackendProfile::TritonMla]),
        k in 1usize..=8,
        ctx in prop::collection::vec(1usize..300, 1..12),
        seed in any::<u64>(),
        layout in common::layout(),
    ) {
        let cfg = engine_config(single_only, k, 16);
        let specs: Vec<RowSpec> = ctx.iter().map(|&c| RowSpec::verify(c, vec![3; k])).collect();
        let batch = build_batch(&cfg, &specs, k + 1, seed);
        let plan = plan_of(&cfg, &batch, layout);
        prop_assert_eq!(plan.threshold, 1);
        prop_assert_eq!(plan.mla.num_decodes, 0);
        prop_assert!(plan.rows.iter().all(|r| !r.is_decode));
        let pre = plan.mla.prefill.as_ref().expect("verify rows run as prefill");
        prop_assert_eq!(pre.rows.clone(), 0..ctx.len());
        let cc = pre.chunked_context.as_ref().expect("verify rows have context");
        for (j, r) in plan.rows.iter().enumerate() {
            let covered: usize = cc.chunks.iter().map(|ch| ch.lens[j]).sum();
            prop_assert_eq!(covered, r.num_computed_tokens);
        }
    }
}

/// Plan level: the plan's order and decode rows are the references', for every profile,
/// planner, K and layout, and `num_decode_tokens` is the decode rows' q.
mod plan_level {
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn plan_split_matches_the_reference(
            profile in common::profile(),
            planner in planner_strategy(),
            k in 0usize..=6,
            rows in prop::collection::vec(common::mixed_row(3, 200, 512), 1..12),
            seed in any::<u64>(),
            layout in common::layout(),
        ) {
            // Rows are generated for K = 3; re-shape verify rows to this K.
            let rows: Vec<RowSpec> = rows
                .into_iter()
                .map(|r| if r.num_computed > 0 && r.samples && !r.drafts.is_empty() {
                    RowSpec::verify(r.num_computed, vec![5; k])
                } else { r })
                .collect();
            let mut cfg = engine_config(profile, k, 16);
            cfg.scheduler.planner = planner;
            let batch = build_batch(&cfg, &rows, k + 1, seed);
            let plan = plan_of(&cfg, &batch, layout);
            let caps = profile.capabilities();
            let thr = ref_threshold(caps.query_len_support, caps.base_threshold, k, false);
            prop_assert_eq!(plan.threshold, thr);
            let shapes: Vec<RowShape> = batch.rows.iter().map(|r| r.shape()).collect();
            let (order, _) = ref_reorder(planner, &shapes, thr);
            let qs: Vec<usize> = order.iter().map(|&i| shapes[i].num_scheduled_tokens).collect();
            let uniform = caps.query_len_support != QueryLenSupport::Varlen;
            let nd = ref_num_decodes(&qs, thr, uniform);
            let mut want = order.clone();
            let dr = match layout {
                RowLayout::DecodeFirst => 0..nd,
                RowLayout::ExtendFirst => { want.rotate_left(nd); rows.len() - nd..rows.len() }
            };
            prop_assert_eq!(&plan.order, &want);
            prop_assert_eq!(plan.mla.num_decodes, nd);
            prop_assert_eq!(plan.mla.num_decode_tokens, qs[..nd].iter().sum::<usize>());
            let qsl = &plan.common.query_start_loc;
            prop_assert_eq!((qsl[dr.end] - qsl[dr.start]) as usize, plan.mla.num_decode_tokens);
        }
    }
}

/// The table, exhaustively: 5 profiles x K in 0..=8 x parallel drafting.
#[test]
fn profile_threshold_matches_the_table() {
    for (profile, support, base) in TABLE {
        assert_eq!(
            profile.capabilities().query_len_support,
            support,
            "{profile:?}"
        );
        assert_eq!(profile.capabilities().base_threshold, base, "{profile:?}");
        for k in 0..=8 {
            for parallel in [false, true] {
                let spec = spec_config(k, parallel);
                assert_eq!(
                    profile_threshold(profile, &spec),
                    ref_threshold(support, base, k, parallel),
                    "{profile:?} K={k} parallel={parallel}"
                );
            }
        }
    }
}

/// vLLM's split reads query lengths only: a fresh 4-token prompt that follows q = 4
/// verify rows on FlashMLA (K = 3) goes down the decode kernel, while a fresh 1-token
/// prompt after q = 1 decodes under a threshold of 1 is a decode by the fast path.
#[test]
fn a_fresh_prompt_can_be_a_decode() {
    let rows = [shape(4, 0, 4), shape(4, 100, 100), shape(4, 50, 50)];
    for layout in [RowLayout::DecodeFirst, RowLayout::ExtendFirst] {
        let rules = PlanRules {
            planner: Planner::Vllm,
            threshold: 128,
            require_uniform: true,
            layout,
        };
        let s = reorder_and_split(&rows, rules);
        assert_eq!(s.num_decodes(), 3, "{layout:?}");
    }
    let rows = [shape(1, 0, 1), shape(1, 5, 5)];
    let rules = PlanRules {
        planner: Planner::Vllm,
        threshold: 1,
        require_uniform: true,
        layout: RowLayout::DecodeFirst,
    };
    let s = reorder_and_split(&rows, rules);
    assert_eq!(s.order, vec![1, 0]);
    assert_eq!(s.num_decodes(), 2);
}

/// The old tidier rule (a stable sort) and vLLM's swaps disagree on which row takes the
/// decode kernel. Rows [fresh prompt, decode q = 2, decode q = 4] on FlashInfer-MLA
/// (threshold 4, uniform): the q = 2 row already sits in a decode slot and stays, the
/// q = 4 row swaps with the prompt into slot 0, so q = 4 is the uniform decode q. A
/// stable sort would have led with the q = 2 row.
#[test]
fn swaps_not_a_stable_sort_decide_the_uniform_q() {
    let rows = [shape(100, 0, 100), shape(2, 10, 10), shape(4, 10, 10)];
    let rules = PlanRules {
        planner: Planner::Vllm,
        threshold: 4,
        require_uniform: true,
        layout: RowLayout::DecodeFirst,
    };
    let s = reorder_and_split(&rows, rules);
    assert_eq!(s.order, vec![2, 1, 0]);
    assert_eq!(s.num_decodes(), 1);
    assert_eq!(s.order[0], 2, "the q = 4 row takes the decode kernel");
}
