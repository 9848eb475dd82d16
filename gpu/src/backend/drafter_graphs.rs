//! The multi-step drafter's passes on CUDA graphs. A pass's kernels depend on its shape
//! alone (tokens, sampled rows, table width; `drafter::DraftShape`), and every per-pass
//! value is uploaded into one persistent workspace first, so a graph captured for a
//! shape replays any later pass of that shape: the same kernels at the same launch
//! parameters as eager, hence the same bits. Shapes are captured as they are first met
//! (a steady decode batch meets two: the first pass over all verify tokens and the
//! single-token passes after it), at most `MAX_DRAFT_GRAPHS` of them; a pass larger than
//! the workspace, or past that many shapes, runs eager.

use specmla_core::backend::DrafterOutput;
use specmla_core::drafter::DrafterPass;

use super::drafter::DraftShape;
use super::timing::TimedGraph;
use super::{GpuBackend, Result};
use crate::workspace::Workspace;

/// The most drafter shapes captured.
const MAX_DRAFT_GRAPHS: usize = 16;

impl GpuBackend {
    /// The drafter workspace's (tokens, rows, width): every row's verify tokens.
    fn draft_ws_dims(&self) -> (usize, usize, usize) {
        let s = &self.cfg.scheduler;
        let q = 1 + self.cfg.spec.k();
        (s.max_num_seqs * q, s.max_num_seqs, s.max_blocks_per_seq())
    }

    /// Whether `pass` runs on a drafter graph: graphs on, the pass inside the
    /// workspace, and its shape captured or room to capture it.
    pub(super) fn drafter_graph_fits(&self, pass: &DrafterPass) -> bool {
        let (cap, rows, width) = self.draft_ws_dims();
        let shape = DraftShape {
            tokens: pass.token_ids.len(),
            rows: pass.num_rows(),
            width: pass.block_table_width,
        };
        self.cfg.cuda_graphs
            && shape.tokens <= cap
            && shape.rows <= rows
            && shape.width == width
            && shape.tokens > 0
            && (self.draft_graphs.len() < MAX_DRAFT_GRAPHS
                || self.draft_graphs.iter().any(|(s, _)| *s == shape))
    }

    /// One pass eager: inputs, kernels, result.
    pub(super) fn drafter_eager(
        &self,
        ws: &mut Workspace,
        pass: &DrafterPass,
        sources: &[i32],
    ) -> Result<DrafterOutput> {
        let shape = self.drafter_inputs(ws, pass, sources)?;
        self.drafter_kernels(ws, shape)?;
        self.drafter_result(ws, shape.rows)
    }

    /// One pass on its shape's graph, captured first if this shape is new.
    pub(super) fn drafter_on_graph(
        &mut self,
        pass: &DrafterPass,
        sources: &[i32],
    ) -> Result<DrafterOutput> {
        if self.draft_ws.is_none() {
            let dims = self.draft_ws_dims();
            self.draft_ws = Some(self.new_workspace(dims)?);
        }
        let mut ws = self.draft_ws.take().expect("allocated above");
        let res = self.drafter_graph_body(&mut ws, pass, sources);
        self.draft_ws = Some(ws);
        res
    }

    fn drafter_graph_body(
        &mut self,
        ws: &mut Workspace,
        pass: &DrafterPass,
        sources: &[i32],
    ) -> Result<DrafterOutput> {
        let shape = self.drafter_inputs(ws, pass, sources)?;
        if !self.draft_graphs.iter().any(|(s, _)| *s == shape) {
            let graph = self.capture_drafter(ws, shape)?;
            self.draft_graphs.push((shape, graph));
        }
        let (_, graph) = self
            .draft_graphs
            .iter()
            .find(|(s, _)| *s == shape)
            .expect("captured above");
        self.launch_graph(graph, "launching a drafter graph")?;
        self.drafter_result(ws, shape.rows)
    }

    /// Captures the kernels of a pass of `shape` over `ws` (nothing runs).
    fn capture_drafter(&self, ws: &Workspace, shape: DraftShape) -> Result<TimedGraph> {
        let what = format!("the drafter pass {shape:?}");
        self.capture_graph(&what, || self.drafter_kernels(ws, shape))
    }
}
