//! Checks of the dense kernels against the CPU model's own f32 building blocks
//! (`specmla-model`) on fresh random inputs, outputs poisoned with NaN first.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use specmla_model::{apply_rope, matvec, rms_norm, silu, RMS_EPS};

use crate::checks::CaseResult;
use specmla_core::backend::{row_digest, row_digests};
use specmla_core::config::{KvCacheDtype, ModelDims};
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::launch::Buf;
use specmla_gpu::ops::{Kernels, MlaDims};

/// Relative tolerance of the dense kernels against the CPU's f32 (reduction orders differ).
pub const DENSE_TOL: f64 = 1e-5;

fn rand_vec(rng: &mut ChaCha8Rng, len: usize, a: f32) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-a..a)).collect()
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            if g.is_nan() != w.is_nan() {
                f64::INFINITY
            } else {
                (g as f64 - w as f64).abs() / (w.abs() as f64).max(1.0)
            }
        })
        .fold(0.0, f64::max)
}

fn case(kernel: &'static str, case: String, err: f64) -> CaseResult {
    CaseResult {
        kernel,
        case,
        max_rel_err: err,
        passed: err <= DENSE_TOL,
    }
}

fn poisoned(dev: &GpuDevice, len: usize) -> Result<Buf<f32>, GpuError> {
    Buf::from_host(dev, &vec![f32::NAN; len], "check output")
}

/// `y = res + x @ w` and RMSNorm over `rows` rows.
pub fn check_matmul_norm(
    dev: &GpuDevice,
    k: &Kernels,
    (rows, kd, n): (usize, usize, usize),
    seed: u64,
) -> Result<Vec<CaseResult>, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = rand_vec(&mut rng, rows * kd, 1.0);
    let w = rand_vec(&mut rng, kd * n, (3.0 / kd as f32).sqrt());
    let res = rand_vec(&mut rng, rows * n, 1.0);
    let g = rand_vec(&mut rng, kd, 1.0);
    let (xd, wd, rd, gd) = (
        Buf::from_host(dev, &x, "x")?,
        Buf::from_host(dev, &w, "w")?,
        Buf::from_host(dev, &res, "res")?,
        Buf::from_host(dev, &g, "g")?,
    );
    let y = poisoned(dev, rows * n)?;
    k.matmul(
        dev,
        xd.ptr(),
        kd,
        wd.ptr(),
        Some(rd.ptr()),
        y.ptr(),
        (rows, kd, n),
    )?;
    let want: Vec<f32> = (0..rows)
        .flat_map(|r| {
            let p = matvec(&x[r * kd..(r + 1) * kd], &w, kd, n);
            p.iter()
                .zip(&res[r * n..])
                .map(|(a, b)| b + a)
                .collect::<Vec<_>>()
        })
        .collect();
    let mm = case(
        "matmul",
        format!("{rows}x{kd} @ {kd}x{n} + res"),
        rel_err(&y.read(dev, rows * n)?, &want),
    );
    let out = poisoned(dev, rows * kd)?;
    k.rms_norm(
        dev,
        xd.ptr(),
        kd,
        gd.ptr(),
        out.ptr(),
        kd,
        rows,
        kd,
        RMS_EPS,
    )?;
    let want: Vec<f32> = (0..rows)
        .flat_map(|r| rms_norm(&x[r * kd..(r + 1) * kd], &g))
        .collect();
    let nm = case(
        "rms_norm",
        format!("{rows} rows of {kd}"),
        rel_err(&out.read(dev, rows * kd)?, &want),
    );
    Ok(vec![mm, nm])
}

