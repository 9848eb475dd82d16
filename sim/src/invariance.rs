//! Engine-level checks that a backend is batch-invariant: a request's logits, hidden
//! states, attention outputs and proposals are bit-identical with graphs on or off, alone
//! or in a batch, in either row layout, and with padded or compacted drafter batches. F2
//! (a graph captured for q = 1) must break the graph check, so the check is shown able
//! to fail. One body for every backend: the CPU's runs in `cargo test`, the GPU's in
//! `gpu-test` when there is a device.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use specmla_core::backend::Backend;
use specmla_core::config::{BackendProfile, DrafterBatch, EngineConfig, SpecConfig};
use specmla_core::engine::{Engine, EngineOptions, NoOracle, StepOutcome};
use specmla_core::fault::Fault;
use specmla_core::request::RequestSpec;
use specmla_model::{DrafterModel, TargetModel};

/// Builds a backend for a config and the seed's weights.
pub type Factory<'a, B> = dyn Fn(&EngineConfig, Arc<TargetModel>, Arc<DrafterModel>) -> Result<B, <B as Backend>::Error>
    + 'a;

/// One invariance case: its name with the counts, and whether it came out as expected.
#[derive(Clone, Debug, PartialEq)]
pub struct InvarianceCase {
    pub case: String,
    /// Rows that differ (or mismatches, for the shadow-run case).
    pub differing: usize,
    pub passed: bool,
}

/// What one planned row produced, keyed by `(req_id, num_computed_tokens)`.
#[derive(Clone, Debug, PartialEq)]
struct RowBits {
    decode_path: bool,
    /// The row's logits bits, then its tokens' hidden-state and attention row digests.
    bits: Vec<u64>,
    proposals: Vec<u32>,
}

#[derive(Default)]
struct RunRecord {
    rows: BTreeMap<(u64, usize), RowBits>,
    /// Keys whose step had other rows in it.
    shared: Vec<(u64, usize)>,
    graph_steps: usize,
    mismatches: usize,
}

fn workload(n: usize, seed: u64) -> Vec<RequestSpec> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n as u64)
        .map(|id| RequestSpec {
            id,
            prompt: (0..rng.gen_range(16..44))
                .map(|_| rng.gen_range(0..512))
                .collect(),
            max_new_tokens: rng.gen_range(24..48),
            arrival_step: if id == 0 { 0 } else { rng.gen_range(0..6) },
            grammar: None,
        })
        .collect()
}

fn absorb(rec: &mut RunRecord, o: &StepOutcome) {
    let c = &o.plan.common;
    rec.graph_steps += o.plan.cudagraph.is_some() as usize;
    rec.mismatches += o.layout_mismatches.len() + o.drafter_mismatches.len();
    let decode_rows = o.plan.mla.decode.as_ref().map_or(0..0, |d| d.rows.clone());
    for (r, row) in o.plan.rows.iter().enumerate() {
        let mut bits: Vec<u64> = Vec::new();
        for i in o.plan.row_samples(r) {
            bits.extend(o.target.logits_row(i).iter().map(|v| v.to_bits() as u64));
        }
        for t in c.row_tokens(r) {
            bits.push(o.target.hidden_digests[t]);
            bits.extend(o.target.attn_digests.iter().map(|layer| layer[t]));
        }
        let key = (row.req_id, row.num_computed_tokens);
        if o.plan.rows.len() > 1 {
            rec.shared.push(key);
        }
        let proposals = o.proposals.get(r).cloned().unwrap_or_default();
        rec.rows.insert(
            key,
            RowBits {
                decode_path: decode_rows.contains(&r),
                bits,
                proposals,
            },
        );
    }
}

fn run<B: Backend>(
    make: &Factory<'_, B>,
    cfg: &EngineConfig,
    work: Vec<RequestSpec>,
    opts: EngineOptions,
) -> Result<RunRecord, String> {
    let seed = 7;
    let (target, drafter) = crate::runner::models(cfg, seed);
    let backend = make(cfg, target, drafter).map_err(|e| e.to_string())?;
    let mut engine = Engine::new(cfg.clone(), opts, work, backend).map_err(|e| e.to_string())?;
    let mut rec = RunRecord::default();
    for _ in 0..2_000 {
        match engine.step(&mut NoOracle).map_err(|e| e.to_string())? {
            Some(o) => absorb(&mut rec, &o),
            None => return Ok(rec),
        }
    }
    Err("the run did not finish in 2000 steps".into())
}

/// Keys of `a` (restricted to `req`, if given) missing from `b` or with other bits,
/// counting only rows that took the same path in both runs; and how many were compared.
fn differing(a: &RunRecord, b: &RunRecord, req: Option<u64>) -> (usize, usize) {
    let (mut diff, mut compared) = (0, 0);
    for (k, va) in &a.rows {
        if req.is_some_and(|r| r != k.0) {
            continue;
        }
        match b.rows.get(k) {
            Some(vb) if vb.decode_path != va.decode_path => {}
            Some(vb) => {
                compared += 1;
                diff += (vb != va) as usize;
            }
            None => diff += 1,
        }
    }
    (diff, compared)
}

