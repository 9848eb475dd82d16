//! The CUDA `Backend`: executes core-built plans on the device with the same weights and
//! the same paged latent cache layout as the CPU backend. Decode rows take the absorbed
//! split-KV kernel; prefill rows take the materialized path (causal new tokens, context
//! chunks gathered from the cache, LSE merge). Every kernel reduces each token on its
//! own in a fixed order, so the backend is batch-invariant by construction: a request's
//! bits do not depend on the rest of the batch, its row, padding rows, or graph vs eager.
//! Uniform decode steps on a captured size replay a CUDA graph of the whole forward.

use std::sync::Arc;

use specmla_core::backend::{Backend, DrafterOutput, TargetOutput};
use specmla_core::block_pool::{NO_BLOCK, PAD_SLOT};
use specmla_core::config::{EngineConfig, ModelDims};
use specmla_core::cudagraph::GraphShape;
use specmla_core::drafter::{DFlashPass, DrafterPass};
use specmla_core::plan::StepPlan;
use specmla_core::split::SplitSchedule;
use specmla_model::{DrafterModel, TargetModel};

use crate::device::{GpuDevice, GpuError};
use crate::launch::{Buf, DPtr};
use crate::ops::{Gemm, GemmAlgo, Kernels, MlaDims};
use crate::weights::{DrafterWeights, LayerWeights, TargetWeights, WeightForm};
use crate::workspace::{PrefillScratch, Workspace};

mod carry;
mod drafter;
mod drafter_graphs;
mod flash_path;
mod graphs;

pub use flash_path::portable_because;
use flash_path::FlashPath;
mod layers;
pub mod memory;
mod prefill;
mod target;
mod timing;
use carry::DeviceCarry;
use drafter::DraftShape;
use timing::{Region, SharedTimeline};

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum GpuBackendError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("step replays a graph of {0} tokens that was never captured")]
    GraphNotCaptured(usize),
    #[error("plan rejected by the GPU backend: {0}")]
    BadPlan(String),
}

impl GpuBackendError {
    /// Whether the error is the environment's (no GPU, no driver, a driver too old, no
    /// NVRTC, a compile failure, out of memory): those exit 2. A CUDA call that fails
    /// mid-run (a launch, a copy) is an engine failure and exits 1, like a bad plan.
    pub fn is_environment(&self) -> bool {
        match self {
            GpuBackendError::Gpu(e) => e.is_environment(),
            _ => false,
        }
    }
}

type Result<T> = std::result::Result<T, GpuBackendError>;

/// The attention of one layer: `(backend, layer, weights, attention output)`.
type AttendFn<'a> = dyn Fn(&GpuBackend, usize, &LayerWeights, DPtr<f32>) -> Result<()> + 'a;

/// One captured uniform-decode graph; its kernels address the backend's one graph
/// workspace (`GpuBackend::graph_ws`).
struct CapturedGraph {
    shape: GraphShape,
    graph: timing::TimedGraph,
}

/// How the decode rows of one launch are laid out.
#[derive(Clone, Copy, Debug)]
struct DecodeLaunch {
    /// First token of the launch in the step's token order.
    token_start: usize,
    rows: usize,
    q_len: usize,
    block_table: DPtr<i32>,
    width: usize,
    seq_lens: DPtr<i32>,
    /// The rows' split schedule (lengths, counts, mapped keys), `[rows]` each.
    split_lens: DPtr<i32>,
    num_splits: DPtr<i32>,
    mapped_kv: DPtr<i32>,
    /// How the flash kernels run the launch's splits.
    splits: SplitForm,
}

/// How a flash decode launch runs its splits. A graph freezes its grid, so it launches
/// the policy's cap; an eager launch takes what core's `invariant_launch` picks for the
/// plan's schedule (the same bits either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SplitForm {
    /// The split grid of the policy's cap (`FlashScratch::max_splits`).
    Cap,
    /// The split grid of this many splits a request: the launch's largest count.
    Grid(usize),
    /// The persistent kernel on the step's balanced work (`FlashScratch::decode_work`).
    Persistent,
}

/// Which latent cache a decode launch reads.
#[derive(Clone, Copy, Debug)]
enum CacheOf {
    /// The target's, of this layer.
    Target(usize),
    Drafter,
}

