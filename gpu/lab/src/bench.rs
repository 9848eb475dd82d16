//! `gpu-bench` measurements: the two ceilings (a large device-to-device copy and a large
//! bf16 cuBLAS GEMM) and our attention paths at the RULES §12 shapes, each timed
//! with CUDA events (warm-up, then the median of many runs) and reported against the
//! ceilings measured in the same run. One CSV row per measurement.

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::CUevent_flags;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::checks::shuffled_ids;
use specmla_core::balanced::{invariant_balanced_schedule, BalancedPolicy};
use specmla_core::split::{invariant_split_plan, SplitPolicy, SplitSchedule};
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::launch::{copy, Buf};
use specmla_gpu::ops::{
    BalancedWork, ContextChunk, DecodeBufs, DecodeShape, FlashKernels, FlashSchedule, FlashShape,
    FlashWorkspace, Kernels, MlaDims, PagedContext, RowScratch, RowTokens, State, WideKernel,
    FLASH_DIM, FLASH_DV, FLASH_ROWS,
};

/// Header of the CSV `gpu-bench` writes (and `plots` reads).
pub const CSV_HEADER: &str =
    "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm,sm_mhz";

/// One attention shape of the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchShape {
    pub heads: usize,
    pub q_len: usize,
    pub batch: usize,
    pub context: usize,
    pub page: usize,
}

impl BenchShape {
    /// Useful bytes (RULES §12): queries, the latent cache once, outputs; bf16.
    pub fn bytes(&self) -> f64 {
        let (b, s, h, l) = (self.batch, self.q_len, self.heads, self.context);
        (b * (s * h * 576 * 2 + l * 576 * 2 + s * h * 512 * 2)) as f64
    }
    /// FLOPs (RULES §12): QK over 576 and PV over 512 for every query and key.
    pub fn flops(&self) -> f64 {
        let (b, s, h, l) = (self.batch, self.q_len, self.heads, self.context);
        (b * h * s) as f64 * (2.0 * 576.0 * l as f64 + 2.0 * 512.0 * l as f64)
    }
}

/// One measured row.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub kernel: &'static str,
    pub mode: &'static str,
    pub shape: Option<BenchShape>,
    pub time_us: f64,
    pub bytes: f64,
    pub flops: f64,
    /// The SM clock right after the timed rounds of this row's shape (all its variants;
    /// `gpu-bench` stamps it), MHz.
    pub sm_mhz: Option<f64>,
}

/// The measured ceilings of this run.
#[derive(Clone, Copy, Debug)]
pub struct Ceilings {
    /// Device-to-device copy, bytes read + written per second.
    pub copy_gb_per_s: f64,
    /// bf16 GEMM (8192^3 by default) through cuBLAS.
    pub gemm_tflop_per_s: f64,
}

impl Measurement {
    pub fn gb_per_s(&self) -> f64 {
        self.bytes / self.time_us / 1e3
    }
    pub fn tflop_per_s(&self) -> f64 {
        self.flops / self.time_us / 1e6
    }
    /// The CSV row, with percentages of the ceilings and the clock (empty where unread).
    pub fn csv(&self, c: &Ceilings) -> String {
        let s = self.shape.unwrap_or(BenchShape {
            heads: 0,
            q_len: 0,
            batch: 0,
            context: 0,
            page: 0,
        });
        let (gb, tf) = (self.gb_per_s(), self.tflop_per_s());
        format!(
            "{},{},{},{},{},{},{},{:.3},{:.0},{:.0},{:.2},{:.3},{:.2},{:.2},{}",
            self.kernel,
            self.mode,
            s.heads,
            s.q_len,
            s.batch,
            s.context,
            s.page,
            self.time_us,
            self.bytes,
            self.flops,
            gb,
            tf,
            100.0 * gb / c.copy_gb_per_s,
            100.0 * tf / c.gemm_tflop_per_s,
            self.sm_mhz.map_or(String::new(), |m| format!("{m:.0}"))
        )
    }
}

/// Times `f` with CUDA events: `warmup` runs, then the median of `reps` timed runs, in µs.
pub fn time_us(
    dev: &GpuDevice,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let mut one: [&mut dyn FnMut() -> Result<(), GpuError>; 1] = [&mut f];
    Ok(time_interleaved_us(dev, warmup, reps, None, &mut one)?[0])
}

