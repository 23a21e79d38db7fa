//! How a user thread waits for a transfer or an immediate counter: it first polls the
//! completion for a bounded time (spinning, then yielding the core), and only then blocks on the
//! condition variable.
//!
//! Why: completions are signalled by engine threads (a worker, the device copy poller). A user
//! thread asleep in a condition variable needs a futex wake-up, which on a virtual machine whose
//! idle core went into a deep sleep state costs tens of microseconds: on the 2xH200 host, one
//! 256 MiB device write waited for that way took 51 us longer than a raw copy synchronised by the
//! CUDA driver, which polls (docs/results/2026-11-22-gpu-staging.md). The CUDA driver's own
//! default (`CU_CTX_SCHED_AUTO`) spins while the host has more cores than active GPU contexts and
//! yields otherwise; this is the same trade, bounded by [`crate::EngineConfig::wait_spin`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

/// A condition variable that knows whether anyone sleeps on it, so the engine thread that
/// signals a completion makes no futex system call when every waiter caught it while polling
/// (the common case once waits poll first: on a VM that call costs about a microsecond on the
/// completion's critical path, once per transfer and once per immediate).
///
/// Correct use: a waiter counts itself in while holding the mutex (this type's wait methods
/// do), and a signaller changes the state under the same mutex before calling
/// [`SleeperCondvar::notify_all`]; then a waiter either saw the new state before sleeping or was
/// counted before the signaller looked.
#[derive(Debug, Default)]
pub(crate) struct SleeperCondvar {
    condvar: Condvar,
    sleepers: AtomicUsize,
}

impl SleeperCondvar {
    /// [`Condvar::wait_timeout`], counted.
    pub(crate) fn wait_timeout<'a, T>(&self, guard: MutexGuard<'a, T>, timeout: Duration) -> MutexGuard<'a, T> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let guard = self.condvar.wait_timeout(guard, timeout).unwrap_or_else(|e| e.into_inner()).0;
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// [`Condvar::wait`], counted.
    pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let guard = self.condvar.wait(guard).unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Wakes every sleeper, if there is one.
    pub(crate) fn notify_all(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.condvar.notify_all();
        }
    }
}

/// Polls before the first yield: a completion already racing in is seen without a syscall.
const SPINS_BEFORE_YIELD: u32 = 64;

/// Polls `done` until it returns true or `budget` has passed (measured from the call); whether
/// it returned true. A zero budget checks once.
pub(crate) fn spin_until(budget: Duration, mut done: impl FnMut() -> bool) -> bool {
    if done() {
        return true;
    }
    if budget.is_zero() {
        return false;
    }
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        if polls < SPINS_BEFORE_YIELD {
            std::hint::spin_loop();
            polls += 1;
        } else {
            std::thread::yield_now();
        }
        if done() {
            return true;
        }
        if start.elapsed() >= budget {
            return false;
        }
    }
}

/// Default of [`crate::EngineConfig::wait_spin`] on a host with `cores` logical cores: a
/// millisecond (long enough to cover a 256 MiB copy-engine write at ~390 GB/s) where cores are
/// plenty, 50 us where they are few (the polling thread would take the core the engine's own
/// threads need; the short poll still catches completions racing in).
pub fn wait_spin_default(cores: usize) -> Duration {
    if cores >= WAIT_SPIN_FULL_CORES_MIN {
        WAIT_SPIN_FULL
    } else {
        WAIT_SPIN_FEW_CORES
    }
}

/// Cores from which a waiting user thread polls for [`WAIT_SPIN_FULL`].
pub const WAIT_SPIN_FULL_CORES_MIN: usize = 8;
/// Poll budget of a waiting user thread on a host with many cores.
pub const WAIT_SPIN_FULL: Duration = Duration::from_millis(1);
/// Poll budget of a waiting user thread on a host with few cores.
pub const WAIT_SPIN_FEW_CORES: Duration = Duration::from_micros(50);
/// Longest [`crate::EngineConfig::wait_spin`] one may configure.
pub const WAIT_SPIN_MAX: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn sees_a_completion_set_by_another_thread() {
        let flag = Arc::new(AtomicBool::new(false));
        let setter = {
            let flag = flag.clone();
            std::thread::spawn(move || flag.store(true, Ordering::Release))
        };
        // A generous budget: the other thread gets scheduled long before it runs out.
        assert!(spin_until(Duration::from_secs(10), || flag.load(Ordering::Acquire)));
        setter.join().unwrap();
    }

    #[test]
    fn gives_up_after_its_budget_and_zero_checks_once() {
        let mut calls = 0;
        assert!(!spin_until(Duration::ZERO, || {
            calls += 1;
            false
        }));
        assert_eq!(calls, 1);
        assert!(!spin_until(Duration::from_micros(200), || false));
        assert!(spin_until(Duration::ZERO, || true));
    }

    /// A sleeper is woken by a change made under the mutex; with nobody asleep, a notify is a
    /// no-op and loses nothing (the next waiter sees the state before it sleeps).
    #[test]
    fn sleeper_condvar_wakes_sleepers_and_skips_empty_notifies() {
        use std::sync::Mutex;
        let state = Arc::new((Mutex::new(0u32), SleeperCondvar::default()));
        state.1.notify_all(); // nobody asleep
        for round in 1..=50u32 {
            let waiter = {
                let state = state.clone();
                std::thread::spawn(move || {
                    let mut guard = state.0.lock().unwrap();
                    while *guard < round {
                        guard = state.1.wait_timeout(guard, Duration::from_secs(20));
                    }
                    *guard
                })
            };
            *state.0.lock().unwrap() = round;
            state.1.notify_all();
            assert_eq!(waiter.join().unwrap(), round);
        }
        assert_eq!(state.1.sleepers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn default_depends_on_cores() {
        assert_eq!(wait_spin_default(2), WAIT_SPIN_FEW_CORES);
        assert_eq!(wait_spin_default(32), WAIT_SPIN_FULL);
    }
}
