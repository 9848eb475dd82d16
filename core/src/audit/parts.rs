//! The optional parts of a step log, each audited only where the log carries it: the
//! slot mapping against the block table, the chunked-context metadata, the graph
//! dispatch and the spec-decode metadata. Each expected value comes from the function
//! the planner itself uses (`plan_context_chunks`, `dispatch_rows`) or, for the
//! spec-decode indices, from vLLM's formula (below), over the engine's own row order,
//! so an order the reorder audit already flagged does not cascade into every part.

use serde::{Deserialize, Serialize};

use super::StepLog;
use crate::chunked_context::{chunk_size, plan_context_chunks};
use crate::config::{BackendProfile, DrafterBatch};
use crate::cudagraph::dispatch_rows;
use crate::drafter::dflash_slot;
use crate::invariants::matrix_threshold;
use crate::invariants::{Rule, Violation};
use crate::reorder::RowShape;

/// The MLA prefill's chunked-context metadata, `[num_chunks, ...]` each, over the
/// prefill rows (the rows after the `num_decodes` decodes) in row order: vLLM's
/// `ChunkedContextMetadata` (`vllm/v1/attention/backends/mla/common.py`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkedContextLog {
    /// `[num_chunks][num_prefills + 1]`: the running sum of each row's chunk length.
    pub cu_seq_lens: Vec<Vec<usize>>,
    /// `[num_chunks][num_prefills]`: where each row's chunk starts in its context.
    pub starts: Vec<Vec<usize>>,
    /// `[num_chunks]`: tokens gathered per chunk.
    pub seq_tot: Vec<usize>,
    /// `[num_chunks]`: the longest row chunk per chunk.
    pub max_seq_lens: Vec<usize>,
}

/// The graph a step replayed, as vLLM's `BatchDescriptor` names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphLog {
    /// Tokens after padding to the capture size.
    pub num_tokens: usize,
    /// Whether the step ran the uniform-decode (full) graph.
    pub uniform: bool,
    /// Requests after padding, where the engine keys on it.
    #[serde(default)]
    pub num_reqs: Option<usize>,
}

/// vLLM's `SpecDecodeMetadata` (`vllm/v1/spec_decode/metadata.py`), built by
/// `GPUModelRunner._calc_spec_decode_metadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecDecodeLog {
    /// `[num_reqs]`: the running sum of draft tokens per row.
    pub cu_num_draft_tokens: Vec<usize>,
    /// Flat token positions whose logits are computed: each row's last `1 + drafts`.
    pub logits_indices: Vec<usize>,
    /// Indices into those logits of the positions that verify a draft.
    pub target_logits_indices: Vec<usize>,
    /// Indices into those logits of each row's bonus position.
    pub bonus_logits_indices: Vec<usize>,
}

/// One multi-step drafter pass's attention metadata (vLLM's EAGLE/MTP proposer,
/// `vllm/v1/spec_decode/llm_base_proposer.py`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrafterPassLog {
    pub query_start_loc: Vec<usize>,
    pub seq_lens: Vec<usize>,
    pub num_actual_tokens: usize,
    pub token_indices_to_sample: Vec<usize>,
}

/// The drafter passes vLLM's proposer builds for `k` passes over rows of `q` tokens
/// with `seq` seq_lens, `rejected` draft tokens rejected per row
/// (`llm_base_proposer.py`, vLLM v0.33.0 `4ba787ec9`). The first pass, padded
/// (`prepare_inputs_padded`): the target's `query_start_loc`, `seq_lens` and token
/// count, sampling each row's last valid token `query_start_loc[i + 1] - 1 -
/// rejected[i]`; compacted (`prepare_inputs`): the rejected tokens dropped from every
/// row. Each later pass: one token per row (`query_start_loc` = `0..=rows`, each sampled),
/// `seq_lens` less the rejected tokens once, then one more per pass (the fix of vLLM
/// #26191 in #29845). Rows that reach `max_model_len` are the one edge not modelled.
pub fn drafter_passes(
    q: &[usize],
    seq: &[usize],
    rejected: &[usize],
    mode: DrafterBatch,
    k: usize,
) -> Vec<DrafterPassLog> {
    let padded = mode == DrafterBatch::Padded;
    let kept: Vec<usize> = (0..q.len())
        .map(|i| {
            if padded {
                q[i]
            } else {
                q[i] - rejected[i].min(q[i])
            }
        })
        .collect();
    let mut first = DrafterPassLog {
        query_start_loc: vec![0],
        ..DrafterPassLog::default()
    };
    for (i, &n) in kept.iter().enumerate() {
        let end = first.query_start_loc[i] + n;
        first.query_start_loc.push(end);
        let skip = if padded { rejected[i] } else { 0 };
        // A row of no tokens (which no engine schedules) samples at its start.
        first
            .token_indices_to_sample
            .push(end.saturating_sub(1 + skip));
        first
            .seq_lens
            .push(if padded { seq[i] } else { seq[i] - (q[i] - n) });
    }
    first.num_actual_tokens = *first.query_start_loc.last().unwrap_or(&0);
    let base: Vec<usize> = (0..q.len())
        .map(|i| first.seq_lens[i] - if padded { rejected[i] } else { 0 })
        .collect();
    let rows = q.len();
    let mut out = vec![first];
    for j in 1..k {
        out.push(DrafterPassLog {
            query_start_loc: (0..=rows).collect(),
            seq_lens: base.iter().map(|&s| s + j).collect(),
            num_actual_tokens: rows,
            token_indices_to_sample: (0..rows).collect(),
        });
    }
    out
}

