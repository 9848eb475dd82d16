//! Configuration: model dimensions, speculation, scheduler limits and the backend
//! capability matrix (RULES §1 and §4). Everything the rest of the core derives
//! its decisions from lives here, validated once at start-up.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Upper bounds keep every size the backends allocate far from overflow; configs can
/// come from trace files, not only from code.
fn check_limits(what: &str, limits: &[(&str, usize, usize)]) -> Result<(), ConfigError> {
    match limits.iter().find(|(_, v, max)| v > max) {
        Some((name, v, max)) => Err(ConfigError::Invalid(format!(
            "{what}{name} = {v} is above {max}"
        ))),
        None => Ok(()),
    }
}

/// Attention/model dimensions of an MLA model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDims {
    /// Residual stream width.
    pub hidden_size: usize,
    /// Transformer layers of the target model.
    pub num_layers: usize,
    /// Query heads (per tensor-parallel rank).
    pub num_heads: usize,
    /// Width of the query's low-rank compression (`q_a_proj`, normed, then `q_b_proj`);
    /// 0 projects the query straight from the hidden state (DeepSeek-V2-Lite's form).
    #[serde(default)]
    pub q_lora_rank: usize,
    /// Width of the compressed latent KV (V is its first `kv_lora_rank` columns).
    pub kv_lora_rank: usize,
    /// Width of the decoupled RoPE key part, shared by all heads.
    pub qk_rope_head_dim: usize,
    /// Per-head width of the non-RoPE query/key part.
    pub qk_nope_head_dim: usize,
    /// Per-head value width after up-projection.
    pub v_head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// RoPE base.
    pub rope_theta: f64,
}

/// The attention widths every MLA kernel needs, derived from [`ModelDims`]: one type for
/// the CPU reference and the CUDA kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaDims {
    /// Query heads (all share the single latent KV head).
    pub heads: usize,
    /// Width of `c_kv`, the compressed KV (and of V in the absorbed form).
    pub kv_lora: usize,
    /// Width of the shared RoPE key part.
    pub rope: usize,
    /// Per-head width of the non-RoPE query/key part.
    pub nope: usize,
    /// Per-head value width after up-projection.
    pub v: usize,
}

impl From<&ModelDims> for MlaDims {
    fn from(d: &ModelDims) -> Self {
        Self {
            heads: d.num_heads,
            kv_lora: d.kv_lora_rank,
            rope: d.qk_rope_head_dim,
            nope: d.qk_nope_head_dim,
            v: d.v_head_dim,
        }
    }
}

impl MlaDims {
    /// Width of one cached latent row (576 for DeepSeek-V3).
    pub fn latent(&self) -> usize {
        self.kv_lora + self.rope
    }

    /// Per-head query width of the materialized form (`nope + rope`).
    pub fn qk(&self) -> usize {
        self.nope + self.rope
    }

    /// `1 / sqrt(nope + rope)`, in both forms: the model was defined over full per-head
    /// keys, so the absorbed form keeps this scale although its dot products are
    /// kv_lora + rope wide.
    pub fn softmax_scale(&self) -> f32 {
        1.0 / (self.qk() as f32).sqrt()
    }
}

/// The models `--model` names, with what each is (`sim list`).
pub const MODEL_NAMES: [(&str, &str); 2] = [
    ("tiny", "the reference model: hidden 64, 4 heads, latent 32 + 8, 2 layers, vocabulary 512"),
    (
        "deepseek-v3-attn",
        "DeepSeek-V3's attention widths (hidden 7168, 128 heads, q_lora 1536, latent 512 + 64, nope 128, v 128); 2 layers, MLP 2048, vocabulary 4096",
    ),
];

impl ModelDims {
    /// The tiny reference model the CPU backend runs (RULES §10).
    pub fn tiny() -> Self {
        Self {
            hidden_size: 64,
            num_layers: 2,
            num_heads: 4,
            q_lora_rank: 0,
            kv_lora_rank: 32,
            qk_rope_head_dim: 8,
            qk_nope_head_dim: 16,
            v_head_dim: 16,
            vocab_size: 512,
            intermediate_size: 128,
            rope_theta: 10_000.0,
        }
    }

