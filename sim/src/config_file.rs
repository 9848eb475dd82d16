//! A run as a TOML file: what `sim config` prints and `sim --config FILE` runs. Every
//! field is written with a comment saying what it is and its unit, and where the value
//! differs from the built-in scenario's, that default too. Unknown keys are errors that
//! name the key.

use serde::{Deserialize, Serialize};
use specmla_core::config::EngineConfig;

use crate::acceptance::AcceptanceRates;
use crate::scenarios::{self, Scenario, WorkloadShape};

/// Everything one `sim` run is made of, in the order `sim config` prints it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The scenario's name (a label; any name may be given in a file).
    pub scenario: String,
    pub seed: u64,
    pub acceptance_rate: AcceptanceRates,
    pub max_steps: u64,
    pub check_layouts: bool,
    pub check_drafter_batches: bool,
    pub workload: WorkloadShape,
    pub engine: EngineConfig,
}

impl RunConfig {
    /// The file form of `s` run with `seed`.
    pub fn of(s: &Scenario, seed: u64) -> Self {
        RunConfig {
            scenario: s.name.clone(),
            seed,
            acceptance_rate: s.acceptance_rate.clone(),
            max_steps: s.max_steps,
            check_layouts: s.check_layouts,
            check_drafter_batches: s.check_drafter_batches,
            workload: s.workload.clone(),
            engine: s.cfg.clone(),
        }
    }

    /// The scenario this file describes, and its seed.
    pub fn into_scenario(self) -> (Scenario, u64) {
        let description = scenarios::by_name(&self.scenario)
            .map_or_else(|| "from a config file".to_string(), |s| s.description);
        let s = Scenario {
            name: self.scenario,
            description,
            cfg: self.engine,
            workload: self.workload,
            acceptance_rate: self.acceptance_rate,
            max_steps: self.max_steps,
            check_layouts: self.check_layouts,
            check_drafter_batches: self.check_drafter_batches,
        };
        (s, self.seed)
    }

    /// Parses a config file; an error is one line naming the key or the line.
    pub fn parse(text: &str) -> Result<Self, String> {
        // A byte-order mark (editors on Windows write one) is not part of the TOML.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    let line = text[..span.start.min(text.len())].lines().count().max(1);
                    format!("line {line}: {msg}")
                }
                None => msg,
            }
        })
    }

    /// The commented TOML of this config; `defaults` (the built-in scenario of the same
    /// name, when there is one) adds a "default" note to every value that differs.
    pub fn to_commented_toml(&self, defaults: Option<&RunConfig>) -> String {
        let table = toml::Table::try_from(self).expect("a config serializes to a table");
        let base = defaults.map(|d| toml::Table::try_from(d).expect("serializes"));
        let mut out = String::from(
            "# specmla run configuration: `sim --config FILE` runs it, and command-line flags\n\
             # override it. Units are in the comments. Unknown keys are errors.\n",
        );
        write_table(&mut out, "", &table, base.as_ref());
        out
    }
}

