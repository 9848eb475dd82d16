//! `gpu-bench --verify-step`: whole real-width steps timed through the engine (the
//! `specmla-sim` verify bench: 64 rows of 1 + K tokens at 4k keys by default), with the
//! GEMMs pinned (batch-invariant) and on cuBLAS's heuristic, graphs on and off, on one
//! device in one call, so the ratios compare like with like.

use std::sync::Arc;

use specmla_core::config::{EngineConfig, ModelDims};
use specmla_core::split::invariant_split_plan;
use specmla_gpu::ops::{GemmAlgo, FLASH_ROWS};
use specmla_gpu::{GpuBackend, GpuDevice};
use specmla_sim::step_bench::VerifyBench;
use specmla_sim::step_time::{lines, StepKindTime};

/// One timed configuration's per-kind summary.
pub struct StepRun {
    pub label: String,
    pub kinds: Vec<StepKindTime>,
}

/// Runs `bench` with each GEMM choice, with graphs on and (unless `graphs_only`) off;
/// prints and returns the summaries.
pub fn bench_verify_step(
    dev: &Arc<GpuDevice>,
    bench: VerifyBench,
    graphs_only: bool,
) -> Result<Vec<StepRun>, String> {
    let model = ModelDims::deepseek_v3_attn();
    let base = bench.config(model);
    let models = specmla_sim::runner::models(&base, 7);
    let mut out = Vec::new();
    let modes: &[bool] = if graphs_only { &[true] } else { &[true, false] };
    for &graphs in modes {
        for algo in [GemmAlgo::Invariant, GemmAlgo::Heuristic] {
            let b = VerifyBench {
                cuda_graphs: graphs,
                ..bench
            };
            let mut cfg = b.config(base.model.clone());
            // The split plan gpu-bench's invariant mode times at this shape, so the
            // step's attention compares with the kernel's own time.
            let heads = cfg.model.num_heads;
            let plan = invariant_split_plan((b.num_spec_tokens + 1) * heads, FLASH_ROWS);
            cfg.split_size_tokens = plan.split_size_tokens;
            cfg.max_splits = plan.max_splits;
            let make = |cfg: &EngineConfig, t, d| {
                let mut g = GpuBackend::on_device(Arc::clone(dev), cfg, t, d)?;
                g.set_gemm_algo(algo)?;
                Ok(g)
            };
            let times = b.run(&make, &cfg, models.clone())?;
            let label = format!(
                "{} rows x (1 + {}) at {} keys, graphs {}, GEMMs {}",
                b.rows,
                b.num_spec_tokens,
                b.context_tokens,
                if graphs { "on" } else { "off" },
                algo.name()
            );
            println!("{label}");
            let kinds = times.summary();
            for l in lines(&kinds) {
                println!("  {l}");
            }
            out.push(StepRun { label, kinds });
        }
    }
    Ok(out)
}
