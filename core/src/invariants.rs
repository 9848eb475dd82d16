//! Invariant checkers for every rule of RULES §4-§8. Each recomputes the rule
//! from the scheduled batch with a deliberately simple reference and reports structured
//! violations (rule, step, row) instead of panicking, so `sim` can name what broke.

use serde::{Deserialize, Serialize};

use crate::batch::ScheduledBatch;
use crate::block_pool::PAD_SLOT;
use crate::config::{DrafterBatch, EngineConfig, Planner, QueryLenSupport};
use crate::drafter::{DFlashPass, DrafterPass, RowOutcome};
use crate::graph_buffers::DummyStep;
use crate::plan::StepPlan;
use crate::reorder::Region;
use crate::split::SplitSchedule;

/// The rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Rule {
    /// Threshold and require_uniform follow the capability matrix (section 4).
    Threshold,
    /// Regions and order are vLLM's: rows already in their region stay, misplaced rows
    /// fill the misplaced slots in (region, index) order.
    Reorder,
    /// Decode rows are contiguous at the layout's edge and as many as vLLM's
    /// query-length split gives.
    Split,
    /// query_start_loc, seq_lens, positions and counts agree with the batch (section 1).
    CommonMetadata,
    /// Every token's slot is its own page slot; PAD only where nothing may be written.
    SlotMapping,
    /// The decode planner and kernel read the same rows (section 8).
    DecodeRows,
    /// Context chunks fit the workspace and cover each row's context (section 5).
    ChunkedContext,
    /// Graph sizes, dispatch and padding (section 7).
    CudaGraph,
    /// Logits indices and grammar masks of verify positions (section 3, 8).
    Sampling,
    /// Multi-step drafter inputs, padded and compacted (section 6).
    DrafterInputs,
    /// DFlash block positions and slots (section 6).
    DFlashSlots,
    /// What a replayed graph reads from its persistent buffers is this step's: padding
    /// rows see no key, and the split schedule is the one the current seq_lens give.
    GraphBuffers,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::Threshold => "threshold",
            Rule::Reorder => "reorder",
            Rule::Split => "split",
            Rule::CommonMetadata => "common-metadata",
            Rule::SlotMapping => "slot-mapping",
            Rule::DecodeRows => "decode-rows",
            Rule::ChunkedContext => "chunked-context",
            Rule::CudaGraph => "cuda-graph",
            Rule::Sampling => "sampling",
            Rule::DrafterInputs => "drafter-inputs",
            Rule::DFlashSlots => "dflash-slots",
            Rule::GraphBuffers => "graph-buffers",
        }
    }
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub rule: Rule,
    pub step: u64,
    /// Planned row, when the rule is about one row.
    pub row: Option<usize>,
    pub detail: String,
}

struct Sink {
    step: u64,
    out: Vec<Violation>,
}

impl Sink {
    fn check(&mut self, ok: bool, rule: Rule, row: Option<usize>, detail: impl FnOnce() -> String) {
        if !ok {
            self.out.push(Violation {
                rule,
                step: self.step,
                row,
                detail: detail(),
            });
        }
    }
}

/// The slot a request's position must have, restated here rather than borrowed from
/// the planner (`block_pool::slot_for`), so a wrong slot rule in the planner cannot also
/// pass its own check. The block table is the request's own block list, as scheduled:
/// -1 (PAD) at or past `max_model_len` or past the allocated blocks, else the block's
/// first slot plus the offset in the page.
fn ref_slot(block_ids: &[u32], pos: usize, page_size: usize, max_model_len: usize) -> i64 {
    let block = pos / page_size;
    if pos >= max_model_len || block >= block_ids.len() || block_ids[block] == u32::MAX {
        return -1;
    }
    i64::from(block_ids[block]) * page_size as i64 + (pos % page_size) as i64
}