    /// DeepSeek-V3 attention dimensions (128 heads, latent 512 + rope 64).
    pub fn deepseek_v3() -> Self {
        Self {
            hidden_size: 7168,
            num_layers: 61,
            num_heads: 128,
            q_lora_rank: 1536,
            kv_lora_rank: 512,
            qk_rope_head_dim: 64,
            qk_nope_head_dim: 128,
            v_head_dim: 128,
            vocab_size: 129_280,
            intermediate_size: 18_432,
            rope_theta: 10_000.0,
        }
    }

    /// An attention-faithful model at DeepSeek-V3's widths (`--model deepseek-v3-attn`):
    /// every attention width of [`Self::deepseek_v3`] (hidden 7168, 128 heads, q_lora 1536,
    /// kv_lora 512, nope 128, rope 64, v 128), but 2 layers, a dense MLP of 2048 and a
    /// vocabulary of 4096, so a run fits one GPU and the CPU reference can check it. Not
    /// DeepSeek-V3: no MoE, no YaRN, random weights.
    pub fn deepseek_v3_attn() -> Self {
        Self {
            num_layers: 2,
            vocab_size: 4096,
            intermediate_size: 2048,
            ..Self::deepseek_v3()
        }
    }

    /// The model `--model` names, if any ([`MODEL_NAMES`]).
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "tiny" => Some(Self::tiny()),
            "deepseek-v3-attn" => Some(Self::deepseek_v3_attn()),
            _ => None,
        }
    }

    /// The slice of the heads one of `tp` tensor-parallel ranks holds (`--tp`): MLA
    /// shards attention by head (each rank projects, attends and up-projects its own
    /// `num_heads / tp` heads; the latent cache is replicated), so a rank's attention is
    /// this model's with fewer heads. The rest of the model stays whole here.
    pub fn tensor_parallel(&self, tp: usize) -> Result<Self, ConfigError> {
        if tp == 0 || !self.num_heads.is_multiple_of(tp) {
            return Err(ConfigError::Invalid(format!(
                "--tp {tp} does not divide the model's {} heads",
                self.num_heads
            )));
        }
        Ok(Self {
            num_heads: self.num_heads / tp,
            ..self.clone()
        })
    }

    /// The widths on one line, as run summaries print them.
    pub fn summary(&self) -> String {
        let q = match self.q_lora_rank {
            0 => String::new(),
            r => format!(", q_lora {r}"),
        };
        format!(
            "hidden {}, {} heads{q}, latent {} + {}, nope {}, v {}, {} layers, vocabulary {}",
            self.hidden_size,
            self.num_heads,
            self.kv_lora_rank,
            self.qk_rope_head_dim,
            self.qk_nope_head_dim,
            self.v_head_dim,
            self.num_layers,
            self.vocab_size
        )
    }

    /// Values cached per token per layer: `kv_lora_rank + qk_rope_head_dim` (576 for DSv3).
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Per-head query/key width used for the softmax scale.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let limits = [
            ("hidden_size", self.hidden_size, 1 << 16),
            ("num_layers", self.num_layers, 1 << 10),
            ("num_heads", self.num_heads, 1 << 12),
            ("q_lora_rank", self.q_lora_rank, 1 << 14),
            ("kv_lora_rank", self.kv_lora_rank, 1 << 14),
            ("qk_rope_head_dim", self.qk_rope_head_dim, 1 << 12),
            ("qk_nope_head_dim", self.qk_nope_head_dim, 1 << 12),
            ("v_head_dim", self.v_head_dim, 1 << 12),
            ("vocab_size", self.vocab_size, 1 << 20),
            ("intermediate_size", self.intermediate_size, 1 << 18),
        ];
        check_limits("model dimension ", &limits)?;
        let dims = [
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("vocab_size", self.vocab_size),
            ("intermediate_size", self.intermediate_size),
        ];
        for (name, v) in dims {
            if v == 0 {
                return Err(ConfigError::Invalid(format!(
                    "model dimension {name} must be > 0"
                )));
            }
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "rope_theta must be a positive number, got {}",
                self.rope_theta
            )));
        }
        if self.qk_rope_head_dim == 0 || !self.qk_rope_head_dim.is_multiple_of(2) {
            return Err(ConfigError::Invalid(
                "qk_rope_head_dim must be a positive even number (RoPE rotates pairs)".into(),
            ));
        }
        Ok(())
    }
}

