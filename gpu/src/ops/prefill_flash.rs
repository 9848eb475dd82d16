//! The bf16 tensor-core prefill attention at DeepSeek-V3 widths (qk 192, v 128):
//! varlen rows in one launch, causal (a prefill row's new tokens over themselves) or not
//! (queries over a gathered context chunk, a DFlash block), returning the LSE
//! `[heads, tokens]` the merge reads. Compiled into the flash module
//! ([`FlashKernels::load`]), whose helpers it shares.

use cudarc::driver::LaunchConfig;

use super::FlashKernels;
use crate::device::{GpuDevice, GpuError};
use crate::launch::{launch_cfg, Arg, DPtr, TensorMap};

/// CUDA source of the prefill kernel, compiled after the decode kernels.
pub const FLASH_PREFILL_SRC: &str = include_str!("../../kernels/flash_prefill.cu");

/// Query/key width (128 nope + 64 rope) and value width the prefill kernel is built for.
pub const PREFILL_DQK: usize = 192;
pub const PREFILL_DV: usize = 128;
/// Whether a model's heads fit the prefill kernel (qk 128 + 64, v 128): where the flash
/// path takes prefill rows and DFlash blocks.
pub fn prefill_widths_fit(d: &specmla_core::config::ModelDims) -> bool {
    d.qk_nope_head_dim + d.qk_rope_head_dim == PREFILL_DQK
        && d.qk_rope_head_dim == 64
        && d.v_head_dim == PREFILL_DV
}

/// The prefill kernel variant: queries per CTA (16 per warp) and the tensor-core
/// instruction (mma.sync anywhere, wgmma on sm_90a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillTile {
    /// `flash_prefill`: 64 queries, 4 warps, mma.sync.
    Rows64,
    /// `flash_prefill_wide`: 128 queries, 8 warps sharing each K and V tile.
    Rows128,
    /// `flash_prefill_tma`: 128 queries over 128-key tiles, the copy engine (TMA) feeding
    /// two consumer warpgroups from a producer warpgroup, each tile's softmax overlapped
    /// with the previous tile's P V (sm_90a). Needs [`PrefillKeyLayout::tma_ok`].
    Tma128,
}

impl PrefillTile {
    pub const ALL: [PrefillTile; 3] = [
        PrefillTile::Rows64,
        PrefillTile::Rows128,
        PrefillTile::Tma128,
    ];

    /// The CUDA function.
    pub fn function(self) -> &'static str {
        match self {
            PrefillTile::Rows64 => "flash_prefill",
            PrefillTile::Rows128 => "flash_prefill_wide",
            PrefillTile::Tma128 => "flash_prefill_tma",
        }
    }

    /// Whether it needs sm_90a (wgmma).
    pub fn hopper(self) -> bool {
        self == PrefillTile::Tma128
    }

    /// Queries per CTA.
    pub fn rows(self) -> usize {
        match self {
            PrefillTile::Rows64 => 64,
            PrefillTile::Rows128 | PrefillTile::Tma128 => 128,
        }
    }

    /// The variant for a launch whose longest row has `max_q_len` queries: the TMA kernel
    /// where it can run (`tma`: sm_90a and a [`PrefillKeyLayout::tma_ok`] layout), the
    /// fastest at every shape measured on an H100, 64 queries over 2048 keys included
    /// (there half of each CTA idles and it still beats 64-query CTAs by 1.2x). Else
    /// mma.sync with 128-query CTAs from 2048 queries up, where sharing each K and V tile
    /// between 8 warps measured 2-9% faster, 64 below. Neither choice changes a row's
    /// bits within the mma.sync family (`gpu-test`), and a TMA launch's rows never read
    /// each other's keys.
    pub fn for_queries(max_q_len: usize, tma: bool) -> Self {
        match (tma, max_q_len >= 2048) {
            (true, _) => PrefillTile::Tma128,
            (false, true) => PrefillTile::Rows128,
            (false, false) => PrefillTile::Rows64,
        }
    }

    /// Threads per CTA: 16 queries per warp; the TMA kernel's two consumer warpgroups and
    /// its producer warpgroup.
    pub fn threads(self) -> usize {
        match self {
            PrefillTile::Tma128 => 384,
            _ => 2 * self.rows(),
        }
    }

    /// Shared memory (the kernel's FP_SMEM_BYTES, FT_SMEM_BYTES): the Q tile and two
    /// stages of K and V tiles (64 keys; 128 in the TMA kernel), bf16; the TMA kernel's
    /// aligned to 1024 bytes (the swizzle's anchor), then its 16 mbarrier slots.
    pub fn smem_bytes(self) -> usize {
        let tiles =
            |keys: usize| (self.rows() * PREFILL_DQK + 2 * keys * (PREFILL_DQK + PREFILL_DV)) * 2;
        match self {
            PrefillTile::Rows64 | PrefillTile::Rows128 => tiles(64),
            PrefillTile::Tma128 => 1024 + tiles(128) + 16 * 8,
        }
    }
}

