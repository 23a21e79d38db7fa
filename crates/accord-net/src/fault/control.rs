//! The run-time handle of a fault injector: path cuts, timed blackholes and
//! counters, shared through an `Arc` so another thread can cut a "NIC"
//! mid-transfer.

use crate::clock::Clock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest blackhole [`FaultControl::blackhole_for`] sets: an outage that ends
/// by itself, so a test that fails half-way never leaves a path cut for ever.
pub const BLACKHOLE_MAX: Duration = Duration::from_secs(600);

/// Counters of injected faults, in packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Packets dropped at random.
    pub dropped: u64,
    /// Extra copies sent.
    pub duplicated: u64,
    /// Packets held back to be overtaken.
    pub reordered: u64,
    /// Packets with a flipped byte.
    pub corrupted: u64,
    /// Packets held for the configured delay.
    pub delayed: u64,
    /// Packets swallowed by a cut path (either direction).
    pub cut: u64,
    /// Packets captured and sent again, verbatim, `replay_delay` later.
    pub replayed: u64,
    /// Packets with a bit flipped in their first `header_bytes` (past the UDP checksum).
    pub header_corrupted: u64,
}

/// Path cuts and fault counters of one [`super::FaultInjector`].
pub struct FaultControl {
    cut: Vec<AtomicBool>,
    cut_count: AtomicUsize,
    /// The injector's clock, which times blackholes.
    clock: Arc<dyn Clock>,
    /// While the clock reads below this (nanoseconds), every path is cut; 0: no blackhole.
    blackhole_until_ns: AtomicU64,
    /// As `blackhole_until_ns`, for arrivals only (sends pass).
    deaf_until_ns: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    corrupted: AtomicU64,
    delayed: AtomicU64,
    cut_packets: AtomicU64,
    replayed: AtomicU64,
    header_corrupted: AtomicU64,
}

impl FaultControl {
    pub(super) fn new(path_count: u16, clock: Arc<dyn Clock>) -> Self {
        FaultControl {
            cut: (0..path_count).map(|_| AtomicBool::new(false)).collect(),
            cut_count: AtomicUsize::new(0),
            clock,
            blackhole_until_ns: AtomicU64::new(0),
            deaf_until_ns: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            duplicated: AtomicU64::new(0),
            reordered: AtomicU64::new(0),
            corrupted: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            cut_packets: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            header_corrupted: AtomicU64::new(0),
        }
    }

    /// Cuts `path`: everything sent or received on it vanishes until
    /// restored. Returns false if there is no such path.
    pub fn cut_path(&self, path: u16) -> bool {
        let Some(flag) = self.cut.get(usize::from(path)) else {
            return false;
        };
        if !flag.swap(true, Ordering::AcqRel) {
            self.cut_count.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    /// Restores a cut `path`. Returns false if there is no such path.
    pub fn restore_path(&self, path: u16) -> bool {
        let Some(flag) = self.cut.get(usize::from(path)) else {
            return false;
        };
        if flag.swap(false, Ordering::AcqRel) {
            self.cut_count.fetch_sub(1, Ordering::AcqRel);
        }
        true
    }

    /// Cuts every path, both directions, for `duration` (at most [`BLACKHOLE_MAX`]) from
    /// now: an outage that heals by itself. A later call replaces the end (a zero duration
    /// ends it now). Returns the duration applied. Paths cut with
    /// [`cut_path`](Self::cut_path) stay cut after the blackhole.
    pub fn blackhole_for(&self, duration: Duration) -> Duration {
        self.set_until(&self.blackhole_until_ns, duration)
    }

    /// Drops everything that arrives, on every path, for `duration` (at most
    /// [`BLACKHOLE_MAX`]), while sends still go out: an outage of one direction, in which
    /// the peer receives our data but we hear none of its acknowledgements.
    pub fn deafen_for(&self, duration: Duration) -> Duration {
        self.set_until(&self.deaf_until_ns, duration)
    }

    fn set_until(&self, until_ns: &AtomicU64, duration: Duration) -> Duration {
        let duration = duration.min(BLACKHOLE_MAX);
        let until = self.clock.now().saturating_add(duration).as_nanos().min(u128::from(u64::MAX)) as u64;
        until_ns.store(until.max(1), Ordering::Release);
        duration
    }

    fn in_force(&self, until_ns: &AtomicU64) -> bool {
        let until = until_ns.load(Ordering::Acquire);
        until != 0 && self.clock.now().as_nanos() < u128::from(until)
    }

    /// Whether a blackhole is in force now.
    pub fn is_blackholed(&self) -> bool {
        self.in_force(&self.blackhole_until_ns)
    }

    /// Whether arrivals on `path` are dropped now: it is cut, blackholed or deafened.
    pub fn drops_arrivals(&self, path: u16) -> bool {
        self.is_cut(path) || self.in_force(&self.deaf_until_ns)
    }

    /// Whether `path` is cut, or blackholed (unknown paths are cut only by a blackhole).
    pub fn is_cut(&self, path: u16) -> bool {
        self.cut.get(usize::from(path)).is_some_and(|flag| flag.load(Ordering::Acquire)) || self.is_blackholed()
    }

    /// Whether any path is cut (a cheap check for the receive fast path: one load unless a
    /// blackhole was ever set).
    pub fn any_cut(&self) -> bool {
        self.cut_count.load(Ordering::Acquire) > 0
            || (self.blackhole_until_ns.load(Ordering::Relaxed) != 0 && self.is_blackholed())
            || (self.deaf_until_ns.load(Ordering::Relaxed) != 0 && self.in_force(&self.deaf_until_ns))
    }

    /// Counters so far.
    pub fn stats(&self) -> FaultStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FaultStats {
            dropped: get(&self.dropped),
            duplicated: get(&self.duplicated),
            reordered: get(&self.reordered),
            corrupted: get(&self.corrupted),
            delayed: get(&self.delayed),
            cut: get(&self.cut_packets),
            replayed: get(&self.replayed),
            header_corrupted: get(&self.header_corrupted),
        }
    }

    pub(super) fn count_cut(&self, packets: u64) {
        self.cut_packets.fetch_add(packets, Ordering::Relaxed);
    }
    pub(super) fn count_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_duplicated(&self) {
        self.duplicated.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_reordered(&self) {
        self.reordered.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_corrupted(&self) {
        self.corrupted.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_replayed(&self) {
        self.replayed.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_header_corrupted(&self) {
        self.header_corrupted.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_delayed(&self) {
        self.delayed.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for FaultControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultControl")
            .field("cut_count", &self.cut_count.load(Ordering::Relaxed))
            .field("blackholed", &self.is_blackholed())
            .field("stats", &self.stats())
            .finish()
    }
}