/// Checks a target plan against the batch it was built from.
pub fn check_plan(
    cfg: &EngineConfig,
    batch: &ScheduledBatch,
    plan: &StepPlan,
    capture_sizes: &[usize],
) -> Vec<Violation> {
    let mut s = Sink {
        step: plan.step,
        out: Vec::new(),
    };
    check_threshold(cfg, plan, &mut s);
    check_reorder(cfg, batch, plan, &mut s);
    check_split(plan, &mut s);
    check_common(cfg, batch, plan, &mut s);
    check_decode_rows(cfg, plan, &mut s);
    check_chunks(cfg, plan, &mut s);
    check_graph(cfg, plan, capture_sizes, &mut s);
    check_graph_buffers(cfg, plan, &mut s);
    check_sampling(batch, plan, &mut s);
    s.out
}

fn check_threshold(cfg: &EngineConfig, plan: &StepPlan, s: &mut Sink) {
    let k = cfg.spec.k();
    let verify_len = if cfg.spec.parallel_drafting {
        1 + 2 * k
    } else {
        1 + k
    };
    let expect = cfg
        .backends
        .iter()
        .map(|p| {
            let c = p.capabilities();
            match (c.query_len_support, cfg.spec.enabled()) {
                (QueryLenSupport::SingleOnly, _) => 1,
                (_, true) => c.base_threshold.max(verify_len),
                (_, false) => c.base_threshold,
            }
        })
        .min()
        .unwrap_or(1);
    let expect = cfg.split_override.reorder_batch_threshold.unwrap_or(expect);
    s.check(plan.threshold == expect, Rule::Threshold, None, || {
        format!("threshold {} != {expect}", plan.threshold)
    });
    let uniform = cfg
        .backends
        .iter()
        .any(|p| p.capabilities().query_len_support != QueryLenSupport::Varlen);
    let uniform = cfg.split_override.require_uniform.unwrap_or(uniform);
    s.check(
        plan.require_uniform == uniform,
        Rule::Threshold,
        None,
        || "require_uniform disagrees with the matrix".into(),
    );
}

/// The region of a row, restated from vLLM's four booleans (has context, below the
/// threshold, done prefilling), independent of `reorder::region`.
fn ref_region(planner: Planner, computed: usize, q: usize, prompt: usize, thr: usize) -> Region {
    let has_context = computed > 0;
    let below = q <= thr;
    let short_extend = planner == Planner::Vllm && computed < prompt;
    match (has_context, below, short_extend) {
        (false, _, _) => Region::Prefill,
        (true, false, _) => Region::LongExtend,
        (true, true, true) => Region::ShortExtend,
        (true, true, false) => Region::Decode,
    }
}

/// The plan's order with the layout undone: vLLM's decode-first order, whatever the
/// layout (extend-first keeps the decode rows at the end).
fn decode_first_order(plan: &StepPlan) -> Vec<usize> {
    let mut order = plan.order.clone();
    if plan.layout == crate::config::RowLayout::ExtendFirst {
        let nd = plan.rows.iter().filter(|r| r.is_decode).count();
        let len = order.len();
        order.rotate_right(nd.min(len));
    }
    order
}