/// The DFlash drafter's query blocks: each row's `block_len` positions (the next token,
/// then K masks) and the cache slot each writes, with the rows' block tables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DFlashLog {
    pub block_len: usize,
    /// `[rows][width]` block ids (-1: none).
    pub block_table: Vec<Vec<i64>>,
    /// `[rows * block_len]`.
    pub block_positions: Vec<usize>,
    /// `[rows * block_len]` (-1: PAD).
    pub block_slots: Vec<i64>,
    /// `[rows * block_len]`: the block-table index each position was looked up at,
    /// where the engine logs it (it must stay inside the row).
    #[serde(default)]
    pub block_indices: Option<Vec<usize>>,
}

/// Shapes the parts' audits index by, checked before any part is audited.
pub(super) fn validate(log: &StepLog) -> Result<(), String> {
    let rows = log.order.len();
    if let Some(r) = &log.num_rejected_tokens {
        if r.len() != rows {
            return Err(format!(
                "num_rejected_tokens has {} rows, order has {rows}",
                r.len()
            ));
        }
        let q: Vec<usize> = log
            .order
            .iter()
            .filter_map(|&i| log.num_scheduled_tokens.get(i).copied())
            .collect();
        if let Some(i) = (0..rows.min(q.len())).find(|&i| r[i] >= q[i].max(1)) {
            return Err(format!(
                "num_rejected_tokens[{i}] = {} of a row of {} tokens",
                r[i], q[i]
            ));
        }
    }
    if let Some(bad) = log
        .attention_backends
        .iter()
        .flatten()
        .find(|n| BackendProfile::from_name(n).is_none())
    {
        return Err(format!(
            "attention_backends: {bad:?} is not one of {:?}",
            BackendProfile::ALL.map(|p| p.name())
        ));
    }
    if let Some(t) = &log.block_table {
        if t.len() != rows {
            return Err(format!(
                "block_table has {} rows, order has {rows}",
                t.len()
            ));
        }
    }
    if let Some(d) = &log.dflash {
        let want = d.block_table.len() * d.block_len;
        let (p, s) = (d.block_positions.len(), d.block_slots.len());
        if d.block_len == 0 || p != want || s != want {
            return Err(format!(
                "dflash: {p} block positions and {s} slots for {} rows of blocks of {}",
                d.block_table.len(),
                d.block_len
            ));
        }
    }
    if let Some(c) = &log.chunked_context {
        let n = c.cu_seq_lens.len();
        let lens = [c.starts.len(), c.seq_tot.len(), c.max_seq_lens.len()];
        if lens.iter().any(|&l| l != n) {
            return Err(format!(
                "chunked_context: cu_seq_lens has {n} chunks, starts / seq_tot / \
                 max_seq_lens have {lens:?}"
            ));
        }
    }
    Ok(())
}

/// Every optional part `log` carries, audited.
pub(super) fn audit_parts(log: &StepLog, rows: &[RowShape]) -> Vec<Violation> {
    let in_order: Vec<RowShape> = log.order.iter().map(|&r| rows[r]).collect();
    let mut out = Vec::new();
    let mut add = |rule, found: Option<(Option<usize>, String)>| {
        if let Some((row, detail)) = found {
            out.push(Violation {
                rule,
                step: 0,
                row,
                detail,
            });
        }
    };
    add(Rule::Threshold, audit_threshold(log));
    add(Rule::CudaGraph, audit_padding(log));
    add(Rule::GraphBuffers, audit_idx_mapping(log));
    add(Rule::SlotMapping, audit_slots(log, &in_order));
    add(Rule::ChunkedContext, audit_chunks(log, &in_order));
    add(Rule::CudaGraph, audit_graph(log, &in_order));
    add(Rule::Sampling, audit_spec_decode(log, &in_order));
    add(Rule::DrafterInputs, audit_drafter(log, &in_order));
    add(Rule::DFlashSlots, audit_dflash(log));
    out
}

