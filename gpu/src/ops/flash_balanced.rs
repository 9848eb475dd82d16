//! The fast mode's balanced decode on the device: core's [`BalancedSchedule`] uploaded as
//! the persistent seesaw kernel reads it (each part's segments for each of its row blocks),
//! the launch, and `flash_combine_slots`, which merges the cut requests' partials after it.
//! The schedule is core's, read as given: nothing here decides a cut.

use cudarc::driver::LaunchConfig;
use specmla_core::balanced::BalancedSchedule;

use super::flash::{FlashBufs, FlashKernels, FlashOut, FlashShape, SplitMerge, WideKernel};
use crate::device::{GpuDevice, GpuError};
use crate::launch::{launch_cfg, Arg, Buf, DPtr};

/// A balanced schedule on the device.
pub struct BalancedWork {
    /// Parts of the schedule: the launch runs one CTA per part and row block.
    pub parts: usize,
    /// `[parts + 1]`: part p's segments are `items[part_items[p]..part_items[p + 1]]`.
    pub part_items: Buf<i32>,
    /// `[segments][4]`: request, first tile, end tile, partial slot (-1: a final row).
    pub items: Buf<i32>,
    /// `[cuts][3]`: request, first slot, splits of each cut request.
    pub cuts: Buf<i32>,
    /// Cut requests: rows of `cuts`.
    pub num_cuts: usize,
    /// Partial slots the schedule writes (`[slots, rows, 512]` of the split partials).
    pub partial_slots: usize,
    /// Requests the schedule was built for: a launch must have exactly these.
    pub requests: usize,
}

impl BalancedWork {
    /// `s` (a one-split shape of the launch's requests) with `max_splits` raised so that a
    /// workspace of it, `[max_splits, batch, rows]` partials, holds `partial_slots` slots.
    pub fn shape(partial_slots: usize, s: FlashShape) -> FlashShape {
        FlashShape {
            max_splits: partial_slots.div_ceil(s.batch.max(1)).max(1),
            ..s
        }
    }

    /// Uploads `s`, whose tiles must be the kernel's 64 keys (anything else is a caller
    /// bug, and panics).
    pub fn upload(dev: &GpuDevice, s: &BalancedSchedule) -> Result<Self, GpuError> {
        let (part_items, items, cuts) = schedule_ints(s);
        // A zero-length buffer cannot be allocated: pad the empty lists (never read).
        let padded = |v: Vec<i32>| if v.is_empty() { vec![0] } else { v };
        Ok(Self {
            parts: s.parts(),
            part_items: Buf::from_host(dev, &part_items, "balanced part items")?,
            num_cuts: cuts.len() / 3,
            items: Buf::from_host(dev, &padded(items), "balanced work items")?,
            cuts: Buf::from_host(dev, &padded(cuts), "balanced cut requests")?,
            partial_slots: s.partial_slots,
            requests: s.num_splits.len(),
        })
    }

    /// Bytes [`Self::with_capacity`] allocates.
    pub fn capacity_bytes(requests: usize, max_splits: usize) -> u64 {
        let (parts, items, cuts) = Self::capacity(requests, max_splits);
        ((parts + items + cuts) * 4) as u64
    }

    /// i32 elements of each buffer of [`Self::with_capacity`].
    fn capacity(requests: usize, max_splits: usize) -> (usize, usize, usize) {
        let pieces = requests.max(1) * max_splits.max(1);
        (MAX_PARTS + 1, pieces * 4, requests.max(1) * 3)
    }

    /// Buffers for schedules of up to `requests` requests of up to `max_splits` pieces
    /// each on up to [`MAX_PARTS`] parts, written by [`Self::rewrite`] (an engine's
    /// workspace holds one, counted with its memory); empty until then.
    pub fn with_capacity(
        dev: &GpuDevice,
        requests: usize,
        max_splits: usize,
    ) -> Result<Self, GpuError> {
        let (parts, items, cuts) = Self::capacity(requests, max_splits);
        Ok(Self {
            parts: 0,
            part_items: Buf::uninit(dev, parts, "balanced part items")?,
            items: Buf::uninit(dev, items, "balanced work items")?,
            cuts: Buf::uninit(dev, cuts, "balanced cut requests")?,
            num_cuts: 0,
            partial_slots: 0,
            requests: 0,
        })
    }

    /// Writes `s` into these buffers, allocating nothing; `false` (nothing written) where
    /// it does not fit them.
    pub fn rewrite(&mut self, dev: &GpuDevice, s: &BalancedSchedule) -> Result<bool, GpuError> {
        let (part_items, items, cuts) = schedule_ints(s);
        let fits = part_items.len() <= self.part_items.len()
            && items.len() <= self.items.len()
            && cuts.len() <= self.cuts.len();
        if !fits {
            return Ok(false);
        }
        self.part_items.write(dev, &part_items)?;
        self.items.write(dev, &items)?;
        self.cuts.write(dev, &cuts)?;
        self.parts = s.parts();
        self.num_cuts = cuts.len() / 3;
        self.partial_slots = s.partial_slots;
        self.requests = s.num_splits.len();
        Ok(true)
    }
}

