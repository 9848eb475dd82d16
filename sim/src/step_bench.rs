//! A steady-state verify workload for timing a backend's steps: `rows` requests of
//! `context_tokens` prompt tokens arrive together, run through their prefill, then
//! decode together under MTP with K speculative tokens, so every decode-only step is a
//! uniform verify step of `rows` rows of 1 + K tokens at about `context_tokens` keys.
//! There is no oracle (the drafts are the drafter's own), but the engine's plan
//! invariants run on every step and a violation fails the bench: a time from a wrong
//! step is worthless.
//!
//! By default the prompts arrive in the configuration's small chunks (48 tokens), which
//! FlashMLA's profile (threshold 128) sends down the decode kernel; `prefill_chunk_tokens`
//! above the threshold sends them down the prefill path instead, each chunk after the
//! first with its cached context in chunks: the prefill step.

use std::sync::Arc;

use specmla_core::backend::{Backend, StepTime};
use specmla_core::config::{
    BackendProfile, DrafterBatch, EngineConfig, KvCacheDtype, ModelDims, SpecConfig,
};
use specmla_core::engine::{Engine, EngineOptions, NoOracle, StepOutcome};
use specmla_core::request::RequestSpec;
use specmla_model::{DrafterModel, TargetModel};

use crate::invariance::Factory;
use crate::step_time::{step_kind, StepTimes};

/// The shape of a verify-step bench.
#[derive(Clone, Copy, Debug)]
pub struct VerifyBench {
    pub rows: usize,
    pub context_tokens: usize,
    /// Verify steps each request lives through (its `max_new_tokens`).
    pub decode_steps: usize,
    pub num_spec_tokens: usize,
    pub cuda_graphs: bool,
    /// Prompt tokens a request runs per step (`None`: the configuration's 48).
    pub prefill_chunk_tokens: Option<usize>,
}

impl VerifyBench {
    /// The engine configuration: `model` with a bf16 cache of pages of 64, FlashMLA's
    /// profile (verify rows on the decode kernel), a cache and a graph capture that hold
    /// the whole batch.
    pub fn config(&self, model: ModelDims) -> EngineConfig {
        let k = self.num_spec_tokens;
        // K 0: plain decode steps, which a fit of the per-pass cost needs beside K >= 1.
        let spec = match k {
            0 => SpecConfig::off(),
            _ => SpecConfig::multi_step(k, DrafterBatch::Padded),
        };
        let mut cfg = EngineConfig::tiny(BackendProfile::FlashMla, spec);
        cfg.model = model;
        cfg.kv_cache_dtype = KvCacheDtype::Bf16;
        cfg.cuda_graphs = self.cuda_graphs;
        let s = &mut cfg.scheduler;
        s.page_size = 64;
        s.max_num_seqs = self.rows;
        if let Some(c) = self.prefill_chunk_tokens {
            s.prefill_chunk_tokens = c;
        }
        // Room for the drafts past the last token, in whole pages.
        let len = self.context_tokens + self.decode_steps * (k + 1) + 2 * (k + 1);
        s.max_model_len = len.next_multiple_of(s.page_size);
        s.max_num_batched_tokens = s.max_num_batched_tokens.max(self.rows * (k + 1)).max(8192);
        s.num_gpu_blocks = self.rows * (s.max_model_len / s.page_size + 1);
        // The chunked-context workspace must give every row a page.
        s.workspace_tokens = s.workspace_tokens.max(self.rows * s.page_size);
        cfg.max_capture_size_tokens = cfg.max_capture_size_tokens.max(self.rows * (k + 1));
        cfg
    }

    /// `rows` prompts of `context_tokens` tokens (a fixed pattern; the bench times shapes,
    /// not answers), all arriving at step 0.
    pub fn workload(&self, vocab_size: usize) -> Vec<RequestSpec> {
        (0..self.rows as u64)
            .map(|id| RequestSpec {
                id,
                prompt: (0..self.context_tokens as u64)
                    .map(|i| ((id * 7919 + i * 104_729) % vocab_size as u64) as u32)
                    .collect(),
                max_new_tokens: self.decode_steps,
                arrival_step: 0,
                grammar: None,
            })
            .collect()
    }

