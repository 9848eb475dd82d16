//! CUDA graphs of uniform decode steps: the whole target forward captured per size,
//! replayed after copying the step's inputs into the graph's own workspace.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use specmla_core::backend::TargetOutput;
use specmla_core::cudagraph::GraphShape;
use specmla_core::plan::StepPlan;

use super::timing::TimedGraph;
use super::{CacheOf, CapturedGraph, DecodeLaunch, GpuBackend, GpuBackendError, Result, SplitForm};
use crate::device::GpuError;
use crate::launch::copy;
use crate::workspace::Workspace;

impl GpuBackend {
    pub(super) fn graph_launch(&self, ws: &Workspace, shape: GraphShape) -> DecodeLaunch {
        DecodeLaunch {
            token_start: 0,
            rows: shape.num_rows,
            q_len: shape.query_len,
            block_table: ws.block_table.ptr(),
            width: ws.width,
            seq_lens: ws.seq_lens.ptr(),
            split_lens: ws.split_lens.ptr(),
            num_splits: ws.num_splits.ptr(),
            mapped_kv: ws.mapped_kv.ptr(),
            splits: SplitForm::Cap,
        }
    }

    /// The kernels one graph replays: the whole target forward of `shape.num_tokens`
    /// tokens, logits for every token (padding included).
    pub(super) fn graph_body(&self, ws: &Workspace, shape: GraphShape) -> Result<()> {
        let n = shape.num_tokens;
        let dl = self.graph_launch(ws, shape);
        self.target_layers(ws, n, &|me, l, w, attn| {
            me.decode(w, ws, CacheOf::Target(l), dl, n, attn)
        })?;
        copy(
            self.dev(),
            ws.x.ptr(),
            ws.xs.ptr(),
            n * self.dims.hidden_size,
        )?;
        self.lm_head(ws, &self.target.final_norm, &self.target.lm_head, n)
    }

    pub(super) fn capture(&self, ws: &Workspace, shape: GraphShape) -> Result<CapturedGraph> {
        let what = format!("{shape:?}");
        let graph = self.capture_graph(&what, || self.graph_body(ws, shape))?;
        Ok(CapturedGraph { shape, graph })
    }

    /// Captures what `body` launches into a graph (nothing runs), with the timed regions
    /// paused; the capture ends whatever happened, so the stream stays usable.
    pub(super) fn capture_graph(
        &self,
        what: &str,
        body: impl FnOnce() -> Result<()>,
    ) -> Result<TimedGraph> {
        let stream = &self.dev.stream;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(GpuError::driver("beginning a graph capture"))?;
        self.set_capturing(true);
        let body = body();
        self.set_capturing(false);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        body?;
        let graph = graph
            .map_err(GpuError::driver("instantiating a captured graph"))?
            .ok_or_else(|| {
                GpuBackendError::BadPlan(format!("capture of {what} recorded nothing"))
            })?;
        Ok(self.timed_graph(graph))
    }

    pub(super) fn replay(&mut self, plan: &StepPlan, idx: usize) -> Result<TargetOutput> {
        let mut ws = self
            .graph_ws
            .take()
            .expect("graphs were captured with their workspace");
        let res = self.replay_body(&mut ws, idx, plan);
        self.graph_ws = Some(ws);
        res
    }

    /// Writes the step's inputs into the graph workspace `ws` and replays graph `idx`.
    pub(super) fn replay_body(
        &self,
        ws: &mut Workspace,
        idx: usize,
        plan: &StepPlan,
    ) -> Result<TargetOutput> {
        let g = &self.graphs[idx];
        let s = g.shape;
        let c = &plan.common;
        let d = plan.mla.decode.as_ref();
        self.write_token_inputs(ws, plan, s.num_tokens)?;
        // Rows past the plan's are padding: seq_len 0 and no blocks, so they see no key.
        let width = ws.width;
        let mut table = vec![-1i32; s.num_rows * width];
        let mut seq = vec![0i32; s.num_rows];
        // A row the schedule does not reach takes no split.
        let mut sched = [(); 3].map(|_| vec![0i32; s.num_rows]);
        if let Some(d) = d {
            let n = s.num_rows.min(d.split.len());
            for (buf, v) in sched.iter_mut().zip(self.split_schedule(&d.split, n)?) {
                buf[..n].copy_from_slice(&v);
            }
        }
        for r in 0..s.num_rows.min(c.num_rows()) {
            let row = self.block_ids(c.block_row(r))?;
            table[r * width..r * width + row.len().min(width)]
                .copy_from_slice(&row[..row.len().min(width)]);
            seq[r] = c.seq_lens[r] as i32;
        }
        let dev = Arc::clone(&self.dev);
        ws.block_table.write(&dev, &table)?;
        ws.seq_lens.write(&dev, &seq)?;
        ws.split_lens.write(&dev, &sched[0])?;
        ws.num_splits.write(&dev, &sched[1])?;
        ws.mapped_kv.write(&dev, &sched[2])?;
        self.launch_graph(&g.graph, "launching a captured graph")?;
        let rows: Vec<usize> = plan.logits_indices.iter().map(|&i| i as usize).collect();
        self.read_target(ws, plan.num_tokens(), &rows)
    }
}
