//! The bf16 tensor-core MLA decode at DeepSeek-V3 widths (576/512): the `mma.sync`
//! kernels, the Hopper wgmma kernels (first and seesaw schedule), their split merges and
//! launch plans. Compiled into a module of its own by [`FlashKernels::load`], so a
//! backend that never calls it never compiles it (nor reads its tuning variables).

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};

use crate::device::{GpuDevice, GpuError};
use crate::launch::{launch_cfg, launch_cluster, max_active_clusters, Arg, TensorMap, THREADS};
use crate::launch::{Buf, DPtr};
use specmla_core::split::{CtaOverhead, SplitSchedule};

/// The tensor-core decode's source, compiled on its own with its tile configuration.
pub const FLASH_SRC: &str = include_str!("../../kernels/flash_decode.cu");
/// CUDA source of the warpgroup-MMA decode (sm_90a), compiled into the same module.
pub const FLASH_WGMMA_SRC: &str = include_str!("../../kernels/flash_wgmma.cu");
/// CUDA source of the seesaw-scheduled warpgroup-MMA decode (sm_90a), after the above.
pub const FLASH_SEESAW_SRC: &str = include_str!("../../kernels/flash_seesaw.cu");

/// Latent width and value width the tensor-core decode is built for (DeepSeek-V3).
pub const FLASH_DIM: usize = 576;
pub const FLASH_DV: usize = 512;
/// Query rows (tokens x heads) per CTA of the tensor-core decode.
pub const FLASH_ROWS: usize = 64;
/// Largest dynamic shared memory a block may have on Hopper (227 KiB).
const MAX_SMEM_BYTES: usize = 232_448;

/// Shared memory of `flash_decode_wgmma` (its FW_SMEM_BYTES): 1024 bytes to align the
/// swizzled tiles, the Q tile and two 64-key tiles of 576 bf16, the P tile, row maxima,
/// the two tiles' mbarriers and the last-split flag.
const WGMMA_SMEM_BYTES: usize = 1024 + 3 * 64 * 576 * 2 + 64 * 128 + 2 * 64 * 4 + 2 * 8 + 16;

/// Shared memory of `flash_decode_seesaw` (its FS_SMEM_BYTES): the same tiles without the P
/// tile (probabilities go to a tile's rope block), two maxima and two row-sum rows, one
/// mbarrier per stage and 64-column block, one for a persistent CTA's later Q tiles, the
/// last-split flag (the copy warpgroup's reloads wait on named barriers).
const SEESAW_SMEM_BYTES: usize = 1024 + 3 * 64 * 576 * 2 + 4 * 64 * 4 + 19 * 8 + 16;
/// Threads of a `flash_decode_seesaw` CTA: two warpgroups of products, one of copies.
/// [`SEESAW_2WG`] has the first two only (256 threads).
pub(super) const SEESAW_THREADS: u32 = 384;
/// The seesaw kernel without the copy warpgroup (same body, `fs_decode<false>`).
const SEESAW_2WG: &str = "flash_decode_seesaw_2wg";
/// The seesaw kernel with the copy warpgroup: one split a request, a one-dimensional grid
/// of CTAs each taking every `gridDim.x`-th row block (`fs_decode<true>`); or a balanced
/// schedule's pieces, a CTA per part and row block (`flash_balanced.rs`).
pub(super) const SEESAW_PERSISTENT: &str = "flash_decode_seesaw";

/// Which kernel takes requests of more than 16 query rows (at most 16 take
/// `flash_decode_narrow`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WideKernel {
    /// `flash_decode_seesaw`: warpgroup MMA, the two warpgroups on alternate key tiles so
    /// one's softmax runs under the other's products (sm_90a). The default on Hopper.
    Seesaw,
    /// `flash_decode_wgmma`: warpgroup MMA straight from swizzled shared memory, both
    /// warpgroups on every tile (sm_90a); the peer the benchmark times beside the default.
    Wgmma,
    /// `flash_decode`: `mma.sync` with `ldmatrix`, any sm_80+ device; on Hopper the
    /// peer the benchmark times beside the default.
    Mma,
}

impl WideKernel {
    /// The CUDA function's name.
    pub fn function(self) -> &'static str {
        match self {
            Self::Seesaw => "flash_decode_seesaw",
            Self::Wgmma => "flash_decode_wgmma",
            Self::Mma => "flash_decode",
        }
    }

    /// What in this family's arithmetic a recording's bits depend on beyond its name, for
    /// the GPU backend's kernel fingerprint: it changes whenever the same inputs would give
    /// other bits, so a trace recorded before such a change does not replay as a divergence.
    pub fn numerics(self) -> &'static str {
        match self {
            // The running maximum moves only when a tile raises it past 8 (log2 units):
            // `raise_max` in flash_seesaw.cu.
            Self::Seesaw => "running max raised past 2^8",
            Self::Wgmma | Self::Mma => "exact running max",
        }
    }

    /// Whether this family needs sm_90a: warpgroup MMA and the copy engine (TMA), 64-key
    /// tiles, 256 or 384 threads, and its own split merge (no flash_combine).
    pub fn hopper(self) -> bool {
        self != Self::Mma
    }

    /// The row label the benchmark gives this family when it is not the default.
    pub fn peer_label(self) -> &'static str {
        match self {
            Self::Seesaw => "decode_seesaw",
            Self::Wgmma => "decode_wgmma",
            Self::Mma => "decode_mma",
        }
    }

    /// The CUDA function and threads a CTA for a launch of requests of `row_blocks` 64-row
    /// blocks each and a grid of `max_splits` splits a request (the launch's
    /// `FlashShape::max_splits`: the engine's graphs size it by the policy's cap, by
    /// default at least 2, so they take `_2wg`; its eager uniform target launches by
    /// core's `invariant_launch`, its other eager launches by their largest split count).
    /// The seesaw family has a persistent kernel with a copy
    /// warpgroup (384 threads) and one whose product warpgroups issue their own copies, a
    /// CTA a row block ([`SEESAW_2WG`], 256); both give the same bits. On the H100 the copy
    /// warpgroup was 2-5% faster at one split and four or more row blocks (q 2 and 4 at 128
    /// heads; runs 55 and 64) and 1-7% slower at several splits (short split CTAs and a
    /// merge; run 64). At two row blocks (q 1) it now wins at every batch measured, one row
    /// block a CTA included (runs 158 and 166, 3 rounds each, the order of the kernels
    /// reversed between them: B 48 and 64 at L 4k and B 64 at L 8k 1.5-4.8% faster; likely
    /// the L2 prefetch of a request's tiles by its row blocks, which `_2wg` has no
    /// warpgroup for, not traced). At one row block a request (16 heads) it
    /// was 19% slower with that prefetch (run 158), and 0.9-1.0% slower without it, which
    /// such requests now take (run 162), so `_2wg` keeps them. Three row blocks take the
    /// rule of two, unmeasured.
    pub fn launch_function(self, max_splits: usize, row_blocks: usize) -> (&'static str, u32) {
        match self {
            Self::Seesaw if max_splits == 1 && row_blocks >= 2 => (self.function(), SEESAW_THREADS),
            Self::Seesaw => (SEESAW_2WG, 256),
            _ => (self.function(), 256),
        }
    }

    /// Shared memory of a CTA of this family's kernel, where it is fixed (Hopper ones).
    fn smem_bytes(self) -> Option<usize> {
        match self {
            Self::Seesaw => Some(SEESAW_SMEM_BYTES),
            Self::Wgmma => Some(WGMMA_SMEM_BYTES),
            Self::Mma => None,
        }
    }
}

