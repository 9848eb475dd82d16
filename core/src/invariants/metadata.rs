//! The attention metadata (RULES §5-§6): common tensors and slots, the decode rows and
//! their split schedule, the chunked context.

use super::*;

pub(super) fn check_common(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    s: &mut Sink,
) {
    let c = &plan.common;
    let sc = &cfg.scheduler;
    s.check(
        c.query_start_loc.first() == Some(&0),
        Rule::CommonMetadata,
        None,
        || "query_start_loc[0] != 0".into(),
    );
    s.check(
        c.num_actual_tokens == batch.num_tokens(),
        Rule::CommonMetadata,
        None,
        || "num_actual_tokens differs".into(),
    );
    let mut slots: Vec<i64> = Vec::with_capacity(c.slot_mapping.len());
    for (r, &i) in plan.order.iter().enumerate() {
        let b = &batch.rows[i];
        let toks = c.row_tokens(r);
        s.check(
            toks.len() == b.num_scheduled_tokens,
            Rule::CommonMetadata,
            Some(r),
            || format!("q {} != scheduled {}", toks.len(), b.num_scheduled_tokens),
        );
        s.check(
            c.seq_lens[r] as usize == b.seq_len() && b.seq_len() <= sc.max_model_len,
            Rule::CommonMetadata,
            Some(r),
            || format!("seq_len {} (expected {})", c.seq_lens[r], b.seq_len()),
        );
        for (j, t) in toks.enumerate() {
            let pos = b.num_computed_tokens + j;
            s.check(
                c.positions[t] as usize == pos,
                Rule::CommonMetadata,
                Some(r),
                || format!("token {t} position {} != {pos}", c.positions[t]),
            );
            let expect = ref_slot(&b.block_ids, pos, sc.page_size, sc.max_model_len);
            s.check(
                c.slot_mapping[t] == expect && expect != PAD_SLOT,
                Rule::SlotMapping,
                Some(r),
                || {
                    format!(
                        "token {t} at position {pos} has slot {} (expected {expect})",
                        c.slot_mapping[t]
                    )
                },
            );
            slots.push(c.slot_mapping[t]);
        }
    }
    for r in plan.rows.len()..c.num_rows() {
        s.check(
            c.query_len(r) == 0 && c.seq_lens[r] == 0,
            Rule::CudaGraph,
            Some(r),
            || {
                format!(
                    "padding row with q {} or seq_len {}",
                    c.query_len(r),
                    c.seq_lens[r]
                )
            },
        );
    }
    for t in c.num_actual_tokens..c.slot_mapping.len() {
        s.check(
            c.slot_mapping[t] == PAD_SLOT,
            Rule::SlotMapping,
            None,
            || format!("padding token {t} has a live slot"),
        );
    }
    slots.sort_unstable();
    s.check(
        slots.windows(2).all(|w| w[0] != w[1]),
        Rule::SlotMapping,
        None,
        || "two tokens write the same slot".into(),
    );
}

pub(super) fn check_decode_rows(cfg: &EngineConfig, plan: &StepPlan, s: &mut Sink) {
    let Some(d) = &plan.mla.decode else { return };
    let c = &plan.common;
    let rows_ok = d.rows.end <= c.num_rows();
    s.check(rows_ok, Rule::DecodeRows, None, || {
        "decode rows beyond the batch".into()
    });
    if !rows_ok {
        return;
    }
    // Query rows equal block-table rows: each row the kernel runs is a decode row with
    // its own seq_len and table row (a single-token kernel given verify rows runs a row
    // per token against one table row per request: F14).
    s.check(
        d.kernel_rows == d.rows.len(),
        Rule::DecodeRows,
        None,
        || {
            format!(
                "the decode kernel runs {} query rows of {:?} tokens against {} block-table rows \
             (verify rows not expanded per token)",
                d.kernel_rows,
                d.uniform_query_len,
                d.rows.len()
            )
        },
    );
    s.check(
        d.plan_seq_lens == c.seq_lens[d.rows.clone()],
        Rule::DecodeRows,
        None,
        || {
            format!(
                "decode planner built over seq_lens {:?}, kernel reads rows {:?}",
                d.plan_seq_lens, d.rows
            )
        },
    );
    let sched = &d.split;
    let lens = [
        sched.split_len_tokens.len(),
        sched.num_splits.len(),
        sched.mapped_kv_tokens.len(),
    ];
    s.check(lens == [d.kernel_rows; 3], Rule::DecodeRows, None, || {
        format!(
            "split schedule of {lens:?} entries for {} kernel rows",
            d.kernel_rows
        )
    });
    let width = c.block_table_width;
    for (i, &len) in d.plan_seq_lens.iter().enumerate().take(sched.len()) {
        let (split, n) = (sched.split_len_tokens[i], sched.num_splits[i]);
        s.check(
            ref_split_ok(cfg, len as usize, split, n),
            Rule::DecodeRows,
            Some(d.rows.start + i),
            || format!("split schedule {n} x {split} keys for {len} keys"),
        );
        let row = c
            .block_table
            .get((d.rows.start + i) * width..(d.rows.start + i + 1) * width)
            .unwrap_or(&[]);
        let mapped = ref_mapped_keys(row, cfg.scheduler.page_size);
        s.check(
            sched.mapped_kv_tokens.get(i) == Some(&mapped),
            Rule::DecodeRows,
            Some(d.rows.start + i),
            || {
                format!(
                    "mapped keys {:?}, the row's block table maps {mapped}",
                    sched.mapped_kv_tokens.get(i)
                )
            },
        );
    }
    s.check(
        d.tokens.start == c.query_start_loc[d.rows.start] as usize
            && d.tokens.end == c.query_start_loc[d.rows.end] as usize,
        Rule::DecodeRows,
        None,
        || "decode token range differs from its rows".into(),
    );
    if let Some(q) = d.uniform_query_len {
        for r in d.rows.clone() {
            let len = c.query_len(r);
            s.check(
                len == q || (len == 0 && r >= plan.rows.len()),
                Rule::DecodeRows,
                Some(r),
                || format!("uniform kernel launched with q={q} but row has q={len}"),
            );
        }
    }
}

