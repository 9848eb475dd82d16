//! The tensor-core attention path. At DeepSeek-V3's latent widths (512 + 64) with a bf16
//! cache on Hopper, every decode-kernel row (the target's decode rows and each drafter
//! pass's sampled rows) runs the flash decode over bf16 copies of the latent caches,
//! reading the plan's split schedule as given, and every projection (the dense ones, the
//! query absorption, the value up-projection and the prefill's `kv_b` up-projection)
//! runs in bf16 on cuBLASLt with the batch-invariant algorithms of [`crate::ops::gemm`].
//! Where the heads are DeepSeek-V3's too (qk 128 + 64, v 128), prefill rows and DFlash's
//! block attention run the TMA prefill (`prefill.rs`); otherwise they run the portable
//! f32 kernels over the f32 caches, which hold the same values (latents are rounded to
//! bf16 where produced). Any other configuration runs the portable kernels alone, and
//! the device line of a report says why.

use specmla_core::config::{EngineConfig, KvCacheDtype};
use specmla_core::memory::Allocation;
use specmla_core::split::SplitPolicy;

use specmla_core::balanced::balanced_schedule_of_splits;
use specmla_core::invariant_launch::{invariant_launch, largest_split_count, InvariantLaunch};
use specmla_core::metadata::MlaDecodeMetadata;

use super::{CacheOf, DecodeLaunch, GpuBackend, GpuBackendError, Result, SplitForm};
use crate::device::GpuDevice;
use crate::launch::{Buf, DPtr};
use crate::ops::{
    BalancedWork, FlashBufs, FlashKernels, FlashOut, FlashShape, Gemm, GemmAlgo, WideKernel,
    FLASH_DIM, FLASH_DV, FLASH_ROWS,
};
use crate::workspace::Workspace;

/// The flash kernels and the bf16 caches they read.
pub(super) struct FlashPath {
    pub fk: FlashKernels,
    /// `[layers, slots, 576]` bf16.
    pub target_cache: Buf<u16>,
    /// `[slots, 576]` bf16.
    pub drafter_cache: Buf<u16>,
    pub policy: SplitPolicy,
    /// The projections' GEMMs (batch-invariant unless the backend is told otherwise).
    pub gemm: Gemm,
}

/// Why `cfg` on a device of `arch` runs the portable kernels; `None` when the flash
/// path takes its decode rows. The Hopper kernels' tiles are 64 keys, and their copy
/// engine takes pages of 16, 32, 64 or a multiple of 64.
pub fn portable_because(cfg: &EngineConfig, arch: &str) -> Option<String> {
    let m = &cfg.model;
    let page = cfg.scheduler.page_size;
    if m.latent_dim() != FLASH_DIM || m.kv_lora_rank != FLASH_DV {
        Some(format!(
            "the flash kernels take DeepSeek-V3's latent of 512 + 64, not {} + {}",
            m.kv_lora_rank, m.qk_rope_head_dim
        ))
    } else if cfg.kv_cache_dtype != KvCacheDtype::Bf16 {
        Some("the flash kernels read a bf16 cache (--kv-cache-dtype bf16)".into())
    } else if arch != "sm_90a" {
        Some(format!("{arch} is not Hopper (sm_90a)"))
    } else if !cfg.split_size_tokens.is_multiple_of(64) {
        Some(format!(
            "split size {} is not a multiple of the 64-key tile",
            cfg.split_size_tokens
        ))
    } else if page < 16 || !(64 % page == 0 || page.is_multiple_of(64)) {
        Some(format!("page {page} is not 16, 32, 64 or a multiple of 64"))
    } else {
        None
    }
}

/// The bf16 caches the flash path adds to the backend's allocations.
pub fn flash_allocations(cfg: &EngineConfig) -> Vec<Allocation> {
    let slots = (cfg.scheduler.num_gpu_blocks * cfg.scheduler.page_size) as u64;
    let per_layer = slots * cfg.model.latent_dim() as u64 * 2;
    vec![
        Allocation {
            what: "target KV cache (bf16 copy)",
            bytes: per_layer * cfg.model.num_layers as u64,
        },
        Allocation {
            what: "drafter KV cache (bf16 copy)",
            bytes: per_layer,
        },
    ]
}

impl FlashPath {
    /// Compiles the flash kernels and allocates the bf16 caches (NaN, as the f32 ones).
    pub fn new(dev: &GpuDevice, cfg: &EngineConfig) -> Result<Self> {
        // Chosen by configuration alone: the lab's tuning variables are not read here.
        let fk = FlashKernels::for_engine(dev)?;
        let slots = cfg.scheduler.num_gpu_blocks * cfg.scheduler.page_size;
        let per = slots * FLASH_DIM;
        // bf16 NaN: a slot never written reads as NaN, as in the f32 caches.
        let nan = vec![0x7fc0u16; per];
        let mut target = Vec::with_capacity(per * cfg.model.num_layers);
        for _ in 0..cfg.model.num_layers {
            target.extend_from_slice(&nan);
        }
        Ok(Self {
            target_cache: Buf::from_host(dev, &target, "target KV cache (bf16)")?,
            drafter_cache: Buf::from_host(dev, &nan, "drafter KV cache (bf16)")?,
            policy: cfg.split_policy(),
            gemm: Gemm::new(dev, GemmAlgo::Invariant)?,
            fk,
        })
    }

    /// The bf16 copy of cache `c`.
    pub fn cache(&self, c: CacheOf) -> DPtr<u16> {
        match c {
            CacheOf::Target(l) => {
                let per = self.drafter_cache.len();
                self.target_cache.ptr().range(l * per, per)
            }
            CacheOf::Drafter => self.drafter_cache.ptr(),
        }
    }
}

