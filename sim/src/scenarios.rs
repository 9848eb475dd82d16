//! Built-in scenarios: a workload plus an engine config each, and the overrides that
//! command-line flags apply. A scenario is data; `runner` executes it.

use std::sync::Arc;

use rand::Rng;
use serde::{Deserialize, Serialize};
use specmla_core::config::{BackendProfile, DrafterBatch, EngineConfig, RowLayout, SpecConfig};
use specmla_core::grammar::{GrammarState, RequestGrammar, TokenAutomaton};
use specmla_core::request::RequestSpec;
use specmla_core::rng::{stream_rng, Stream};

use crate::acceptance::AcceptanceRates;

/// Shape of a scenario's generated workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadShape {
    pub num_requests: usize,
    pub prompt_len: (usize, usize),
    pub max_new_tokens: (usize, usize),
    /// Requests arrive uniformly over `[0, arrival_steps)`.
    pub arrival_steps: u64,
    /// Fraction of requests carrying a grammar.
    pub grammar_fraction: f64,
}

/// A named workload plus config.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub cfg: EngineConfig,
    pub workload: WorkloadShape,
    /// Per draft position, the probability that it proposes the oracle's greedy token.
    pub acceptance_rate: AcceptanceRates,
    /// Stop after this many steps even if requests remain.
    pub max_steps: u64,
    pub check_layouts: bool,
    pub check_drafter_batches: bool,
}

/// A page size an engine allocates: a power of two. The core's rules hold for any page
/// size (its property tests use them all), but no engine allocates such blocks: vLLM's
/// block sizes are powers of two. `sim` and `sim plan` both refuse the others.
pub fn check_page_size(page: usize) -> Result<(), String> {
    if page > 0 && !page.is_power_of_two() {
        return Err(format!(
            "page size {page} is not a power of two (engines use 1, 8, 16, 32, 64, ...)"
        ));
    }
    Ok(())
}

/// The most requests one run takes (`--requests` is bounded the same).
pub const MAX_REQUESTS: usize = 100_000;

impl Scenario {
    /// Every setting outside the engine config, checked once on the merged scenario,
    /// whatever it came from (a built-in, a config file, flags over either): each bad
    /// value is one line naming its key and flag, never a panic later and never a run
    /// that checks nothing. The engine config is [`EngineConfig::validate`]'s.
    pub fn validate(&self) -> Result<(), String> {
        let w = &self.workload;
        let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
        if let Err(e) = self.acceptance_rate.check() {
            return Err(format!("acceptance_rate (--acceptance-rate): {e}"));
        }
        if !unit(w.grammar_fraction) {
            return Err(format!(
                "workload.grammar_fraction must be within [0, 1], got {}",
                w.grammar_fraction
            ));
        }
        if w.num_requests == 0 {
            return Err(
                "workload.num_requests (--requests) must be at least 1: a run without requests \
                 checks nothing"
                    .into(),
            );
        }
        if w.num_requests > MAX_REQUESTS {
            return Err(format!(
                "workload.num_requests (--requests) must be at most {MAX_REQUESTS}, got {}",
                w.num_requests
            ));
        }
        if self.max_steps == 0 {
            return Err(
                "max_steps (--steps) must be at least 1: a run of no step checks nothing".into(),
            );
        }
        for (key, flag, (lo, hi)) in [
            ("workload.prompt_len", "--prompt-len", w.prompt_len),
            (
                "workload.max_new_tokens",
                "--max-new-tokens",
                w.max_new_tokens,
            ),
        ] {
            if lo == 0 || lo > hi {
                return Err(format!(
                    "{key} ({flag}) [{lo}, {hi}] must be a range of at least 1 with MIN <= MAX"
                ));
            }
        }
        check_page_size(self.cfg.scheduler.page_size)?;
        let max_len = self.cfg.scheduler.max_model_len;
        if w.prompt_len.1 >= max_len {
            return Err(format!(
                "prompts of up to {} tokens (workload.prompt_len, --prompt-len) do not fit \
                 max_model_len {max_len}: a prompt must leave room for one generated token, \
                 and vLLM refuses a longer one",
                w.prompt_len.1
            ));
        }
        Ok(())
    }
}