/// The CUDA backend.
pub struct GpuBackend {
    dev: Arc<GpuDevice>,
    k: Kernels,
    cfg: EngineConfig,
    dims: ModelDims,
    md: MlaDims,
    target: TargetWeights,
    drafter: DrafterWeights,
    /// `[layers, slots, latent]`, NaN-poisoned.
    target_cache: Buf<f32>,
    /// `[slots, latent]`, NaN-poisoned.
    drafter_cache: Buf<f32>,
    num_slots: usize,
    eager: Option<Workspace>,
    scratch: Option<PrefillScratch>,
    /// The current step's prefill index arrays, on the tensor-core prefill path.
    prefill_index: Option<prefill::PrefillIndex>,
    /// Prefill rows and DFlash blocks on the portable f32 kernels although the flash
    /// path could take them (`set_portable_prefill`: the reference it is timed against).
    portable_prefill: bool,
    graphs: Vec<CapturedGraph>,
    /// The persistent buffers every captured graph reads and writes in place, sized for
    /// the largest capture: graphs replay one at a time, so one set serves them all.
    graph_ws: Option<Workspace>,
    /// The multi-step drafter's graphs, one per pass shape met (`drafter_graphs.rs`),
    /// and the one workspace they share.
    draft_graphs: Vec<(DraftShape, timing::TimedGraph)>,
    draft_ws: Option<Workspace>,
    /// The tensor-core decode path, where the configuration and device take it.
    flash: Option<FlashPath>,
    /// Why the decode rows run the portable kernels (`None` on the flash path).
    portable_because: Option<String>,
    /// Where the current step's time goes (`timing.rs`).
    timeline: SharedTimeline,
    /// Whether forwards return their full tensors (otherwise digests only).
    full_outputs: bool,
    /// The hidden states drafter passes continue from (`carry.rs`).
    carry: DeviceCarry,
}

impl GpuBackend {
    /// Opens device 0, compiles the kernels, uploads the weights and allocates caches.
    pub fn new(
        cfg: &EngineConfig,
        target: Arc<TargetModel>,
        drafter: Arc<DrafterModel>,
    ) -> Result<Self> {
        let dev = Arc::new(GpuDevice::open(0)?);
        Self::on_device(dev, cfg, target, drafter)
    }

    /// [`Self::new`] on an already open device.
    pub fn on_device(
        dev: Arc<GpuDevice>,
        cfg: &EngineConfig,
        target: Arc<TargetModel>,
        drafter: Arc<DrafterModel>,
    ) -> Result<Self> {
        let portable_because = flash_path::portable_because(cfg, &dev.arch);
        let mut allocs = specmla_core::memory::allocations(cfg);
        if portable_because.is_none() {
            allocs.extend(flash_path::flash_allocations(cfg));
        }
        let splits = portable_because
            .is_none()
            .then(|| cfg.split_policy().max_splits);
        allocs.extend(memory::workspace_allocations(cfg, splits));
        dev.check_fits(&allocs)?;
        let flash = match portable_because {
            None => Some(FlashPath::new(&dev, cfg)?),
            Some(_) => None,
        };
        let k = Kernels::load(&dev)?;
        let form = match flash {
            Some(_) => WeightForm::Bf16,
            None => WeightForm::F32,
        };
        let d = cfg.model.clone();
        let num_slots = cfg.scheduler.num_gpu_blocks * cfg.scheduler.page_size;
        let latent = d.latent_dim();
        let target_cache = Buf::uninit(&dev, d.num_layers * num_slots * latent, "target KV cache")?;
        let drafter_cache = Buf::uninit(&dev, num_slots * latent, "drafter KV cache")?;
        // Unwritten slots read as NaN, as on the CPU, so a stale read cannot pass.
        k.fill(&dev, target_cache.ptr(), f32::NAN, target_cache.len())?;
        k.fill(&dev, drafter_cache.ptr(), f32::NAN, drafter_cache.len())?;
        Ok(Self {
            target: TargetWeights::generate(&dev, &k, &target, form)?,
            drafter: DrafterWeights::generate(&dev, &k, &drafter, form)?,
            md: MlaDims::from(&d),
            dims: d,
            cfg: cfg.clone(),
            target_cache,
            drafter_cache,
            num_slots,
            eager: None,
            scratch: None,
            prefill_index: None,
            portable_prefill: false,
            graphs: Vec::new(),
            graph_ws: None,
            draft_graphs: Vec::new(),
            draft_ws: None,
            flash,
            portable_because,
            timeline: SharedTimeline::default(),
            full_outputs: false,
            carry: DeviceCarry::new(&dev, DeviceCarry::capacity(cfg), cfg.model.hidden_size)?,
            k,
            dev,
        })
    }