/// RoPE on the rope part of each head, SwiGLU, and the W_UK / W_UV absorption.
pub fn check_rope_mlp_absorb(
    dev: &GpuDevice,
    k: &Kernels,
    d: MlaDims,
    n: usize,
    seed: u64,
) -> Result<Vec<CaseResult>, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let qk = d.qk();
    let q = rand_vec(&mut rng, n * d.heads * qk, 1.0);
    let pos: Vec<i32> = (0..n).map(|_| rng.gen_range(0..100_000)).collect();
    let qd = Buf::from_host(dev, &q, "q")?;
    let pd = Buf::from_host(dev, &pos, "positions")?;
    k.rope(
        dev,
        qd.ptr(),
        pd.ptr(),
        n,
        (d.heads, d.heads * qk, qk),
        (d.nope, d.rope),
        10_000.0,
    )?;
    let mut want = q.clone();
    for t in 0..n {
        for h in 0..d.heads {
            let head = &mut want[(t * d.heads + h) * qk..][..qk];
            apply_rope(&mut head[d.nope..], pos[t] as usize, 10_000.0);
        }
    }
    let got_q = qd.read(dev, q.len())?;
    let mut out = vec![case(
        "rope",
        format!("{n} tokens x {} heads, rope {}", d.heads, d.rope),
        rel_err(&got_q, &want),
    )];
    let (gate, up) = (
        rand_vec(&mut rng, n * 64, 4.0),
        rand_vec(&mut rng, n * 64, 1.0),
    );
    let (gd, ud, ad) = (
        Buf::from_host(dev, &gate, "gate")?,
        Buf::from_host(dev, &up, "up")?,
        poisoned(dev, n * 64)?,
    );
    k.silu_mul(dev, gd.ptr(), ud.ptr(), ad.ptr(), n * 64)?;
    let want: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
    out.push(case(
        "silu_mul",
        format!("{} values", n * 64),
        rel_err(&ad.read(dev, n * 64)?, &want),
    ));
    let w_uk = rand_vec(
        &mut rng,
        d.heads * d.kv_lora * d.nope,
        (3.0 / d.kv_lora as f32).sqrt(),
    );
    let w_uv = rand_vec(
        &mut rng,
        d.heads * d.kv_lora * d.v,
        (3.0 / d.kv_lora as f32).sqrt(),
    );
    let (ukd, uvd) = (
        Buf::from_host(dev, &w_uk, "w_uk")?,
        Buf::from_host(dev, &w_uv, "w_uv")?,
    );
    let q_lat = poisoned(dev, n * d.heads * d.latent())?;
    k.absorb_q(dev, d, qd.ptr(), ukd.ptr(), q_lat.ptr(), n)?;
    let mut want_lat = Vec::with_capacity(n * d.heads * d.latent());
    for t in 0..n {
        for h in 0..d.heads {
            let head = &got_q[(t * d.heads + h) * qk..][..qk];
            let w = &w_uk[h * d.kv_lora * d.nope..][..d.kv_lora * d.nope];
            want_lat.extend(w.chunks_exact(d.nope).map(|r| {
                r.iter()
                    .zip(&head[..d.nope])
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
            }));
            want_lat.extend_from_slice(&head[d.nope..]);
        }
    }
    out.push(case(
        "absorb_q",
        format!("{n} tokens, heads {} lora {}", d.heads, d.kv_lora),
        rel_err(&q_lat.read(dev, want_lat.len())?, &want_lat),
    ));
    let o_lat = rand_vec(&mut rng, n * d.heads * d.kv_lora, 1.0);
    let od = Buf::from_host(dev, &o_lat, "o_lat")?;
    let o = poisoned(dev, n * d.heads * d.v)?;
    k.apply_uv(dev, d, od.ptr(), uvd.ptr(), o.ptr(), n)?;
    let want: Vec<f32> = (0..n * d.heads)
        .flat_map(|th| {
            let h = th % d.heads;
            matvec(
                &o_lat[th * d.kv_lora..][..d.kv_lora],
                &w_uv[h * d.kv_lora * d.v..][..d.kv_lora * d.v],
                d.kv_lora,
                d.v,
            )
        })
        .collect();
    out.push(case(
        "apply_uv",
        format!("{n} tokens, heads {} v {}", d.heads, d.v),
        rel_err(&o.read(dev, want.len())?, &want),
    ));
    Ok(out)
}