/// Tile configuration of `flash_decode`, fixed when the kernel is compiled (FD_KEYS,
/// FD_STAGES, FD_VPARTS). `SPECMLA_FLASH_CONFIG=keys,stages,vparts` overrides the default
/// for tuning runs; `gpu-bench` prints the one in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashConfig {
    /// Keys per tile.
    pub keys: usize,
    /// Tiles in flight (the pipeline depth, at least 2).
    pub stages: usize,
    /// Warps per 16-row group, each owning 512 / vparts V columns.
    pub vparts: usize,
}

impl Default for FlashConfig {
    fn default() -> Self {
        Self {
            keys: 64,
            stages: 2,
            vparts: 4,
        }
    }
}

impl FlashConfig {
    /// The default, or `SPECMLA_FLASH_CONFIG` when set.
    pub fn from_env() -> Result<Self, GpuError> {
        match std::env::var("SPECMLA_FLASH_CONFIG") {
            Ok(v) => Self::parse(&v)
                .map_err(|why| GpuError::NoDevice(format!("SPECMLA_FLASH_CONFIG={v:?}: {why}"))),
            Err(_) => Ok(Self::default()),
        }
    }

    /// `keys,stages,vparts`, checked.
    pub fn parse(v: &str) -> Result<Self, String> {
        let n: Vec<usize> = v
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .map_err(|_| "expected keys,stages,vparts such as 64,2,4".to_string())
            })
            .collect::<Result<_, _>>()?;
        let [keys, stages, vparts] = n[..] else {
            return Err("expected three numbers: keys,stages,vparts".into());
        };
        let c = Self {
            keys,
            stages,
            vparts,
        };
        c.check()?;
        Ok(c)
    }

    /// Why the kernel cannot be built this way, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if ![2, 4, 8].contains(&self.vparts) {
            return Err("vparts must be 2, 4 or 8".into());
        }
        if self.keys == 0 || !self.keys.is_multiple_of(16 * self.vparts) {
            return Err(format!(
                "keys must be a multiple of 16 * vparts = {}",
                16 * self.vparts
            ));
        }
        if self.stages < 2 {
            return Err("stages must be at least 2".into());
        }
        if self.smem_bytes() > MAX_SMEM_BYTES {
            return Err(format!(
                "needs {} bytes of shared memory, above {MAX_SMEM_BYTES}",
                self.smem_bytes()
            ));
        }
        Ok(())
    }

    /// 64 query rows and `stages` key tiles of 576 bf16 (swizzled, unpadded), four 16-row
    /// probability tiles, and the row groups' maxima.
    pub fn smem_bytes(&self) -> usize {
        (FLASH_ROWS + self.stages * self.keys) * 576 * 2
            + 4 * 16 * (self.keys + 8) * 2
            + 4 * self.vparts * 16 * 4
    }

    fn threads(&self) -> u32 {
        128 * self.vparts as u32
    }

    fn defines(&self) -> String {
        format!(
            "#define FD_KEYS {}\n#define FD_STAGES {}\n#define FD_VPARTS {}\n",
            self.keys, self.stages, self.vparts
        )
    }
}

/// `SPECMLA_FLASH_DEFINES=A,B`: macros defined before the flash kernels compile, for
/// tuning and diagnosis only. On the wgmma kernel `FW_NO_LOAD` drops the loads after the
/// first two tiles, `FW_NO_MMA` all tensor-core work, `FW_NO_QK` / `FW_NO_PV` one of the
/// two products (each gives wrong outputs: they time what is left); `FW_QK2` splits the
/// scores into two accumulator chains. On the seesaw kernel `FW_NO_LOAD` does the same,
/// `FS_GROUP_BARRIERS` puts back a warpgroup barrier before each release of blocks the
/// warpgroup's products read (by default the releasing warps' own waits, or on the
/// 2-warpgroup kernel the issuing thread's own wait),
/// `FS_BT_INPLACE` reads each block-table entry right at its copy instead of ahead of it,
/// and `FS_TRACE` has one CTA write its timeline over the split partials (`gpu-bench
/// --timeline`).
/// On both, `FW_NO_MERGE` leaves every split's partial unmerged, and `FW_DIRECT_STORE`
/// writes a one-split request's output straight from registers instead of through shared
/// memory and bulk copies. On a balanced launch `FS_NO_PARTIAL` drops the cut pieces'
/// partial stores and `FS_NO_COMBINE` the combine's work (its launch stays).
/// `FS_NO_L2_PREFETCH` leaves out the seesaw kernels' L2 prefetch of later key tiles,
/// `FS_PREFETCH_ONE_BLOCK` takes it at one row block a request too, and
/// `FS_SKIP_POISONED_ROWS` plants a fault for `gpu-test` to catch: the persistent seesaw
/// kernel leaves the rows that read a missing block unwritten.
fn diagnostic_defines() -> Result<String, GpuError> {
    match std::env::var("SPECMLA_FLASH_DEFINES") {
        Ok(v) => parse_defines(&v).map_err(GpuError::NoDevice),
        Err(_) => Ok(String::new()),
    }
}

/// The diagnostic switches the kernels know; anything else (a layout macro such as
/// `FD_KEYS`, which the host sizes shared memory from) is refused.
const DIAGNOSTIC_DEFINES: [&str; 25] = [
    "FW_NO_LOAD",
    "FS_QUAD_MAX",
    "FW_DIRECT_STORE",
    "FS_GROUP_BARRIERS",
    "FS_BT_INPLACE",
    "FS_TRACE",
    "FW_NO_MMA",
    "FW_NO_QK",
    "FW_NO_PV",
    "FW_NO_SOFTMAX",
    "FW_NO_PFENCE",
    "FW_NO_SYNC2",
    "FW_NO_MERGE",
    "FS_EXACT_MAX",
    "FS_TRACE_THIRD",
    "FT_NO_PINGPONG",
    "FS_NO_PARTIAL",
    "FS_NO_COMBINE",
    "FS_NO_L2_PREFETCH",
    "FS_SKIP_POISONED_ROWS",
    "FW_EVICT_FIRST",
    "FS_LOADS_ONLY",
    "FS_LOADS_HALF",
    "FS_LOADS_FREE",
    "FS_PREFETCH_ONE_BLOCK",
];

fn parse_defines(v: &str) -> Result<String, String> {
    let mut out = String::new();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !DIAGNOSTIC_DEFINES.contains(&name) && name != "FW_QK2" {
            return Err(format!(
                "SPECMLA_FLASH_DEFINES: {name:?} is not one of {}, FW_QK2",
                DIAGNOSTIC_DEFINES.join(", ")
            ));
        }
        out.push_str(&format!("#define {name} 1\n"));
    }
    Ok(out)
}

/// A split schedule on the device, `[batch]` each: what the flash decode kernels read to
/// know each request's splits and read bound (core's [`SplitSchedule`]).
pub struct FlashSchedule {
    pub split_lens: Buf<i32>,
    pub num_splits: Buf<i32>,
    pub mapped_kv_tokens: Buf<i32>,
}

