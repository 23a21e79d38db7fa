//! How the engine's polling threads (device copy poller, staging thread), and the GPU
//! collectives' waits on their flag board, wait when a round made no progress: spin briefly,
//! then yield the core, then sleep in short steps.
//!
//! Why: copy completions and chunk acknowledgements are due within microseconds while work is
//! in flight, so the first rounds must not sleep (a sleep costs tens of microseconds on a VM);
//! a thread with nothing in flight for long must stop burning its core. One ladder, with each
//! user's own step counts, instead of one copy per polling loop.

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// Rounds without progress that only spin, unless [`IdleBackoff::with_spin`] says otherwise.
const SPIN_ROUNDS: u32 = 64;

/// The idle-round counter of one polling thread.
#[derive(Debug)]
pub struct IdleBackoff {
    idle_rounds: u32,
    spin_rounds: u32,
    rounds_before_sleep: u32,
    sleep: Duration,
}

impl IdleBackoff {
    /// Spins the first 64 idle rounds, yields until `rounds_before_sleep` idle rounds, then
    /// sleeps `sleep` per round.
    pub fn new(rounds_before_sleep: u32, sleep: Duration) -> IdleBackoff {
        IdleBackoff::with_spin(SPIN_ROUNDS, rounds_before_sleep, sleep)
    }

    /// As [`IdleBackoff::new`], spinning the first `spin_rounds` idle rounds.
    pub fn with_spin(spin_rounds: u32, rounds_before_sleep: u32, sleep: Duration) -> IdleBackoff {
        IdleBackoff { idle_rounds: 0, spin_rounds, rounds_before_sleep, sleep }
    }

    /// Whether the next idle round only spins (a caller may skip slower checks until it does
    /// not).
    pub fn will_spin(&self) -> bool {
        self.idle_rounds.saturating_add(1) < self.spin_rounds
    }

    /// Ends a round: resets on progress, otherwise spins, yields or sleeps.
    pub fn after_round(&mut self, progress: bool) {
        if progress {
            self.idle_rounds = 0;
            return;
        }
        self.idle_rounds = self.idle_rounds.saturating_add(1);
        if self.idle_rounds < self.spin_rounds {
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

/// Receives the next message of `rx` for a thread that blocks when it has nothing to do (the
/// completion thread, the landing thread, the staging thread): while its last progress is
/// within `window` it polls, yielding the core between looks, and only then blocks, for at
/// most `block`.
///
/// Why: each of these threads is one hop of a small device write's chain (staging, landing,
/// completion). Blocked, it is woken by a futex, and on a virtual machine whose other vCPUs
/// are idle a wake-up cost about 100 us: on 2xH200 the network route's 8-byte put took
/// 80-90 us one way with the bench pinned to 8 cores and 90-230 us unpinned
/// (docs/results/2026-11-28-network-route-wakeups.md). Within the window the next message
/// of a running exchange is seen without a wake-up; the window is the workers' own
/// ([`crate::EngineConfig::await_poll`]), so an idle engine still sleeps.
pub(crate) fn recv_hot<T>(
    rx: &Receiver<T>,
    last_progress: Instant,
    window: Duration,
    block: Duration,
) -> Result<T, RecvTimeoutError> {
    loop {
        match rx.try_recv() {
            Ok(message) => return Ok(message),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) if last_progress.elapsed() < window => std::thread::yield_now(),
            Err(TryRecvError::Empty) => return rx.recv_timeout(block),
        }
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

    #[test]
    fn the_spin_phase_is_as_long_as_asked() {
        let mut b = IdleBackoff::with_spin(3, 5, Duration::from_micros(1));
        let mut spinning = vec![];
        for _ in 0..4 {
            spinning.push(b.will_spin());
            b.after_round(false);
        }
        assert_eq!(spinning, [true, true, false, false], "rounds 1 and 2 spin, round 3 on do not");
        b.after_round(true);
        assert!(b.will_spin(), "progress starts over");
        assert!(IdleBackoff::new(100, Duration::from_micros(1)).will_spin());
    }

    #[test]
    fn recv_hot_polls_within_the_window_then_blocks_and_sees_every_message() {
        let (tx, rx) = std::sync::mpsc::channel();
        // Past the window, with nothing sent: blocks for `block`, then times out.
        let t = Instant::now();
        assert_eq!(recv_hot::<u8>(&rx, t, Duration::ZERO, Duration::from_millis(5)), Err(RecvTimeoutError::Timeout));
        assert!(t.elapsed() >= Duration::from_millis(5));
        // Within the window: a message sent meanwhile by another thread is received.
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            tx.send(7u8).unwrap();
            tx
        });
        assert_eq!(recv_hot(&rx, Instant::now(), Duration::from_secs(5), Duration::from_secs(5)), Ok(7));
        drop(sender.join().unwrap());
        // A closed channel ends the wait at once, in the window or not.
        assert_eq!(
            recv_hot(&rx, Instant::now(), Duration::from_secs(5), Duration::from_secs(5)),
            Err(RecvTimeoutError::Disconnected)
        );
    }
}
