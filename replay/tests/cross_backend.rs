//! The cross-backend comparison, exercised without a GPU. A CPU trace whose header is
//! relabelled "gpu" replays on the CPU through exactly the path a CPU trace takes on the
//! GPU (and a GPU trace on the CPU): metadata and tokens exact, near-ties reported,
//! stored tensors within tolerance. Perturbing the record stands in for the other
//! backend's numerics.

use std::collections::BTreeMap;

use specmla_core::fault::{Fault, Faults};
use specmla_cpu::cpu_backend;
use specmla_replay::bisect::{bisect, Trace};
use specmla_replay::compare::{
    compare_cross, CrossTolerances, CROSS_ATOL, CROSS_RTOL, CROSS_TOLERANCES,
};
use specmla_replay::replayer::{Replayer, StepFindings};
use specmla_replay::{replay_records, replay_records_on, ReplayReport};
use specmla_sim::checks::NEAR_TIE_MARGIN;
use specmla_sim::record::TraceSink;
use specmla_sim::runner::run_with;
use specmla_sim::scenarios;
use specmla_traces::{RowPath, StepRecord};

/// `scenario` on the CPU (with full tensors when `tensors`), relabelled as recorded on
/// the GPU.
fn gpu_labelled(scenario: &str, requests: usize, tensors: bool) -> Trace {
    let mut s = scenarios::by_name(scenario).unwrap();
    s.workload.num_requests = requests;
    let mut sink = TraceSink::new(Vec::new(), tensors);
    let sum = run_with(&s, 0, cpu_backend, Some(&mut sink), |_| {}).unwrap();
    assert!(sum.passed() && sum.backend == "cpu", "{:?}", sum.failures);
    let bytes = sink.into_inner().unwrap();
    let (mut header, records, _) =
        specmla_traces::read_all_from(bytes.as_slice(), Some(bytes.len() as u64)).unwrap();
    assert_eq!(header.backend, "cpu");
    header.backend = "gpu".into();
    Trace { header, records }
}

fn replay_cross(t: &Trace, faults: Faults) -> ReplayReport {
    replay_records_on(&t.header, &t.records, faults, cpu_backend, |_| {}).unwrap()
}

/// Token range of planned row `r` of a record, and the row's path label.
fn row_tokens(rec: &StepRecord, r: usize) -> (std::ops::Range<usize>, &'static str) {
    let start: u64 = rec.order[..r]
        .iter()
        .map(|&i| rec.rows[i as usize].num_scheduled_tokens)
        .sum();
    let row = &rec.rows[rec.order[r] as usize];
    let path = match row.path {
        RowPath::Decode => "decode",
        RowPath::Prefill if row.num_computed_tokens > 0 => "prefill+context",
        RowPath::Prefill => "prefill",
    };
    let start = start as usize;
    (start..start + row.num_scheduled_tokens as usize, path)
}

/// A step with at least `rows` planned rows.
fn step_with_rows(t: &Trace, rows: usize) -> usize {
    t.records
        .iter()
        .position(|r| r.order.len() >= rows)
        .unwrap()
}

/// The same kind on another kernel family (another GPU architecture or attention path)
/// is not promised bit for bit: it compares within tolerances and says so, and a
/// recording that ran the bf16 flash decode widens them to `sim`'s tolerances for it.
#[test]
fn another_kernel_fingerprint_compares_within_tolerances() {
    let mut t = gpu_labelled("mixed_mtp", 4, true);
    t.header.backend = "cpu".into();
    let bitwise = replay_cross(&t, Faults::none());
    assert!(
        bitwise.bitwise() && bitwise.mode == "bitwise (same backend)",
        "{}",
        bitwise.mode
    );
    t.header.kernels = "sm_90a; bf16 flash decode (flash_decode_seesaw)".into();
    t.header.bf16_compute = true;
    let r = replay_cross(&t, Faults::none());
    assert!(r.divergence.is_none(), "{:?}", r.divergence);
    assert!(!r.bitwise());
    assert_eq!(
        r.tolerances,
        Some(specmla_replay::compare::BF16_COMPUTE_CROSS_TOLERANCES)
    );
    assert!(
        r.mode.starts_with(
            "cross-kernel (recorded on sm_90a; bf16 flash decode (flash_decode_seesaw), \
             replayed on CPU reference (f32): not bit for bit; metadata and tokens exact"
        ),
        "{}",
        r.mode
    );
    assert!(
        r.mode.contains("within abs 1.5e-1 + rel 1e-3"),
        "{}",
        r.mode
    );
    assert_eq!(
        r.recorded_kernels,
        "sm_90a; bf16 flash decode (flash_decode_seesaw)"
    );
}