impl FlashSchedule {
    /// Uploads `s`. Every split length must be a positive multiple of `unit` (the launch's
    /// [`FlashShape::split_size_tokens`]), as a schedule from a policy of that unit is:
    /// anything else is a caller bug, and panics.
    pub fn upload(dev: &GpuDevice, s: &SplitSchedule, unit: usize) -> Result<Self, GpuError> {
        let bad = s
            .split_len_tokens
            .iter()
            .find(|&&l| l == 0 || !(l as usize).is_multiple_of(unit));
        assert!(
            bad.is_none(),
            "split length {bad:?} is not a positive multiple of {unit}"
        );
        let up = |v: &[u32], what: &str| {
            let v: Vec<i32> = v
                .iter()
                .map(|&x| i32::try_from(x).expect("fits in i32"))
                .collect();
            Buf::from_host(dev, &v, what)
        };
        Ok(Self {
            split_lens: up(&s.split_len_tokens, "flash split lengths")?,
            num_splits: up(&s.num_splits, "flash split counts")?,
            mapped_kv_tokens: up(&s.mapped_kv_tokens, "flash mapped keys")?,
        })
    }
}

/// Shape of one tensor-core decode launch (bf16 cache, 576/512 widths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashShape {
    pub batch: usize,
    pub q_len: usize,
    pub heads: usize,
    pub page: usize,
    /// Block-table width.
    pub width: usize,
    /// The split policy's unit: every request's split length (in [`FlashBufs`]'s
    /// schedule) is a multiple of it, and it is a multiple of the kernel's keys per tile.
    pub split_size_tokens: usize,
    /// Most splits a request takes (the partial buffers hold that many, and a Hopper
    /// launch's clusters are this wide); a schedule entry above it is clamped.
    pub max_splits: usize,
}

impl FlashShape {
    /// Query rows (a row of the attention matrix: one token and one head) per request,
    /// token-major. Not a batch row, which is a request.
    pub fn query_rows(&self) -> usize {
        self.q_len * self.heads
    }
}

/// The element type of a decode's merged rows (`out`). Split partials and LSEs are f32
/// either way, and so is all arithmetic: a bf16 row is the f32 row rounded once, to
/// nearest even.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeOut {
    /// f32 rows: what the checks compare against the f64 reference.
    F32,
    /// bf16 bits (the module built with `FD_OUT_BF16`): what an engine's W_UV GEMM reads
    /// and FlashMLA writes, half the bytes of the f32 rows. The engine's build.
    Bf16,
}

impl DecodeOut {
    /// `SPECMLA_FLASH_OUT`: `f32` or `bf16` (the engine's, when unset).
    pub fn from_env() -> Result<Self, GpuError> {
        match std::env::var("SPECMLA_FLASH_OUT") {
            Ok(v) => Self::parse(&v)
                .map_err(|why| GpuError::NoDevice(format!("SPECMLA_FLASH_OUT={v:?}: {why}"))),
            Err(_) => Ok(Self::Bf16),
        }
    }

    pub fn parse(v: &str) -> Result<Self, String> {
        match v {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            _ => Err("expected f32 or bf16".into()),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }

    fn defines(self) -> &'static str {
        match self {
            Self::F32 => "",
            Self::Bf16 => "#define FD_OUT_BF16 1\n",
        }
    }
}

/// Where a decode writes its merged rows, `[batch, rows, 512]` of the build's
/// [`DecodeOut`].
#[derive(Clone, Copy, Debug)]
pub enum FlashOut {
    F32(DPtr<f32>),
    Bf16(DPtr<u16>),
}

impl FlashOut {
    pub fn dtype(&self) -> DecodeOut {
        match self {
            Self::F32(_) => DecodeOut::F32,
            Self::Bf16(_) => DecodeOut::Bf16,
        }
    }

    fn need(self, n: usize) -> Self {
        match self {
            Self::F32(p) => Self::F32(p.need(n)),
            Self::Bf16(p) => Self::Bf16(p.need(n)),
        }
    }
}

impl From<FlashOut> for Arg {
    fn from(o: FlashOut) -> Self {
        match o {
            FlashOut::F32(p) => p.into(),
            FlashOut::Bf16(p) => p.into(),
        }
    }
}

/// An owned [`FlashOut`].
pub enum FlashOutBuf {
    F32(Buf<f32>),
    Bf16(Buf<u16>),
}

impl FlashOutBuf {
    /// `len` values of `dtype`; with `poison`, each starts as that value (rounded to bf16).
    pub fn new(
        dev: &GpuDevice,
        dtype: DecodeOut,
        len: usize,
        poison: Option<f32>,
    ) -> Result<Self, GpuError> {
        let what = "flash outputs";
        Ok(match (dtype, poison) {
            (DecodeOut::F32, Some(v)) => Self::F32(Buf::from_host(dev, &vec![v; len], what)?),
            (DecodeOut::F32, None) => Self::F32(Buf::uninit(dev, len, what)?),
            (DecodeOut::Bf16, Some(v)) => {
                let bits = half::bf16::from_f32(v).to_bits();
                Self::Bf16(Buf::from_host(dev, &vec![bits; len], what)?)
            }
            (DecodeOut::Bf16, None) => Self::Bf16(Buf::uninit(dev, len, what)?),
        })
    }

    pub fn ptr(&self) -> FlashOut {
        match self {
            Self::F32(b) => FlashOut::F32(b.ptr()),
            Self::Bf16(b) => FlashOut::Bf16(b.ptr()),
        }
    }

    /// The values as f32 (a bf16 value widened exactly).
    pub fn read_f32(&self, dev: &GpuDevice) -> Result<Vec<f32>, GpuError> {
        Ok(match self {
            Self::F32(b) => b.read(dev, b.len())?,
            Self::Bf16(b) => b
                .read(dev, b.len())?
                .into_iter()
                .map(|x| f32::from_bits((x as u32) << 16))
                .collect(),
        })
    }
}

/// Device buffers of one tensor-core decode.
#[derive(Clone, Copy, Debug)]
pub struct FlashBufs {
    /// `[batch, rows, 576]` bf16.
    pub q: DPtr<u16>,
    /// `[slots, 576]` bf16.
    pub cache: DPtr<u16>,
    pub block_table: DPtr<i32>,
    pub seq_lens: DPtr<i32>,
    /// `[batch]`: keys each request's table maps before its first hole (core's
    /// `split::mapped_kv_tokens`). The kernels read nothing at or past it.
    pub mapped_kv_tokens: DPtr<i32>,
    /// `[batch]` each: the split schedule (split i of request b covers keys
    /// `[i * split_lens[b], (i + 1) * split_lens[b])` for i below `num_splits[b]`).
    pub split_lens: DPtr<i32>,
    pub num_splits: DPtr<i32>,
    /// `[max_splits, batch, rows, 512]`.
    pub o_part: DPtr<f32>,
    /// `[max_splits, batch, rows]`.
    pub lse_part: DPtr<f32>,
    /// `[batch, rows, 512]`, of the kernels' [`DecodeOut`].
    pub out: FlashOut,
    /// `[heads, batch * q_len]`: the f32 kernels' and the CPU reference's layout.
    pub lse: DPtr<f32>,
    /// `[batch, ceil(rows / 64)]` zeros: where a request's splits merge through global
    /// memory, the Hopper kernels count its finished splits here (the last one merges
    /// them) and leave them zero again.
    pub done: DPtr<i32>,
}

