//! The multipath table: one entry per entropy value, each with its own RTT estimate, loss
//! score and liveness state, and the policy that picks a path for each chunk.
//!
//! A path that keeps timing out is quarantined: the selector skips it and the connection sends
//! it only probes, one per `probe_interval`, until a probe is answered and the path is revived.
//! Primary/backup failover is the two-path case of this.

mod choice;
mod recycle;
mod rtt;
mod selector;
#[cfg(test)]
mod tests;

pub use choice::{Selector, SelectorKind};
pub use recycle::{Recycling, RECYCLE_PATHS_MAX};
pub use rtt::RttEstimator;
pub use selector::{PathSelector, PowerOfTwoChoices, RoundRobin};

use crate::ids::PathId;
use crate::time::Instant;
use core::time::Duration;

/// Weight of one new observation in the loss score (an EWMA over about this many packets).
const LOSS_SCORE_WINDOW_PACKETS: f64 = 64.0;

/// A path's learned RTO floor (see [`PathTable::rto_floor`]) halves after this long without a
/// new spurious timeout, so one stall long ago does not slow loss recovery for good.
pub const RTO_FLOOR_HALF_LIFE: Duration = Duration::from_secs(1);

/// Liveness of a path.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PathHealth {
    /// Carries traffic.
    Active,
    /// Stopped delivering: skipped by the selector, probed at `next_probe_at`.
    Quarantined { since: Instant, next_probe_at: Instant },
}

/// Counters and estimates of one path, readable at any time through the connection's stats.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PathStats {
    pub path: PathId,
    pub packets_sent: u64,
    pub bytes_sent: u64,
    pub packets_acked: u64,
    pub packets_lost: u64,
    pub retransmits_sent: u64,
    pub timeouts: u64,
    /// Packets sent on this path, declared lost, whose earlier transmission was acknowledged
    /// after all (the acknowledgement was late; nothing was lost).
    pub spurious_losses: u64,
    pub rtt_min: Duration,
    pub rtt_smoothed: Duration,
    pub rto: Duration,
    pub quarantined: bool,
    pub quarantines: u64,
    pub probes_sent: u64,
    /// Fraction of recent packets on this path that were lost (EWMA, 0..1).
    pub loss_score: f64,
}

/// One entry of the path table.
#[derive(Clone, Debug)]
pub struct PathState {
    pub id: PathId,
    pub rtt: RttEstimator,
    pub health: PathHealth,
    /// Timeouts since the last acknowledgement of a packet sent on this path.
    pub consecutive_timeouts: u32,
    /// RTO doublings in force (reset by an acknowledgement).
    pub backoff_exponent: u32,
    /// Per-path send sequence of the next packet, for reordering-based loss detection.
    pub next_path_seq: u64,
    /// Largest path sequence acknowledged so far.
    pub largest_acked_path_seq: Option<u64>,
    /// Send time of the oldest packet still outstanding on this path (maintained by the
    /// connection); an old one is the first sign of a dead path.
    pub oldest_outstanding_sent_at: Option<Instant>,
    pub stats: PathStats,
}

impl PathState {
    fn new(id: PathId, initial_rtt: Duration) -> Self {
        PathState {
            id,
            rtt: RttEstimator::new(initial_rtt),
            health: PathHealth::Active,
            consecutive_timeouts: 0,
            backoff_exponent: 0,
            next_path_seq: 0,
            largest_acked_path_seq: None,
            oldest_outstanding_sent_at: None,
            stats: PathStats { path: id, ..Default::default() },
        }
    }

    /// Whether the selector may put new chunks on this path.
    pub fn is_active(&self) -> bool {
        matches!(self.health, PathHealth::Active)
    }

    /// Retransmission timeout of this path, backoff included, within `[rto_min, rto_max]`
    /// (callers pass the table's learned floor in `rto_min`: [`PathTable::rto`]).
    pub fn rto(&self, rto_min: Duration, rto_max: Duration) -> Duration {
        let base = self.rtt.rto().max(rto_min);
        let shift = self.backoff_exponent.min(16);
        base.saturating_mul(1u32 << shift).min(rto_max.max(rto_min))
    }

    /// Cost the selector compares: the smoothed RTT, or the age of the oldest outstanding
    /// packet when that is larger (a path that stopped answering looks slow before it times
    /// out), scaled up by recent loss.
    pub fn selection_cost(&self, now: Instant) -> Duration {
        let age =
            self.oldest_outstanding_sent_at.map(|sent| now.saturating_duration_since(sent)).unwrap_or(Duration::ZERO);
        let base = self.rtt.smoothed().max(age);
        base.mul_f64(1.0 + 8.0 * self.stats.loss_score)
    }

