//! The device carries: the last target forward's hidden states and the last drafter
//! pass's stay on the device, where the next drafter pass gathers its inputs from; the
//! host reads only their row digests. `core::backend::Carries` hands out the forward ids
//! that say which output a carry holds, so a pass given any other output is refused.

use specmla_core::backend::Carries;
use specmla_core::drafter::HiddenSource;

use super::{GpuBackend, GpuBackendError, Result};
use crate::device::GpuDevice;
use crate::launch::{Buf, DPtr};
use crate::workspace::Workspace;

/// The carried hidden states, `[rows, hidden]` each, allocated once at their largest
/// (a step's every token; every drafter row's K samples), so their addresses never
/// change: captured drafter graphs read and write them in place.
pub(super) struct DeviceCarry {
    pub ids: Carries,
    target: Buf<f32>,
    target_cap: usize,
    pub target_rows: usize,
    drafter: Buf<f32>,
    drafter_cap: usize,
    pub drafter_rows: usize,
}

impl DeviceCarry {
    /// Room for `(target_rows, drafter_rows)` rows of `hid` values.
    pub fn new(
        dev: &GpuDevice,
        (target_cap, drafter_cap): (usize, usize),
        hid: usize,
    ) -> Result<Self> {
        Ok(Self {
            ids: Carries::default(),
            target: Buf::uninit(dev, target_cap * hid, "carried target hidden states")?,
            target_cap,
            target_rows: 0,
            drafter: Buf::uninit(dev, drafter_cap * hid, "carried drafter hidden states")?,
            drafter_cap,
            drafter_rows: 0,
        })
    }

    /// The rows each carry holds at most for `cfg`: a step's tokens, and every row's K
    /// samples (a DFlash pass returns K per row).
    pub fn capacity(cfg: &specmla_core::config::EngineConfig) -> (usize, usize) {
        let s = &cfg.scheduler;
        (
            s.max_num_batched_tokens,
            s.max_num_seqs * cfg.spec.k().max(1),
        )
    }

    /// Refuses a forward of `target` tokens or a pass of `drafter` rows past the room.
    pub fn check(&self, target: usize, drafter: usize) -> Result<()> {
        if target > self.target_cap || drafter > self.drafter_cap {
            return Err(GpuBackendError::BadPlan(format!(
                "{target} tokens / {drafter} drafter rows past the carries' {} / {}",
                self.target_cap, self.drafter_cap
            )));
        }
        Ok(())
    }

    pub fn target_ptr(&self) -> DPtr<f32> {
        self.target.ptr()
    }

    pub fn drafter_ptr(&self) -> DPtr<f32> {
        self.drafter.ptr()
    }
}

impl GpuBackend {
    /// The gather indices of a pass's hidden sources over the two carries (`>= 0`: a
    /// target token, `< 0`: `-1 -` a previous-pass row), each checked against the rows
    /// carried.
    pub(super) fn carried_rows(&self, sources: &[HiddenSource], prev: bool) -> Result<Vec<i32>> {
        let c = &self.carry;
        sources
            .iter()
            .map(|&s| match s {
                HiddenSource::TargetToken(i) if (i as usize) < c.target_rows => Ok(i as i32),
                HiddenSource::DrafterRow(r) if prev && (r as usize) < c.drafter_rows => {
                    Ok(-1 - r as i32)
                }
                s => Err(GpuBackendError::BadPlan(format!(
                    "hidden source {s:?} outside the carries ({} target rows, {} drafter \
                     rows, previous pass: {prev})",
                    c.target_rows, c.drafter_rows
                ))),
            })
            .collect()
    }

    /// Uploads the carried rows `idx` (from [`Self::carried_rows`]) into `ws.src_idx`.
    pub(super) fn upload_carried(&self, ws: &mut Workspace, idx: &[i32]) -> Result<()> {
        ws.src_idx.write(&self.dev, idx)?;
        Ok(())
    }

    /// Gathers the `n` carried rows [`Self::upload_carried`] named into `out`.
    pub(super) fn gather_carried(&self, ws: &Workspace, n: usize, out: DPtr<f32>) -> Result<()> {
        let hid = self.dims.hidden_size;
        let srcs = (self.carry.target_ptr(), self.carry.drafter_ptr());
        // SAFETY: ws.src_idx is written only by upload_carried, whose indices passed
        // carried_rows against the rows each carry holds.
        unsafe {
            self.k
                .gather_rows2(self.dev(), srcs, ws.src_idx.ptr(), out, (n, hid))
        }?;
        Ok(())
    }
}
