//! Checks of the balanced decode (the fast mode's schedule, core's `balanced` module):
//! every request's rows against f64 whichever parts its keys were cut over, missing
//! blocks included, and the engine's bf16 rows against the f32 build's bit for bit, through
//! both the decode's own final rows and `flash_combine_slots`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checks::{
    bf16_rows_differ, bits_differ, download, flash_check_scale, max_rel_err, schedule_of, upload,
    CaseResult, FlashCaseInputs, FlashLaunch, Holes, BF16_TOL, UNWRITTEN,
};
use crate::reference::decode_f64;
use specmla_core::balanced::{invariant_balanced_schedule, BalancedPolicy, BalancedSchedule};
use specmla_core::split::SplitPolicy;
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::ops::{
    BalancedWork, DecodeOut, FlashKernels, FlashSchedule, FlashShape, FlashWorkspace, SplitMerge,
    WideKernel, FLASH_DIM, FLASH_DV, FLASH_ROWS,
};

/// One balanced case: requests of `ctx` keys before their `q_len` new tokens at `heads`
/// heads, pages of `page`, on `parts` parts (FlashMLA's for the device where `None`).
#[derive(Clone, Copy, Debug)]
pub struct BalancedCase<'a> {
    pub q_len: usize,
    pub heads: usize,
    pub page: usize,
    pub ctx: &'a [usize],
    pub parts: Option<usize>,
    pub holes: Holes<'a>,
}

/// What one build's run of a case gave.
struct BalancedRun {
    out: Vec<f32>,
    lse: Vec<f32>,
    /// Against f64, where the run computed the reference.
    err: Option<f64>,
    cuts: usize,
    most_splits: u32,
}

fn run_balanced(
    dev: &GpuDevice,
    k: &FlashKernels,
    c: BalancedCase,
    seed: u64,
    reference: bool,
) -> Result<BalancedRun, GpuError> {
    let inp = FlashCaseInputs::new((c.q_len, c.heads, c.page), c.ctx, c.holes, seed);
    run_balanced_on(dev, k, c, &inp, None, reference)
}

/// Runs `inp` (`c` gives its shape and parts) on core's balanced schedule, or with
/// `invariant` on the batch-invariant one of those splits (`invariant_balanced_schedule`).
fn run_balanced_on(
    dev: &GpuDevice,
    k: &FlashKernels,
    c: BalancedCase,
    inp: &FlashCaseInputs,
    invariant: Option<SplitPolicy>,
    reference: bool,
) -> Result<BalancedRun, GpuError> {
    let batch = inp.seq_lens.len();
    let rows = c.q_len * c.heads;
    let row_blocks = rows.div_ceil(FLASH_ROWS);
    let policy = BalancedPolicy {
        parts: c
            .parts
            .unwrap_or(BalancedPolicy::for_device(dev.sms, row_blocks).parts),
        ..BalancedPolicy::for_device(dev.sms, row_blocks)
    };
    let lens: Vec<u32> = inp.seq_lens.iter().map(|&l| l as u32).collect();
    let sched: BalancedSchedule = match invariant {
        Some(split) => invariant_balanced_schedule(&lens, split, policy),
        None => policy.schedule(&lens),
    };
    let work = BalancedWork::upload(dev, &sched)?;
    // The split schedule only for its mapped keys (the balanced kernel reads no split).
    let one = SplitPolicy {
        split_size_tokens: inp.max_len.div_ceil(64) * 64,
        max_splits: 1,
    };
    let splits = schedule_of(one, &inp.seq_lens, &inp.table, inp.width, c.page);
    let one_split = FlashShape {
        batch,
        q_len: c.q_len,
        heads: c.heads,
        page: c.page,
        width: inp.width,
        split_size_tokens: one.split_size_tokens,
        max_splits: 1,
    };
    let s = BalancedWork::shape(sched.partial_slots, one_split);
    let ws = FlashWorkspace::new(dev, s, k.out, Some(UNWRITTEN))?;
    let on_device = FlashSchedule::upload(dev, &splits, one.split_size_tokens)?;
    let (q_d, table_d, seq_d) = (
        upload(dev, &inp.q_bits)?,
        upload(dev, &inp.table)?,
        upload(dev, &inp.seq_lens)?,
    );
    let cache_d = upload(dev, &inp.cache_bits)?;
    let bufs = ws.bufs(
        q_d.ptr(),
        cache_d.ptr(),
        table_d.ptr(),
        seq_d.ptr(),
        &on_device,
    );
    // SAFETY: the block table names blocks inside the cache or -1, its mapped keys stop at
    // each row's first -1, and the schedule is core's for these seq_lens.
    unsafe { k.flash_decode_balanced(dev, s, bufs, &work, flash_check_scale()) }?;
    let out = ws.out.read_f32(dev)?;
    let lse = download(dev, &ws.lse)?;
    let shape = (c.q_len, c.heads, FLASH_DIM, FLASH_DV, c.page, inp.width);
    let scale = flash_check_scale() as f64;
    let err = reference.then(|| {
        let (want_out, want_lse) =
            decode_f64(&inp.q, &inp.cache, &inp.table, &inp.seq_lens, shape, scale);
        max_rel_err(&out, &want_out).max(max_rel_err(&lse, &want_lse))
    });
    Ok(BalancedRun {
        out,
        lse,
        err,
        cuts: sched.cut_requests().len(),
        most_splits: sched.num_splits.iter().copied().max().unwrap_or(0),
    })
}