/// Each block position's slot by the DFlash slot rule (`drafter::dflash_slot`): PAD at
/// or past `max_model_len`, else the row's block at the position, the index clamped to
/// the table width.
fn audit_dflash(log: &StepLog) -> Option<(Option<usize>, String)> {
    let (d, page, max_len) = (log.dflash.as_ref()?, log.page_size?, log.max_model_len?);
    let width = d.block_table.first().map_or(0, Vec::len);
    if let Some((j, &i)) = d
        .block_indices
        .iter()
        .flatten()
        .enumerate()
        .find(|&(_, &i)| i >= width)
    {
        return Some((
            Some(j / d.block_len.max(1)),
            format!("block position {j} looked up block-table index {i}, past the width {width}"),
        ));
    }
    for (j, (&pos, &got)) in d.block_positions.iter().zip(&d.block_slots).enumerate() {
        let r = j / d.block_len.max(1);
        let row: Vec<u32> = d
            .block_table
            .get(r)?
            .iter()
            .map(|&b| block_u32(b))
            .collect();
        if row.is_empty() {
            return None;
        }
        let want = dflash_slot(&row, pos, page, max_len);
        if got != want {
            return Some((
                Some(r),
                format!(
                    "block position {j} (row {r}, position {pos}): slot {got}, the slot rule \
                     gives {want} (max_model_len {max_len})"
                ),
            ));
        }
    }
    None
}

fn block_u32(b: i64) -> u32 {
    u32::try_from(b).unwrap_or(crate::block_pool::NO_BLOCK)
}

fn audit_drafter(log: &StepLog, rows: &[RowShape]) -> Option<(Option<usize>, String)> {
    let (got, rejected) = (
        log.drafter_passes.as_ref()?,
        log.num_rejected_tokens.as_ref()?,
    );
    let mode = log.drafter_batch.unwrap_or(DrafterBatch::Padded);
    let q: Vec<usize> = rows.iter().map(|r| r.num_scheduled_tokens).collect();
    let seq: Vec<usize> = rows
        .iter()
        .map(|r| r.num_computed_tokens + r.num_scheduled_tokens)
        .collect();
    let want = drafter_passes(&q, &seq, rejected, mode, got.len());
    let (j, (g, w)) = got
        .iter()
        .zip(&want)
        .enumerate()
        .find(|(_, (g, w))| g != w)?;
    Some((
        None,
        format!("drafter pass {j}: {g:?}, the rows and rejected drafts {rejected:?} give {w:?}"),
    ))
}

/// The threshold and `require_uniform` the backend matrix gives the logged backends
/// (`invariants::matrix_threshold`; verify rows of `1 + K` tokens).
fn audit_threshold(log: &StepLog) -> Option<(Option<usize>, String)> {
    let names = log.attention_backends.as_ref()?;
    let profiles: Vec<BackendProfile> = names
        .iter()
        .filter_map(|n| BackendProfile::from_name(n))
        .collect();
    let k = log.num_spec_tokens;
    let want = matrix_threshold(&profiles, (k > 0).then_some(1 + k));
    let got = (log.decode_threshold, log.require_uniform);
    (got != want).then(|| {
        (
            None,
            format!(
                "(decode_threshold, require_uniform) = {got:?}, the backend matrix gives \
                 {names:?} with K = {k} {want:?}"
            ),
        )
    })
}

/// Padding rows past the real ones (a graph's): `seq_lens` 0 and `query_start_loc`
/// repeating the last real offset, so they see no key and own no token.
fn audit_padding(log: &StepLog) -> Option<(Option<usize>, String)> {
    let n = log.order.len();
    if let Some(i) = (n..log.seq_lens.len()).find(|&i| log.seq_lens[i] != 0) {
        return Some((
            Some(i),
            format!(
                "padding row {i} reads seq_len {} (a stale persistent buffer; it must be 0)",
                log.seq_lens[i]
            ),
        ));
    }
    let last = log.query_start_loc.get(n).copied()?;
    let tail = log.query_start_loc.get(n + 1..).unwrap_or(&[]);
    tail.iter().position(|&x| x != last).map(|j| {
        (
            Some(n + j),
            format!(
                "padding row {}'s query_start_loc is {}, not {last} (q = 0)",
                n + j,
                tail[j]
            ),
        )
    })
}

