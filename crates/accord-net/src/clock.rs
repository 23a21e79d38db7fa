//! Time source for the wrappers, injectable so tests are deterministic.
//!
//! The wrappers never call `Instant::now()` directly: a fault injector whose
//! delays depend on wall time would make seeded tests flaky.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic clock, read as time elapsed since the clock's own origin.
pub trait Clock: Send + Sync {
    /// Time since this clock's origin; never decreases.
    fn now(&self) -> Duration;
}

/// The real monotonic clock, with its origin at construction.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        SystemClock { origin: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told to; clones share the same time, so a
/// test keeps one handle and gives another to the wrapper.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by` (saturating at about 584 years).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // fetch_update cannot fail with a closure that always returns Some.
        let _ = self.nanos.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_add(by)));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }
}