/// Every dense check over tiny and DeepSeek-V3 attention shapes.
/// The bf16 rounding of a latent against the core's (`KvCacheDtype::round`, which is
/// `half`'s): bit for bit on random values of every magnitude and on the edges: exact
/// ties to even and to odd, NaN, infinities, the largest float (rounds to infinity),
/// subnormals, -0. The output buffer is the input (the kernel works in place).
pub fn check_round_bf16(dev: &GpuDevice, k: &Kernels, seed: u64) -> Result<CaseResult, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut x: Vec<f32> = (0..4096)
        .map(|_| f32::from_bits(rng.gen::<u32>()))
        .collect();
    x.extend((0..4096).map(|_| rng.gen_range(-4.0f32..4.0)));
    x.extend([
        f32::from_bits(0x3f80_8000), // tie, even below: stays 0x3f80
        f32::from_bits(0x3f81_8000), // tie, odd below: up to 0x3f82
        f32::from_bits(0xbf81_8000),
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::from_bits(1),
        f32::from_bits(0x0000_8000),
        -0.0,
    ]);
    let want: Vec<f32> = x.iter().map(|&v| KvCacheDtype::Bf16.round(v)).collect();
    let buf = Buf::from_host(dev, &x, "round input")?;
    k.round_bf16(dev, buf.ptr(), x.len())?;
    let got = buf.read(dev, x.len())?;
    let wrong = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()))
        .count();
    Ok(CaseResult {
        kernel: "round_bf16",
        case: format!("{} values: random bits, [-4, 4), ties, NaN, inf, f32::MAX, subnormals; {wrong} differ from half::bf16", x.len()),
        max_rel_err: if wrong == 0 { 0.0 } else { 1.0 },
        passed: wrong == 0,
    })
}

/// The device's row digests against `core::backend::row_digest`, exactly: random bits
/// (NaNs, -0 and subnormals among them) in 3 groups of rows spaced apart, widths that
/// are not multiples of the block, and one bit flipped to show the digest moves.
pub fn check_row_digest(
    dev: &GpuDevice,
    k: &Kernels,
    seed: u64,
) -> Result<Vec<CaseResult>, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::new();
    for (groups, rows, width, gap) in [(1, 1, 1, 0), (1, 37, 7168, 0), (3, 19, 16384, 5)] {
        let stride = rows * width + gap;
        let mut x: Vec<f32> = (0..groups * stride)
            .map(|_| f32::from_bits(rng.gen::<u32>()))
            .collect();
        x[0] = -0.0;
        let want: Vec<u64> = (0..groups)
            .flat_map(|g| row_digests(&x[g * stride..g * stride + rows * width], width))
            .collect();
        let src = Buf::from_host(dev, &x, "digest input")?;
        let dig = Buf::<u64>::from_host(dev, &vec![0; groups * rows], "digests")?;
        k.row_digest(dev, src.ptr(), dig.ptr(), (groups, rows, width), stride)?;
        let got = dig.read(dev, groups * rows)?;
        let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        x[width - 1] = f32::from_bits(x[width - 1].to_bits() ^ 1);
        let moved = row_digest(&x[..width]) != want[0];
        out.push(CaseResult {
            kernel: "row_digest",
            case: format!(
                "{groups} x {rows} rows of {width} random bits: {wrong} differ from the \
                 core's; one flipped bit {} the digest",
                if moved { "moves" } else { "does NOT move" }
            ),
            max_rel_err: if wrong == 0 && moved { 0.0 } else { 1.0 },
            passed: wrong == 0 && moved,
        });
    }
    Ok(out)
}