/// The element type of the paged latent KV cache (vLLM's `--kv-cache-dtype`). The latent
/// is rounded to it where it is produced, so the values a query reads are the same whether
/// they come back from the cache (decode rows, context chunks) or straight from this
/// step's projection (a prefill row's new tokens): the case of a cache in the model's own
/// dtype, vLLM's `auto` on a bf16 model. An fp8 cache, where the fresh and the cached
/// values differ, is not modelled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// Exact f32 (the CPU reference's default; every backend takes it).
    #[default]
    F32,
    /// bf16, round to nearest even: what the Hopper decode kernels read.
    Bf16,
}

impl KvCacheDtype {
    /// `x` as the cache stores it, widened back to f32.
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvCacheDtype::F32 => x,
            KvCacheDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }

    /// [`Self::round`] for the f64 oracle: one rounding from f64 straight to bf16. An f32
    /// cache leaves the oracle's f64 alone: the f32 backends' own arithmetic is what the
    /// oracle tolerance covers.
    pub fn round_f64(self, x: f64) -> f64 {
        match self {
            KvCacheDtype::F32 => x,
            KvCacheDtype::Bf16 => half::bf16::from_f64(x).to_f64(),
        }
    }
}

/// How the drafter's batch is shaped after verification (RULES §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrafterBatch {
    /// Rejected tokens stay in the batch; shapes stay uniform.
    #[serde(rename = "padded")]
    Padded,
    /// Rejected tokens are dropped; q and seq_len shrink.
    #[serde(rename = "compacted")]
    Compacted,
}

/// Which speculative method runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SpecMethod {
    /// Plain decoding, one token per step.
    #[serde(rename = "off")]
    Off,
    /// Multi-step drafter (MTP / EAGLE): K sequential drafter passes.
    #[serde(rename = "multi-step")]
    MultiStep,
    /// DFlash block drafter: one non-causal pass proposes K tokens.
    #[serde(rename = "dflash")]
    DFlash,
}

/// Speculative decoding settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecConfig {
    pub method: SpecMethod,
    /// K = `num_speculative_tokens`.
    pub num_speculative_tokens: usize,
    pub drafter_batch: DrafterBatch,
    /// Parallel drafting widens verify rows to 1 + 2K for the threshold rule.
    pub parallel_drafting: bool,
    /// Sampling temperature; 0 means greedy verification.
    pub temperature: f32,
}

impl SpecConfig {
    pub fn off() -> Self {
        Self {
            method: SpecMethod::Off,
            num_speculative_tokens: 0,
            drafter_batch: DrafterBatch::Padded,
            parallel_drafting: false,
            temperature: 0.0,
        }
    }

    pub fn multi_step(k: usize, drafter_batch: DrafterBatch) -> Self {
        Self {
            method: SpecMethod::MultiStep,
            num_speculative_tokens: k,
            drafter_batch,
            parallel_drafting: false,
            temperature: 0.0,
        }
    }

    pub fn dflash(k: usize) -> Self {
        Self {
            method: SpecMethod::DFlash,
            num_speculative_tokens: k,
            drafter_batch: DrafterBatch::Compacted,
            parallel_drafting: false,
            temperature: 0.0,
        }
    }

    /// Whether speculation is on.
    pub fn enabled(&self) -> bool {
        self.method != SpecMethod::Off
    }

