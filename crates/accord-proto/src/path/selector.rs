//! Path selection: which path carries the next chunk.

use super::PathTable;
use crate::ids::PathId;
use crate::time::Instant;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The path-selection hook. `avoid` names a path the caller would rather not use (the one a
/// retransmitted packet was lost on) when another is available.
pub trait PathSelector: core::fmt::Debug + Send {
    fn select(&mut self, now: Instant, paths: &PathTable, rng: &mut ChaCha8Rng, avoid: Option<PathId>) -> PathId;

    /// Feedback on one path: `clean` when an acknowledgement covered packets sent on it with
    /// no congestion mark, false when a packet on it was trimmed or lost. Default: ignored.
    fn on_feedback(&mut self, _path: PathId, _clean: bool) {}
}

/// Candidates for a selection: the active paths other than `avoid`; failing that, the active
/// paths; failing that (every path quarantined), all paths, so traffic still flows somewhere.
/// Number of candidates and the `index`-th of them. With no path quarantined (the common case)
/// both are arithmetic; otherwise they walk the table.
pub(super) fn candidate_count(paths: &PathTable, avoid: Option<PathId>) -> usize {
    if paths.quarantined_count() == 0 {
        let n = paths.len();
        return match avoid {
            Some(a) if (a.0 as usize) < n && n > 1 => n - 1,
            _ => n,
        };
    }
    candidates(paths, avoid).count()
}

pub(super) fn candidate_nth(paths: &PathTable, avoid: Option<PathId>, index: usize) -> Option<PathId> {
    if paths.quarantined_count() == 0 {
        let n = paths.len();
        let skip = match avoid {
            Some(a) if (a.0 as usize) < n && n > 1 => Some(a.0 as usize),
            _ => None,
        };
        let i = if skip.is_some_and(|a| index >= a) { index + 1 } else { index };
        return (i < n).then_some(PathId(i as u16));
    }
    candidates(paths, avoid).nth(index)
}

fn candidates(paths: &PathTable, avoid: Option<PathId>) -> impl Iterator<Item = PathId> + '_ {
    let active_other = paths.iter().filter(|p| p.is_active() && Some(p.id) != avoid).count();
    let active = paths.active_count();
    paths
        .iter()
        .filter(move |p| {
            if active_other > 0 {
                p.is_active() && Some(p.id) != avoid
            } else if active > 0 {
                p.is_active()
            } else {
                true
            }
        })
        .map(|p| p.id)
}

/// Power-of-two choices on path cost (RTT, age of the oldest outstanding packet, loss).
#[derive(Copy, Clone, Debug, Default)]
pub struct PowerOfTwoChoices;

impl PathSelector for PowerOfTwoChoices {
    fn select(&mut self, now: Instant, paths: &PathTable, rng: &mut ChaCha8Rng, avoid: Option<PathId>) -> PathId {
        let count = candidate_count(paths, avoid);
        debug_assert!(count > 0);
        let first = rng.gen_range(0..count);
        let mut second = rng.gen_range(0..count);
        if count > 1 && second == first {
            second = (first + 1) % count;
        }
        let a = candidate_nth(paths, avoid, first).unwrap_or(PathId(0));
        let b = candidate_nth(paths, avoid, second).unwrap_or(a);
        let cost = |id: PathId| paths.get(id).map(|p| p.selection_cost(now)).unwrap_or_default();
        if cost(b) < cost(a) {
            b
        } else {
            a
        }
    }
}

/// Each active path in turn.
#[derive(Copy, Clone, Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl PathSelector for RoundRobin {
    fn select(&mut self, _now: Instant, paths: &PathTable, _rng: &mut ChaCha8Rng, avoid: Option<PathId>) -> PathId {
        let count = candidate_count(paths, avoid);
        let pick = candidate_nth(paths, avoid, self.next % count.max(1)).unwrap_or(PathId(0));
        self.next = self.next.wrapping_add(1);
        pick
    }
}
