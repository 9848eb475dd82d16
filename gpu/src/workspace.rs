//! Device activations of one forward: sized for a token capacity, reused across steps
//! (eager) or owned by one captured graph, whose kernels read these exact addresses on
//! every replay.

use specmla_core::config::ModelDims;

use crate::device::{GpuDevice, GpuError};
use crate::launch::Buf;
use crate::ops::BalancedWork;

/// Activations and per-step inputs for up to `cap` tokens and `rows_cap` rows.
pub struct Workspace {
    pub cap: usize,
    pub rows_cap: usize,
    /// Block-table width of `block_table`.
    pub width: usize,
    pub ids: Buf<i32>,
    pub positions: Buf<i32>,
    pub slots: Buf<i64>,
    pub block_table: Buf<i32>,
    pub seq_lens: Buf<i32>,
    /// The decode split schedule's split lengths, counts and mapped keys, `[rows_cap]` each.
    pub split_lens: Buf<i32>,
    pub num_splits: Buf<i32>,
    pub mapped_kv: Buf<i32>,
    /// The flash decode's inputs and scratch, where the backend runs it.
    pub flash: Option<FlashScratch>,
    pub logits_idx: Buf<i32>,
    /// A drafter pass's hidden sources over the carries (`gather_rows2`'s indices).
    pub src_idx: Buf<i32>,
    /// Residual stream `[cap, hidden]`.
    pub x: Buf<f32>,
    /// Normed activations `[cap, hidden]`.
    pub h: Buf<f32>,
    /// The compressed queries `[cap, q_lora_rank]` (one value where the model has none).
    pub q_a: Buf<f32>,
    /// Queries `[cap, heads, nope + rope]`.
    pub q: Buf<f32>,
    /// Latent rows `[cap, kv_lora + rope]`.
    pub latent: Buf<f32>,
    /// Absorbed queries `[cap, heads, kv_lora + rope]` in f32 (none on the flash path, see
    /// `portable_latent_tokens`).
    pub q_lat: Buf<f32>,
    /// Decode output in the latent space `[cap, heads, kv_lora]` in f32 (none on the flash
    /// path, as `q_lat`: its rows are bf16, [`FlashScratch::o_lat`]).
    pub o_lat: Buf<f32>,
    /// Decode LSE `[heads, cap]`.
    pub lse: Buf<f32>,
    /// Attention output per layer `[layers, cap, heads * v]`.
    pub attn: Buf<f32>,
    pub gate: Buf<f32>,
    pub up: Buf<f32>,
    pub act: Buf<f32>,
    /// Staging for compactions and concatenations, `[cap, max(heads * qk, 2 * hidden)]`.
    pub tmp: Buf<f32>,
    /// Rows the LM head reads `[cap, hidden]`.
    pub xs: Buf<f32>,
    /// `[cap, vocab]`.
    pub logits: Buf<f32>,
    /// Row digests of the hidden states and of each layer's attention outputs, `[1 +
    /// layers, cap]`: what the host reads each step instead of the tensors.
    pub digests: Buf<u64>,
}

/// Tokens of f32 absorbed queries and latent outputs a workspace holds: none on the flash
/// path where its prefill takes DFlash's blocks too (the flash decode's queries and rows
/// are bf16, in its scratch); one row per token where the portable decode or DFlash's
/// portable blocks read and write them.
fn portable_latent_tokens(d: &ModelDims, cap: usize, flash_splits: Option<usize>) -> usize {
    match flash_splits.is_some() && crate::ops::prefill_widths_fit(d) {
        true => 0,
        false => cap,
    }
}