/// How [`L2Scrub`] clears the L2 before a timed launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ScrubKind {
    /// Read the buffer: the L2 then holds clean lines of it only.
    Read,
    /// Overwrite the buffer (FlashMLA's harness clears its L2 with a 256 MB memset): the
    /// L2 then holds dirty lines of it, which the timed launch's misses write back.
    Write,
}

/// A 128 MiB buffer (over twice the H100's 50 MiB of L2) and the kernel that reads (or
/// overwrites) it: run before every timed launch of a comparison, so each starts from the
/// same cold cache, with no other launch's inputs in it.
pub struct L2Scrub<'a> {
    k: &'a Kernels,
    buf: Buf<f32>,
    sink: Buf<f32>,
    kind: ScrubKind,
}

impl<'a> L2Scrub<'a> {
    const FLOATS: usize = 2 * 64 * (1 << 20) / 4;

    pub fn new(dev: &GpuDevice, k: &'a Kernels) -> Result<Self, GpuError> {
        Self::with_kind(dev, k, ScrubKind::Read)
    }

    pub fn with_kind(dev: &GpuDevice, k: &'a Kernels, kind: ScrubKind) -> Result<Self, GpuError> {
        let buf = Buf::uninit(dev, Self::FLOATS, "L2 scrub buffer")?;
        k.fill(dev, buf.ptr(), 0.0, Self::FLOATS)?;
        let sink = Buf::uninit(dev, 1, "L2 scrub sink")?;
        Ok(Self { k, buf, sink, kind })
    }

    fn run(&self, dev: &GpuDevice) -> Result<(), GpuError> {
        match self.kind {
            ScrubKind::Read => self
                .k
                .scrub_l2(dev, self.buf.ptr(), Self::FLOATS, self.sink.ptr()),
            ScrubKind::Write => self.k.fill(dev, self.buf.ptr(), 0.0, Self::FLOATS),
        }
    }
}

/// Times several launches against each other: `warmup` runs of each, then `reps` rounds
/// in which each runs once untimed and then once between its own CUDA events (after
/// `scrub`, if given, between the two), in a shuffled order every round; the median per
/// launch, in µs.
/// Round by round, so the clock the GPU settles at under sustained load (it falls as the
/// chip heats) weighs on every variant alike, not on whichever was timed last.
pub fn time_interleaved_us(
    dev: &GpuDevice,
    warmup: usize,
    reps: usize,
    scrub: Option<&L2Scrub>,
    fs: &mut [&mut dyn FnMut() -> Result<(), GpuError>],
) -> Result<Vec<f64>, GpuError> {
    for f in fs.iter_mut() {
        for _ in 0..warmup {
            f()?;
        }
    }
    let ev = || {
        dev.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(GpuError::driver("creating a timing event"))
    };
    let n = fs.len();
    let mut times = vec![Vec::with_capacity(reps); n];
    // The launch before a timed one weighs on it even across the scrub: with the
    // variants in an order rotated every round (each always after the same one), two
    // identical 128-head q 1 grid launches differed by 2.4-4.6%, the slower one always
    // the variant after the mma.sync peer (runs 211-213 on the H100). So each timed
    // launch follows an untimed one of its own, as a launch repeated on its own is timed
    // (FlashMLA's harness), and each round takes the variants in a fixed seed's shuffle:
    // none is always first after the host's wait on the previous round.
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(0x0DE7_0A11);
    for _ in 0..reps.max(1) {
        order.shuffle(&mut rng);
        for &i in &order {
            let (f, t) = (&mut fs[i], &mut times[i]);
            f()?;
            if let Some(scrub) = scrub {
                scrub.run(dev)?;
            }
            let (start, end) = (ev()?, ev()?);
            start
                .record(&dev.stream)
                .map_err(GpuError::driver("recording an event"))?;
            f()?;
            end.record(&dev.stream)
                .map_err(GpuError::driver("recording an event"))?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(GpuError::driver("reading an event"))?;
            t.push(ms as f64 * 1e3);
        }
    }
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect())
}