    /// Chooses how the bf16 path's GEMMs pick their algorithm (batch-invariant by
    /// default); call before the first step. The portable path has no GEMM to choose.
    pub fn set_gemm_algo(&mut self, algo: GemmAlgo) -> Result<()> {
        if let Some(fp) = &mut self.flash {
            fp.gemm = Gemm::new(&self.dev, algo)?;
        }
        Ok(())
    }

    /// Runs prefill rows on the portable f32 kernels even on the flash path, to time the
    /// tensor-core prefill against them; call before the first step. Multi-step drafters
    /// only: a flash workspace has no f32 absorbed queries for DFlash's portable blocks.
    /// The memory check counted the tensor-core prefill's scratch, which is smaller.
    pub fn set_portable_prefill(&mut self, portable: bool) {
        self.portable_prefill = portable;
    }

    /// How the bf16 path's GEMMs pick their algorithm (`None` on the portable path).
    pub fn gemm_algo(&self) -> Option<GemmAlgo> {
        self.flash.as_ref().map(|f| f.gemm.algo)
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// The device and the kernels its decode rows run, for reports.
    pub fn device_line(&self) -> String {
        match &self.portable_because {
            None => format!(
                "{}; decode rows on the bf16 flash kernels ({}), projections on cuBLASLt ({} \
                 algorithms)",
                self.dev.name,
                self.flash.as_ref().map_or("", |f| f.fk.wide.function()),
                self.gemm_algo().map_or("", GemmAlgo::name)
            ),
            Some(why) => format!("{}; portable f32 kernels ({why})", self.dev.name),
        }
    }

    /// A workspace for `dims` (tokens, rows, table width), with the flash decode's
    /// scratch on the flash path.
    fn new_workspace(&self, dims: (usize, usize, usize)) -> Result<Workspace> {
        let splits = self.flash.as_ref().map(|f| f.policy.max_splits);
        Ok(Workspace::new(
            &self.dev,
            &self.dims,
            self.dims.num_layers,
            dims,
            splits,
        )?)
    }

    fn f32_cache(&self, c: CacheOf) -> DPtr<f32> {
        match c {
            CacheOf::Target(l) => self.layer_cache(l),
            CacheOf::Drafter => self.drafter_cache.ptr(),
        }
    }

    /// Writes `n` latents of `ws.latent` to `slots` of cache `c`, and of its bf16 copy on
    /// the flash path.
    ///
    /// # Safety
    /// Every slot in `ws.slots[..n]` passed [`Self::check_slots`].
    unsafe fn write_latents(&self, ws: &Workspace, c: CacheOf, n: usize) -> Result<()> {
        let lat = self.dims.latent_dim();
        let (dev, k) = (self.dev(), &self.k);
        let (latent, slots) = (ws.latent.ptr(), ws.slots.ptr());
        // SAFETY: the caller's promise; both caches hold num_slots slots.
        unsafe { k.kv_write(dev, latent, slots, self.f32_cache(c), (n, lat)) }?;
        if let Some(fp) = &self.flash {
            // SAFETY: as above.
            unsafe { k.kv_write_bf16(dev, latent, slots, fp.cache(c), (n, lat)) }?;
        }
        Ok(())
    }

    fn dev(&self) -> &GpuDevice {
        &self.dev
    }

    fn layer_cache(&self, l: usize) -> DPtr<f32> {
        let per = self.num_slots * self.dims.latent_dim();
        self.target_cache.ptr().range(l * per, per)
    }

    fn attn_width(&self) -> usize {
        self.dims.num_heads * self.dims.v_head_dim
    }
}

// Host-side validation: kernels index with these values, so they are checked before
// they reach the device instead of faulting there.
impl GpuBackend {
    fn check_tokens(&self, ids: &[u32]) -> Result<Vec<i32>> {
        ids.iter()
            .map(|&t| {
                if (t as usize) < self.dims.vocab_size {
                    Ok(t as i32)
                } else {
                    Err(GpuBackendError::BadPlan(format!(
                        "token {t} outside the vocabulary"
                    )))
                }
            })
            .collect()
    }