/// The outputs and scratch of one flash decode shape: split partials, the merged output
/// and its LSE, and the split counters (zeroed; the kernels re-arm them). Owned together
/// so their sizes stay tied to the shape they were made for.
pub struct FlashWorkspace {
    pub shape: FlashShape,
    pub o_part: Buf<f32>,
    pub lse_part: Buf<f32>,
    pub out: FlashOutBuf,
    pub lse: Buf<f32>,
    pub done: Buf<i32>,
}

impl FlashWorkspace {
    /// Allocates for `s`, the merged rows as `out` (the kernels' [`FlashKernels::out`]);
    /// with `poison`, every output buffer starts as that value (NaN in the checks, so a
    /// value the kernel never wrote shows).
    pub fn new(
        dev: &GpuDevice,
        s: FlashShape,
        out: DecodeOut,
        poison: Option<f32>,
    ) -> Result<Self, GpuError> {
        let rows = s.batch * s.query_rows();
        let f32_buf = |len: usize, what: &str| match poison {
            Some(v) => Buf::from_host(dev, &vec![v; len], what),
            None => Buf::uninit(dev, len, what),
        };
        Ok(Self {
            shape: s,
            o_part: f32_buf(s.max_splits * rows * FLASH_DV, "flash partial outputs")?,
            lse_part: f32_buf(s.max_splits * rows, "flash partial lse")?,
            out: FlashOutBuf::new(dev, out, rows * FLASH_DV, poison)?,
            lse: f32_buf(rows, "flash lse")?,
            done: Buf::from_host(
                dev,
                &vec![0i32; FlashBufs::done_len(&s)],
                "flash split counters",
            )?,
        })
    }

    /// A launch's buffers: these outputs, and the inputs given.
    pub fn bufs(
        &self,
        q: DPtr<u16>,
        cache: DPtr<u16>,
        block_table: DPtr<i32>,
        seq_lens: DPtr<i32>,
        schedule: &FlashSchedule,
    ) -> FlashBufs {
        FlashBufs {
            q,
            cache,
            block_table,
            seq_lens,
            mapped_kv_tokens: schedule.mapped_kv_tokens.ptr(),
            split_lens: schedule.split_lens.ptr(),
            num_splits: schedule.num_splits.ptr(),
            o_part: self.o_part.ptr(),
            lse_part: self.lse_part.ptr(),
            out: self.out.ptr(),
            lse: self.lse.ptr(),
            done: self.done.ptr(),
        }
    }
}

impl FlashBufs {
    /// Elements of [`Self::done`] for `s`.
    pub fn done_len(s: &FlashShape) -> usize {
        s.batch * s.query_rows().div_ceil(FLASH_ROWS)
    }
}

/// How a Hopper kernel merges a request's splits (one split needs no merge). Either way
/// in split order with the same arithmetic per element, so the bits depend on the split
/// plan alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMerge {
    /// The splits run as one cluster and merge through distributed shared memory; more than
    /// [`MAX_CLUSTER_SPLITS`] take the global merge.
    Cluster,
    /// Every split writes an f32 partial; the last to finish merges them from L2.
    Global,
}

/// The most splits a request's cluster takes (the portable cluster size).
pub const MAX_CLUSTER_SPLITS: usize = 8;

impl SplitMerge {
    /// Whether a Hopper launch whose requests take up to `splits` splits runs them as
    /// clusters: the cluster merge, with 2 to [`MAX_CLUSTER_SPLITS`] splits.
    pub fn in_clusters(self, splits: usize) -> bool {
        self == Self::Cluster && (2..=MAX_CLUSTER_SPLITS).contains(&splits)
    }
}

/// Compile-time checks appended to the flash module: each kernel's own shared-memory
/// formula must equal the size the host launches it with, or the module does not build
/// (NVRTC compares the values every time the kernels are compiled).
/// Pair iterations and marks per warpgroup of the seesaw kernel's `FS_TRACE` timeline
/// (`FS_TRACE_ITERS`, `FS_TRACE_EVENTS`; the compiled source asserts they agree).
pub const SEESAW_TRACE_ITERS: usize = 64;
pub const SEESAW_TRACE_EVENTS: usize = 12;
/// The word a traced CTA writes last (`FS_TRACE_MAGIC`): its timeline is whole.
pub const SEESAW_TRACE_MAGIC: u64 = 0x5EE5_A77A_CE00_0001;
/// Marks of the traced CTA's epilogue, after its start, end and magic words
/// (`FW_EPI_MARKS`, in `flash_wgmma.cu`).
pub const SEESAW_TRACE_EPILOGUE_MARKS: usize = 4;
/// Where every persistent CTA's own record starts (`FS_CTA_AT`, 64-bit words into the split
/// partials' buffer), and its words (`FS_CTA_WORDS`): clock64 at start and end, SM and item
/// count (`smid | items << 32`), [`SEESAW_CTA_MAGIC`] (`FS_CTA_MAGIC`), then `%globaltimer`
/// (ns) at start and end.
pub const SEESAW_CTA_AT: usize = 4096;
pub const SEESAW_CTA_WORDS: usize = 6;
pub const SEESAW_CTA_MAGIC: u64 = 0x5EE5_C7A7_135E_0001;

fn smem_asserts() -> String {
    use super::PrefillTile;
    [
        ("FW_SMEM_BYTES", WGMMA_SMEM_BYTES),
        ("FS_SMEM_BYTES", SEESAW_SMEM_BYTES),
        ("FS_THREADS", SEESAW_THREADS as usize),
        ("FP_SMEM_BYTES(64)", PrefillTile::Rows64.smem_bytes()),
        ("FP_SMEM_BYTES(128)", PrefillTile::Rows128.smem_bytes()),
        ("FT_SMEM_BYTES", PrefillTile::Tma128.smem_bytes()),
    ]
    .iter()
    .map(|(kernel, host)| {
        format!("static_assert({kernel} == {host}, \"{kernel}: the host launches with {host} bytes\");\n")
    })
    .collect()
}

/// The timeline's sizes as the host reads them, asserted where `FS_TRACE` compiles them.
fn trace_asserts() -> String {
    format!(
        "#ifdef FS_TRACE\nstatic_assert(FS_TRACE_ITERS == {SEESAW_TRACE_ITERS} && FS_TRACE_EVENTS == {SEESAW_TRACE_EVENTS} && FS_TRACE_MAGIC == {SEESAW_TRACE_MAGIC}ull && FW_EPI_MARKS == {SEESAW_TRACE_EPILOGUE_MARKS} && FS_CTA_AT == {SEESAW_CTA_AT} && FS_CTA_WORDS == {SEESAW_CTA_WORDS} && FS_CTA_MAGIC == {SEESAW_CTA_MAGIC}ull, \"the host reads the timeline with other sizes\");\n#endif\n"
    )
}

/// The compiled tensor-core decode kernels.
#[derive(Clone)]
pub struct FlashKernels {
    _module: Arc<CudaModule>,
    pub(super) fns: BTreeMap<&'static str, CudaFunction>,
    /// The tile configuration `flash_decode` was compiled with.
    pub flash: FlashConfig,
    /// The kernel [`Self::flash_decode`] gives more than 16 query rows: the seesaw wgmma
    /// kernel where the device has it (sm_90a), else mma.sync.
    pub wide: WideKernel,
    /// How [`Self::flash_decode`] has the Hopper kernels merge a request's splits.
    pub merge: SplitMerge,
    /// How many CTAs the persistent seesaw kernel runs.
    pub persist: Persist,
    /// The element type of the merged rows the kernels write.
    pub out: DecodeOut,
}

