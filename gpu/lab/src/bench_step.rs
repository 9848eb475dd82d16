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

/// One configuration of the backend a step bench times.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub graphs: bool,
    pub algo: GemmAlgo,
    /// Prefill rows on the portable f32 kernels instead of the TMA prefill.
    pub portable_prefill: bool,
}

impl Variant {
    fn label(&self, b: &VerifyBench) -> String {
        let prefill = match (b.prefill_chunk_tokens, self.portable_prefill) {
            (None, _) => String::new(),
            (Some(c), p) => format!(
                ", prompt chunks of {c} on the {} prefill",
                if p { "portable f32" } else { "TMA" }
            ),
        };
        format!(
            "{} rows x (1 + {}) at {} keys, graphs {}, GEMMs {}{prefill}",
            b.rows,
            b.num_spec_tokens,
            b.context_tokens,
            if self.graphs { "on" } else { "off" },
            self.algo.name()
        )
    }
}

/// Runs `bench` with each GEMM choice, with graphs on and (unless `graphs_only`) off;
/// prints and returns the summaries.
pub fn bench_verify_step(
    dev: &Arc<GpuDevice>,
    bench: VerifyBench,
    graphs_only: bool,
) -> Result<Vec<StepRun>, String> {
    let modes: &[bool] = if graphs_only { &[true] } else { &[true, false] };
    let variants = modes.iter().flat_map(|&graphs| {
        [GemmAlgo::Invariant, GemmAlgo::Heuristic].map(|algo| Variant {
            graphs,
            algo,
            portable_prefill: false,
        })
    });
    bench_steps(dev, bench, &variants.collect::<Vec<_>>())
}

/// `gpu-bench --prefill-step`: the verify bench with its prompts in chunks of
/// `chunk_tokens` (on the prefill path, with context chunks), the TMA prefill against
/// the portable f32 one, graphs on, GEMMs pinned.
pub fn bench_prefill_step(
    dev: &Arc<GpuDevice>,
    bench: VerifyBench,
    chunk_tokens: usize,
) -> Result<Vec<StepRun>, String> {
    let bench = VerifyBench {
        prefill_chunk_tokens: Some(chunk_tokens),
        ..bench
    };
    let variants = [false, true].map(|portable_prefill| Variant {
        graphs: true,
        algo: GemmAlgo::Invariant,
        portable_prefill,
    });
    bench_steps(dev, bench, &variants)
}

/// Runs `bench` under each variant; prints and returns the summaries.
fn bench_steps(
    dev: &Arc<GpuDevice>,
    bench: VerifyBench,
    variants: &[Variant],
) -> Result<Vec<StepRun>, String> {
    let model = ModelDims::deepseek_v3_attn();
    let base = bench.config(model);
    let models = specmla_sim::runner::models(&base, 7);
    let mut out = Vec::new();
    for v in variants {
        let b = VerifyBench {
            cuda_graphs: v.graphs,
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
            g.set_gemm_algo(v.algo)?;
            g.set_portable_prefill(v.portable_prefill);
            Ok(g)
        };
        let times = b.run(&make, &cfg, models.clone())?;
        let label = v.label(&b);
        println!("{label}");
        let kinds = times.summary();
        for l in lines(&kinds) {
            println!("  {l}");
        }
        out.push(StepRun { label, kinds });
    }
    Ok(out)
}
