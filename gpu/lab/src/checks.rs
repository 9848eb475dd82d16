//! Kernel checks against the f64 references on fresh random inputs over a grid of
//! shapes: outputs start as [`UNWRITTEN`] before every launch (intermediate buffers as
//! NaN), inputs are never zeros.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::reference::{decode_f64, prefill_f64};
use specmla_core::block_pool::NO_BLOCK;
use specmla_core::config::ModelDims;
use specmla_core::split::{SplitPolicy, SplitSchedule};
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::launch::Buf;
use specmla_gpu::ops::{
    ContextChunk, DecodeBufs, DecodeOut, DecodeShape, FlashBuild, FlashKernels, Kernels, MlaDims,
    PagedContext, RowScratch, RowTokens, SplitMerge, State, WideKernel,
};

/// The result of one checked case.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub kernel: &'static str,
    pub case: String,
    pub max_rel_err: f64,
    pub passed: bool,
}

/// Relative tolerance of f32 kernels against f64 references.
pub const F32_TOL: f64 = 2e-4;

pub(crate) fn upload<T: cudarc::driver::DeviceRepr>(
    dev: &GpuDevice,
    v: &[T],
) -> Result<Buf<T>, GpuError> {
    Buf::from_host(dev, v, "check input")
}

pub(crate) fn download<T: cudarc::driver::DeviceRepr>(
    dev: &GpuDevice,
    d: &Buf<T>,
) -> Result<Vec<T>, GpuError> {
    d.read(dev, d.len())
}

/// 0..n in a random order (Fisher-Yates from the end), as slot or block ids.
pub fn shuffled_ids<T: From<i32>>(rng: &mut ChaCha8Rng, n: usize) -> Vec<T> {
    let mut ids: Vec<i32> = (0..n as i32).collect();
    for i in (1..n).rev() {
        ids.swap(i, rng.gen_range(0..=i));
    }
    ids.into_iter().map(T::from).collect()
}

/// kv_write and kv_write_bf16: random rows to shuffled slots, some PAD; untouched slots
/// keep a sentinel; the bf16 cache holds `half`'s rounding of each value, bit for bit.
pub fn check_kv_write(
    dev: &GpuDevice,
    k: &Kernels,
    dim: usize,
    tokens: usize,
    seed: u64,
) -> Result<CaseResult, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let slots = tokens * 2 + 3;
    let latent: Vec<f32> = (0..tokens * dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let order: Vec<i64> = shuffled_ids(&mut rng, slots);
    let slot_mapping: Vec<i64> = (0..tokens)
        .map(|t| if t % 5 == 3 { -1 } else { order[t] })
        .collect();
    const SENTINEL: f32 = 1234.5;
    let cache = upload(dev, &vec![SENTINEL; slots * dim])?;
    let (latent_d, slots_d) = (upload(dev, &latent)?, upload(dev, &slot_mapping)?);
    const SENTINEL_BF16: u16 = 0x1234;
    let cache_bf16 = upload(dev, &vec![SENTINEL_BF16; slots * dim])?;
    let dims = (tokens, dim);
    // SAFETY: every slot is PAD or inside the caches this check allocated.
    unsafe { k.kv_write(dev, latent_d.ptr(), slots_d.ptr(), cache.ptr(), dims) }?;
    // SAFETY: as above.
    unsafe { k.kv_write_bf16(dev, latent_d.ptr(), slots_d.ptr(), cache_bf16.ptr(), dims) }?;
    let (got, got_bf16) = (download(dev, &cache)?, download(dev, &cache_bf16)?);
    let mut want = vec![SENTINEL; slots * dim];
    let mut want_bf16 = vec![SENTINEL_BF16; slots * dim];
    for (t, &s) in slot_mapping.iter().enumerate() {
        if s >= 0 {
            let row = &latent[t * dim..][..dim];
            want[s as usize * dim..][..dim].copy_from_slice(row);
            for (w, &v) in want_bf16[s as usize * dim..][..dim].iter_mut().zip(row) {
                *w = half::bf16::from_f32(v).to_bits();
            }
        }
    }
    let passed = got
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits())
        && got_bf16 == want_bf16;
    Ok(CaseResult {
        kernel: "kv_write(_bf16)",
        case: format!("dim {dim} tokens {tokens}"),
        max_rel_err: if passed { 0.0 } else { 1.0 },
        passed,
    })
}

/// gather_context: a chunk of a request's context, read through a shuffled block table,
/// must equal the cache rows bit for bit.
pub fn check_gather(
    dev: &GpuDevice,
    k: &Kernels,
    dim: usize,
    page: usize,
    start: usize,
    len: usize,
    seed: u64,
) -> Result<CaseResult, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let width = (start + len).div_ceil(page).max(1);
    let num_blocks = width * 2;
    let blocks: Vec<i32> = shuffled_ids(&mut rng, num_blocks);
    let row = blocks[..width].to_vec();
    let cache: Vec<f32> = (0..num_blocks * page * dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let ws = upload(dev, &vec![f32::NAN; len.max(1) * dim])?;
    let (cache_d, row_d) = (upload(dev, &cache)?, upload(dev, &row)?);
    // SAFETY: the check's block row names blocks inside its cache, or -1.
    unsafe {
        k.gather_context(
            dev,
            cache_d.ptr(),
            row_d.ptr(),
            ws.ptr(),
            start,
            len,
            page,
            dim,
        )
    }?;
    let got = download(dev, &ws)?;
    let passed = (0..len).all(|i| {
        let pos = start + i;
        let slot = row[pos / page] as usize * page + pos % page;
        got[i * dim..][..dim]
            .iter()
            .zip(&cache[slot * dim..][..dim])
            .all(|(a, b)| a.to_bits() == b.to_bits())
    });
    Ok(CaseResult {
        kernel: "gather_ctx",
        case: format!("dim {dim} page {page} positions {start}..{}", start + len),
        max_rel_err: if passed { 0.0 } else { 1.0 },
        passed,
    })
}

/// Block-table entries a decode check takes away, to see the kernels treat a missing
/// block as the reference does (the row that reads it is NaN, the others exact).
#[derive(Clone, Copy, Debug, Default)]
pub struct Holes<'a> {
    /// `(request, page)` entries set to -1.
    pub missing: &'a [(usize, usize)],
    /// Pages cut from the table's width: the longest request runs past it.
    pub cut_pages: usize,
}

impl Holes<'_> {
    pub(crate) fn apply(&self, table: &mut [i32], width: usize) {
        for &(r, p) in self.missing {
            table[r * width + p] = -1;
        }
    }

    pub(crate) fn label(&self) -> String {
        if self.missing.is_empty() && self.cut_pages == 0 {
            return String::new();
        }
        format!(
            "; missing (request, page) {:?}, table {} page(s) short",
            self.missing, self.cut_pages
        )
    }
}

