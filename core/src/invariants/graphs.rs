//! CUDA graphs (RULES §7): dispatch and capture sizes, the persistent buffers a replay
//! reads, and an idle data-parallel rank's dummy step.

use super::metadata::ref_split_ok;
use super::*;

/// A replay reads the graph's persistent buffers whole: the padding rows' seq_lens must
/// be this step's zeros, and the split schedule must be recomputed from the seq_lens the
/// replay reads (the reference recomputes it here, as vLLM #35175 copies it).
pub(super) fn check_graph_buffers(cfg: &EngineConfig, plan: &StepPlan, s: &mut Sink) {
    if plan.cudagraph.is_none() {
        return;
    }
    let c = &plan.common;
    for r in plan.rows.len()..c.num_rows() {
        s.check(c.seq_lens[r] == 0, Rule::GraphBuffers, Some(r), || {
            format!(
                "padding row reads seq_len {} from the graph's buffer (must be 0: a stale length)",
                c.seq_lens[r]
            )
        });
    }
    for r in plan.rows.len()..plan.idx_mapping.len() {
        let slot = plan.idx_mapping[r];
        s.check(slot == -1, Rule::GraphBuffers, Some(r), || {
            // Only for the message: whose live slot the padding row writes into.
            let owner = plan.idx_mapping[..plan.rows.len()]
                .iter()
                .position(|&s| s == slot)
                .map(|o| format!(", live request {}'s", plan.rows[o].req_id))
                .unwrap_or_default();
            format!(
                "padding row samples drafts into request-state slot {slot}{owner} (must be \
                 -1: a padding row writes nothing)"
            )
        });
    }
    let Some(d) = &plan.mla.decode else { return };
    let sched = &d.split;
    let stale = (0..c.seq_lens.len()).find(|&r| {
        !(r < sched.len()
            && ref_split_ok(
                cfg,
                c.seq_lens[r] as usize,
                sched.split_len_tokens[r],
                sched.num_splits[r],
            ))
    });
    if let Some(r) = stale {
        s.check(false, Rule::GraphBuffers, Some(r), || {
            format!(
                "replay reads a schedule of {:?} splits of {:?} keys for seq_len {} (a \
                 schedule left in the graph's buffer, not recomputed from the current seq_lens)",
                sched.num_splits.get(r),
                sched.split_len_tokens.get(r),
                c.seq_lens[r],
            )
        });
    }
}

/// An idle rank's dummy step writes no KV: every drafter slot it computes is PAD.
pub fn check_dummy_step(cfg: &EngineConfig, step: u64, d: &DummyStep) -> Vec<Violation> {
    let mut s = Sink {
        step,
        out: Vec::new(),
    };
    let page = cfg.scheduler.page_size as i64;
    for (p, slots) in d.drafter_slot_mapping.iter().enumerate() {
        for (r, &slot) in slots.iter().enumerate() {
            s.check(slot == PAD_SLOT, Rule::SlotMapping, None, || {
                format!(
                    "dummy step: drafter pass {} row {r} writes slot {slot} (block {}, through \
                     request-state slot {}'s table)",
                    p + 1,
                    slot / page,
                    d.idx_mapping[r]
                )
            });
        }
    }
    s.out
}

pub(super) fn check_graph(cfg: &EngineConfig, plan: &StepPlan, sizes: &[usize], s: &mut Sink) {
    let q = cfg.spec.uniform_decode_query_len();
    for &size in sizes {
        s.check(size % q == 0, Rule::CudaGraph, None, || {
            format!("capture size {size} is not a multiple of 1 + K = {q}")
        });
    }
    let Some(g) = &plan.cudagraph else { return };
    let sh = g.shape;
    s.check(
        sizes.contains(&sh.num_tokens),
        Rule::CudaGraph,
        None,
        || format!("graph size {} was never captured", sh.num_tokens),
    );
    s.check(
        sh.query_len == q && sh.max_query_len == q && sh.num_rows * q == sh.num_tokens,
        Rule::CudaGraph,
        None,
        || format!("graph shape {sh:?} is not uniform 1 + K"),
    );
    s.check(plan.mla.num_prefills == 0, Rule::CudaGraph, None, || {
        "a graph replays a batch with prefill rows".into()
    });
    s.check(
        plan.common.max_query_len == sh.max_query_len,
        Rule::CudaGraph,
        None,
        || {
            format!(
                "replayed max_query_len {} != captured {}",
                plan.common.max_query_len, sh.max_query_len
            )
        },
    );
    s.check(
        plan.common.num_rows() == sh.num_rows && plan.token_ids.len() == sh.num_tokens,
        Rule::CudaGraph,
        None,
        || "padded batch shape differs from the captured shape".into(),
    );
    for (r, row) in plan.rows.iter().enumerate() {
        s.check(
            row.query_len == q && row.num_computed_tokens >= row.num_prompt_tokens,
            Rule::CudaGraph,
            Some(r),
            || {
                format!(
                    "row q={} computed={} of a {}-token prompt replayed on the uniform decode \
                     graph (a graph row must be past its prompt)",
                    row.query_len, row.num_computed_tokens, row.num_prompt_tokens
                )
            },
        );
    }
}