#[test]
fn a_clean_trace_matches_across_backends_and_says_how_it_compared() {
    let t = gpu_labelled("mixed_mtp", 6, true);
    let r = replay_cross(&t, Faults::none());
    assert!(r.divergence.is_none(), "{:?}", r.divergence);
    assert!(r.near_ties.is_empty(), "{:?}", r.near_ties);
    assert_eq!(
        (r.recorded_on.as_str(), r.replayed_on.as_str()),
        ("gpu", "cpu")
    );
    assert_eq!(r.tolerances, Some(CROSS_TOLERANCES));
    assert!(!r.bitwise());
    assert!(r.mode.starts_with("cross-backend"), "{}", r.mode);
    assert!(r.mode.contains("within abs 1e-3 + rel 1e-3"), "{}", r.mode);
    // The same records under their true label replay bit for bit.
    let mut cpu = t.clone();
    cpu.header.backend = "cpu".into();
    let r = replay_records(&cpu.header, &cpu.records, Faults::none()).unwrap();
    assert!(r.divergence.is_none() && r.bitwise());
    assert_eq!(r.mode, "bitwise (same backend)");
}

/// The tolerances are the named constants, and the near-tie margin is `sim`'s own.
#[test]
fn the_tolerances_are_the_named_constants() {
    assert_eq!(
        CROSS_TOLERANCES,
        CrossTolerances {
            atol: CROSS_ATOL,
            rtol: CROSS_RTOL,
            near_tie_margin: NEAR_TIE_MARGIN,
        }
    );
    assert_eq!(
        NEAR_TIE_MARGIN,
        specmla_sim::checks::Tolerances::default().near_tie_margin
    );
    let t = CROSS_TOLERANCES;
    let bound = (CROSS_ATOL + 0.5 * CROSS_RTOL) as f32;
    assert!(t.within(0.5, 0.5 + 0.9 * bound) && t.within(0.5, 0.5 - 0.9 * bound));
    assert!(!t.within(0.5, 0.5 + 1.1 * bound) && !t.within(0.5, 0.5 - 1.1 * bound));
    // Relative to the recorded magnitude.
    assert!(t.within(100.0, 100.0 + 50.0 * CROSS_ATOL as f32));
    assert!(!t.within(100.0, 100.0 + 200.0 * CROSS_ATOL as f32));
    assert!(t.within(f32::NAN, f32::NAN) && t.within(f32::INFINITY, f32::INFINITY));
    assert!(!t.within(f32::NAN, 0.0) && !t.within(0.0, f32::NAN));
}

