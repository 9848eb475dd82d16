//! The SM clock behind `gpu-bench`'s times: the probe kernel's reading right after each
//! shape's timed rounds, kept with that shape's rows, and a warning where the device ran
//! throttled. Healthy H100s read 94-104% of their reported maximum after a shape (runs
//! 229-233; above the maximum right after a batch, unexplained, 99.8% idle); one in
//! thermal slowdown ran at 17-49% (BENCHMARKS, twentieth section), with times up to 4.6x
//! a healthy machine's. Times from such a run compare with nothing, so the clock goes into
//! the CSV and a low one is said out loud. A probe that fails costs its reading, not the
//! run.

use specmla_gpu::device::GpuDevice;
use specmla_gpu::ops::Kernels;

use crate::bench::Measurement;
use crate::checks::CaseResult;

/// Cycles the probe spins for: about 2 ms between two ticks of the global timer (the
/// kernel's comment says why).
pub const PROBE_SPIN_CYCLES: u32 = 4_000_000;

/// Below this share of the device's maximum clock a batch counts as throttled. Under its
/// power cap alone the H100 read 94-104% by this probe (runs 229-233), and nvidia-smi's
/// 20-ms samples dipped to 81% (run 229); thermal slowdown went far lower.
pub const THROTTLED_SHARE: f64 = 0.75;

/// Whether a batch at `mhz` ran throttled on a device whose maximum is `max_mhz` (never
/// where the maximum is unknown, 0).
pub fn throttled(mhz: f64, max_mhz: f64) -> bool {
    mhz < THROTTLED_SHARE * max_mhz
}

/// The warning for a batch that ran at `mhz` on a device whose maximum is `max_mhz`, or
/// `None` when it was not [`throttled`].
pub fn throttle_warning(mhz: f64, max_mhz: f64, what: &str) -> Option<String> {
    throttled(mhz, max_mhz).then(|| {
        format!(
            "warning: the SM clock was {mhz:.0} MHz after {what}, {:.0}% of the device's \
             {max_mhz:.0} MHz: the GPU is throttled (thermal or power), and times from this \
             run are not comparable with another's",
            100.0 * mhz / max_mhz
        )
    })
}

/// The clock readings of one `gpu-bench` run.
pub struct ClockWatch {
    max_mhz: f64,
    /// The lowest reading so far and what it followed.
    lowest: Option<(f64, String)>,
}

impl ClockWatch {
    /// No readings yet, against `dev`'s reported maximum clock.
    pub fn new(dev: &GpuDevice) -> Self {
        Self {
            max_mhz: f64::from(dev.boost_clock_mhz),
            lowest: None,
        }
    }

    /// Reads the clock now (after `what`), stamps it on `rows`, warns on stderr where it is
    /// throttled, and returns it. A failed reading is a warning and `None`: the rows keep
    /// an empty clock, and the run goes on.
    pub fn stamp(
        &mut self,
        dev: &GpuDevice,
        k: &Kernels,
        what: &str,
        rows: &mut [Measurement],
    ) -> Option<f64> {
        let mhz = match k.sm_clock_mhz(dev, PROBE_SPIN_CYCLES) {
            Ok(mhz) => mhz,
            Err(e) => {
                eprintln!("warning: the SM clock after {what} was not read: {e}");
                return None;
            }
        };
        for r in rows.iter_mut() {
            r.sm_mhz = Some(mhz);
        }
        if let Some(w) = throttle_warning(mhz, self.max_mhz, what) {
            eprintln!("{w}");
        }
        if self.lowest.as_ref().is_none_or(|(m, _)| mhz < *m) {
            self.lowest = Some((mhz, what.to_string()));
        }
        Some(mhz)
    }

    /// One line on the run's clock: its lowest reading against the maximum.
    pub fn summary(&self) -> String {
        match &self.lowest {
            None => "SM clock: not read".into(),
            Some((mhz, what)) => format!(
                "SM clock: lowest {mhz:.0} MHz ({:.0}% of the device's {:.0} MHz), after {what}{}",
                100.0 * mhz / self.max_mhz.max(1.0),
                self.max_mhz,
                if throttled(*mhz, self.max_mhz) {
                    ": THROTTLED"
                } else {
                    ""
                }
            ),
        }
    }
}

/// `gpu-test`'s check of the probe: two readings (spins of 2 and 8 M cycles) must lie
/// between 50 MHz and 5% over the device's maximum (no upper bound where it reports none)
/// and within 10% of each other (the clock may move between them, not by more on an idle
/// device). A unit slip (kHz for MHz, a timer read in the wrong order) lands far outside;
/// a probe that fails is a failed case, not an aborted run.
pub fn check_sm_clock(dev: &GpuDevice, k: &Kernels) -> CaseResult {
    let failed = |case: String| CaseResult {
        kernel: "sm_clock",
        case,
        max_rel_err: f64::INFINITY,
        passed: false,
    };
    let read = |spin_cycles| k.sm_clock_mhz(dev, spin_cycles);
    let (short, long) = match (read(PROBE_SPIN_CYCLES / 2), read(PROBE_SPIN_CYCLES * 2)) {
        (Ok(short), Ok(long)) => (short, long),
        (Err(e), _) | (_, Err(e)) => return failed(e.to_string()),
    };
    let max = f64::from(dev.boost_clock_mhz);
    let top = if max > 0.0 { 1.05 * max } else { f64::INFINITY };
    let plausible = |m: f64| (50.0..=top).contains(&m);
    let spread = (short - long).abs() / long.max(1.0);
    CaseResult {
        kernel: "sm_clock",
        case: format!("{short:.0} and {long:.0} MHz, maximum {max:.0} MHz"),
        max_rel_err: spread,
        passed: plausible(short) && plausible(long) && spread <= 0.10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The readings of our calls: a power cap (1835-1848 of 1980 MHz, run 227) is no
    /// warning; the thermal slowdown of run 228 (345-970 MHz) is.
    #[test]
    fn power_cap_passes_and_thermal_slowdown_warns() {
        for mhz in [1835.0, 1848.0, 1980.0, 1500.0] {
            assert_eq!(throttle_warning(mhz, 1980.0, "x"), None, "{mhz}");
        }
        for mhz in [345.0, 970.0, 1480.0] {
            let w = throttle_warning(mhz, 1980.0, "H 128 q 4 B 64 L 4096").expect("throttled");
            assert!(w.contains("after H 128 q 4 B 64 L 4096"), "{w}");
            assert!(w.starts_with("warning: the SM clock was"), "{w}");
        }
    }
}
