//! Timing of the bf16 prefill attention (`flash_prefill`) at DeepSeek-V3 widths: causal
//! self-attention of whole prompts and non-causal queries over a context chunk, the
//! shapes `gpu/tools/sdpa_peer.py` times PyTorch's SDPA (cuDNN) at.

use crate::bench::{time_us, BenchShape, Measurement};
use crate::checks_prefill::start_locs;
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::launch::Buf;
use specmla_gpu::ops::{FlashKernels, Kernels, PrefillBufs, PrefillShape, PREFILL_DQK, PREFILL_DV};

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

/// Times `flash_prefill` at `c` (hash-filled bf16 inputs).
pub fn bench_flash_prefill(
    dev: &GpuDevice,
    k: &Kernels,
    fk: &FlashKernels,
    c: PrefillCase,
    reps: usize,
) -> Result<Measurement, GpuError> {
    let (tq, tk) = (c.batch * c.q_len, c.batch * c.k_len);
    let bf16 = |n: usize, seed: u32, what: &str| -> Result<Buf<u16>, GpuError> {
        let b = Buf::<u16>::uninit(dev, n.max(1), what)?;
        k.fill_bf16_hash(dev, b.ptr(), b.len(), seed)?;
        Ok(b)
    };
    let q = bf16(tq * c.heads * PREFILL_DQK, 21, "prefill bench q")?;
    let kk = bf16(tk * c.heads * PREFILL_DQK, 22, "prefill bench k")?;
    let v = bf16(tk * c.heads * PREFILL_DV, 23, "prefill bench v")?;
    let out = Buf::<f32>::uninit(dev, (tq * c.heads * PREFILL_DV).max(1), "prefill bench out")?;
    let lse = Buf::<f32>::uninit(dev, (tq * c.heads).max(1), "prefill bench lse")?;
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
        k: kk.ptr(),
        v: v.ptr(),
        q_start_loc: ql.ptr(),
        k_start_loc: kl.ptr(),
        out: out.ptr(),
        lse: lse.ptr(),
    };
    let scale = 1.0 / (PREFILL_DQK as f32).sqrt();
    // SAFETY: equal rows, prefix sums built above (a causal case has q_len <= k_len).
    let t = time_us(dev, 2, reps, || unsafe {
        fk.flash_prefill(dev, s, bufs, scale)
    })?;
    Ok(Measurement {
        kernel: "prefill_flash",
        mode: if c.causal { "causal" } else { "noncausal" },
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
    })
}