/// What each key is, with its unit: the comment `sim config` writes above it.
pub const FIELD_DOCS: &[(&str, &str)] = &[
    (
        "scenario",
        "name of the run (a built-in scenario's, or any label)",
    ),
    (
        "seed",
        "seed of the weights, the workload and every random decision",
    ),
    (
        "acceptance_rate",
        "probability that a draft position proposes the oracle's greedy token (0..1): one \
         rate, or one per position as an array (the last repeats)",
    ),
    ("max_steps", "stop after this many engine steps (steps)"),
    (
        "check_layouts",
        "also run each batch in the other row layout and compare bit for bit",
    ),
    (
        "check_drafter_batches",
        "also run the other drafter batch mode and compare proposals",
    ),
    ("workload.num_requests", "requests in the workload"),
    (
        "workload.prompt_len",
        "prompt length, drawn uniformly from [min, max] (tokens)",
    ),
    (
        "workload.max_new_tokens",
        "generation budget per request, drawn from [min, max] (tokens)",
    ),
    (
        "workload.arrival_steps",
        "requests arrive uniformly over [0, arrival_steps) (steps)",
    ),
    (
        "workload.grammar_fraction",
        "fraction of requests constrained by a token grammar (0..1)",
    ),
    (
        "engine.backends",
        "attention backend profile of each attention group (see `sim list`)",
    ),
    (
        "engine.cuda_graphs",
        "replay uniform-decode steps on captured CUDA graphs",
    ),
    (
        "engine.max_capture_size_tokens",
        "largest captured graph (tokens)",
    ),
    (
        "engine.dp_peer_num_tokens",
        "data parallelism: the busiest other rank's token count; drafter passes are padded to it (0: one rank)",
    ),
    (
        "engine.poison_stale_buffers",
        "fill what a step leaves unwritten in the graphs' persistent buffers with garbage",
    ),
    (
        "engine.kv_cache_dtype",
        "element type of the latent KV cache: f32 or bf16 (latents rounded where produced)",
    ),
    (
        "engine.split_size_tokens",
        "split-KV size of the decode kernel, a multiple of page_size (tokens)",
    ),
    (
        "engine.max_splits",
        "most split-KV splits a decode row takes; longer rows take longer splits (0: no cap)",
    ),
    (
        "engine.faults",
        "known-bug switches, e.g. [\"F1\"] (see the README's catalog)",
    ),
    ("engine.model.hidden_size", "residual stream width (values)"),
    ("engine.model.num_layers", "target model layers"),
    ("engine.model.num_heads", "query heads"),
    (
        "engine.model.q_lora_rank",
        "width of the query's low-rank compression (0: the query comes straight from the hidden state)",
    ),
    (
        "engine.model.kv_lora_rank",
        "latent KV width; V is its first columns (values)",
    ),
    (
        "engine.model.qk_rope_head_dim",
        "decoupled RoPE key width, shared by all heads (values)",
    ),
    (
        "engine.model.qk_nope_head_dim",
        "per-head query/key width without RoPE (values)",
    ),
    ("engine.model.v_head_dim", "per-head value width (values)"),
    ("engine.model.vocab_size", "vocabulary size (tokens)"),
    ("engine.model.intermediate_size", "MLP inner width (values)"),
    ("engine.model.rope_theta", "RoPE base"),
    (
        "engine.spec.method",
        "\"off\", \"multi-step\" (MTP/EAGLE) or \"dflash\"",
    ),
    (
        "engine.spec.num_speculative_tokens",
        "K, drafts per verify row (tokens)",
    ),
    (
        "engine.spec.drafter_batch",
        "\"padded\" (rejected tokens stay) or \"compacted\"",
    ),
    (
        "engine.spec.parallel_drafting",
        "verify rows of 1 + 2K for the threshold rule",
    ),
    (
        "engine.spec.temperature",
        "sampling temperature; 0 = greedy verification",
    ),
    (
        "engine.scheduler.max_num_seqs",
        "most requests in one step (vLLM's max_num_seqs)",
    ),
    (
        "engine.scheduler.max_num_batched_tokens",
        "token budget of one step (tokens)",
    ),
    (
        "engine.scheduler.max_model_len",
        "longest request, prompt plus output (tokens)",
    ),
    ("engine.scheduler.page_size", "tokens per KV block (tokens)"),
    (
        "engine.scheduler.num_gpu_blocks",
        "KV blocks in the pool, shared by target and drafter (blocks)",
    ),
    (
        "engine.scheduler.chunked_prefill",
        "split long prompts over several steps",
    ),
    (
        "engine.scheduler.prefill_chunk_tokens",
        "largest prompt chunk of one request in one step (tokens)",
    ),
    (
        "engine.scheduler.mixed_batches",
        "let one step hold prefills and decodes together",
    ),
    (
        "engine.scheduler.row_layout",
        "\"decode-first\" (vLLM) or \"extend-first\" (TokenSpeed)",
    ),
    (
        "engine.scheduler.planner",
        "reorder-and-split rule: \"vllm\" (four regions) or \"vllm-3region\"",
    ),
    (
        "engine.scheduler.workspace_tokens",
        "workspace for gathering cached context of prefill rows (tokens)",
    ),
    (
        "engine.split_override.reorder_batch_threshold",
        "replaces the profile's decode threshold (tokens; unset: from the profile)",
    ),
    (
        "engine.split_override.require_uniform",
        "replaces the profile's require_uniform (unset: from the profile)",
    ),
];

fn doc(path: &str) -> &'static str {
    FIELD_DOCS
        .iter()
        .find(|(p, _)| *p == path)
        .map_or("", |(_, d)| d)
}