impl GpuBackend {
    /// One decode launch on the flash kernels: the bf16 absorbed queries `q` (the
    /// launch's tokens), the split schedule and mapped keys the launch's rows were given,
    /// the output into `o_lat` in bf16 (the engine's build, [`crate::ops::FlashBuild::engine`]).
    pub(super) fn flash_decode(
        &self,
        ws: &Workspace,
        cache: DPtr<u16>,
        dl: DecodeLaunch,
        (q, o_lat): (DPtr<u16>, DPtr<u16>),
    ) -> Result<()> {
        let fp = self
            .flash
            .as_ref()
            .expect("the caller checked the flash path");
        let fs = ws
            .flash
            .as_ref()
            .expect("a flash backend's workspaces have flash scratch");
        let (dev, md) = (self.dev(), self.md);
        let q = q.need(dl.rows * dl.q_len * md.heads * FLASH_DIM);
        let max_splits = match dl.splits {
            SplitForm::Cap => fs.max_splits,
            SplitForm::Grid(n) if n <= fs.max_splits => n,
            SplitForm::Grid(n) => {
                return Err(GpuBackendError::BadPlan(format!(
                    "a launch of {n} splits a request past the workspace's {}",
                    fs.max_splits
                )))
            }
            // A one-split shape; BalancedWork::shape sizes its partials below.
            SplitForm::Persistent => 1,
        };
        let shape = FlashShape {
            batch: dl.rows,
            q_len: dl.q_len,
            heads: md.heads,
            page: self.cfg.scheduler.page_size,
            width: dl.width,
            split_size_tokens: fp.policy.split_size_tokens,
            max_splits,
        };
        let bufs = FlashBufs {
            q,
            cache,
            block_table: dl.block_table,
            seq_lens: dl.seq_lens,
            mapped_kv_tokens: dl.mapped_kv,
            split_lens: dl.split_lens,
            num_splits: dl.num_splits,
            o_part: fs.o_part.ptr(),
            lse_part: fs.lse_part.ptr(),
            out: FlashOut::Bf16(o_lat),
            lse: ws.lse.ptr(),
            done: fs.done.ptr(),
        };
        // SAFETY: the launch's block table was written through block_ids (blocks inside
        // the pool, whose slots the bf16 cache holds, or -1) and its mapped keys are the
        // plan's, computed from that table (a -1 entry ends them); its split lengths come
        // from the plan's schedule under the config's policy, whose unit the flash path
        // requires to be a multiple of 64 (`portable_because`), checked by split_schedule.
        let scale = md.softmax_scale();
        if dl.splits == SplitForm::Persistent {
            let work = &fs.decode_work;
            let shape = BalancedWork::shape(work.partial_slots, shape);
            // SAFETY: as above; the work is core's schedule of this launch's split
            // schedule, written this step (eager_split_form).
            unsafe { fp.fk.flash_decode_balanced(dev, shape, bufs, work, scale) }?
        } else {
            // SAFETY: as above.
            unsafe { fp.fk.flash_decode(dev, shape, bufs, scale) }?
        }
        Ok(())
    }

    /// The split form of an eager step's uniform decode launch (`q_len` tokens a row):
    /// core's `invariant_launch` over the plan's split schedule `d.split`, on this device.
    /// Where it picks the persistent kernel, the step's balanced work (core's schedule of
    /// the same splits) is written into `ws`'s buffers for every layer's launch. Off the
    /// seesaw kernel (or on pages its copy engine does not take) the grid.
    pub(super) fn eager_split_form(
        &self,
        ws: &mut Workspace,
        d: &MlaDecodeMetadata,
        q_len: usize,
    ) -> Result<SplitForm> {
        let fp = self
            .flash
            .as_ref()
            .expect("the caller checked the flash path");
        let (dev, rows) = (self.dev(), d.kernel_rows);
        let splits: Vec<(u32, u32)> = d.split.split_len_tokens[..rows]
            .iter()
            .copied()
            .zip(d.split.num_splits[..rows].iter().copied())
            .collect();
        let largest = largest_split_count(splits.iter().map(|&(_, n)| n));
        let query_rows = q_len * self.md.heads;
        let page = self.cfg.scheduler.page_size;
        let seesaw = fp.fk.wide == WideKernel::Seesaw
            && fp.fk.decode_function(query_rows, page, WideKernel::Seesaw)
                == WideKernel::Seesaw.function();
        // Whole requests (invariant_launch keeps their one-split grid) ask the driver
        // nothing.
        if !seesaw || largest == 1 {
            return Ok(SplitForm::Grid(largest));
        }
        // invariant_launch reads the resident groups at the batch's largest count alone.
        let resident = fp.fk.resident_split_groups(dev, dev.sms, largest)?;
        let row_blocks = query_rows.div_ceil(FLASH_ROWS);
        match invariant_launch(&splits, row_blocks, dev.sms, &|_| resident) {
            InvariantLaunch::Grid { max_splits } => Ok(SplitForm::Grid(max_splits)),
            InvariantLaunch::Persistent(policy) => {
                let sched = balanced_schedule_of_splits(&d.plan_seq_lens[..rows], &splits, policy);
                let fs = ws.flash.as_mut().expect("a flash backend's workspaces");
                // A schedule past the workspace's buffers (more parts than MAX_PARTS) runs
                // on the grid, which gives the same bits.
                match fs.decode_work.rewrite(dev, &sched)? {
                    true => Ok(SplitForm::Persistent),
                    false => Ok(SplitForm::Grid(largest)),
                }
            }
        }
    }
}
