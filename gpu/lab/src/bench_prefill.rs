//! Timing of the bf16 prefill attention (`flash_prefill`) at DeepSeek-V3 widths: causal
//! self-attention of whole prompts and non-causal queries over a context chunk, the
//! shapes `gpu/tools/sdpa_peer.py` times PyTorch's SDPA (cuDNN) at; and the whole bf16
//! prefill path of a spec step (gather from the paged cache, up-projection, attention),
//! the honest peer of the decode path.

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use half::bf16;

use crate::bench::{time_interleaved_us, time_us, BenchShape, DecodeInputs, L2Scrub, Measurement};
use crate::checks_prefill::start_locs;
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::launch::Buf;
use specmla_gpu::ops::{
    FlashKernels, Kernels, PrefillBufs, PrefillKeyLayout, PrefillShape, PrefillTile, PREFILL_DQK,
    PREFILL_DV,
};

/// One prefill shape: `batch` rows of `q_len` queries over `k_len` keys each.
#[derive(Clone, Copy, Debug)]
pub struct PrefillCase {
    pub heads: usize,
    pub batch: usize,
    pub q_len: usize,
    pub k_len: usize,
    pub causal: bool,
}

impl PrefillCase {
    /// The shapes of the issue: causal B 1 x 4096, B 1 x 8192, B 4 x 2048; non-causal 64
    /// queries over 2048 keys; at `heads` heads.
    pub fn standard(heads: usize) -> Vec<PrefillCase> {
        let c = |batch, q_len, k_len, causal| PrefillCase {
            heads,
            batch,
            q_len,
            k_len,
            causal,
        };
        vec![
            c(1, 4096, 4096, true),
            c(1, 8192, 8192, true),
            c(4, 2048, 2048, true),
            c(1, 64, 2048, false),
        ]
    }

    /// The sweep around them, so the shapes draw as curves against keys per row: causal
    /// prompts of 1024, 2048 and 16384 tokens (with the standard 4096 and 8192); 64
    /// queries (a few verify rows' worth) over 512 to 16384 keys (with the standard
    /// 2048); a chunked prefill's 2048 new tokens over a context chunk of 2048 to 16384.
    pub fn sweep(heads: usize) -> Vec<PrefillCase> {
        let c = |q_len, k_len, causal| PrefillCase {
            heads,
            batch: 1,
            q_len,
            k_len,
            causal,
        };
        let mut cases: Vec<PrefillCase> = [1024, 2048, 16384].map(|n| c(n, n, true)).into();
        cases.extend([512, 1024, 4096, 8192, 16384].map(|k| c(64, k, false)));
        cases.extend([2048, 4096, 8192, 16384].map(|k| c(2048, k, false)));
        cases
    }

    /// Keys every query of a row sees, summed over the row.
    fn pairs_per_row(&self) -> f64 {
        if self.causal {
            let shift = self.k_len - self.q_len;
            (0..self.q_len).map(|i| (shift + i + 1) as f64).sum()
        } else {
            (self.q_len * self.k_len) as f64
        }
    }

    /// FLOPs: QK over 192 and PV over 128 for every (query, visible key) pair.
    pub fn flops(&self) -> f64 {
        (self.batch * self.heads) as f64 * self.pairs_per_row() * 2.0 * 320.0
    }

    /// Bytes: Q, K, V read and the output written once, bf16.
    pub fn bytes(&self) -> f64 {
        let per_row = self.q_len * (PREFILL_DQK + PREFILL_DV) + self.k_len * 320;
        (self.batch * self.heads * per_row * 2) as f64
    }
}

/// The CSV mode of each variant, causal and not.
const MODES: [(PrefillTile, &str, &str); 3] = [
    (PrefillTile::Rows64, "causal", "noncausal"),
    (PrefillTile::Rows128, "causal/wide", "noncausal/wide"),
    (PrefillTile::Tma128, "causal/tma", "noncausal/tma"),
];

