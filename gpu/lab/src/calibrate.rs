//! `gpu-bench --calibrate FILE --commit SHA`: measures what `sim --cost-model` prices
//! steps with (`specmla_core::cost`), on this device, and writes the calibration file:
//! - the flash decode the engine runs (its kernel family, the default split policy) over
//!   heads x q_len x batch x context;
//! - the TMA prefill over causal and non-causal shapes;
//! - the cuBLASLt GEMMs (pinned algorithms) at DeepSeek-V3's shapes, the MoE experts'
//!   and one tensor-parallel rank's included, over M;
//! - the overhead: whole engine steps (the verify bench at DeepSeek-V3's attention widths,
//!   one rank of 16, 1 and 2 layers, K 1 and 3, graphs on and off), each step's wall time
//!   less the kernel classes' price of the same step, median per configuration and kind.
//!
//! Every kernel sample is sized by the same functions the model prices with
//! (`cost::step::{decode_size, prefill_size, gemm_size}`), so a fit's error on its own
//! samples is the model's error on those launches.

use std::sync::Arc;

use specmla_core::backend::StepTime;
use specmla_core::config::{EngineConfig, ModelDims};
use specmla_core::cost::step::{decode_size, gemm_size, prefill_size};
use specmla_core::cost::{
    step_cost, AllReduce, Calibration, CostTarget, HeadsClass, KernelClass, Overhead,
    OverheadSample, Sample, CALIBRATION_FORMAT,
};
use specmla_core::engine::StepOutcome;
use specmla_core::split::SplitPolicy;
use specmla_gpu::device::GpuError;
use specmla_gpu::launch::Buf;
use specmla_gpu::ops::{FlashKernels, Gemm, GemmAlgo, GemmShape, Kernels};
use specmla_gpu::{GpuBackend, GpuDevice};
use specmla_sim::step_bench::VerifyBench;

use crate::bench::{
    bench_flash, time_interleaved_us, BenchShape, DecodeInputs, FlashVariant, L2Scrub,
};
use crate::bench_prefill::{bench_flash_prefill, PrefillCase};

/// The all-reduce line of every calibration: one GPU cannot measure it.
fn allreduce_assumption() -> AllReduce {
    AllReduce {
        latency_us: 10.0,
        bus_gb_per_s: 360.0,
        source: "assumed, not measured (one GPU): NCCL ring all-reduce on 8 H100 SXM over \
                 NVLink 4, of the order of 360 GB/s bus bandwidth for large messages and \
                 10 us latency for small ones"
            .into(),
    }
}

/// The two split policies the decode is timed under at `context` keys: the default
/// unit with the cap a short `max_model_len` gives (long splits), and uncapped (a split
/// per unit, as a run whose `max_model_len` covers the context plans it).
fn split_policies(context: usize) -> [SplitPolicy; 2] {
    let p = EngineConfig::tiny(
        specmla_core::config::BackendProfile::FlashMla,
        specmla_core::config::SpecConfig::off(),
    )
    .split_policy();
    let uncapped = SplitPolicy {
        split_size_tokens: p.split_size_tokens,
        max_splits: context.div_ceil(p.split_size_tokens),
    };
    [p, uncapped]
}

/// Head counts the attention classes are measured at: one rank of 16, of 8, and all 128.
const HEADS: [usize; 3] = [8, 16, 128];

