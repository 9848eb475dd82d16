//! CUDA graphs (RULES §7): `cudagraph::capture_sizes`, `graph_shapes` and
//! `dispatch` against references written from docs/RULES.md (multiples of 1 + K, bounds,
//! smallest size that holds the batch, q = 0 padding rows), the named triggers of bugs
//! F3 (K = 2 capturing 8 tokens) and F7 (a fresh 1 + K token prompt on the verify
//! graph), and padded plans from `plan::build_step_plan` checked field by field and by
//! `invariants::check_plan`.

mod common;

use proptest::prelude::*;
use specmla_core::config::{BackendProfile, CudaGraphSupport, EngineConfig, RowLayout};
use specmla_core::cudagraph::{capture_sizes, dispatch, graph_shapes};
use specmla_core::invariants::check_plan;
use specmla_core::reorder::RowShape;
use specmla_tests::{build_batch, engine_config, plan_of, ref_slot, validated, RowSpec, PAD};

/// vLLM's default capture ladder (1, 2, 4, 8..=248 by 8, then by 16 up to the maximum).
fn ladder(max: usize) -> Vec<usize> {
    let mut v = vec![1, 2, 4];
    let mut s = 8;
    while s < 256 {
        v.push(s);
        s += 8;
    }
    let mut s = 256;
    while s <= max.max(256) {
        v.push(s);
        s += 16;
    }
    v
}

