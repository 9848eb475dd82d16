//! Drafter inputs (RULES §6): `drafter::first_pass` / `next_pass` in padded and
//! compacted mode and `drafter::dflash_pass` / `dflash_slot`, built from real plans of
//! random verify batches (plus some prefill rows) with random accept counts, checked
//! against a reference computed from the scheduled rows alone: shifted tokens, the
//! sampled index `query_start_loc[r+1] - 1 - n_rej`, positions, seq_lens, slots and PAD
//! at or past max_model_len. The padded-speculation claim is checked at the input
//! level: after pass 0 both modes feed every row the same position, seq_len and slot
//! (bug F4 breaks this). Named tests: the F4 and F5/F6 minimal triggers.

mod common;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use specmla_core::batch::ScheduledBatch;
use specmla_core::config::{BackendProfile, DrafterBatch, EngineConfig, RowLayout, SpecConfig};
use specmla_core::drafter::{
    dflash_pass, dflash_slot, first_pass, next_pass, DrafterPass, HiddenSource, RowOutcome,
};
use specmla_core::invariants::{check_dflash, check_drafter_pass, Rule};
use specmla_core::plan::StepPlan;
use specmla_tests::{
    build_batch, engine_config, outcomes_for, plan_of, ref_slot, validated, RowResult, RowSpec, PAD,
};

/// One generated case: a config shape and rows with their verification results.
#[derive(Clone, Debug)]
struct Case {
    profile: BackendProfile,
    k: usize,
    page: usize,
    max_model_len: usize,
    layout: RowLayout,
    rows: Vec<(RowSpec, RowResult)>,
    seed: u64,
}

fn case(profiles: Vec<BackendProfile>) -> impl Strategy<Value = Case> {
    (
        prop::sample::select(profiles),
        1usize..=6,
        1usize..=16,
        0usize..=200,
        common::layout(),
        any::<u64>(),
    )
        .prop_flat_map(|(profile, k, page, extra, layout, seed)| {
            let max_len = k + 2 + extra;
            // Verify rows with 0..=K drafts (nc biased toward the end of the model length
            // so drafter positions cross max_model_len), and fresh prompt chunks.
            let verify = (0..=k).prop_flat_map(move |nd| {
                let last = max_len - 1 - nd;
                let nc = prop_oneof![2 => 1..=last, 1 => last.saturating_sub(3).max(1)..=last];
                (nc, prop::collection::vec(0u32..512, nd), 0..=nd, 0u32..512).prop_map(
                    |(nc, drafts, acc, bonus)| {
                        (
                            RowSpec::verify(nc, drafts),
                            RowResult {
                                accepted: acc,
                                bonus,
                            },
                        )
                    },
                )
            });
            let prefill = (1..=max_len.min(24), any::<bool>(), 0u32..512).prop_map(
                move |(q, samples, bonus)| {
                    // A partial chunk needs a next prompt token inside max_model_len.
                    let samples = samples || q == max_len;
                    (
                        RowSpec::chunk(0, q, samples),
                        RowResult { accepted: 0, bonus },
                    )
                },
            );
            let row = prop_oneof![4 => verify, 1 => prefill];
            (
                Just(profile),
                Just(k),
                Just(page),
                Just(max_len),
                Just(layout),
                prop::collection::vec(row, 1..10),
                Just(seed),
            )
        })
        .prop_map(
            |(profile, k, page, max_model_len, layout, rows, seed)| Case {
                profile,
                k,
                page,
                max_model_len,
                layout,
                rows,
                seed,
            },
        )
}

fn config_for(c: &Case, spec: SpecConfig) -> EngineConfig {
    let mut cfg = engine_config(c.profile, c.k, c.page);
    cfg.scheduler.max_model_len = c.max_model_len;
    cfg.spec = spec;
    validated(cfg)
}

