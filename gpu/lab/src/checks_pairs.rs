//! Checks of the CTA-pair decode (`flash_decode_seesaw_pair`: a request's two splits on a
//! cluster of two, merged on chip): its rows against f64, missing blocks included; its
//! bits against `flash_decode_seesaw_2wg`'s cluster and global merges of the same launch
//! (a request's bits must not depend on which of them its batch takes); the engine's bf16
//! rows against the f32 build's.

use crate::checks::{
    check_flash_bf16_rows, check_flash_decode, upload, CaseResult, FlashCaseInputs, FlashLaunch,
    Holes,
};
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::ops::{FlashKernels, FlashShape, Persist, SplitMerge, WideKernel, FLASH_ROWS};

const PAIR: &str = "flash_decode_seesaw_pair";
/// Keys a split: the contexts below take one split (up to 1024 keys) or two.
const SPLIT: usize = 1024;

/// Contexts of one and two splits in turn, `requests` of them: just past the row blocks
/// where a launch of two splits a request takes the pairs (more than half the
/// multiprocessors), so most pairs take two row blocks and some one.
fn contexts(q_len: usize, heads: usize, sms: usize) -> Vec<usize> {
    let row_blocks = (q_len * heads).div_ceil(FLASH_ROWS);
    let requests = sms / 2 / row_blocks + 1;
    [5usize, 1500, 700, 2000, 1030, 63, 1100]
        .iter()
        .cycle()
        .take(requests)
        .copied()
        .collect()
}

/// Missing pages in a split 0 (request 1) and a split 1 (request 3, 2000 keys), and the
/// table a page short of the longest requests: their rows come out NaN through the merge.
const HOLES: Holes<'static> = Holes {
    missing: &[(1, 3), (3, 20)],
    cut_pages: 1,
};

/// Every pair check at q 1 and 128 heads (two row blocks a request) and q 4 and 16
/// heads (one), with `fk` (f32 rows) and `bf16k` (the engine's rows).
pub fn run_pair_checks(
    dev: &GpuDevice,
    (fk, bf16k): (&FlashKernels, &FlashKernels),
) -> Result<Vec<CaseResult>, GpuError> {
    let path = (WideKernel::Seesaw, SplitMerge::Cluster);
    let mut results = Vec::new();
    for (i, (q_len, heads)) in [(1usize, 128usize), (4, 16)].into_iter().enumerate() {
        let ctx = contexts(q_len, heads, dev.sms);
        let shape = (q_len, heads, 64, SPLIT);
        let seed = 1300 + i as u64;
        for holes in [Holes::default(), HOLES] {
            let mut case = check_flash_decode(dev, fk, path, shape, &ctx, holes, seed)?;
            case.passed &= case.kernel == PAIR;
            results.push(case);
        }
        let mut case = check_flash_bf16_rows(dev, (fk, bf16k), path, shape, &ctx, HOLES, seed)?;
        case.passed &= case.kernel == PAIR;
        results.push(case);
        results.push(check_pairs_agree(dev, fk, (q_len, heads), &ctx, seed)?);
    }
    Ok(results)
}

/// The pair kernel on the engine's grid and on three pairs (each taking many row blocks,
/// so its exchange barriers cycle through their phases), against `_2wg`'s cluster merge
/// and its global merge (`Persist::Off` takes the pairs away) on one launch with missing
/// blocks: every output and LSE bit the same.
fn check_pairs_agree(
    dev: &GpuDevice,
    k: &FlashKernels,
    (q_len, heads): (usize, usize),
    ctx: &[usize],
    seed: u64,
) -> Result<CaseResult, GpuError> {
    let inp = FlashCaseInputs::new((q_len, heads, 64), ctx, HOLES, seed);
    let s = FlashShape {
        batch: ctx.len(),
        q_len,
        heads,
        page: 64,
        width: inp.width,
        split_size_tokens: SPLIT,
        max_splits: 2,
    };
    let inputs = (&inp.q_bits[..], &inp.table[..], &inp.seq_lens[..]);
    let launch = FlashLaunch::new((dev, k), s, inputs, &inp.seq_lens)?;
    let cache = upload(dev, &inp.cache_bits)?;
    let mut runs = Vec::new();
    for (persist, merge) in [
        (Persist::PerMultiprocessor, SplitMerge::Cluster),
        (Persist::Ctas(3), SplitMerge::Cluster),
        (Persist::Off, SplitMerge::Cluster),
        (Persist::Off, SplitMerge::Global),
    ] {
        let mut k = k.clone();
        k.persist = persist;
        let path = (WideKernel::Seesaw, merge);
        let name = k.decode_launch(&s, path, dev.sms).0;
        // SAFETY: the case's block table names blocks inside its cache or -1, and its
        // mapped keys stop at the first -1 of each row.
        let (out, lse) = unsafe { launch.run(dev, &k, path, s, &cache) }?;
        let bits: Vec<u32> = out.iter().chain(&lse).map(|x| x.to_bits()).collect();
        runs.push((format!("{name} ({persist:?}, {merge:?})"), bits));
    }
    let differ: Vec<usize> = runs[1..]
        .iter()
        .map(|(_, b)| b.iter().zip(&runs[0].1).filter(|(x, y)| x != y).count())
        .collect();
    let nan = runs[0].1.iter().filter(|&&b| f32::from_bits(b).is_nan()).count();
    let names: Vec<&str> = runs.iter().map(|(n, _)| n.as_str()).collect();
    let kernels_right = names[..2].iter().all(|n| n.starts_with(PAIR))
        && names[2..].iter().all(|n| n.starts_with("flash_decode_seesaw_2wg"));
    Ok(CaseResult {
        kernel: PAIR,
        case: format!(
            "{} against {}, {} and {} (q {q_len} heads {heads}, {} requests of ctx {ctx:?}, splits of {SPLIT}{}): {differ:?} of {} values differ ({nan} NaN)",
            names[0],
            names[1],
            names[2],
            names[3],
            ctx.len(),
            HOLES.label(),
            runs[0].1.len()
        ),
        max_rel_err: differ.iter().sum::<usize>() as f64,
        passed: differ.iter().all(|&d| d == 0) && kernels_right && nan > 0,
    })
}