/// One prefill attention launch: `batch` rows of up to `max_q_len` queries each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillShape {
    pub batch: usize,
    pub heads: usize,
    pub max_q_len: usize,
    /// Queries over all rows (`q_start_loc[batch]`).
    pub total_q: usize,
    /// Keys over all rows (`k_start_loc[batch]`).
    pub total_k: usize,
    /// Query i of a row of q queries over k keys sees keys below `k - q + i + 1`; else
    /// every key of its row.
    pub causal: bool,
}

/// Where key j of head h lives, in elements: its 128 nope values at
/// `j * k_nope_row + h * k_nope_head`, its 64 rope values (shared by every head, as MLA
/// has them) at `j * k_rope_row`, its 128 values at `j * v_row + h * v_head`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillKeyLayout {
    pub k_nope_row: usize,
    pub k_nope_head: usize,
    pub k_rope_row: usize,
    pub v_row: usize,
    pub v_head: usize,
}

impl PrefillKeyLayout {
    /// `k_nope [keys, heads, 128]`, `k_rope [keys, 64]`, `v [keys, heads, 128]`.
    pub fn separate(heads: usize) -> Self {
        Self {
            k_nope_row: heads * 128,
            k_nope_head: 128,
            k_rope_row: 64,
            v_row: heads * 128,
            v_head: 128,
        }
    }

    /// The up-projection's output `[keys, heads, 128 nope | 128 v]` (k_nope at offset 0,
    /// v at offset 128 of the same buffer) and the rope part of gathered latent rows
    /// `[keys, 576]` (at offset 512).
    pub fn up_projected(heads: usize) -> Self {
        Self {
            k_nope_row: heads * 256,
            k_nope_head: 256,
            k_rope_row: 576,
            v_row: heads * 256,
            v_head: 256,
        }
    }

    /// Whether the copy engine can read keys laid out so ([`PrefillTile::Tma128`]): every
    /// row stride and head offset a multiple of 8 elements (16 bytes), the rope part no
    /// wider than its row.
    pub fn tma_ok(&self) -> bool {
        [
            self.k_nope_row,
            self.k_nope_head,
            self.k_rope_row,
            self.v_row,
            self.v_head,
        ]
        .iter()
        .all(|x| x.is_multiple_of(8))
            && self.k_rope_row >= 64
    }

    /// Elements a buffer must hold for `keys` keys of `heads` heads, given its row and
    /// head strides and the width read at each.
    fn span(keys: usize, heads: usize, row: usize, head: usize, width: usize) -> usize {
        if keys == 0 {
            0
        } else {
            (keys - 1) * row + (heads - 1) * head + width
        }
    }
}

/// Device buffers of one prefill attention launch.
#[derive(Clone, Copy, Debug)]
pub struct PrefillBufs {
    /// `[total_q, heads, 192]` bf16.
    pub q: DPtr<u16>,
    /// Keys and values, bf16, laid out as `layout` says.
    pub k_nope: DPtr<u16>,
    pub k_rope: DPtr<u16>,
    pub v: DPtr<u16>,
    pub layout: PrefillKeyLayout,
    /// `[batch + 1]` prefix sums of the rows' query counts.
    pub q_start_loc: DPtr<i32>,
    /// `[batch + 1]` prefix sums of the rows' key counts.
    pub k_start_loc: DPtr<i32>,
    /// `[total_q, heads, 128]`.
    pub out: DPtr<f32>,
    /// `[heads, total_q]`, natural log; -inf (output 0) for a query that sees no key.
    pub lse: DPtr<f32>,
}

/// Whether `q_start_loc` and `k_start_loc` describe `s`: both start at 0, never
/// decrease, end at the totals; no row has more than `max_q_len` queries; a causal row
/// has at least as many keys as queries. What [`FlashKernels::flash_prefill`] trusts.
pub fn prefill_rows_valid(s: &PrefillShape, q_start_loc: &[i32], k_start_loc: &[i32]) -> bool {
    let ok = |loc: &[i32], total: usize| {
        loc.len() == s.batch + 1
            && loc[0] == 0
            && loc.windows(2).all(|w| w[0] <= w[1])
            && loc[s.batch] as usize == total
    };
    ok(q_start_loc, s.total_q)
        && ok(k_start_loc, s.total_k)
        && (0..s.batch).all(|b| {
            let q = (q_start_loc[b + 1] - q_start_loc[b]) as usize;
            let k = (k_start_loc[b + 1] - k_start_loc[b]) as usize;
            q <= s.max_q_len && (!s.causal || q <= k)
        })
}