/// The schedule core's `policy` gives requests of `seq_lens` over a block table in the
/// kernels' form (-1 for a missing block).
pub fn schedule_of(
    policy: SplitPolicy,
    seq_lens: &[i32],
    table: &[i32],
    width: usize,
    page: usize,
) -> SplitSchedule {
    let table: Vec<u32> = table
        .iter()
        .map(|&e| u32::try_from(e).unwrap_or(NO_BLOCK))
        .collect();
    let lens: Vec<u32> = seq_lens.iter().map(|&l| l as u32).collect();
    policy.schedule(&lens, &table, width, page)
}

/// One decode case: `rows` rows with the given context lengths (seq_len = ctx + q_len),
/// in the splits core's `policy` schedules.
pub fn check_decode(
    dev: &GpuDevice,
    k: &Kernels,
    (s, policy): (DecodeShape, SplitPolicy),
    ctx: &[usize],
    holes: Holes,
    seed: u64,
) -> Result<CaseResult, GpuError> {
    let s = DecodeShape {
        width: s.width - holes.cut_pages,
        ..s
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let seq_lens: Vec<i32> = ctx.iter().map(|&c| (c + s.q_len) as i32).collect();
    let num_blocks = s.num_rows * s.width + 1;
    let blocks: Vec<i32> = shuffled_ids(&mut rng, num_blocks);
    let mut block_table = blocks[..s.num_rows * s.width].to_vec();
    holes.apply(&mut block_table, s.width);
    let cache: Vec<f32> = (0..num_blocks * s.page * s.dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let tokens = s.num_rows * s.q_len;
    let q: Vec<f32> = (0..tokens * s.heads * s.dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let sched = schedule_of(policy, &seq_lens, &block_table, s.width, s.page);
    let split_lens: Vec<i32> = sched.split_len_tokens.iter().map(|&l| l as i32).collect();
    let num_splits: Vec<i32> = sched.num_splits.iter().map(|&n| n as i32).collect();
    let scale = 1.0 / (s.dim as f32).sqrt();
    let out = upload(dev, &vec![UNWRITTEN; tokens * s.heads * s.dv])?;
    let lse = upload(dev, &vec![UNWRITTEN; s.heads * tokens])?;
    let inputs = [upload(dev, &q)?, upload(dev, &cache)?];
    let ints = [
        upload(dev, &block_table)?,
        upload(dev, &seq_lens)?,
        upload(dev, &split_lens)?,
        upload(dev, &num_splits)?,
    ];
    let bufs = DecodeBufs {
        q: inputs[0].ptr(),
        cache: inputs[1].ptr(),
        block_table: ints[0].ptr(),
        seq_lens: ints[1].ptr(),
        split_lens: ints[2].ptr(),
        num_splits: ints[3].ptr(),
        out: out.ptr(),
        lse: lse.ptr(),
    };
    // SAFETY: the check's block table names blocks inside its cache, or -1 (a hole); the
    // kernel treats -1 and pages past the width as missing.
    unsafe { k.decode(dev, s, bufs, scale) }?;
    let (got_out, got_lse) = (download(dev, &out)?, download(dev, &lse)?);
    let shape = (s.q_len, s.heads, s.dim, s.dv, s.page, s.width);
    let (want_out, want_lse) = decode_f64(&q, &cache, &block_table, &seq_lens, shape, scale as f64);
    let err = max_rel_err(&got_out, &want_out).max(max_rel_err(&got_lse, &want_lse));
    Ok(CaseResult {
        kernel: "mla_decode",
        case: format!(
            "rows {} q {} heads {} dim {}/{} page {} split {} x {} ctx {:?}{}",
            s.num_rows,
            s.q_len,
            s.heads,
            s.dim,
            s.dv,
            s.page,
            policy.split_size_tokens,
            policy.max_splits,
            ctx,
            holes.label()
        ),
        max_rel_err: err,
        passed: err <= F32_TOL,
    })
}

/// Missing blocks on the f32 decode: a batch of four where request 0 runs one page past
/// the table's width (only its last token sees that page), request 1 misses a page in the
/// middle (every row sees it), request 2 misses the page of its last position only (the
/// tokens before the last do not see it), and request 3 is whole. The long request comes
/// first, so a read past its table row would find request 1's first block: a valid one,
/// and a wrong answer instead of a NaN. Rows that see a missing page must be NaN (output
/// and LSE, as on the CPU), every other row exact. The bf16 flash kernels take the same
/// batch, holes and all, on every kernel and merge.
fn missing_block_checks(
    dev: &GpuDevice,
    k: &Kernels,
    fk: &FlashKernels,
    results: &mut Vec<CaseResult>,
) -> Result<(), GpuError> {
    let page = 64;
    for q_len in [1, 2] {
        let (ctx, holes) = missing_block_inputs(q_len);
        let s = DecodeShape {
            num_rows: ctx.len(),
            q_len,
            heads: 16,
            dim: 576,
            dv: 512,
            page,
            width: 1025usize.div_ceil(page),
        };
        let policy = SplitPolicy {
            split_size_tokens: 256,
            max_splits: 4,
        };
        results.push(check_decode(
            dev,
            k,
            (s, policy),
            &ctx,
            holes,
            700 + q_len as u64,
        )?);
        // q 1 x 16 heads takes the narrow mma.sync kernel, 2 x 16 the wide one.
        for wide in wide_kernels(fk) {
            let shape = (q_len, 16, page, 256);
            let seed = 710 + q_len as u64;
            results.push(check_flash_decode(dev, fk, wide, shape, &ctx, holes, seed)?);
            // One split of 2 (q 1) and 4 (q 2) 64-row blocks: both seesaw kernels.
            let shape = (q_len, 128, page, 2048);
            let seed = 720 + q_len as u64;
            results.push(check_flash_decode(dev, fk, wide, shape, &ctx, holes, seed)?);
        }
    }
    Ok(())
}

/// The chunked-context prefill on the GPU (new tokens causal, context in chunks of
/// `chunk` tokens gathered from a paged cache, merged by LSE; the backend's
/// `chunked_prefill_row`) against one f64 softmax over context + new tokens.
pub fn check_chunked_prefill(
    dev: &GpuDevice,
    k: &Kernels,
    d: MlaDims,
    ctx: usize,
    m: usize,
    chunk: usize,
    seed: u64,
) -> Result<CaseResult, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = ctx + m;
    let mut rand =
        |len: usize, a: f32| -> Vec<f32> { (0..len).map(|_| rng.gen_range(-a..a)).collect() };
    let latent = rand(n * d.latent(), 1.0);
    let w_uk = rand(
        d.heads * d.kv_lora * d.nope,
        (3.0 / d.kv_lora as f32).sqrt(),
    );
    let w_uv = rand(d.heads * d.kv_lora * d.v, (3.0 / d.kv_lora as f32).sqrt());
    let q = rand(m * d.heads * (d.nope + d.rope), 1.0);
    let scale = 1.0 / ((d.nope + d.rope) as f32).sqrt();
    // The context is a paged cache of pages of 16 read through a shuffled block table,
    // the new tokens' latents follow it; the sequence is the backend's own
    // (`chunked_prefill_row`).
    let page = 16;
    let width = ctx.div_ceil(page).max(1);
    let blocks = shuffled_ids(&mut rng, width);
    let mut cache = vec![f32::NAN; width * page * d.latent()];
    for t in 0..ctx {
        let slot = blocks[t / page] as usize * page + t % page;
        cache[slot * d.latent()..(slot + 1) * d.latent()]
            .copy_from_slice(&latent[t * d.latent()..(t + 1) * d.latent()]);
    }
    let (cache_d, table_d) = (upload(dev, &cache)?, upload(dev, &blocks)?);
    let new_lat = upload(dev, &latent[ctx * d.latent()..])?;
    let (w_uk_d, w_uv_d) = (upload(dev, &w_uk)?, upload(dev, &w_uv)?);
    let q_d = upload(dev, &q)?;
    let poisoned = |len| upload(dev, &vec![f32::NAN; len]);
    let keys_len = ctx.max(m);
    let (sk, sn, sv) = (
        poisoned(keys_len * d.latent())?,
        poisoned(keys_len * d.heads * d.nope)?,
        poisoned(keys_len * d.heads * d.v)?,
    );
    let states = [
        poisoned(m * d.heads * d.v)?,
        poisoned(d.heads * m)?,
        poisoned(m * d.heads * d.v)?,
        poisoned(d.heads * m)?,
    ];
    let sc = RowScratch {
        keys: sk.ptr(),
        k_nope: sn.ptr(),
        v: sv.ptr(),
        new: State {
            out: states[0].ptr(),
            lse: states[1].ptr(),
        },
        part: State {
            out: states[2].ptr(),
            lse: states[3].ptr(),
        },
    };
    let unwritten = |len| upload(dev, &vec![UNWRITTEN; len]);
    let (out, lse) = (unwritten(m * d.heads * d.v)?, unwritten(d.heads * m)?);
    let acc = State {
        out: out.ptr(),
        lse: lse.ptr(),
    };
    let chunks: Vec<ContextChunk> = (0..ctx)
        .step_by(chunk)
        .map(|start| ContextChunk {
            start,
            len: chunk.min(ctx - start),
        })
        .collect();
    let row = RowTokens {
        q: q_d.ptr(),
        latent: new_lat.ptr(),
        m,
    };
    let paged = PagedContext {
        cache: cache_d.ptr(),
        row_table: table_d.ptr(),
        page,
    };
    // SAFETY: the table names the check's own blocks, all inside its cache.
    unsafe {
        k.chunked_prefill_row(
            dev,
            d,
            (w_uk_d.ptr(), w_uv_d.ptr()),
            row,
            (paged, &chunks),
            sc,
            acc,
            false,
        )
    }?;
    let (got_out, got_lse) = (download(dev, &out)?, download(dev, &lse)?);
    let (want_out, want_lse) = prefill_f64(
        &q,
        &latent,
        &w_uk,
        &w_uv,
        m,
        n,
        (d.heads, d.kv_lora, d.rope, d.nope, d.v),
        scale as f64,
    );
    let err = max_rel_err(&got_out, &want_out).max(max_rel_err(&got_lse, &want_lse));
    Ok(CaseResult {
        kernel: "prefill+merge",
        case: format!(
            "heads {} latent {}+{} nope {} v {} ctx {ctx} new {m} chunk {chunk}",
            d.heads, d.kv_lora, d.rope, d.nope, d.v
        ),
        max_rel_err: err,
        passed: err <= F32_TOL,
    })
}

/// Tolerance of the bf16 tensor-core decode against f64 on the same (bf16) inputs: the
/// probabilities are rounded to bf16 before P V, about 2^-9 relative each.
pub const BF16_TOL: f64 = 1e-2;

/// Random values rounded to bf16: the device gets the bits, the reference their exact f32.
pub fn bf16_vec(rng: &mut ChaCha8Rng, len: usize, a: f32) -> (Vec<u16>, Vec<f32>) {
    (0..len)
        .map(|_| {
            let b = half::bf16::from_f32(rng.gen_range(-a..a));
            (b.to_bits(), b.to_f32())
        })
        .unzip()
}

/// The tensor-core decode (bf16 cache, DeepSeek-V3 widths) against f64 on the same
/// bf16 inputs: one request per entry of `ctx` (seq_len = ctx + q_len), with `holes`
/// taken from its block table (the rows that see one must come out NaN).
pub fn check_flash_decode(
    dev: &GpuDevice,
    k: &FlashKernels,
    (wide, merge): (WideKernel, SplitMerge),
    (q_len, heads, page, split): (usize, usize, usize, usize),
    ctx: &[usize],
    holes: Holes,
    seed: u64,
) -> Result<CaseResult, GpuError> {
    let shape = (q_len, heads, page, split);
    let run = run_flash_case(dev, k, (wide, merge), shape, ctx, holes, seed, None)?;
    Ok(CaseResult {
        kernel: run.kernel,
        case: format!(
            "bf16, q {q_len} heads {heads} page {page} split {split} ctx {ctx:?}{}{}{}",
            merge_label(wide, merge),
            holes.label(),
            if run.rearmed {
                ""
            } else {
                "; split counters left non-zero"
            }
        ),
        max_rel_err: run.err,
        passed: run.err <= BF16_TOL && run.rearmed,
    })
}

/// The bf16 rows of the engine's build ([`DecodeOut::Bf16`]) against the f32 build's on
/// the same case: every bf16 value must be the f32 one rounded to nearest even (NaN where
/// it is NaN) and every LSE the same bits, whatever store path the launch takes (a
/// persistent CTA's item end, the bulk copies of a one-split block, the cluster or global
/// merge, `flash_combine`). The f32 run must match the f64 reference, so a row neither
/// build wrote cannot pass.
pub fn check_flash_bf16_rows(
    dev: &GpuDevice,
    (f32k, bf16k): (&FlashKernels, &FlashKernels),
    path: (WideKernel, SplitMerge),
    (q_len, heads, page, split): (usize, usize, usize, usize),
    ctx: &[usize],
    holes: Holes,
    seed: u64,
) -> Result<CaseResult, GpuError> {
    assert_eq!((f32k.out, bf16k.out), (DecodeOut::F32, DecodeOut::Bf16));
    let shape = (q_len, heads, page, split);
    let f32_run = run_flash_case(dev, f32k, path, shape, ctx, holes, seed, None)?;
    let bf16_run = run_flash_case(dev, bf16k, path, shape, ctx, holes, seed, None)?;
    let (rows_differ, lse_differ) =
        bf16_rows_differ((&f32_run.out, &f32_run.lse), (&bf16_run.out, &bf16_run.lse));
    let nan_rows = f32_run.out.iter().filter(|v| v.is_nan()).count() / specmla_gpu::ops::FLASH_DV;
    let (wide_kernel, merge) = path;
    Ok(CaseResult {
        kernel: bf16_run.kernel,
        case: format!(
            "bf16 rows vs f32 rows rounded, q {q_len} heads {heads} split {split} ctx {ctx:?}{}{}: {rows_differ} of {} values and {lse_differ} of {} LSEs differ ({nan_rows} NaN rows); f32 rows {:.1e} from f64{}",
            merge_label(wide_kernel, merge),
            holes.label(),
            f32_run.out.len(),
            f32_run.lse.len(),
            f32_run.err,
            if f32_run.rearmed && bf16_run.rearmed { "" } else { "; split counters left non-zero" }
        ),
        max_rel_err: (rows_differ + lse_differ) as f64,
        passed: rows_differ == 0
            && lse_differ == 0
            && f32_run.out.len() == bf16_run.out.len()
            && !f32_run.out.is_empty()
            && f32_run.err <= BF16_TOL
            && f32_run.rearmed
            && bf16_run.rearmed,
    })
}

/// How many of a bf16 build's rows (widened to f32 by `read_f32`) differ from an f32
/// build's rounded to nearest even (any NaN matching any NaN), and how many LSEs differ in
/// any bit: `(rows, lses)`.
pub(crate) fn bf16_rows_differ(
    (f32_out, f32_lse): (&[f32], &[f32]),
    (bf16_out, bf16_lse): (&[f32], &[f32]),
) -> (usize, usize) {
    let rounded = |x: f32| match x.is_nan() {
        true => u16::MAX,
        false => half::bf16::from_f32(x).to_bits(),
    };
    // A bf16 build's value as read_f32 widened it (its low half zero).
    let as_bf16 = |x: f32| match x.is_nan() {
        true => u16::MAX,
        false => (x.to_bits() >> 16) as u16,
    };
    let rows = (f32_out.iter().zip(bf16_out))
        .filter(|&(&w, &n)| rounded(w) != as_bf16(n))
        .count();
    let lses = (f32_lse.iter().zip(bf16_lse))
        .filter(|(w, n)| w.to_bits() != n.to_bits())
        .count();
    (rows, lses)
}

/// F12 on the tensor-core decode: the kernel given the schedule a graph's capture wrote
/// (every request one split of `split` keys, as for `seq_len` 1) instead of this step's.
/// The kernel reads the schedule as given, so the requests longer than one split lose
/// their later keys: the case passes when the output is wrong (beyond the bf16
/// tolerance) but finite, and the split counters are re-armed.
pub fn check_flash_stale_schedule(
    dev: &GpuDevice,
    k: &FlashKernels,
    (wide, merge): (WideKernel, SplitMerge),
    seed: u64,
) -> Result<CaseResult, GpuError> {
    let (q_len, heads, page, split) = (2, 64, 64, 256);
    let ctx = [700, 90, 1500];
    let captured = |seq: &[i32]| vec![1; seq.len()];
    let shape = (q_len, heads, page, split);
    let holes = Holes::default();
    let run = run_flash_case(
        dev,
        k,
        (wide, merge),
        shape,
        &ctx,
        holes,
        seed,
        Some(&captured),
    )?;
    Ok(CaseResult {
        kernel: run.kernel,
        case: format!(
            "F12 mutant (the capture's schedule replayed), q {q_len} heads {heads} ctx {ctx:?}{}: \
             error {:.3} (must exceed {BF16_TOL:e}){}",
            merge_label(wide, merge),
            run.err,
            if run.finite {
                ""
            } else {
                "; non-finite output"
            }
        ),
        max_rel_err: run.err,
        passed: run.err > BF16_TOL && run.err.is_finite() && run.finite && run.rearmed,
    })
}

/// The softmax scale of the tensor-core decode checks: 1 / sqrt(192), a head of 192.
pub(crate) fn flash_check_scale() -> f32 {
    1.0 / 192f32.sqrt()
}

/// A tensor-core decode check's device side: the workspace for a shape (outputs filled
/// with [`UNWRITTEN`], so a row the kernel skips shows), the check's Q, block table and seq_lens,
/// and the schedule the shape's policy gives for the seq_lens it is planned for.
pub(crate) struct FlashLaunch {
    ws: specmla_gpu::ops::FlashWorkspace,
    q: Buf<u16>,
    table: Buf<i32>,
    seq_lens: Buf<i32>,
    sched: specmla_gpu::ops::FlashSchedule,
}

impl FlashLaunch {
    /// `s`'s workspace (rows of `k`'s output type) and policy (`split_size_tokens`,
    /// `max_splits`); `planned` is what the schedule is built from (the real `seq_lens`,
    /// or a stale copy's).
    pub(crate) fn new(
        (dev, k): (&GpuDevice, &FlashKernels),
        s: specmla_gpu::ops::FlashShape,
        (q_bits, table, seq_lens): (&[u16], &[i32], &[i32]),
        planned: &[i32],
    ) -> Result<Self, GpuError> {
        use specmla_gpu::ops::{FlashSchedule, FlashWorkspace};
        let policy = SplitPolicy {
            split_size_tokens: s.split_size_tokens,
            max_splits: s.max_splits,
        };
        let sched = schedule_of(policy, planned, table, s.width, s.page);
        Ok(Self {
            ws: FlashWorkspace::new(dev, s, k.out, Some(UNWRITTEN))?,
            q: upload(dev, q_bits)?,
            table: upload(dev, table)?,
            seq_lens: upload(dev, seq_lens)?,
            sched: FlashSchedule::upload(dev, &sched, s.split_size_tokens)?,
        })
    }

    /// One launch of `path` over `cache` with shape `s` (at most the workspace's splits)
    /// and the checks' softmax scale; the output and the LSE as they come back.
    ///
    /// # Safety
    /// The block table names blocks inside `cache` (or -1) for every key of each seq_len
    /// below the first -1 of its row.
    pub(crate) unsafe fn run(
        &self,
        dev: &GpuDevice,
        k: &FlashKernels,
        path: (WideKernel, SplitMerge),
        s: specmla_gpu::ops::FlashShape,
        cache: &Buf<u16>,
    ) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
        let bufs = self.ws.bufs(
            self.q.ptr(),
            cache.ptr(),
            self.table.ptr(),
            self.seq_lens.ptr(),
            &self.sched,
        );
        // SAFETY: the caller's promise, forwarded.
        unsafe { k.flash_decode_merged(path, dev, s, bufs, flash_check_scale()) }?;
        Ok((self.ws.out.read_f32(dev)?, download(dev, &self.ws.lse)?))
    }
}

/// The seesaw family's two kernels on the same one-split launch: `flash_decode_seesaw`
/// (copy warpgroup) where the grid has one split a request, `flash_decode_seesaw_2wg` where
/// it has room for two and the schedule gives every request one. They run the same math,
/// so their outputs must match bit for bit: which one a launch takes (its grid, the
/// engine's split cap) must not change a trace's bits. The copy warpgroup's kernel runs
/// three grids: the engine's (a CTA a multiprocessor), three CTAs (each taking a third of
/// the row blocks of requests of 1 to 24 tiles in turn, every item's Q and first tiles
/// loading under the one before) and a CTA a row block. Pages of 64; `q_len * heads` rows
/// a request, five requests of 1 to 24 tiles; at two or three row blocks a request
/// `sms / row_blocks + 1` requests of the same five lengths in turn, so CTAs of the
/// engine's grid take several row blocks too (at one row block only a balanced launch takes
/// the copy warpgroup's kernel, which `checks_balanced` covers: not a case for this
/// check). Where the rows are
/// not a multiple of 64, a later item's Q rows past its request's are the next request's
/// (the kernel loads a 64-row box): they must not reach the live rows.
pub fn check_seesaw_kernels_agree(
    dev: &GpuDevice,
    k: &FlashKernels,
    (q_len, heads): (usize, usize),
    seed: u64,
) -> Result<CaseResult, GpuError> {
    use specmla_gpu::ops::{FlashShape, Persist, FLASH_DIM};
    let (page, split) = (64usize, 2048usize);
    let rows = q_len * heads;
    // Under four row blocks a request, the five lengths again and again, past one row
    // block a multiprocessor: the engine's grid then has CTAs take several too.
    let row_blocks = rows.div_ceil(64);
    let requests = if row_blocks >= 4 {
        5
    } else {
        dev.sms / row_blocks + 1
    };
    let lens = [5usize, 129, 1500, 700, 124];
    let ctx: Vec<usize> = lens.iter().copied().cycle().take(requests).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let seq_lens: Vec<i32> = ctx.iter().map(|&c| (c + q_len) as i32).collect();
    let width = split.div_ceil(page);
    let blocks = shuffled_ids(&mut rng, ctx.len() * width);
    let (cache_bits, _) = bf16_vec(&mut rng, blocks.len() * page * FLASH_DIM, 1.0);
    let (q_bits, _) = bf16_vec(&mut rng, ctx.len() * rows * FLASH_DIM, 1.0);
    let shape = |max_splits| FlashShape {
        batch: ctx.len(),
        q_len,
        heads,
        page,
        width,
        split_size_tokens: split,
        max_splits,
    };
    // One workspace and schedule for all: every request fits one split of `split` keys.
    let inputs = (&q_bits[..], &blocks[..], &seq_lens[..]);
    let launch = FlashLaunch::new((dev, k), shape(2), inputs, &seq_lens)?;
    let cache = upload(dev, &cache_bits)?;
    let mut outputs = Vec::new();
    let mut names = Vec::new();
    let mut functions = Vec::new();
    for (max_splits, persist) in [
        (1, Persist::PerMultiprocessor),
        (1, Persist::Ctas(3)),
        (1, Persist::Off),
        (2, Persist::PerMultiprocessor),
    ] {
        let s = shape(max_splits);
        let mut k = k.clone();
        k.persist = persist;
        let name = k.decode_launch(&s, WideKernel::Seesaw).0;
        functions.push(name);
        names.push(format!("{name} ({persist:?})"));
        // SAFETY: the check's block table covers every seq_len with blocks inside its cache.
        let (out, lse) = unsafe { launch.run(dev, &k, (WideKernel::Seesaw, k.merge), s, &cache) }?;
        outputs.push(
            out.iter()
                .chain(&lse)
                .map(|x| x.to_bits())
                .collect::<Vec<u32>>(),
        );
    }
    let differ: Vec<usize> = outputs[1..]
        .iter()
        .map(|o| o.iter().zip(&outputs[0]).filter(|(a, b)| a != b).count())
        .collect();
    let finite = outputs[0].iter().all(|&b| f32::from_bits(b).is_finite());
    // The copy warpgroup's kernel three times, then the other one.
    let kernels_differ =
        functions[..3].iter().all(|&f| f == functions[0]) && functions[3] != functions[0];
    Ok(CaseResult {
        kernel: "flash_seesaw_pair",
        case: format!(
            "{} against {}, {} and {} on one launch (q {q_len} heads {heads}, {requests} requests of ctx {lens:?} in turn, one split each): {differ:?} of {} values differ",
            names[0],
            names[1],
            names[2],
            names[3],
            outputs[0].len()
        ),
        max_rel_err: differ.iter().sum::<usize>() as f64,
        passed: differ.iter().all(|&d| d == 0) && finite && kernels_differ,
    })
}

/// The seq_lens a case's schedule is built from, given the requests' real ones.
type ScheduleLens = dyn Fn(&[i32]) -> Vec<i32>;

/// What one tensor-core decode case measured.
struct FlashRun {
    kernel: &'static str,
    err: f64,
    rearmed: bool,
    finite: bool,
    /// The merged rows (widened to f32 from a bf16 build) and the LSE, as they came back.
    out: Vec<f32>,
    lse: Vec<f32>,
}

/// A tensor-core decode case's inputs, from `seed`: requests of `ctx` keys before their
/// `q_len` new tokens, a shuffled block table of pages of `page` with `holes` taken from it,
/// and random bf16 cache and queries (the device's bits, and the reference's exact f32).
pub(crate) struct FlashCaseInputs {
    pub seq_lens: Vec<i32>,
    pub max_len: usize,
    /// The table's width: `cut_pages` short of the longest request.
    pub width: usize,
    pub table: Vec<i32>,
    pub cache_bits: Vec<u16>,
    pub cache: Vec<f32>,
    pub q_bits: Vec<u16>,
    pub q: Vec<f32>,
}

impl FlashCaseInputs {
    /// Request `r` alone: its queries (`rows` of them) and block-table row over the same
    /// cache, the table as wide.
    pub(crate) fn alone(&self, r: usize, rows: usize) -> Self {
        use specmla_gpu::ops::FLASH_DIM;
        let q = r * rows * FLASH_DIM..(r + 1) * rows * FLASH_DIM;
        Self {
            seq_lens: vec![self.seq_lens[r]],
            max_len: self.seq_lens[r] as usize,
            width: self.width,
            table: self.table[r * self.width..(r + 1) * self.width].to_vec(),
            cache_bits: self.cache_bits.clone(),
            cache: self.cache.clone(),
            q_bits: self.q_bits[q.clone()].to_vec(),
            q: self.q[q].to_vec(),
        }
    }

    pub(crate) fn new(
        (q_len, heads, page): (usize, usize, usize),
        ctx: &[usize],
        holes: Holes,
        seed: u64,
    ) -> Self {
        use specmla_gpu::ops::FLASH_DIM;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let batch = ctx.len();
        let seq_lens: Vec<i32> = ctx.iter().map(|&c| (c + q_len) as i32).collect();
        let max_len = *seq_lens.iter().max().unwrap_or(&1) as usize;
        // `cut_pages` short of the longest request: the rows that see past it must be NaN.
        let width = max_len.div_ceil(page).max(1 + holes.cut_pages) - holes.cut_pages;
        let num_blocks = batch * width + 1;
        let blocks: Vec<i32> = shuffled_ids(&mut rng, num_blocks);
        let mut table = blocks[..batch * width].to_vec();
        holes.apply(&mut table, width);
        let (cache_bits, cache) = bf16_vec(&mut rng, num_blocks * page * FLASH_DIM, 1.0);
        let (q_bits, q) = bf16_vec(&mut rng, batch * q_len * heads * FLASH_DIM, 1.0);
        Self {
            seq_lens,
            max_len,
            width,
            table,
            cache_bits,
            cache,
            q_bits,
            q,
        }
    }
}

/// Runs one tensor-core decode case against f64: the schedule core's policy gives for
/// the requests' seq_lens, or for `schedule_lens(seq_lens)` where given (a stale one).
#[allow(clippy::too_many_arguments)]
fn run_flash_case(
    dev: &GpuDevice,
    k: &FlashKernels,
    (wide, merge): (WideKernel, SplitMerge),
    (q_len, heads, page, split): (usize, usize, usize, usize),
    ctx: &[usize],
    holes: Holes,
    seed: u64,
    schedule_lens: Option<&ScheduleLens>,
) -> Result<FlashRun, GpuError> {
    use specmla_gpu::ops::{FlashShape, FLASH_DIM, FLASH_DV};
    let inp = FlashCaseInputs::new((q_len, heads, page), ctx, holes, seed);
    let batch = ctx.len();
    let s = FlashShape {
        batch,
        q_len,
        heads,
        page,
        width: inp.width,
        split_size_tokens: split,
        // At most four, as in the invariant mode: the longest requests here take longer
        // splits (a multiple of `split`).
        max_splits: inp.max_len.div_ceil(split).clamp(1, 4),
    };
    let planned = schedule_lens.map_or_else(|| inp.seq_lens.clone(), |f| f(&inp.seq_lens));
    let launch = FlashLaunch::new(
        (dev, k),
        s,
        (&inp.q_bits, &inp.table, &inp.seq_lens),
        &planned,
    )?;
    let cache_d = upload(dev, &inp.cache_bits)?;
    // SAFETY: the check's block table names blocks inside its cache or -1, and its mapped
    // keys stop at the first -1 of each row.
    let (got_out, got_lse) = unsafe { launch.run(dev, k, (wide, merge), s, &cache_d) }?;
    let scale = flash_check_scale();
    // The split counters must be re-armed for the next launch (a CUDA graph replays them).
    let rearmed = download(dev, &launch.ws.done)?.iter().all(|&c| c == 0);
    let shape = (q_len, heads, FLASH_DIM, FLASH_DV, page, inp.width);
    let (want_out, want_lse) = decode_f64(
        &inp.q,
        &inp.cache,
        &inp.table,
        &inp.seq_lens,
        shape,
        scale as f64,
    );
    // The kernel's LSE is the reference's [heads, tokens]: compared as it comes.
    let err = max_rel_err(&got_out, &want_out).max(max_rel_err(&got_lse, &want_lse));
    let finite = got_out.iter().chain(&got_lse).all(|v| v.is_finite());
    Ok(FlashRun {
        kernel: k.decode_launch(&s, wide).0,
        err,
        rearmed,
        finite,
        out: got_out,
        lse: got_lse,
    })
}

/// How many of two runs' values differ in their bits (NaNs compared as bits too).
pub(crate) fn bits_differ(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// Batch invariance of the tensor-core decode: request 1 of a batch of three gives the
/// same bits alone (its own block-table row and seq_len, a batch of one) as in the batch,
/// with the same fixed split size. Both the wide and the narrow kernel. On a Hopper kernel
/// with the cluster merge, the global merge must also give the same bits for the batch.
pub fn check_flash_invariance(
    dev: &GpuDevice,
    k: &FlashKernels,
    (wide, merge): (WideKernel, SplitMerge),
    (q_len, heads, page, split): (usize, usize, usize, usize),
    seed: u64,
) -> Result<CaseResult, GpuError> {
    use specmla_gpu::ops::{FlashShape, FLASH_DIM, FLASH_DV};
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ctx = [700usize, 1500, 90];
    let rows = q_len * heads;
    let max_len = ctx.iter().max().unwrap() + q_len;
    let width = max_len.div_ceil(page);
    let num_blocks = ctx.len() * width;
    let blocks: Vec<i32> = shuffled_ids(&mut rng, num_blocks);
    let (cache_bits, _) = bf16_vec(&mut rng, num_blocks * page * FLASH_DIM, 1.0);
    let (q_bits, _) = bf16_vec(&mut rng, ctx.len() * rows * FLASH_DIM, 1.0);
    let cache = upload(dev, &cache_bits)?;
    let run_merged = |merge: SplitMerge,
                      batch: usize,
                      q: &[u16],
                      table: &[i32],
                      seq: &[i32],
                      split: usize|
     -> Result<Vec<f32>, GpuError> {
        let s = FlashShape {
            batch,
            q_len,
            heads,
            page,
            width,
            split_size_tokens: split,
            max_splits: max_len.div_ceil(split),
        };
        let launch = FlashLaunch::new((dev, k), s, (q, table, seq), seq)?;
        // SAFETY: the check's block table covers every seq_len with blocks inside its cache.
        let (mut v, lse) = unsafe { launch.run(dev, k, (wide, merge), s, &cache) }?;
        v.extend(lse);
        Ok(v)
    };
    let run = |batch, q: &[u16], table: &[i32], seq: &[i32], split| {
        run_merged(merge, batch, q, table, seq, split)
    };
    let seq: Vec<i32> = ctx.iter().map(|&c| (c + q_len) as i32).collect();
    let batch = run(3, &q_bits, &blocks, &seq, split)?;
    let one_q = &q_bits[rows * FLASH_DIM..2 * rows * FLASH_DIM];
    let alone = run(1, one_q, &blocks[width..2 * width], &seq[1..2], split)?;
    // The check can fail: other split boundaries (what a batch-dependent split plan
    // would pick) change the bits of the same request.
    let resplit = run(1, one_q, &blocks[width..2 * width], &seq[1..2], 2 * split)?;
    // Request 1's LSE in the batch's [heads, 3 * q_len], in the order of its own [heads, q_len].
    let o = rows * FLASH_DV;
    let lse_in_batch =
        (0..heads).flat_map(|h| (0..q_len).map(move |j| 3 * o + h * 3 * q_len + q_len + j));
    let in_batch: Vec<u32> = batch[o..2 * o]
        .iter()
        .chain(lse_in_batch.map(|i| &batch[i]))
        .map(|v| v.to_bits())
        .collect();
    let by_itself: Vec<u32> = alone.iter().map(|v| v.to_bits()).collect();
    let differ = in_batch
        .iter()
        .zip(&by_itself)
        .filter(|(a, b)| a != b)
        .count();
    let moved = bits_differ(&resplit, &alone);
    let finite = alone.iter().all(|v| !v.is_nan() && *v != UNWRITTEN);
    // The two merges do the same arithmetic in the same order: same bits for the batch.
    let across = if wide.hopper() && merge == SplitMerge::Cluster {
        let global = run_merged(SplitMerge::Global, 3, &q_bits, &blocks, &seq, split)?;
        Some(bits_differ(&global, &batch))
    } else {
        None
    };
    Ok(CaseResult {
        kernel: "flash_invariance",
        case: format!(
            "{}{}: request alone vs in a batch of 3, q {q_len} heads {heads}: {differ} of {} values differ ({moved} with splits of {}){}",
            k.decode_function(rows, page, wide),
            merge_label(wide, merge),
            by_itself.len(),
            2 * split,
            across.map_or(String::new(), |n| format!(
                "; global merge: {n} of {} batch values differ",
                batch.len()
            ))
        ),
        max_rel_err: differ as f64,
        passed: differ == 0
            && moved > 0
            && finite
            && in_batch.len() == by_itself.len()
            && across.unwrap_or(0) == 0,
    })
}

/// The bf16 rows against the f32 ones on every decode path and each way a launch stores
/// its rows: one split of 8 and of 4 row blocks (a persistent seesaw CTA's item end; the
/// last block 16 live rows; the other kernels' bulk copies and `flash_combine`), up to
/// four splits (cluster and global merges beside one-split requests), and missing blocks
/// (NaN rows) through both.
fn bf16_row_checks(
    dev: &GpuDevice,
    builds: (&FlashKernels, &FlashKernels),
    results: &mut Vec<CaseResult>,
) -> Result<(), GpuError> {
    let holes = Holes {
        missing: &[(1, 3), (2, 8)],
        cut_pages: 1,
    };
    let ragged = [1023usize, 700, 511, 898];
    let cases: [(_, &[usize], _); 5] = [
        ((4, 128, 64, 4096), &[0, 1, 700, 1500], Holes::default()),
        ((13, 16, 64, 4096), &[5, 129, 1500], Holes::default()),
        ((2, 128, 64, 256), &[0, 65, 1000, 1100], Holes::default()),
        ((2, 16, 64, 256), &ragged, holes),
        ((2, 128, 64, 2048), &ragged, holes),
    ];
    for (i, (shape, ctx, holes)) in cases.into_iter().enumerate() {
        for path in wide_kernels(builds.0) {
            let seed = 900 + i as u64;
            results.push(check_flash_bf16_rows(
                dev, builds, path, shape, ctx, holes, seed,
            )?);
        }
    }
    Ok(())
}

/// The missing-block cases' contexts for `q_len` query tokens (sequence lengths 16 * 64 + 1,
/// 702, 8 * 64 + 1 and 900) and their holes: two missing pages, and the longest request
/// running a page past the table.
fn missing_block_inputs(q_len: usize) -> ([usize; 4], Holes<'static>) {
    let holes = Holes {
        missing: &[(1, 3), (2, 8)],
        cut_pages: 1,
    };
    ([1025 - q_len, 702 - q_len, 513 - q_len, 900 - q_len], holes)
}

/// A planted fault: `build` with `FS_SKIP_POISONED_ROWS`, where the persistent seesaw
/// kernel never writes the rows whose window reaches a missing block. Its missing-block
/// case (q 2 at 128 heads: four row blocks, the persistent kernel) must fail, or a pass
/// of that case would not show the rows are written: with NaN as the outputs' poison, a
/// row the reference expects NaN passed unwritten.
fn check_planted_fault(dev: &GpuDevice, build: &FlashBuild) -> Result<CaseResult, GpuError> {
    let faulty = FlashKernels::load_build(
        dev,
        FlashBuild {
            defines: format!("{}#define FS_SKIP_POISONED_ROWS 1\n", build.defines),
            out: DecodeOut::F32,
            ..build.clone()
        },
    )?;
    let (ctx, holes) = missing_block_inputs(2);
    let path = (WideKernel::Seesaw, SplitMerge::Cluster);
    let case = check_flash_decode(dev, &faulty, path, (2, 128, 64, 2048), &ctx, holes, 722)?;
    let persistent = case.kernel == "flash_decode_seesaw";
    Ok(CaseResult {
        kernel: "planted_fault",
        case: format!(
            "FS_SKIP_POISONED_ROWS, the missing-block case must fail{}: {} ({})",
            if persistent {
                ""
            } else {
                " (NOT on the persistent kernel)"
            },
            if case.passed {
                "it PASSED"
            } else {
                "it failed"
            },
            case.case
        ),
        max_rel_err: case.max_rel_err,
        passed: !case.passed && persistent,
    })
}

/// The decode paths to check: where the device has wgmma, both Hopper kernels with each
/// split merge, and the mma.sync kernels (whose merge is `flash_combine`).
fn wide_kernels(k: &FlashKernels) -> Vec<(WideKernel, SplitMerge)> {
    let mut paths = Vec::new();
    if k.wide.hopper() {
        for wide in [WideKernel::Seesaw, WideKernel::Wgmma] {
            paths.push((wide, SplitMerge::Cluster));
            paths.push((wide, SplitMerge::Global));
        }
    }
    paths.push((WideKernel::Mma, SplitMerge::Global));
    paths
}

/// "; global merge" for a Hopper kernel merging through global partials.
fn merge_label(wide: WideKernel, merge: SplitMerge) -> &'static str {
    if wide.hopper() && merge == SplitMerge::Global {
        "; global merge"
    } else {
        ""
    }
}

/// What a check's outputs hold before its launch: 2^100, finite and exact in bf16, far
/// outside any attention output. A value the kernel never wrote then fails both ways:
/// beyond the error bound where the reference has a number, and not NaN where the
/// reference has NaN (a row that read a missing block). A NaN poison let such a row pass
/// unwritten.
pub(crate) const UNWRITTEN: f32 = f32::from_bits(0x7180_0000);

/// Largest |got - want| / max(1, |want|); an unwritten output ([`UNWRITTEN`]) counts as
/// infinite, and a NaN is right only where the reference has one (a row that read a
/// missing block).
pub(crate) fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            if g == UNWRITTEN {
                f64::INFINITY
            } else if w.is_nan() || g.is_nan() {
                if w.is_nan() && g.is_nan() {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else if g.is_infinite() != w.is_infinite() {
                f64::INFINITY
            } else if w.is_infinite() {
                0.0
            } else {
                (g as f64 - w).abs() / w.abs().max(1.0)
            }
        })
        .fold(0.0, f64::max)
}