    fn check_slots(&self, slots: &[i64]) -> Result<()> {
        match slots
            .iter()
            .find(|&&s| s != PAD_SLOT && (s < 0 || s as usize >= self.num_slots))
        {
            Some(s) => Err(GpuBackendError::BadPlan(format!(
                "slot {s} outside the cache of {} slots",
                self.num_slots
            ))),
            None => Ok(()),
        }
    }

    /// Uploads row indices into `ws.logits_idx`, each checked below `n` first: the rows
    /// [`Self::gather`] will read.
    fn set_gather_rows(&self, ws: &mut Workspace, idx: &[i32], n: usize) -> Result<()> {
        if let Some(i) = idx.iter().find(|&&i| i < 0 || i as usize >= n) {
            return Err(GpuBackendError::BadPlan(format!(
                "index {i} outside the {n} rows it gathers from"
            )));
        }
        ws.logits_idx.write(&self.dev, idx)?;
        Ok(())
    }

    /// `out[i] = src[ws.logits_idx[i]]` for the `rows` indices [`Self::set_gather_rows`]
    /// uploaded, rows of `width` values: the one place the backend's unchecked gather runs.
    fn gather(
        &self,
        ws: &Workspace,
        src: DPtr<f32>,
        out: DPtr<f32>,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        // SAFETY: ws.logits_idx is written only by set_gather_rows, which checked every
        // index against the rows it gathers from.
        unsafe {
            self.k
                .gather_rows(&self.dev, src, ws.logits_idx.ptr(), out, rows, width)
        }?;
        Ok(())
    }

    /// The first `n` rows of a split schedule as the decode kernels take them, `[split
    /// lengths, split counts, mapped keys]`, checked so no split offset overflows the
    /// kernels' ints.
    fn split_schedule(&self, s: &SplitSchedule, n: usize) -> Result<[Vec<i32>; 3]> {
        let (lens, counts) = (&s.split_len_tokens[..n], &s.num_splits[..n]);
        let mapped = &s.mapped_kv_tokens[..n];
        if let Some(m) = mapped.iter().find(|&&m| m > i32::MAX as u32) {
            return Err(GpuBackendError::BadPlan(format!("{m} mapped keys")));
        }
        // The flash kernels' tiles need whole units of 64 keys (the path requires a unit
        // that is a multiple of 64).
        let unit = self
            .flash
            .as_ref()
            .map_or(1, |f| f.policy.split_size_tokens as u32);
        let bad = lens.iter().zip(counts).find(|&(&l, &c)| {
            l == 0 || l % unit != 0 || (l as u64) * (c as u64 + 1) > i32::MAX as u64
        });
        if let Some((l, c)) = bad {
            return Err(GpuBackendError::BadPlan(format!(
                "split schedule of {c} splits of {l} keys"
            )));
        }
        Ok([as_i32(lens), as_i32(counts), as_i32(mapped)])
    }

    /// Block ids as the kernels take them: NO_BLOCK becomes -1 (reads as NaN).
    fn block_ids(&self, table: &[u32]) -> Result<Vec<i32>> {
        let blocks = self.cfg.scheduler.num_gpu_blocks;
        table
            .iter()
            .map(|&b| match b {
                NO_BLOCK => Ok(-1),
                b if (b as usize) < blocks => Ok(b as i32),
                b => Err(GpuBackendError::BadPlan(format!(
                    "block {b} outside the pool of {blocks}"
                ))),
            })
            .collect()
    }
}

/// Positions, lengths and counts as the kernels take them (bounded by max_model_len and
/// the other limits config validation caps).
fn as_i32(p: &[u32]) -> Vec<i32> {
    p.iter().map(|&x| x as i32).collect()
}

impl Backend for GpuBackend {
    type Error = GpuBackendError;
    const KIND: &'static str = "gpu";