    fn note_outcome(&mut self, lost: bool) {
        let sample = if lost { 1.0 } else { 0.0 };
        self.stats.loss_score += (sample - self.stats.loss_score) / LOSS_SCORE_WINDOW_PACKETS;
    }
}

/// The path table of one connection.
#[derive(Clone, Debug)]
pub struct PathTable {
    paths: Vec<PathState>,
    /// Paths in quarantine, so the per-poll probe checks cost nothing when there are none.
    /// Health changes only through `on_timeout` and `on_probe_answered`, which keep it.
    quarantined_count: usize,
    /// Sum of the active paths' loss scores, kept by every method that changes a score or a
    /// path's health, so the chunk-size decision reads the mean without a scan.
    loss_score_active_sum: f64,
    /// Smallest RTO any path allows, learned from spurious losses ([`PathTable::raise_rto_floor`]):
    /// a packet declared lost and then acknowledged anyway shows how late an acknowledgement can
    /// be, which the smoothed RTT of the prompt ones does not. Zero until the first; halves every
    /// [`RTO_FLOOR_HALF_LIFE`] without another.
    rto_floor: Duration,
    /// When a spurious loss last raised or confirmed `rto_floor`, or it last halved: the
    /// half-life counts from there.
    rto_floor_at: Option<Instant>,
}

impl PathTable {
    /// `count` paths, numbered from 0, each starting at `initial_rtt`.
    pub fn new(count: u16, initial_rtt: Duration) -> Self {
        assert!(count > 0, "a connection has at least one path");
        PathTable {
            paths: (0..count).map(|i| PathState::new(PathId(i), initial_rtt)).collect(),
            quarantined_count: 0,
            loss_score_active_sum: 0.0,
            rto_floor: Duration::ZERO,
            rto_floor_at: None,
        }
    }

    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// The entry of `path`, if the table has it (a peer may name any path id).
    pub fn get(&self, path: PathId) -> Option<&PathState> {
        self.paths.get(path.0 as usize)
    }

    pub fn get_mut(&mut self, path: PathId) -> Option<&mut PathState> {
        self.paths.get_mut(path.0 as usize)
    }