/// Measures both ceilings.
pub fn ceilings(dev: &Arc<GpuDevice>, quick: bool) -> Result<Ceilings, GpuError> {
    let copy_bytes: usize = if quick { 256 << 20 } else { 1 << 30 };
    let n = copy_bytes / 4;
    let (src, dst) = (
        Buf::<f32>::uninit(dev, n, "copy-ceiling source")?,
        Buf::<f32>::uninit(dev, n, "copy-ceiling destination")?,
    );
    let t = time_us(dev, 3, if quick { 10 } else { 30 }, || {
        copy(dev, src.ptr(), dst.ptr(), n)
    })?;
    let copy_gb_per_s = 2.0 * copy_bytes as f64 / t / 1e3;
    let gemm_tflop_per_s = gemm_rate(dev, if quick { 4096 } else { 8192 })?;
    Ok(Ceilings {
        copy_gb_per_s,
        gemm_tflop_per_s,
    })
}

/// bf16 GEMM `n^3` through cuBLAS (f32 accumulate), TFLOP/s.
fn gemm_rate(dev: &Arc<GpuDevice>, n: usize) -> Result<f64, GpuError> {
    let blas = CudaBlas::new(Arc::clone(&dev.stream))
        .map_err(|e| GpuError::NoDevice(format!("cuBLAS could not be loaded: {e:?}")))?;
    let mk = |what: &str| -> Result<cudarc::driver::CudaSlice<half::bf16>, GpuError> {
        dev.stream
            .alloc_zeros::<half::bf16>(n * n)
            .map_err(|e| GpuError::alloc(what, n * n * 2, e))
    };
    let (a, b, mut c) = (mk("GEMM A")?, mk("GEMM B")?, mk("GEMM C")?);
    let cfg = GemmConfig {
        transa: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: half::bf16::ONE,
        lda: n as i32,
        ldb: n as i32,
        beta: half::bf16::ZERO,
        ldc: n as i32,
    };
    let t = time_us(dev, 3, 10, || {
        // SAFETY: A, B and C are n x n device matrices matching cfg.
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }
            .map_err(|e| GpuError::NoDevice(format!("cuBLAS GEMM failed: {e:?}")))
    })?;
    Ok(2.0 * (n as f64).powi(3) / t / 1e6)
}

/// Device inputs of one decode shape: bf16 queries and paged cache, a shuffled block
/// table, every request at `context` keys.
pub struct DecodeInputs {
    pub shape: BenchShape,
    pub q: Buf<u16>,
    pub cache: Buf<u16>,
    pub block_table: Buf<i32>,
    pub seq_lens: Buf<i32>,
    /// The block table on the host, which split schedules are built over.
    pub table: Vec<i32>,
    pub width: usize,
}

impl DecodeInputs {
    /// The launch shape of these inputs under `plan` (split size in tokens, splits).
    pub fn flash_shape(&self, (split_size_tokens, max_splits): (usize, usize)) -> FlashShape {
        let s = self.shape;
        FlashShape {
            batch: s.batch,
            q_len: s.q_len,
            heads: s.heads,
            page: s.page,
            width: self.width,
            split_size_tokens,
            max_splits,
        }
    }

    /// `plan`'s split schedule over these inputs' table (core's policy), and on the device.
    pub fn schedule(
        &self,
        dev: &GpuDevice,
        (split_size_tokens, max_splits): (usize, usize),
    ) -> Result<(SplitSchedule, FlashSchedule), GpuError> {
        let policy = SplitPolicy {
            split_size_tokens,
            max_splits,
        };
        let seq = vec![self.shape.context as i32; self.shape.batch];
        let sched =
            crate::checks::schedule_of(policy, &seq, &self.table, self.width, self.shape.page);
        let on_device = FlashSchedule::upload(dev, &sched, split_size_tokens)?;
        Ok((sched, on_device))
    }