impl Workspace {
    /// Allocates a workspace; `layers` is how many attention outputs it keeps.
    pub fn new(
        dev: &GpuDevice,
        d: &ModelDims,
        layers: usize,
        (cap, rows_cap, width): (usize, usize, usize),
        flash_splits: Option<usize>,
    ) -> Result<Self, GpuError> {
        let (hid, heads) = (d.hidden_size, d.num_heads);
        let portable = portable_latent_tokens(d, cap, flash_splits);
        let f = |len: usize, what: &str| Buf::<f32>::uninit(dev, len, &format!("workspace {what}"));
        let i = |len: usize, what: &str| Buf::<i32>::uninit(dev, len, &format!("workspace {what}"));
        Ok(Self {
            cap,
            rows_cap,
            width,
            ids: i(cap, "token_ids")?,
            positions: i(cap, "positions")?,
            slots: Buf::uninit(dev, cap, "workspace slot_mapping")?,
            block_table: i(rows_cap * width, "block_table")?,
            seq_lens: i(rows_cap, "seq_lens")?,
            split_lens: i(rows_cap, "split_lens")?,
            num_splits: i(rows_cap, "num_splits")?,
            mapped_kv: i(rows_cap, "mapped keys")?,
            flash: match flash_splits {
                Some(n) => Some(FlashScratch::new(dev, d, (cap, rows_cap), n)?),
                None => None,
            },
            logits_idx: i(cap, "logits_indices")?,
            src_idx: i(cap, "hidden sources")?,
            x: f(cap * hid, "hidden")?,
            h: f(cap * hid, "normed hidden")?,
            q_a: f(cap * d.q_lora_rank.max(1), "compressed queries")?,
            q: f(cap * heads * d.qk_head_dim(), "queries")?,
            latent: f(cap * d.latent_dim(), "latent rows")?,
            q_lat: f(portable * heads * d.latent_dim(), "absorbed queries")?,
            o_lat: f(portable * heads * d.kv_lora_rank, "latent attention output")?,
            lse: f(cap * heads, "decode lse")?,
            attn: f(layers * cap * heads * d.v_head_dim, "attention outputs")?,
            gate: f(cap * d.intermediate_size, "mlp gate")?,
            up: f(cap * d.intermediate_size, "mlp up")?,
            act: f(cap * d.intermediate_size, "mlp activation")?,
            tmp: f(cap * (heads * d.qk_head_dim()).max(2 * hid), "staging")?,
            xs: f(cap * hid, "lm-head rows")?,
            logits: f(cap * d.vocab_size, "logits")?,
            digests: Buf::uninit(dev, (1 + layers) * cap, "workspace row digests")?,
        })
    }

    /// The bytes [`Self::new`] allocates for these arguments, to check a configuration
    /// against the device before allocating (a gpu-test case holds the two equal).
    pub fn bytes(
        d: &ModelDims,
        layers: usize,
        (cap, rows_cap, width): (usize, usize, usize),
        flash_splits: Option<usize>,
    ) -> u64 {
        let (hid, heads, inter) = (d.hidden_size, d.num_heads, d.intermediate_size);
        let portable = portable_latent_tokens(d, cap, flash_splits);
        // Every buffer's element count, as `new` allocates it (at least one element).
        let i32s = [
            cap,
            cap,
            rows_cap * width,
            rows_cap,
            rows_cap,
            rows_cap,
            rows_cap,
            cap, // logits_idx
            cap, // src_idx
        ];
        let f32s = [
            cap * hid, // x
            cap * hid, // h
            cap * d.q_lora_rank.max(1),
            cap * heads * d.qk_head_dim(),
            cap * d.latent_dim(),
            portable * heads * d.latent_dim(),
            portable * heads * d.kv_lora_rank,
            cap * heads,
            layers * cap * heads * d.v_head_dim,
            cap * inter, // gate
            cap * inter, // up
            cap * inter, // act
            cap * (heads * d.qk_head_dim()).max(2 * hid),
            cap * hid, // xs
            cap * d.vocab_size,
        ];
        let (i64s, u64s) = ([cap], [(1 + layers) * cap]);
        let sum = |counts: &[usize], size: u64| -> u64 {
            counts.iter().map(|&n| n.max(1) as u64 * size).sum()
        };
        let flash = flash_splits.map_or(0, |n| FlashScratch::bytes(d, (cap, rows_cap), n));
        sum(&i32s, 4) + sum(&f32s, 4) + sum(&i64s, 8) + sum(&u64s, 8) + flash
    }