    /// K, or 0 when speculation is off.
    pub fn k(&self) -> usize {
        if self.enabled() {
            self.num_speculative_tokens
        } else {
            0
        }
    }

    /// `uniform_decode_query_len = 1 + K`.
    pub fn uniform_decode_query_len(&self) -> usize {
        1 + self.k()
    }
}

/// Where decode rows sit in the batch (RULES §3 step 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowLayout {
    /// vLLM: decode rows first, then extends, then fresh prefills.
    #[serde(rename = "decode-first")]
    DecodeFirst,
    /// TokenSpeed: extend/prefill rows `[0, num_extends)`, decode rows after.
    #[serde(rename = "extend-first")]
    ExtendFirst,
}

/// Which engine's reorder-and-split rule plans the batch (see [`crate::reorder`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Planner {
    /// vLLM after PR #37303: four regions (decode, short_extend, long_extend, prefill),
    /// which needs each request's prompt length.
    #[default]
    #[serde(rename = "vllm")]
    Vllm,
    /// vLLM before PR #37303: three regions (decode, extend, prefill); a short chunk
    /// with context is a decode whether or not its prompt is done.
    #[serde(rename = "vllm-3region")]
    Vllm3Region,
}

impl Planner {
    pub const ALL: [Planner; 2] = [Planner::Vllm, Planner::Vllm3Region];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Planner::Vllm => "vllm",
            Planner::Vllm3Region => "vllm-3region",
        }
    }

    /// Parses a command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Scheduler limits and policies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    /// Tokens per KV page (block).
    pub page_size: usize,
    /// KV blocks in the pool (shared by the target and drafter caches).
    pub num_gpu_blocks: usize,
    pub chunked_prefill: bool,
    /// Largest prompt chunk scheduled for one request in one step.
    pub prefill_chunk_tokens: usize,
    /// Whether one step may hold prefills and decodes together.
    pub mixed_batches: bool,
    pub row_layout: RowLayout,
    /// The reorder-and-split rule (older configs, written before it existed, get vLLM's
    /// current one).
    #[serde(default)]
    pub planner: Planner,
    /// Workspace for gathering cached context of prefill rows (RULES §5).
    pub workspace_tokens: usize,
}

impl SchedulerConfig {
    /// Blocks a request of `max_model_len` tokens can hold: the block table width.
    pub fn max_blocks_per_seq(&self) -> usize {
        self.max_model_len.div_ceil(self.page_size)
    }
}

/// The kinds of query length an attention backend's decode kernel supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueryLenSupport {
    SingleOnly,
    Uniform,
    Varlen,
}

/// Which batches a backend can run as a full CUDA graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CudaGraphSupport {
    Never,
    UniformSingleTokenDecode,
    UniformBatch,
    Always,
}

/// The five MLA backend profiles as the real ones ship (RULES §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BackendProfile {
    #[serde(rename = "flashmla")]
    FlashMla,
    #[serde(rename = "flashinfer-mla")]
    FlashInferMla,
    #[serde(rename = "cutlass-mla")]
    CutlassMla,
    #[serde(rename = "flashattn-mla")]
    FlashAttnMla,
    #[serde(rename = "triton-mla")]
    TritonMla,
}

/// Capability matrix row of one backend profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    pub query_len_support: QueryLenSupport,
    pub base_threshold: usize,
    pub cuda_graph: CudaGraphSupport,
    pub non_causal: bool,
}

