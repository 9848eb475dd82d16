//! CUDA-graph capture sizes and dispatch (RULES §7): which decode batches replay a
//! captured uniform-decode graph, and with how many q = 0 padding rows.

use serde::{Deserialize, Serialize};

use crate::config::{CudaGraphSupport, EngineConfig};
use crate::fault::Fault;
use crate::reorder::RowShape;

/// The shape frozen when a graph is captured; a replay must run exactly this shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GraphShape {
    pub num_tokens: usize,
    pub num_rows: usize,
    /// Uniform q_len of every row.
    pub query_len: usize,
    pub max_query_len: usize,
}

/// A step dispatched onto a captured graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphDispatch {
    pub shape: GraphShape,
    /// Rows added with q = 0 to reach the captured row count.
    pub num_padding_rows: usize,
    /// Tokens added (never written to the cache) to reach the captured token count.
    pub num_padding_tokens: usize,
}

/// The weakest graph support over the attention groups.
pub fn graph_support(cfg: &EngineConfig) -> CudaGraphSupport {
    use CudaGraphSupport::*;
    let rank = |s: CudaGraphSupport| match s {
        Never => 0,
        UniformSingleTokenDecode => 1,
        UniformBatch => 2,
        Always => 3,
    };
    cfg.backends
        .iter()
        .map(|p| p.capabilities().cuda_graph)
        .min_by_key(|&s| rank(s))
        .unwrap_or(Never)
}

/// Capture sizes in tokens: vLLM's default ladder (1, 2, 4, then steps of 8, then 16),
/// each rounded up to a multiple of `1 + K`, deduplicated, and dropped above the
/// maximum (never more rows than `max_num_seqs`). Empty when graphs cannot run here.
pub fn capture_sizes(cfg: &EngineConfig) -> Vec<usize> {
    let q = cfg.spec.uniform_decode_query_len();
    let support = graph_support(cfg);
    let usable = match support {
        CudaGraphSupport::Never => false,
        CudaGraphSupport::UniformSingleTokenDecode => q == 1,
        _ => true,
    };
    if !cfg.cuda_graphs || !usable {
        return Vec::new();
    }
    let max = cfg
        .max_capture_size_tokens
        .min(cfg.scheduler.max_num_seqs * q);
    let ladder = [1usize, 2, 4]
        .into_iter()
        .chain((8..256).step_by(8))
        .chain((256..=max.max(256)).step_by(16));
    // F3: the ladder taken as is, so a size like 8 with K = 2 makes a dummy batch
    // [3, 3, 2] whose last row is a prefill inside the decode graph.
    let round = !cfg.faults.has(Fault::F3);
    let mut sizes: Vec<usize> = ladder
        .map(|s| if round { s.div_ceil(q) * q } else { s })
        .filter(|&s| s <= max)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The shapes a backend captures at start-up, as the capture freezes them: uniform
/// `1 + K` rows. F2 (vLLM #21505) is a faulty capture: the MLA builder built decode-only
/// metadata with `max_query_len` 1, so the frozen graph runs one token per row (as many
/// rows as tokens) whatever q a replayed step has. Backends capture exactly these
/// shapes and, on replay, run the one frozen for the dispatched size.
pub fn graph_shapes(cfg: &EngineConfig) -> Vec<GraphShape> {
    let q = if cfg.faults.has(Fault::F2) {
        1
    } else {
        cfg.spec.uniform_decode_query_len()
    };
    capture_sizes(cfg)
        .into_iter()
        .map(|t| GraphShape {
            num_tokens: t,
            num_rows: t / q,
            query_len: q,
            max_query_len: q,
        })
        .collect()
}

/// Picks a graph for a batch whose rows are given in execution order. A batch qualifies
/// only if every row has exactly `1 + K` tokens and is past its prompt, and the smallest
/// captured size holds it. The second test is the fix of vLLM #49918: the runner once
/// classified a batch as uniform decode from its shape alone, so a prompt chunk of
/// `1 + K` tokens replayed the verify graph over prompt tokens; the fixed
/// `_is_uniform_decode` (vLLM #51865 for Model Runner V2, #53059 for the V1 runner) also
/// requires `num_computed_tokens >= num_prompt_tokens` for every request. F7 drops it.
pub fn dispatch(cfg: &EngineConfig, rows: &[RowShape], sizes: &[usize]) -> Option<GraphDispatch> {
    let q = cfg.spec.uniform_decode_query_len();
    dispatch_rows(q, cfg.faults.has(Fault::F7), rows, sizes)
}

/// [`dispatch`] from its inputs alone: the uniform q_len `1 + K` and whether a batch
/// qualifies by shape alone (F7's bug); what `core::audit` checks an engine's dispatch
/// against.
pub fn dispatch_rows(
    q: usize,
    shape_only: bool,
    rows: &[RowShape],
    sizes: &[usize],
) -> Option<GraphDispatch> {
    if rows.is_empty()
        || !rows
            .iter()
            .all(|r| r.num_scheduled_tokens == q && (shape_only || !r.is_prefilling()))
    {
        return None;
    }
    let num_tokens = rows.len() * q;
    let size = *sizes.iter().find(|&&s| s >= num_tokens)?;
    let shape = GraphShape {
        num_tokens: size,
        num_rows: size / q,
        query_len: q,
        max_query_len: q,
    };
    Some(GraphDispatch {
        shape,
        num_padding_rows: shape.num_rows - rows.len(),
        num_padding_tokens: size - num_tokens,
    })
}