/// Times `flash_prefill` at `c` (hash-filled bf16 inputs) with each CTA size, the two
/// interleaved round by round; modes `causal` / `noncausal`, `/wide` for 128-query CTAs,
/// `/tma` for the TMA kernel (on sm_90a).
pub fn bench_flash_prefill(
    dev: &GpuDevice,
    k: &Kernels,
    fk: &FlashKernels,
    c: PrefillCase,
    reps: usize,
    scrub: Option<&L2Scrub>,
) -> Result<Vec<Measurement>, GpuError> {
    let (tq, tk) = (c.batch * c.q_len, c.batch * c.k_len);
    let bf16 = |n: usize, seed: u32, what: &str| -> Result<Buf<u16>, GpuError> {
        let b = Buf::<u16>::uninit(dev, n, what)?;
        k.fill_bf16_hash(dev, b.ptr(), b.len(), seed)?;
        Ok(b)
    };
    let q = bf16(tq * c.heads * PREFILL_DQK, 21, "prefill bench q")?;
    let k_nope = bf16(tk * c.heads * 128, 22, "prefill bench k_nope")?;
    let k_rope = bf16(tk * 64, 24, "prefill bench k_rope")?;
    let v = bf16(tk * c.heads * PREFILL_DV, 23, "prefill bench v")?;
    let out = Buf::<f32>::uninit(dev, tq * c.heads * PREFILL_DV, "prefill bench out")?;
    let lse = Buf::<f32>::uninit(dev, tq * c.heads, "prefill bench lse")?;
    let ql = Buf::from_host(
        dev,
        &start_locs((0..c.batch).map(|_| c.q_len)),
        "q_start_loc",
    )?;
    let kl = Buf::from_host(
        dev,
        &start_locs((0..c.batch).map(|_| c.k_len)),
        "k_start_loc",
    )?;
    let s = PrefillShape {
        batch: c.batch,
        heads: c.heads,
        max_q_len: c.q_len,
        total_q: tq,
        total_k: tk,
        causal: c.causal,
    };
    let bufs = PrefillBufs {
        q: q.ptr(),
        k_nope: k_nope.ptr(),
        k_rope: k_rope.ptr(),
        v: v.ptr(),
        layout: PrefillKeyLayout::separate(c.heads),
        q_start_loc: ql.ptr(),
        k_start_loc: kl.ptr(),
        out: out.ptr(),
        lse: lse.ptr(),
    };
    let scale = 1.0 / (PREFILL_DQK as f32).sqrt();
    let tiles: Vec<PrefillTile> = PrefillTile::ALL
        .into_iter()
        .filter(|t| !t.hopper() || fk.wide.hopper())
        .collect();
    let mut runs: Vec<Box<dyn FnMut() -> Result<(), GpuError> + '_>> = tiles
        .iter()
        .map(|&tile| {
            // SAFETY: equal rows, prefix sums built above (a causal case has q_len <= k_len).
            Box::new(move || unsafe { fk.flash_prefill_with(tile, dev, s, bufs, scale) })
                as Box<dyn FnMut() -> Result<(), GpuError> + '_>
        })
        .collect();
    let mut refs: Vec<&mut dyn FnMut() -> Result<(), GpuError>> =
        runs.iter_mut().map(|r| &mut **r as _).collect();
    let times = time_interleaved_us(dev, 2, reps, scrub, &mut refs)?;
    let mode = |t: PrefillTile| {
        let (_, causal, noncausal) = MODES.iter().find(|m| m.0 == t).expect("every variant");
        if c.causal {
            *causal
        } else {
            *noncausal
        }
    };
    Ok(times
        .into_iter()
        .zip(tiles.into_iter().map(mode))
        .map(|(t, mode)| Measurement {
            kernel: "prefill_flash",
            mode,
            shape: Some(BenchShape {
                heads: c.heads,
                q_len: c.q_len,
                batch: c.batch,
                context: c.k_len,
                page: 0,
            }),
            time_us: t,
            bytes: c.bytes(),
            flops: c.flops(),
            sm_mhz: None,
        })
        .collect())
}