fn result(case: String, diff: usize, compared: usize, expect_diff: bool) -> InvarianceCase {
    let passed = compared > 0 && (diff > 0) == expect_diff;
    InvarianceCase {
        case: format!("{case}: {diff} of {compared} rows differ"),
        differing: diff,
        passed,
    }
}

fn opts(layouts: bool, drafter: bool) -> EngineOptions {
    EngineOptions {
        check_layouts: layouts,
        check_drafter_batches: drafter,
        seed: 7,
        full_outputs: false,
    }
}

/// Graphs on vs off for one config (and whether a difference is expected).
fn graph_vs_eager<B: Backend>(
    make: &Factory<'_, B>,
    name: &str,
    cfg: &EngineConfig,
    expect_diff: bool,
) -> Result<InvarianceCase, String> {
    let mut eager_cfg = cfg.clone();
    eager_cfg.cuda_graphs = false;
    let g = run(make, cfg, workload(8, 11), opts(true, false))?;
    let e = run(make, &eager_cfg, workload(8, 11), opts(true, false))?;
    let (diff, compared) = differing(&g, &e, None);
    let mut r = result(
        format!("{name}: graph ({} steps) vs eager", g.graph_steps),
        diff,
        compared,
        expect_diff,
    );
    r.passed &= g.graph_steps > 0 && g.mismatches + e.mismatches == 0;
    Ok(r)
}

/// Plain decode (no speculation), graph against eager, the configuration changed by
/// `adapt` first. At 128 heads its decode rows (q 1, two 64-row blocks) are where the GPU
/// backend's eager launches take the persistent kernel on a cut batch (core's
/// `invariant_launch`) while its graphs run the split grid of the policy's cap: the two
/// must give the same bits.
pub fn plain_decode_graph_vs_eager<B: Backend>(
    make: &Factory<'_, B>,
    adapt: &dyn Fn(&mut EngineConfig),
) -> Result<InvarianceCase, String> {
    let mut cfg = EngineConfig::tiny(BackendProfile::FlashMla, SpecConfig::off());
    adapt(&mut cfg);
    graph_vs_eager(make, "plain decode", &cfg, false)
}

/// Every invariance case, on the backend `make` builds, with the tiny model.
pub fn run_invariance<B: Backend>(make: &Factory<'_, B>) -> Result<Vec<InvarianceCase>, String> {
    run_invariance_on(make, &|_| {})
}

/// Every invariance case, each configuration changed by `adapt` first (another model,
/// another cache dtype: what selects another kernel path).
pub fn run_invariance_on<B: Backend>(
    make: &Factory<'_, B>,
    adapt: &dyn Fn(&mut EngineConfig),
) -> Result<Vec<InvarianceCase>, String> {
    let base = |profile, spec| {
        let mut c = EngineConfig::tiny(profile, spec);
        adapt(&mut c);
        c
    };
    let mtp = SpecConfig::multi_step(3, DrafterBatch::Padded);
    let cfg = base(BackendProfile::FlashMla, mtp.clone());
    let mut out = vec![graph_vs_eager(make, "FlashMLA MTP K=3", &cfg, false)?];
    let mut f2 = cfg.clone();
    f2.faults = f2.faults.with(Fault::F2);
    out.push(graph_vs_eager(
        make,
        "mutant F2 (graph captured for q=1)",
        &f2,
        true,
    )?);
    // One request alone, then in a batch of eight (graphs on in both).
    let alone = run(make, &cfg, workload(1, 11), opts(false, false))?;
    let batch = run(make, &cfg, workload(8, 11), opts(false, false))?;
    let (diff, compared) = differing(&alone, &batch, Some(0));
    let shared = batch.shared.iter().filter(|k| k.0 == 0).count();
    let mut r = result(
        format!("request 0 alone vs in a batch ({shared} shared steps)"),
        diff,
        compared,
        false,
    );
    r.passed &= shared > 0;
    out.push(r);
    let padded = base(
        BackendProfile::FlashInferMla,
        SpecConfig::multi_step(5, DrafterBatch::Padded),
    );
    let p = run(make, &padded, workload(8, 12), opts(true, true))?;
    out.push(InvarianceCase {
        case: format!(
            "layouts and padded vs compacted drafter: {} mismatches over {} rows",
            p.mismatches,
            p.rows.len()
        ),
        differing: p.mismatches,
        passed: p.mismatches == 0 && !p.rows.is_empty(),
    });
    let mut dflash = base(BackendProfile::FlashAttnMla, SpecConfig::dflash(8));
    dflash.scheduler.max_model_len = 160;
    dflash.scheduler.num_gpu_blocks = 96;
    out.push(graph_vs_eager(make, "DFlash K=8", &dflash, false)?);
    out.push(plain_decode_graph_vs_eager(make, adapt)?);
    Ok(out)
}
