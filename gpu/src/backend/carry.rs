//! The device carries: the last target forward's hidden states and the last drafter
//! pass's stay on the device, where the next drafter pass gathers its inputs from; the
//! host reads only their row digests. `core::backend::Carries` hands out the forward ids
//! that say which output a carry holds, so a pass given any other output is refused.

use specmla_core::backend::Carries;
use specmla_core::drafter::HiddenSource;

use super::{GpuBackend, GpuBackendError, Result};
use crate::device::GpuDevice;
use crate::launch::{copy, Buf, DPtr};
use crate::workspace::Workspace;

/// The carried hidden states, `[rows, hidden]` each, grown on demand.
pub(super) struct DeviceCarry {
    pub ids: Carries,
    target: Option<Buf<f32>>,
    pub target_rows: usize,
    drafter: Option<Buf<f32>>,
    pub drafter_rows: usize,
}

impl DeviceCarry {
    pub fn new() -> Self {
        Self {
            ids: Carries::default(),
            target: None,
            target_rows: 0,
            drafter: None,
            drafter_rows: 0,
        }
    }

    /// Room for `rows` target rows (the old rows are about to be replaced).
    pub fn ensure_target(&mut self, dev: &GpuDevice, rows: usize, hid: usize) -> Result<()> {
        if self.target.as_ref().is_none_or(|b| b.len() < rows * hid) {
            self.target = None;
            let cap = rows.max(64) * hid;
            self.target = Some(Buf::uninit(dev, cap, "carried target hidden states")?);
        }
        Ok(())
    }

    /// Room for `rows` drafter rows, keeping the rows carried now (the pass about to run
    /// reads them).
    pub fn ensure_drafter(&mut self, dev: &GpuDevice, rows: usize, hid: usize) -> Result<()> {
        if self.drafter.as_ref().is_none_or(|b| b.len() < rows * hid) {
            let grown = Buf::uninit(dev, rows.max(64) * hid, "carried drafter hidden states")?;
            if let Some(old) = &self.drafter {
                copy(dev, old.ptr(), grown.ptr(), self.drafter_rows * hid)?;
            }
            self.drafter = Some(grown);
        }
        Ok(())
    }

    pub fn target_ptr(&self) -> DPtr<f32> {
        self.target
            .as_ref()
            .expect("ensured before the forward")
            .ptr()
    }

    pub fn drafter_ptr(&self) -> DPtr<f32> {
        // Before the first drafter pass there is nothing to read: the target's buffer
        // stands in (no index can select it, see `carried_rows`).
        self.drafter
            .as_ref()
            .map_or_else(|| self.target_ptr(), Buf::ptr)
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

    /// Gathers the carried rows `idx` (from [`Self::carried_rows`]) into `out`, through
    /// `ws.logits_idx`.
    pub(super) fn gather_carried(
        &self,
        ws: &mut Workspace,
        idx: &[i32],
        out: DPtr<f32>,
    ) -> Result<()> {
        ws.logits_idx.write(&self.dev, idx)?;
        let hid = self.dims.hidden_size;
        let srcs = (self.carry.target_ptr(), self.carry.drafter_ptr());
        // SAFETY: every index passed carried_rows against the rows each carry holds.
        unsafe {
            self.k
                .gather_rows2(self.dev(), srcs, ws.logits_idx.ptr(), out, (idx.len(), hid))
        }?;
        Ok(())
    }

    /// Row digests of `rows` rows of width `width` at `src` (`groups` groups,
    /// `group_stride` apart), through `ws.digests`, read back.
    pub(super) fn read_digests(
        &self,
        ws: &Workspace,
        src: DPtr<f32>,
        (groups, rows, width): (usize, usize, usize),
        group_stride: usize,
    ) -> Result<Vec<u64>> {
        let out = ws.digests.ptr();
        self.k
            .row_digest(self.dev(), src, out, (groups, rows, width), group_stride)?;
        Ok(ws.digests.read(self.dev(), groups * rows)?)
    }
}