/// The decode at `h` heads over q_len (1 + K verify rows, and the 48-token prompt chunks
/// FlashMLA's threshold sends to the decode kernel) x batch x context.
fn decode_samples(
    dev: &GpuDevice,
    k: &Kernels,
    h: usize,
    quick: bool,
) -> Result<Vec<Sample>, GpuError> {
    let fk = FlashKernels::for_engine(dev)?;
    let scrub = L2Scrub::new(dev, k)?;
    let (q_lens, batches, contexts): (&[usize], &[usize], &[usize]) = match quick {
        true => (&[1, 4, 48], &[1, 32], &[256, 2048]),
        false => (&[1, 2, 4, 16, 48], &[1, 8, 32, 64], &[128, 1024, 4096]),
    };
    let mut out = Vec::new();
    for &q in q_lens {
        for &b in batches {
            for &l in contexts {
                let s = BenchShape {
                    heads: h,
                    q_len: q,
                    batch: b,
                    context: l,
                    page: 64,
                };
                let inp = DecodeInputs::new(dev, k, s, 13)?;
                let policies = split_policies(l);
                let variants = policies.map(|p| {
                    FlashVariant::split(fk.wide, (p.split_size_tokens, p.max_splits), "engine")
                });
                let reps = if quick { 5 } else { 10 };
                let ms = bench_flash(dev, &fk, &inp, &variants, reps, &scrub)?;
                for (p, m) in policies.iter().zip(ms) {
                    let splits = p.split_of(l).1 as usize;
                    let (bytes, flops, ctas) = decode_size(h, &vec![(q, l, splits); b]);
                    out.push(Sample {
                        label: format!("decode H {h} q {q} B {b} L {l}, {splits} splits"),
                        bytes,
                        flops,
                        ctas,
                        us: m.time_us,
                        gemm_mkn: None,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The prefill at `h` heads: causal new tokens, and queries over context (the chunk sizes
/// the engine runs, 512-token prompt chunks over up to 8k keys among them).
fn prefill_samples(
    dev: &GpuDevice,
    k: &Kernels,
    scrub: &L2Scrub,
    h: usize,
    quick: bool,
) -> Result<Vec<Sample>, GpuError> {
    let fk = FlashKernels::for_engine(dev)?;
    let causal = [
        (1, 128),
        (1, 512),
        (1, 1024),
        (1, 4096),
        (8, 256),
        (16, 512),
        (64, 48),
    ];
    let non_causal = [
        (1, 16, 2048),
        (1, 64, 256),
        (1, 64, 8192),
        (8, 64, 2048),
        (1, 512, 512),
        (1, 512, 2048),
        (16, 512, 1024),
        (16, 512, 4096),
        (32, 16, 1024),
        (64, 48, 4096),
    ];
    let mut cases: Vec<PrefillCase> = causal
        .iter()
        .map(|&(batch, q)| PrefillCase {
            heads: h,
            batch,
            q_len: q,
            k_len: q,
            causal: true,
        })
        .collect();
    cases.extend(non_causal.iter().map(|&(batch, q, kl)| PrefillCase {
        heads: h,
        batch,
        q_len: q,
        k_len: kl,
        causal: false,
    }));
    let mut out = Vec::new();
    for c in cases {
        // The engine's kernel is the fastest tile at every shape measured (BENCHMARKS.md).
        let ms = bench_flash_prefill(dev, k, &fk, c, if quick { 5 } else { 10 }, Some(scrub))?;
        let us = ms.iter().map(|m| m.time_us).fold(f64::INFINITY, f64::min);
        let rows = vec![(c.q_len, c.k_len); c.batch];
        let (bytes, flops, units) = prefill_size(c.heads, &rows, c.causal);
        let kind = if c.causal { "causal" } else { "non-causal" };
        out.push(Sample {
            label: format!(
                "prefill H {h} B {} q {} k {} {kind}",
                c.batch, c.q_len, c.k_len
            ),
            bytes,
            flops,
            ctas: units,
            us,
            gemm_mkn: None,
        });
    }
    Ok(out)
}

/// DeepSeek-V3's projection shapes `(k, n)`: attention at 8 and 128 heads per rank, the
/// dense MLP sharded 8 ways, one expert, the small model's MLP, the up-projection.
const GEMM_SHAPES: [(usize, usize); 12] = [
    (7168, 1536),
    (7168, 576),
    (1536, 1536),
    (1536, 24576),
    (1024, 7168),
    (16384, 7168),
    (7168, 4608),
    (2304, 7168),
    (7168, 4096),
    (2048, 7168),
    (512, 2048),
    (512, 32768),
];

fn gemm_samples(
    dev: &GpuDevice,
    k: &Kernels,
    scrub: &L2Scrub,
    quick: bool,
) -> Result<Vec<Sample>, GpuError> {
    let gemm = Gemm::new(dev, GemmAlgo::Invariant)?;
    let ms: &[usize] = if quick {
        &[1, 64, 1024]
    } else {
        &[1, 8, 32, 128, 512, 2048, 8192, 32768]
    };
    let mut out = Vec::new();
    for (kd, n) in GEMM_SHAPES {
        let w = Buf::<u16>::uninit(dev, kd * n, "calibration weight")?;
        k.fill_bf16_hash(dev, w.ptr(), w.len(), 5)?;
        for &m in ms {
            let x = Buf::<u16>::uninit(dev, m * kd, "calibration activations")?;
            k.fill_bf16_hash(dev, x.ptr(), x.len(), 6)?;
            let y = Buf::<f32>::uninit(dev, m * n, "calibration output")?;
            let shape = GemmShape::linear(m, kd, n, kd);
            let mut run = || gemm.run(dev, shape, w.ptr(), x.ptr(), y.ptr(), false);
            let reps = if quick { 5 } else { 20 };
            let us = time_interleaved_us(dev, 3, reps, Some(scrub), &mut [&mut run])?[0];
            let (bytes, flops, ctas) = gemm_size(m, kd, n, 1);
            out.push(Sample {
                label: format!("gemm M {m} K {kd} N {n}"),
                bytes,
                flops,
                ctas,
                us,
                gemm_mkn: Some([m, kd, n]),
            });
        }
    }
    Ok(out)
}

/// The f32-to-bf16 conversion of GEMM inputs, over sizes from one token's hidden state to
/// thousands of tokens'.
fn convert_samples(
    dev: &GpuDevice,
    k: &Kernels,
    scrub: &L2Scrub,
    quick: bool,
) -> Result<Vec<Sample>, GpuError> {
    let sizes: &[usize] = if quick {
        &[7168, 1 << 20, 1 << 24]
    } else {
        &[1536, 7168, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]
    };
    let mut out = Vec::new();
    for &n in sizes {
        let x = Buf::<f32>::uninit(dev, n, "calibration f32 input")?;
        k.fill(dev, x.ptr(), 0.5, n)?;
        let y = Buf::<u16>::uninit(dev, n, "calibration bf16 output")?;
        let mut run = || k.to_bf16(dev, x.ptr(), y.ptr(), n);
        let reps = if quick { 5 } else { 20 };
        let us = time_interleaved_us(dev, 3, reps, Some(scrub), &mut [&mut run])?[0];
        out.push(Sample {
            label: format!("to_bf16 of {n} values"),
            bytes: n as f64 * 6.0,
            flops: 0.0,
            ctas: 0.0,
            us,
            gemm_mkn: None,
        });
    }
    Ok(out)
}

/// The overhead samples: verify-bench runs through the engine, each step's wall time less
/// `kernels`' price of it, median per configuration and step shape (graph or eager,
/// drafter passes, tokens; shapes seen fewer than 3 times are left out as noise).
fn overhead_samples(
    dev: &Arc<GpuDevice>,
    kernels: &Calibration,
    quick: bool,
) -> Result<Vec<OverheadSample>, String> {
    // (layers, K, graphs, rows)
    let configs: &[(usize, usize, bool, usize)] = match quick {
        true => &[
            (2, 0, true, 8),
            (2, 1, true, 8),
            (2, 3, true, 32),
            (2, 1, false, 8),
        ],
        // Without K 0 the per-step and per-pass terms trade off freely: a calibration
        // without them over-priced plain decode steps by 24-29%.
        false => &[
            (1, 0, true, 8),
            (2, 0, true, 8),
            (2, 0, true, 32),
            (2, 0, false, 8),
            (1, 1, true, 8),
            (1, 3, true, 8),
            (2, 1, true, 8),
            (2, 3, true, 8),
            (1, 1, true, 32),
            (2, 3, true, 32),
            (2, 1, true, 64),
            (1, 1, false, 8),
            (2, 1, false, 8),
            (2, 3, false, 32),
        ],
    };
    let mut out = Vec::new();
    for &(layers, k, graphs, rows) in configs {
        let bench = VerifyBench {
            rows,
            context_tokens: 512,
            decode_steps: 12,
            num_spec_tokens: k,
            cuda_graphs: graphs,
            prefill_chunk_tokens: None,
        };
        let mut groups: Vec<((bool, usize, usize), Vec<f64>)> = Vec::new();
        run_bench(dev, bench, layers, &mut |target, o, t| {
            let c = step_cost(kernels, target, o);
            let key = (
                o.plan.cudagraph.is_some(),
                specmla_core::cost::drafter_passes(o),
                o.plan.num_tokens(),
            );
            let r = t.wall_us - (c.attention_us + c.gemm_us + c.comm_us);
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => g.1.push(r),
                None => groups.push((key, vec![r])),
            }
        })?;
        let kind = |graph| if graph { "graph steps" } else { "eager steps" };
        for ((graph, passes, tokens), mut v) in groups {
            if v.len() < 3 {
                continue;
            }
            v.sort_by(f64::total_cmp);
            out.push(OverheadSample {
                label: format!(
                    "verify bench {rows} x (1 + {k}) at 512 keys, 8 heads, {layers} layers, {}",
                    kind(graph)
                ),
                graph,
                layers,
                passes,
                tokens,
                us: v[v.len() / 2],
                steps: v.len(),
            });
        }
    }
    Ok(out)
}

/// Runs `bench` through the engine at DeepSeek-V3's attention widths (one rank of 16,
/// `layers` layers), handing each timed step to `on_step` with the target that prices it.
fn run_bench(
    dev: &Arc<GpuDevice>,
    bench: VerifyBench,
    layers: usize,
    on_step: &mut dyn FnMut(&CostTarget, &StepOutcome, &StepTime),
) -> Result<(), String> {
    let model = ModelDims {
        num_layers: layers,
        ..ModelDims::deepseek_v3_attn()
            .tensor_parallel(16)
            .expect("16 divides 128")
    };
    let cfg = bench.config(model);
    let target = CostTarget::engine(&cfg.model);
    let models = specmla_sim::runner::models(&cfg, 7);
    let make = |cfg: &EngineConfig, t, d| GpuBackend::on_device(Arc::clone(dev), cfg, t, d);
    bench.run_observed(&make, &cfg, models, &mut |o, t| on_step(&target, o, t))?;
    Ok(())
}

/// Measures and fits every class on `dev`; `commit` is the binary's commit.
pub fn calibrate(dev: &Arc<GpuDevice>, quick: bool, commit: &str) -> Result<Calibration, String> {
    let k = Kernels::load(dev).map_err(|e| e.to_string())?;
    let class = |s: Result<Vec<Sample>, GpuError>, what: &str| -> Result<KernelClass, String> {
        KernelClass::fitted(s.map_err(|e| format!("{what}: {e}"))?)
            .map_err(|e| format!("{what}: {e}"))
    };
    // Every timed launch starts behind the scrub, with a cold cache (a layer's weights
    // are not in L2 when its GEMMs run) and a busy device: timed from an idle one, a
    // launch also counts the host's latency to enqueue it (several us for cuBLASLt),
    // which a graph replay, and an eager step whose host runs ahead, never pay.
    let scrub = L2Scrub::new(dev, &k).map_err(|e| e.to_string())?;
    let (mut decode, mut prefill) = (Vec::new(), Vec::new());
    for h in HEADS {
        let class_d = class(decode_samples(dev, &k, h, quick), "decode")?;
        decode.push(HeadsClass {
            heads: h,
            class: class_d,
        });
        let class_p = class(prefill_samples(dev, &k, &scrub, h, quick), "prefill")?;
        prefill.push(HeadsClass {
            heads: h,
            class: class_p,
        });
    }
    let gemm = class(gemm_samples(dev, &k, &scrub, quick), "gemm")?;
    let convert = class(convert_samples(dev, &k, &scrub, quick), "convert")?;
    let mut c = Calibration {
        format: CALIBRATION_FORMAT,
        device: dev.name.clone(),
        commit: commit.to_string(),
        decode,
        prefill,
        gemm,
        convert,
        overhead: Overhead::fitted(Vec::new()),
        allreduce: allreduce_assumption(),
    };
    c.overhead = Overhead::fitted(overhead_samples(dev, &c, quick)?);
    Ok(c)
}

/// The report lines: each class's fit and its error on its own samples, the overhead.
pub fn report(c: &Calibration) -> Vec<String> {
    let mut out = vec![format!("calibration on {} at {}", c.device, c.commit)];
    let mut classes: Vec<(String, &KernelClass)> = Vec::new();
    for (name, v) in [("decode", &c.decode), ("prefill", &c.prefill)] {
        classes.extend(v.iter().map(|h| (format!("{name} H{}", h.heads), &h.class)));
    }
    classes.push(("gemm".into(), &c.gemm));
    classes.push(("convert".into(), &c.convert));
    let rate = |per: f64| if per > 0.0 { 1e6 / per } else { f64::INFINITY };
    for (name, k) in classes {
        let (median, max) = k.fit_errors();
        let f = k.fit;
        out.push(format!(
            "  {name:<12} {} samples: {:.2} us + bytes at {:.0} GB/s + flops at {:.0} TFLOP/s + \
             {:.2} us per 1000 CTAs; fit error median {:.1}%, worst {:.1}%",
            k.samples.len(),
            f.overhead_us,
            rate(f.us_per_gb),
            rate(f.us_per_tflop),
            f.us_per_kcta,
            100.0 * median,
            100.0 * max
        ));
    }
    for (name, f) in [("graph", c.overhead.graph), ("eager", c.overhead.eager)] {
        out.push(format!(
            "  overhead {name}: {:.1} us + {:.1} us per layer + {:.1} us per drafter pass + \
             {:.3} us per token",
            f.step_us, f.layer_us, f.pass_us, f.token_us
        ));
    }
    for s in &c.overhead.samples {
        out.push(format!(
            "    {}: {} passes, {} tokens, median residual {:.1} us over {} steps",
            s.label, s.passes, s.tokens, s.us, s.steps
        ));
    }
    out
}

/// One held-out configuration: its measured and simulated totals over the same steps.
pub struct Validation {
    pub label: String,
    pub steps: usize,
    pub measured_us: f64,
    pub simulated_us: f64,
    /// The same, by step kind, with the parts the backend times on its own.
    pub kinds: Vec<KindComparison>,
}

/// One step kind of a validation run: totals over its steps.
#[derive(Clone, Debug, Default)]
pub struct KindComparison {
    pub kind: &'static str,
    pub steps: usize,
    pub measured_us: f64,
    pub simulated_us: f64,
    pub measured_attention_us: f64,
    pub simulated_attention_us: f64,
    /// Eager GEMMs (a graph's are inside its replay).
    pub measured_gemm_us: f64,
    pub simulated_gemm_us: f64,
    pub simulated_overhead_us: f64,
}

impl Validation {
    /// `simulated / measured - 1`: the error of simulated step time, and so (over the same
    /// generated tokens) of throughput, the other way round.
    pub fn error(&self) -> f64 {
        self.simulated_us / self.measured_us - 1.0
    }
}

/// Runs verify benches the calibration did not measure (other batches, contexts, K, the
/// prefill path) through the engine, and prices each timed step with `c`.
pub fn validate(
    dev: &Arc<GpuDevice>,
    c: &Calibration,
    quick: bool,
) -> Result<Vec<Validation>, String> {
    // (rows, context, K, graphs, prefill chunk)
    let configs: &[(usize, usize, usize, bool, Option<usize>)] = match quick {
        true => &[(32, 1024, 2, true, None), (16, 1024, 2, true, Some(512))],
        false => &[
            (1, 1024, 2, true, None),
            (4, 1024, 0, true, None),
            (32, 1024, 2, true, None),
            (64, 4096, 2, true, None),
            (16, 2048, 3, false, None),
            (64, 1024, 1, true, None),
            (16, 2048, 2, true, Some(512)),
        ],
    };
    let mut out = Vec::new();
    for &(rows, context, k, graphs, chunk) in configs {
        let bench = VerifyBench {
            rows,
            context_tokens: context,
            decode_steps: 12,
            num_spec_tokens: k,
            cuda_graphs: graphs,
            prefill_chunk_tokens: chunk,
        };
        let (mut measured_us, mut simulated_us, mut steps) = (0.0, 0.0, 0);
        let mut kinds: Vec<KindComparison> = Vec::new();
        run_bench(dev, bench, 2, &mut |target, o, t| {
            let sim = step_cost(c, target, o);
            measured_us += t.wall_us;
            simulated_us += sim.total_us();
            steps += 1;
            let kind = specmla_sim::step_time::step_kind(&o.plan).unwrap_or("empty");
            let k = match kinds.iter().position(|k| k.kind == kind) {
                Some(i) => &mut kinds[i],
                None => {
                    kinds.push(KindComparison {
                        kind,
                        ..Default::default()
                    });
                    kinds.last_mut().expect("just pushed")
                }
            };
            k.steps += 1;
            k.measured_us += t.wall_us;
            k.simulated_us += sim.total_us();
            k.measured_attention_us += t.attention_us;
            k.simulated_attention_us += sim.attention_us;
            k.measured_gemm_us += t.gemm_us;
            k.simulated_gemm_us += sim.gemm_us;
            k.simulated_overhead_us += sim.host_us;
        })?;
        out.push(Validation {
            label: format!(
                "verify bench {rows} x (1 + {k}) at {context} keys, graphs {}{}",
                if graphs { "on" } else { "off" },
                chunk.map_or(String::new(), |c| format!(", prompt chunks of {c}"))
            ),
            steps,
            measured_us,
            simulated_us,
            kinds,
        });
    }
    Ok(out)
}
