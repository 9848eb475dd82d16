//! The portable chunked prefill of one row, written once: the row's new tokens expanded
//! by `W_UK`/`W_UV` and attended causally over themselves; each context chunk gathered
//! from the paged cache, expanded, attended non-causally and merged by LSE into the
//! accumulator; the new tokens' state merged in last (where F1 reads its LSE
//! transposed). The backend's portable prefill path, `gpu-test`'s check against f64 and
//! `gpu-bench`'s peer all run this sequence, so what is checked and timed is what runs.

use super::{Kernels, KeyBufs, MlaDims, State};
use crate::device::{GpuDevice, GpuError};
use crate::launch::DPtr;

/// A request's context in the paged latent cache.
#[derive(Clone, Copy, Debug)]
pub struct PagedContext {
    /// The latent cache `[slots, latent]`.
    pub cache: DPtr<f32>,
    /// The row's block table.
    pub row_table: DPtr<i32>,
    pub page: usize,
}

/// One context chunk of a row: positions `start..start + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextChunk {
    pub start: usize,
    pub len: usize,
}

/// Scratch for [`Kernels::chunked_prefill_row`], each sized for the most keys or queries
/// one call handles: `keys [n, latent]`, `k_nope [n, heads, nope]`, `v [n, heads, dv]`,
/// and two attention states (`new`, `part`) of `[m, heads, dv]` and `[heads, m]`.
#[derive(Clone, Copy, Debug)]
pub struct RowScratch {
    pub keys: DPtr<f32>,
    pub k_nope: DPtr<f32>,
    pub v: DPtr<f32>,
    pub new: State,
    pub part: State,
}

/// The row's queries and new tokens.
#[derive(Clone, Copy, Debug)]
pub struct RowTokens {
    /// `[m, heads, nope + rope]`.
    pub q: DPtr<f32>,
    /// The new tokens' latent rows `[m, latent]`.
    pub latent: DPtr<f32>,
    pub m: usize,
}

impl Kernels {
    /// Attention of one prefill row into `acc` (`out [m, heads, dv]`, `lse [heads, m]`),
    /// over its context `chunks` and its new tokens; `f1` reads the new tokens' LSE
    /// transposed in the last merge (the catalog's F1).
    ///
    /// # Safety
    /// Every entry of `ctx.row_table` that the chunks reach names a block inside
    /// `ctx.cache`, or is -1 (gathered as NaN).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn chunked_prefill_row(
        &self,
        dev: &GpuDevice,
        md: MlaDims,
        (w_uk, w_uv): (DPtr<f32>, DPtr<f32>),
        row: RowTokens,
        (ctx, chunks): (PagedContext, &[ContextChunk]),
        sc: RowScratch,
        acc: State,
        f1: bool,
    ) -> Result<(), GpuError> {
        let m = row.m;
        let expand = |latent: DPtr<f32>, n: usize| -> Result<KeyBufs, GpuError> {
            self.expand(dev, md, latent, w_uk, w_uv, sc.k_nope, sc.v, n)?;
            Ok(KeyBufs {
                k_nope: sc.k_nope,
                latent,
                v: sc.v,
                n,
            })
        };
        let new_keys = expand(row.latent, m)?;
        self.attend(dev, md, row.q, m, new_keys, true, sc.new)?;
        self.fill(dev, acc.out, 0.0, m * md.heads * md.v)?;
        self.fill(dev, acc.lse, f32::NEG_INFINITY, m * md.heads)?;
        for ch in chunks.iter().filter(|ch| ch.len > 0) {
            // SAFETY: the table's entries as the caller promised.
            unsafe {
                self.gather_context(
                    dev,
                    ctx.cache,
                    ctx.row_table,
                    sc.keys,
                    ch.start,
                    ch.len,
                    ctx.page,
                    md.latent(),
                )
            }?;
            let keys = expand(sc.keys, ch.len)?;
            self.attend(dev, md, row.q, m, keys, false, sc.part)?;
            self.merge(dev, md, acc, sc.part, m, false)?;
        }
        self.merge(dev, md, acc, sc.new, m, f1)
    }
}
