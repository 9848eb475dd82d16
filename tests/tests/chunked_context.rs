//! Chunked context (RULES §5): `chunked_context::plan_context_chunks` checked
//! against the rules (docs/RULES.md) with a reference that walks each row's context position by
//! position: chunks fit the workspace, cover each row's context exactly once and in
//! order, use chunk = round_down(W / n, page), and a too-small workspace is an error,
//! never a panic.

use proptest::prelude::*;
use specmla_core::chunked_context::{plan_context_chunks, ChunkError};

fn page() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![1usize, 16, 64])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn chunks_fit_the_workspace_and_cover_each_context(
        ctx in prop::collection::vec(prop_oneof![1 => Just(0usize), 4 => 0usize..5000], 1..16),
        page in page(),
        extra in 0usize..20_000,
    ) {
        // The config guarantees W >= max_num_seqs * page >= rows * page.
        let w = ctx.len() * page + extra;
        let n = ctx.iter().filter(|&&c| c > 0).count();
        let plan = plan_context_chunks(&ctx, w, page).expect("workspace holds a page per row");
        let Some(plan) = plan else {
            prop_assert_eq!(n, 0, "rows have context but no chunk plan");
            return Ok(());
        };
        prop_assert!(n > 0, "a chunk plan without context");
        prop_assert_eq!(plan.workspace_tokens, w);
        let chunk = plan.chunk_size_tokens;
        // round_down(W / n, page), computed by repeated subtraction.
        let mut want = 0;
        while want + page <= w / n {
            want += page;
        }
        prop_assert_eq!(chunk, want);

        // Walk every chunk, tracking the next uncovered position of each row.
        let mut next = vec![0usize; ctx.len()];
        for (i, ch) in plan.chunks.iter().enumerate() {
            prop_assert_eq!(ch.starts.len(), ctx.len());
            prop_assert_eq!(ch.lens.len(), ctx.len());
            let total: usize = ch.lens.iter().sum();
            prop_assert!(total <= w, "chunk {} gathers {} > W {}", i, total, w);
            prop_assert!(total > 0, "chunk {} is empty", i);
            for j in 0..ctx.len() {
                let len = ch.lens[j];
                prop_assert!(len <= chunk, "row {} chunk {} len {} > chunk {}", j, i, len, chunk);
                if len > 0 {
                    prop_assert_eq!(ch.starts[j], next[j], "row {} chunk {} not contiguous", j, i);
                    // Greedy: a row only takes less than a full chunk on its last one.
                    prop_assert!(len == chunk || next[j] + len == ctx[j]);
                }
                next[j] += len;
                prop_assert!(next[j] <= ctx[j], "row {} covers past its context", j);
            }
        }
        prop_assert_eq!(&next, &ctx);
        // The fewest chunks: ceil(max ctx / chunk).
        let max = *ctx.iter().max().unwrap();
        prop_assert_eq!(plan.chunks.len(), max.div_ceil(chunk));
    }

    /// W / n < page: a structured error naming the sizes, not a panic or a zero chunk.
    #[test]
    fn too_small_workspace_is_an_error(
        ctx in prop::collection::vec(1usize..5000, 1..16),
        page in page(),
        frac in 0.0f64..1.0,
    ) {
        let n = ctx.len();
        let w = ((n * page) as f64 * frac) as usize;
        prop_assume!(w / n < page);
        let got = plan_context_chunks(&ctx, w, page);
        prop_assert_eq!(got, Err(ChunkError::WorkspaceTooSmall { workspace_tokens: w, rows: n, page_size: page }));
    }
}

/// Rows without context take no workspace share: two rows with context and one without
/// split W = 64 into chunks of 32, not 21.
#[test]
fn rows_without_context_do_not_shrink_the_chunk() {
    let plan = plan_context_chunks(&[40, 0, 10], 64, 16).unwrap().unwrap();
    assert_eq!(plan.chunk_size_tokens, 32);
    assert_eq!(plan.chunks.len(), 2);
    assert_eq!(plan.chunks[0].lens, vec![32, 0, 10]);
    assert_eq!(plan.chunks[1].lens, vec![8, 0, 0]);
    assert_eq!(plan.chunks[1].starts[0], 32);
}