/// Padding rows map to no request state (vLLM #47066: draft sampling writes through a
/// stale entry into a live request's slot).
fn audit_idx_mapping(log: &StepLog) -> Option<(Option<usize>, String)> {
    let idx = log.idx_mapping.as_ref()?;
    let n = log.order.len();
    (n..idx.len()).find(|&i| idx[i] != -1).map(|i| {
        (
            Some(i),
            format!(
                "padding row {i} maps to request-state slot {} (it must be -1)",
                idx[i]
            ),
        )
    })
}

/// Each real token's slot: its row's block for the token's position, times the page
/// size, plus the offset in the page.
fn audit_slots(log: &StepLog, rows: &[RowShape]) -> Option<(Option<usize>, String)> {
    let (table, slots, page) = (
        log.block_table.as_ref()?,
        log.slot_mapping.as_ref()?,
        log.page_size?,
    );
    let mut t = 0;
    for (i, r) in rows.iter().enumerate() {
        for pos in r.num_computed_tokens..r.num_computed_tokens + r.num_scheduled_tokens {
            let block = table[i].get(pos / page).copied();
            let want = block
                .filter(|&b| b >= 0)
                .and_then(|b| b.checked_mul(page as i64))
                .and_then(|s| s.checked_add((pos % page) as i64));
            let got = slots.get(t).copied();
            if want.is_none() || got != want {
                return Some((
                    Some(i),
                    format!(
                        "token {t} (position {pos} of row {i}): slot {got:?}, its block table \
                         row gives {want:?}"
                    ),
                ));
            }
            t += 1;
        }
    }
    None
}

/// The chunk plan of the prefill rows' contexts under the log's workspace and page.
fn audit_chunks(log: &StepLog, rows: &[RowShape]) -> Option<(Option<usize>, String)> {
    let (got, workspace, page) = (
        log.chunked_context.as_ref()?,
        log.workspace_tokens?,
        log.page_size?,
    );
    // The prefill rows by the rule's split, so a wrong `num_decodes` (the split audit's
    // finding) does not cascade here.
    let qs: Vec<usize> = rows.iter().map(|r| r.num_scheduled_tokens).collect();
    let (num_decodes, _, _) = super::rule_split(log, &qs);
    let prefill = rows.get(num_decodes.min(rows.len())..)?;
    let ctx: Vec<usize> = prefill.iter().map(|r| r.num_computed_tokens).collect();
    // The count first: a log's contexts may call for more chunks than it could hold.
    let count = match chunk_size(&ctx, workspace, page) {
        Ok(size) => size.map_or(0, |(_, n)| n),
        Err(e) => return Some((None, format!("the log has chunks, but {e}"))),
    };
    if count != got.cu_seq_lens.len() {
        return Some((
            None,
            format!(
                "chunked_context has {} chunks, the prefill rows' contexts under a workspace \
                 of {workspace} tokens and pages of {page} give {count}",
                got.cu_seq_lens.len()
            ),
        ));
    }
    let want = match plan_context_chunks(&ctx, workspace, page) {
        Ok(plan) => chunked_context_log(plan.as_ref()),
        Err(e) => return Some((None, format!("the log has chunks, but {e}"))),
    };
    (*got != want).then(|| {
        (
            None,
            format!(
                "chunked_context {got:?}, the prefill rows' contexts {ctx:?} under a workspace \
                 of {workspace} tokens and pages of {page} give {want:?}"
            ),
        )
    })
}

/// A chunk plan in vLLM's arrays (all empty when no prefill row has context).
pub fn chunked_context_log(
    plan: Option<&crate::chunked_context::ChunkedContext>,
) -> ChunkedContextLog {
    let mut out = ChunkedContextLog::default();
    for ch in plan.map_or(&[][..], |p| &p.chunks) {
        let mut cu = vec![0];
        for &l in &ch.lens {
            cu.push(cu.last().copied().unwrap_or(0) + l);
        }
        out.cu_seq_lens.push(cu);
        out.starts.push(ch.starts.clone());
        out.seq_tot.push(ch.total_tokens());
        out.max_seq_lens
            .push(ch.lens.iter().copied().max().unwrap_or(0));
    }
    out
}