    fn device_name(&self) -> String {
        self.device_line()
    }

    /// The arch and attention path: what decides the bits.
    fn kernels(&self) -> String {
        match &self.flash {
            Some(f) => format!(
                "{}; bf16 flash decode ({}, {}); cuBLASLt bf16 GEMMs ({})",
                self.dev.arch,
                f.fk.wide.function(),
                f.fk.wide.numerics(),
                f.gemm.algo.name()
            ),
            None => format!("{}; portable f32", self.dev.arch),
        }
    }

    /// The flash path's decode takes queries and probabilities in bf16, and its
    /// projections bf16 activations.
    fn bf16_compute(&self) -> bool {
        self.flash.is_some()
    }

    fn is_environment(e: &GpuBackendError) -> bool {
        e.is_environment()
    }

    /// The f32 kernels hold a decode row's latent values (`kv_lora_rank`) and a prefill
    /// row's `v_head_dim` values in registers, a fixed number per thread.
    fn check_dims(d: &specmla_core::config::ModelDims) -> std::result::Result<(), String> {
        if d.kv_lora_rank > crate::ops::MAX_DECODE_DV {
            return Err(format!(
                "kv_lora_rank {} is above the decode kernel's {}",
                d.kv_lora_rank,
                crate::ops::MAX_DECODE_DV
            ));
        }
        if d.v_head_dim > crate::ops::MAX_PREFILL_DV {
            return Err(format!(
                "v_head_dim {} is above the prefill kernel's {}",
                d.v_head_dim,
                crate::ops::MAX_PREFILL_DV
            ));
        }
        Ok(())
    }

    fn set_full_outputs(&mut self, on: bool) {
        self.full_outputs = on;
    }

    fn capture_graphs(&mut self, shapes: &[GraphShape]) -> Result<()> {
        // The core hands over the shapes as the capture froze them (F2 included).
        self.graphs.clear();
        self.graph_ws = None;
        let Some(dims) = graph_ws_dims(&self.cfg, shapes) else {
            return Ok(());
        };
        let ws = self.new_workspace(dims)?;
        for &s in shapes {
            let g = self.capture(&ws, s)?;
            self.graphs.push(g);
        }
        self.graph_ws = Some(ws);
        Ok(())
    }

    fn set_check_forwards(&mut self, on: bool) {
        self.set_check_forwards_timing(on);
    }

    fn take_step_time(&mut self) -> Option<specmla_core::backend::StepTime> {
        Some(self.take_step_timing())
    }

    fn forward_target(&mut self, plan: &StepPlan) -> Result<TargetOutput> {
        let n = plan.num_tokens();
        self.carry.check(n, 0)?;
        self.begin_forward()?;
        let mut out = self.forward_target_body(plan)?;
        self.end_forward()?;
        self.carry.target_rows = n;
        out.forward_id = self.carry.ids.new_target();
        Ok(out)
    }

    fn forward_drafter(
        &mut self,
        pass: &DrafterPass,
        target: &TargetOutput,
        prev: Option<&DrafterOutput>,
    ) -> Result<DrafterOutput> {
        let ids = (target.forward_id, prev.map(|p| p.forward_id));
        self.carry_ahead(ids, pass.num_rows())?;
        self.begin_forward()?;
        let mut out = self.forward_drafter_body(pass, prev.is_some())?;
        self.end_forward()?;
        self.carry.drafter_rows = pass.num_rows();
        out.forward_id = self.carry.ids.new_drafter();
        Ok(out)
    }