/// Builds the batch (blocks for nc + q + K + 1 tokens), plan and outcomes of a case.
fn build(c: &Case, cfg: &EngineConfig) -> (ScheduledBatch, StepPlan, Vec<RowOutcome>) {
    let specs: Vec<RowSpec> = c.rows.iter().map(|r| r.0.clone()).collect();
    let results: Vec<RowResult> = c.rows.iter().map(|r| r.1).collect();
    let batch = build_batch(cfg, &specs, c.k + 1, c.seed);
    let plan = plan_of(cfg, &batch, c.layout);
    let outcomes = outcomes_for(&batch, &plan, &results);
    (batch, plan, outcomes)
}

/// Reference pass 0 of planned row `r`: (q, sampled offset in the row, tokens,
/// positions, slots, seq_len, n_rej), from the scheduled row and its result only.
#[allow(clippy::type_complexity)]
fn ref_pass0(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    c: &Case,
    r: usize,
    mode: DrafterBatch,
) -> (usize, usize, Vec<Option<u32>>, Vec<u32>, Vec<i64>, u32, u32) {
    let i = plan.order[r];
    let (b, res) = (&batch.rows[i], c.rows[i].1);
    let (q, nd, nc) = (
        b.num_scheduled_tokens,
        b.num_draft_tokens,
        b.num_computed_tokens,
    );
    let (valid, next) = if b.samples {
        (q - nd + res.accepted, res.bonus)
    } else {
        (q, b.next_prompt_token.unwrap())
    };
    let n_rej = q - valid;
    let row_q = match mode {
        DrafterBatch::Padded => q,
        DrafterBatch::Compacted => valid,
    };
    // Position p consumes token p + 1; the last valid position consumes the next token;
    // tokens after it (padded only) are not pinned down by the rules.
    let tokens = (0..row_q)
        .map(|j| match (j + 1).cmp(&valid) {
            std::cmp::Ordering::Less => Some(b.token_ids[j + 1]),
            std::cmp::Ordering::Equal => Some(next),
            std::cmp::Ordering::Greater => None,
        })
        .collect();
    let positions = (nc..nc + row_q).map(|p| p as u32).collect();
    let s = &cfg.scheduler;
    let slots = (nc..nc + row_q)
        .map(|p| ref_slot(&b.block_ids, p, s.page_size, s.max_model_len))
        .collect();
    (
        row_q,
        valid - 1,
        tokens,
        positions,
        slots,
        (nc + row_q) as u32,
        if mode == DrafterBatch::Padded {
            n_rej as u32
        } else {
            0
        },
    )
}