fn check_reorder(cfg: &EngineConfig, batch: &ScheduledBatch, plan: &StepPlan, s: &mut Sink) {
    let n = batch.rows.len();
    let mut seen = vec![false; n];
    for &i in &plan.order {
        s.check(
            i < n && !std::mem::replace(&mut seen[i.min(n - 1)], true),
            Rule::Reorder,
            None,
            || format!("order {:?} is not a permutation of 0..{n}", plan.order),
        );
    }
    s.check(plan.order.len() == n, Rule::Reorder, None, || {
        "order length differs from the batch".into()
    });
    s.check(
        plan.planner == cfg.scheduler.planner,
        Rule::Reorder,
        None,
        || {
            format!(
                "planned by {:?}, configured {:?}",
                plan.planner, cfg.scheduler.planner
            )
        },
    );
    if plan.order.len() != n || seen.iter().any(|&x| !x) {
        return;
    }
    let regions: Vec<Region> = batch
        .rows
        .iter()
        .map(|b| {
            let (c, q, p) = (
                b.num_computed_tokens,
                b.num_scheduled_tokens,
                b.num_prompt_tokens,
            );
            ref_region(plan.planner, c, q, p, plan.threshold)
        })
        .collect();
    for (r, row) in plan.rows.iter().enumerate() {
        let expect = regions[plan.order[r]];
        s.check(row.region == expect, Rule::Reorder, Some(r), || {
            format!("region {:?}, expected {expect:?}", row.region)
        });
    }
    // vLLM's swaps: a row whose slot already wants its region stays; the others fill the
    // misplaced slots in index order, taken by (region, index).
    let mut target = regions.clone();
    target.sort();
    let misplaced: Vec<usize> = (0..n).filter(|&i| regions[i] != target[i]).collect();
    let mut movers = misplaced.clone();
    movers.sort_by_key(|&i| (regions[i], i));
    let mut expect: Vec<usize> = (0..n).collect();
    for (&slot, &row) in misplaced.iter().zip(&movers) {
        expect[slot] = row;
    }
    let got = decode_first_order(plan);
    if let Some(p) = (0..n).find(|&p| got[p] != expect[p]) {
        s.check(false, Rule::Reorder, Some(p), || {
            format!(
                "vLLM's reorder puts input row {} at position {p}, the plan has {} (order {got:?})",
                expect[p], got[p]
            )
        });
    }
    s.check(
        plan.reordered != misplaced.is_empty(),
        Rule::Reorder,
        None,
        || {
            format!(
                "reordered = {}, but {} rows were misplaced",
                plan.reordered,
                misplaced.len()
            )
        },
    );
}

/// vLLM's split read literally over the decode-first query lengths: the number of
/// leading rows the decode kernel takes.
fn ref_num_decodes(qs: &[usize], thr: usize, uniform: bool) -> usize {
    let n = qs.len();
    if n == 0 || (qs.iter().all(|&q| q <= thr) && (!uniform || thr <= 1)) {
        return n;
    }
    if qs[0] > thr {
        return 0;
    }
    if uniform && qs.iter().all(|&q| q == qs[0] || q == 0) {
        return n;
    }
    let mut i = 0;
    while i < n
        && if uniform {
            qs[i] == qs[0]
        } else {
            qs[i] <= thr
        }
    {
        i += 1;
    }
    i
}

fn check_split(plan: &StepPlan, s: &mut Sink) {
    let dec: Vec<usize> = (0..plan.rows.len())
        .filter(|&r| plan.rows[r].is_decode)
        .collect();
    if let (Some(&first), Some(&last)) = (dec.first(), dec.last()) {
        s.check(
            last - first + 1 == dec.len(),
            Rule::Split,
            Some(first),
            || "decode rows are not contiguous".into(),
        );
        let at_edge = match plan.layout {
            crate::config::RowLayout::DecodeFirst => first == 0,
            crate::config::RowLayout::ExtendFirst => last + 1 == plan.rows.len(),
        };
        s.check(at_edge, Rule::Split, Some(first), || {
            format!("decode rows not at the {:?} edge", plan.layout)
        });
    }
    let mut qs: Vec<usize> = plan.rows.iter().map(|r| r.query_len).collect();
    if plan.layout == crate::config::RowLayout::ExtendFirst {
        qs.rotate_right(dec.len());
    }
    let want = ref_num_decodes(&qs, plan.threshold, plan.require_uniform);
    s.check(dec.len() == want, Rule::Split, None, || {
        format!(
            "{} decode rows; vLLM's split of q {qs:?} (threshold {}, uniform {}) gives {want}",
            dec.len(),
            plan.threshold,
            plan.require_uniform
        )
    });
    let m = &plan.mla;
    s.check(m.num_decodes == dec.len(), Rule::Split, None, || {
        format!("num_decodes {} != {}", m.num_decodes, dec.len())
    });
    let dec_tokens: usize = dec.iter().map(|&r| plan.rows[r].query_len).sum();
    s.check(m.num_decode_tokens == dec_tokens, Rule::Split, None, || {
        format!("num_decode_tokens {} != {dec_tokens}", m.num_decode_tokens)
    });
    s.check(
        m.num_decodes + m.num_prefills == plan.rows.len(),
        Rule::Split,
        None,
        || "decodes + prefills != rows".into(),
    );
}

