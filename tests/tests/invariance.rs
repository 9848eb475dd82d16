//! The batch-invariance cases (`specmla_sim::invariance`) on the CPU reference backend:
//! the same body `gpu-test` runs on the device. Graphs on vs off, a request alone vs in
//! a batch, both layouts, padded vs compacted drafters, DFlash on graphs, plain decode on
//! graphs; and F2 must
//! break the graph case, so the check can fail.

use specmla_sim::invariance::run_invariance;

#[test]
fn the_cpu_backend_is_batch_invariant() {
    let cases = run_invariance(&specmla_cpu::cpu_backend).expect("every case runs");
    assert_eq!(cases.len(), 6);
    for c in &cases {
        assert!(c.passed, "{}", c.case);
    }
    let f2 = cases.iter().find(|c| c.case.contains("mutant F2")).unwrap();
    assert!(f2.differing > 0, "{}", f2.case);
}