    /// Runs the workload on the backend `make` builds over `models` (as
    /// [`crate::runner::models`] draws them for `cfg`); every step's time by kind.
    pub fn run<B: Backend>(
        &self,
        make: &Factory<'_, B>,
        cfg: &EngineConfig,
        models: (Arc<TargetModel>, Arc<DrafterModel>),
    ) -> Result<StepTimes, String> {
        self.run_observed(make, cfg, models, &mut |_, _| {})
    }

    /// [`Self::run`], also handing each timed step and its time to `on_step` (the cost
    /// model's calibration prices the same step and keeps the residual).
    pub fn run_observed<B: Backend>(
        &self,
        make: &Factory<'_, B>,
        cfg: &EngineConfig,
        (target, drafter): (Arc<TargetModel>, Arc<DrafterModel>),
        on_step: &mut dyn FnMut(&StepOutcome, &StepTime),
    ) -> Result<StepTimes, String> {
        let backend = make(cfg, target, drafter).map_err(|e| e.to_string())?;
        let opts = EngineOptions {
            check_layouts: false,
            check_drafter_batches: false,
            seed: 7,
            full_outputs: false,
        };
        let work = self.workload(cfg.model.vocab_size);
        let mut engine =
            Engine::new(cfg.clone(), opts, work, backend).map_err(|e| e.to_string())?;
        let mut times = StepTimes::default();
        let limit = 4 * (self.context_tokens + self.decode_steps) + 100;
        for _ in 0..limit {
            let Some(o) = engine.step(&mut NoOracle).map_err(|e| e.to_string())? else {
                return Ok(times);
            };
            if let Some(v) = o.violations.first() {
                return Err(format!("step {}: invariant violated: {v:?}", o.plan.step));
            }
            let time = engine.backend_mut().take_step_time();
            if let (Some(t), Some(kind)) = (time, step_kind(&o.plan)) {
                on_step(&o, &t);
                times.push(kind, t);
            }
        }
        Err(format!("the bench did not finish in {limit} steps"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench's configuration holds its batch (cache, capture, model length) and its
    /// workload passes the scheduler's own validation.
    #[test]
    fn the_configuration_holds_the_batch() {
        let b = VerifyBench {
            rows: 64,
            context_tokens: 4096,
            decode_steps: 20,
            num_spec_tokens: 3,
            cuda_graphs: true,
            prefill_chunk_tokens: None,
        };
        let cfg = b.config(ModelDims::deepseek_v3_attn());
        cfg.validate().expect("a valid configuration");
        assert!(cfg.max_capture_size_tokens >= 256);
        assert_eq!(cfg.scheduler.max_model_len % 64, 0);
        assert!(cfg.scheduler.max_model_len >= 4096 + 20 * 4);
        let work = b.workload(cfg.model.vocab_size);
        specmla_core::scheduler::validate_workload(&cfg, &work).expect("a valid workload");
    }

    /// On the CPU backend at tiny width the bench runs to the end, checking its
    /// invariants, and reports no times (the CPU backend does not time itself).
    #[test]
    fn runs_on_the_cpu_backend() {
        // K 0 (plain decode, what the calibration's per-pass fit stands on) and K 2.
        for k in [0, 2] {
            let b = VerifyBench {
                rows: 3,
                context_tokens: 40,
                decode_steps: 4,
                num_spec_tokens: k,
                cuda_graphs: true,
                prefill_chunk_tokens: Some(16),
            };
            let cfg = b.config(ModelDims::tiny());
            assert_eq!(cfg.spec.num_speculative_tokens, k);
            let make = |cfg: &EngineConfig, t, d| specmla_cpu::cpu_backend(cfg, t, d);
            let models = crate::runner::models(&cfg, 7);
            let times = b.run(&make, &cfg, models).expect("the bench runs");
            assert!(times.summary().is_empty());
        }
    }
}