fn check_pass0(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    c: &Case,
    p: &DrafterPass,
    mode: DrafterBatch,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(p.pass, 0);
    prop_assert_eq!(p.num_rows(), plan.rows.len());
    prop_assert_eq!(p.query_start_loc[0], 0);
    for r in 0..plan.rows.len() {
        let (q, sampled, tokens, positions, slots, seq_len, n_rej) =
            ref_pass0(cfg, batch, plan, c, r, mode);
        let (a, e) = (
            p.query_start_loc[r] as usize,
            p.query_start_loc[r + 1] as usize,
        );
        prop_assert_eq!(e - a, q, "row {} q", r);
        prop_assert_eq!(p.req_ids[r], plan.rows[r].req_id);
        // The RULES formula and the reference offset agree, and both name the token
        // holding the next token.
        prop_assert_eq!(
            p.token_indices_to_sample[r] as usize,
            e - 1 - n_rej as usize,
            "row {} sample index",
            r
        );
        prop_assert_eq!(p.token_indices_to_sample[r] as usize, a + sampled);
        for (j, want) in tokens.iter().enumerate() {
            if let Some(t) = want {
                prop_assert_eq!(p.token_ids[a + j], *t, "row {} token {}", r, j);
            }
        }
        prop_assert_eq!(&p.positions[a..e], &positions[..]);
        prop_assert_eq!(&p.slot_mapping[a..e], &slots[..]);
        prop_assert_eq!(p.seq_lens[r], seq_len);
        prop_assert_eq!(p.num_rejected[r], n_rej);
        let t0 = plan.common.query_start_loc[r];
        let want_hidden: Vec<HiddenSource> = (0..q as u32)
            .map(|j| HiddenSource::TargetToken(t0 + j))
            .collect();
        prop_assert_eq!(&p.hidden[a..e], &want_hidden[..]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Padded and compacted pass 0 against the reference, then K - 1 single-token
    /// passes fed the same proposals: both modes agree on every input the drafter's
    /// attention reads, and each matches the reference (position = last valid + j,
    /// seq_len = position + 1, slot or PAD).
    #[test]
    fn padded_and_compacted_passes_agree(c in case(BackendProfile::ALL.to_vec())) {
        let cfg = config_for(&c, SpecConfig::multi_step(c.k, DrafterBatch::Padded));
        let (batch, plan, outcomes) = build(&c, &cfg);
        let mut padded = first_pass(&cfg, &plan, &outcomes, DrafterBatch::Padded);
        let mut compact = first_pass(&cfg, &plan, &outcomes, DrafterBatch::Compacted);
        check_pass0(&cfg, &batch, &plan, &c, &padded, DrafterBatch::Padded)?;
        check_pass0(&cfg, &batch, &plan, &c, &compact, DrafterBatch::Compacted)?;
        prop_assert_eq!(check_drafter_pass(&cfg, &batch, &plan, &outcomes, &padded), vec![]);
        prop_assert_eq!(check_drafter_pass(&cfg, &batch, &plan, &outcomes, &compact), vec![]);
        // Both sample at the same position.
        let n = plan.rows.len();
        for r in 0..n {
            let pp = padded.positions[padded.token_indices_to_sample[r] as usize];
            let pc = compact.positions[compact.token_indices_to_sample[r] as usize];
            prop_assert_eq!(pp, pc);
        }
        let mut rng = ChaCha8Rng::seed_from_u64(c.seed ^ 0xD1AF);
        let s = &cfg.scheduler;
        for j in 1..c.k {
            let proposals: Vec<u32> = (0..n).map(|_| rng.gen_range(0..512)).collect();
            padded = next_pass(&cfg, &padded, &proposals);
            compact = next_pass(&cfg, &compact, &proposals);
            for p in [&padded, &compact] {
                prop_assert_eq!(p.pass, j);
                prop_assert_eq!(&p.token_ids, &proposals);
                prop_assert_eq!(&p.query_start_loc, &(0..=n as u32).collect::<Vec<_>>());
                prop_assert_eq!(&p.token_indices_to_sample, &(0..n as u32).collect::<Vec<_>>());
                for r in 0..n {
                    let i = plan.order[r];
                    let b = &batch.rows[i];
                    let o = outcomes[r];
                    let pos = b.num_computed_tokens + o.valid - 1 + j;
                    prop_assert_eq!(p.positions[r] as usize, pos, "pass {} row {}", j, r);
                    prop_assert_eq!(p.seq_lens[r] as usize, pos + 1, "pass {} row {} seq_len", j, r);
                    let want = ref_slot(&b.block_ids, pos, s.page_size, s.max_model_len);
                    prop_assert_eq!(p.slot_mapping[r], want);
                    prop_assert_eq!(want == PAD, pos >= s.max_model_len, "blocks do not back position {}", pos);
                }
                prop_assert_eq!(check_drafter_pass(&cfg, &batch, &plan, &outcomes, p), vec![]);
            }
            prop_assert_eq!(&padded.positions, &compact.positions);
            prop_assert_eq!(&padded.seq_lens, &compact.seq_lens);
            prop_assert_eq!(&padded.slot_mapping, &compact.slot_mapping);
        }
    }

    /// DFlash: context = this step's valid tokens, query block [next, mask x K] at
    /// last_valid + 1 ..= last_valid + 1 + K, slot or PAD.
    #[test]
    fn dflash_pass_matches_the_reference(c in case(vec![BackendProfile::FlashInferMla, BackendProfile::FlashAttnMla, BackendProfile::TritonMla])) {
        let cfg = config_for(&c, SpecConfig::dflash(c.k));
        let (batch, plan, outcomes) = build(&c, &cfg);
        let p = dflash_pass(&cfg, &plan, &outcomes);
        let s = &cfg.scheduler;
        let bl = 1 + c.k;
        prop_assert_eq!(p.block_len, bl);
        prop_assert_eq!(p.context_start_loc[0], 0);
        for r in 0..plan.rows.len() {
            let i = plan.order[r];
            let (b, res) = (&batch.rows[i], c.rows[i].1);
            let nc = b.num_computed_tokens;
            let (valid, next) = if b.samples {
                (b.num_scheduled_tokens - b.num_draft_tokens + res.accepted, res.bonus)
            } else {
                (b.num_scheduled_tokens, b.next_prompt_token.unwrap())
            };
            let (a, e) = (p.context_start_loc[r] as usize, p.context_start_loc[r + 1] as usize);
            prop_assert_eq!(e - a, valid);
            let t0 = plan.common.query_start_loc[r];
            prop_assert_eq!(&p.context_token_indices[a..e], &(t0..t0 + valid as u32).collect::<Vec<_>>()[..]);
            prop_assert_eq!(&p.context_positions[a..e], &(nc as u32..(nc + valid) as u32).collect::<Vec<_>>()[..]);
            let ctx_slots: Vec<i64> = (nc..nc + valid).map(|q| ref_slot(&b.block_ids, q, s.page_size, s.max_model_len)).collect();
            prop_assert_eq!(&p.context_slots[a..e], &ctx_slots[..]);
            let last_valid = nc + valid - 1;
            prop_assert_eq!(p.context_lens[r] as usize, last_valid + 1);
            for j in 0..bl {
                let x = r * bl + j;
                let pos = last_valid + 1 + j;
                prop_assert_eq!(p.block_tokens[x], (j == 0).then_some(next));
                prop_assert_eq!(p.block_positions[x] as usize, pos);
                let want = if pos >= s.max_model_len {
                    PAD
                } else {
                    b.block_ids[pos / s.page_size] as i64 * s.page_size as i64 + (pos % s.page_size) as i64
                };
                prop_assert_eq!(p.block_slots[x], want, "row {} offset {} position {}", r, j, pos);
            }
        }
        prop_assert_eq!(check_dflash(&cfg, &batch, &plan, &outcomes, &p), vec![]);
    }

    /// `dflash_slot` on its own: PAD at or past max_model_len, else the clamped block
    /// `min(pos / page, width - 1)` of whatever row it is given.
    #[test]
    fn dflash_slot_clamps_and_pads(
        page in 1usize..=16,
        max_len in 2usize..300,
        width_short in 0usize..3,
        pos_frac in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let full = max_len.div_ceil(page);
        let width = full.saturating_sub(width_short).max(1);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let row: Vec<u32> = (0..width).map(|_| rng.gen_range(0..100_000)).collect();
        let pos = ((max_len + 2 * page) as f64 * pos_frac) as usize;
        let want = if pos >= max_len {
            PAD
        } else {
            row[(pos / page).min(width - 1)] as i64 * page as i64 + (pos % page) as i64
        };
        prop_assert_eq!(dflash_slot(&row, pos, page, max_len), want);
    }
}

/// F4: K = 3, nothing accepted. Pass 1 must drop the 3 rejected tokens from seq_len
/// (position 11, seq_len 12); keeping them (seq_len 15) is what the reference and
/// `check_drafter_pass` both reject.
#[test]
fn f4_padded_drafter_drops_rejected_seq_len() {
    let cfg = engine_config(BackendProfile::FlashInferMla, 3, 16);
    let batch = build_batch(&cfg, &[RowSpec::verify(10, vec![1, 2, 3])], 4, 5);
    let plan = plan_of(&cfg, &batch, RowLayout::DecodeFirst);
    let outcomes = outcomes_for(
        &batch,
        &plan,
        &[RowResult {
            accepted: 0,
            bonus: 42,
        }],
    );
    assert_eq!(
        outcomes[0],
        RowOutcome {
            valid: 1,
            next_token: 42,
            num_rejected: 3
        }
    );
    let p0 = first_pass(&cfg, &plan, &outcomes, DrafterBatch::Padded);
    assert_eq!(p0.token_indices_to_sample, vec![0]);
    assert_eq!(p0.token_ids[0], 42);
    let p1 = next_pass(&cfg, &p0, &[7]);
    assert_eq!((p1.positions[0], p1.seq_lens[0]), (11, 12));
    let c1 = next_pass(
        &cfg,
        &first_pass(&cfg, &plan, &outcomes, DrafterBatch::Compacted),
        &[7],
    );
    assert_eq!(
        (c1.positions[0], c1.seq_lens[0], c1.slot_mapping[0]),
        (11, 12, p1.slot_mapping[0])
    );
    // The bug, simulated: the reference property and the checker both catch it.
    let mut buggy = p1.clone();
    buggy.seq_lens[0] += 3;
    assert_ne!(buggy.seq_lens[0], buggy.positions[0] + 1);
    let v = check_drafter_pass(&cfg, &batch, &plan, &outcomes, &buggy);
    assert!(v.iter().any(|v| v.rule == Rule::DrafterInputs), "{v:?}");
}

/// F5/F6: page 16, max_model_len 64, K = 3, last valid position 60. The block covers
/// positions 61..=64 in a 4-block table: 61..=63 live in block 3, 64 is PAD (an
/// unclamped block index would be 4, past the table; an unpadded slot would be live).
#[test]
fn f5_f6_dflash_block_at_the_end_of_the_model_length() {
    for (nc, drafts, accepted) in [(57usize, 3usize, 3usize), (59, 3, 1)] {
        let mut cfg = engine_config(BackendProfile::FlashInferMla, 3, 16);
        cfg.scheduler.max_model_len = 64;
        cfg.spec = SpecConfig::dflash(3);
        let cfg = validated(cfg);
        let batch = build_batch(&cfg, &[RowSpec::verify(nc, vec![5; drafts])], 4, 9);
        let plan = plan_of(&cfg, &batch, RowLayout::ExtendFirst);
        assert_eq!(plan.common.block_table_width, 4);
        let outcomes = outcomes_for(&batch, &plan, &[RowResult { accepted, bonus: 1 }]);
        let p = dflash_pass(&cfg, &plan, &outcomes);
        assert_eq!(p.context_lens, vec![61], "last valid position is 60");
        assert_eq!(p.block_positions, vec![61, 62, 63, 64]);
        let b3 = batch.rows[0].block_ids[3] as i64 * 16;
        assert_eq!(p.block_slots, vec![b3 + 13, b3 + 14, b3 + 15, PAD]);
        assert_eq!(dflash_slot(plan.common.block_row(0), 64, 16, 64), PAD);
        assert_eq!(check_dflash(&cfg, &batch, &plan, &outcomes, &p), vec![]);
    }
}

/// RULES §6: a backend without non-causal attention is refused at start-up with
/// a clear error naming it, and so is a padded DFlash batch.
#[test]
fn dflash_is_refused_on_causal_only_backends() {
    // Non-causal support per the RULES §4 table.
    let table = [
        (BackendProfile::FlashMla, false),
        (BackendProfile::FlashInferMla, true),
        (BackendProfile::CutlassMla, false),
        (BackendProfile::FlashAttnMla, true),
        (BackendProfile::TritonMla, true),
    ];
    for (profile, non_causal) in table {
        let mut cfg = engine_config(BackendProfile::FlashInferMla, 3, 16);
        cfg.spec = SpecConfig::dflash(3);
        cfg.backends = vec![BackendProfile::FlashInferMla, profile];
        match cfg.validate() {
            Ok(()) => assert!(non_causal, "{profile:?} accepted for DFlash"),
            Err(e) => {
                assert!(!non_causal, "{profile:?} refused: {e}");
                let msg = e.to_string();
                assert!(
                    msg.contains("non-causal") && msg.contains(profile.name()),
                    "{msg}"
                );
                assert!(!msg.contains('\n'), "one-line message: {msg}");
            }
        }
    }
    let mut cfg = engine_config(BackendProfile::FlashInferMla, 3, 16);
    cfg.spec = SpecConfig::dflash(3);
    cfg.spec.drafter_batch = DrafterBatch::Padded;
    assert!(cfg.validate().is_err());
}
