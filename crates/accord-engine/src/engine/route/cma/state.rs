//! The pull route's state: what a writer knows of each peer, what a receiver verified and
//! served, and the counters. Apart from the route's logic so that the engine's shared state
//! can hold it without importing the route.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::address::EngineId;
use crate::engine::part::Part;
use crate::recent::Recent;

pub use crate::config::CMA_MIN_BYTES_DEFAULT;
/// Pulls a writer has outstanding per engine; a further eligible part goes over the transport.
pub const CMA_PULLS_IN_FLIGHT_MAX: usize = 4096;
/// Writers a receiver remembers as verified.
pub const CMA_VERIFIED_PEERS_MAX: usize = 4096;
/// Pull ids a receiver remembers per writer, to serve a duplicated pull message (a control
/// write resent on another lane after its connection failed) without counting it twice.
pub const CMA_SERVED_REMEMBERED: usize = 8192;

/// The pull ids served for one writer, most recent [`CMA_SERVED_REMEMBERED`].
#[derive(Default)]
pub(crate) struct ServedPulls {
    pub(super) ids: Recent<u64, (), CMA_SERVED_REMEMBERED>,
}

impl ServedPulls {
    /// Records `req`; false if it was served already (a duplicate).
    pub(crate) fn first_time(&mut self, req: u64) -> bool {
        self.ids.insert(req, ())
    }
}

/// Counters of the pull route ([`crate::Engine::cma_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmaStats {
    /// Parts this engine sent as pulls (writer side).
    pub pulls_sent: u64,
    /// Pull bytes that landed at peers (writer side, answered `Done`).
    pub bytes_pulled: u64,
    /// Pulls this engine served (receiver side, bytes copied).
    pub pulls_served: u64,
    /// Parts sent over the transport after a peer answered `Unavailable`.
    pub fallbacks: u64,
    /// Pull messages refused or ignored as malformed, stale or from unknown writers.
    pub refused: u64,
}

/// What a writer knows of one peer's pull route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PeerRoute {
    /// Hello sent, no answer yet: parts go over the transport.
    Asked,
    /// The peer verified us: eligible parts are pulled.
    Verified,
    /// The peer cannot pull from us: transport only.
    Unavailable,
}

/// A part whose pull is outstanding.
pub(super) struct Pending {
    pub(super) part: Part,
    pub(super) deadline: Instant,
}

/// Per-engine state of the route.
pub(crate) struct Cma {
    /// Our engine id at a stable address: what a receiver reads to verify us.
    pub(super) id_cell: Box<u64>,
    pub(super) peers: Mutex<HashMap<EngineId, PeerRoute>>,
    /// Receiver side: writers verified, with the pid they were verified at.
    pub(super) verified: Mutex<HashMap<EngineId, u32>>,
    /// Receiver side: pulls served per writer (duplicates are answered, not run again).
    pub(super) served: Mutex<HashMap<EngineId, ServedPulls>>,
    pub(super) pending: Mutex<HashMap<u64, Pending>>,
    pub(super) pending_count: AtomicUsize,
    pub(super) next_req: AtomicU64,
    pub(super) last_sweep_ns: AtomicU64,
    pub(super) pulls_sent: AtomicU64,
    pub(super) bytes_pulled: AtomicU64,
    pub(super) pulls_served: AtomicU64,
    pub(super) fallbacks: AtomicU64,
    pub(super) refused: AtomicU64,
}

impl Cma {
    pub(crate) fn new(id: EngineId) -> Cma {
        Cma {
            id_cell: Box::new(id.0),
            peers: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
            served: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            pending_count: AtomicUsize::new(0),
            next_req: AtomicU64::new(rand::RngCore::next_u64(&mut rand::rngs::OsRng) >> 1 | 1),
            last_sweep_ns: AtomicU64::new(0),
            pulls_sent: AtomicU64::new(0),
            bytes_pulled: AtomicU64::new(0),
            pulls_served: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> CmaStats {
        CmaStats {
            pulls_sent: self.pulls_sent.load(Ordering::Relaxed),
            bytes_pulled: self.bytes_pulled.load(Ordering::Relaxed),
            pulls_served: self.pulls_served.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}