    pub fn new(dev: &GpuDevice, k: &Kernels, s: BenchShape, seed: u64) -> Result<Self, GpuError> {
        let width = s.context.div_ceil(s.page);
        let blocks = s.batch * width;
        let rows = s.q_len * s.heads;
        let q = Buf::<u16>::uninit(dev, s.batch * rows * FLASH_DIM, "bench queries")?;
        let cache = Buf::<u16>::uninit(dev, blocks * s.page * FLASH_DIM, "bench KV cache")?;
        k.fill_bf16_hash(dev, q.ptr(), q.len(), seed as u32)?;
        k.fill_bf16_hash(dev, cache.ptr(), cache.len(), seed as u32 ^ 0x9e37_79b9)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let table: Vec<i32> = shuffled_ids(&mut rng, blocks);
        Ok(Self {
            shape: s,
            q,
            cache,
            block_table: Buf::from_host(dev, &table, "bench block table")?,
            seq_lens: Buf::from_host(dev, &vec![s.context as i32; s.batch], "bench seq_lens")?,
            table,
            width,
        })
    }
}

/// One way to run the tensor-core decode at a shape: the kernel family for the wide rows,
/// the split plan (split size in keys, most splits a request takes) and the mode label.
#[derive(Clone, Copy, Debug)]
pub struct FlashVariant {
    pub wide: WideKernel,
    pub plan: (usize, usize),
    pub mode: &'static str,
    /// A balanced schedule of this policy instead of `plan`'s splits (the seesaw kernel's
    /// persistent launch and `flash_combine_slots`; `plan` is then unused).
    pub balanced: Option<BalancedPolicy>,
    /// With `balanced`: the batch-invariant schedule of `plan`'s splits
    /// (`invariant_balanced_schedule`) instead of the fast mode's cuts.
    pub invariant: bool,
    /// Without `balanced`: the grid's splits a request where they are fewer than `plan`'s
    /// cap (the batch's largest count, [`specmla_core::invariant_launch`]); the schedule
    /// stays `plan`'s.
    pub grid_splits: Option<usize>,
}

impl FlashVariant {
    /// `wide` on `plan`'s splits.
    pub fn split(wide: WideKernel, plan: (usize, usize), mode: &'static str) -> Self {
        Self {
            wide,
            plan,
            mode,
            balanced: None,
            invariant: false,
            grid_splits: None,
        }
    }
}

/// A variant's launch state: its workspace, split schedule and balanced work, if any.
struct VariantState {
    ws: FlashWorkspace,
    sched: FlashSchedule,
    shape: FlashShape,
    work: Option<BalancedWork>,
}

impl VariantState {
    fn new(
        dev: &GpuDevice,
        k: &FlashKernels,
        inp: &DecodeInputs,
        v: &FlashVariant,
    ) -> Result<Self, GpuError> {
        let s = inp.shape;
        let Some(policy) = v.balanced else {
            let shape = FlashShape {
                max_splits: v.grid_splits.unwrap_or(v.plan.1),
                ..inp.flash_shape(v.plan)
            };
            return Ok(Self {
                ws: FlashWorkspace::new(dev, shape, k.out, None)?,
                sched: inp.schedule(dev, v.plan)?.1,
                shape,
                work: None,
            });
        };
        let lens = vec![s.context as u32; s.batch];
        let sched = if v.invariant {
            let (split_size_tokens, max_splits) = v.plan;
            let split = SplitPolicy {
                split_size_tokens,
                max_splits,
            };
            invariant_balanced_schedule(&lens, split, policy)
        } else {
            policy.schedule(&lens)
        };
        // One split a request for the mapped keys; the workspace's partials hold the slots.
        let one = (s.context.div_ceil(64) * 64, 1);
        let shape = BalancedWork::shape(sched.partial_slots, inp.flash_shape(one));
        Ok(Self {
            ws: FlashWorkspace::new(dev, shape, k.out, None)?,
            sched: inp.schedule(dev, one)?.1,
            shape,
            work: Some(BalancedWork::upload(dev, &sched)?),
        })
    }
}

