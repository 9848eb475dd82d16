//! Checks of the bf16 path's cuBLASLt GEMMs at every projection shape of the real-width
//! model (DeepSeek-V3 attention widths, one rank): values against an f64 product of the
//! same bf16 inputs, and batch invariance across row counts: under the pinned
//! algorithms, row `r` of `X[:M] W` must equal row `r` of `X[:M_max] W` bit for bit for
//! every M. The heuristic algorithms are measured the same way and reported (the M at
//! which their bits first change), not checked: they are not meant to be invariant.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::checks::{bf16_vec, upload, CaseResult};
use specmla_core::config::ModelDims;
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::launch::Buf;
use specmla_gpu::ops::{Gemm, GemmAlgo, GemmShape};

/// Error of the GEMMs against f64 on the same bf16 inputs, relative to max(|want|, 1):
/// f32 accumulation over up to 16384 products in the kernel's order.
pub const GEMM_TOL: f64 = 1e-4;

/// The row counts the invariance cases compare: around every power of two up to
/// [`MAX_ROWS`], where cuBLAS's heuristic changes its tiles and split-K.
const ROWS: [usize; 19] = [
    1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 63, 64, 65, 127, 128, 129, 255, 256,
];
const MAX_ROWS: usize = 640;

/// One projection of the model: a name and its shape at `m` rows.
struct Projection {
    name: &'static str,
    shape: fn(&ModelDims, usize) -> GemmShape,
}

fn linear(m: usize, k: usize, n: usize) -> GemmShape {
    GemmShape::linear(m, k, n, k)
}

/// Every GEMM the bf16 path runs, as the backend shapes it (`layers.rs`).
const PROJECTIONS: [Projection; 11] = [
    Projection {
        name: "q_a",
        shape: |d, m| linear(m, d.hidden_size, d.q_lora_rank),
    },
    Projection {
        name: "q_b",
        shape: |d, m| linear(m, d.q_lora_rank, d.num_heads * d.qk_head_dim()),
    },
    Projection {
        name: "kv_a",
        shape: |d, m| linear(m, d.hidden_size, d.latent_dim()),
    },
    Projection {
        name: "o_proj",
        shape: |d, m| linear(m, d.num_heads * d.v_head_dim, d.hidden_size),
    },
    Projection {
        name: "gate/up",
        shape: |d, m| linear(m, d.hidden_size, d.intermediate_size),
    },
    Projection {
        name: "down",
        shape: |d, m| linear(m, d.intermediate_size, d.hidden_size),
    },
    Projection {
        name: "lm_head",
        shape: |d, m| linear(m, d.hidden_size, d.vocab_size),
    },
    Projection {
        name: "fc",
        shape: |d, m| linear(m, 2 * d.hidden_size, d.hidden_size),
    },
    Projection {
        name: "fc_ctx",
        shape: |d, m| linear(m, d.hidden_size, d.hidden_size),
    },
    Projection {
        name: "absorb W_UK",
        shape: absorb,
    },
    Projection {
        name: "up W_UV",
        shape: up_v,
    },
];

fn absorb(d: &ModelDims, m: usize) -> GemmShape {
    let (h, qk, lat) = (d.num_heads, d.qk_head_dim(), d.latent_dim());
    GemmShape {
        m,
        n: d.kv_lora_rank,
        k: d.qk_nope_head_dim,
        trans_a: true,
        lda: d.qk_nope_head_dim,
        ldb: h * qk,
        ldd: h * lat,
        batch: h,
        stride_a: d.kv_lora_rank * d.qk_nope_head_dim,
        stride_b: qk,
        stride_d: lat,
    }
}

fn up_v(d: &ModelDims, m: usize) -> GemmShape {
    let (h, lora, v) = (d.num_heads, d.kv_lora_rank, d.v_head_dim);
    GemmShape {
        m,
        n: v,
        k: lora,
        trans_a: false,
        lda: v,
        ldb: h * lora,
        ldd: h * v,
        batch: h,
        stride_a: lora * v,
        stride_b: lora,
        stride_d: v,
    }
}

/// Element `(row, col)` of a column-major matrix at `base` with leading dimension `ld`.
fn at(base: usize, ld: usize, row: usize, col: usize) -> usize {
    base + col * ld + row
}

/// `D = op(A) B (+ C)` in f64 on the columns (output rows) `cols` of `s`.
fn reference(
    s: &GemmShape,
    a: &[f32],
    b: &[f32],
    c: Option<&[f32]>,
    cols: &[usize],
) -> Vec<(usize, f64)> {
    let mut out = Vec::new();
    for bi in 0..s.batch {
        for &j in cols {
            for i in 0..s.n {
                let mut acc = 0f64;
                for kk in 0..s.k {
                    let ai = if s.trans_a {
                        at(bi * s.stride_a, s.lda, kk, i)
                    } else {
                        at(bi * s.stride_a, s.lda, i, kk)
                    };
                    acc += a[ai] as f64 * b[at(bi * s.stride_b, s.ldb, kk, j)] as f64;
                }
                let di = at(bi * s.stride_d, s.ldd, i, j);
                out.push((di, acc + c.map_or(0.0, |c| c[di] as f64)));
            }
        }
    }
    out
}

/// Random bf16 operands of `s` and a poisoned f32 output, with their host copies.
struct Operands {
    a: (Buf<u16>, Vec<f32>),
    b: (Buf<u16>, Vec<f32>),
    d_len: usize,
}

