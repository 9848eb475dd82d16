//! What `replay show` prints of a trace's steps, as text: one line per step, or a step
//! in detail. A library module so the reader and these lines can be fuzzed together;
//! `show` reads records as they are, so nothing here trusts an index it did not check.

use specmla_sim::cli::count;
use specmla_traces::format::decode_payload;
use specmla_traces::{RowPath, StepRecord};

/// One line: rows by path, tokens, accepted drafts, violated invariants.
pub fn step_line(r: &StepRecord) -> String {
    let decode = r.rows.iter().filter(|x| x.path == RowPath::Decode).count();
    let tokens: u64 = r
        .rows
        .iter()
        .fold(0, |a, x| a.saturating_add(x.num_scheduled_tokens));
    let accepted: u64 = r.num_accepted.iter().map(|&a| u64::from(a)).sum();
    let rows = count(r.rows.len(), "row");
    let violated = match r.violations.len() {
        0 => String::new(),
        n => format!(", {} violated", count(n, "invariant")),
    };
    format!(
        "step {:>5}: {rows:>8} ({decode} decode, {} prefill), {tokens:>5} tokens, {} accepted{violated}",
        r.step,
        r.rows.len() - decode,
        count(accepted as usize, "draft")
    )
}

/// The step line, then one line per planned row and per violated invariant.
pub fn step_detail(r: &StepRecord) -> Vec<String> {
    let mut out = vec![step_line(r)];
    for (p, &i) in r.order.iter().enumerate() {
        // A damaged order entry is named, not trusted.
        let Some(x) = r.rows.get(i as usize) else {
            out.push(format!(
                "  row {p:>3}: (order names scheduled row {i}, which does not exist)"
            ));
            continue;
        };
        let path = match x.path {
            RowPath::Decode => "decode",
            RowPath::Prefill => "prefill",
        };
        out.push(format!(
            "  row {p:>3}: request {:>4} {path:<7} context {:>5} q {:>3} drafts {} sampled {:?} accepted {} proposals {:?}",
            x.req_id,
            x.num_computed_tokens,
            x.num_scheduled_tokens,
            x.num_draft_tokens,
            r.sampled.get(p).cloned().unwrap_or_default(),
            r.num_accepted.get(p).copied().unwrap_or(0),
            r.proposals.get(p).cloned().unwrap_or_default()
        ));
    }
    for v in &r.violations {
        let row = v.row.map_or(String::new(), |p| format!(" (row {p})"));
        out.push(format!("  violated: {}{row}: {}", v.rule, v.detail));
    }
    out
}

/// The fuzz target's body (`fuzz/fuzz_targets/replay_show.rs`): `data` as a record
/// payload past its checksum (postcard, as the reader decodes it), then every line
/// `replay show` prints of it, its JSON, and the shape check a replay runs first under
/// the default scenario's config. A panic is a bug; errors are fine.
pub fn fuzz_one(data: &[u8]) {
    let Ok(rec) = decode_payload::<StepRecord>(data) else {
        return;
    };
    let _ = step_detail(&rec);
    let _ = serde_json::to_string(&rec);
    let cfg = &crate::fuzz_config();
    if let Err(e) = crate::replayer::check_record_shape(&rec, cfg) {
        assert!(!e.to_string().contains('\n'), "a multi-line error: {e}");
    }
}
