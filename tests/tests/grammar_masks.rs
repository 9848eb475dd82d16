//! Mixed batches and grammar masks (RULES §3 step 2, §8 and bugs F8/F9): random
//! mixed batches (fresh prefills, extends, verify rows with drafts, fresh 1 + K
//! prompts) where some requests carry a `grammar::TokenAutomaton::random` grammar.
//! Plans built with DecodeFirst and ExtendFirst must give each request (matched by
//! req_id) the same q, seq_len, positions, slots, tokens, decode/prefill choice,
//! sampled positions and masks; every mask of verify position i must be the automaton's
//! allowed set after the row's own drafts[..i] (read from the ScheduledRow, computed
//! here token by token with `advance`); the decode planner must read exactly the
//! decode rows (F8); `invariants::check_plan` and `check_grammar_masks` stay silent.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use specmla_core::batch::ScheduledBatch;
use specmla_core::config::{BackendProfile, EngineConfig, QueryLenSupport, RowLayout};
use specmla_core::cudagraph::capture_sizes;
use specmla_core::grammar::{GrammarState, TokenAutomaton};
use specmla_core::invariants::{check_grammar_masks, check_plan, Rule};
use specmla_core::plan::{build_step_plan, StepPlan};
use specmla_tests::{
    build_batch, engine_config, planned_row, ref_slot, req_id_of, validated, RowSpec,
};

/// Grammar vocabulary: small so random drafts hit both allowed and disallowed tokens.
const GVOCAB: u32 = 70;

/// Grammars by request id (BTreeMap: deterministic, and lookups only).
type Grammars = BTreeMap<u64, (TokenAutomaton, GrammarState)>;

fn plan_with(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    layout: RowLayout,
    g: &Grammars,
) -> StepPlan {
    let lookup = |id: u64| g.get(&id).map(|(a, s)| (a, *s));
    build_step_plan(cfg, batch, &capture_sizes(cfg), layout, &lookup).expect("plan builds")
}

/// Reference mask after `drafts` from `state`: the set of tokens t with
/// `advance(s, t)` live, or everything once the state is dead.
fn ref_allowed(a: &TokenAutomaton, state: GrammarState, drafts: &[u32]) -> Vec<bool> {
    let mut s = state;
    for &d in drafts {
        s = a.advance(s, d);
    }
    (0..a.vocab_size as u32)
        .map(|t| s == GrammarState::Dead || matches!(a.advance(s, t), GrammarState::Live(_)))
        .collect()
}

/// Every per-request property of one plan, against the scheduled row.
fn check_layout(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    g: &Grammars,
) -> Result<(), TestCaseError> {
    let lookup = |id: u64| g.get(&id).map(|(a, s)| (a, *s));
    prop_assert_eq!(check_plan(cfg, batch, plan, &capture_sizes(cfg)), vec![]);
    prop_assert_eq!(check_grammar_masks(batch, plan, &lookup), vec![]);
    let c = &plan.common;
    for (i, b) in batch.rows.iter().enumerate() {
        let r = planned_row(plan, b.req_id);
        prop_assert_eq!(plan.order[r], i);
        let samples = plan.row_samples(r);
        let n = if b.samples { b.num_draft_tokens + 1 } else { 0 };
        prop_assert_eq!(samples.len(), n, "row {} sampled positions", r);
        // Sampled tokens: the last 1 + drafts of the row.
        for (j, x) in samples.clone().enumerate() {
            let t = plan.logits_indices[x] as usize;
            prop_assert_eq!(c.positions[t] as usize, b.seq_len() - n + j);
            prop_assert_eq!(
                plan.token_ids[t],
                b.token_ids[b.num_scheduled_tokens - n + j]
            );
        }
        let drafts = &b.token_ids[b.num_scheduled_tokens - b.num_draft_tokens..];
        for (j, x) in samples.enumerate() {
            let mask = &plan.grammar_masks[x];
            match g.get(&b.req_id) {
                None => prop_assert!(mask.is_none(), "unconstrained request got a mask"),
                Some((a, state)) => {
                    let mask = mask.as_ref().expect("constrained request has a mask");
                    let want = ref_allowed(a, *state, &drafts[..j]);
                    for (t, &ok) in want.iter().enumerate() {
                        prop_assert_eq!(
                            mask.allows(t as u32),
                            ok,
                            "req {} verify position {} token {}",
                            b.req_id,
                            j,
                            t
                        );
                    }
                }
            }
        }
    }
    // F8: the decode planner and kernel read exactly the decode rows.
    let dec: Vec<usize> = (0..plan.rows.len())
        .filter(|&r| plan.rows[r].is_decode)
        .collect();
    match &plan.mla.decode {
        None => prop_assert!(dec.is_empty()),
        Some(d) if plan.cudagraph.is_none() => {
            prop_assert_eq!(d.rows.clone().collect::<Vec<_>>(), dec.clone());
            let want: Vec<u32> = dec.iter().map(|&r| c.seq_lens[r]).collect();
            prop_assert_eq!(&d.plan_seq_lens, &want);
            prop_assert_eq!(
                d.tokens.clone(),
                c.query_start_loc[d.rows.start] as usize..c.query_start_loc[d.rows.end] as usize
            );
            if plan.require_uniform {
                prop_assert_eq!(d.uniform_query_len, Some(plan.rows[dec[0]].query_len));
            }
        }
        Some(_) => {}
    }
    Ok(())
}