/// A graph-enabled config: `profile`, K drafts, row and capture limits.
fn graph_config(
    profile: BackendProfile,
    k: usize,
    max_num_seqs: usize,
    max_capture: usize,
    graphs: bool,
) -> EngineConfig {
    let mut cfg = engine_config(profile, k, 16);
    cfg.cuda_graphs = graphs;
    cfg.max_capture_size_tokens = max_capture;
    cfg.scheduler.max_num_seqs = max_num_seqs;
    validated(cfg)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn capture_sizes_are_multiples_within_bounds(
        profile in common::profile(),
        k in 0usize..=8,
        max_num_seqs in 1usize..=64,
        max_capture in 1usize..=600,
        graphs in any::<bool>(),
    ) {
        let cfg = graph_config(profile, k, max_num_seqs, max_capture, graphs);
        let q = 1 + k;
        let sizes = capture_sizes(&cfg);
        let support = profile.capabilities().cuda_graph;
        let usable = graphs && match support {
            CudaGraphSupport::Never => false,
            CudaGraphSupport::UniformSingleTokenDecode => k == 0,
            _ => true,
        };
        if !usable {
            prop_assert!(sizes.is_empty(), "graphs captured although unusable: {:?}", sizes);
            return Ok(());
        }
        let max = max_capture.min(max_num_seqs * q);
        for w in sizes.windows(2) {
            prop_assert!(w[0] < w[1], "not sorted and deduplicated: {:?}", sizes);
        }
        for &s in &sizes {
            prop_assert!(s > 0 && s % q == 0, "size {} not a multiple of {}", s, q);
            prop_assert!(s <= max_capture && s <= max_num_seqs * q, "size {} above the maximum", s);
        }
        if k == 2 {
            prop_assert!(!sizes.contains(&8), "K = 2 captured 8 tokens (F3)");
        }
        // Exactly the ladder rounded up to multiples of q, within the maximum.
        let mut want: Vec<usize> = ladder(max).into_iter().map(|s| s.div_ceil(q) * q).filter(|&s| s <= max).collect();
        want.sort_unstable();
        want.dedup();
        prop_assert_eq!(&sizes, &want);
        // graph_shapes: one uniform shape per size.
        let shapes = graph_shapes(&cfg);
        prop_assert_eq!(shapes.len(), sizes.len());
        for (sh, &s) in shapes.iter().zip(&sizes) {
            prop_assert_eq!((sh.num_tokens, sh.num_rows, sh.query_len, sh.max_query_len), (s, s / q, q, q));
        }
    }

    #[test]
    fn dispatch_picks_the_smallest_size_for_uniform_verify_rows(
        profile in prop::sample::select(vec![BackendProfile::FlashMla, BackendProfile::FlashInferMla, BackendProfile::FlashAttnMla]),
        k in 0usize..=6,
        max_num_seqs in 1usize..=40,
        max_capture in 1usize..=300,
        // Mostly verify rows; sometimes a fresh prompt, a wrong q, or a chunk of a prompt
        // that is not done (kind 0 verify, 1 fresh, 2 wrong q, 3 prefilling).
        rows in prop::collection::vec(prop_oneof![
            8 => (1usize..100, Just(0u8)),
            1 => (Just(0usize), Just(1u8)),
            1 => (1usize..100, Just(2u8)),
            1 => (1usize..100, Just(3u8)),
        ], 0..48),
        wrong_q in 0usize..10,
    ) {
        let cfg = graph_config(profile, k, max_num_seqs, max_capture, true);
        let q = 1 + k;
        let sizes = capture_sizes(&cfg);
        let rows: Vec<RowShape> = rows
            .iter()
            .map(|&(c, kind)| RowShape {
                num_computed_tokens: c,
                num_scheduled_tokens: if kind == 2 && wrong_q != q { wrong_q } else { q },
                num_prompt_tokens: match kind {
                    1 => q,
                    3 => c + q + 5,
                    _ => c,
                },
            })
            .collect();
        let got = dispatch(&cfg, &rows, &sizes);
        // vLLM's fixed `_is_uniform_decode`: every row 1 + K tokens and past its prompt.
        let eligible = !rows.is_empty()
            && rows
                .iter()
                .all(|r| r.num_scheduled_tokens == q && r.num_computed_tokens >= r.num_prompt_tokens);
        let tokens = rows.len() * q;
        let smallest = sizes.iter().copied().filter(|&s| s >= tokens).min();
        match (eligible, smallest) {
            (true, Some(size)) => {
                let g = got.expect("an eligible batch with a size that holds it dispatches");
                prop_assert_eq!(g.shape.num_tokens, size);
                prop_assert_eq!(g.shape.num_rows, size / q);
                prop_assert_eq!((g.shape.query_len, g.shape.max_query_len), (q, q));
                prop_assert_eq!(g.num_padding_rows, size / q - rows.len());
                prop_assert_eq!(g.num_padding_tokens, size - tokens);
            }
            _ => prop_assert!(got.is_none(), "dispatched {:?} for rows {:?}", got, rows),
        }
    }

    /// Padded plans: q = 0 padding rows with seq_len 0, PAD slots on padding tokens,
    /// decode metadata over every row, and no invariant violation.
    #[test]
    fn padded_plans_have_inert_padding(
        profile in prop::sample::select(vec![BackendProfile::FlashMla, BackendProfile::FlashInferMla, BackendProfile::FlashAttnMla]),
        k in 0usize..=4,
        ctx in prop::collection::vec(1usize..500, 1..20),
        fresh in any::<bool>(),
        page in 1usize..=16,
        layout in common::layout(),
        seed in any::<u64>(),
    ) {
        let mut cfg = engine_config(profile, k, page);
        cfg.cuda_graphs = true;
        cfg.max_capture_size_tokens = 64;
        let cfg = validated(cfg);
        let q = 1 + k;
        let mut specs: Vec<RowSpec> = ctx.iter().map(|&c| RowSpec::verify(c, vec![9; k])).collect();
        if fresh {
            // A fresh prompt of exactly 1 + K tokens must keep the batch off the graph.
            specs.push(RowSpec::chunk(0, q, true));
        }
        let batch = build_batch(&cfg, &specs, k + 1, seed);
        let sizes = capture_sizes(&cfg);
        let plan = plan_of(&cfg, &batch, layout);
        prop_assert_eq!(check_plan(&cfg, &batch, &plan, &sizes), vec![]);
        let c = &plan.common;
        let n = specs.len();
        let tokens = n * q;
        let want_size = sizes.iter().copied().find(|&s| s >= tokens).filter(|_| !fresh);
        prop_assert_eq!(plan.cudagraph.map(|g| g.shape.num_tokens), want_size);
        let (rows_total, tokens_total) = match want_size {
            Some(size) => (size / q, size),
            None => (n, tokens),
        };
        prop_assert_eq!(c.num_rows(), rows_total);
        prop_assert_eq!(c.num_reqs, n);
        prop_assert_eq!(c.num_actual_tokens, tokens);
        prop_assert_eq!(c.slot_mapping.len(), tokens_total);
        prop_assert_eq!(c.positions.len(), tokens_total);
        prop_assert_eq!(plan.token_ids.len(), tokens_total);
        for r in n..rows_total {
            prop_assert_eq!(c.query_len(r), 0);
            prop_assert_eq!(c.seq_lens[r], 0);
        }
        for t in tokens..tokens_total {
            prop_assert_eq!(c.slot_mapping[t], PAD);
        }
        // Real tokens keep their own slots.
        for (r, &i) in plan.order.iter().enumerate() {
            let b = &batch.rows[i];
            for (j, t) in c.row_tokens(r).enumerate() {
                let pos = b.num_computed_tokens + j;
                prop_assert_eq!(c.slot_mapping[t], ref_slot(&b.block_ids, pos, page, cfg.scheduler.max_model_len));
            }
        }
        if let (Some(size), true) = (want_size, tokens_total > tokens) {
            // Negative control: a live slot on a padding token is reported.
            let mut bad = plan.clone();
            bad.common.slot_mapping[size - 1] = 0;
            prop_assert!(!check_plan(&cfg, &batch, &bad, &sizes).is_empty());
        }
        if want_size.is_some() {
            let d = plan.mla.decode.as_ref().expect("a graph runs the decode kernel");
            prop_assert_eq!(d.rows.clone(), 0..rows_total);
            prop_assert_eq!(d.uniform_query_len.unwrap_or(q), q);
            prop_assert_eq!(plan.common.max_query_len, q);
            prop_assert!(plan.mla.prefill.is_none());
        }
    }
}