impl FlashKernels {
    /// Prefill attention of every row of `s` in one launch, with the CTA size
    /// [`PrefillTile::for_queries`] picks; `scale` is the softmax scale.
    ///
    /// # Safety
    /// The device copies of `q_start_loc` and `k_start_loc` pass [`prefill_rows_valid`]
    /// for `s`: the kernel reads the rows they name, unchecked.
    pub unsafe fn flash_prefill(
        &self,
        dev: &GpuDevice,
        s: PrefillShape,
        b: PrefillBufs,
        scale: f32,
    ) -> Result<(), GpuError> {
        let tma = self.wide.hopper() && b.layout.tma_ok();
        let tile = PrefillTile::for_queries(s.max_q_len, tma);
        // SAFETY: the caller's promise, forwarded.
        unsafe { self.flash_prefill_with(tile, dev, s, b, scale) }
    }

    /// [`Self::flash_prefill`] with CTAs of `tile`.
    ///
    /// # Safety
    /// As [`Self::flash_prefill`].
    pub unsafe fn flash_prefill_with(
        &self,
        tile: PrefillTile,
        dev: &GpuDevice,
        s: PrefillShape,
        b: PrefillBufs,
        scale: f32,
    ) -> Result<(), GpuError> {
        assert!(scale.is_finite() && scale > 0.0, "softmax scale {scale}");
        let (l, keys, heads) = (b.layout, s.total_k, s.heads);
        b.q.need(s.total_q * s.heads * PREFILL_DQK);
        b.k_nope.need(PrefillKeyLayout::span(
            keys,
            heads,
            l.k_nope_row,
            l.k_nope_head,
            128,
        ));
        b.k_rope
            .need(PrefillKeyLayout::span(keys, 1, l.k_rope_row, 0, 64));
        b.v.need(PrefillKeyLayout::span(
            keys, heads, l.v_row, l.v_head, PREFILL_DV,
        ));
        b.q_start_loc.need(s.batch + 1);
        b.k_start_loc.need(s.batch + 1);
        b.out.need(s.total_q * s.heads * PREFILL_DV);
        b.lse.need(s.total_q * s.heads);
        if s.batch == 0 || s.max_q_len == 0 {
            return Ok(());
        }
        let mut args: Vec<Arg> = vec![
            b.q.into(),
            b.k_nope.into(),
            b.k_rope.into(),
            b.v.into(),
            b.q_start_loc.into(),
            b.k_start_loc.into(),
            b.out.into(),
            b.lse.into(),
            s.heads.into(),
            s.total_q.into(),
            usize::from(s.causal).into(),
            (scale * std::f32::consts::LOG2_E).into(),
            Arg::I64(l.k_nope_row as i64),
            l.k_nope_head.into(),
            Arg::I64(l.k_rope_row as i64),
            Arg::I64(l.v_row as i64),
            l.v_head.into(),
        ];
        let q_blocks = s.max_q_len.div_ceil(tile.rows()) as u32;
        if tile == PrefillTile::Tma128 {
            args.extend(Self::prefill_maps(s, &b)?.map(Arg::Map));
        }
        let cfg = LaunchConfig {
            grid_dim: (q_blocks, s.heads as u32, s.batch as u32),
            block_dim: (tile.threads() as u32, 1, 1),
            shared_mem_bytes: tile.smem_bytes() as u32,
        };
        let name = tile.function();
        assert!(!tile.hopper() || self.wide.hopper(), "{name} needs sm_90a");
        // SAFETY: argument list matches the kernel; sizes checked above; the caller's
        // start locations name rows inside them.
        unsafe { launch_cfg(dev, &self.fns[name], name, cfg, &args) }
    }
}