    pub fn iter(&self) -> impl Iterator<Item = &PathState> {
        self.paths.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut PathState> {
        self.paths.iter_mut()
    }

    /// Number of paths not in quarantine.
    pub fn active_count(&self) -> usize {
        self.paths.len() - self.quarantined_count
    }

    /// Paths in quarantine.
    pub fn quarantined_count(&self) -> usize {
        self.quarantined_count
    }

    /// Mean loss score of the active paths (0 when none is active).
    pub fn mean_active_loss_score(&self) -> f64 {
        match self.active_count() {
            0 => 0.0,
            n => self.loss_score_active_sum.max(0.0) / n as f64,
        }
    }

    fn note_outcome(&mut self, path: PathId, lost: bool) {
        let Some(p) = self.paths.get_mut(path.0 as usize) else { return };
        let before = p.stats.loss_score;
        p.note_outcome(lost);
        if p.is_active() {
            self.loss_score_active_sum += p.stats.loss_score - before;
        }
    }

    /// A packet sent on `path` was acknowledged: the path is alive.
    pub fn on_acked(&mut self, path: PathId, path_seq: u64) {
        if let Some(p) = self.get_mut(path) {
            p.consecutive_timeouts = 0;
            p.backoff_exponent = 0;
            p.stats.packets_acked += 1;
            p.largest_acked_path_seq = Some(p.largest_acked_path_seq.map_or(path_seq, |s| s.max(path_seq)));
            self.note_outcome(path, false);
        }
    }

    /// A packet sent on `path` was declared lost.
    pub fn on_lost(&mut self, path: PathId) {
        if let Some(p) = self.get_mut(path) {
            p.stats.packets_lost += 1;
            self.note_outcome(path, true);
        }
    }

    /// Retransmission timeout of `path` (see [`PathState::rto`]), at least the learned floor.
    pub fn rto(&self, path: PathId, rto_min: Duration, rto_max: Duration) -> Option<Duration> {
        self.get(path).map(|p| p.rto(rto_min.max(self.rto_floor), rto_max))
    }

    /// The RTO floor learned from spurious losses (zero before any).
    pub fn rto_floor(&self) -> Duration {
        self.rto_floor
    }

    /// A packet sent on `path`, declared lost, was acknowledged after all (the caller found the
    /// declaration wrong). The path's loss score counts one more delivery, offsetting the loss.
    pub fn note_spurious_loss(&mut self, path: PathId) {
        let Some(p) = self.paths.get_mut(path.0 as usize) else { return };
        p.stats.spurious_losses += 1;
        self.note_outcome(path, false);
    }

    /// A packet sent at `sent_at` and declared lost was acknowledged at `now`. The RTO floor of
    /// every path rises to a quarter above how long that acknowledgement took (at most
    /// `rto_max`): an acknowledgement that late is mostly the hosts' doing (a worker
    /// descheduled, a queue in a shared-memory ring, which every path of a peer shares), and no
    /// path's own RTT samples show it. Returns true when the floor rose (every path's loss
    /// deadline moves).
    pub fn raise_rto_floor(&mut self, sent_at: Instant, now: Instant, rto_max: Duration) -> bool {
        let took = now.saturating_duration_since(sent_at);
        let floor = (took + took / 4).min(rto_max);
        self.rto_floor_at = Some(now);
        if floor > self.rto_floor {
            self.rto_floor = floor;
            return true;
        }
        false
    }

    /// Halves the learned floor once [`RTO_FLOOR_HALF_LIFE`] has passed since it last moved
    /// (called as RTT samples arrive). Returns true when it changed.
    pub fn decay_rto_floor(&mut self, now: Instant) -> bool {
        let Some(at) = self.rto_floor_at else { return false };
        if now.saturating_duration_since(at) < RTO_FLOOR_HALF_LIFE {
            return false;
        }
        self.rto_floor /= 2;
        self.rto_floor_at = (!self.rto_floor.is_zero()).then_some(now);
        true
    }

    /// A timeout fired for packets on `path`. Returns true when this quarantined the path.
    pub fn on_timeout(&mut self, now: Instant, path: PathId, quarantine_after: u32, probe_interval: Duration) -> bool {
        let Some(p) = self.paths.get_mut(path.0 as usize) else { return false };
        p.stats.timeouts += 1;
        p.consecutive_timeouts += 1;
        p.backoff_exponent = p.backoff_exponent.saturating_add(1);
        if p.is_active() && p.consecutive_timeouts >= quarantine_after {
            p.health = PathHealth::Quarantined { since: now, next_probe_at: now + probe_interval };
            p.stats.quarantined = true;
            p.stats.quarantines += 1;
            self.quarantined_count += 1;
            self.loss_score_active_sum -= p.stats.loss_score;
            return true;
        }
        false
    }

    /// A probe on a quarantined path was answered. Returns true when this revived it.
    pub fn on_probe_answered(&mut self, path: PathId, rtt_sample: Duration) -> bool {
        let Some(p) = self.paths.get_mut(path.0 as usize) else { return false };
        p.rtt.on_sample(rtt_sample);
        let was_quarantined = !p.is_active();
        if !was_quarantined {
            self.loss_score_active_sum -= p.stats.loss_score;
        }
        p.health = PathHealth::Active;
        p.stats.quarantined = false;
        p.consecutive_timeouts = 0;
        p.backoff_exponent = 0;
        p.stats.loss_score = 0.0;
        self.quarantined_count -= was_quarantined as usize;
        was_quarantined
    }

    /// The earliest probe due among quarantined paths.
    pub fn next_probe_at(&self) -> Option<Instant> {
        if self.quarantined_count == 0 {
            return None;
        }
        self.paths
            .iter()
            .filter_map(|p| match p.health {
                PathHealth::Quarantined { next_probe_at, .. } => Some(next_probe_at),
                PathHealth::Active => None,
            })
            .min()
    }

    /// A quarantined path whose probe is due, with its next probe scheduled.
    pub fn take_due_probe(&mut self, now: Instant, probe_interval: Duration) -> Option<PathId> {
        if self.quarantined_count == 0 {
            return None;
        }
        for p in &mut self.paths {
            if let PathHealth::Quarantined { since, next_probe_at } = p.health {
                if next_probe_at <= now {
                    p.health = PathHealth::Quarantined { since, next_probe_at: now + probe_interval };
                    p.stats.probes_sent += 1;
                    return Some(p.id);
                }
            }
        }
        None
    }

    /// Snapshot of every path's counters.
    pub fn stats(&self, rto_min: Duration, rto_max: Duration) -> Vec<PathStats> {
        self.paths
            .iter()
            .map(|p| {
                let mut s = p.stats.clone();
                s.rtt_min = p.rtt.min();
                s.rtt_smoothed = p.rtt.smoothed();
                s.rto = self.rto(p.id, rto_min, rto_max).unwrap_or(rto_min);
                s
            })
            .collect()
    }
}