    /// Whether this workspace can hold a step of this size.
    pub fn fits(&self, cap: usize, rows: usize, width: usize) -> bool {
        cap <= self.cap && rows <= self.rows_cap && width == self.width
    }
}

/// What the bf16 path reads and writes beyond the shared activations: the absorbed
/// queries and the decode's rows in bf16, the split partials for up to `max_splits`
/// splits, the split counters (zero; the kernels re-arm them, so a graph replays them as
/// captured) and the GEMMs' bf16 inputs.
pub struct FlashScratch {
    /// `[cap, heads, 576]` bf16.
    pub q: Buf<u16>,
    /// The decode's rows `[cap, heads, 512]` in bf16, what the W_UV GEMM reads.
    pub o_lat: Buf<u16>,
    pub o_part: Buf<f32>,
    pub lse_part: Buf<f32>,
    pub done: Buf<i32>,
    pub max_splits: usize,
    /// A GEMM's input rounded to bf16, `[cap, widest input]`.
    pub gemm_in: Buf<u16>,
    /// An eager step's balanced work, where its uniform decode launch takes the persistent
    /// kernel (written once a step, read by every layer's launch), for up to `rows_cap`
    /// requests of up to `max_splits` pieces.
    pub decode_work: BalancedWork,
}

impl FlashScratch {
    /// The bytes [`Self::new`] allocates.
    fn bytes(d: &ModelDims, (cap, rows_cap): (usize, usize), max_splits: usize) -> u64 {
        let rows = cap * d.num_heads;
        let one = |n: usize| n.max(1) as u64;
        one(rows * d.latent_dim()) * 2
            + one(rows * d.kv_lora_rank) * 2
            + one(max_splits * rows * d.kv_lora_rank) * 4
            + one(max_splits * rows) * 4
            + one(rows.div_ceil(64) + rows_cap) * 4
            + one(cap * gemm_input_width(d)) * 2
            + BalancedWork::capacity_bytes(rows_cap, max_splits)
    }

    fn new(
        dev: &GpuDevice,
        d: &ModelDims,
        (cap, rows_cap): (usize, usize),
        max_splits: usize,
    ) -> Result<Self, GpuError> {
        let rows = cap * d.num_heads;
        Ok(Self {
            q: Buf::uninit(
                dev,
                rows * d.latent_dim(),
                "workspace bf16 absorbed queries",
            )?,
            o_lat: Buf::uninit(dev, rows * d.kv_lora_rank, "workspace bf16 decode output")?,
            o_part: Buf::uninit(
                dev,
                max_splits * rows * d.kv_lora_rank,
                "workspace split partials",
            )?,
            lse_part: Buf::uninit(dev, max_splits * rows, "workspace split partial lse")?,
            // A request's counters: one per 64 query rows; rows of all requests together
            // are at most cap * heads, plus one partial block per request.
            done: Buf::from_host(
                dev,
                &vec![0i32; rows.div_ceil(64) + rows_cap],
                "workspace split counters",
            )?,
            max_splits,
            gemm_in: Buf::uninit(dev, cap * gemm_input_width(d), "workspace bf16 GEMM input")?,
            decode_work: BalancedWork::with_capacity(dev, rows_cap, max_splits)?,
        })
    }
}

/// The widest row a GEMM of the bf16 path reads: the drafter's `[embedding | hidden]`,
/// the queries and latent outputs of all heads (absorption, value up-projection), the
/// attention output (o_proj) or the MLP activation.
fn gemm_input_width(d: &ModelDims) -> usize {
    let heads = d.num_heads;
    [
        2 * d.hidden_size,
        heads * d.qk_head_dim(),
        heads * d.kv_lora_rank,
        heads * d.v_head_dim,
        d.intermediate_size,
        d.q_lora_rank,
    ]
    .into_iter()
    .max()
    .unwrap_or(0)
}

