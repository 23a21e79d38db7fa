//! The polling loop of the progress thread's waits on the GPU (events, words the caller's
//! stream stores), on the engine's idle backoff: spin briefly, then yield, then sleep in short
//! steps, and give up at the deadline with an error that names what was waited for.

use std::time::{Duration, Instant};

use super::board::Deadline;
use super::error::{GpuCollError, GpuResult};

/// Polls `done` (spin, then yield, then short sleeps) until it says so, or the deadline; the
/// timeout names what was waited for (`what`, built only then).
pub fn poll_until(
    deadline: Deadline,
    what: impl Fn() -> String,
    done: impl FnMut() -> GpuResult<bool>,
) -> GpuResult<()> {
    poll_until_spinning(64, deadline, what, done)
}

/// [`poll_until`] with `spin_rounds` busy rounds before the first yield (a wait expected to end
/// within microseconds, such as the caller's stream reaching a call, spins longer).
pub fn poll_until_spinning(
    spin_rounds: u32,
    deadline: Deadline,
    what: impl Fn() -> String,
    mut done: impl FnMut() -> GpuResult<bool>,
) -> GpuResult<()> {
    // The engine's idle backoff: spin, then yield, then sleep 10 us a round; the clock is read
    // only once spinning is over.
    let mut backoff = accord_engine::backoff::IdleBackoff::with_spin(spin_rounds, 4096, Duration::from_micros(10));
    loop {
        if done()? {
            return Ok(());
        }
        if !backoff.will_spin() && Instant::now() >= deadline.at {
            return Err(GpuCollError::Timeout { what: what(), waited: deadline.budget });
        }
        backoff.after_round(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_once_done_and_names_what_it_waited_for_at_the_deadline() {
        let mut calls = 0;
        poll_until(
            Deadline::after(Duration::from_secs(5)),
            || "never built".into(),
            || {
                calls += 1;
                Ok(calls == 3)
            },
        )
        .expect("done on the third poll");
        assert_eq!(calls, 3);
        let late = poll_until(Deadline::after(Duration::from_millis(20)), || "the widget".into(), || Ok(false));
        match late {
            Err(GpuCollError::Timeout { what, .. }) => assert_eq!(what, "the widget"),
            other => panic!("expected a timeout, got {other:?}"),
        }
        let failed = poll_until(Deadline::after(Duration::from_secs(5)), String::new, || {
            Err(GpuCollError::InvalidArgument { what: "broken".into() })
        });
        assert!(matches!(failed, Err(GpuCollError::InvalidArgument { .. })), "an error ends the wait");
    }
}
