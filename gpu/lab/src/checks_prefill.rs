//! Checks of the bf16 prefill attention (`flash_prefill`) against f64 on the same bf16
//! inputs: causal and not, varlen rows in one launch, outputs poisoned with NaN first.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::checks::{bf16_vec, download, max_rel_err, upload, CaseResult, BF16_TOL};
use crate::reference::attention_f64;
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::ops::{
    prefill_rows_valid, FlashKernels, PrefillBufs, PrefillShape, PREFILL_DQK, PREFILL_DV,
};

/// Prefix sums of `lens`, as the kernel takes them.
pub fn start_locs(lens: impl Iterator<Item = usize>) -> Vec<i32> {
    let mut loc = vec![0i32];
    for l in lens {
        loc.push(loc.last().copied().unwrap_or(0) + l as i32);
    }
    loc
}

/// One launch over `rows` (queries, keys) of `heads` heads against f64.
pub fn check_flash_prefill(
    dev: &GpuDevice,
    fk: &FlashKernels,
    heads: usize,
    rows: &[(usize, usize)],
    causal: bool,
    seed: u64,
) -> Result<CaseResult, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let q_loc = start_locs(rows.iter().map(|r| r.0));
    let k_loc = start_locs(rows.iter().map(|r| r.1));
    let s = PrefillShape {
        batch: rows.len(),
        heads,
        max_q_len: rows.iter().map(|r| r.0).max().unwrap_or(0),
        total_q: *q_loc.last().unwrap_or(&0) as usize,
        total_k: *k_loc.last().unwrap_or(&0) as usize,
        causal,
    };
    assert!(
        prefill_rows_valid(&s, &q_loc, &k_loc),
        "check rows {rows:?}"
    );
    let (q_bits, q) = bf16_vec(&mut rng, s.total_q * heads * PREFILL_DQK, 1.0);
    let (k_bits, k) = bf16_vec(&mut rng, s.total_k * heads * PREFILL_DQK, 1.0);
    let (v_bits, v) = bf16_vec(&mut rng, s.total_k * heads * PREFILL_DV, 1.0);
    // At least one element each, so an empty batch still has buffers to point at.
    let one = |n: usize| n.max(1);
    let out = upload(dev, &vec![f32::NAN; one(s.total_q * heads * PREFILL_DV)])?;
    let lse = upload(dev, &vec![f32::NAN; one(s.total_q * heads)])?;
    let (qd, kd, vd) = (
        upload(dev, &padded(q_bits))?,
        upload(dev, &padded(k_bits))?,
        upload(dev, &padded(v_bits))?,
    );
    let (ql, kl) = (upload(dev, &q_loc)?, upload(dev, &k_loc)?);
    let bufs = PrefillBufs {
        q: qd.ptr(),
        k: kd.ptr(),
        v: vd.ptr(),
        q_start_loc: ql.ptr(),
        k_start_loc: kl.ptr(),
        out: out.ptr(),
        lse: lse.ptr(),
    };
    let scale = 1.0 / (PREFILL_DQK as f32).sqrt();
    // SAFETY: the start locations passed prefill_rows_valid above.
    unsafe { fk.flash_prefill(dev, s, bufs, scale) }?;
    let n_out = s.total_q * heads * PREFILL_DV;
    let got_out = &download(dev, &out)?[..n_out];
    let got_lse = &download(dev, &lse)?[..s.total_q * heads];
    let dims = (heads, PREFILL_DQK, PREFILL_DV);
    let (want_out, want_lse) =
        attention_f64((&q, &k, &v), (&q_loc, &k_loc), dims, causal, scale as f64);
    let err = max_rel_err(got_out, &want_out).max(max_rel_err(got_lse, &want_lse));
    let shown: Vec<_> = rows.iter().take(4).collect();
    Ok(CaseResult {
        kernel: "flash_prefill",
        case: format!(
            "bf16, {} heads {heads}, rows (q, k) {shown:?}{}",
            if causal { "causal" } else { "non-causal" },
            if rows.len() > 4 { " ..." } else { "" }
        ),
        max_rel_err: err,
        passed: err <= BF16_TOL,
    })
}

fn padded(mut v: Vec<u16>) -> Vec<u16> {
    if v.is_empty() {
        v.push(0);
    }
    v
}

/// The grid: causal self-attention from 1 to 8192 tokens (non-aligned lengths, many rows
/// in one launch), causal queries over a longer tail-aligned key range, and non-causal
/// queries over context chunks (empty, short, long, a row with no queries).
pub fn run_prefill(dev: &GpuDevice, fk: &FlashKernels) -> Result<Vec<CaseResult>, GpuError> {
    let self_attn = |lens: &[usize]| lens.iter().map(|&l| (l, l)).collect::<Vec<_>>();
    let cases: Vec<(usize, Vec<(usize, usize)>, bool)> = vec![
        (16, self_attn(&[1]), true),
        (16, self_attn(&[5, 64, 65, 1, 130]), true),
        (128, self_attn(&[64, 100]), true),
        (16, self_attn(&[1000]), true),
        (1, self_attn(&[8192]), true),
        (16, vec![(37, 300), (1, 64)], true),
        (16, vec![(64, 2048)], false),
        (16, vec![(7, 0)], false),
        (16, vec![(3, 5), (0, 10), (20, 1), (65, 129)], false),
        (128, vec![(9, 24)], false),
    ];
    cases
        .into_iter()
        .enumerate()
        .map(|(i, (heads, rows, causal))| {
            check_flash_prefill(dev, fk, heads, &rows, causal, 900 + i as u64)
        })
        .collect()
}
