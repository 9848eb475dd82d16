//! Checks of the bf16 prefill attention (`flash_prefill`) against f64 on the same bf16
//! inputs: causal and not, varlen rows in one launch, outputs poisoned with NaN first.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::checks::{bf16_vec, download, max_rel_err, upload, CaseResult, BF16_TOL};
use crate::reference::attention_f64;
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::ops::{
    prefill_rows_valid, FlashKernels, PrefillBufs, PrefillKeyLayout, PrefillShape, PREFILL_DQK,
    PREFILL_DV,
};

/// Prefix sums of `lens`, as the kernel takes them.
pub fn start_locs(lens: impl Iterator<Item = usize>) -> Vec<i32> {
    let mut loc = vec![0i32];
    for l in lens {
        loc.push(loc.last().copied().unwrap_or(0) + l as i32);
    }
    loc
}

/// Keys and values of `keys` keys in `layout`, bf16, random: the three device arrays
/// (k_nope, k_rope, v; the up-projected layout keeps k_nope and v in one buffer, so v is
/// that buffer again) and, for the reference, each key of each head as `[192]` and each
/// value as `[128]`.
struct Keys {
    k_nope: Vec<u16>,
    k_rope: Vec<u16>,
    /// `None`: v lives in `k_nope`'s buffer at offset 128.
    v: Option<Vec<u16>>,
    k_ref: Vec<f32>,
    v_ref: Vec<f32>,
}

fn keys(rng: &mut ChaCha8Rng, keys: usize, heads: usize, layout: PrefillKeyLayout) -> Keys {
    let shared = layout == PrefillKeyLayout::up_projected(heads);
    let nope_len = if keys == 0 {
        0
    } else {
        (keys - 1) * layout.k_nope_row + heads * layout.k_nope_head
    };
    let rope_len = keys * layout.k_rope_row;
    let (k_nope, nope) = bf16_vec(rng, nope_len, 1.0);
    let (k_rope, rope) = bf16_vec(rng, rope_len, 1.0);
    let (v, vals) = if shared {
        (None, nope.clone())
    } else {
        let (b, f) = bf16_vec(rng, keys * layout.v_row, 1.0);
        (Some(b), f)
    };
    let v_off = if shared { 128 } else { 0 };
    let rope_off = if shared { 512 } else { 0 };
    let mut k_ref = Vec::with_capacity(keys * heads * PREFILL_DQK);
    let mut v_ref = Vec::with_capacity(keys * heads * PREFILL_DV);
    for j in 0..keys {
        for h in 0..heads {
            let n0 = j * layout.k_nope_row + h * layout.k_nope_head;
            k_ref.extend_from_slice(&nope[n0..n0 + 128]);
            let r0 = j * layout.k_rope_row + rope_off;
            k_ref.extend_from_slice(&rope[r0..r0 + 64]);
            let v0 = j * layout.v_row + h * layout.v_head + v_off;
            v_ref.extend_from_slice(&vals[v0..v0 + PREFILL_DV]);
        }
    }
    Keys {
        k_nope,
        k_rope,
        v,
        k_ref,
        v_ref,
    }
}

/// One launch over `rows` (queries, keys) of `heads` heads against f64, keys laid out as
/// `layout` says.
pub fn check_flash_prefill(
    dev: &GpuDevice,
    fk: &FlashKernels,
    (heads, layout): (usize, PrefillKeyLayout),
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
    let kv = keys(&mut rng, s.total_k, heads, layout);
    // At least one element each, so an empty batch still has buffers to point at.
    let one = |n: usize| n.max(1);
    let out = upload(dev, &vec![f32::NAN; one(s.total_q * heads * PREFILL_DV)])?;
    let lse = upload(dev, &vec![f32::NAN; one(s.total_q * heads)])?;
    let qd = upload(dev, &padded(q_bits))?;
    let (nd, rd) = (
        upload(dev, &padded(kv.k_nope))?,
        upload(dev, &padded(kv.k_rope))?,
    );
    let vd = kv.v.map(|v| upload(dev, &padded(v))).transpose()?;
    let (ql, kl) = (upload(dev, &q_loc)?, upload(dev, &k_loc)?);
    let shared_v = || nd.ptr().offset(128.min(nd.len()));
    let bufs = PrefillBufs {
        q: qd.ptr(),
        k_nope: nd.ptr(),
        // The up-projected layout's rope sits at column 512 of 576-wide rows.
        k_rope: if vd.is_none() {
            rd.ptr().offset(512.min(rd.len()))
        } else {
            rd.ptr()
        },
        v: vd.as_ref().map_or_else(shared_v, |v| v.ptr()),
        layout,
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
    let (want_out, want_lse) = attention_f64(
        (&q, &kv.k_ref, &kv.v_ref),
        (&q_loc, &k_loc),
        dims,
        causal,
        scale as f64,
    );
    let err = max_rel_err(got_out, &want_out).max(max_rel_err(got_lse, &want_lse));
    let shown: Vec<_> = rows.iter().take(4).collect();
    Ok(CaseResult {
        kernel: "flash_prefill",
        case: format!(
            "bf16, {} heads {heads}, rows (q, k) {shown:?}{}{}",
            if causal { "causal" } else { "non-causal" },
            if rows.len() > 4 { " ..." } else { "" },
            if vd.is_none() {
                ", up-projected layout"
            } else {
                ""
            }
        ),
        max_rel_err: err,
        passed: err <= BF16_TOL,
    })
}

/// Heads, rows (queries, keys), causal.
type Case = (usize, Vec<(usize, usize)>, bool);

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
    let cases: Vec<Case> = vec![
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
    let mut out = Vec::new();
    for (i, (heads, rows, causal)) in cases.into_iter().enumerate() {
        let layout = PrefillKeyLayout::separate(heads);
        out.push(check_flash_prefill(
            dev,
            fk,
            (heads, layout),
            &rows,
            causal,
            900 + i as u64,
        )?);
    }
    // K and V straight from the up-projection's output, rope from the gathered latent.
    for (i, (heads, rows)) in [(16, vec![(5, 300), (64, 64)]), (128, vec![(3, 130)])]
        .into_iter()
        .enumerate()
    {
        let layout = PrefillKeyLayout::up_projected(heads);
        out.push(check_flash_prefill(
            dev,
            fk,
            (heads, layout),
            &rows,
            true,
            950 + i as u64,
        )?);
    }
    Ok(out)
}
