//! The cross-backend comparison, exercised without a GPU: a CPU trace whose header is
//! relabelled "gpu" replays on the CPU through exactly the path a CPU trace takes on the
//! GPU (metadata and tokens exact, near-ties reported, tensors within tolerance).

use std::collections::BTreeMap;

use specmla_core::fault::{Fault, Faults};
use specmla_replay::bisect::Trace;
use specmla_replay::compare::{compare_cross, CROSS_ATOL};
use specmla_replay::replayer::StepFindings;
use specmla_replay::{replay_records, replay_records_on};
use specmla_sim::record::TraceSink;
use specmla_sim::runner::{run_with, DeviceBackend};
use specmla_sim::scenarios;

/// `mixed_mtp` with tensors, relabelled as recorded on the GPU.
fn gpu_labelled(requests: usize) -> Trace {
    let mut s = scenarios::by_name("mixed_mtp").unwrap();
    s.workload.num_requests = requests;
    let mut sink = TraceSink::new(Vec::new(), true);
    assert!(run_with(&s, 0, Some(&mut sink), |_| {}).unwrap().passed());
    let bytes = sink.into_inner().unwrap();
    let (mut header, records, _) =
        specmla_traces::read_all_from(bytes.as_slice(), Some(bytes.len() as u64)).unwrap();
    assert_eq!(header.backend, "cpu");
    header.backend = "gpu".into();
    Trace { header, records }
}

fn replay_cross(t: &Trace, faults: Faults) -> specmla_replay::ReplayReport {
    replay_records_on(DeviceBackend::Cpu, &t.header, &t.records, faults, |_| {}).unwrap()
}

#[test]
fn a_clean_trace_matches_across_backends() {
    let t = gpu_labelled(6);
    let r = replay_cross(&t, Faults::none());
    assert!(r.mode.starts_with("cross-backend"), "{}", r.mode);
    assert!(r.divergence.is_none(), "{:?}", r.divergence);
    assert!(r.near_ties.is_empty(), "{:?}", r.near_ties);
    assert_eq!(
        (r.recorded_on.as_str(), r.replayed_on.as_str()),
        ("gpu", "cpu")
    );
}

#[test]
fn tensors_within_tolerance_pass_and_beyond_it_diverge_at_that_layer_and_row() {
    let mut t = gpu_labelled(6);
    let step = 3;
    let layer1 = &mut t.records[step].tensors.as_mut().unwrap()[1];
    for v in layer1.iter_mut() {
        *v += CROSS_ATOL / 4.0;
    }
    assert!(replay_cross(&t, Faults::none()).divergence.is_none());
    // Row 0's first value moved by 50x the tolerance: layer 1, row 0, nothing else.
    t.records[step].tensors.as_mut().unwrap()[1][0] += 50.0 * CROSS_ATOL;
    let d = replay_cross(&t, Faults::none())
        .divergence
        .expect("diverges");
    assert_eq!(d.step, t.records[step].step);
    assert_eq!(d.first_layer, Some(1));
    assert_eq!(
        d.layer_rows.iter().map(|r| r.row).collect::<Vec<_>>(),
        vec![0]
    );
    assert!(d.max_abs_diff.unwrap() > 40.0 * CROSS_ATOL, "{d:?}");
    assert!(!d.metadata_differs && d.token_rows.is_empty());
}

#[test]
fn f1_is_localized_across_backends_as_it_is_bit_for_bit() {
    let t = gpu_labelled(10);
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
    assert_eq!(cross.layer_rows, bitwise.layer_rows);
    assert!(cross.layer_rows.iter().all(|r| r.path == "prefill+context"));
}

#[test]
fn a_flipped_token_is_a_near_tie_only_when_the_logits_are_one() {
    let t = gpu_labelled(4);
    let rec = t
        .records
        .iter()
        .find(|r| r.sampled.first().is_some_and(|s| !s.is_empty()))
        .unwrap();
    let req = rec.rows[rec.order[0] as usize].req_id;
    let x = rec.sampled[0][0];
    let y = (x + 1) % 512;
    let mut got = rec.clone();
    got.sampled[0][0] = y;
    let findings = |gap: f32| {
        let mut logits = vec![0.0f32; 512];
        logits[x as usize] = 1.0;
        logits[y as usize] = 1.0 + gap;
        StepFindings {
            target_logits: BTreeMap::from([((req, 0), logits)]),
            ..Default::default()
        }
    };
    let (d, ties) = compare_cross(rec, &got, &findings(2e-4), 1e-3);
    assert!(d.is_none(), "{d:?}");
    assert_eq!((ties.len(), ties[0].recorded, ties[0].replayed), (1, x, y));
    let (d, ties) = compare_cross(rec, &got, &findings(0.5), 1e-3);
    assert!(ties.is_empty());
    assert_eq!(d.unwrap().token_rows[0].0, 0);
    // Without the replayed logits nothing can excuse it.
    let (d, _) = compare_cross(rec, &got, &StepFindings::default(), 1e-3);
    assert!(d.is_some());
}
