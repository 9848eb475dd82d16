//! End to end: a clean trace of the scenario that exercises each known bug replays bit
//! for bit; replayed with the fault on, it diverges at a named step and names the layer
//! and path (or the violated invariant); bisection shrinks it to a small trace that
//! replays on its own.

use specmla_core::config::{BackendProfile, SpecConfig};
use specmla_core::fault::{Fault, Faults};
use specmla_cpu::cpu_backend;
use specmla_replay::bisect::{bisect, Trace};
use specmla_replay::compare::Divergence;
use specmla_replay::replay_records;
use specmla_sim::record::TraceSink;
use specmla_sim::runner::run_with;
use specmla_sim::scenarios::{self, Scenario};

/// Records `scenario` (with at most `requests` requests) into memory.
fn record(scenario: &str, requests: usize, seed: u64) -> (Trace, Vec<u8>) {
    record_with(scenario, requests, seed, false)
}

/// [`record`], with full tensors when `tensors`.
fn record_with(scenario: &str, requests: usize, seed: u64, tensors: bool) -> (Trace, Vec<u8>) {
    let mut s = scenarios::by_name(scenario).unwrap();
    s.workload.num_requests = s.workload.num_requests.min(requests);
    record_scenario(&s, seed, tensors)
}

/// Records `s` into memory; the run must pass.
fn record_scenario(s: &Scenario, seed: u64, tensors: bool) -> (Trace, Vec<u8>) {
    let scenario = &s.name;
    let mut sink = TraceSink::new(Vec::new(), tensors);
    let sum = run_with(s, seed, cpu_backend, Some(&mut sink), |_| {}).unwrap();
    assert!(sum.passed(), "{scenario}: {:?}", sum.failures);
    let bytes = sink.into_inner().unwrap();
    let (header, records, _) =
        specmla_traces::read_all_from(bytes.as_slice(), Some(bytes.len() as u64)).unwrap();
    (Trace { header, records }, bytes)
}

fn diverge(t: &Trace, f: Fault) -> Divergence {
    let clean = replay_records(&t.header, &t.records, Faults::none()).unwrap();
    assert!(
        clean.divergence.is_none(),
        "clean replay diverged: {:?}",
        clean.divergence
    );
    let r = replay_records(&t.header, &t.records, Faults::none().with(f)).unwrap();
    r.divergence
        .unwrap_or_else(|| panic!("{f:?} went unnoticed"))
}

fn has_invariant(d: &Divergence, rule: &str) -> bool {
    d.violations.iter().any(|v| v.starts_with(rule))
}

#[test]
fn f1_is_localized_to_the_context_merge_of_prefill_rows() {
    let (t, _) = record("mixed_mtp", 10, 0);
    let d = diverge(&t, Fault::F1);
    assert_eq!(d.first_layer, Some(0), "{d:?}");
    assert!(
        !d.metadata_differs,
        "F1 is a kernel bug: the plan is unchanged"
    );
    assert!(
        d.layer_rows.iter().all(|r| r.path == "prefill+context"),
        "{:?}",
        d.layer_rows
    );
}

#[test]
fn f2_is_localized_to_decode_rows_on_a_graph() {
    let (t, _) = record("mixed_mtp", 10, 0);
    let d = diverge(&t, Fault::F2);
    assert!(
        d.first_layer.is_some() && d.layer_rows.iter().all(|r| r.path == "decode"),
        "{d:?}"
    );
}

#[test]
fn plan_and_drafter_faults_name_their_invariant() {
    let cases = [
        (Fault::F3, "mixed_mtp", "cuda-graph"),
        (Fault::F4, "mixed_mtp", "drafter-inputs"),
        (Fault::F5, "dflash", "dflash-slots"),
        (Fault::F6, "dflash", "dflash-slots"),
        (Fault::F7, "graphs", "cuda-graph"),
        (Fault::F8, "mixed_mtp", "decode-rows"),
        (Fault::F9, "grammar_mixed", "sampling"),
        (Fault::F10, "mixed_mtp", "split"),
    ];
    for (f, scenario, rule) in cases {
        let (t, _) = record(scenario, 14, 0);
        let d = diverge(&t, f);
        assert!(has_invariant(&d, rule), "{f:?} on {scenario}: {d:?}");
    }
}

/// The stale-state faults: F12's stale schedule reaches the decode rows' outputs on a
/// graph; the others name the invariant of the buffer or metadata they leave stale.
#[test]
fn stale_state_faults_are_named_on_replay() {
    let (t, _) = record("mixed_mtp", 14, 0);
    let d = diverge(&t, Fault::F12);
    assert!(has_invariant(&d, "graph-buffers"), "{d:?}");
    assert!(
        d.first_layer.is_some() && d.layer_rows.iter().all(|r| r.path == "decode"),
        "{d:?}"
    );
    for f in [Fault::F11, Fault::F13] {
        assert!(has_invariant(&diverge(&t, f), "graph-buffers"), "{f:?}");
    }
    // TritonMLA with a DFlash drafter.
    let mut s = scenarios::by_name("dflash").unwrap();
    s.workload.num_requests = 4;
    s.cfg.backends = vec![BackendProfile::TritonMla];
    s.cfg.spec = SpecConfig::dflash(2);
    // The raised threshold is named at the first step, before any verify row reaches
    // the single-token kernel.
    let d = diverge(&record_scenario(&s, 0, false).0, Fault::F14);
    assert!(has_invariant(&d, "threshold"), "{d:?}");
    // A data-parallel rank: a busier peer pads its drafter, and it idles between arrivals.
    let mut s = scenarios::by_name("mixed_mtp").unwrap();
    s.workload.num_requests = 3;
    s.workload.arrival_steps = 120;
    s.cfg.dp_peer_num_tokens = 6;
    let (t, _) = record_scenario(&s, 0, false);
    assert!(has_invariant(&diverge(&t, Fault::F15), "slot-mapping"));
    assert!(has_invariant(&diverge(&t, Fault::F16), "drafter-inputs"));
}