/// Times the tensor-core decode at `inp.shape` in each of `variants`, interleaved round by
/// round, each launch after `scrub` ([`time_interleaved_us`]). A row is `decode` on the
/// device's default kernel, else the family's peer label (`decode_wgmma`, `decode_mma`).
pub fn bench_flash(
    dev: &GpuDevice,
    k: &FlashKernels,
    inp: &DecodeInputs,
    variants: &[FlashVariant],
    reps: usize,
    scrub: &L2Scrub,
) -> Result<Vec<Measurement>, GpuError> {
    let s = inp.shape;
    let states = variants
        .iter()
        .map(|v| VariantState::new(dev, k, inp, v))
        .collect::<Result<Vec<_>, _>>()?;
    let scale = 1.0 / 192f32.sqrt();
    let mut runs: Vec<Box<dyn FnMut() -> Result<(), GpuError> + '_>> = variants
        .iter()
        .zip(&states)
        .map(|(v, st)| {
            let bufs = st.ws.bufs(
                inp.q.ptr(),
                inp.cache.ptr(),
                inp.block_table.ptr(),
                inp.seq_lens.ptr(),
                &st.sched,
            );
            let (wide, fs) = (v.wide, st.shape);
            // SAFETY: DecodeInputs builds a block table with no hole, every entry inside
            // its cache, and its mapped keys from that table; a balanced schedule is core's
            // for its seq_lens.
            Box::new(move || unsafe {
                match &st.work {
                    Some(w) => k.flash_decode_balanced(dev, fs, bufs, w, scale),
                    None => k.flash_decode_with(wide, dev, fs, bufs, scale),
                }
            }) as Box<dyn FnMut() -> Result<(), GpuError> + '_>
        })
        .collect();
    let mut refs: Vec<&mut dyn FnMut() -> Result<(), GpuError>> =
        runs.iter_mut().map(|r| &mut **r as _).collect();
    let times = time_interleaved_us(dev, 3, reps, Some(scrub), &mut refs)?;
    Ok(variants
        .iter()
        .zip(times)
        .map(|(v, t)| Measurement {
            kernel: if v.wide == k.wide {
                "decode"
            } else {
                v.wide.peer_label()
            },
            mode: v.mode,
            shape: Some(s),
            time_us: t,
            bytes: s.bytes(),
            flops: s.flops(),
            sm_mhz: None,
        })
        .collect())
}

/// Times the f32 correctness-baseline decode (`mla_decode`) at `s`, inputs f32.
pub fn bench_baseline_decode(
    dev: &GpuDevice,
    k: &Kernels,
    s: BenchShape,
    reps: usize,
) -> Result<Measurement, GpuError> {
    let width = s.context.div_ceil(s.page);
    let tokens = s.batch * s.q_len;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let table: Vec<i32> = shuffled_ids(&mut rng, s.batch * width);
    let cache = Buf::<f32>::uninit(dev, s.batch * width * s.page * FLASH_DIM, "baseline cache")?;
    let q = Buf::<f32>::uninit(dev, tokens * s.heads * FLASH_DIM, "baseline queries")?;
    k.fill(dev, cache.ptr(), 0.01, cache.len())?;
    k.fill(dev, q.ptr(), 0.01, q.len())?;
    // The invariant plan's unit, uncapped: the f32 kernel's splits are one CTA's loop.
    let unit = invariant_split_plan(s.q_len * s.heads, FLASH_ROWS).split_size_tokens;
    let (split, n) = SplitPolicy {
        split_size_tokens: unit,
        max_splits: s.context.div_ceil(unit).max(1),
    }
    .split_of(s.context);
    let seq = vec![s.context as i32; s.batch];
    let (td, sd, ld, nd) = (
        Buf::from_host(dev, &table, "baseline table")?,
        Buf::from_host(dev, &seq, "baseline seq_lens")?,
        Buf::from_host(dev, &vec![split as i32; s.batch], "baseline split lengths")?,
        Buf::from_host(dev, &vec![n as i32; s.batch], "baseline splits")?,
    );
    let out = Buf::<f32>::uninit(dev, tokens * s.heads * FLASH_DV, "baseline out")?;
    let lse = Buf::<f32>::uninit(dev, tokens * s.heads, "baseline lse")?;
    let shape = DecodeShape {
        num_rows: s.batch,
        q_len: s.q_len,
        heads: s.heads,
        dim: FLASH_DIM,
        dv: FLASH_DV,
        page: s.page,
        width,
    };
    let bufs = DecodeBufs {
        q: q.ptr(),
        cache: cache.ptr(),
        block_table: td.ptr(),
        seq_lens: sd.ptr(),
        split_lens: ld.ptr(),
        num_splits: nd.ptr(),
        out: out.ptr(),
        lse: lse.ptr(),
    };
    // SAFETY: the table built above covers every row's context with blocks of `cache`.
    let t = time_us(dev, 1, reps, || unsafe { k.decode(dev, shape, bufs, 0.07) })?;
    Ok(Measurement {
        kernel: "decode_f32_baseline",
        mode: "invariant",
        shape: Some(s),
        time_us: t,
        bytes: s.bytes(),
        flops: s.flops(),
        sm_mhz: None,
    })
}