/// The grid of the persistent seesaw kernel (the copy warpgroup's, [`SEESAW_PERSISTENT`]),
/// whose CTAs each take every `gridDim.x`-th row block of a launch. Each row block's
/// arithmetic is the same whatever the grid: so are the bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persist {
    /// At most one CTA a multiprocessor (one fits): the engine's.
    PerMultiprocessor,
    /// At most this many CTAs: `gpu-test`'s few, so CTAs take many row blocks each.
    Ctas(usize),
    /// One CTA a row block (`SPECMLA_NO_PERSIST`), to time what persistence saves.
    Off,
}

impl Persist {
    /// CTAs for a launch of `requests` requests of `row_blocks` row blocks each on `sms`
    /// multiprocessors.
    pub fn ctas(self, requests: usize, row_blocks: usize, sms: usize) -> usize {
        let items = requests * row_blocks;
        match self {
            Self::PerMultiprocessor => aligned_ctas(items, row_blocks, sms),
            Self::Ctas(n) => items.min(n.max(1)),
            Self::Off => items,
        }
    }
}

/// One CTA a multiprocessor, fewer where that takes no more items a CTA: then the most that
/// are a whole number of requests' row blocks. CTA x takes items x, x + grid, ..., so
/// with such a grid every wave holds whole requests and a request's row blocks, which read
/// the same keys, run side by side; on any other grid a request now and then splits across
/// two waves and its keys come from memory twice (132 CTAs and 8 row blocks a request: 128).
fn aligned_ctas(items: usize, row_blocks: usize, sms: usize) -> usize {
    let n = items.min(sms).max(1);
    let aligned = n / row_blocks.max(1) * row_blocks.max(1);
    if aligned > 0 && items.div_ceil(aligned) == items.div_ceil(n) {
        aligned
    } else {
        n
    }
}

/// How the flash module is built: the lab's tuning knobs, which an engine never reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlashBuild {
    /// `flash_decode`'s tiles.
    pub config: FlashConfig,
    /// Diagnostic `#define`s (`FW_NO_LOAD`, ...).
    pub defines: String,
    pub merge: SplitMerge,
    /// See [`FlashKernels::persist`].
    pub persist: Persist,
    /// See [`FlashKernels::out`].
    pub out: DecodeOut,
}

impl FlashBuild {
    /// The engine's build, whatever the environment says: the default tiles, no
    /// diagnostic switches, the cluster merge, bf16 rows. Its kernels are chosen by configuration
    /// alone, so the bits a trace records do not depend on a variable someone set.
    pub fn engine() -> Self {
        Self {
            config: FlashConfig::default(),
            defines: String::new(),
            merge: SplitMerge::Cluster,
            persist: Persist::PerMultiprocessor,
            out: DecodeOut::Bf16,
        }
    }

    /// The lab's build: `SPECMLA_FLASH_CONFIG` (tiles), `SPECMLA_FLASH_DEFINES`
    /// (diagnostic switches), `SPECMLA_NO_CLUSTER_MERGE` (the global merge),
    /// `SPECMLA_NO_PERSIST` (a CTA a row block) and `SPECMLA_FLASH_OUT` (f32 rows), the
    /// last three for A/B timing, each defaulting to [`Self::engine`]'s.
    pub fn from_env() -> Result<Self, GpuError> {
        Ok(Self {
            config: FlashConfig::from_env()?,
            defines: diagnostic_defines()?,
            merge: if std::env::var_os("SPECMLA_NO_CLUSTER_MERGE").is_some() {
                SplitMerge::Global
            } else {
                SplitMerge::Cluster
            },
            persist: if std::env::var_os("SPECMLA_NO_PERSIST").is_some() {
                Persist::Off
            } else {
                Persist::PerMultiprocessor
            },
            out: DecodeOut::from_env()?,
        })
    }
}

impl FlashKernels {
    /// What a CTA of the seesaw kernels costs beyond its keys, in 64-key tiles, for the fast
    /// split plan (`split::fast_split_plan`): fitted to `gpu-bench --sweep-splits` on the
    /// H100 at 17 shapes whose batches fill no whole wave (run 130: 128 heads q 1 B 72-200,
    /// q 2 B 40-96, q 4 B 20-72, 16 heads B 160-200). With 6 to 10 tiles a split CTA (a
    /// `_2wg` CTA's cold start and its cluster merge) and 0 to 2 a one-split one (most run
    /// persistent, each item's start under the last one's end) the plan took a count within
    /// 5.5% of the fastest at every shape, and the fastest at 16 of 17 with 8 and 1. Those
    /// counts merge in clusters; past one wave the plan takes no more than a cluster holds
    /// (the global merge costs more).
    ///
    /// A balanced launch costs 20 tiles beyond its parts' share: fitted to run 134 (20
    /// shapes whose last wave is part full, the balanced schedule against the split counts),
    /// where it tells the faster of the two at every shape; run 135 put 2-17 µs of it in the
    /// cut pieces' partial stores and 11-16 µs (128 heads) in the combine. Against a split
    /// plan of several splits in one wave (small batches) it costs 12: the only count that
    /// tells the faster launch at the 11 shapes of run 230 (q 1-4, B 4-16), which then picked
    /// it at 9 of 11 shapes it had not seen (run 231) and lost 2.4-2.5% at the other two.
    pub const CTA_OVERHEAD: CtaOverhead = CtaOverhead {
        one_split_tiles: 1,
        split_tiles: 8,
        priced_splits: MAX_CLUSTER_SPLITS,
        balanced_tiles: 20,
        balanced_one_wave_tiles: 12,
    };

    /// Compiles the flash family for `dev` as the lab's environment asks
    /// ([`FlashBuild::from_env`]).
    pub fn load(dev: &GpuDevice) -> Result<Self, GpuError> {
        Self::load_build(dev, FlashBuild::from_env()?)
    }

    /// Compiles the flash family for `dev` as an engine runs it ([`FlashBuild::engine`]).
    pub fn for_engine(dev: &GpuDevice) -> Result<Self, GpuError> {
        Self::load_build(dev, FlashBuild::engine())
    }

