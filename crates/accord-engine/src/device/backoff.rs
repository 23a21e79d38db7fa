//! How the engine's polling threads (device copy poller, staging thread) wait when a round
//! made no progress: spin briefly, then yield the core, then sleep in short steps.
//!
//! Why: copy completions and chunk acknowledgements are due within microseconds while work is
//! in flight, so the first rounds must not sleep (a sleep costs tens of microseconds on a VM);
//! a thread with nothing in flight for long must stop burning its core.

use std::time::Duration;

/// Rounds without progress that only spin.
const SPIN_ROUNDS: u32 = 64;

/// The idle-round counter of one polling thread.
#[derive(Debug)]
pub(crate) struct IdleBackoff {
    idle_rounds: u32,
    rounds_before_sleep: u32,
    sleep: Duration,
}

impl IdleBackoff {
    /// Yields until `rounds_before_sleep` idle rounds, then sleeps `sleep` per round.
    pub(crate) fn new(rounds_before_sleep: u32, sleep: Duration) -> IdleBackoff {
        IdleBackoff { idle_rounds: 0, rounds_before_sleep, sleep }
    }

    /// Ends a round: resets on progress, otherwise spins, yields or sleeps.
    pub(crate) fn after_round(&mut self, progress: bool) {
        if progress {
            self.idle_rounds = 0;
            return;
        }
        self.idle_rounds = self.idle_rounds.saturating_add(1);
        if self.idle_rounds < SPIN_ROUNDS {
            std::hint::spin_loop();
        } else if self.idle_rounds < self.rounds_before_sleep {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep);
        }
    }

    /// Idle rounds so far (for tests).
    #[cfg(test)]
    pub(crate) fn idle_rounds(&self) -> u32 {
        self.idle_rounds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_resets_and_idle_rounds_count_up() {
        let mut b = IdleBackoff::new(4, Duration::from_micros(1));
        for _ in 0..3 {
            b.after_round(false);
        }
        assert_eq!(b.idle_rounds(), 3);
        b.after_round(true);
        assert_eq!(b.idle_rounds(), 0);
        for _ in 0..100 {
            b.after_round(false); // past the sleep threshold: sleeps 1 us per round
        }
        assert_eq!(b.idle_rounds(), 100);
    }
}