#[test]
fn attention_outputs_within_tolerance_pass_and_beyond_it_diverge_at_that_layer_and_row() {
    let mut t = gpu_labelled("mixed_mtp", 6, true);
    let step = step_with_rows(&t, 3);
    let tensors = t.records[step].tensors.as_mut().unwrap();
    assert!(tensors.attn_outputs.len() >= 2);
    for v in tensors.attn_outputs[1].iter_mut() {
        *v += 0.9 * CROSS_ATOL as f32;
    }
    for v in tensors.logits.iter_mut() {
        *v -= 0.9 * CROSS_ATOL as f32;
    }
    let r = replay_cross(&t, Faults::none());
    assert!(r.divergence.is_none(), "{:?}", r.divergence);

    // One value of planned row 2's last token, in layer 1, moved by 50x the tolerance:
    // layer 1, row 2 with its path, nothing else.
    let rec = &t.records[step];
    let (tokens, path) = row_tokens(rec, 2);
    let width = rec.tensors.as_ref().unwrap().attn_outputs[1].len()
        / rec
            .rows
            .iter()
            .map(|r| r.num_scheduled_tokens as usize)
            .sum::<usize>();
    let at = (tokens.end - 1) * width + width / 2;
    t.records[step].tensors.as_mut().unwrap().attn_outputs[1][at] += 50.0 * CROSS_ATOL as f32;
    let d = replay_cross(&t, Faults::none())
        .divergence
        .expect("diverges");
    assert_eq!(d.step, t.records[step].step);
    assert_eq!(d.first_layer, Some(1));
    let rows: Vec<(usize, &str)> = d
        .layer_rows
        .iter()
        .map(|r| (r.row, r.path.as_str()))
        .collect();
    assert_eq!(rows, vec![(2, path)]);
    assert!(d.max_abs_diff.unwrap() > 40.0 * CROSS_ATOL as f32, "{d:?}");
    assert!(!d.metadata_differs && d.token_rows.is_empty() && d.logit_rows.is_empty());
    assert!(d.headline().contains("layer 1 (1 row:"), "{}", d.headline());

    // An earlier layer beyond tolerance in another row is the first divergent layer.
    let (tokens0, path0) = row_tokens(&t.records[step], 0);
    t.records[step].tensors.as_mut().unwrap().attn_outputs[0][tokens0.start * width] -= 1.0;
    let d = replay_cross(&t, Faults::none())
        .divergence
        .expect("diverges");
    assert_eq!(d.first_layer, Some(0));
    let rows: Vec<(usize, &str)> = d
        .layer_rows
        .iter()
        .map(|r| (r.row, r.path.as_str()))
        .collect();
    assert_eq!(rows, vec![(0, path0)]);
}

#[test]
fn logits_beyond_tolerance_diverge_at_their_row() {
    let mut t = gpu_labelled("mixed_mtp", 6, true);
    let step = t
        .records
        .iter()
        .position(|r| r.order.len() >= 2 && r.sampled.iter().filter(|s| !s.is_empty()).count() >= 2)
        .unwrap();
    let rec = &t.records[step];
    // The last planned row that samples: its logits are the last ones.
    let r = (0..rec.order.len())
        .rev()
        .find(|&r| !rec.sampled[r].is_empty())
        .unwrap();
    let n = rec.tensors.as_ref().unwrap().logits.len();
    // Push a low logit (not the argmax: tokens must stay the same) beyond tolerance.
    let logits = &mut t.records[step].tensors.as_mut().unwrap().logits;
    let (i, _) = logits[n - 8..]
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .unwrap();
    logits[n - 8 + i] -= 10.0 * CROSS_ATOL as f32;
    let d = replay_cross(&t, Faults::none())
        .divergence
        .expect("diverges");
    assert_eq!(d.step, t.records[step].step);
    assert_eq!(
        d.logit_rows.iter().map(|x| x.row).collect::<Vec<_>>(),
        vec![r]
    );
    assert!(
        d.logits_max_abs_diff.unwrap() > 9.0 * CROSS_ATOL as f32,
        "{d:?}"
    );
    assert!(d.first_layer.is_none() && d.token_rows.is_empty() && !d.metadata_differs);
    assert!(d.headline().contains("logits of 1 row"), "{}", d.headline());
}

#[test]
fn without_tensors_metadata_and_tokens_are_still_compared_and_the_report_says_so() {
    let t = gpu_labelled("mixed_mtp", 6, false);
    let r = replay_cross(&t, Faults::none());
    assert!(r.divergence.is_none(), "{:?}", r.divergence);
    assert!(
        r.mode
            .contains("the trace has no tensors, so only metadata and tokens are compared"),
        "{}",
        r.mode
    );
    let mut bad = t.clone();
    bad.records[4].metadata_digest ^= 1;
    let d = replay_cross(&bad, Faults::none())
        .divergence
        .expect("diverges");
    assert!(d.metadata_differs && d.step == bad.records[4].step, "{d:?}");
    let mut bad = t.clone();
    bad.records[4].order.swap(0, 1);
    assert!(
        replay_cross(&bad, Faults::none())
            .divergence
            .unwrap()
            .metadata_differs
    );
}

