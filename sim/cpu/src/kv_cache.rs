//! The paged latent KV cache of the CPU backend: one `kv_lora_rank + qk_rope_head_dim`
//! row per slot per layer. Slots start as NaN so a read of anything never written shows
//! up as NaN logits instead of passing silently.

use specmla_core::block_pool::{slot_for, PAD_SLOT};

/// A paged cache of latent rows, `[layers][slots][dim]`.
#[derive(Clone, Debug)]
pub struct PagedLatentCache {
    num_layers: usize,
    num_slots: usize,
    dim: usize,
    data: Vec<f32>,
}

impl PagedLatentCache {
    /// A cache of `num_blocks * page_size` slots per layer, poisoned with NaN.
    pub fn new(num_layers: usize, num_blocks: usize, page_size: usize, dim: usize) -> Self {
        let num_slots = num_blocks * page_size;
        Self {
            num_layers,
            num_slots,
            dim,
            data: vec![f32::NAN; num_layers * num_slots * dim],
        }
    }

    fn offset(&self, layer: usize, slot: usize) -> usize {
        assert!(
            layer < self.num_layers && slot < self.num_slots,
            "slot {slot} out of range"
        );
        (layer * self.num_slots + slot) * self.dim
    }

    /// Writes one row; PAD slots are skipped (the kernel's "do not write").
    pub fn write(&mut self, layer: usize, slot: i64, row: &[f32]) {
        if slot == PAD_SLOT {
            return;
        }
        let o = self.offset(layer, slot as usize);
        self.data[o..o + self.dim].copy_from_slice(row);
    }

    /// Reads one row.
    pub fn read(&self, layer: usize, slot: usize) -> &[f32] {
        let o = self.offset(layer, slot);
        &self.data[o..o + self.dim]
    }

    /// Gathers positions `[from, to)` of a request into a contiguous buffer through its
    /// block-table row (the workspace gather of a context chunk). A position with no
    /// backing slot gathers NaN.
    pub fn gather(
        &self,
        layer: usize,
        block_row: &[u32],
        page_size: usize,
        from: usize,
        to: usize,
    ) -> Vec<f32> {
        let mut out = Vec::with_capacity(to.saturating_sub(from) * self.dim);
        for pos in from..to {
            match slot_for(block_row, pos, page_size, usize::MAX) {
                PAD_SLOT => out.extend(std::iter::repeat_n(f32::NAN, self.dim)),
                s => out.extend_from_slice(self.read(layer, s as usize)),
            }
        }
        out
    }
}