pub(super) fn check_chunks(cfg: &EngineConfig, plan: &StepPlan, s: &mut Sink) {
    let Some(p) = &plan.mla.prefill else { return };
    let c = &plan.common;
    let ctx: Vec<usize> = p
        .rows
        .clone()
        .map(|r| c.num_computed_tokens[r] as usize)
        .collect();
    let Some(cc) = &p.chunked_context else {
        s.check(
            ctx.iter().all(|&x| x == 0),
            Rule::ChunkedContext,
            None,
            || "prefill rows have context but no chunk plan".into(),
        );
        return;
    };
    let n = ctx.iter().filter(|&&x| x > 0).count().max(1);
    let page = cfg.scheduler.page_size;
    let expect = cfg.scheduler.workspace_tokens / n / page * page;
    s.check(
        cc.chunk_size_tokens == expect,
        Rule::ChunkedContext,
        None,
        || format!("chunk size {} != {expect}", cc.chunk_size_tokens),
    );
    let mut covered = vec![0usize; ctx.len()];
    for (i, ch) in cc.chunks.iter().enumerate() {
        s.check(
            ch.total_tokens() <= cfg.scheduler.workspace_tokens,
            Rule::ChunkedContext,
            None,
            || format!("chunk {i} gathers {} > workspace", ch.total_tokens()),
        );
        for (j, (&st, &len)) in ch.starts.iter().zip(&ch.lens).enumerate() {
            s.check(
                len == 0 || st == covered[j],
                Rule::ChunkedContext,
                Some(p.rows.start + j),
                || format!("chunk {i} starts at {st}, expected {}", covered[j]),
            );
            covered[j] += len;
        }
    }
    for (j, (&got, &want)) in covered.iter().zip(&ctx).enumerate() {
        s.check(
            got == want,
            Rule::ChunkedContext,
            Some(p.rows.start + j),
            || format!("chunks cover {got} of {want} context tokens"),
        );
    }
}

/// Whether `num_splits` splits of `split_len` keys are the policy's schedule for a row
/// of `kv_len` keys, restated as properties: splits are whole units, at most the cap,
/// cover the keys, none is empty (but a keyless row's one), and no shorter split
/// (one unit less) would cover them within the cap.
pub(super) fn ref_split_ok(
    cfg: &EngineConfig,
    kv_len: usize,
    split_len: u32,
    num_splits: u32,
) -> bool {
    let policy = cfg.split_policy();
    let (unit, cap) = (policy.split_size_tokens, policy.max_splits);
    let (len, n) = (split_len as usize, num_splits as usize);
    if len == 0 || n == 0 {
        return false;
    }
    let whole = len.is_multiple_of(unit);
    let covers = (1..=cap).contains(&n) && len * n >= kv_len;
    let tight = if kv_len == 0 {
        n == 1
    } else {
        (n - 1) * len < kv_len
    };
    let shortest = len == unit || (len - unit) * cap < kv_len;
    whole && covers && tight && shortest
}

/// Keys a block-table row maps: every entry before the first missing one, restated.
pub(super) fn ref_mapped_keys(row: &[u32], page_size: usize) -> u32 {
    let mut keys = 0;
    for &b in row {
        if b == crate::block_pool::NO_BLOCK {
            break;
        }
        keys += page_size as u32;
    }
    keys
}
