//! Where a step's time goes on the device: CUDA events around each attention launch,
//! each GEMM and each graph replay, and around every forward as a whole, read once the
//! forward's outputs are on the host. Graphs are captured outside any forward, so no
//! event lands inside one (a captured graph's time is its replay's); the engine's
//! check-only forwards are not timed. The cost: two event records per timed region, a few
//! microseconds of host time each, on eager forwards only (a graph replay takes two).

use std::sync::Mutex;
use std::time::Instant;

use cudarc::driver::CudaEvent;
use specmla_core::backend::StepTime;

use super::{GpuBackend, Result};
use crate::device::GpuError;

/// What a timed region runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Region {
    Attention,
    Gemm,
    Graph,
}

/// The events of the forward in flight and the times of the step so far.
#[derive(Default)]
pub(super) struct Timeline {
    /// Events for reuse; `used` of them recorded in the current forward.
    pool: Vec<CudaEvent>,
    used: usize,
    /// Each timed region's kind and its start event (the end is the next one).
    regions: Vec<(Region, usize)>,
    /// Set between begin_forward and end_forward of a timed forward.
    host_start: Option<Instant>,
    /// Set during the engine's check-only forwards, which are not timed.
    checks: bool,
    /// Set while a graph is being captured: no event may be recorded into it.
    capturing: bool,
    step: StepTime,
}

fn elapsed_us(a: &CudaEvent, b: &CudaEvent) -> Result<f64> {
    let ms = a
        .elapsed_ms(b)
        .map_err(GpuError::driver("reading a step-timing event"))?;
    Ok(ms as f64 * 1e3)
}

impl GpuBackend {
    fn timeline(&self) -> std::sync::MutexGuard<'_, Timeline> {
        self.timeline.lock().expect("no panic while timing")
    }

    /// Records the next event of the current forward on the stream; its index.
    fn mark(&self, t: &mut Timeline) -> Result<usize> {
        if t.used == t.pool.len() {
            let ev = self
                .dev
                .ctx
                // Timing on: cudarc's default event disables it.
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(GpuError::driver("creating a step-timing event"))?;
            t.pool.push(ev);
        }
        t.pool[t.used]
            .record(&self.dev.stream)
            .map_err(GpuError::driver("recording a step-timing event"))?;
        t.used += 1;
        Ok(t.used - 1)
    }

    /// Runs `f` as a timed region of kind `r` (untimed outside a timed forward).
    pub(super) fn timed<T>(&self, r: Region, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = {
            let mut t = self.timeline();
            match t.host_start.is_some() && !t.capturing {
                true => Some(self.mark(&mut t)?),
                false => None,
            }
        };
        let out = f()?;
        if let Some(i) = start {
            let mut t = self.timeline();
            self.mark(&mut t)?;
            t.regions.push((r, i));
        }
        Ok(out)
    }

    /// Starts timing a forward (nothing during check-only forwards).
    pub(super) fn begin_forward(&self) -> Result<()> {
        let mut t = self.timeline();
        if t.checks {
            return Ok(());
        }
        t.host_start = Some(Instant::now());
        t.used = 0;
        t.regions.clear();
        self.mark(&mut t)?;
        Ok(())
    }

    /// Ends the forward begun by [`Self::begin_forward`] once its outputs are on the
    /// host: adds its wall time, device span and regions to the step's.
    pub(super) fn end_forward(&self) -> Result<()> {
        let mut t = self.timeline();
        let Some(host_start) = t.host_start.take() else {
            return Ok(());
        };
        let last = self.mark(&mut t)?;
        t.pool[last]
            .synchronize()
            .map_err(GpuError::driver("waiting for a step-timing event"))?;
        let mut f = StepTime {
            wall_us: host_start.elapsed().as_secs_f64() * 1e6,
            device_us: elapsed_us(&t.pool[0], &t.pool[last])?,
            ..StepTime::default()
        };
        for &(r, i) in &t.regions {
            let us = elapsed_us(&t.pool[i], &t.pool[i + 1])?;
            match r {
                Region::Attention => f.attention_us += us,
                Region::Gemm => f.gemm_us += us,
                Region::Graph => f.graph_us += us,
            }
        }
        t.step.add(&f);
        Ok(())
    }

    /// Pauses the timed regions while a graph is captured mid-forward.
    pub(super) fn set_capturing(&self, on: bool) {
        self.timeline().capturing = on;
    }

    pub(super) fn set_check_forwards_timing(&self, on: bool) {
        self.timeline().checks = on;
    }

    pub(super) fn take_step_timing(&self) -> StepTime {
        std::mem::take(&mut self.timeline().step)
    }
}

/// A backend's timeline, behind a lock because the forwards time from `&self`.
pub(super) type SharedTimeline = Mutex<Timeline>;
