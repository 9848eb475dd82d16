//! `sim --step-log` closes the loop with `replay audit`: a clean run of every scenario
//! logs steps that audit clean, and each fault that lives in planning or in the
//! persistent buffers, and shows in the schema, makes its run's log fail the audit
//! naming that fault's invariant (the one `sim` names for it).

use specmla_core::fault::{Fault, Faults};
use specmla_cpu::cpu_backend;
use specmla_replay::audit_log::audit_log;
use specmla_sim::runner::run_with;
use specmla_sim::scenarios;
use specmla_sim::step_log::StepLogSink;

/// The step log of `scenario` run on the CPU with `faults`.
fn log_of(scenario: &str, faults: Faults) -> String {
    let mut s = scenarios::by_name(scenario).unwrap();
    s.cfg.faults = faults;
    let mut sink = StepLogSink::new(Vec::new(), &s.cfg);
    run_with(&s, 0, cpu_backend, Some(&mut sink), |_| {}).unwrap();
    String::from_utf8(sink.into_inner()).unwrap()
}

#[test]
fn every_scenario_logs_steps_that_audit_clean() {
    // The schema's rows follow vLLM's decode-first layout; `sim --step-log` refuses the
    // extend-first one (grammar_mixed's), so that scenario is left out here.
    let decode_first = scenarios::all()
        .into_iter()
        .filter(|s| s.cfg.scheduler.row_layout == specmla_core::config::RowLayout::DecodeFirst);
    for s in decode_first {
        let log = log_of(&s.name, Faults::none());
        let (steps, findings) = audit_log(&log).unwrap();
        assert!(steps > 0, "{}", s.name);
        assert!(findings.is_empty(), "{}: {:?}", s.name, &findings[..1]);
    }
}

/// Each fault, the scenario that triggers it, and the invariant its log breaks.
const CAUGHT: [(Fault, &str, &str); 10] = [
    (Fault::F3, "mixed_mtp", "cuda-graph"),
    (Fault::F4, "mixed_mtp", "drafter-inputs"),
    (Fault::F5, "dflash", "dflash-slots"),
    (Fault::F6, "dflash", "dflash-slots"),
    (Fault::F7, "mixed_mtp", "cuda-graph"),
    (Fault::F10, "mixed_mtp", "split"),
    (Fault::F11, "graphs", "graph-buffers"),
    (Fault::F13, "graphs", "cuda-graph"),
    (Fault::F14, "triton_dflash", "threshold"),
    (Fault::F16, "dp_idle", "drafter-inputs"),
];

fn assert_caught(f: Fault) {
    let (_, scenario, invariant) = CAUGHT.iter().find(|c| c.0 == f).unwrap();
    let log = log_of(scenario, Faults::none().with(f));
    let (_, findings) = audit_log(&log).unwrap();
    assert!(
        findings.iter().any(|x| x.invariant == *invariant),
        "{f:?} on {scenario}: no {invariant} violation in {:?}",
        findings.iter().map(|x| x.invariant).collect::<Vec<_>>()
    );
}

#[test]
fn f3_capture_size_not_a_multiple_of_1_plus_k() {
    assert_caught(Fault::F3);
}
#[test]
fn f4_padded_drafter_keeps_rejected_seq_lens() {
    assert_caught(Fault::F4);
}
#[test]
fn f5_dflash_block_index_unclamped() {
    assert_caught(Fault::F5);
}
#[test]
fn f6_dflash_live_slot_past_max_model_len() {
    assert_caught(Fault::F6);
}
#[test]
fn f7_prompt_chunk_on_the_verify_graph() {
    assert_caught(Fault::F7);
}
#[test]
fn f10_non_uniform_decodes_on_a_uniform_kernel() {
    assert_caught(Fault::F10);
}
#[test]
fn f11_padding_rows_keep_stale_idx_mapping() {
    assert_caught(Fault::F11);
}
#[test]
fn f13_padded_seq_lens_not_zeroed() {
    assert_caught(Fault::F13);
}
#[test]
fn f14_threshold_raised_on_a_single_token_kernel() {
    assert_caught(Fault::F14);
}
#[test]
fn f16_dp_padded_count_as_num_actual_tokens() {
    assert_caught(Fault::F16);
}