/// The balanced decode against f64 (the f32 build), and the bf16 build's rows against the
/// f32 ones rounded to nearest even (LSEs the same bits). `want_cuts`: the case is built
/// to cut at least this many requests, and fails if the schedule cut fewer (a case that
/// never reached the combine would pass for nothing).
pub fn check_flash_balanced(
    dev: &GpuDevice,
    (f32k, bf16k): (&FlashKernels, &FlashKernels),
    c: BalancedCase,
    want_cuts: usize,
    seed: u64,
) -> Result<CaseResult, GpuError> {
    assert_eq!((f32k.out, bf16k.out), (DecodeOut::F32, DecodeOut::Bf16));
    // The same inputs on both builds (the seed); the f32 rows against f64.
    let f = run_balanced(dev, f32k, c, seed, true)?;
    let h = run_balanced(dev, bf16k, c, seed, false)?;
    let err = f.err.unwrap_or(f64::INFINITY);
    let (rows_differ, lse_differ) = bf16_rows_differ((&f.out, &f.lse), (&h.out, &h.lse));
    let nan_rows = f.out.iter().filter(|v| v.is_nan()).count() / FLASH_DV;
    let parts = c
        .parts
        .map_or("the device's".to_string(), |p| p.to_string());
    Ok(CaseResult {
        kernel: "flash_balanced",
        case: format!(
            "q {} heads {} page {} ctx {:?} on {parts} parts{}: {} cut request(s), up to {} splits; f32 {:.1e} from f64 ({nan_rows} NaN rows); bf16 rows: {rows_differ} of {} values and {lse_differ} LSEs differ",
            c.q_len,
            c.heads,
            c.page,
            c.ctx,
            c.holes.label(),
            f.cuts,
            f.most_splits,
            err,
            f.out.len()
        ),
        max_rel_err: err,
        passed: err <= BF16_TOL
            && f.cuts >= want_cuts
            && rows_differ == 0
            && lse_differ == 0,
    })
}

/// Batch invariance of the persistent kernel on the invariant schedule: request 1 of three
/// (700, 1500 and 90 keys before its `q_len` tokens; splits of 512+ keys, up to 8, so it
/// takes 3) on 2 parts, where its pieces share parts with the others', gives the same bits
/// alone on the device's parts, where each piece has a part to itself; the batch's rows
/// within tolerance of f64 (the f32 build); and the split grid's launch of the batch on the
/// same splits gives the batch's bits. The check can fail: the same request alone with
/// splits of 1024 must come out different.
pub fn check_invariant_persistent(
    dev: &GpuDevice,
    k: &FlashKernels,
    (q_len, heads, page): (usize, usize, usize),
    seed: u64,
) -> Result<CaseResult, GpuError> {
    assert_eq!(k.out, DecodeOut::F32);
    let ctx = [700usize, 1500, 90];
    let c = case(q_len, heads, page, &ctx, Some(2), Holes::default());
    let inp = FlashCaseInputs::new((q_len, heads, page), &ctx, c.holes, seed);
    let split = |split_size_tokens| SplitPolicy {
        split_size_tokens,
        max_splits: 8,
    };
    let batch = run_balanced_on(dev, k, c, &inp, Some(split(512)), true)?;
    let rows = q_len * heads;
    let alone_in = inp.alone(1, rows);
    let own = BalancedCase { parts: None, ..c };
    let alone = run_balanced_on(dev, k, own, &alone_in, Some(split(512)), false)?;
    let resplit = run_balanced_on(dev, k, own, &alone_in, Some(split(1024)), false)?;
    let o = rows * FLASH_DV;
    // Request 1's LSE in the batch's [heads, 3 q_len], in the order of its own [heads, q_len].
    let lse_in_batch = (0..heads).flat_map(|h| (0..q_len).map(move |j| h * 3 * q_len + q_len + j));
    let in_batch: Vec<f32> = batch.out[o..2 * o]
        .iter()
        .copied()
        .chain(lse_in_batch.map(|i| batch.lse[i]))
        .collect();
    let by_itself = [&alone.out[..], &alone.lse[..]].concat();
    let differ = bits_differ(&in_batch, &by_itself);
    let moved = bits_differ(&resplit.out, &alone.out);
    let finite = alone.out.iter().all(|v| !v.is_nan() && *v != UNWRITTEN);
    let err = batch.err.unwrap_or(f64::INFINITY);
    // The split grid (one CTA a split, the cluster merge) must give the same bits for the
    // batch: then an invariant launch may take either kernel, by cost, per batch.
    let grid = {
        let policy = split(512);
        let s = FlashShape {
            batch: ctx.len(),
            q_len,
            heads,
            page,
            width: inp.width,
            split_size_tokens: policy.split_size_tokens,
            max_splits: policy.max_splits,
        };
        let launch = FlashLaunch::new(
            (dev, k),
            s,
            (&inp.q_bits, &inp.table, &inp.seq_lens),
            &inp.seq_lens,
        )?;
        let cache = upload(dev, &inp.cache_bits)?;
        // SAFETY: the case's block table has no hole and names blocks inside its cache.
        let (out, lse) =
            unsafe { launch.run(dev, k, (WideKernel::Seesaw, SplitMerge::Cluster), s, &cache) }?;
        bits_differ(&out, &batch.out) + bits_differ(&lse, &batch.lse)
    };
    Ok(CaseResult {
        kernel: "flash_balanced",
        case: format!(
            "invariant schedule, q {q_len} heads {heads} page {page} ctx {ctx:?} on 2 parts: {} cut request(s), up to {} splits; f32 {err:.1e} from f64; request 1 alone on the device's parts: {differ} of {} values differ; with splits of 1024: {moved} differ (must be > 0); the split grid's batch: {grid} values differ",
            batch.cuts,
            batch.most_splits,
            in_batch.len()
        ),
        max_rel_err: err,
        passed: differ == 0
            && grid == 0
            && moved > 0
            && finite
            && err <= BF16_TOL
            && batch.most_splits == 3,
    })
}