/// Writes the scalar keys of `t` (with comments), then its sub-tables under headers.
fn write_table(out: &mut String, prefix: &str, t: &toml::Table, base: Option<&toml::Table>) {
    let path = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    for (k, v) in t.iter().filter(|(_, v)| !v.is_table()) {
        let default = base
            .and_then(|b| b.get(k))
            .filter(|d| *d != v)
            .map_or(String::new(), |d| format!(" (default {d})"));
        out.push_str(&format!("# {}{default}\n{k} = {v}\n", doc(&path(k))));
    }
    // Unset optional keys are shown commented out, so every field is on the page.
    let here = format!("{prefix}.");
    for (p, d) in FIELD_DOCS.iter().filter(|(p, _)| {
        p.strip_prefix(&here)
            .is_some_and(|k| !k.contains('.') && !t.contains_key(k))
    }) {
        out.push_str(&format!("# {d}\n# {} =\n", &p[here.len()..]));
    }
    for (k, v) in t.iter() {
        if let Some(sub) = v.as_table() {
            out.push_str(&format!("\n[{}]\n", path(k)));
            let sub_base = base.and_then(|b| b.get(k)).and_then(|b| b.as_table());
            write_table(out, &path(k), sub, sub_base);
        }
    }
}

/// The fuzz target's body (`fuzz/fuzz_targets/run_config.rs`): `data` as a config file,
/// through parsing, the scenario's and the engine's validation, and (for a small valid
/// one) its workload, as `sim --config` runs them. Errors are fine (one line each); a
/// panic is a bug.
pub fn fuzz_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let c = match RunConfig::parse(text) {
        Ok(c) => c,
        Err(e) => {
            assert!(!e.contains('\n'), "a multi-line error: {e}");
            return;
        }
    };
    let (s, seed) = c.into_scenario();
    if let Err(e) = s.validate() {
        assert!(!e.contains('\n'), "a multi-line error: {e}");
        return;
    }
    if let Err(e) = s.cfg.validate() {
        assert!(!e.to_string().contains('\n'), "a multi-line error: {e}");
        return;
    }
    if s.workload.num_requests <= 64 {
        let work = scenarios::generate_workload(&s.workload, &s.cfg, seed);
        let _ = specmla_core::scheduler::validate_workload(&s.cfg, &work);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(prefix: &str, t: &toml::Table, out: &mut Vec<String>) {
        for (k, v) in t {
            let p = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v.as_table() {
                Some(sub) => keys(&p, sub, out),
                None => out.push(p),
            }
        }
    }

    #[test]
    fn every_scenario_round_trips_and_every_key_is_documented() {
        for s in scenarios::all() {
            let mut c = RunConfig::of(&s, 7);
            c.engine.split_override.reorder_batch_threshold = Some(9);
            c.engine.split_override.require_uniform = Some(false);
            let text = c.to_commented_toml(None);
            assert_eq!(RunConfig::parse(&text).unwrap(), c, "{}", s.name);
            let mut all = Vec::new();
            keys("", &toml::Table::try_from(&c).unwrap(), &mut all);
            for k in &all {
                assert!(!doc(k).is_empty(), "{k} has no entry in FIELD_DOCS");
            }
            assert_eq!(all.len(), FIELD_DOCS.len(), "{all:?}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_name_themselves() {
        let c = RunConfig::of(&scenarios::all()[0], 0);
        let text = c.to_commented_toml(None);
        let e = RunConfig::parse(&text.replace("max_num_seqs", "max_num_seq")).unwrap_err();
        assert!(e.contains("max_num_seq"), "{e}");
        let e = RunConfig::parse(&text.replace("\"flashmla\"", "\"flash\"")).unwrap_err();
        assert!(e.contains("flash") && e.starts_with("line "), "{e}");
        let e = RunConfig::parse(&text.replace("faults = []", "faults = [\"F99\"]")).unwrap_err();
        assert!(e.contains("F99"), "{e}");
    }

    #[test]
    fn defaults_are_noted_where_a_value_differs() {
        let s = scenarios::all().remove(0);
        let base = RunConfig::of(&s, 0);
        let mut c = base.clone();
        c.engine.scheduler.max_num_seqs = 3;
        let text = c.to_commented_toml(Some(&base));
        assert!(text.contains("(default 16)\nmax_num_seqs = 3"), "{text}");
        assert_eq!(text.matches("(default").count(), 1);
    }
}
