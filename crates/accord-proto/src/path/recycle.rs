//! Entropy recycling: reuse the paths that recently delivered cleanly, spray fresh ones only
//! when none is waiting (the idea of REPS, as in Ultra Ethernet's transport).
//!
//! Random spraying keeps choosing congested paths as often as idle ones; a path whose packet
//! came back acknowledged (no trim, no loss, no ECN mark) was uncongested a round trip ago,
//! so it is a better bet than a random one. Each clean acknowledgement returns its path to a
//! bounded FIFO; the next chunk takes the oldest entry. A path that loses a packet (a trim
//! NACK, a loss) is struck from the FIFO; fresh random paths replace it when the FIFO runs
//! dry. With no feedback yet (the first round trip) it is plain random spraying.

use super::selector::{candidate_count, candidate_nth, PathSelector};
use super::PathTable;
use crate::ids::PathId;
use crate::time::Instant;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// Recycled paths held at most: about a bandwidth-delay product of 8 KiB chunks at 400 Gbit/s
/// and 20 µs, so a sender at full rate finds its acknowledged paths waiting. Older entries
/// beyond this are forgotten (a fresh random path is as good as a stale one).
pub const RECYCLE_PATHS_MAX: usize = 256;

/// The recycling selector's state.
#[derive(Clone, Debug, Default)]
pub struct Recycling {
    clean: VecDeque<PathId>,
    /// Chunks sent on a recycled path and on a fresh one (diagnostics).
    pub recycled_picks: u64,
    pub fresh_picks: u64,
}

impl Recycling {
    /// Paths waiting to be reused.
    pub fn waiting(&self) -> usize {
        self.clean.len()
    }
}

impl PathSelector for Recycling {
    fn select(&mut self, _now: Instant, paths: &PathTable, rng: &mut ChaCha8Rng, avoid: Option<PathId>) -> PathId {
        while let Some(path) = self.clean.pop_front() {
            let usable = paths.get(path).is_some_and(|p| p.is_active()) && Some(path) != avoid;
            if usable {
                self.recycled_picks += 1;
                return path;
            }
        }
        self.fresh_picks += 1;
        let count = candidate_count(paths, avoid).max(1);
        candidate_nth(paths, avoid, rng.gen_range(0..count)).unwrap_or(PathId(0))
    }

    fn on_feedback(&mut self, path: PathId, clean: bool) {
        if clean {
            if self.clean.len() >= RECYCLE_PATHS_MAX {
                self.clean.pop_front();
            }
            self.clean.push_back(path);
        } else {
            self.clean.retain(|&p| p != path);
        }
    }
}
