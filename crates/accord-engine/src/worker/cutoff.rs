//! Lanes cut off from a peer: a connection every path of which has been quarantined for
//! [`LANE_CUT_OFF_AFTER`] has lost its NIC, the peer's, or the link between them.
//!
//! Why: until this, a lane whose NIC went down kept its writes until the connection's idle
//! timeout (5 s by default) failed them over to another lane, and a write split over both
//! lanes waited for it: a job on two NICs moved nothing for those seconds
//! (`cargo test --release -p accord-engine --test nic_failover -- --nocapture`, one veth taken
//! down, showed a full idle timeout at 0 GB/s). Quarantine sees a dead path within a few
//! retransmission timeouts; a whole connection quarantined that long is not a burst of loss.
//! The worker then closes the connection, which fails its operations with `Closed`, and
//! `Worker::fail_over` marks the lane dead for that peer and resubmits them on another lane.
//! Only where another lane to the peer is live: with none, the probes may still revive a path
//! and the idle timeout keeps its meaning.

use accord_proto::ConnectionHandle;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long every path of a connection must stay quarantined before its lane is cut off
/// from the peer. Quarantined paths are probed every 5 ms (`accord_proto` `probe_interval`),
/// so this is some 20 unanswered probes a path: far past a loss burst, far short of the idle
/// timeout.
pub const LANE_CUT_OFF_AFTER: Duration = Duration::from_millis(100);

/// Connections with every path quarantined, and since when.
#[derive(Default)]
pub(crate) struct CutOffs {
    since: HashMap<ConnectionHandle, Instant>,
}

impl CutOffs {
    /// A path of `conn` was quarantined; `all` whether every path of it now is.
    pub(crate) fn quarantined(&mut self, conn: ConnectionHandle, all: bool, now: Instant) {
        if all {
            self.since.entry(conn).or_insert(now);
        }
    }

    /// A path of `conn` answered again, or `conn` is gone.
    pub(crate) fn clear(&mut self, conn: ConnectionHandle) {
        self.since.remove(&conn);
    }

    /// Whether none is waiting (the worker's loop checks this every turn).
    pub(crate) fn is_empty(&self) -> bool {
        self.since.is_empty()
    }

    /// Connections quarantined whole for at least [`LANE_CUT_OFF_AFTER`] at `now`.
    pub(crate) fn due(&self, now: Instant) -> Vec<ConnectionHandle> {
        let mut due: Vec<_> = self
            .since
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= LANE_CUT_OFF_AFTER)
            .map(|(conn, _)| *conn)
            .collect();
        due.sort_unstable_by_key(|c| c.0);
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_due_only_once_wholly_quarantined_for_the_bound() {
        let t0 = Instant::now();
        let (a, b) = (accord_proto::ConnectionId(1), accord_proto::ConnectionId(2));
        let mut c = CutOffs::default();
        c.quarantined(a, false, t0);
        assert!(c.is_empty(), "one path of several quarantined is no cut-off");
        c.quarantined(a, true, t0);
        c.quarantined(a, true, t0 + LANE_CUT_OFF_AFTER / 2);
        c.quarantined(b, true, t0 + LANE_CUT_OFF_AFTER / 2);
        assert!(c.due(t0 + LANE_CUT_OFF_AFTER / 2).is_empty());
        assert_eq!(c.due(t0 + LANE_CUT_OFF_AFTER), [a], "timed from the first time it was whole");
        assert_eq!(c.due(t0 + LANE_CUT_OFF_AFTER * 2), [a, b]);
        c.clear(a);
        assert_eq!(c.due(t0 + LANE_CUT_OFF_AFTER * 2), [b], "a revived path clears it");
    }
}
