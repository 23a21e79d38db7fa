//! Which peers died, who is waiting on whom, and which processes the watcher must open:
//! the state the engine's shared state holds, kept apart from the watcher that fills it.

use crate::address::EngineId;
use crate::peer_death::PeerDeath;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

/// A process to watch: the peer, its pid and its advertised start time.
pub(super) struct ProcessWatch {
    pub(super) peer: EngineId,
    pub(super) pid: u32,
    pub(super) start_ticks: u64,
}

/// The engine's liveness state, shared by its API, workers and watcher thread.
#[derive(Default)]
pub(crate) struct Liveness {
    pub(super) dead: RwLock<HashMap<EngineId, PeerDeath>>,
    /// Whether `dead` holds anything: the common case (nobody died) costs one load.
    pub(super) any_dead: AtomicBool,
    /// Peers named by a wait now, with how many waits name them.
    pub(super) watched: Mutex<HashMap<EngineId, usize>>,
    /// Same-host processes the watcher has yet to open pidfds for.
    pub(super) new_processes: Mutex<Vec<ProcessWatch>>,
    pub(super) stop: AtomicBool,
}

impl Liveness {
    /// Why `peer` was declared dead, if it was.
    pub(crate) fn death(&self, peer: EngineId) -> Option<PeerDeath> {
        if !self.any_dead.load(Ordering::Acquire) {
            return None;
        }
        self.dead.read().unwrap().get(&peer).copied()
    }

    /// Every peer declared dead.
    pub(crate) fn deaths(&self) -> Vec<(EngineId, PeerDeath)> {
        let mut v: Vec<_> = self.dead.read().unwrap().iter().map(|(k, v)| (*k, *v)).collect();
        v.sort_unstable_by_key(|(k, _)| *k);
        v
    }

    /// Asks the watcher to watch a same-host peer's process.
    pub(crate) fn watch_process(&self, peer: EngineId, pid: u32, start_ticks: u64) {
        if start_ticks != 0 {
            self.new_processes.lock().unwrap().push(ProcessWatch { peer, pid, start_ticks });
        }
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    pub(super) fn add_interest(&self, peer: EngineId) {
        *self.watched.lock().unwrap().entry(peer).or_insert(0) += 1;
    }

    pub(super) fn drop_interest(&self, peer: EngineId) {
        let mut watched = self.watched.lock().unwrap();
        if let Some(n) = watched.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                watched.remove(&peer);
            }
        }
    }
}