impl BackendProfile {
    pub const ALL: [BackendProfile; 5] = [
        BackendProfile::FlashMla,
        BackendProfile::FlashInferMla,
        BackendProfile::CutlassMla,
        BackendProfile::FlashAttnMla,
        BackendProfile::TritonMla,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            BackendProfile::FlashMla => "flashmla",
            BackendProfile::FlashInferMla => "flashinfer-mla",
            BackendProfile::CutlassMla => "cutlass-mla",
            BackendProfile::FlashAttnMla => "flashattn-mla",
            BackendProfile::TritonMla => "triton-mla",
        }
    }

    /// Parses a command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The profile's row of the capability matrix.
    pub fn capabilities(self) -> Capabilities {
        use CudaGraphSupport::*;
        use QueryLenSupport::*;
        let (query_len_support, base_threshold, cuda_graph, non_causal) = match self {
            BackendProfile::FlashMla => (Uniform, 128, UniformBatch, false),
            BackendProfile::FlashInferMla => (Uniform, 1, UniformBatch, true),
            BackendProfile::CutlassMla => (SingleOnly, 1, UniformSingleTokenDecode, false),
            BackendProfile::FlashAttnMla => (Varlen, 512, UniformBatch, true),
            BackendProfile::TritonMla => (SingleOnly, 1, UniformSingleTokenDecode, true),
        };
        Capabilities {
            query_len_support,
            base_threshold,
            cuda_graph,
            non_causal,
        }
    }
}

/// The whole engine configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    pub model: ModelDims,
    pub spec: SpecConfig,
    pub scheduler: SchedulerConfig,
    /// Attention groups' backend profiles; the runner uses the minimum threshold over them.
    pub backends: Vec<BackendProfile>,
    /// Whether decode batches run through captured (emulated) CUDA graphs.
    pub cuda_graphs: bool,
    /// Largest token count captured as a graph.
    pub max_capture_size_tokens: usize,
    /// The decode kernels' split-KV unit: keys per split (a multiple of the page size).
    pub split_size_tokens: usize,
    /// The most splits a decode row takes; a longer row takes longer splits, whole
    /// multiples of `split_size_tokens` (`split::SplitPolicy`). 0: no cap, every split is
    /// `split_size_tokens` long.
    #[serde(default)]
    pub max_splits: usize,
    /// Element type of the paged latent cache (target and drafter).
    #[serde(default)]
    pub kv_cache_dtype: KvCacheDtype,
    /// Data parallelism: the token count of the busiest other rank each step (0: one
    /// rank). DP sync pads this rank's drafter passes to at least it, as vLLM's
    /// `num_tokens_across_dp` does.
    #[serde(default)]
    pub dp_peer_num_tokens: usize,
    /// Known-bug switches (RULES §9); all off unless asked for.
    #[serde(default)]
    pub faults: crate::fault::Faults,
    /// Fills every region of the persistent step buffers that a step does not write with
    /// garbage before the step (`graph_buffers`: the buffers' tails, the split schedule
    /// where no copy lands, unscheduled slots' block tables), so a stale read gives a
    /// wrong output. A correct engine never reads those regions: every check passes.
    #[serde(default)]
    pub poison_stale_buffers: bool,
    /// Raw threshold and uniformity that replace the capability matrix's (for an engine
    /// whose attention backend is not one of the five profiles).
    #[serde(default)]
    pub split_override: SplitOverride,
}

/// Replaces what the capability matrix derives for the reorder and split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitOverride {
    pub reorder_batch_threshold: Option<usize>,
    pub require_uniform: Option<bool>,
}

impl EngineConfig {
    /// The tiny model on a small pool: the base of every built-in scenario and of the
    /// GPU backend's invariance checks. Graphs on (up to 64 tokens), splits of 64.
    pub fn tiny(profile: BackendProfile, spec: SpecConfig) -> Self {
        EngineConfig {
            model: ModelDims::tiny(),
            spec,
            scheduler: SchedulerConfig {
                max_num_seqs: 16,
                max_num_batched_tokens: 160,
                max_model_len: 384,
                page_size: 16,
                num_gpu_blocks: 224,
                chunked_prefill: true,
                prefill_chunk_tokens: 48,
                mixed_batches: true,
                row_layout: RowLayout::DecodeFirst,
                planner: Planner::Vllm,
                workspace_tokens: 512,
            },
            backends: vec![profile],
            cuda_graphs: true,
            max_capture_size_tokens: 64,
            split_size_tokens: 64,
            max_splits: 0,
            kv_cache_dtype: KvCacheDtype::F32,
            dp_peer_num_tokens: 0,
            faults: Default::default(),
            poison_stale_buffers: false,
            split_override: Default::default(),
        }
    }