fn base_config(profile: BackendProfile, spec: SpecConfig) -> EngineConfig {
    EngineConfig::tiny(profile, spec)
}

fn workload(n: usize, prompt: (usize, usize), new: (usize, usize), arrival: u64) -> WorkloadShape {
    WorkloadShape {
        num_requests: n,
        prompt_len: prompt,
        max_new_tokens: new,
        arrival_steps: arrival,
        grammar_fraction: 0.0,
    }
}

/// Every built-in scenario, the default first.
pub fn all() -> Vec<Scenario> {
    let mtp = SpecConfig::multi_step(3, DrafterBatch::Padded);
    let mut dflash_cfg = base_config(BackendProfile::FlashAttnMla, SpecConfig::dflash(8));
    dflash_cfg.scheduler.max_model_len = 160;
    dflash_cfg.scheduler.num_gpu_blocks = 96;
    let mut graphs_cfg = base_config(BackendProfile::FlashMla, mtp.clone());
    graphs_cfg.max_capture_size_tokens = 48;
    let mut grammar_cfg = base_config(BackendProfile::FlashInferMla, mtp.clone());
    grammar_cfg.scheduler.row_layout = RowLayout::ExtendFirst;
    let mut grammar_load = workload(14, (20, 120), (24, 64), 30);
    grammar_load.grammar_fraction = 0.5;
    let mut tight = base_config(BackendProfile::FlashMla, mtp.clone());
    tight.scheduler.num_gpu_blocks = 40;
    // TritonMLA (SingleOnly, non-causal) under a DFlash drafter: where F14 fires.
    let mut triton = base_config(BackendProfile::TritonMla, SpecConfig::dflash(1));
    triton.cuda_graphs = false;
    // One rank of several data-parallel ranks, idle between requests: where F15 and F16
    // fire.
    let mut dp = base_config(
        BackendProfile::FlashMla,
        SpecConfig::multi_step(2, DrafterBatch::Padded),
    );
    dp.dp_peer_num_tokens = 4;
    vec![
        Scenario {
            name: "mixed_mtp".into(),
            description: "chunked prefill, mixed batches, MTP K=3, FlashMLA profile".into(),
            cfg: base_config(BackendProfile::FlashMla, mtp.clone()),
            workload: workload(20, (16, 200), (24, 80), 40),
            acceptance_rate: AcceptanceRates::uniform(0.7),
            max_steps: 2_000,
            check_layouts: true,
            check_drafter_batches: false,
        },
        Scenario {
            name: "cutlass_mtp".into(),
            description:
                "SingleOnly profile: every verify row takes the chunked-context prefill path".into(),
            cfg: base_config(BackendProfile::CutlassMla, mtp.clone()),
            workload: workload(14, (16, 160), (24, 64), 30),
            acceptance_rate: AcceptanceRates::uniform(0.7),
            max_steps: 2_000,
            check_layouts: true,
            check_drafter_batches: false,
        },
        Scenario {
            name: "padded_eagle".into(),
            description: "K=5 multi-step drafter, padded and compacted batches side by side".into(),
            cfg: base_config(
                BackendProfile::FlashInferMla,
                SpecConfig::multi_step(5, DrafterBatch::Padded),
            ),
            workload: workload(14, (16, 120), (24, 72), 30),
            acceptance_rate: AcceptanceRates::uniform(0.6),
            max_steps: 2_000,
            check_layouts: false,
            check_drafter_batches: true,
        },
        Scenario {
            name: "dflash".into(),
            description:
                "K=8 DFlash block drafter, non-causal, requests running up to max_model_len".into(),
            cfg: dflash_cfg,
            workload: workload(10, (16, 100), (200, 200), 20),
            acceptance_rate: AcceptanceRates::uniform(0.7),
            max_steps: 2_000,
            check_layouts: true,
            check_drafter_batches: false,
        },
        Scenario {
            name: "graphs".into(),
            description: "uniform-decode graphs: capture sizes, q=0 padding rows, 1+K-token prompts arriving mid-decode".into(),
            cfg: graphs_cfg,
            workload: workload(13, (4, 8), (24, 64), 16),
            acceptance_rate: AcceptanceRates::uniform(0.7),
            max_steps: 2_000,
            check_layouts: true,
            check_drafter_batches: false,
        },
        Scenario {
            name: "grammar_mixed".into(),
            description: "constrained requests inside mixed batches, extend-first layout".into(),
            cfg: grammar_cfg,
            workload: grammar_load,
            acceptance_rate: AcceptanceRates::uniform(0.7),
            max_steps: 2_000,
            check_layouts: true,
            check_drafter_batches: false,
        },
        Scenario {
            name: "preemption".into(),
            description: "a small block pool: preemption by recompute under MTP K=3".into(),
            cfg: tight,
            workload: workload(16, (40, 160), (40, 100), 10),
            acceptance_rate: AcceptanceRates::uniform(0.7),
            max_steps: 3_000,
            check_layouts: false,
            check_drafter_batches: false,
        },
        Scenario {
            name: "triton_dflash".into(),
            description: "SingleOnly TritonMLA under a non-causal DFlash drafter, K=1: verify rows on the single-token kernel".into(),
            cfg: triton,
            workload: workload(8, (8, 60), (8, 40), 12),
            acceptance_rate: AcceptanceRates::uniform(0.7),
            max_steps: 2_000,
            check_layouts: true,
            check_drafter_batches: false,
        },
        Scenario {
            name: "dp_idle".into(),
            description: "one data-parallel rank of several (peer at 4 tokens), MTP K=2, idle between requests: dummy steps".into(),
            cfg: dp,
            workload: workload(6, (4, 24), (6, 16), 80),
            acceptance_rate: AcceptanceRates::uniform(0.7),
            max_steps: 2_000,
            check_layouts: true,
            check_drafter_batches: false,
        },
    ]
}