/// The bf16 prefill path a SingleOnly backend runs a spec step's verify rows through, at
/// `s` (q_len verify tokens per request, `context` keys each, the new ones included):
/// gather every row's latent rows from the paged cache, up-project them to per-head K
/// nope and V with cuBLAS (`[keys, 512] x [512, heads * 256]`, bf16, f32 accumulate), then
/// one causal `flash_prefill` (each row's queries are its keys' tail). Times the three
/// together; FLOPs count the up-projection and the attention.
pub fn bench_prefill_spec_step(
    dev: &GpuDevice,
    (kernels, fk): (&Kernels, &FlashKernels),
    inp: &DecodeInputs,
    reps: usize,
) -> Result<Measurement, GpuError> {
    let s = inp.shape;
    let (h, keys, tq) = (s.heads, s.batch * s.context, s.batch * s.q_len);
    let blas = CudaBlas::new(Arc::clone(&dev.stream))
        .map_err(|e| GpuError::NoDevice(format!("cuBLAS could not be loaded: {e:?}")))?;
    let latent = Buf::<bf16>::uninit(dev, keys * 576, "spec-step gathered latent")?;
    let w = Buf::<bf16>::uninit(dev, 512 * h * 256, "spec-step W_UK|W_UV")?;
    kernels.fill_bf16_hash(dev, w.ptr().cast::<u16>(), w.len(), 41)?;
    let mut kv = Buf::<bf16>::uninit(dev, keys * h * 256, "spec-step K nope | V")?;
    let q = Buf::<u16>::uninit(dev, tq * h * PREFILL_DQK, "spec-step q")?;
    kernels.fill_bf16_hash(dev, q.ptr(), q.len(), 31)?;
    let out = Buf::<f32>::uninit(dev, tq * h * PREFILL_DV, "spec-step out")?;
    let lse = Buf::<f32>::uninit(dev, tq * h, "spec-step lse")?;
    let ql = Buf::from_host(
        dev,
        &start_locs((0..s.batch).map(|_| s.q_len)),
        "q_start_loc",
    )?;
    let kl = Buf::from_host(
        dev,
        &start_locs((0..s.batch).map(|_| s.context)),
        "k_start_loc",
    )?;
    let shape = PrefillShape {
        batch: s.batch,
        heads: h,
        max_q_len: s.q_len,
        total_q: tq,
        total_k: keys,
        causal: true,
    };
    // Column-major: kv^T [h * 256, keys] = W^T [h * 256, 512] x latent^T [512, keys],
    // the latent's first 512 of 576 columns.
    let cfg = GemmConfig {
        transa: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        m: (h * 256) as i32,
        n: keys as i32,
        k: 512,
        alpha: bf16::ONE,
        lda: (h * 256) as i32,
        ldb: 576,
        beta: bf16::ZERO,
        ldc: (h * 256) as i32,
    };
    let lat = latent.ptr().cast::<u16>();
    let scale = 1.0 / (PREFILL_DQK as f32).sqrt();
    let t = time_us(dev, 2, reps, || {
        // SAFETY: DecodeInputs' table covers every row's `context` keys with blocks inside
        // its cache; the start locations are equal rows' prefix sums.
        unsafe {
            fk.gather_latent_bf16(
                dev,
                inp.cache.ptr(),
                inp.block_table.ptr(),
                (kl.ptr(), None, None),
                (s.batch, inp.width, s.page, s.context),
                lat,
            )
        }?;
        // SAFETY: W, the latent and kv are the sizes cfg names.
        unsafe { blas.gemm(cfg, w.slice(), latent.slice(), kv.slice_mut()) }
            .map_err(|e| GpuError::NoDevice(format!("cuBLAS GEMM failed: {e:?}")))?;
        let kvp = kv.ptr().cast::<u16>();
        let bufs = PrefillBufs {
            q: q.ptr(),
            k_nope: kvp,
            k_rope: lat.offset(512),
            v: kvp.offset(128),
            layout: PrefillKeyLayout::up_projected(h),
            q_start_loc: ql.ptr(),
            k_start_loc: kl.ptr(),
            out: out.ptr(),
            lse: lse.ptr(),
        };
        // SAFETY: equal rows, q_len <= context.
        unsafe { fk.flash_prefill(dev, shape, bufs, scale) }
    })?;
    let case = PrefillCase {
        heads: h,
        batch: s.batch,
        q_len: s.q_len,
        k_len: s.context,
        causal: true,
    };
    Ok(Measurement {
        kernel: "prefill_flash_path",
        mode: "invariant",
        shape: Some(s),
        time_us: t,
        bytes: s.bytes(),
        flops: case.flops() + 2.0 * (keys * 512 * h * 256) as f64,
        sm_mhz: None,
    })
}