    /// The split-KV policy every decode kernel runs, the target's and the drafter's: the
    /// configured unit and cap, where no cap means enough splits for the longest row any
    /// pass can see (`max_model_len` keys plus a drafter block of 1 + K).
    pub fn split_policy(&self) -> crate::split::SplitPolicy {
        let unit = self.split_size_tokens.max(1);
        let longest = self.scheduler.max_model_len + 1 + self.spec.k();
        crate::split::SplitPolicy {
            split_size_tokens: unit,
            max_splits: match self.max_splits {
                0 => longest.div_ceil(unit),
                n => n,
            },
        }
    }

    /// `reorder_batch_threshold`: the override, or the minimum over attention groups.
    pub fn reorder_batch_threshold(&self) -> usize {
        let derived = || {
            if self.faults.has(crate::fault::Fault::F14) {
                let t = |p| crate::reorder::f14_profile_threshold(p, &self.spec);
                self.backends.iter().map(|&p| t(p)).min().unwrap_or(1)
            } else {
                crate::reorder::reorder_batch_threshold(&self.backends, &self.spec)
            }
        };
        self.split_override
            .reorder_batch_threshold
            .unwrap_or_else(derived)
    }

    /// Whether the decode kernel takes one token per row and reads `seq_lens` and the
    /// block table by its row (program) index: a SingleOnly profile's (TritonMLA's and
    /// CutlassMLA's decode before vLLM #51065 made Triton's uniform).
    /// An override threshold stands for an engine outside the five profiles: its kernel
    /// takes the rows the threshold lets through, so none is single-token.
    pub fn single_token_decode_kernel(&self) -> bool {
        self.split_override.reorder_batch_threshold.is_none()
            && self
                .backends
                .iter()
                .any(|p| p.capabilities().query_len_support == QueryLenSupport::SingleOnly)
    }

    /// `require_uniform`: the override, or whether any group needs uniform decodes.
    pub fn require_uniform(&self) -> bool {
        self.split_override
            .require_uniform
            .unwrap_or_else(|| crate::reorder::require_uniform(&self.backends))
    }

