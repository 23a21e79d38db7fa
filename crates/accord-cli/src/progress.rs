//! Progress lines on standard error for long commands, only when a person watches (standard
//! error is a terminal) and at most one a second, so pipes and logs stay clean.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Least time between two progress lines.
const INTERVAL: Duration = Duration::from_secs(1);

/// One command's progress reporter.
pub struct Progress {
    what: &'static str,
    enabled: bool,
    started: Instant,
    last: Option<Instant>,
    wrote: bool,
}

impl Progress {
    /// A reporter that writes only when standard error is a terminal.
    pub fn new(what: &'static str) -> Progress {
        Progress::with(what, std::io::stderr().is_terminal())
    }

    fn with(what: &'static str, enabled: bool) -> Progress {
        Progress { what, enabled, started: Instant::now(), last: None, wrote: false }
    }

    /// The line for `done` of `all`.
    fn line(&self, done: usize, all: usize, unit: &str) -> String {
        let pct = if all == 0 { 100.0 } else { done as f64 * 100.0 / all as f64 };
        format!("{}: {done}/{all} {unit} ({pct:.0}%), {:.0} s", self.what, self.started.elapsed().as_secs_f64())
    }

    /// Reports `done` of `all`; rewrites the same terminal line at most once per interval.
    pub fn update(&mut self, done: usize, all: usize, unit: &str) {
        if !self.enabled || self.last.is_some_and(|t| t.elapsed() < INTERVAL) {
            return;
        }
        self.last = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{}\x1b[K", self.line(done, all, unit));
        let _ = err.flush();
        self.wrote = true;
    }

    /// Clears the progress line (the result follows on stdout).
    pub fn finish(&mut self) {
        if self.wrote {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
            self.wrote = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Progress;

    #[test]
    fn lines_say_how_far_and_disabled_reporters_stay_silent() {
        let p = Progress::with("sim", true);
        assert!(p.line(5, 20, "flows done").starts_with("sim: 5/20 flows done (25%), "));
        let mut quiet = Progress::with("sim", false);
        quiet.update(1, 2, "x");
        assert!(!quiet.wrote);
    }
}