    fn forward_dflash(
        &mut self,
        pass: &DFlashPass,
        target: &TargetOutput,
    ) -> Result<DrafterOutput> {
        let rows = pass.sample_indices.len();
        self.carry_ahead((target.forward_id, None), rows)?;
        self.begin_forward()?;
        let mut out = self.forward_dflash_body(pass)?;
        self.end_forward()?;
        self.carry.drafter_rows = rows;
        out.forward_id = self.carry.ids.new_drafter();
        Ok(out)
    }
}

/// The forwards' bodies, timed as a whole by the `Backend` impl above.
impl GpuBackend {
    fn forward_target_body(&mut self, plan: &StepPlan) -> Result<TargetOutput> {
        match &plan.cudagraph {
            Some(gd) => {
                let n = gd.shape.num_tokens;
                let idx = self
                    .graphs
                    .iter()
                    .position(|g| g.shape.num_tokens == n)
                    .ok_or(GpuBackendError::GraphNotCaptured(n))?;
                self.replay(plan, idx)
            }
            None => self.forward_eager(plan),
        }
    }

    /// Before a drafter pass: the outputs it names are the ones carried, and the drafter
    /// carry has room for the `rows` it will write.
    fn carry_ahead(&mut self, (target, prev): (u64, Option<u64>), rows: usize) -> Result<()> {
        let ids = &self.carry.ids;
        ids.check(target, prev).map_err(GpuBackendError::BadPlan)?;
        self.carry.check(0, rows)
    }

    fn forward_drafter_body(&mut self, pass: &DrafterPass, prev: bool) -> Result<DrafterOutput> {
        let n = pass.token_ids.len();
        let sources = self.carried_rows(&pass.hidden, prev)?;
        if self.drafter_graph_fits(pass) {
            return self.drafter_on_graph(pass, &sources);
        }
        let rows = pass.num_rows();
        self.ensure_eager(n.max(1), rows.max(1), pass.block_table_width)?;
        let mut ws = self.eager.take().expect("ensured above");
        let res = self.drafter_eager(&mut ws, pass, &sources);
        self.eager = Some(ws);
        res
    }

    fn forward_dflash_body(&mut self, pass: &DFlashPass) -> Result<DrafterOutput> {
        if self.portable_prefill && self.flash.is_some() {
            return Err(GpuBackendError::BadPlan(
                "DFlash blocks run on the TMA prefill on the flash path (portable prefill set)"
                    .into(),
            ));
        }
        let (e, b) = (pass.context_token_indices.len(), pass.block_len);
        let nb = pass.block_tokens.len();
        let rows = pass.req_ids.len();
        let keys = pass.context_lens.iter().map(|&c| c as usize + b);
        // The tensor-core path attends every row at once, the portable one a row at a time.
        let max_keys = match self.prefill_on_flash() {
            true => keys.sum::<usize>().max(nb),
            false => keys.max().unwrap_or(0),
        };
        self.ensure_eager(
            e.max(nb).max(1),
            rows.max(b).max(1),
            pass.block_table_width.max(1),
        )?;
        self.ensure_scratch(max_keys)?;
        let mut ws = self.eager.take().expect("ensured above");
        let res = self.dflash_body(&mut ws, pass);
        self.eager = Some(ws);
        res
    }
}

/// The one graph workspace's (tokens, rows, table width): the largest capture's.
fn graph_ws_dims(cfg: &EngineConfig, shapes: &[GraphShape]) -> Option<(usize, usize, usize)> {
    let tokens = shapes.iter().map(|s| s.num_tokens).max()?;
    let rows = shapes.iter().map(|s| s.num_rows).max()?;
    Some((tokens, rows, cfg.scheduler.max_blocks_per_seq()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_errors_exit_2_and_engine_failures_exit_1() {
        let env = GpuBackendError::Gpu(GpuError::NoDriver("libcuda missing".into()));
        assert!(env.is_environment());
        let oom = GpuError::alloc(
            "target KV cache",
            1 << 40,
            cudarc::driver::DriverError(
                cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY,
            ),
        );
        assert!(GpuBackendError::Gpu(oom).is_environment());
        let launch = GpuError::Driver {
            what: "launching mla_decode".into(),
            source: cudarc::driver::DriverError(
                cudarc::driver::sys::cudaError_enum::CUDA_ERROR_ILLEGAL_ADDRESS,
            ),
        };
        assert!(!GpuBackendError::Gpu(launch).is_environment());
        assert!(!GpuBackendError::BadPlan("slot 9 outside the cache".into()).is_environment());
        assert!(!GpuBackendError::GraphNotCaptured(8).is_environment());
    }
}
