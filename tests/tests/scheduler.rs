//! Scheduler (RULES §3 steps 1 and 6): `scheduler::Scheduler` driven through
//! random workloads (prompt lengths, max_new_tokens, arrival steps) on small block pools
//! so preemption happens, with fabricated verification results (random accepted counts
//! and bonus tokens) and drafts. A shadow model kept by the test (each request's tokens,
//! drafts, computed count) is the reference. Each step: token, row and budget limits,
//! no request twice, rows carry the right tokens and drafts, block tables cover the
//! scheduled tokens, blocks are conserved (free + held == pool, held ids distinct),
//! rejected tokens' blocks are rolled back, and unmixed steps never mix prefill and
//! decode rows. At the end every request finished once with exactly the tokens the test
//! committed, min(max_new_tokens, max_model_len - prompt_len) of them.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use specmla_core::config::{BackendProfile, EngineConfig};
use specmla_core::request::RequestSpec;
use specmla_core::scheduler::{validate_workload, Commit, Scheduler};
use specmla_tests::{engine_config, validated};

#[derive(Clone, Debug)]
struct Case {
    profile: BackendProfile,
    k: usize,
    page: usize,
    max_model_len: usize,
    extra_blocks: usize,
    max_num_seqs: usize,
    chunked: bool,
    budget: usize,
    chunk: usize,
    mixed: bool,
    /// (prompt length, max_new_tokens, arrival step)
    requests: Vec<(usize, usize, u64)>,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        common::profile(),
        0usize..=3,
        prop::sample::select(vec![1usize, 2, 4, 8, 16]),
        16usize..=96,
        0usize..=6,
        1usize..=6,
        any::<bool>(),
        0usize..=60,
        1usize..=32,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_flat_map(
            |(
                profile,
                k,
                page,
                max_len,
                extra_blocks,
                seqs,
                chunked,
                budget,
                chunk,
                mixed,
                seed,
            )| {
                let req = (1..max_len, 1usize..=40, 0u64..10);
                (
                    Just((
                        profile,
                        k,
                        page,
                        max_len,
                        extra_blocks,
                        seqs,
                        chunked,
                        budget,
                        chunk,
                        mixed,
                        seed,
                    )),
                    prop::collection::vec(req, 1..=8),
                )
            },
        )
        .prop_map(
            |(
                (
                    profile,
                    k,
                    page,
                    max_model_len,
                    extra_blocks,
                    max_num_seqs,
                    chunked,
                    budget,
                    chunk,
                    mixed,
                    seed,
                ),
                requests,
            )| Case {
                profile,
                k,
                page,
                max_model_len,
                extra_blocks,
                max_num_seqs,
                chunked,
                budget,
                chunk,
                mixed,
                requests,
                seed,
            },
        )
}

fn config(c: &Case) -> EngineConfig {
    let mut cfg = engine_config(c.profile, c.k, c.page);
    let s = &mut cfg.scheduler;
    s.max_model_len = c.max_model_len;
    s.num_gpu_blocks = c.max_model_len.div_ceil(c.page) + c.extra_blocks;
    s.max_num_seqs = c.max_num_seqs;
    s.chunked_prefill = c.chunked;
    s.prefill_chunk_tokens = c.chunk;
    // Without chunked prefill the whole prompt must fit one step.
    s.max_num_batched_tokens = if c.chunked {
        (1 + c.k) + c.budget
    } else {
        c.max_model_len + c.budget
    };
    s.mixed_batches = c.mixed;
    s.workspace_tokens = c.max_num_seqs * c.page;
    validated(cfg)
}

/// The test's own view of a request.
struct Shadow {
    prompt: Vec<u32>,
    max_new: usize,
    /// Every token committed by the test, in order (the scheduler truncates at finish).
    output: Vec<u32>,
    /// Drafts handed to `set_drafts` and not consumed yet.
    drafts: Vec<u32>,
    finished: bool,
}

impl Shadow {
    fn tokens(&self) -> Vec<u32> {
        self.prompt.iter().chain(&self.output).copied().collect()
    }
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let cfg = config(c);
    let s = cfg.scheduler.clone();
    let lookahead = if c.k > 0 { c.k + 1 } else { 0 };
    let mut rng = ChaCha8Rng::seed_from_u64(c.seed);
    let workload: Vec<RequestSpec> = c
        .requests
        .iter()
        .enumerate()
        .map(|(i, &(plen, max_new, arrival))| RequestSpec {
            id: 100 + i as u64,
            prompt: (0..plen).map(|_| rng.gen_range(0..512)).collect(),
            max_new_tokens: max_new,
            arrival_step: arrival,
            grammar: None,
        })
        .collect();
    prop_assert_eq!(validate_workload(&cfg, &workload), Ok(()));
    let mut shadow: BTreeMap<u64, Shadow> = workload
        .iter()
        .map(|r| {
            (
                r.id,
                Shadow {
                    prompt: r.prompt.clone(),
                    max_new: r.max_new_tokens,
                    output: Vec::new(),
                    drafts: Vec::new(),
                    finished: false,
                },
            )
        })
        .collect();
    let mut sched = Scheduler::new(cfg.clone(), workload);

    let check_blocks = |sched: &Scheduler, when: &str| -> Result<(), TestCaseError> {
        let mut held: Vec<u32> = sched
            .requests()
            .flat_map(|r| r.block_ids.iter().copied())
            .collect();
        prop_assert_eq!(
            sched.num_free_blocks() + held.len(),
            s.num_gpu_blocks,
            "block leak {}",
            when
        );
        held.sort_unstable();
        let n = held.len();
        held.dedup();
        prop_assert_eq!(held.len(), n, "a block is held twice {}", when);
        prop_assert!(held.iter().all(|&b| (b as usize) < s.num_gpu_blocks));
        Ok(())
    };

