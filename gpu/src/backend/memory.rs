//! What the CUDA backend allocates beyond the weights and caches core counts
//! (`core::memory`): the one graph workspace, the eager workspace at its largest (a step
//! of `max_num_batched_tokens`), the prefill scratch and the two carries. The backend
//! checks their sum against the device's free memory before allocating anything, so a
//! configuration that does not fit is one line naming its allocations, not an
//! out-of-memory error halfway through a run.

use specmla_core::config::EngineConfig;
use specmla_core::cudagraph::graph_shapes;
use specmla_core::memory::Allocation;

use crate::workspace::{PrefillScratch, Workspace};

/// The backend's own allocations for `cfg`; `flash_splits` is the flash path's split
/// cap (its workspaces hold that many split partials), `None` on the portable path.
pub fn workspace_allocations(cfg: &EngineConfig, flash_splits: Option<usize>) -> Vec<Allocation> {
    let d = &cfg.model;
    let s = &cfg.scheduler;
    let (layers, width) = (d.num_layers, s.max_blocks_per_seq());
    let k = cfg.spec.k().max(1);
    // The eager path grows to the largest step: every scheduled token, or every row of a
    // uniform decode launch (which may address past the real tokens).
    let eager_tokens = s.max_num_batched_tokens.max(s.max_num_seqs * (1 + k));
    let mut out = vec![Allocation {
        what: "eager workspace",
        bytes: Workspace::bytes(
            d,
            layers,
            (eager_tokens, s.max_num_seqs.max(4), width),
            flash_splits,
        ),
    }];
    if let Some((tokens, rows, w)) = super::graph_ws_dims(cfg, &graph_shapes(cfg)) {
        out.push(Allocation {
            what: "graph workspace",
            bytes: Workspace::bytes(d, layers, (tokens, rows, w), flash_splits),
        });
    }
    if cfg.cuda_graphs && cfg.spec.method == specmla_core::config::SpecMethod::MultiStep {
        let q = 1 + cfg.spec.k();
        out.push(Allocation {
            what: "drafter graph workspace",
            bytes: Workspace::bytes(
                d,
                layers,
                (s.max_num_seqs * q, s.max_num_seqs, width),
                flash_splits,
            ),
        });
    }
    let flash_prefill = flash_splits.is_some() && crate::ops::prefill_widths_fit(d);
    out.push(Allocation {
        what: "prefill scratch",
        bytes: PrefillScratch::bytes(d, prefill_scratch_tokens(cfg, flash_prefill), flash_prefill),
    });
    let hid = d.hidden_size as u64 * 4;
    out.push(Allocation {
        what: "carried hidden states",
        bytes: (s.max_num_batched_tokens as u64 + (s.max_num_seqs * k) as u64) * hid,
    });
    out
}

/// The most queries or keys the prefill scratch holds at once: a step's tokens or a
/// context chunk's; under DFlash also a pass's keys, each row's context and block (every
/// row at once on the tensor-core path, one row at a time on the portable one).
fn prefill_scratch_tokens(cfg: &EngineConfig, flash_prefill: bool) -> usize {
    let s = &cfg.scheduler;
    let steps = s.max_num_batched_tokens.max(s.workspace_tokens);
    if cfg.spec.method != specmla_core::config::SpecMethod::DFlash {
        return steps;
    }
    let row = s.max_model_len + cfg.spec.k() + 1;
    steps.max(if flash_prefill {
        s.max_num_seqs * row
    } else {
        row
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use specmla_core::config::{BackendProfile, DrafterBatch, ModelDims, SpecConfig};
    use specmla_core::memory::{describe, gib, total_bytes};

    /// The README's configuration: DeepSeek-V3's attention, 2 layers, 128 heads, 64
    /// requests of 8192 tokens in pages of 64, MTP K = 3, steps of up to 8192 tokens,
    /// graphs up to 256 tokens, at most 4 splits a row; what the flash path allocates
    /// beyond core's weights and caches.
    #[test]
    fn a_real_width_batch_of_64_requests_of_8k() {
        let spec = SpecConfig::multi_step(3, DrafterBatch::Padded);
        let mut cfg = EngineConfig::tiny(BackendProfile::FlashMla, spec);
        cfg.model = ModelDims::deepseek_v3_attn();
        let s = &mut cfg.scheduler;
        s.page_size = 64;
        s.max_num_seqs = 64;
        s.max_model_len = 8192 + 64;
        s.num_gpu_blocks = 64 * (8192 + 64) / 64;
        s.max_num_batched_tokens = 8192;
        s.workspace_tokens = 8192;
        cfg.max_capture_size_tokens = 256;
        let a = workspace_allocations(&cfg, Some(4));
        let all: Vec<_> = specmla_core::memory::allocations(&cfg)
            .into_iter()
            .chain(crate::backend::flash_path::flash_allocations(&cfg))
            .chain(a.iter().cloned())
            .collect();
        assert_eq!(
            describe(&a),
            "eager workspace 14.68 GiB, prefill scratch 1.90 GiB, drafter graph workspace \
             0.46 GiB, graph workspace 0.46 GiB, carried hidden states 0.22 GiB"
        );
        assert_eq!(gib(total_bytes(&all)), "26.41 GiB");
    }

    /// A DFlash pass attends every row's context and block at once on the tensor-core
    /// path: the memory check counts that many keys, not a step's tokens.
    #[test]
    fn a_dflash_pass_counts_every_rows_keys() {
        let mut cfg = EngineConfig::tiny(BackendProfile::FlashAttnMla, SpecConfig::dflash(4));
        cfg.model = ModelDims::deepseek_v3_attn();
        let s = &mut cfg.scheduler;
        (s.max_num_seqs, s.max_model_len) = (8, 4096);
        (s.max_num_batched_tokens, s.workspace_tokens) = (2048, 2048);
        assert_eq!(prefill_scratch_tokens(&cfg, true), 8 * (4096 + 5));
        assert_eq!(prefill_scratch_tokens(&cfg, false), 4096 + 5);
        cfg.spec = SpecConfig::multi_step(4, DrafterBatch::Padded);
        assert_eq!(prefill_scratch_tokens(&cfg, true), 2048);
    }
}