/// The scenario named `name`.
pub fn by_name(name: &str) -> Option<Scenario> {
    all().into_iter().find(|s| s.name == name)
}

/// The grammar a workload request carries, rebuilt from its seed (traces store only the
/// seed).
pub fn grammar_from_seed(vocab_size: usize, grammar_seed: u64) -> RequestGrammar {
    RequestGrammar {
        automaton: Arc::new(TokenAutomaton::random(6, vocab_size, 0.3, grammar_seed)),
        state: GrammarState::Live(0),
    }
}

/// Generates the workload of `shape` for `cfg` from `seed`.
pub fn generate_workload(shape: &WorkloadShape, cfg: &EngineConfig, seed: u64) -> Vec<RequestSpec> {
    let mut rng = stream_rng(seed, Stream::Workload);
    let vocab = cfg.model.vocab_size as u32;
    let max_prompt = cfg.scheduler.max_model_len - 1;
    (0..shape.num_requests as u64)
        .map(|id| {
            let len = rng
                .gen_range(shape.prompt_len.0..=shape.prompt_len.1)
                .clamp(1, max_prompt);
            let prompt = (0..len).map(|_| rng.gen_range(0..vocab)).collect();
            let max_new_tokens = rng
                .gen_range(shape.max_new_tokens.0..=shape.max_new_tokens.1)
                .max(1);
            let arrival_step = rng.gen_range(0..shape.arrival_steps.max(1));
            let grammar = rng
                .gen_bool(shape.grammar_fraction)
                .then(|| grammar_from_seed(cfg.model.vocab_size, rng.gen::<u64>() ^ seed));
            RequestSpec {
                id,
                prompt,
                max_new_tokens,
                arrival_step,
                grammar,
            }
        })
        .collect()
}