/// The uniform-decode graph the rows qualify for under the log's capture sizes (the
/// fixed rule: every row `1 + K` tokens and past its prompt), or none.
fn audit_graph(log: &StepLog, rows: &[RowShape]) -> Option<(Option<usize>, String)> {
    let sizes = log.capture_sizes.as_ref()?;
    let q = 1 + log.num_spec_tokens;
    // vLLM rounds every capture size to a multiple of 1 + K (#28207,
    // `adjust_cudagraph_sizes_for_spec_decode`), or a uniform batch pads past a row.
    if let Some(s) = sizes.iter().find(|&&s| s % q != 0) {
        return Some((
            None,
            format!("capture size {s} of {sizes:?} is not a multiple of 1 + K = {q}"),
        ));
    }
    let got = log.graph.as_ref()?;
    let want = dispatch_rows(q, false, rows, sizes);
    let ok = match want {
        Some(d) => {
            got.uniform
                && got.num_tokens == d.shape.num_tokens
                && got.num_reqs.is_none_or(|n| n == d.shape.num_rows)
        }
        None => !got.uniform,
    };
    let want = want.map(|d| (d.shape.num_tokens, d.shape.num_rows));
    (!ok).then(|| {
        let why = match want {
            Some((t, r)) => format!("the uniform-decode graph of {t} tokens and {r} requests"),
            None => format!(
                "no uniform-decode graph (every row must have q_len {q} and be past its \
                 prompt, and fit a capture size of {sizes:?})"
            ),
        };
        (
            None,
            format!("the step ran {got:?}; its rows qualify for {why}"),
        )
    })
}

/// vLLM's `_calc_spec_decode_metadata` over the rows in order, each row sampling its
/// last `1 + drafts` positions (`vllm/v1/worker/gpu_model_runner.py`): `logits_indices`
/// are flat token positions, `target_logits_indices` and `bonus_logits_indices` index
/// into those logits.
pub fn spec_decode_metadata(
    num_draft_tokens: &[usize],
    query_start_loc: &[usize],
) -> SpecDecodeLog {
    let mut out = SpecDecodeLog::default();
    let mut drafts = 0;
    for (i, &nd) in num_draft_tokens.iter().enumerate() {
        drafts += nd;
        out.cu_num_draft_tokens.push(drafts);
        let first_sample = out.logits_indices.len();
        let end = query_start_loc.get(i + 1).copied().unwrap_or(0);
        out.logits_indices.extend(end.saturating_sub(nd + 1)..end);
        out.target_logits_indices
            .extend(first_sample..first_sample + nd);
        out.bonus_logits_indices.push(first_sample + nd);
    }
    out
}