#[test]
fn f4_and_f6_change_the_drafter() {
    let (t, _) = record("mixed_mtp", 10, 0);
    assert!(diverge(&t, Fault::F4).drafter_differs);
    let (t, _) = record("dflash", 14, 0);
    assert!(diverge(&t, Fault::F6).drafter_differs);
}

#[test]
fn bisect_shrinks_f1_to_a_reproducer_that_replays_on_its_own() {
    let (t, _) = record("mixed_mtp", 20, 0);
    let min = bisect(&t, Faults::none().with(Fault::F1))
        .unwrap()
        .expect("F1 diverges");
    assert!(
        min.requests().len() <= 2 && min.records.len() <= 3,
        "{} requests, {} steps",
        min.requests().len(),
        min.records.len()
    );
    assert!(min.records.len() < t.records.len() && min.requests().len() < t.requests().len());
    let clean = replay_records(&min.header, &min.records, Faults::none()).unwrap();
    assert!(
        clean.divergence.is_none(),
        "the minimal trace must replay clean on its own"
    );
    let d = replay_records(&min.header, &min.records, Faults::none().with(Fault::F1)).unwrap();
    assert!(d
        .divergence
        .is_some_and(|d| d.layer_rows.iter().any(|r| r.path == "prefill+context")));
}

/// F15 shows only on an idle step: bisection keeps a data-parallel rank's emptied steps
/// (its dummy steps), so it shrinks to one request and the idle step after it.
#[test]
fn bisect_keeps_the_idle_steps_of_a_data_parallel_rank() {
    let mut s = scenarios::by_name("mixed_mtp").unwrap();
    s.workload.num_requests = 3;
    s.workload.arrival_steps = 120;
    s.cfg.dp_peer_num_tokens = 6;
    let (t, _) = record_scenario(&s, 0, false);
    let min = bisect(&t, Faults::none().with(Fault::F15))
        .unwrap()
        .expect("F15 diverges");
    assert_eq!(min.requests().len(), 1, "one request, then an idle step");
    let d = replay_records(&min.header, &min.records, Faults::none().with(Fault::F15)).unwrap();
    assert!(d
        .divergence
        .is_some_and(|d| d.violations.iter().any(|v| v.contains("dummy step"))));
}

#[test]
fn bisect_of_a_clean_trace_finds_nothing() {
    let (t, _) = record("graphs", 4, 0);
    assert!(bisect(&t, Faults::none()).unwrap().is_none());
}

#[test]
fn same_seed_same_trace_bytes() {
    let (_, a) = record("grammar_mixed", 6, 3);
    let (_, b) = record("grammar_mixed", 6, 3);
    let (_, c) = record("grammar_mixed", 6, 4);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // With full tensors too, and the header names the backend kind, not the device.
    let (t, a) = record_with("grammar_mixed", 6, 3, true);
    let (_, b) = record_with("grammar_mixed", 6, 3, true);
    assert_eq!(a, b);
    assert_eq!(t.header.backend, "cpu");
    assert!(t.records.iter().all(|r| r.tensors.is_some()));
}

/// Postmortem (issue 22, defect 6): a header whose model disagreed with its recorded
/// steps replayed as "DIVERGED at step 0". Now such a trace is refused before any step
/// runs, naming the disagreement (the CLI exits 2 on it).
#[test]
fn steps_that_cannot_come_from_their_header_are_refused() {
    let (t, _) = record_with("mixed_mtp", 3, 1, true);
    let with = |from: &str, to: &str| {
        let mut h = t.header.clone();
        assert!(h.config_json.contains(from), "{}", h.config_json);
        h.config_json = h.config_json.replacen(from, to, 1);
        replay_records(&h, &t.records, Faults::none())
    };
    let err = with("\"num_layers\":2", "\"num_layers\":3").unwrap_err();
    assert!(
        err.to_string().contains(
            "disagrees with the header's config: 2 layer digests, the model has 3 layers"
        ),
        "{err}"
    );
    let err = with("\"num_heads\":4", "\"num_heads\":8").unwrap_err();
    assert!(
        err.to_string()
            .contains("attention outputs are not 2 layers of"),
        "{err}"
    );
    let mut t2 = t.clone();
    let busy = t2.records.iter().position(|r| !r.rows.is_empty()).unwrap();
    let first = t2.records[busy].order[0];
    t2.records[busy].order.push(first);
    let err = replay_records(&t2.header, &t2.records, Faults::none()).unwrap_err();
    assert!(err.to_string().contains("is not a permutation"), "{err}");
}

/// Postmortem: replay drew the weights unrounded while `sim` rounds them to bf16 under
/// a bf16 cache, so every bf16 trace diverged on the first step that read an f32
/// weight (on the GPU, the first prefill row or long decode row).
#[test]
fn a_bf16_cache_trace_replays_bit_for_bit_with_the_weights_it_ran_with() {
    let mut s = scenarios::by_name("mixed_mtp").unwrap();
    s.workload.num_requests = 4;
    s.cfg.kv_cache_dtype = specmla_core::config::KvCacheDtype::Bf16;
    let (t, _) = record_scenario(&s, 3, false);
    let r = replay_records(&t.header, &t.records, Faults::none()).unwrap();
    assert!(r.divergence.is_none(), "{:?}", r.divergence);
}