/// F3: K = 2 with a maximum of 8 tokens captures [3, 6], never 8 (which would replay a
/// dummy batch [3, 3, 2]).
#[test]
fn f3_k2_never_captures_8_tokens() {
    let cfg = graph_config(BackendProfile::FlashMla, 2, 64, 8, true);
    assert_eq!(capture_sizes(&cfg), vec![3, 6]);
    let cfg = graph_config(BackendProfile::FlashInferMla, 2, 64, 512, true);
    assert!(capture_sizes(&cfg).iter().all(|s| s % 3 == 0));
}

/// F7: K = 3. A fresh prompt of 4 tokens, alone or next to verify rows, and the last
/// 4-token chunk of a longer prompt are never replayed on the verify graph (vLLM #49918
/// and its fix: every graph row must be past its prompt); with F7 the shape alone
/// decides.
#[test]
fn f7_prompt_chunks_of_1_plus_k_tokens_are_not_dispatched() {
    let cfg = graph_config(BackendProfile::FlashMla, 3, 64, 512, true);
    let sizes = capture_sizes(&cfg);
    assert!(sizes.contains(&4));
    let row = |c: usize, prompt: usize| RowShape {
        num_computed_tokens: c,
        num_scheduled_tokens: 4,
        num_prompt_tokens: prompt,
    };
    assert_eq!(dispatch(&cfg, &[row(0, 4)], &sizes), None);
    assert_eq!(dispatch(&cfg, &[row(10, 10), row(0, 4)], &sizes), None);
    assert_eq!(dispatch(&cfg, &[row(10, 10), row(20, 24)], &sizes), None);
    assert!(dispatch(&cfg, &[row(10, 10), row(1, 1)], &sizes).is_some());
    let mut faulty = cfg.clone();
    faulty.faults = faulty.faults.with(specmla_core::fault::Fault::F7);
    assert!(dispatch(&faulty, &[row(10, 10), row(0, 4)], &sizes).is_some());
    let batch = build_batch(&cfg, &[RowSpec::chunk(0, 4, true)], 4, 1);
    for layout in [RowLayout::DecodeFirst, RowLayout::ExtendFirst] {
        let plan = plan_of(&cfg, &batch, layout);
        assert_eq!(plan.cudagraph, None);
        assert_eq!(check_plan(&cfg, &batch, &plan, &sizes), vec![]);
    }
}

/// SingleOnly profiles cannot run a multi-token verify graph: nothing is captured.
#[test]
fn single_token_graph_profiles_capture_nothing_with_spec() {
    for p in [BackendProfile::CutlassMla, BackendProfile::TritonMla] {
        assert!(
            capture_sizes(&graph_config(p, 1, 64, 512, true)).is_empty(),
            "{p:?}"
        );
        assert!(
            !capture_sizes(&graph_config(p, 0, 64, 512, true)).is_empty(),
            "{p:?}"
        );
    }
}