/// `replay --gpu --fault F1` on a CPU trace with tensors must localize F1 as the CPU
/// replay does: step, layer 0, the same `prefill+context` rows.
#[test]
fn f1_is_localized_across_backends_as_it_is_bit_for_bit() {
    let t = gpu_labelled("mixed_mtp", 10, true);
    let cross = replay_cross(&t, Faults::none().with(Fault::F1))
        .divergence
        .unwrap();
    let mut cpu = t.clone();
    cpu.header.backend = "cpu".into();
    let bitwise = replay_records(&cpu.header, &cpu.records, Faults::none().with(Fault::F1))
        .unwrap()
        .divergence
        .unwrap();
    assert_eq!(cross.step, bitwise.step);
    assert_eq!(cross.first_layer, Some(0));
    assert_eq!(bitwise.first_layer, Some(0));
    assert_eq!(cross.layer_rows, bitwise.layer_rows);
    assert!(!cross.layer_rows.is_empty());
    assert!(cross.layer_rows.iter().all(|r| r.path == "prefill+context"));
    assert!(cross.max_abs_diff.unwrap() > 100.0 * CROSS_ATOL as f32);
    assert!(!cross.metadata_differs);
}

/// A synthetic replay of `rec` where planned row 0's first sampled token is `y` instead
/// of `x`, with replayed logits `gap` apart.
fn flipped_sample(rec: &StepRecord, gap: f32) -> (StepRecord, StepFindings, u32, u32) {
    let req = rec.rows[rec.order[0] as usize].req_id;
    let x = rec.sampled[0][0];
    let y = (x + 1) % 512;
    let mut got = rec.clone();
    got.sampled[0][0] = y;
    let mut logits = vec![0.0f32; 512];
    logits[x as usize] = 1.0;
    logits[y as usize] = 1.0 + gap;
    let f = StepFindings {
        target_logits: BTreeMap::from([((req, 0), logits)]),
        ..Default::default()
    };
    (got, f, x, y)
}

#[test]
fn a_flipped_token_is_a_near_tie_only_when_the_logits_are_one() {
    let t = gpu_labelled("mixed_mtp", 4, false);
    let rec = t
        .records
        .iter()
        .find(|r| {
            r.sampled.first().is_some_and(|s| !s.is_empty())
                && r.proposals.first().is_some_and(|p| !p.is_empty())
        })
        .unwrap();
    let tol = CROSS_TOLERANCES;
    let (mut got, f, x, y) = flipped_sample(rec, 0.2 * NEAR_TIE_MARGIN as f32);
    // The drafter started from the other token: the row's proposals follow from it.
    if let Some(p) = got.proposals[0].first_mut() {
        *p = (*p + 3) % 512;
    }
    let (d, ties) = compare_cross(rec, &got, &f, &tol);
    assert!(d.is_none(), "{d:?}");
    assert_eq!(ties.len(), 1);
    assert_eq!(
        (ties[0].recorded, ties[0].replayed, ties[0].drafter),
        (x, y, false)
    );
    assert!(ties[0].margin < NEAR_TIE_MARGIN as f32);
    // A wide margin is a divergence naming the row, and no near-tie.
    let (got, f, _, _) = flipped_sample(rec, 0.5);
    let (d, ties) = compare_cross(rec, &got, &f, &tol);
    assert!(ties.is_empty());
    assert_eq!(d.unwrap().token_rows[0].0, 0);
    // Just above the margin is already a divergence.
    let (got, f, _, _) = flipped_sample(rec, 2.0 * NEAR_TIE_MARGIN as f32);
    assert!(compare_cross(rec, &got, &f, &tol).0.is_some());
    // Without the replayed logits nothing can excuse it.
    let (d, _) = compare_cross(rec, &got, &StepFindings::default(), &tol);
    assert!(d.is_some());
}