    /// Compiles the flash family for `dev` as `build` says.
    pub fn load_build(dev: &GpuDevice, build: FlashBuild) -> Result<Self, GpuError> {
        let flash = build.config;
        flash
            .check()
            .map_err(|why| GpuError::NoDevice(format!("flash config {flash:?}: {why}")))?;
        let flash_src = format!(
            "{}{}{}{FLASH_SRC}\n{FLASH_WGMMA_SRC}\n{FLASH_SEESAW_SRC}\n{}\n{}{}",
            flash.defines(),
            build.out.defines(),
            build.defines,
            super::FLASH_PREFILL_SRC,
            smem_asserts(),
            trace_asserts()
        );
        let module = dev.compile("flash_decode.cu", &flash_src)?;
        let mut fns = BTreeMap::new();
        for name in [
            "flash_decode",
            "flash_decode_narrow",
            "flash_decode_wgmma",
            "flash_decode_seesaw",
            SEESAW_2WG,
            "flash_combine",
            "flash_combine_slots",
            "flash_prefill",
            "flash_prefill_wide",
            "flash_prefill_tma",
            "gather_latent_bf16",
        ] {
            let f = module
                .load_function(name)
                .map_err(GpuError::driver(format!("loading kernel {name}")))?;
            fns.insert(name, f);
        }
        let wide = if dev.arch == "sm_90a" {
            WideKernel::Seesaw
        } else {
            WideKernel::Mma
        };
        for (name, bytes) in [
            ("flash_decode", flash.smem_bytes()),
            ("flash_decode_narrow", flash.smem_bytes()),
            ("flash_decode_wgmma", WGMMA_SMEM_BYTES),
            ("flash_decode_seesaw", SEESAW_SMEM_BYTES),
            (SEESAW_2WG, SEESAW_SMEM_BYTES),
            ("flash_prefill", super::PrefillTile::Rows64.smem_bytes()),
            (
                "flash_prefill_wide",
                super::PrefillTile::Rows128.smem_bytes(),
            ),
            ("flash_prefill_tma", super::PrefillTile::Tma128.smem_bytes()),
        ] {
            let hopper = [WideKernel::Wgmma, WideKernel::Seesaw]
                .iter()
                .any(|w| w.function() == name)
                || name == SEESAW_2WG
                || super::PrefillTile::ALL
                    .iter()
                    .any(|t| t.hopper() && t.function() == name);
            if hopper && !wide.hopper() {
                continue; // compiled as a trap off sm_90a; never launched there
            }
            fns[name]
                .set_attribute(
                    CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
                .map_err(GpuError::driver(format!(
                    "raising {name}'s shared memory limit"
                )))?;
        }
        Ok(Self {
            _module: module,
            fns,
            flash,
            wide,
            merge: build.merge,
            persist: build.persist,
            out: build.out,
        })
    }

    /// Whether requests of `rows` query rows take `flash_decode_narrow`: at most 16 rows,
    /// and tiles that split into four 16-key quarters (whose merge buffers fit in the
    /// key stages).
    pub fn narrow(&self, rows: usize) -> bool {
        rows <= 16 && self.flash.keys.is_multiple_of(64)
    }

    /// The CUDA function [`Self::flash_decode_merged`] launches for shape `s`, with its
    /// CTA's threads where a Hopper kernel takes it (else the configuration's).
    pub fn decode_launch(&self, s: &FlashShape, wide: WideKernel) -> (&'static str, Option<u32>) {
        let rows = s.query_rows();
        let family = self.decode_function(rows, s.page, wide);
        if wide.hopper() && family == wide.function() {
            let row_blocks = rows.div_ceil(FLASH_ROWS);
            let (name, threads) = wide.launch_function(s.max_splits, row_blocks);
            (name, Some(threads))
        } else {
            (family, None)
        }
    }

    /// The kernel that takes requests of `rows` query rows in pages of `page` on the
    /// `wide` family. The wgmma kernel takes every row count (even at 16 rows, where 48 of
    /// its 64 are dead, it beats the narrow kernel: the copy engine keeps the loads
    /// streaming); it copies whole pages, or 64-slot parts of them, so its page must be
    /// 16, 32, 64 or a multiple of 64. On mma.sync, at most 16 rows take the narrow kernel.
    pub fn decode_function(&self, rows: usize, page: usize, wide: WideKernel) -> &'static str {
        // Pages below 16 would mean 36+ boxes a tile from one thread, and are untested.
        let tma_pages = page >= 16 && (64 % page == 0 || page.is_multiple_of(64));
        if wide.hopper() && tma_pages {
            wide.function()
        } else if self.narrow(rows) {
            "flash_decode_narrow"
        } else {
            WideKernel::Mma.function()
        }
    }

    /// How many groups of `splits` CTAs of the default wide kernel run at once on a device
    /// of `sms` multiprocessors (one CTA each, its shared memory allows no more): the
    /// driver's count of resident clusters where those splits merge in a cluster, else
    /// `sms / splits`.
    pub fn resident_split_groups(
        &self,
        dev: &GpuDevice,
        sms: usize,
        splits: usize,
    ) -> Result<usize, GpuError> {
        let clustered = self.wide.hopper() && self.merge.in_clusters(splits);
        match self.wide.smem_bytes().filter(|_| clustered) {
            Some(bytes) => {
                // Split launches: the row blocks do not change the kernel.
                let (name, threads) = self.wide.launch_function(splits, 0);
                max_active_clusters(dev, &self.fns[name], threads, bytes as u32, splits as u32)
            }
            None => Ok(sms / splits.max(1)),
        }
    }

    /// Tensor-core decode: every request's keys `[0, seq_len)` in the schedule's splits
    /// (`b.split_lens`, `b.num_splits`: the plan's, never derived here), token j of a
    /// request seeing keys below `seq_len - q_len + j + 1`; then the splits merged in split
    /// order. `scale` is the softmax scale.
    ///
    /// A row whose causal window reaches a missing block (a -1 entry, or past the table's
    /// `width`) comes out NaN, output and LSE, as in the f32 decode; the other rows are exact.
    ///
    /// # Safety
    /// `mapped_kv_tokens` is core's `split::mapped_kv_tokens` of the block table on the device: every
    /// entry below `mapped_kv_tokens[b] / page` in request b's row names a block inside
    /// `cache`. The kernels read those entries unchecked and nothing past them. Every
    /// `split_lens` entry is a positive multiple of `s.split_size_tokens` (a
    /// [`FlashSchedule`] is).
    pub unsafe fn flash_decode(
        &self,
        dev: &GpuDevice,
        s: FlashShape,
        b: FlashBufs,
        scale: f32,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's promise, forwarded.
        unsafe { self.flash_decode_with(self.wide, dev, s, b, scale) }
    }

    /// [`Self::flash_decode`] with requests of more than 16 rows on `wide`; the Hopper
    /// families only where [`Self::wide`] is one.
    ///
    /// # Safety
    /// As [`Self::flash_decode`].
    pub unsafe fn flash_decode_with(
        &self,
        wide: WideKernel,
        dev: &GpuDevice,
        s: FlashShape,
        b: FlashBufs,
        scale: f32,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's promise, forwarded.
        unsafe { self.flash_decode_merged((wide, self.merge), dev, s, b, scale) }
    }

    /// The CTAs of the persistent seesaw kernel where `wide` launches it for shape `s` on
    /// `sms` multiprocessors ([`WideKernel::launch_function`]), else `None`.
    pub fn persistent_ctas(&self, wide: WideKernel, s: FlashShape, sms: usize) -> Option<usize> {
        let row_blocks = s.query_rows().div_ceil(FLASH_ROWS);
        let (name, _) = wide.launch_function(s.max_splits, row_blocks);
        (name == SEESAW_PERSISTENT).then(|| self.persist.ctas(s.batch, row_blocks, sms))
    }

    /// [`Self::flash_decode_with`] with the Hopper kernels' split merge given.
    ///
    /// # Safety
    /// As [`Self::flash_decode`].
    pub unsafe fn flash_decode_merged(
        &self,
        (wide, merge): (WideKernel, SplitMerge),
        dev: &GpuDevice,
        s: FlashShape,
        b: FlashBufs,
        scale: f32,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's promise, forwarded.
        unsafe { self.decode_on((wide, merge), dev, s, b, scale, None) }
    }