/// `gather_rows2` against the host: rows from two sources by the sign of the index.
pub fn check_gather_rows2(dev: &GpuDevice, k: &Kernels, seed: u64) -> Result<CaseResult, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (ra, rb, d) = (9, 5, 7168);
    let a = rand_vec(&mut rng, ra * d, 1.0);
    let b = rand_vec(&mut rng, rb * d, 1.0);
    let idx: Vec<i32> = (0..23)
        .map(|_| match rng.gen_bool(0.5) {
            true => rng.gen_range(0..ra as i32),
            false => -1 - rng.gen_range(0..rb as i32),
        })
        .collect();
    let want: Vec<f32> = idx
        .iter()
        .flat_map(|&j| match j {
            j if j >= 0 => &a[j as usize * d..(j as usize + 1) * d],
            j => &b[(-1 - j) as usize * d..(-j) as usize * d],
        })
        .copied()
        .collect();
    let (da, db) = (Buf::from_host(dev, &a, "a")?, Buf::from_host(dev, &b, "b")?);
    let di = Buf::from_host(dev, &idx, "indices")?;
    let o = poisoned(dev, idx.len() * d)?;
    // SAFETY: every index was drawn inside its source above.
    unsafe { k.gather_rows2(dev, (da.ptr(), db.ptr()), di.ptr(), o.ptr(), (idx.len(), d)) }?;
    let got = o.read(dev, idx.len() * d)?;
    let exact = got
        .iter()
        .zip(&want)
        .all(|(g, w)| g.to_bits() == w.to_bits());
    Ok(CaseResult {
        kernel: "gather_rows2",
        case: format!(
            "{} rows of {d} from two sources: {}",
            idx.len(),
            if exact { "exact" } else { "WRONG" }
        ),
        max_rel_err: if exact { 0.0 } else { 1.0 },
        passed: exact,
    })
}

/// The footprint the backend checks a configuration against before allocating
/// (`Workspace::bytes`, `PrefillScratch::bytes`) against what allocating them took.
pub fn check_workspace_bytes(dev: &GpuDevice) -> Result<Vec<CaseResult>, GpuError> {
    use specmla_gpu::workspace::{PrefillScratch, Workspace};
    use std::sync::atomic::Ordering::Relaxed;
    let mut wide = ModelDims::deepseek_v3_attn();
    wide.num_heads = 8;
    let mut out = Vec::new();
    for (name, d) in [
        ("tiny", ModelDims::tiny()),
        ("DeepSeek-V3 widths, 8 heads", wide),
    ] {
        for splits in [None, Some(3)] {
            let flash = splits.is_some();
            let dims = (37, 5, 11);
            let before = dev.allocated_bytes.load(Relaxed);
            let ws = Workspace::new(dev, &d, d.num_layers, dims, splits)?;
            let took = dev.allocated_bytes.load(Relaxed) - before;
            drop(ws);
            let want = Workspace::bytes(&d, d.num_layers, dims, splits);
            let before = dev.allocated_bytes.load(Relaxed);
            let sc = PrefillScratch::new(dev, &d, 29, flash)?;
            let took_sc = dev.allocated_bytes.load(Relaxed) - before;
            drop(sc);
            let ok = took == want && took_sc == PrefillScratch::bytes(&d, 29, flash);
            out.push(CaseResult {
                kernel: "workspace bytes",
                case: format!(
                    "{name}, flash splits {splits:?}: computed {want} B, allocated {took} B; \
                     prefill scratch {} B, allocated {took_sc} B",
                    PrefillScratch::bytes(&d, 29, flash)
                ),
                max_rel_err: if ok { 0.0 } else { 1.0 },
                passed: ok,
            });
        }
    }
    Ok(out)
}

pub fn run_dense(dev: &GpuDevice, k: &Kernels) -> Result<Vec<CaseResult>, GpuError> {
    let mut results = vec![check_round_bf16(dev, k, 450)?];
    results.extend(check_row_digest(dev, k, 460)?);
    results.push(check_gather_rows2(dev, k, 470)?);
    results.extend(check_workspace_bytes(dev)?);
    for (i, shape) in [(1, 64, 512), (37, 64, 96), (5, 128, 64), (3, 7168, 576)]
        .into_iter()
        .enumerate()
    {
        results.extend(check_matmul_norm(dev, k, shape, 300 + i as u64)?);
    }
    let tiny = MlaDims::from(&ModelDims::tiny());
    let dsv3 = MlaDims::from(&ModelDims::deepseek_v3());
    for (i, (d, n)) in [(tiny, 1), (tiny, 37), (dsv3, 3)].into_iter().enumerate() {
        results.extend(check_rope_mlp_absorb(dev, k, d, n, 400 + i as u64)?);
    }
    Ok(results)
}
