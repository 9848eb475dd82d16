//! Progress on stderr for long runs, and Ctrl-C. On a terminal: a bar with a total and an
//! estimate. Otherwise: one line every few seconds (`SPECMLA_PROGRESS_SECS`, default 5),
//! so a run in CI or under `nohup` is never silent. Progress reads the wall clock, so it
//! stays out of everything recorded.
//!
//! Ctrl-C sets a flag ([`interrupted`]) that the run loops check between steps: `sim`
//! and `replay` then stop, print what they have so far, and close the trace with its
//! footer, so the file is a valid prefix of the run.

use std::io::IsTerminal;
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
    /// A bar on a terminal, timed lines otherwise.
    pub fn new(label: &str, total: u64, unit: &'static str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total);
            let template = format!(
                "{{bar:30}} {{pos}}/{{len}} {unit} {{msg}} [{{elapsed_precise}}, about {{eta}} left]"
            );
            b.set_style(ProgressStyle::with_template(&template).expect("static template"));
            b
        });
        let secs = std::env::var("SPECMLA_PROGRESS_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5.0);
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
        eprintln!(
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
