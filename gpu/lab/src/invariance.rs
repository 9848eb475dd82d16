//! The harness's invariance cases (`specmla_sim::invariance`, one body for every backend)
//! run on the device, as rows of `gpu-test`'s table.

use std::sync::Arc;

use specmla_core::config::{BackendProfile, EngineConfig, KvCacheDtype, ModelDims, SpecConfig};
use specmla_gpu::backend::portable_because;
use specmla_gpu::{GpuBackend, GpuDevice};

use crate::checks::CaseResult;

/// Every invariance case on `dev`: with the tiny model (the portable kernels), then at
/// DeepSeek-V3's widths on one tensor-parallel rank of 8 (16 heads) with a bf16 cache,
/// where a Hopper device runs the decode rows on the flash kernels.
pub fn run_invariance(dev: &Arc<GpuDevice>) -> Result<Vec<CaseResult>, String> {
    let make =
        |cfg: &_, target, drafter| GpuBackend::on_device(Arc::clone(dev), cfg, target, drafter);
    let rows = |cases: Vec<specmla_sim::invariance::InvarianceCase>, kernel| {
        cases.into_iter().map(move |c| CaseResult {
            kernel,
            case: c.case,
            max_rel_err: c.differing as f64,
            passed: c.passed,
        })
    };
    let mut out: Vec<CaseResult> = rows(
        specmla_sim::invariance::run_invariance(&make)?,
        "invariance",
    )
    .collect();
    let real_width = |c: &mut EngineConfig| {
        c.model = ModelDims::deepseek_v3_attn()
            .tensor_parallel(8)
            .expect("8 divides 128");
        c.kv_cache_dtype = KvCacheDtype::Bf16;
    };
    let mut probe = EngineConfig::tiny(BackendProfile::FlashMla, SpecConfig::off());
    real_width(&mut probe);
    match portable_because(&probe, &dev.arch) {
        Some(why) if dev.arch == "sm_90a" => out.push(CaseResult {
            kernel: "invariance flash",
            case: format!("DeepSeek-V3 widths should take the flash path: {why}"),
            max_rel_err: f64::INFINITY,
            passed: false,
        }),
        Some(why) => println!("skipping the flash-path invariance cases: {why}"),
        None => {
            let cases = specmla_sim::invariance::run_invariance_on(&make, &real_width)?;
            out.extend(rows(cases, "invariance flash"));
            // All 128 heads on one rank: plain decode rows are two 64-row blocks, where
            // an eager launch of a cut batch takes the persistent kernel (graphs the cap's
            // grid; `persistent_in_eager` below says the rule picks it for this case).
            let one_rank = |c: &mut EngineConfig| {
                c.model = ModelDims::deepseek_v3_attn();
                c.kv_cache_dtype = KvCacheDtype::Bf16;
            };
            let case = specmla_sim::invariance::plain_decode_graph_vs_eager(&make, &one_rank)?;
            out.extend(rows(vec![case], "invariance H128"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use specmla_core::config::{BackendProfile, EngineConfig, SpecConfig};
    use specmla_core::invariant_launch::{invariant_launch, splits_of, InvariantLaunch};

    /// The 128-head plain-decode case covers the eager persistent launch: its 8 requests
    /// (prompts of 16-43 tokens, 24-47 new ones) pass 64 keys, so the tiny policy (splits
    /// of 64) cuts them, and 16 groups of two row blocks fill under 5/6 of one wave of 66
    /// (the H100's pairs; 132 multiprocessors).
    #[test]
    fn persistent_in_eager() {
        let cfg = EngineConfig::tiny(BackendProfile::FlashMla, SpecConfig::off());
        let split = cfg.split_policy();
        assert_eq!(split.split_size_tokens, 64);
        let splits = splits_of(&[90; 8], split);
        let launch = invariant_launch(&splits, 2, 132, &|n| 132 / n);
        assert!(
            matches!(launch, InvariantLaunch::Persistent(_)),
            "{launch:?}"
        );
    }
}