/// The balanced cases `gpu-test` runs (sm_90a only): 2, 8 and 4 row blocks a request (the
/// last with 16 live rows), pages of 16, 64 and 128, few parts so that most requests are
/// cut, the device's parts over one long request (a merge of one split a part), missing
/// blocks through cut requests, and six random batches.
pub fn run_balanced_checks(
    dev: &GpuDevice,
    builds: (&FlashKernels, &FlashKernels),
) -> Result<Vec<CaseResult>, GpuError> {
    let holes = Holes {
        missing: &[(1, 3), (2, 8)],
        cut_pages: 1,
    };
    let mixed = [0usize, 1, 63, 64, 65, 1000, 2047, 3000];
    let ragged = [1023usize, 700, 511, 898];
    let none = Holes::default();
    // Each with the cut requests core's schedule gives it (worked by hand for the first:
    // tiles 1, 1, 1, 2, 2, 16, 32, 47 plus 5 each on 3 parts cut the last request once).
    let cases: [(BalancedCase, usize); 8] = [
        (case(1, 128, 64, &mixed, Some(3), none), 1),
        (case(4, 128, 64, &[5, 129, 1500, 700], Some(2), none), 1),
        (case(13, 16, 64, &[5, 129, 1500], Some(4), none), 1),
        (case(2, 128, 16, &[3, 300, 900], Some(2), none), 1),
        (case(1, 128, 128, &[100, 700, 2500], Some(3), none), 1),
        (case(1, 16, 64, &ragged, Some(5), holes), 2),
        (case(2, 128, 64, &ragged, Some(3), holes), 1),
        (case(2, 128, 64, &[8000], None, none), 1),
    ];
    let mut results = Vec::new();
    for (i, (c, want_cuts)) in cases.into_iter().enumerate() {
        results.push(check_flash_balanced(
            dev,
            builds,
            c,
            want_cuts,
            1000 + i as u64,
        )?);
    }
    // Random batches: 3-8 requests of 0-2000 keys at 1-4 tokens and 16 or 128 heads, on 1-8
    // parts or the device's; whatever they cut (some cut nothing: the uncut pieces' final
    // rows, one or several a CTA), every row against f64.
    let mut rng = ChaCha8Rng::seed_from_u64(1100);
    for i in 0..6 {
        let heads = if rng.gen_bool(0.5) { 16 } else { 128 };
        let q_len = rng.gen_range(1..=4);
        let n = rng.gen_range(3..=8);
        let ctx: Vec<usize> = (0..n).map(|_| rng.gen_range(0..=2000)).collect();
        let parts = rng.gen_bool(0.75).then(|| rng.gen_range(1..=8));
        let c = case(q_len, heads, 64, &ctx, parts, none);
        results.push(check_flash_balanced(dev, builds, c, 0, 1100 + i)?);
    }
    for (i, shape) in [(1, 128, 64), (4, 16, 16)].into_iter().enumerate() {
        results.push(check_invariant_persistent(
            dev,
            builds.0,
            shape,
            1200 + i as u64,
        )?);
    }
    Ok(results)
}

fn case<'a>(
    q_len: usize,
    heads: usize,
    page: usize,
    ctx: &'a [usize],
    parts: Option<usize>,
    holes: Holes<'a>,
) -> BalancedCase<'a> {
    BalancedCase {
        q_len,
        heads,
        page,
        ctx,
        parts,
        holes,
    }
}