/// The most parts a schedule written into buffers sized ahead may have
/// ([`BalancedWork::with_capacity`]; a part per multiprocessor at most).
pub const MAX_PARTS: usize = 1024;

/// `s` as the kernel reads it: `[parts + 1]` part starts, `[segments][4]` (request, first
/// tile, end tile, partial slot or -1) and `[cuts][3]` (request, first slot, splits).
/// Tiles must be the kernel's 64 keys (a caller bug otherwise, and panics).
fn schedule_ints(s: &BalancedSchedule) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    assert_eq!(
        s.policy.tile_keys, 64,
        "the balanced kernel runs tiles of 64 keys"
    );
    let int = |x: u32| i32::try_from(x).expect("fits in i32");
    let items: Vec<i32> = s
        .segments
        .iter()
        .flat_map(|g| {
            let slot = s.slot_of(g).map_or(-1, int);
            [int(g.request), int(g.tile_begin), int(g.tile_end), slot]
        })
        .collect();
    let cuts: Vec<i32> = s
        .cut_requests()
        .iter()
        .flat_map(|&(r, f, n)| [r, f, n].map(int))
        .collect();
    let part_items = s.part_starts.iter().map(|&x| int(x)).collect();
    (part_items, items, cuts)
}

impl FlashKernels {
    /// The decode of `s` on a balanced schedule (`work`, from core's
    /// [`BalancedSchedule`] of the requests' seq_lens): the persistent seesaw kernel, a CTA
    /// per part and 64-row block, each running its part's segments; a cut request's pieces
    /// write f32 partials to `b.o_part` / `b.lse_part` (`[slots, rows, ...]`), merged in
    /// split order by `flash_combine_slots`. Needs the seesaw family (sm_90a) and pages the
    /// copy engine takes. The split schedule in `b` is not read, but `s` is checked as for
    /// any launch: make it with [`BalancedWork::shape`], whose `max_splits` sizes a
    /// [`super::FlashWorkspace`]'s partials for the slots.
    ///
    /// # Safety
    /// As [`FlashKernels::flash_decode`]; `work` covers every request's keys below its
    /// seq_len (a schedule core built for these seq_lens does).
    pub unsafe fn flash_decode_balanced(
        &self,
        dev: &GpuDevice,
        s: FlashShape,
        b: FlashBufs,
        work: &BalancedWork,
        scale: f32,
    ) -> Result<(), GpuError> {
        assert!(
            self.wide == WideKernel::Seesaw,
            "the balanced schedule runs on the seesaw kernel (sm_90a)"
        );
        assert_eq!(
            self.decode_function(s.query_rows(), s.page, WideKernel::Seesaw),
            WideKernel::Seesaw.function(),
            "page {} is not one the copy engine takes",
            s.page
        );
        assert!(
            work.parts * s.query_rows().div_ceil(super::FLASH_ROWS) <= dev.sms,
            "a balanced launch's CTAs must all be resident"
        );
        assert_eq!(
            work.requests, s.batch,
            "a balanced schedule for {} requests, launched on {}",
            work.requests, s.batch
        );
        // SAFETY: the caller's promise, forwarded.
        unsafe {
            self.decode_on(
                (WideKernel::Seesaw, SplitMerge::Cluster),
                dev,
                s,
                b,
                scale,
                Some(work),
            )
        }
    }

    /// `flash_combine_slots` over `work`'s cut requests (none: nothing launched).
    ///
    /// # Safety
    /// The partials of every cut request are written (the balanced decode just ran).
    pub(super) unsafe fn combine_slots(
        &self,
        dev: &GpuDevice,
        s: FlashShape,
        (o_part, lse_part): (DPtr<f32>, DPtr<f32>),
        out: FlashOut,
        lse: DPtr<f32>,
        work: &BalancedWork,
    ) -> Result<(), GpuError> {
        if work.num_cuts == 0 {
            return Ok(());
        }
        let rows = s.query_rows();
        let args: [Arg; 8] = [
            o_part.into(),
            lse_part.into(),
            work.cuts.ptr().into(),
            out.into(),
            lse.into(),
            s.batch.into(),
            rows.into(),
            s.heads.into(),
        ];
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, work.num_cuts as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let name = "flash_combine_slots";
        // SAFETY: argument list matches the kernel; the decode checked the partials' and
        // outputs' sizes; every cut names a request below the batch and slots below
        // `partial_slots` (core's schedule).
        unsafe { launch_cfg(dev, &self.fns[name], name, cfg, &args) }
    }
}
