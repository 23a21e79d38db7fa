//! Per-path loss deadlines with the earliest one at hand.
//!
//! Every path with packets outstanding has a retransmission deadline (its oldest outstanding
//! packet's send time plus the path's RTO). `poll_timeout` needs the earliest over all paths
//! after every input, and with 256 paths a scan per call dominated a 1024-host simulation. This
//! is a tournament tree over the paths: setting one path's deadline walks one leaf-to-root line
//! (8 steps for 256 paths), and the earliest is the root. The connection updates a path's entry
//! whenever that path's oldest outstanding packet or its RTO may have changed; an entry that is
//! early (stale) only costs a timer pass that finds nothing, and the connection's invariant
//! check compares every entry with a fresh computation.

use crate::ids::PathId;
use crate::time::Instant;

/// Tournament tree of per-path deadlines (`u64::MAX`: none).
#[derive(Clone, Debug)]
pub struct PathDeadlines {
    /// Leaves padded to a power of two.
    leaves: usize,
    /// Heap-ordered nodes: `nodes[1]` is the root, leaf `i` is `nodes[leaves + i]`; each inner
    /// node holds the minimum of its two children.
    nodes: Vec<u64>,
    /// A copy of `nodes[1]` beside the struct: `poll_timeout` reads it after every input and
    /// the nodes' line is usually cold.
    root: u64,
}

const NONE: u64 = u64::MAX;

impl PathDeadlines {
    /// A tree for `path_count` paths, all without a deadline.
    pub fn new(path_count: u16) -> Self {
        let leaves = (path_count.max(1) as usize).next_power_of_two();
        PathDeadlines { leaves, nodes: vec![NONE; 2 * leaves], root: NONE }
    }

    /// Sets (or clears) the deadline of `path`. Paths outside the table are ignored.
    pub fn set(&mut self, path: PathId, deadline: Option<Instant>) {
        let i = path.0 as usize;
        if i >= self.leaves {
            return;
        }
        let value = deadline.map_or(NONE, Instant::as_nanos);
        let mut node = self.leaves + i;
        if self.nodes[node] == value {
            return;
        }
        self.nodes[node] = value;
        while node > 1 {
            node /= 2;
            let min = self.nodes[2 * node].min(self.nodes[2 * node + 1]);
            if self.nodes[node] == min {
                return; // ancestors, the root included, already hold the right minimum
            }
            self.nodes[node] = min;
        }
        self.root = self.nodes[1];
    }

    /// The deadline of `path`.
    pub fn get(&self, path: PathId) -> Option<Instant> {
        let v = *self.nodes.get(self.leaves + path.0 as usize)?;
        (v != NONE).then_some(Instant::from_nanos(v))
    }

    /// The earliest deadline and its path.
    pub fn earliest(&self) -> Option<(PathId, Instant)> {
        let v = self.root;
        if v == NONE {
            return None;
        }
        let mut node = 1;
        while node < self.leaves {
            node = if self.nodes[2 * node] == v { 2 * node } else { 2 * node + 1 };
        }
        Some((PathId((node - self.leaves) as u16), Instant::from_nanos(v)))
    }

    /// The earliest deadline.
    pub fn earliest_at(&self) -> Option<Instant> {
        debug_assert_eq!(self.root, self.nodes[1]);
        let v = self.root;
        (v != NONE).then_some(Instant::from_nanos(v))
    }

    /// Clears every deadline.
    pub fn clear(&mut self) {
        self.nodes.fill(NONE);
        self.root = NONE;
    }
}
