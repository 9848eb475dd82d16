//! Whether an armed fault switch fired: changed what the engine computed in a step. A
//! switch that never fires tests nothing, so a run counts, per armed fault, the steps in
//! which it fired, and a harness calls out the ones that never did.
//!
//! Each armed fault is judged on its own: the step's artifacts are recomputed with that
//! switch off (every other switch as armed) from the same inputs (the batch, the graph
//! buffers as they stood before the step, the verify outcomes, each drafter pass's
//! predecessor), and it fired where they differ. F1 and F2 change no plan (they live in
//! the backends' attention): F1 fires where a prefill row with cached context has at
//! least two new tokens and two heads (where a transposed LSE reads other values), F2
//! where a step replays a graph whose captured shape the switch changed.

use crate::batch::ScheduledBatch;
use crate::config::EngineConfig;
use crate::cudagraph::{capture_sizes, graph_shapes};
use crate::drafter::{dflash_pass, first_pass, next_pass, DFlashPass, DrafterPass, RowOutcome};
use crate::fault::{Fault, Faults};
use crate::graph_buffers::{dummy_step, DummyStep, GraphBuffers, RequestStateTables};
use crate::plan::{build_step_plan, GrammarLookup, StepPlan};

/// What one step computed, and what it was computed from.
pub struct StepArtifacts<'a> {
    pub batch: &'a ScheduledBatch,
    /// The plan as the backend got it (after the graph buffers were written).
    pub plan: &'a StepPlan,
    /// The graph buffers before this step wrote them.
    pub buffers_before: &'a GraphBuffers,
    pub outcomes: &'a [RowOutcome],
    /// Every multi-step drafter pass, in the order they ran (a shadow mode's first).
    pub passes: &'a [DrafterPass],
    pub dflash: Option<&'a DFlashPass>,
}

/// The armed faults of `cfg` that fired in the step `a` describes (`seed`: the engine's,
/// for the graph buffers' poison).
pub fn fired_in_step(
    cfg: &EngineConfig,
    seed: u64,
    a: &StepArtifacts<'_>,
    grammar: GrammarLookup<'_>,
) -> Faults {
    let mut fired = Faults::none();
    for f in cfg.faults.iter() {
        let off = without(cfg, f);
        let hit = match f {
            Fault::F1 => f1_reads_other_values(a.plan, cfg.model.num_heads),
            Fault::F2 => a.plan.cudagraph.is_some() && graph_shapes(&off) != graph_shapes(cfg),
            _ => plan_differs(&off, seed, a, grammar) || drafts_differ(&off, a),
        };
        if hit {
            fired = fired.with(f);
        }
    }
    fired
}

/// The armed faults of `cfg` that fired in an idle data-parallel rank's dummy step.
pub fn fired_in_dummy_step(
    cfg: &EngineConfig,
    tables: &RequestStateTables,
    dummy: Option<&DummyStep>,
) -> Faults {
    let mut fired = Faults::none();
    for f in cfg.faults.iter() {
        if dummy_step(&without(cfg, f), tables).as_ref() != dummy {
            fired = fired.with(f);
        }
    }
    fired
}

fn without(cfg: &EngineConfig, f: Fault) -> EngineConfig {
    let mut off = cfg.clone();
    off.faults = cfg
        .faults
        .iter()
        .filter(|&g| g != f)
        .fold(Faults::none(), Faults::with);
    off
}

/// Whether the plan with the switch off (its own capture sizes, the same buffers) is not
/// the plan the backend got.
fn plan_differs(
    off: &EngineConfig,
    seed: u64,
    a: &StepArtifacts<'_>,
    grammar: GrammarLookup<'_>,
) -> bool {
    let layout = off.scheduler.row_layout;
    let Ok(mut plan) = build_step_plan(off, a.batch, &capture_sizes(off), layout, grammar) else {
        return true;
    };
    let mut buffers = a.buffers_before.clone();
    buffers.write_step(off, &mut plan, seed);
    &plan != a.plan
}

/// Whether any drafter pass with the switch off, from the same inputs, differs.
fn drafts_differ(off: &EngineConfig, a: &StepArtifacts<'_>) -> bool {
    let multi = a.passes.iter().enumerate().any(|(i, p)| {
        let again = match p.pass {
            0 => first_pass(off, a.plan, a.outcomes, p.mode),
            _ => match i.checked_sub(1).map(|j| &a.passes[j]) {
                Some(prev) if prev.pass + 1 == p.pass => next_pass(off, prev, &p.token_ids),
                _ => return false,
            },
        };
        &again != p
    });
    let dflash = a
        .dflash
        .is_some_and(|d| &dflash_pass(off, a.plan, a.outcomes) != d);
    multi || dflash
}

/// F1 transposes the new tokens' LSE before the context merge: it reads other values
/// only where a prefill row has cached context, at least two new tokens and two heads
/// (with one token or one head the two layouts coincide).
fn f1_reads_other_values(plan: &StepPlan, heads: usize) -> bool {
    let Some(p) = &plan.mla.prefill else {
        return false;
    };
    let Some(cc) = &p.chunked_context else {
        return false;
    };
    heads >= 2
        && p.rows
            .clone()
            .enumerate()
            .any(|(j, r)| plan.common.query_len(r) >= 2 && cc.chunks.iter().any(|c| c.lens[j] > 0))
}