/// Times our portable prefill path on a spec-step shape: per request, the backend's
/// `chunked_prefill_row` (the new tokens causal, the context gathered from the cache as
/// one chunk, K/V materialized per head, attended, both merged by LSE; f32).
pub fn bench_prefill_path(
    dev: &GpuDevice,
    k: &Kernels,
    s: BenchShape,
    reps: usize,
) -> Result<Measurement, GpuError> {
    let d = MlaDims {
        heads: s.heads,
        kv_lora: FLASH_DV,
        rope: FLASH_DIM - FLASH_DV,
        nope: 128,
        v: 128,
    };
    let width = s.context.div_ceil(s.page);
    let cache = Buf::<f32>::uninit(
        dev,
        s.batch * width * s.page * FLASH_DIM,
        "prefill-path cache",
    )?;
    k.fill(dev, cache.ptr(), 0.01, cache.len())?;
    let table: Vec<i32> = (0..(s.batch * width) as i32).collect();
    let td = Buf::from_host(dev, &table, "prefill-path table")?;
    let n = s.context;
    let buf = |len: usize, what: &str| -> Result<Buf<f32>, GpuError> {
        let b = Buf::<f32>::uninit(dev, len, what)?;
        k.fill(dev, b.ptr(), 0.01, len)?;
        Ok(b)
    };
    let keys_len = n.max(s.q_len);
    let keys = buf(keys_len * FLASH_DIM, "prefill-path context")?;
    let new_lat = buf(s.q_len * FLASH_DIM, "prefill-path new latents")?;
    let w_uk = buf(d.heads * d.kv_lora * d.nope, "prefill-path w_uk")?;
    let w_uv = buf(d.heads * d.kv_lora * d.v, "prefill-path w_uv")?;
    let k_nope = buf(keys_len * d.heads * d.nope, "prefill-path k_nope")?;
    let v = buf(keys_len * d.heads * d.v, "prefill-path v")?;
    let q = buf(s.q_len * d.heads * d.qk(), "prefill-path q")?;
    let part = |what: &str| buf(s.q_len * d.heads * d.v.max(1), what);
    let (o1, o2, o3) = (
        part("prefill-path out")?,
        part("new out")?,
        part("part out")?,
    );
    let (l1, l2, l3) = (
        part("prefill-path lse")?,
        part("new lse")?,
        part("part lse")?,
    );
    let state = |o: &Buf<f32>, l: &Buf<f32>| State {
        out: o.ptr(),
        lse: l.ptr(),
    };
    let sc = RowScratch {
        keys: keys.ptr(),
        k_nope: k_nope.ptr(),
        v: v.ptr(),
        new: state(&o2, &l2),
        part: state(&o3, &l3),
    };
    let row = RowTokens {
        q: q.ptr(),
        latent: new_lat.ptr(),
        m: s.q_len,
    };
    let chunks = [ContextChunk { start: 0, len: n }];
    let t = time_us(dev, 1, reps, || {
        for b in 0..s.batch {
            let ctx = PagedContext {
                cache: cache.ptr(),
                row_table: td.ptr().range(b * width, width),
                page: s.page,
            };
            // SAFETY: the bench's block rows name blocks inside its cache.
            unsafe {
                k.chunked_prefill_row(
                    dev,
                    d,
                    (w_uk.ptr(), w_uv.ptr()),
                    row,
                    (ctx, &chunks),
                    sc,
                    state(&o1, &l1),
                    false,
                )
            }?;
        }
        Ok(())
    })?;
    Ok(Measurement {
        kernel: "prefill_path",
        mode: "invariant",
        shape: Some(s),
        time_us: t,
        bytes: s.bytes(),
        flops: s.flops(),
        sm_mhz: None,
    })
}