    let mut steps = 0;
    while !sched.is_done() {
        steps += 1;
        prop_assert!(steps <= 20_000, "no progress after 20000 steps");
        let batch = sched.schedule();
        check_blocks(&sched, "after schedule")?;
        prop_assert!(batch.num_tokens() <= s.max_num_batched_tokens);
        prop_assert!(batch.rows.len() <= s.max_num_seqs);
        let mut ids: Vec<u64> = batch.rows.iter().map(|r| r.req_id).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assert_eq!(ids.len(), batch.rows.len(), "a request appears twice");
        for p in &batch.preempted {
            prop_assert!(!ids.contains(p), "request {} preempted and scheduled", p);
            shadow.get_mut(p).unwrap().drafts.clear();
        }
        let (mut prefills, mut decodes) = (0, 0);
        for row in &batch.rows {
            let sh = &shadow[&row.req_id];
            prop_assert!(!sh.finished);
            let toks = sh.tokens();
            let (nc, q, nd) = (
                row.num_computed_tokens,
                row.num_scheduled_tokens,
                row.num_draft_tokens,
            );
            prop_assert!(q >= 1 && nd < q);
            prop_assert!(nc + q <= s.max_model_len, "row past max_model_len");
            prop_assert!(
                row.block_ids.len() * s.page_size >= nc + q,
                "blocks do not cover the row"
            );
            prop_assert_eq!(
                &row.block_ids,
                &sched.request(row.req_id).unwrap().block_ids
            );
            let committed = q - nd;
            prop_assert!(nc + committed <= toks.len());
            prop_assert_eq!(&row.token_ids[..committed], &toks[nc..nc + committed]);
            prop_assert_eq!(row.samples, nc + committed == toks.len());
            if !row.samples {
                prop_assert_eq!(row.next_prompt_token, Some(toks[nc + committed]));
            }
            // Drafts: a prefix of what the test handed over.
            prop_assert!(nd <= sh.drafts.len());
            prop_assert_eq!(&row.token_ids[committed..], &sh.drafts[..nd]);
            let is_decode = nc > 0 && nc + 1 == toks.len();
            if is_decode {
                decodes += 1;
            } else {
                prefills += 1;
                prop_assert_eq!(nd, 0, "a prefill row carries drafts");
            }
        }
        if !s.mixed_batches {
            prop_assert!(
                prefills == 0 || decodes == 0,
                "unmixed step with {} prefills and {} decodes",
                prefills,
                decodes
            );
        }

        // Fabricated verification.
        let mut commits = Vec::new();
        let mut expect_nc = BTreeMap::new();
        for row in &batch.rows {
            let nd = row.num_draft_tokens;
            let mut new_tokens = Vec::new();
            let mut accepted = 0;
            if row.samples {
                accepted = rng.gen_range(0..=nd);
                new_tokens
                    .extend_from_slice(&row.token_ids[row.num_scheduled_tokens - nd..][..accepted]);
                new_tokens.push(rng.gen_range(0..512));
            }
            expect_nc.insert(
                row.req_id,
                row.num_computed_tokens + row.num_scheduled_tokens - nd + accepted,
            );
            let sh = shadow.get_mut(&row.req_id).unwrap();
            sh.output.extend_from_slice(&new_tokens);
            sh.drafts.clear();
            commits.push(Commit {
                req_id: row.req_id,
                num_scheduled_tokens: row.num_scheduled_tokens,
                num_draft_tokens: nd,
                new_tokens,
            });
        }
        sched.commit(&commits);
        check_blocks(&sched, "after commit")?;
        for f in sched.take_finished() {
            let sh = shadow.get_mut(&f.id).unwrap();
            prop_assert!(!sh.finished, "request {} finished twice", f.id);
            sh.finished = true;
            let want_len = sh.max_new.min(s.max_model_len - sh.prompt.len());
            prop_assert_eq!(f.prompt_len, sh.prompt.len());
            prop_assert_eq!(f.output.len(), want_len, "request {} output length", f.id);
            prop_assert_eq!(&f.output[..], &sh.output[..want_len]);
            prop_assert!(sched.request(f.id).is_none());
        }
        for row in &batch.rows {
            let Some(req) = sched.request(row.req_id) else {
                continue;
            };
            // Progress and rollback: blocks for the committed tokens plus lookahead.
            let nc = expect_nc[&row.req_id];
            prop_assert_eq!(req.num_computed_tokens, nc);
            prop_assert_eq!(
                req.block_ids.len(),
                (nc + lookahead).min(s.max_model_len).div_ceil(s.page_size),
                "blocks not rolled back"
            );
            if row.samples && c.k > 0 {
                let drafts: Vec<u32> = (0..c.k).map(|_| rng.gen_range(0..512)).collect();
                sched.set_drafts(row.req_id, drafts.clone(), Vec::new());
                shadow.get_mut(&row.req_id).unwrap().drafts = drafts;
            }
        }
    }
    for (id, sh) in &shadow {
        prop_assert!(sh.finished, "request {} never finished", id);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn scheduler_respects_limits_and_conserves_blocks(c in case()) {
        run(&c)?;
    }
}

/// A pool of exactly one request's worth of blocks and two long requests: the second
/// must wait or be preempted, and both still finish with every token.
#[test]
fn one_request_pool_forces_preemption_and_still_finishes() {
    let c = Case {
        profile: BackendProfile::FlashMla,
        k: 2,
        page: 4,
        max_model_len: 32,
        extra_blocks: 0,
        max_num_seqs: 2,
        chunked: true,
        budget: 16,
        chunk: 8,
        mixed: true,
        requests: vec![(10, 20, 0), (12, 20, 0)],
        seed: 3,
    };
    run(&c).unwrap();
}