/// A row's view in one plan: everything that must not depend on the layout.
#[derive(Debug, PartialEq)]
struct RowView {
    q: usize,
    seq_len: u32,
    computed: u32,
    positions: Vec<u32>,
    slots: Vec<i64>,
    tokens: Vec<u32>,
    is_decode: bool,
    sampled_positions: Vec<u32>,
    masks: Vec<Option<Vec<u64>>>,
    blocks: Vec<u32>,
}

/// `nblocks`: the request's allocated blocks (the table row is padded with zeros).
fn view(plan: &StepPlan, req: u64, nblocks: usize) -> RowView {
    let r = planned_row(plan, req);
    let c = &plan.common;
    let toks = c.row_tokens(r);
    RowView {
        q: c.query_len(r),
        seq_len: c.seq_lens[r],
        computed: c.num_computed_tokens[r],
        positions: c.positions[toks.clone()].to_vec(),
        slots: c.slot_mapping[toks.clone()].to_vec(),
        tokens: plan.token_ids[toks].to_vec(),
        is_decode: plan.rows[r].is_decode,
        sampled_positions: plan
            .row_samples(r)
            .map(|x| c.positions[plan.logits_indices[x] as usize])
            .collect(),
        masks: plan
            .row_samples(r)
            .map(|x| plan.grammar_masks[x].as_ref().map(|m| m.words.clone()))
            .collect(),
        blocks: c.block_row(r)[..nblocks].to_vec(),
    }
}

#[allow(clippy::type_complexity)]
fn case() -> impl Strategy<
    Value = (
        BackendProfile,
        usize,
        usize,
        Vec<RowSpec>,
        Vec<Option<(u64, u32)>>,
        u64,
    ),