fn operands(dev: &GpuDevice, s: &GemmShape, seed: u64) -> Result<Operands, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (a_rows, a_cols) = if s.trans_a { (s.k, s.n) } else { (s.n, s.k) };
    let a_len = (s.batch - 1) * s.stride_a + (a_cols - 1) * s.lda + a_rows;
    let b_len = (s.batch - 1) * s.stride_b + (s.m - 1) * s.ldb + s.k;
    let d_len = (s.batch - 1) * s.stride_d + (s.m - 1) * s.ldd + s.n;
    let (ab, af) = bf16_vec(&mut rng, a_len, (3.0 / s.k as f32).sqrt());
    let (bb, bf) = bf16_vec(&mut rng, b_len, 1.0);
    Ok(Operands {
        a: (upload(dev, &ab)?, af),
        b: (upload(dev, &bb)?, bf),
        d_len,
    })
}

fn run(
    gemm: &Gemm,
    dev: &GpuDevice,
    s: GemmShape,
    o: &Operands,
    c: Option<&[f32]>,
) -> Result<Vec<f32>, GpuError> {
    let init = match c {
        Some(c) => c.to_vec(),
        None => vec![f32::NAN; o.d_len],
    };
    let d = upload(dev, &init)?;
    gemm.run(dev, s, o.a.0.ptr(), o.b.0.ptr(), d.ptr(), c.is_some())?;
    d.read(dev, o.d_len)
}

/// Values of each projection at 37 rows (plus a residual on o_proj and down, as the
/// backend adds one) against f64 on rows 0, 17 and 36.
fn check_values(dev: &GpuDevice, gemm: &Gemm, d: &ModelDims) -> Result<Vec<CaseResult>, GpuError> {
    let mut out = Vec::new();
    for (i, p) in PROJECTIONS.iter().enumerate() {
        let s = (p.shape)(d, 37);
        let o = operands(dev, &s, 300 + i as u64)?;
        let residual = matches!(p.name, "o_proj" | "down");
        let c: Option<Vec<f32>> =
            residual.then(|| (0..o.d_len).map(|j| (j % 7) as f32 - 3.0).collect());
        let got = run(gemm, dev, s, &o, c.as_deref())?;
        let err = reference(&s, &o.a.1, &o.b.1, c.as_deref(), &[0, 17, 36])
            .into_iter()
            .map(|(di, want)| {
                let g = got[di] as f64;
                if g.is_nan() {
                    f64::INFINITY
                } else {
                    (g - want).abs() / want.abs().max(1.0)
                }
            })
            .fold(0.0, f64::max);
        out.push(CaseResult {
            kernel: "gemm bf16",
            case: format!(
                "{} {}x{} @ {}x{}{}{}",
                p.name,
                s.m,
                s.k,
                s.k,
                s.n,
                if s.batch > 1 {
                    format!(" x {} heads", s.batch)
                } else {
                    String::new()
                },
                if residual { " + res" } else { "" }
            ),
            max_rel_err: err,
            passed: err <= GEMM_TOL,
        });
    }
    Ok(out)
}

/// The row counts of [`ROWS`] (and [`MAX_ROWS`]) at which row bits differ from the
/// `MAX_ROWS` product's, for projection `p` under `gemm`.
fn differing_rows(
    dev: &GpuDevice,
    gemm: &Gemm,
    d: &ModelDims,
    p: &Projection,
    seed: u64,
) -> Result<Vec<usize>, GpuError> {
    let full = (p.shape)(d, MAX_ROWS);
    let o = operands(dev, &full, seed)?;
    let want = run(gemm, dev, full, &o, None)?;
    let mut differ = Vec::new();
    for m in ROWS {
        let s = (p.shape)(d, m);
        let got = run(gemm, dev, s, &o, None)?;
        // D's first m columns span the same prefix of both buffers (elements between
        // heads are never written: NaN in both).
        let n = (s.batch - 1) * s.stride_d + (m - 1) * s.ldd + s.n;
        let same = got[..n]
            .iter()
            .zip(&want[..n])
            .all(|(g, w)| g.to_bits() == w.to_bits());
        if !same {
            differ.push(m);
        }
    }
    Ok(differ)
}

/// Values and invariance at every projection shape of the real-width model; the
/// heuristic's first differing M per shape comes back as notes for the report.
pub fn run_gemm(dev: &GpuDevice) -> Result<(Vec<CaseResult>, Vec<String>), GpuError> {
    let d = ModelDims::deepseek_v3_attn();
    let pinned = Gemm::new(dev, GemmAlgo::Invariant)?;
    let heuristic = Gemm::new(dev, GemmAlgo::Heuristic)?;
    let mut results = check_values(dev, &pinned, &d)?;
    let mut notes = Vec::new();
    for (i, p) in PROJECTIONS.iter().enumerate() {
        let seed = 400 + i as u64;
        let differ = differing_rows(dev, &pinned, &d, p, seed)?;
        results.push(CaseResult {
            kernel: "gemm invariance",
            case: format!(
                "{}: rows of M = 1..{} equal to M = {MAX_ROWS}'s (pinned){}",
                p.name,
                ROWS[ROWS.len() - 1],
                if differ.is_empty() {
                    String::new()
                } else {
                    format!("; differ at M {differ:?}")
                }
            ),
            max_rel_err: differ.len() as f64,
            passed: differ.is_empty(),
        });
        let h = differing_rows(dev, &heuristic, &d, p, seed)?;
        notes.push(format!(
            "heuristic {}: {}",
            p.name,
            match h.first() {
                None => format!("rows equal at every M up to {}", ROWS[ROWS.len() - 1]),
                Some(m) => format!(
                    "row bits change at M {m} (differ at {} of {} row counts)",
                    h.len(),
                    ROWS.len()
                ),
            }
        ));
    }
    Ok((results, notes))
}