/// Grow-only scratch of the prefill path: K/V expansions, gathered context chunks and
/// partial attention states. On the tensor-core prefill (`flash`) the keys and values
/// are bf16 up-projections, and neither the f32 expansions nor the f32 context rows
/// (the portable path's, DFlash's included) are allocated.
pub struct PrefillScratch {
    pub cap: usize,
    pub k_nope: Buf<f32>,
    pub v: Buf<f32>,
    pub keys: Buf<f32>,
    pub part_out: Buf<f32>,
    pub part_lse: Buf<f32>,
    pub new_out: Buf<f32>,
    pub new_lse: Buf<f32>,
    pub ctx_lse: Buf<f32>,
    pub flash: Option<FlashPrefillScratch>,
}

/// The tensor-core prefill's bf16 operands, for up to `cap` queries or keys at once.
pub struct FlashPrefillScratch {
    /// `[cap, heads, nope + rope]`: the prefill tokens' queries.
    pub q: Buf<u16>,
    /// `[cap, latent]`: the keys' latent rows (new tokens, or a gathered context chunk);
    /// their rope part is the kernel's k_rope.
    pub latent: Buf<u16>,
    /// `[cap, heads, nope + v]`: the latent rows up-projected, k_nope then v per head.
    pub kv: Buf<u16>,
}

impl PrefillScratch {
    /// The elements of each f32 buffer, in [`Self::new`]'s order, and of each bf16 one.
    fn sizes(d: &ModelDims, cap: usize, flash: bool) -> ([usize; 8], [usize; 3]) {
        let heads = d.num_heads;
        let expand = if flash { 0 } else { cap };
        let f32s = [
            expand * heads * d.qk_nope_head_dim,
            expand * heads * d.v_head_dim,
            expand * d.latent_dim(),
            cap * heads * d.v_head_dim,
            cap * heads,
            cap * heads * d.v_head_dim,
            cap * heads,
            cap * heads,
        ];
        let bf16s = match flash {
            true => [
                cap * heads * d.qk_head_dim(),
                cap * d.latent_dim(),
                cap * heads * (d.qk_nope_head_dim + d.v_head_dim),
            ],
            false => [0; 3],
        };
        (f32s, bf16s)
    }

    /// The bytes [`Self::new`] allocates.
    pub fn bytes(d: &ModelDims, cap: usize, flash: bool) -> u64 {
        let (f32s, bf16s) = Self::sizes(d, cap, flash);
        let f: u64 = f32s.iter().map(|&n| n.max(1) as u64 * 4).sum();
        let b: u64 = match flash {
            true => bf16s.iter().map(|&n| n.max(1) as u64 * 2).sum(),
            false => 0,
        };
        f + b
    }

    /// Scratch for up to `cap` keys or queries at once, with the tensor-core prefill's
    /// operands when `flash`.
    pub fn new(dev: &GpuDevice, d: &ModelDims, cap: usize, flash: bool) -> Result<Self, GpuError> {
        let ([kn, v, keys, po, pl, no, nl, cl], [q, lat, kv]) = Self::sizes(d, cap, flash);
        let f = |len: usize, what: &str| {
            Buf::<f32>::uninit(dev, len.max(1), &format!("prefill scratch {what}"))
        };
        let b = |len: usize, what: &str| {
            Buf::<u16>::uninit(dev, len.max(1), &format!("prefill scratch {what} (bf16)"))
        };
        Ok(Self {
            cap,
            k_nope: f(kn, "k_nope")?,
            v: f(v, "v")?,
            keys: f(keys, "context keys")?,
            part_out: f(po, "chunk output")?,
            part_lse: f(pl, "chunk lse")?,
            new_out: f(no, "new-token output")?,
            new_lse: f(nl, "new-token lse")?,
            ctx_lse: f(cl, "context lse")?,
            flash: match flash {
                true => Some(FlashPrefillScratch {
                    q: b(q, "queries")?,
                    latent: b(lat, "latent rows")?,
                    kv: b(kv, "up-projected keys and values")?,
                }),
                false => None,
            },
        })
    }
}