fn audit_spec_decode(log: &StepLog, rows: &[RowShape]) -> Option<(Option<usize>, String)> {
    let (got, drafts) = (log.spec_decode.as_ref()?, log.num_draft_tokens.as_ref()?);
    let nd: Vec<usize> = log.order.iter().map(|&r| drafts[r]).collect();
    let mut loc = vec![0];
    for r in rows {
        loc.push(loc.last().copied().unwrap_or(0) + r.num_scheduled_tokens);
    }
    // The sizes first: the rows may call for more indices than the log could hold.
    let drafts_total: usize = nd.iter().sum();
    let sizes = [
        (got.logits_indices.len(), drafts_total + nd.len()),
        (got.target_logits_indices.len(), drafts_total),
        (got.bonus_logits_indices.len(), nd.len()),
        (got.cu_num_draft_tokens.len(), nd.len()),
    ];
    if let Some((g, w)) = sizes.iter().find(|(g, w)| g != w) {
        return Some((
            None,
            format!("spec_decode holds an array of {g} entries where the rows' draft counts {nd:?} give {w}"),
        ));
    }
    let want = spec_decode_metadata(&nd, &loc);
    (*got != want).then(|| {
        (
            None,
            format!("spec_decode {got:?}, the rows' draft counts {nd:?} give {want:?}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunked_context::plan_context_chunks;

    /// vLLM's `_calc_spec_decode_metadata` on num_draft_tokens [3, 0, 2] over rows of
    /// [4, 7, 3] tokens (worked through the code of v0.33.0 `4ba787ec9`).
    #[test]
    fn spec_decode_metadata_is_vllms() {
        let m = spec_decode_metadata(&[3, 0, 2], &[0, 4, 11, 14]);
        assert_eq!(m.cu_num_draft_tokens, vec![3, 3, 5]);
        assert_eq!(m.logits_indices, vec![0, 1, 2, 3, 10, 11, 12, 13]);
        assert_eq!(m.target_logits_indices, vec![0, 1, 2, 5, 6]);
        assert_eq!(m.bonus_logits_indices, vec![3, 4, 7]);
    }

    /// The classic MLA chunked-context arrays (vLLM v0.12-v0.26 `common.py`) for prefill
    /// contexts [100, 0, 300], a workspace of 256 tokens, pages of 16.
    #[test]
    fn chunked_context_arrays_are_vllms() {
        let plan = plan_context_chunks(&[100, 0, 300], 256, 16).unwrap();
        let c = chunked_context_log(plan.as_ref());
        assert_eq!(c.starts, vec![vec![0; 3], vec![128; 3], vec![256; 3]]);
        assert_eq!(
            c.cu_seq_lens,
            vec![
                vec![0, 100, 100, 228],
                vec![0, 0, 0, 128],
                vec![0, 0, 0, 44]
            ]
        );
        assert_eq!(c.seq_tot, vec![228, 128, 44]);
        assert_eq!(c.max_seq_lens, vec![128, 128, 44]);
    }

    /// vLLM's proposer on query_start_loc [0, 4, 11, 14], seq_lens [20, 57, 33] and 2, 0
    /// and 0 rejected drafts (`llm_base_proposer.py`, v0.33.0).
    #[test]
    fn drafter_passes_are_vllms() {
        let (q, seq, rej) = ([4, 7, 3], [20, 57, 33], [2, 0, 0]);
        let p = drafter_passes(&q, &seq, &rej, DrafterBatch::Padded, 2);
        assert_eq!(p[0].query_start_loc, vec![0, 4, 11, 14]);
        assert_eq!(p[0].seq_lens, vec![20, 57, 33]);
        assert_eq!(p[0].token_indices_to_sample, vec![1, 10, 13]);
        assert_eq!(p[0].num_actual_tokens, 14);
        assert_eq!(p[1].seq_lens, vec![19, 58, 34]);
        assert_eq!(p[1].query_start_loc, vec![0, 1, 2, 3]);
        assert_eq!(p[1].num_actual_tokens, 3);
        // A row of no tokens is no panic (an engine's log may hold anything).
        let z = drafter_passes(&[0, 2], &[5, 7], &[0, 1], DrafterBatch::Padded, 2);
        assert_eq!(z[0].token_indices_to_sample, vec![0, 0]);
        let c = drafter_passes(&q, &seq, &rej, DrafterBatch::Compacted, 1);
        assert_eq!(c[0].query_start_loc, vec![0, 2, 9, 12]);
        assert_eq!(c[0].seq_lens, vec![18, 57, 33]);
        assert_eq!(c[0].token_indices_to_sample, vec![1, 8, 11]);
        assert_eq!(c[0].num_actual_tokens, 12);
    }

    fn rows(shapes: &[(usize, usize, usize)]) -> Vec<RowShape> {
        shapes
            .iter()
            .map(|&(c, q, p)| RowShape {
                num_computed_tokens: c,
                num_scheduled_tokens: q,
                num_prompt_tokens: p,
            })
            .collect()
    }

    /// K = 3, sizes [..., 16, 24, ...]: five verify rows of 4 tokens take the 24-token
    /// graph of 6 requests; a row still prefilling keeps the step off it.
    #[test]
    fn the_graph_is_the_dispatchers() {
        let sizes = vec![8, 16, 24, 32];
        let verify = rows(&[(50, 4, 10); 5]);
        let log = |uniform, num_tokens, num_reqs| StepLog {
            num_spec_tokens: 3,
            capture_sizes: Some(sizes.clone()),
            graph: Some(GraphLog {
                num_tokens,
                uniform,
                num_reqs,
            }),
            ..StepLog::default()
        };
        assert!(audit_graph(&log(true, 24, Some(6)), &verify).is_none());
        assert!(audit_graph(&log(true, 24, Some(5)), &verify).is_some());
        assert!(audit_graph(&log(false, 20, None), &verify).is_some());
        let prefilling = rows(&[(0, 4, 10)]);
        assert!(audit_graph(&log(true, 8, None), &prefilling).is_some());
        assert!(audit_graph(&log(false, 4, None), &prefilling).is_none());
        let mut odd = log(false, 4, None);
        odd.capture_sizes = Some(vec![1, 8]);
        assert!(audit_graph(&odd, &prefilling)
            .unwrap()
            .1
            .contains("not a multiple"));
    }
}