    /// The launch behind [`Self::flash_decode_merged`] and, with `work`, the balanced
    /// schedule's ([`Self::flash_decode_balanced`]): the persistent seesaw kernel on
    /// `work`'s parts, then `flash_combine_slots` over its cut requests.
    ///
    /// # Safety
    /// As [`Self::flash_decode`].
    pub(super) unsafe fn decode_on(
        &self,
        (wide, merge): (WideKernel, SplitMerge),
        dev: &GpuDevice,
        s: FlashShape,
        b: FlashBufs,
        scale: f32,
        work: Option<&super::BalancedWork>,
    ) -> Result<(), GpuError> {
        assert!(
            !wide.hopper() || self.wide.hopper(),
            "{} needs sm_90a",
            wide.function()
        );
        let rows = s.query_rows();
        assert!(s.page >= 1, "a page holds at least one slot");
        // The wgmma kernel takes row maxima before scaling: only a positive scale keeps them.
        assert!(
            scale.is_finite() && scale > 0.0,
            "the softmax scale must be positive, got {scale}"
        );
        let (name, hopper_threads) = match work {
            Some(_) => (SEESAW_PERSISTENT, Some(SEESAW_THREADS)),
            None => self.decode_launch(&s, wide),
        };
        // Whether a Hopper kernel takes this launch (not the narrow or mma.sync fallback).
        let hopper = hopper_threads.is_some();
        // The Hopper kernels' tiles are 64 keys; the others' are the configuration's.
        let keys = if hopper { 64 } else { self.flash.keys };
        assert!(
            s.split_size_tokens.is_multiple_of(keys) && s.split_size_tokens > 0,
            "split size {} is not a multiple of {keys}",
            s.split_size_tokens
        );
        assert!(s.max_splits >= 1, "a request takes at least one split");
        b.q.need(s.batch * rows * FLASH_DIM);
        b.block_table.need(s.batch * s.width);
        b.seq_lens.need(s.batch);
        b.mapped_kv_tokens.need(s.batch);
        b.split_lens.need(s.batch);
        b.num_splits.need(s.batch);
        let partial_rows = match work {
            Some(w) => w.partial_slots * rows,
            None => s.max_splits * s.batch * rows,
        };
        b.o_part.need(partial_rows * FLASH_DV);
        b.lse_part.need(partial_rows);
        assert_eq!(
            b.out.dtype(),
            self.out,
            "the output buffer must be of the kernels' type"
        );
        let out = b.out.need(s.batch * rows * FLASH_DV);
        b.lse.need(s.batch * rows);
        let mut args: Vec<Arg> = vec![
            b.q.into(),
            b.cache.into(),
            b.block_table.into(),
            b.seq_lens.into(),
            b.mapped_kv_tokens.into(),
            b.split_lens.into(),
            b.num_splits.into(),
            b.o_part.into(),
            b.lse_part.into(),
        ];
        for x in [
            s.batch,
            rows,
            s.heads,
            s.q_len,
            s.page,
            s.width,
            s.max_splits,
        ] {
            args.push(x.into());
        }
        args.push((scale * std::f32::consts::LOG2_E).into());
        // The Hopper kernels merge their own splits: no flash_combine after them.
        if hopper {
            // Outside a cluster, its merge weights live in the freed tiles: [splits][64].
            assert!(
                s.max_splits <= 256,
                "at most 256 splits, got {}",
                s.max_splits
            );
            b.done.need(FlashBufs::done_len(&s));
            args.extend::<[Arg; 3]>([out.into(), b.lse.into(), b.done.into()]);
            let slots = b.cache.len() / FLASH_DIM;
            let map = TensorMap::bf16_rows(b.cache, FLASH_DIM, slots, (64, s.page.min(64)))?;
            args.push(Arg::Map(map));
            if name == SEESAW_PERSISTENT {
                // Its later items' Q: 64-row boxes of the [batch * rows, 576] queries.
                let q_rows = s.batch * rows;
                args.push(Arg::Map(TensorMap::bf16_rows(
                    b.q,
                    FLASH_DIM,
                    q_rows,
                    (64, 64),
                )?));
                // Its balanced schedule, or none (null: the round-robin grid).
                match work {
                    Some(w) => {
                        args.extend::<[Arg; 2]>([w.part_items.ptr().into(), w.items.ptr().into()])
                    }
                    None => args.extend([Arg::Ptr(0), Arg::Ptr(0)]),
                }
            }
        }
        let (threads, smem) = if let (Some(bytes), Some(t)) = (wide.smem_bytes(), hopper_threads) {
            (t, bytes)
        } else {
            (self.flash.threads(), self.flash.smem_bytes())
        };
        let row_blocks = rows.div_ceil(FLASH_ROWS);
        let grid_dim = if let Some(w) = work {
            ((w.parts * row_blocks) as u32, 1, 1)
        } else if name == SEESAW_PERSISTENT {
            // The kernel takes one split a request (launch_function picks it only then).
            (self.persist.ctas(s.batch, row_blocks, dev.sms) as u32, 1, 1)
        } else {
            (row_blocks as u32, s.max_splits as u32, s.batch as u32)
        };
        let cfg = LaunchConfig {
            grid_dim,
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: argument list matches the kernel (the wgmma one also takes the outputs,
        // the split counters and the tensor map); sizes checked above; no request takes more
        // than max_splits splits (the kernels clamp the schedule's count); the caller's table names
        // blocks inside `cache` below each request's mapped_kv_tokens, the kernels' read
        // bound (they do not check the entries); the narrow
        // kernel runs only for at most 16 rows; a cluster holds one request's splits of one
        // 64-row block, which is what the Hopper kernels' on-chip merge expects.
        if hopper && work.is_none() && merge.in_clusters(s.max_splits) {
            let f = &self.fns[name];
            unsafe { launch_cluster(dev, f, name, cfg, s.max_splits as u32, &args) }?;
        } else {
            unsafe { launch_cfg(dev, &self.fns[name], name, cfg, &args) }?;
        }
        if let Some(w) = work {
            // SAFETY: the decode wrote every cut request's partials in its slots.
            return unsafe { self.combine_slots(dev, s, (b.o_part, b.lse_part), out, b.lse, w) };
        }
        if hopper {
            return Ok(());
        }
        let args = [
            b.o_part.into(),
            b.lse_part.into(),
            b.split_lens.into(),
            b.num_splits.into(),
            out.into(),
            b.lse.into(),
            s.batch.into(),
            rows.into(),
            s.heads.into(),
            s.max_splits.into(),
        ];
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, s.batch as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches flash_combine; sizes checked above.
        unsafe { launch_cfg(dev, &self.fns["flash_combine"], "flash_combine", cfg, &args) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_persistent_grid_takes_whole_requests_where_that_costs_no_wave() {
        let ctas = |requests, row_blocks| {
            super::Persist::PerMultiprocessor.ctas(requests, row_blocks, 132)
        };
        // q 4 at 128 heads (8 row blocks a request): 512 and 1024 items take 4 and 8 a CTA
        // on 128 CTAs as on 132, and 128 hold whole requests.
        assert_eq!(ctas(64, 8), 128);
        assert_eq!(ctas(128, 8), 128);
        assert_eq!(ctas(32, 8), 128);
        // q 2 (4 row blocks): 132 is already whole requests.
        assert_eq!(ctas(64, 4), 132);
        // 67 requests of 8: 536 items take 5 a CTA on 128 (536 / 128 > 4) but 5 on 132
        // too (536 / 132 > 4): whole requests again.
        assert_eq!(ctas(67, 8), 128);
        // 33 requests of 8: 264 items, 2 a CTA on 132, 3 on 128: one a multiprocessor.
        assert_eq!(ctas(33, 8), 132);
        // Fewer items than multiprocessors: one CTA an item.
        assert_eq!(ctas(8, 8), 64);
        assert_eq!(ctas(3, 5), 15);
        // The other grids are as they were.
        assert_eq!(super::Persist::Ctas(5).ctas(64, 8, 132), 5);
        assert_eq!(super::Persist::Off.ctas(64, 8, 132), 512);
    }
    use super::FlashConfig;

    #[test]
    fn only_the_diagnostic_switches_pass() {
        use super::parse_defines;
        assert_eq!(
            parse_defines("FW_NO_LOAD, FW_NO_MMA").unwrap(),
            "#define FW_NO_LOAD 1\n#define FW_NO_MMA 1\n"
        );
        assert_eq!(parse_defines("").unwrap(), "");
        // A layout macro would desynchronize the host's shared-memory size.
        assert!(parse_defines("FD_KEYS").unwrap_err().contains("FD_KEYS"));
        assert!(parse_defines("FW_NO_LOAD,x;y").is_err());
    }

    /// `SPECMLA_FLASH_OUT` names one of the two row types exactly; the output type is a
    /// build property, not a diagnostic switch (`FD_OUT_BF16` does not pass as one).
    #[test]
    fn the_output_type_is_f32_or_bf16() {
        use super::{parse_defines, DecodeOut};
        assert_eq!(DecodeOut::parse("f32"), Ok(DecodeOut::F32));
        assert_eq!(DecodeOut::parse("bf16"), Ok(DecodeOut::Bf16));
        for bad in ["", "F32", "fp16", "bf16 "] {
            assert!(DecodeOut::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(DecodeOut::Bf16.defines(), "#define FD_OUT_BF16 1\n");
        assert_eq!(DecodeOut::F32.defines(), "");
        assert!(parse_defines("FD_OUT_BF16").is_err());
    }

    /// The seesaw family's kernel per launch shape (runs 55, 64 and 158's measurements), the
    /// others' one kernel whatever the shape.
    #[test]
    fn the_seesaw_copy_warpgroup_takes_one_split_of_two_or_more_row_blocks() {
        use super::WideKernel::{Mma, Seesaw, Wgmma};
        let (persistent, two) = (
            ("flash_decode_seesaw", 384),
            ("flash_decode_seesaw_2wg", 256),
        );
        // (kernel, splits, row blocks a request).
        for (wide, splits, blocks, want) in [
            (Seesaw, 1, 8, persistent),
            (Seesaw, 1, 4, persistent),
            (Seesaw, 1, 3, persistent),
            // q 1 at 128 heads, one row block a CTA or several.
            (Seesaw, 1, 2, persistent),
            // One row block (16 heads) takes _2wg, as do split launches.
            (Seesaw, 1, 1, two),
            (Seesaw, 2, 8, two),
            (Seesaw, 2, 2, two),
            (Seesaw, 2, 0, two),
            (Wgmma, 1, 8, ("flash_decode_wgmma", 256)),
            (Mma, 1, 8, ("flash_decode", 256)),
        ] {
            assert_eq!(
                wide.launch_function(splits, blocks),
                want,
                "{wide:?} {splits} {blocks}"
            );
        }
    }

    /// core's plan tests (`split::H100_OVERHEAD`) copy these values.
    #[test]
    fn the_plans_overheads_are_the_ones_core_tests() {
        let o = super::FlashKernels::CTA_OVERHEAD;
        assert_eq!(
            (
                o.one_split_tiles,
                o.split_tiles,
                o.priced_splits,
                o.balanced_tiles,
                o.balanced_one_wave_tiles
            ),
            (1, 8, 8, 20, 12)
        );
    }

    #[test]
    fn the_hopper_decode_kernels_fit_in_shared_memory() {
        const { assert!(super::SEESAW_SMEM_BYTES <= super::MAX_SMEM_BYTES) };
        const { assert!(super::WGMMA_SMEM_BYTES <= super::MAX_SMEM_BYTES) };
        assert_eq!(super::WGMMA_SMEM_BYTES, 230_944);
        assert_eq!(super::SEESAW_SMEM_BYTES, 223_400);
    }

    /// The module checks every kernel's shared-memory formula against the host's size at
    /// compile time (one static_assert per kernel, each naming the host's value), and the
    /// seesaw kernel's thread count against the host's launch.
    #[test]
    fn the_module_asserts_every_shared_memory_size() {
        let asserts = super::smem_asserts();
        for (kernel, host) in [
            ("FW_SMEM_BYTES", super::WGMMA_SMEM_BYTES),
            ("FS_SMEM_BYTES", super::SEESAW_SMEM_BYTES),
            ("FP_SMEM_BYTES(64)", 106_496),
            ("FP_SMEM_BYTES(128)", 131_072),
            ("FT_SMEM_BYTES", 214_144),
            ("FS_THREADS", 384),
        ] {
            let line = format!("static_assert({kernel} == {host}, ");
            assert!(asserts.contains(&line), "{line} missing from {asserts}");
        }
        assert_eq!(asserts.lines().count(), 6);
        // The timeline's sizes, checked only where the kernel records one, and the
        // kernel's source defines the ones the host reads.
        let t = super::trace_asserts();
        assert!(t.starts_with("#ifdef FS_TRACE\n"), "{t}");
        for (name, host) in [
            ("FS_TRACE_ITERS", super::SEESAW_TRACE_ITERS.to_string()),
            ("FS_TRACE_EVENTS", super::SEESAW_TRACE_EVENTS.to_string()),
            (
                "FS_TRACE_MAGIC",
                format!("{:#X}ull", super::SEESAW_TRACE_MAGIC).replace("0X", "0x"),
            ),
            ("FS_CTA_AT", super::SEESAW_CTA_AT.to_string()),
            ("FS_CTA_WORDS", super::SEESAW_CTA_WORDS.to_string()),
            (
                "FS_CTA_MAGIC",
                format!("{:#X}ull", super::SEESAW_CTA_MAGIC).replace("0X", "0x"),
            ),
        ] {
            let line = format!("#define {name} {host}");
            assert!(
                super::FLASH_SEESAW_SRC.contains(&line),
                "{line} not in flash_seesaw.cu"
            );
        }
        let line = format!(
            "#define FW_EPI_MARKS {}",
            super::SEESAW_TRACE_EPILOGUE_MARKS
        );
        assert!(
            super::FLASH_WGMMA_SRC.contains(&line),
            "{line} not in flash_wgmma.cu"
        );
        assert!(t.contains("FW_EPI_MARKS == 4"), "{t}");
    }

    #[test]
    fn flash_configs_are_checked_before_compiling() {
        let d = FlashConfig::default();
        assert!(d.check().is_ok(), "{:?}", d.check());
        assert_eq!(
            FlashConfig::parse("32, 4, 2"),
            Ok(FlashConfig {
                keys: 32,
                stages: 4,
                vparts: 2
            })
        );
        // Three 64-key stages do not fit beside 64 query rows in 227 KiB.
        assert!(FlashConfig::parse("64,3,4")
            .unwrap_err()
            .contains("shared memory"));
        assert!(FlashConfig::parse("48,2,4")
            .unwrap_err()
            .contains("multiple of 16 * vparts"));
        assert!(FlashConfig::parse("64,1,4").unwrap_err().contains("stages"));
        assert!(FlashConfig::parse("64,2").is_err() && FlashConfig::parse("a,b,c").is_err());
    }
}
