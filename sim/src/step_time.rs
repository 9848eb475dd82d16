//! Step-time accounting of a run on a backend that times itself (the GPU's): each
//! step's [`StepTime`] filed under its kind, summarized per kind as the median wall time
//! and the shares of wall time in attention, in GEMMs, in replayed graphs, in other
//! device work and on the host. Wall-clock numbers: printed and in `--json`, never in a
//! trace.

use serde::Serialize;
use specmla_core::backend::StepTime;
use specmla_core::plan::StepPlan;

/// What kind of step a plan is, for timing, by what its rows do (not by which kernel
/// path the profile sends them down): `None` for an empty step (no forward ran);
/// "decode-only" when every row decodes or verifies (eager or on a CUDA graph); "mixed"
/// when some row extends its prompt from the start; "with context chunks" when some row
/// extends its prompt after an earlier chunk, so its attention reads cached context.
pub fn step_kind(plan: &StepPlan) -> Option<&'static str> {
    let prompt_rows = || {
        plan.rows
            .iter()
            .filter(|r| r.num_computed_tokens < r.num_prompt_tokens)
    };
    Some(if plan.rows.is_empty() {
        return None;
    } else if prompt_rows().any(|r| r.num_computed_tokens > 0) {
        "with context chunks"
    } else if prompt_rows().next().is_some() {
        "mixed"
    } else if plan.cudagraph.is_some() {
        "decode-only, graph"
    } else {
        "decode-only, eager"
    })
}

/// The timed steps of a run, in step order, with their kinds.
#[derive(Clone, Debug, Default)]
pub struct StepTimes {
    steps: Vec<(&'static str, StepTime)>,
}

/// One kind's summary: how many steps, their median wall time, and the shares of the
/// kind's total wall time (each in [0, 1]; `host` is what no device work covered).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StepKindTime {
    pub kind: &'static str,
    pub steps: usize,
    pub median_wall_us: f64,
    /// The kind's steps' wall time, summed.
    pub total_wall_us: f64,
    /// Means per step of the timed regions.
    pub mean_attention_us: f64,
    pub mean_gemm_us: f64,
    pub mean_graph_us: f64,
    pub attention_share: f64,
    pub gemm_share: f64,
    pub graph_share: f64,
    pub other_device_share: f64,
    pub host_share: f64,
}

impl StepTimes {
    pub fn push(&mut self, kind: &'static str, t: StepTime) {
        self.steps.push((kind, t));
    }

    /// Per kind, in the order kinds first appeared.
    pub fn summary(&self) -> Vec<StepKindTime> {
        let mut kinds: Vec<&'static str> = Vec::new();
        for (k, _) in &self.steps {
            if !kinds.contains(k) {
                kinds.push(k);
            }
        }
        kinds.into_iter().map(|k| self.kind_summary(k)).collect()
    }

    fn kind_summary(&self, kind: &'static str) -> StepKindTime {
        let ts: Vec<&StepTime> = self
            .steps
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, t)| t)
            .collect();
        let mut total = StepTime::default();
        ts.iter().for_each(|t| total.add(t));
        let mut walls: Vec<f64> = ts.iter().map(|t| t.wall_us).collect();
        walls.sort_by(f64::total_cmp);
        let share = |us: f64| match total.wall_us {
            w if w > 0.0 => (us / w).clamp(0.0, 1.0),
            _ => 0.0,
        };
        let regions = total.attention_us + total.gemm_us + total.graph_us;
        let mean = |us: f64| us / ts.len() as f64;
        StepKindTime {
            kind,
            steps: ts.len(),
            median_wall_us: walls[walls.len() / 2],
            total_wall_us: total.wall_us,
            mean_attention_us: mean(total.attention_us),
            mean_gemm_us: mean(total.gemm_us),
            mean_graph_us: mean(total.graph_us),
            attention_share: share(total.attention_us),
            gemm_share: share(total.gemm_us),
            graph_share: share(total.graph_us),
            other_device_share: share((total.device_us - regions).max(0.0)),
            host_share: share((total.wall_us - total.device_us).max(0.0)),
        }
    }
}

/// One line per kind: "decode-only, graph  12 steps  median 1.230 ms  attention 0%
/// (0.000 ms)  GEMMs ...", shares of wall time with the mean per step in parentheses.
pub fn lines(kinds: &[StepKindTime]) -> Vec<String> {
    let ms = |us: f64| us / 1e3;
    kinds
        .iter()
        .map(|k| {
            format!(
                "{:<19} {:>4} steps  median {:>8.3} ms  attention {:>3.0}% ({:.3} ms)  \
                 GEMMs {:>3.0}% ({:.3} ms)  graph {:>3.0}% ({:.3} ms)  other device {:>3.0}%  \
                 host {:>3.0}%",
                k.kind,
                k.steps,
                ms(k.median_wall_us),
                k.attention_share * 100.0,
                ms(k.mean_attention_us),
                k.gemm_share * 100.0,
                ms(k.mean_gemm_us),
                k.graph_share * 100.0,
                ms(k.mean_graph_us),
                k.other_device_share * 100.0,
                k.host_share * 100.0
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(wall: f64, device: f64, attn: f64, gemm: f64, graph: f64) -> StepTime {
        StepTime {
            wall_us: wall,
            device_us: device,
            attention_us: attn,
            gemm_us: gemm,
            graph_us: graph,
        }
    }

    /// Shares are of the kind's total wall time; the host's is what the device span did
    /// not cover; the median is the middle step's wall time.
    #[test]
    fn shares_and_median_per_kind() {
        let mut s = StepTimes::default();
        s.push("mixed", t(100.0, 80.0, 30.0, 40.0, 0.0));
        s.push("decode-only, graph", t(50.0, 45.0, 0.0, 0.0, 44.0));
        s.push("mixed", t(300.0, 200.0, 70.0, 60.0, 0.0));
        s.push("mixed", t(200.0, 120.0, 0.0, 20.0, 0.0));
        let sum = s.summary();
        assert_eq!(sum.len(), 2);
        let m = &sum[0];
        assert_eq!((m.kind, m.steps, m.median_wall_us), ("mixed", 3, 200.0));
        assert!((m.attention_share - 100.0 / 600.0).abs() < 1e-12);
        assert!((m.gemm_share - 120.0 / 600.0).abs() < 1e-12);
        assert!((m.other_device_share - 180.0 / 600.0).abs() < 1e-12);
        assert!((m.host_share - 200.0 / 600.0).abs() < 1e-12);
        assert!((m.mean_gemm_us - 40.0).abs() < 1e-12);
        let g = &sum[1];
        assert!((g.graph_share - 44.0 / 50.0).abs() < 1e-12);
        assert!((g.host_share - 5.0 / 50.0).abs() < 1e-12);
        assert!(lines(&sum)[1].starts_with("decode-only, graph"));
    }
}