impl FlashKernels {
    /// The TMA kernel's views of q, k_nope, k_rope and v: 2-D arrays of rows (tokens) in
    /// 64 x 128 boxes. With no keys, the key maps repeat q's (no key box is read).
    fn prefill_maps(s: PrefillShape, b: &PrefillBufs) -> Result<[TensorMap; 4], GpuError> {
        let l = b.layout;
        assert!(
            l.tma_ok(),
            "flash_prefill_tma: key layout {l:?} is not 16-byte strided"
        );
        let boxes = (64, 128);
        let width = s.heads * PREFILL_DQK;
        let q = TensorMap::bf16_strided(b.q, width, s.total_q, width, boxes)?;
        if s.total_k == 0 {
            return Ok([q; 4]);
        }
        let head_cols = |head: usize, w: usize| (s.heads - 1) * head + w;
        Ok([
            q,
            TensorMap::bf16_strided(
                b.k_nope,
                head_cols(l.k_nope_head, 128),
                s.total_k,
                l.k_nope_row,
                boxes,
            )?,
            TensorMap::bf16_strided(b.k_rope, 64, s.total_k, l.k_rope_row, boxes)?,
            TensorMap::bf16_strided(
                b.v,
                head_cols(l.v_head, PREFILL_DV),
                s.total_k,
                l.v_row,
                boxes,
            )?,
        ])
    }

    /// `out[k_start_loc[b] + j]` = the latent row `[576]` of position `start + j` of row
    /// b, for every j below the row's length, gathered from the paged bf16 `cache`
    /// through `block_table` `[batch, width]`. `start` is `ctx_start[b]` (device,
    /// `[batch]`), or 0 without it; the length is `ctx_len[b]`, or without it the row's
    /// key count. A position past the table's width or on a -1 entry gathers NaN (the
    /// missing-block rule of the f32 `gather_context`).
    ///
    /// # Safety
    /// `k_start_loc` (device, `[batch + 1]`) is non-decreasing from 0 to `out`'s row
    /// count, no row's length exceeds `max_len` or its key count, and every table entry
    /// a row's positions reach is -1 or names a block inside `cache`: the kernel reads
    /// and writes where they say.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather_latent_bf16(
        &self,
        dev: &GpuDevice,
        cache: DPtr<u16>,
        block_table: DPtr<i32>,
        (k_start_loc, ctx_start, ctx_len): (DPtr<i32>, Option<DPtr<i32>>, Option<DPtr<i32>>),
        (batch, width, page, max_len): (usize, usize, usize, usize),
        out: DPtr<u16>,
    ) -> Result<(), GpuError> {
        block_table.need(batch * width);
        k_start_loc.need(batch + 1);
        if batch == 0 || max_len == 0 {
            return Ok(());
        }
        let per_row = |p: Option<DPtr<i32>>| match p {
            Some(p) => p.need(batch).into(),
            None => Arg::Ptr(0),
        };
        let args: [Arg; 8] = [
            cache.into(),
            block_table.into(),
            k_start_loc.into(),
            per_row(ctx_start),
            per_row(ctx_len),
            width.into(),
            page.into(),
            out.into(),
        ];
        let cfg = LaunchConfig {
            grid_dim: (max_len as u32, batch as u32, 1),
            block_dim: (96, 1, 1),
            shared_mem_bytes: 0,
        };
        let name = "gather_latent_bf16";
        // SAFETY: argument list matches the kernel; the caller's promise covers the rows.
        unsafe { launch_cfg(dev, &self.fns[name], name, cfg, &args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels' own formulas are compared with these sizes when the module compiles
    /// (`smem_asserts` in ops/flash.rs).
    #[test]
    fn the_prefill_kernels_fit_in_shared_memory() {
        assert_eq!(PrefillTile::Rows64.smem_bytes(), 106_496);
        assert_eq!(PrefillTile::Rows128.smem_bytes(), 131_072);
        assert_eq!(PrefillTile::Tma128.smem_bytes(), 214_144);
        assert!(PrefillTile::ALL.iter().all(|t| t.smem_bytes() <= 232_448));
    }

    #[test]
    fn start_locations_are_validated() {
        let s = PrefillShape {
            batch: 2,
            heads: 1,
            max_q_len: 3,
            total_q: 5,
            total_k: 7,
            causal: true,
        };
        assert!(prefill_rows_valid(&s, &[0, 2, 5], &[0, 3, 7]));
        // A causal row with fewer keys than queries, a row past max_q_len, a bad total.
        assert!(!prefill_rows_valid(&s, &[0, 2, 5], &[0, 1, 7]));
        assert!(!prefill_rows_valid(&s, &[0, 1, 5], &[0, 3, 7]));
        assert!(!prefill_rows_valid(&s, &[0, 2, 4], &[0, 3, 7]));
        assert!(!prefill_rows_valid(&s, &[1, 2, 5], &[0, 3, 7]));
    }
}