/// Multi-step drafts chain: after a near-tie, a row's later drafts were drafted from
/// another token and are not compared. DFlash drafts stand alone: each must match.
#[test]
fn drafts_after_a_near_tie_are_consequences_only_when_drafts_chain() {
    let t = gpu_labelled("mixed_mtp", 4, false);
    let rec = t
        .records
        .iter()
        .find(|r| r.proposals.first().is_some_and(|p| p.len() >= 3))
        .unwrap();
    let req = rec.rows[rec.order[0] as usize].req_id;
    let mut got = rec.clone();
    let p = &mut got.proposals[0];
    let (x, y) = (p[1], (p[1] + 1) % 512);
    p[1] = y;
    p[2] = (p[2] + 7) % 512;
    let mut near = vec![0.0f32; 512];
    near[x as usize] = 1.0;
    near[y as usize] = 1.0 + 1e-4;
    let mut f = StepFindings {
        draft_logits: BTreeMap::from([((req, 1), near), ((req, 2), vec![0.0; 512])]),
        drafts_chain: true,
        ..Default::default()
    };
    f.draft_logits.get_mut(&(req, 2)).unwrap()[rec.proposals[0][2] as usize] = 5.0;
    let (d, ties) = compare_cross(rec, &got, &f, &CROSS_TOLERANCES);
    assert!(d.is_none(), "{d:?}");
    assert_eq!(ties.len(), 1);
    assert!(ties[0].drafter && ties[0].position == 1 && ties[0].req_id == req);
    f.drafts_chain = false;
    let (d, _) = compare_cross(rec, &got, &f, &CROSS_TOLERANCES);
    let d = d.expect("draft 2 stands alone and is a wide-margin difference");
    assert_eq!(d.drafter_requests, vec![req]);
}

/// The same judgement on real replayed logits: the recorded token flipped to the
/// replay's runner-up is a near-tie under a margin just above their gap, a divergence
/// under one just below it, and a flip to the least likely token diverges end to end.
#[test]
fn a_flipped_recorded_token_is_judged_by_the_replayed_logits() {
    let t = gpu_labelled("mixed_mtp", 4, false);
    let step = t
        .records
        .iter()
        .position(|r| r.sampled.first().is_some_and(|s| !s.is_empty()))
        .unwrap();
    let mut r = Replayer::new(&t.header, Faults::none()).unwrap();
    for rec in &t.records[..step] {
        r.step(rec).unwrap();
    }
    let rec = &t.records[step];
    let (got, f) = r.step_checked(rec).unwrap();
    let req = rec.rows[rec.order[0] as usize].req_id;
    let logits = &f.target_logits[&(req, 0)];
    let x = rec.sampled[0][0];
    assert_eq!(got.sampled[0][0], x);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    assert_eq!(order[0], x as usize);
    let (runner_up, last) = (order[1] as u32, order[order.len() - 1] as u32);
    let gap = (logits[x as usize] - logits[runner_up as usize]) as f64;
    let mut flipped = rec.clone();
    flipped.sampled[0][0] = runner_up;
    let margin = |m: f64| CrossTolerances {
        near_tie_margin: m,
        ..CROSS_TOLERANCES
    };
    let (d, ties) = compare_cross(&flipped, &got, &f, &margin(gap * 1.01));
    assert!(d.is_none(), "{d:?}");
    assert_eq!((ties[0].recorded, ties[0].replayed), (runner_up, x));
    let (d, ties) = compare_cross(&flipped, &got, &f, &margin(gap * 0.99));
    assert!(ties.is_empty() && d.is_some_and(|d| d.token_rows[0].0 == 0));

    // End to end, under the real margin.
    let mut t2 = t.clone();
    t2.records[step].sampled[0][0] = last;
    let d = replay_cross(&t2, Faults::none())
        .divergence
        .expect("diverges");
    assert_eq!(d.step, rec.step);
    assert_eq!(d.token_rows[0].0, 0);
    assert!(d.first_layer.is_none() && !d.metadata_differs);
}

/// Bisection runs on the CPU: a GPU trace shrinks to a CPU trace that replays bit for bit
/// on its own and diverges under the fault.
#[test]
fn a_gpu_trace_bisects_to_a_cpu_trace() {
    let t = gpu_labelled("mixed_mtp", 10, false);
    let min = bisect(&t, Faults::none().with(Fault::F1))
        .unwrap()
        .expect("F1 diverges");
    assert_eq!(min.header.backend, "cpu");
    let clean = replay_records(&min.header, &min.records, Faults::none()).unwrap();
    assert!(clean.bitwise() && clean.divergence.is_none());
    let d = replay_records(&min.header, &min.records, Faults::none().with(Fault::F1)).unwrap();
    assert!(d.divergence.is_some());
}
