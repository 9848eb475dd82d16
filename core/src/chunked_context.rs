//! Chunked context for prefill rows with cached context (RULES §5): how the
//! context is cut into workspace-sized chunks that are gathered and merged by LSE.

use serde::{Deserialize, Serialize};

/// One context chunk: per prefill row, the first context position and the length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextChunk {
    pub starts: Vec<usize>,
    pub lens: Vec<usize>,
}

impl ContextChunk {
    /// Tokens gathered into the workspace for this chunk.
    pub fn total_tokens(&self) -> usize {
        self.lens.iter().sum()
    }
}

/// The chunk plan over the prefill rows of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkedContext {
    pub workspace_tokens: usize,
    /// Context positions per row per chunk.
    pub chunk_size_tokens: usize,
    pub chunks: Vec<ContextChunk>,
}

/// Why a chunk plan cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error(
        "workspace of {workspace_tokens} tokens cannot give each of the {rows} prefill rows \
         with context one page of {page_size} tokens"
    )]
    WorkspaceTooSmall {
        workspace_tokens: usize,
        rows: usize,
        page_size: usize,
    },
}

/// The chunk size and the number of chunks [`plan_context_chunks`] plans (`None` when
/// no row has context): what a caller can compare before planning every chunk.
pub fn chunk_size(
    ctx_lens: &[usize],
    workspace_tokens: usize,
    page_size: usize,
) -> Result<Option<(usize, usize)>, ChunkError> {
    let rows_with_ctx = ctx_lens.iter().filter(|&&c| c > 0).count();
    let Some(&max_ctx) = ctx_lens.iter().max().filter(|&&m| m > 0) else {
        return Ok(None);
    };
    let chunk = (workspace_tokens / rows_with_ctx) / page_size * page_size;
    if chunk == 0 {
        return Err(ChunkError::WorkspaceTooSmall {
            workspace_tokens,
            rows: rows_with_ctx,
            page_size,
        });
    }
    Ok(Some((chunk, max_ctx.div_ceil(chunk))))
}

/// Plans the chunks for prefill rows whose context lengths are `ctx_lens`
/// (`seq_len - q_len` each). Returns `None` when no row has context.
pub fn plan_context_chunks(
    ctx_lens: &[usize],
    workspace_tokens: usize,
    page_size: usize,
) -> Result<Option<ChunkedContext>, ChunkError> {
    let Some((chunk, num_chunks)) = chunk_size(ctx_lens, workspace_tokens, page_size)? else {
        return Ok(None);
    };
    let chunks = (0..num_chunks)
        .map(|i| {
            let start = i * chunk;
            ContextChunk {
                starts: ctx_lens.iter().map(|_| start).collect(),
                lens: ctx_lens
                    .iter()
                    .map(|&c| c.saturating_sub(start).min(chunk))
                    .collect(),
            }
        })
        .collect();
    Ok(Some(ChunkedContext {
        workspace_tokens,
        chunk_size_tokens: chunk,
        chunks,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_context_within_workspace() {
        let c = plan_context_chunks(&[100, 0, 300], 256, 16)
            .unwrap()
            .unwrap();
        assert_eq!(c.chunk_size_tokens, 128);
        assert_eq!(c.chunks.len(), 3);
        assert_eq!(c.chunks[0].lens, vec![100, 0, 128]);
        assert_eq!(c.chunks[2].lens, vec![0, 0, 44]);
        assert!(c.chunks.iter().all(|ch| ch.total_tokens() <= 256));
        assert_eq!(plan_context_chunks(&[0, 0], 256, 16), Ok(None));
        assert!(plan_context_chunks(&[5, 5, 5], 32, 16).is_err());
    }
}
