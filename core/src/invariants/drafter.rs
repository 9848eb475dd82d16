//! The drafter passes: the multi-step passes' inputs and key counts, and the DFlash
//! block pass's positions and slots.

use super::metadata::{ref_mapped_keys, ref_split_ok};
use super::*;

/// Checks one multi-step drafter pass.
pub fn check_drafter_pass(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    outcomes: &[RowOutcome],
    p: &DrafterPass,
) -> Vec<Violation> {
    let mut s = Sink {
        step: plan.step,
        out: Vec::new(),
    };
    let sc = &cfg.scheduler;
    let tokens = p.query_start_loc.last().map_or(0, |&t| t as usize);
    s.check(
        p.num_actual_tokens == tokens,
        Rule::DrafterInputs,
        None,
        || {
            format!(
                "drafter pass {} attention metadata counts {} tokens; query_start_loc ends at \
             {tokens} (the data-parallel padded count leaked in)",
                p.pass, p.num_actual_tokens
            )
        },
    );
    s.check(
        p.num_padded_tokens == tokens.max(cfg.dp_peer_num_tokens),
        Rule::DrafterInputs,
        None,
        || {
            format!(
                "drafter pass {} padded to {} input rows",
                p.pass, p.num_padded_tokens
            )
        },
    );
    for r in 0..p.num_rows() {
        let b = &batch.rows[plan.order[r]];
        let o = outcomes[r];
        let q = (p.query_start_loc[r + 1] - p.query_start_loc[r]) as usize;
        let sample = p.token_indices_to_sample[r] as usize;
        let pos = p.positions[sample] as usize;
        if p.pass == 0 {
            let (want_q, n_rej) = match p.mode {
                DrafterBatch::Padded => (b.num_scheduled_tokens, o.num_rejected),
                DrafterBatch::Compacted => (o.valid, 0),
            };
            s.check(q == want_q, Rule::DrafterInputs, Some(r), || {
                format!("pass 0 q={q}, expected {want_q}")
            });
            let want_sample = p.query_start_loc[r + 1] as usize - 1 - n_rej;
            s.check(sample == want_sample, Rule::DrafterInputs, Some(r), || {
                format!("token_indices_to_sample {sample} != {want_sample}")
            });
            s.check(
                pos + 1 == b.num_computed_tokens + o.valid,
                Rule::DrafterInputs,
                Some(r),
                || "pass 0 samples past the last valid token".into(),
            );
        }
        check_drafter_keys(cfg, r, pos + 1, p.kv_lens.get(r).copied(), p, &mut s);
        if p.pass > 0 {
            s.check(
                p.seq_lens[r] as usize == pos + 1,
                Rule::DrafterInputs,
                Some(r),
                || {
                    format!(
                        "pass {} seq_len {} at position {pos}: rejected tokens still counted",
                        p.pass, p.seq_lens[r]
                    )
                },
            );
        }
        for t in p.query_start_loc[r] as usize..p.query_start_loc[r + 1] as usize {
            let tp = p.positions[t] as usize;
            let want = ref_slot(&b.block_ids, tp, sc.page_size, sc.max_model_len);
            s.check(
                p.slot_mapping[t] == want,
                Rule::SlotMapping,
                Some(r),
                || {
                    format!(
                        "drafter pass {} position {tp} slot {} != {want}",
                        p.pass, p.slot_mapping[t]
                    )
                },
            );
            s.check(
                tp >= sc.max_model_len || want != PAD_SLOT,
                Rule::SlotMapping,
                Some(r),
                || format!("drafter position {tp} is not backed by an allocated block"),
            );
        }
    }
    s.out
}

/// A drafter row reads `kv_len` keys (`want`, capped at max_model_len for the
/// multi-step drafter) in splits that cover them.
pub(super) fn check_drafter_keys(
    cfg: &EngineConfig,
    r: usize,
    want: usize,
    kv_len: Option<u32>,
    p: &DrafterPass,
    s: &mut Sink,
) {
    let want = want.min(cfg.scheduler.max_model_len);
    s.check(
        kv_len == Some(want as u32),
        Rule::DrafterInputs,
        Some(r),
        || {
            format!(
                "pass {} kv_len {kv_len:?}, the sampled token sees {want} keys",
                p.pass
            )
        },
    );
    check_splits(cfg, r, want, (&p.split, p.block_row(r)), s);
}