fn check_common(cfg: &EngineConfig, batch: &ScheduledBatch, plan: &StepPlan, s: &mut Sink) {
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

fn check_decode_rows(cfg: &EngineConfig, plan: &StepPlan, s: &mut Sink) {
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

fn check_chunks(cfg: &EngineConfig, plan: &StepPlan, s: &mut Sink) {
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

/// A replay reads the graph's persistent buffers whole: the padding rows' seq_lens must
/// be this step's zeros, and the split schedule must be recomputed from the seq_lens the
/// replay reads (the reference recomputes it here, as vLLM #35175 copies it).
fn check_graph_buffers(cfg: &EngineConfig, plan: &StepPlan, s: &mut Sink) {
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

fn check_graph(cfg: &EngineConfig, plan: &StepPlan, sizes: &[usize], s: &mut Sink) {
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

fn check_sampling(batch: &ScheduledBatch, plan: &StepPlan, s: &mut Sink) {
    let c = &plan.common;
    let mut k = 0;
    for (r, row) in plan.rows.iter().enumerate() {
        let b = &batch.rows[plan.order[r]];
        let n = if b.samples { b.num_draft_tokens + 1 } else { 0 };
        let got = plan.row_samples(r);
        s.check(got.len() == n, Rule::Sampling, Some(r), || {
            format!("{} logits entries, expected {n}", got.len())
        });
        let end = c.query_start_loc[r + 1];
        for (j, i) in got.enumerate() {
            let expect = end - n as u32 + j as u32;
            s.check(
                plan.logits_indices.get(i) == Some(&expect),
                Rule::Sampling,
                Some(r),
                || format!("logits index {i} is not token {expect}"),
            );
        }
        k += n;
        let _ = row;
    }
    s.check(
        plan.logits_indices.len() == k && plan.grammar_masks.len() == k,
        Rule::Sampling,
        None,
        || "logits indices and masks disagree in length".into(),
    );
}

/// Checks the grammar masks against each row's own drafts, read from the batch.
pub fn check_grammar_masks(
    batch: &ScheduledBatch,
    plan: &StepPlan,
    lookup: crate::plan::GrammarLookup<'_>,
) -> Vec<Violation> {
    let mut s = Sink {
        step: plan.step,
        out: Vec::new(),
    };
    for (r, row) in plan.rows.iter().enumerate() {
        let b = &batch.rows[plan.order[r]];
        let Some((a, state)) = lookup(row.req_id).filter(|_| b.samples) else {
            continue;
        };
        let drafts = &b.token_ids[b.token_ids.len() - b.num_draft_tokens..];
        let want = a.verify_masks(state, drafts);
        for (j, i) in plan.row_samples(r).enumerate() {
            s.check(
                plan.grammar_masks[i].as_ref() == Some(&want[j]),
                Rule::Sampling,
                Some(r),
                || format!("grammar mask of verify position {j} does not follow the row's drafts"),
            );
        }
    }
    s.out
}

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

/// Whether `num_splits` splits of `split_len` keys are the policy's schedule for a row
/// of `kv_len` keys, restated as properties: splits are whole units, at most the cap,
/// cover the keys, none is empty (but a keyless row's one), and no shorter split
/// (one unit less) would cover them within the cap.
fn ref_split_ok(cfg: &EngineConfig, kv_len: usize, split_len: u32, num_splits: u32) -> bool {
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
fn ref_mapped_keys(row: &[u32], page_size: usize) -> u32 {
    let mut keys = 0;
    for &b in row {
        if b == crate::block_pool::NO_BLOCK {
            break;
        }
        keys += page_size as u32;
    }
    keys
}

/// A drafter row reads `kv_len` keys (`want`, capped at max_model_len for the
/// multi-step drafter) in splits that cover them.
fn check_drafter_keys(
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
fn check_splits(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::ScheduledRow;
    use crate::config::*;
    use crate::plan::build_step_plan;

    fn cfg() -> EngineConfig {
        EngineConfig {
            model: ModelDims::tiny(),
            spec: SpecConfig::multi_step(3, DrafterBatch::Padded),
            scheduler: SchedulerConfig {
                max_num_seqs: 8,
                max_num_batched_tokens: 256,
                max_model_len: 512,
                page_size: 16,
                num_gpu_blocks: 256,
                chunked_prefill: true,
                prefill_chunk_tokens: 48,
                mixed_batches: true,
                row_layout: RowLayout::DecodeFirst,
                planner: Planner::Vllm,
                workspace_tokens: 512,
            },
            backends: vec![BackendProfile::FlashMla],
            cuda_graphs: false,
            max_capture_size_tokens: 64,
            split_size_tokens: 64,
            max_splits: 0,
            kv_cache_dtype: Default::default(),
            dp_peer_num_tokens: 0,
            faults: Default::default(),
            poison_stale_buffers: false,
            split_override: Default::default(),
        }
    }

    fn row(id: u64, computed: usize, q: usize, first_block: u32) -> ScheduledRow {
        ScheduledRow {
            req_id: id,
            num_computed_tokens: computed,
            // A verify row is past its prompt; a chunk is partway through it.
            num_prompt_tokens: if q == 4 { computed } else { computed + q + 1 },
            num_scheduled_tokens: q,
            token_ids: vec![1; q],
            num_draft_tokens: if q == 4 { 3 } else { 0 },
            samples: q == 4,
            next_prompt_token: (q != 4).then_some(2),
            block_ids: (first_block..first_block + 16).collect(),
            req_state_idx: id as usize,
        }
    }

    /// Found by `sim` on mixed_mtp seed 0, step 6 (under the old stable reorder, where
    /// only the leading q=4 row took the decode kernel). Postmortem: vLLM's reorder swaps
    /// the trailing verify row into the first short-extend slot, so both q=4 rows lead and
    /// both are decodes; the 48-token chunks follow as short extends on the prefill path.
    #[test]
    fn vllm_swaps_the_second_verify_row_next_to_the_first() {
        let cfg = cfg();
        // FlashMLA's threshold is 128, so 48-token chunks with context are short extends.
        let rows = vec![
            row(3, 113, 4, 0),
            row(5, 96, 48, 16),
            row(10, 96, 48, 32),
            row(13, 91, 4, 48),
        ];
        let batch = ScheduledBatch {
            step: 6,
            rows,
            preempted: Vec::new(),
        };
        for layout in [RowLayout::DecodeFirst, RowLayout::ExtendFirst] {
            let plan = build_step_plan(&cfg, &batch, &[], layout, &|_| None).unwrap();
            assert_eq!(plan.mla.num_decodes, 2, "both q=4 rows are decodes");
            let v = check_plan(&cfg, &batch, &plan, &[]);
            assert!(v.is_empty(), "{layout:?}: {v:?}");
        }
        let plan = build_step_plan(&cfg, &batch, &[], RowLayout::DecodeFirst, &|_| None).unwrap();
        assert_eq!(plan.order, vec![0, 3, 2, 1]);
    }

    /// The split rule fires when the decodes stop early without a mismatch.
    #[test]
    fn a_split_that_stops_before_a_mismatch_is_flagged() {
        let cfg = cfg();
        let rows = vec![row(3, 113, 4, 0), row(13, 91, 4, 48)];
        let batch = ScheduledBatch {
            step: 0,
            rows,
            preempted: Vec::new(),
        };
        let mut plan =
            build_step_plan(&cfg, &batch, &[], RowLayout::DecodeFirst, &|_| None).unwrap();
        plan.rows[1].is_decode = false;
        let v = check_plan(&cfg, &batch, &plan, &[]);
        assert!(v.iter().any(|v| v.rule == Rule::Split), "{v:?}");
    }
}
