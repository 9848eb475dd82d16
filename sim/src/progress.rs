//! Progress on stderr for long runs, and Ctrl-C. On a terminal: a bar with a total and an
//! estimate. Otherwise: one line every few seconds (`SPECMLA_PROGRESS_SECS`, default 5),
//! so a run in CI or under `nohup` is never silent. Progress reads the wall clock, so it
//! stays out of everything recorded.
//!
//! Ctrl-C sets a flag ([`interrupted`]) that the run loops check between steps: `sim`
//! and `replay` then stop, print what they have so far, and close the trace with its
//! footer, so the file is a valid prefix of the run.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler (once per process; later calls are no-ops). The first
/// Ctrl-C asks the run to stop after its current step; a second one ends the process.
pub fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
    });
}

/// Whether Ctrl-C asked the run to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// The longest interval between progress lines `SPECMLA_PROGRESS_SECS` may ask for: a day.
pub const MAX_PROGRESS_SECS: f64 = 86_400.0;

/// Seconds between progress lines: `SPECMLA_PROGRESS_SECS`, or 5 (0: a line at every
/// update). Anything but a number of seconds in [0, [`MAX_PROGRESS_SECS`]] is an error
/// naming the variable (a negative, NaN or infinite value would otherwise panic inside
/// `Duration`).
pub fn progress_secs() -> Result<f64, String> {
    let Ok(v) = std::env::var("SPECMLA_PROGRESS_SECS") else {
        return Ok(5.0);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if (0.0..=MAX_PROGRESS_SECS).contains(&s) => Ok(s),
        _ => Err(format!(
            "SPECMLA_PROGRESS_SECS must be a number of seconds from 0 to {MAX_PROGRESS_SECS}, \
             got {v:?}"
        )),
    }
}

/// Seconds left, the smaller of two estimates where each is known: `done` of `total`
/// units (requests, steps) in `secs` so far, and `steps` of a cap of `max_steps`.
pub fn estimate_secs_left(
    secs: f64,
    (done, total): (u64, u64),
    (steps, max_steps): (u64, u64),
) -> Option<f64> {
    let rate_left = |d: u64, t: u64| (d > 0).then(|| secs * t.saturating_sub(d) as f64 / d as f64);
    match (rate_left(done, total), rate_left(steps, max_steps)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A progress reporter over `total` units of work.
pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    unit: &'static str,
    total: u64,
    start: Instant,
    last_line: Option<Instant>,
    every: Duration,
}

impl Progress {
    /// A bar on a terminal, timed lines otherwise, every `secs` seconds
    /// ([`progress_secs`]). The estimate of the time left is the caller's, in its message.
    pub fn new(label: &str, total: u64, unit: &'static str, secs: f64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total);
            let template =
                format!("{{bar:30}} {{pos}}/{{len}} {unit} {{msg}} [{{elapsed_precise}}]");
            b.set_style(ProgressStyle::with_template(&template).expect("static template"));
            b
        });
        Progress {
            bar,
            label: label.to_string(),
            unit,
            total,
            start: Instant::now(),
            last_line: None,
            every: Duration::from_secs_f64(secs),
        }
    }

    /// Reports `pos` units done; `msg` says more, given the seconds elapsed (built only
    /// when shown).
    pub fn update(&mut self, pos: u64, msg: impl FnOnce(f64) -> String) {
        if let Some(b) = &self.bar {
            b.set_position(pos);
            b.set_message(msg(self.start.elapsed().as_secs_f64()));
            return;
        }
        let now = Instant::now();
        let since = self.last_line.unwrap_or(self.start);
        if now.duration_since(since) < self.every {
            return;
        }
        self.last_line = Some(now);
        let secs = now.duration_since(self.start).as_secs_f64();
        // A closed stderr (`2>&1 | head -1`) loses the line; it must not end the run.
        let _ = writeln!(
            std::io::stderr(),
            "{}: {pos}/{} {}, {}, {secs:.0} s elapsed",
            self.label,
            self.total,
            self.unit,
            msg(secs)
        );
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::estimate_secs_left;

    #[test]
    fn the_estimate_takes_whichever_bound_ends_the_run_first() {
        // 10 of 100,000 requests in 5 s, but 100 of a 300-step cap: 10 s left, not 14 hours.
        assert_eq!(
            estimate_secs_left(5.0, (10, 100_000), (100, 300)),
            Some(10.0)
        );
        // No request finished yet: the steps alone.
        assert_eq!(estimate_secs_left(5.0, (0, 20), (50, 100)), Some(5.0));
        // No cap (a replay): the units alone; nothing done, nothing known.
        assert_eq!(estimate_secs_left(4.0, (2, 10), (0, 0)), Some(16.0));
        assert_eq!(estimate_secs_left(4.0, (0, 10), (0, 0)), None);
    }
}