    /// Checks every cross-field rule; the message is one line fit for a CLI.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        let s = &self.scheduler;
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.backends.is_empty() {
            return bad("at least one backend profile is required".into());
        }
        if s.page_size == 0 {
            return bad("page size must be > 0".into());
        }
        if self.split_override.reorder_batch_threshold == Some(0) {
            return bad("reorder_batch_threshold must be >= 1".into());
        }
        if s.max_num_seqs == 0 || s.max_num_batched_tokens == 0 {
            return bad("max_num_seqs and max_num_batched_tokens must be > 0".into());
        }
        if s.max_model_len < 2 {
            return bad("max_model_len must be at least 2".into());
        }
        if s.workspace_tokens < s.page_size {
            return bad(format!(
                "workspace of {} tokens is smaller than one page ({} tokens)",
                s.workspace_tokens, s.page_size
            ));
        }
        let limits = [
            ("max_num_seqs", s.max_num_seqs, 1 << 16),
            ("max_num_batched_tokens", s.max_num_batched_tokens, 1 << 24),
            ("max_model_len", s.max_model_len, 1 << 24),
            ("page_size", s.page_size, 1 << 16),
            ("num_gpu_blocks", s.num_gpu_blocks, 1 << 26),
            ("prefill_chunk_tokens", s.prefill_chunk_tokens, 1 << 24),
            ("workspace_tokens", s.workspace_tokens, 1 << 30),
            (
                "max_capture_size_tokens",
                self.max_capture_size_tokens,
                1 << 20,
            ),
            ("split_size_tokens", self.split_size_tokens, 1 << 24),
            ("max_splits", self.max_splits, 1 << 12),
            ("dp_peer_num_tokens", self.dp_peer_num_tokens, 1 << 24),
        ];
        check_limits("", &limits)?;
        if s.workspace_tokens < s.max_num_seqs * s.page_size {
            return bad(format!(
                "workspace of {} tokens cannot give each of max_num_seqs={} rows one page of {} \
                 tokens (needs >= {})",
                s.workspace_tokens,
                s.max_num_seqs,
                s.page_size,
                s.max_num_seqs * s.page_size
            ));
        }
        if self.split_size_tokens == 0 || !self.split_size_tokens.is_multiple_of(s.page_size) {
            return bad(format!(
                "decode split size {} must be a positive multiple of the page size {}",
                self.split_size_tokens, s.page_size
            ));
        }
        if !s.chunked_prefill && s.max_num_batched_tokens < s.max_model_len {
            return bad(format!(
                "without chunked prefill, max_num_batched_tokens ({}) must be >= max_model_len \
                 ({}) or long prompts never fit",
                s.max_num_batched_tokens, s.max_model_len
            ));
        }
        if s.chunked_prefill && s.prefill_chunk_tokens == 0 {
            return bad("prefill chunk size must be > 0 with chunked prefill".into());
        }
        let k = self.spec.num_speculative_tokens;
        if self.spec.enabled() && k == 0 {
            return bad("speculation is on but num_speculative_tokens (K) is 0".into());
        }
        if self.spec.enabled() && k > 16 {
            return bad(format!(
                "num_speculative_tokens {k} is above the supported maximum of 16"
            ));
        }
        if self.spec.enabled() && s.max_num_batched_tokens < 1 + k {
            return bad("max_num_batched_tokens cannot hold one verify row of 1 + K tokens".into());
        }
        if !(self.spec.temperature >= 0.0 && self.spec.temperature.is_finite()) {
            return bad("temperature must be a finite number >= 0".into());
        }
        if self.spec.method == SpecMethod::DFlash {
            if let Some(p) = self.backends.iter().find(|p| !p.capabilities().non_causal) {
                return bad(format!(
                    "the DFlash drafter needs non-causal attention, which backend {} does not \
                     support (use flashinfer-mla, flashattn-mla or triton-mla)",
                    p.name()
                ));
            }
            if self.spec.drafter_batch == DrafterBatch::Padded {
                return bad(
                    "the DFlash drafter attends non-causally, so rejected tokens cannot stay in \
                     its batch: use the compacted drafter batch"
                        .into(),
                );
            }
        }
        if s.num_gpu_blocks < s.max_blocks_per_seq() {
            return bad(format!(
                "{} KV blocks cannot hold one request of max_model_len={} tokens ({} blocks)",
                s.num_gpu_blocks,
                s.max_model_len,
                s.max_blocks_per_seq()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::KvCacheDtype;

    #[test]
    fn kv_cache_dtypes_round_as_their_type_stores() {
        assert_eq!(KvCacheDtype::default(), KvCacheDtype::F32);
        let x = 1.0 + 3.0 * 2f32.powi(-10);
        assert_eq!(KvCacheDtype::F32.round(x), x);
        // 8 significant bits: 1 + 3 * 2^-10 lies between 1 and 1 + 2^-7, nearer 1.
        assert_eq!(KvCacheDtype::Bf16.round(x), 1.0);
        // A tie rounds to the even neighbour, in f32 and f64 alike.
        let tie = 1.0 + 3.0 * 2f64.powi(-8);
        assert_eq!(KvCacheDtype::Bf16.round_f64(tie), 1.0 + 4.0 * 2f64.powi(-8));
        assert_eq!(
            KvCacheDtype::Bf16.round(tie as f32),
            1.0 + 4.0 * 2f32.powi(-8)
        );
        assert_eq!(KvCacheDtype::F32.round_f64(0.1), 0.1);
    }
}
