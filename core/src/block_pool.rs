//! The paged KV block pool: free-list allocation, per-request block tables, slot
//! mapping, rollback of rejected tokens. Target and drafter caches share block ids
//! (as in vLLM), so one pool serves both.

use std::collections::VecDeque;

/// `slot_mapping` value meaning "do not write this token".
pub const PAD_SLOT: i64 = -1;

/// Block-table entry past a row's allocation. vLLM leaves 0 there, which aliases a live
/// block; a sentinel turns a read past the allocation into PAD (or NaN) instead.
pub const NO_BLOCK: u32 = u32::MAX;

/// A pool of fixed-size KV blocks with deterministic (FIFO) reuse order.
#[derive(Clone, Debug)]
pub struct BlockPool {
    free: VecDeque<u32>,
    num_blocks: usize,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, all free.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            free: (0..num_blocks as u32).collect(),
            num_blocks,
        }
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks currently free.
    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Grows `table` to hold `num_tokens` tokens. All-or-nothing: on failure the table
    /// is unchanged and `false` is returned, so the caller can preempt and retry.
    pub fn grow_to(&mut self, table: &mut Vec<u32>, num_tokens: usize, page_size: usize) -> bool {
        let need = num_tokens.div_ceil(page_size);
        if need <= table.len() {
            return true;
        }
        let extra = need - table.len();
        if extra > self.free.len() {
            return false;
        }
        table.extend(self.free.drain(..extra));
        true
    }

    /// Shrinks `table` to the blocks needed for `num_tokens` tokens, returning the rest
    /// to the pool (rollback of rejected tokens).
    pub fn shrink_to(&mut self, table: &mut Vec<u32>, num_tokens: usize, page_size: usize) {
        let keep = num_tokens.div_ceil(page_size);
        if keep < table.len() {
            self.free.extend(table.drain(keep..));
        }
    }

    /// Returns every block of `table` to the pool (finish or preemption).
    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.free.extend(table.drain(..));
    }
}

/// The slot of position `pos` in a request whose block table is `block_ids`, or
/// [`PAD_SLOT`] when the position is at or past `max_model_len` or not backed by a block.
pub fn slot_for(block_ids: &[u32], pos: usize, page_size: usize, max_model_len: usize) -> i64 {
    if pos >= max_model_len {
        return PAD_SLOT;
    }
    match block_ids.get(pos / page_size) {
        Some(&b) if b != NO_BLOCK => b as i64 * page_size as i64 + (pos % page_size) as i64,
        _ => PAD_SLOT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_is_all_or_nothing_and_shrink_returns_blocks() {
        let mut pool = BlockPool::new(4);
        let mut a = Vec::new();
        assert!(pool.grow_to(&mut a, 33, 16));
        assert_eq!(a, vec![0, 1, 2]);
        let mut b = Vec::new();
        assert!(!pool.grow_to(&mut b, 40, 16));
        assert!(b.is_empty());
        assert_eq!(pool.num_free_blocks(), 1);
        pool.shrink_to(&mut a, 17, 16);
        assert_eq!(a, vec![0, 1]);
        assert_eq!(pool.num_free_blocks(), 2);
        assert_eq!(slot_for(&a, 17, 16, 64), 17);
        assert_eq!(slot_for(&a, 40, 16, 64), PAD_SLOT);
        assert_eq!(slot_for(&a, 64, 16, 64), PAD_SLOT);
    }
}
