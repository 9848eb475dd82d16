//! Where a step's time goes on the device: CUDA events around each attention launch,
//! each GEMM and each graph replay, and around every forward as a whole, read once the
//! forward's outputs are on the host. Inside a graph, each attention launch is bracketed
//! by two event-record nodes captured with it (`CU_EVENT_RECORD_EXTERNAL`), so a replay
//! reports its attention too: that time moves from the graph's share to attention's.
//! The engine's check-only forwards are not timed. The cost: two event records per timed
//! region, a few microseconds of host time each, on eager forwards; two per graph replay
//! and two event nodes per attention launch inside a graph.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::sys::{CUevent_flags, CUevent_record_flags};
use cudarc::driver::{CudaEvent, CudaGraph};
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
    /// Set while a graph is being captured: only attention's event nodes go into it.
    capturing: bool,
    /// The attention event nodes of the graph being captured.
    capture_marks: Vec<(CudaEvent, CudaEvent)>,
    /// The event nodes of the graphs replayed in the current forward.
    replayed: Vec<GraphMarks>,
    step: StepTime,
}

/// The event-record nodes around a graph's attention launches, start and end.
type GraphMarks = Arc<Vec<(CudaEvent, CudaEvent)>>;

/// A captured graph and the event nodes around its attention launches.
pub(super) struct TimedGraph {
    graph: CudaGraph,
    marks: GraphMarks,
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

    /// A new event with timing on (cudarc's default event disables it).
    fn timing_event(&self) -> Result<CudaEvent> {
        let ev = self
            .dev
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        Ok(ev.map_err(GpuError::driver("creating a step-timing event"))?)
    }

    /// Records `ev` into the graph being captured as an event-record node.
    fn record_node(&self, ev: &CudaEvent) -> Result<()> {
        let flags = CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
        // SAFETY: a live event of this context, recorded on the backend's own stream,
        // which is capturing: the call adds a node to the capture and runs nothing.
        let r = unsafe {
            cudarc::driver::sys::cuEventRecordWithFlags(
                ev.cu_event(),
                self.dev.stream.cu_stream(),
                flags,
            )
        };
        Ok(r.result()
            .map_err(GpuError::driver("capturing an attention event node"))?)
    }

    /// Runs `f` as a timed region of kind `r` (untimed outside a timed forward); while a
    /// graph is captured, an attention region gets event nodes in the graph instead.
    pub(super) fn timed<T>(&self, r: Region, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if r == Region::Attention && self.timeline().capturing {
            let (a, b) = (self.timing_event()?, self.timing_event()?);
            self.record_node(&a)?;
            let out = f()?;
            self.record_node(&b)?;
            self.timeline().capture_marks.push((a, b));
            return Ok(out);
        }
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
        t.replayed.clear();
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
        for (a, b) in t.replayed.iter().flat_map(|m| m.iter()) {
            let us = elapsed_us(a, b)?;
            f.attention_us += us;
            f.graph_us -= us;
        }
        f.graph_us = f.graph_us.max(0.0);
        t.replayed.clear();
        t.step.add(&f);
        Ok(())
    }

    /// Pauses the timed regions while a graph is captured mid-forward (attention's
    /// event nodes are gathered instead, for [`Self::timed_graph`]).
    pub(super) fn set_capturing(&self, on: bool) {
        let mut t = self.timeline();
        t.capturing = on;
        if on {
            t.capture_marks.clear();
        }
    }

    /// `graph` with the attention event nodes captured into it.
    pub(super) fn timed_graph(&self, graph: CudaGraph) -> TimedGraph {
        let marks = std::mem::take(&mut self.timeline().capture_marks);
        TimedGraph {
            graph,
            marks: Arc::new(marks),
        }
    }

    /// Replays `g` as a timed graph region; its attention nodes are read with the
    /// forward's other events.
    pub(super) fn launch_graph(&self, g: &TimedGraph, what: &'static str) -> Result<()> {
        self.timed(Region::Graph, || {
            g.graph.launch().map_err(GpuError::driver(what))?;
            Ok(())
        })?;
        let mut t = self.timeline();
        if t.host_start.is_some() {
            t.replayed.push(Arc::clone(&g.marks));
        }
        Ok(())
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