/// An allocation far beyond any device must fail with an error naming it, not abort.
pub fn check_out_of_memory(dev: &GpuDevice) -> CaseResult {
    let bytes = 1usize << 50;
    let (passed, case) =
        match specmla_gpu::launch::Buf::<f32>::uninit(dev, bytes / 4, "a 1 PiB test buffer") {
            Ok(_) => (false, "a 1 PiB allocation succeeded".to_string()),
            Err(e) => {
                let msg = e.to_string();
                let ok = matches!(e, GpuError::OutOfMemory { .. })
                    && msg.contains("a 1 PiB test buffer");
                (ok && msg.lines().count() == 1, msg)
            }
        };
    CaseResult {
        kernel: "environment",
        case,
        max_rel_err: 0.0,
        passed,
    }
}

/// Every kernel check over the grid of shapes: attention kernels against f64, dense
/// kernels against the CPU model's f32 blocks.
pub fn run_all(dev: &GpuDevice) -> Result<Vec<CaseResult>, GpuError> {
    use specmla_gpu::ops::Persist;
    let k = Kernels::load(dev)?;
    // f32 rows against the f64 reference; the engine's bf16 rows against them
    // (check_flash_bf16_rows). Few CTAs for the persistent seesaw kernel: every case of
    // more than five row blocks then runs several a CTA, each item's prologue under the
    // previous one's end.
    let build = FlashBuild {
        persist: Persist::Ctas(5),
        ..FlashBuild::from_env()?
    };
    let fk = FlashKernels::load_build(
        dev,
        FlashBuild {
            out: DecodeOut::F32,
            ..build.clone()
        },
    )?;
    let mut results = vec![
        check_out_of_memory(dev),
        crate::clock::check_sm_clock(dev, &k),
    ];
    results.extend(crate::checks_dense::run_dense(dev, &k)?);
    results.extend(crate::checks_weights::run_weights(dev, &k)?);
    for (i, (dim, tokens)) in [(40, 1), (40, 37), (576, 130)].into_iter().enumerate() {
        results.push(check_kv_write(dev, &k, dim, tokens, i as u64)?);
    }
    for (i, (dim, page, start, len)) in [
        (40, 16, 0, 1),
        (40, 16, 5, 37),
        (576, 64, 128, 128),
        (576, 64, 63, 130),
    ]
    .into_iter()
    .enumerate()
    {
        results.push(check_gather(dev, &k, dim, page, start, len, 50 + i as u64)?);
    }
    let mut seed = 100;
    // (kv_lora + rope, kv_lora): the tiny model and DeepSeek-V3.
    for (dim, dv) in [(40, 32), (576, 512)] {
        for (heads, page) in [(4, 16), (16, 64), (128, 64)] {
            for q_len in [1, 2, 4, 16] {
                if heads == 128 && q_len == 16 {
                    continue;
                }
                // Empty context, short, page-aligned, one past a page, long and ragged.
                let ctx = [0, 1, 63, 64, 65, 1000];
                let width = (1000usize + q_len).div_ceil(page);
                let s = DecodeShape {
                    num_rows: ctx.len(),
                    q_len,
                    heads,
                    dim,
                    dv,
                    page,
                    width,
                };
                // Splits of four pages, up to eight: the 1000-key rows take longer ones.
                let policy = SplitPolicy {
                    split_size_tokens: page * 4,
                    max_splits: 8,
                };
                seed += 1;
                results.push(check_decode(
                    dev,
                    &k,
                    (s, policy),
                    &ctx,
                    Holes::default(),
                    seed,
                )?);
            }
        }
    }
    for (i, (q_len, heads, page, split, ctx)) in [
        (1, 128, 64, 256, vec![0, 1, 63, 64, 65, 1000]),
        (2, 128, 64, 512, vec![31, 32, 33, 700]),
        (4, 16, 64, 256, vec![0, 5, 129, 2047]),
        (1, 16, 16, 128, vec![3, 17, 300]),
        (3, 64, 64, 1024, vec![4000]),
        // 48 rows: the last 16 of the CTA's 64 are dead.
        (3, 16, 64, 256, vec![0, 77, 1000]),
        // Pages of 16 (four copy-engine boxes per tile) and of 128 (half a page per tile).
        (2, 64, 16, 256, vec![5, 300]),
        (1, 128, 128, 256, vec![100, 700]),
        // One split of four or more 64-row blocks: the seesaw kernel with the copy
        // warpgroup (its reloads of pages of 64, 128 and 16; tiles of 1, 2, 11, 32).
        (2, 128, 64, 4096, vec![0, 1, 63, 64, 700, 2000]),
        (4, 128, 128, 4096, vec![5, 129, 1500]),
        (4, 128, 16, 2048, vec![3, 300]),
        // At most 16 rows: mma.sync takes the narrow kernel (key quarters merged at the end).
        (1, 16, 64, 256, vec![0, 5, 129, 2047]),
        (2, 8, 64, 512, vec![1, 64, 65, 900]),
        (1, 4, 16, 128, vec![3, 200]),
    ]
    .into_iter()
    .enumerate()
    {
        for wide in wide_kernels(&fk) {
            results.push(check_flash_decode(
                dev,
                &fk,
                wide,
                (q_len, heads, page, split),
                &ctx,
                Holes::default(),
                500 + i as u64,
            )?);
        }
    }
    missing_block_checks(dev, &k, &fk, &mut results)?;
    if fk.wide == WideKernel::Seesaw {
        results.push(check_planted_fault(dev, &build)?);
    }
    for wide in wide_kernels(&fk) {
        results.push(check_flash_stale_schedule(dev, &fk, wide, 800)?);
    }
    if fk.wide.hopper() {
        // 8 row blocks; 4, the last with 16 live rows (DFlash's 1 + 12 at 16 heads); 2 (q 1).
        for (i, shape) in [(4, 128), (13, 16), (1, 128)].into_iter().enumerate() {
            results.push(check_seesaw_kernels_agree(dev, &fk, shape, 810 + i as u64)?);
        }
    }
    let bf16k = FlashKernels::load_build(
        dev,
        FlashBuild {
            out: DecodeOut::Bf16,
            ..build
        },
    )?;
    bf16_row_checks(dev, (&fk, &bf16k), &mut results)?;
    if fk.wide == WideKernel::Seesaw {
        results.extend(crate::checks_balanced::run_balanced_checks(
            dev,
            (&fk, &bf16k),
        )?);
    }
    results.extend(crate::checks_prefill::run_prefill_checks(dev, &k, &fk)?);
    for (i, shape) in [(1, 128, 64, 256), (4, 16, 64, 512), (1, 16, 64, 256)]
        .into_iter()
        .enumerate()
    {
        for wide in wide_kernels(&fk) {
            results.push(check_flash_invariance(
                dev,
                &fk,
                wide,
                shape,
                600 + i as u64,
            )?);
        }
    }
    let tiny = MlaDims::from(&ModelDims::tiny());
    let dsv3 = MlaDims {
        heads: 16,
        ..MlaDims::from(&ModelDims::deepseek_v3())
    };
    for d in [tiny, dsv3] {
        for (ctx, m) in [(0, 1), (0, 9), (1, 2), (37, 1), (37, 5), (300, 9)] {
            for chunk in [16, 128] {
                seed += 1;
                results.push(check_chunked_prefill(dev, &k, d, ctx, m, chunk, seed)?);
            }
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::{max_rel_err, UNWRITTEN};

    #[test]
    fn the_sentinel_survives_bf16() {
        let bits = half::bf16::from_f32(UNWRITTEN);
        assert_eq!(bits.to_f32(), UNWRITTEN);
        assert!(UNWRITTEN.is_finite());
    }

    /// A row the reference poisons (NaN) must be written NaN: left unwritten it fails,
    /// which a NaN poison could not tell.
    #[test]
    fn an_unwritten_value_fails_where_the_reference_has_nan_or_a_number() {
        assert_eq!(max_rel_err(&[UNWRITTEN], &[f64::NAN]), f64::INFINITY);
        assert_eq!(max_rel_err(&[UNWRITTEN], &[0.5]), f64::INFINITY);
        assert_eq!(max_rel_err(&[f32::NAN], &[f64::NAN]), 0.0);
        assert_eq!(max_rel_err(&[f32::NAN], &[0.5]), f64::INFINITY);
        assert!(max_rel_err(&[0.5], &[0.5]) == 0.0);
        assert!(max_rel_err(&[0.5], &[f64::NAN]).is_infinite());
    }
}
