//! Lanes not used towards a peer, and how they come back.
//!
//! A lane whose connection to a peer failed (or was cut off, `worker/cutoff.rs`) is avoided
//! for [`crate::EngineConfig::lane_avoid`]. It used to be used again as soon as that passed:
//! with its NIC still down, the parts sent there waited out a handshake timeout (the idle
//! timeout, 5 s by default) before failing over again, and a write split over both lanes
//! waited with them, once every avoid period for as long as the NIC stayed down. Now, once
//! the avoid period passes, the lane's worker is asked to connect to the peer (a probe that
//! carries no part), and the lane carries parts again only after that handshake succeeded; a
//! failed handshake avoids it for another period.

use crate::EngineId;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Why a lane is not used towards a peer now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outage {
    /// Its connection failed: avoided until then.
    Avoided { until: Instant },
    /// Its worker is connecting to the peer since then; the lane is used once that succeeds.
    Probing { since: Instant },
}

/// Lanes not used towards each peer.
#[derive(Debug, Default)]
pub(crate) struct LaneOutages {
    outages: HashMap<(EngineId, usize), Outage>,
}

impl LaneOutages {
    /// Whether no lane is out towards any peer.
    pub(crate) fn is_empty(&self) -> bool {
        self.outages.is_empty()
    }

    /// `lane`'s connection to `peer` failed at `now`: avoid it for `avoid`.
    pub(crate) fn failed(&mut self, peer: EngineId, lane: usize, now: Instant, avoid: Duration) {
        self.outages.insert((peer, lane), Outage::Avoided { until: now + avoid });
    }

    /// `lane` has a connection to `peer` that finished its handshake: it may carry parts.
    pub(crate) fn connected(&mut self, peer: EngineId, lane: usize) {
        if matches!(self.outages.get(&(peer, lane)), Some(Outage::Probing { .. })) {
            self.outages.remove(&(peer, lane));
        }
    }

    /// Of `lanes` lanes, those `peer` may use at `now`, and the lanes to probe now: those whose
    /// avoid period ended, and those probing for longer than `probe_again_after` (the probe's
    /// command or its outcome was lost; a handshake gives up well before that).
    pub(crate) fn live(
        &mut self,
        peer: EngineId,
        lanes: usize,
        now: Instant,
        probe_again_after: Duration,
    ) -> (Vec<usize>, Vec<usize>) {
        let mut probe = vec![];
        if self.outages.is_empty() {
            // The usual case, on every part's lane choice: no lookup a lane.
            return ((0..lanes).collect(), probe);
        }
        let mut live = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            match self.outages.get_mut(&(peer, lane)) {
                None => live.push(lane),
                Some(state) => match *state {
                    Outage::Avoided { until } if until <= now => {
                        *state = Outage::Probing { since: now };
                        probe.push(lane);
                    }
                    Outage::Probing { since } if now.saturating_duration_since(since) >= probe_again_after => {
                        *state = Outage::Probing { since: now };
                        probe.push(lane);
                    }
                    Outage::Avoided { .. } | Outage::Probing { .. } => {}
                },
            }
        }
        (live, probe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVOID: Duration = Duration::from_secs(30);
    const AGAIN: Duration = Duration::from_secs(11);

    #[test]
    fn a_failed_lane_is_avoided_then_probed_and_used_only_once_connected() {
        let (peer, t0) = (EngineId(5), Instant::now());
        let mut o = LaneOutages::default();
        assert_eq!(o.live(peer, 2, t0, AGAIN), (vec![0, 1], vec![]));
        o.failed(peer, 1, t0, AVOID);
        assert_eq!(o.live(peer, 2, t0 + AVOID / 2, AGAIN), (vec![0], vec![]), "avoided");
        assert_eq!(o.live(peer, 2, t0 + AVOID, AGAIN), (vec![0], vec![1]), "probed once the period ends");
        assert_eq!(o.live(peer, 2, t0 + AVOID, AGAIN), (vec![0], vec![]), "one probe at a time");
        assert_eq!(o.live(EngineId(6), 2, t0 + AVOID, AGAIN), (vec![0, 1], vec![]), "other peers unaffected");
        o.connected(peer, 1);
        assert_eq!(o.live(peer, 2, t0 + AVOID, AGAIN), (vec![0, 1], vec![]), "used again once connected");
    }

    #[test]
    fn a_failed_probe_avoids_again_and_a_lost_one_is_repeated() {
        let (peer, t0) = (EngineId(5), Instant::now());
        let mut o = LaneOutages::default();
        o.failed(peer, 0, t0, AVOID);
        assert_eq!(o.live(peer, 1, t0 + AVOID, AGAIN).1, [0]);
        o.failed(peer, 0, t0 + AVOID + AGAIN / 2, AVOID);
        assert_eq!(o.live(peer, 1, t0 + AVOID + AGAIN, AGAIN), (vec![], vec![]), "avoided again");
        let t1 = t0 + AVOID * 2 + AGAIN / 2;
        assert_eq!(o.live(peer, 1, t1, AGAIN).1, [0]);
        assert_eq!(o.live(peer, 1, t1 + AGAIN, AGAIN).1, [0], "no outcome within the bound: probed again");
        o.connected(EngineId(9), 0);
        assert_eq!(o.live(peer, 1, t1 + AGAIN, AGAIN).0, Vec::<usize>::new(), "another peer's handshake is not ours");
    }

    #[test]
    fn connecting_a_lane_that_is_still_avoided_changes_nothing() {
        let (peer, t0) = (EngineId(5), Instant::now());
        let mut o = LaneOutages::default();
        o.failed(peer, 0, t0, AVOID);
        o.connected(peer, 0);
        assert_eq!(o.live(peer, 1, t0 + AVOID / 2, AGAIN), (vec![], vec![]));
    }
}