> {
    (common::profile(), 1usize..=4, 1usize..=16).prop_flat_map(|(profile, k, page)| {
        let rows = prop::collection::vec(common::mixed_row(k, 600, GVOCAB), 1..12);
        // Per row: no grammar, or (automaton seed, committed state).
        let grammar = prop::collection::vec(prop::option::weighted(0.5, (0u64..4, 0u32..6)), 12);
        (
            Just(profile),
            Just(k),
            Just(page),
            rows,
            grammar,
            any::<u64>(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn layouts_agree_and_masks_follow_each_rows_drafts(
        (profile, k, page, rows, grammar, seed) in case(),
        graphs in any::<bool>(),
    ) {
        let mut cfg = engine_config(profile, k, page);
        cfg.cuda_graphs = graphs;
        let cfg = validated(cfg);
        let batch = build_batch(&cfg, &rows, k + 1, seed);
        let mut g = Grammars::new();
        for (i, spec) in grammar.iter().take(rows.len()).enumerate() {
            if let Some((aseed, state)) = *spec {
                let a = TokenAutomaton::random(6, GVOCAB as usize, 0.4, aseed);
                g.insert(req_id_of(i), (a, GrammarState::Live(state)));
            }
        }
        let d = plan_with(&cfg, &batch, RowLayout::DecodeFirst, &g);
        let e = plan_with(&cfg, &batch, RowLayout::ExtendFirst, &g);
        check_layout(&cfg, &batch, &d, &g)?;
        check_layout(&cfg, &batch, &e, &g)?;
        for b in &batch.rows {
            let nb = b.block_ids.len();
            let (vd, ve) = (view(&d, b.req_id, nb), view(&e, b.req_id, nb));
            prop_assert_eq!(&vd.blocks, &b.block_ids);
            prop_assert_eq!(vd.q, b.num_scheduled_tokens);
            prop_assert_eq!(vd.seq_len as usize, b.seq_len());
            let s = &cfg.scheduler;
            let want_slots: Vec<i64> = (b.num_computed_tokens..b.seq_len()).map(|p| ref_slot(&b.block_ids, p, page, s.max_model_len)).collect();
            prop_assert_eq!(&vd.slots, &want_slots);
            prop_assert_eq!(&vd.tokens, &b.token_ids);
            prop_assert_eq!(&vd, &ve, "request {} differs between layouts", b.req_id);
        }
        prop_assert_eq!(d.mla.num_decode_tokens, e.mla.num_decode_tokens);
        prop_assert_eq!(&d.cudagraph, &e.cudagraph);
    }
}

/// F8/F9 minimal trigger: 1 extend row + 2 verify rows on a Uniform backend, the first
/// verify row constrained, in the TokenSpeed layout. The decode planner reads only the
/// two verify rows, and each mask follows that row's own drafts.
#[test]
fn f8_f9_extend_plus_two_verify_rows() {
    let cfg = validated(engine_config(BackendProfile::FlashInferMla, 2, 16));
    assert_eq!(
        BackendProfile::FlashInferMla
            .capabilities()
            .query_len_support,
        QueryLenSupport::Uniform
    );
    let rows = [
        RowSpec::chunk(40, 20, true),
        RowSpec::verify(30, vec![3, 4]),
        RowSpec::verify(50, vec![5, 6]),
    ];
    let batch = build_batch(&cfg, &rows, 3, 11);
    let a = TokenAutomaton::random(4, GVOCAB as usize, 0.5, 2);
    let mut g = Grammars::new();
    g.insert(req_id_of(1), (a.clone(), GrammarState::Live(0)));
    for layout in [RowLayout::ExtendFirst, RowLayout::DecodeFirst] {
        let plan = plan_with(&cfg, &batch, layout, &g);
        let d = plan.mla.decode.as_ref().expect("verify rows decode");
        let want_rows = if layout == RowLayout::ExtendFirst {
            1..3
        } else {
            0..2
        };
        assert_eq!(d.rows, want_rows, "{layout:?}");
        // vLLM's reorder swaps the extend (slot 0) with the last verify row, so the
        // verify row with 50 tokens of context leads.
        assert_eq!(d.plan_seq_lens, vec![53, 33]);
        assert_eq!(d.uniform_query_len, Some(3));
        let r = planned_row(&plan, req_id_of(1));
        let masks: Vec<_> = plan
            .row_samples(r)
            .map(|x| plan.grammar_masks[x].clone().unwrap())
            .collect();
        for (j, m) in masks.iter().enumerate() {
            let want = ref_allowed(&a, GrammarState::Live(0), &[3, 4][..j]);
            assert!(
                want.iter()
                    .enumerate()
                    .all(|(t, &ok)| m.allows(t as u32) == ok),
                "{layout:?} position {j}"
            );
        }
        let lookup = |id: u64| g.get(&id).map(|(a, s)| (a, *s));
        assert_eq!(check_grammar_masks(&batch, &plan, &lookup), vec![]);
        assert_eq!(
            check_plan(&cfg, &batch, &plan, &capture_sizes(&cfg)),
            vec![]
        );

        // Negative controls: the checkers report F8 and F9 when they are injected.
        let mut f8 = plan.clone();
        f8.mla.decode.as_mut().unwrap().plan_seq_lens = f8.common.seq_lens.clone();
        let v = check_plan(&cfg, &batch, &f8, &capture_sizes(&cfg));
        assert!(v.iter().any(|v| v.rule == Rule::DecodeRows), "{v:?}");
        // F9: a mask taken from another request's (unconstrained) position.
        let mut f9 = plan.clone();
        let other = planned_row(&plan, req_id_of(2));
        let x = plan.row_samples(r).start;
        f9.grammar_masks[x] = f9.grammar_masks[plan.row_samples(other).start].clone();
        let v = check_grammar_masks(&batch, &f9, &lookup);
        assert!(v.iter().any(|v| v.rule == Rule::Sampling), "{v:?}");
    }
}