/// A drafter row's schedule: the policy's splits for its `kv_len` keys, and the keys its
/// block-table row maps.
pub(super) fn check_splits(
    cfg: &EngineConfig,
    r: usize,
    kv_len: usize,
    (sched, table_row): (&SplitSchedule, &[u32]),
    s: &mut Sink,
) {
    let (split, n) = (
        sched.split_len_tokens.get(r).copied().unwrap_or(0),
        sched.num_splits.get(r).copied().unwrap_or(0),
    );
    s.check(
        ref_split_ok(cfg, kv_len, split, n),
        Rule::DrafterInputs,
        Some(r),
        || format!("drafter split schedule {n} x {split} keys for {kv_len} keys"),
    );
    let mapped = ref_mapped_keys(table_row, cfg.scheduler.page_size);
    s.check(
        sched.mapped_kv_tokens.get(r) == Some(&mapped),
        Rule::DrafterInputs,
        Some(r),
        || {
            format!(
                "drafter mapped keys {:?}, the row's block table maps {mapped}",
                sched.mapped_kv_tokens.get(r)
            )
        },
    );
}

/// Checks the DFlash pass: block positions and the clamp/PAD slot rule.
pub fn check_dflash(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    outcomes: &[RowOutcome],
    p: &DFlashPass,
) -> Vec<Violation> {
    let mut s = Sink {
        step: plan.step,
        out: Vec::new(),
    };
    let sc = &cfg.scheduler;
    for (r, o) in outcomes.iter().enumerate() {
        let b = &batch.rows[plan.order[r]];
        let last_valid = b.num_computed_tokens + o.valid - 1;
        s.check(
            p.context_lens[r] as usize == last_valid + 1,
            Rule::DFlashSlots,
            Some(r),
            || "context length is not last_valid + 1".into(),
        );
        let keys = last_valid + 1 + p.block_len;
        s.check(
            p.kv_lens.get(r) == Some(&(keys as u32)),
            Rule::DFlashSlots,
            Some(r),
            || {
                format!(
                    "block attends to {:?} keys, expected context + block = {keys}",
                    p.kv_lens.get(r)
                )
            },
        );
        let w = p.block_table_width;
        let table_row = &p.block_table[r * w..(r + 1) * w];
        check_splits(cfg, r, keys, (&p.split, table_row), &mut s);
        for i in 0..p.block_len {
            let j = r * p.block_len + i;
            let pos = p.block_positions[j] as usize;
            s.check(
                pos == last_valid + 1 + i,
                Rule::DFlashSlots,
                Some(r),
                || format!("block offset {i} at position {pos}"),
            );
            let want = ref_slot(&b.block_ids, pos, sc.page_size, sc.max_model_len);
            let idx = p.block_indices[j] as usize;
            s.check(idx < p.block_table_width, Rule::DFlashSlots, Some(r), || {
                format!("block offset {i} position {pos} read block-table index {idx} past the width {}", p.block_table_width)
            });
            s.check(p.block_slots[j] == want, Rule::DFlashSlots, Some(r), || {
                format!("block offset {i} position {pos} slot {} (expected {want}; PAD at or past max_model_len {})", p.block_slots[j], sc.max_model_len)
            });
        }
    }
    let want: Vec<u32> = (0..outcomes.len())
        .flat_map(|r| (1..p.block_len).map(move |i| (r * p.block_len + i) as u32))
        .collect();
    s.check(p.sample_indices == want, Rule::DFlashSlots, None, || {
        format!(
            "DFlash samples block positions {:?}, expected offsets 1..={} of each row",
            p.sample_indices,
            p.block_len - 1
        )
    });
    s.out
}
