//! READ's state and wire outcomes: what a reader has outstanding, what an owner served, and
//! the counters. Apart from the route's logic so that the engine's shared state can hold it
//! without importing the route: this file, and the batched READ's assemblies and write-back
//! queue it holds, import only files that never reach the shared state (no import circle).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use accord_proto::wire::RejectReason;

use crate::address::EngineId;
use crate::completion::TransferState;
use crate::error::TransferError;
use crate::recent::Recent;

/// Request ids an owner remembers per reader, to take a duplicated request frame (a control
/// write resent on another lane after its connection failed) once.
pub const READ_SERVED_REMEMBERED: usize = 8192;

/// Counters of READ ([`crate::Engine::read_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Reads this engine sent to peers in other processes (reader side).
    pub requests_sent: u64,
    /// Reads this engine served: source checked and its write started (owner side).
    pub requests_served: u64,
    /// Duplicated request frames taken once (owner side).
    pub duplicates: u64,
    /// Frames refused or ignored: malformed, from an unknown engine, a refused source, a reply
    /// for no pending read.
    pub refused: u64,
    /// Reads failed because their owner did not answer in time (reader side).
    pub unanswered: u64,
    /// Reads into device memory written through the reader's announced IPC handle rather than
    /// landed (owner side; see `route::read::dst_info`).
    pub device_destinations_mapped: u64,
}

/// What an owner answers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every byte landed in the reader's destination.
    Done,
    /// The owner's write into the destination failed other than by a refusal.
    WriteFailed,
    /// Refused: the source (by the owner) or the destination (by the reader's receiver).
    Refused(RejectReason),
}

impl Outcome {
    pub(super) fn code(self) -> u32 {
        match self {
            Outcome::Done => 0,
            Outcome::WriteFailed => 1,
            // A refusal takes the code a refused packet's ACK carries, shifted past ours.
            Outcome::Refused(r) => 2u32.saturating_add(r.to_u32()),
        }
    }

    pub(super) fn from_code(code: u32) -> Outcome {
        match code {
            0 => Outcome::Done,
            1 => Outcome::WriteFailed,
            c => Outcome::Refused(RejectReason::from_u32(c - 2)),
        }
    }

    pub(super) fn result(self) -> Result<(), TransferError> {
        match self {
            Outcome::Done => Ok(()),
            Outcome::WriteFailed => Err(TransferError::PeerUnreachable),
            Outcome::Refused(r) => Err(TransferError::Rejected(r)),
        }
    }
}

/// What an owner knows of one request id of one reader.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Not seen: serve it.
    New,
    /// Being served: its reply will come; do nothing.
    InFlight,
    /// Served: answer this again, write nothing.
    Answered(Outcome),
}

/// The request ids an owner took from one reader, most recent [`READ_SERVED_REMEMBERED`]: each
/// in flight (`None`) or answered.
#[derive(Default)]
pub(crate) struct ServedReads {
    pub(super) outcomes: Recent<u64, Option<Outcome>, READ_SERVED_REMEMBERED>,
}

impl ServedReads {
    /// Takes `req`: what to do with it (a new id is remembered as in flight).
    pub(crate) fn admit(&mut self, req: u64) -> Admission {
        if let Some(known) = self.outcomes.get(&req) {
            return known.map_or(Admission::InFlight, Admission::Answered);
        }
        self.outcomes.insert(req, None);
        Admission::New
    }

    /// What is known of `req` without taking it: `None` if not seen, `Some(None)` while served,
    /// `Some(Some(outcome))` once answered.
    pub(crate) fn known(&self, req: u64) -> Option<Option<Outcome>> {
        self.outcomes.get(&req).copied()
    }

    /// Records the outcome of `req` (if still remembered).
    pub(crate) fn answered(&mut self, req: u64, outcome: Outcome) {
        if let Some(slot) = self.outcomes.get_mut(&req) {
            *slot = Some(outcome);
        }
    }
}

/// A reader's read outstanding at a peer.
pub(super) struct Pending {
    pub(super) peer: EngineId,
    pub(super) transfer: Arc<TransferState>,
    pub(super) imm: Option<u32>,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
}

/// Per-engine state of READ (both sides).
pub(crate) struct ReadState {
    pub(super) pending: Mutex<HashMap<u64, Pending>>,
    pub(super) pending_count: AtomicUsize,
    pub(super) next_req: AtomicU64,
    pub(super) last_sweep_ns: AtomicU64,
    /// Owner side: request ids taken per reader.
    pub(super) served: Mutex<HashMap<EngineId, ServedReads>>,
    pub(super) requests_sent: AtomicU64,
    pub(super) requests_served: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) unanswered: AtomicU64,
    pub(super) device_destinations_mapped: AtomicU64,
    /// Announced device destinations, both sides.
    pub(super) dst_infos: super::dst_info::DstInfos,
    /// Owner side: batched requests whose frames are arriving.
    pub(super) assemblies: Mutex<super::paged::assembly::Assemblies>,
    /// Owner side: batched requests being written back.
    pub(super) write_backs: super::paged::write_back::WriteBacks,
}

impl Default for ReadState {
    fn default() -> Self {
        ReadState {
            pending: Mutex::new(HashMap::new()),
            pending_count: AtomicUsize::new(0),
            // A random start, so ids of an engine that restarted under the same id space do not
            // collide with ids an owner still remembers.
            next_req: AtomicU64::new(crate::memory::random_u64() >> 1 | 1),
            last_sweep_ns: AtomicU64::new(0),
            served: Mutex::new(HashMap::new()),
            requests_sent: AtomicU64::new(0),
            requests_served: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            unanswered: AtomicU64::new(0),
            device_destinations_mapped: AtomicU64::new(0),
            dst_infos: Default::default(),
            assemblies: Default::default(),
            write_backs: Default::default(),
        }
    }
}

impl ReadState {
    pub(crate) fn stats(&self) -> ReadStats {
        ReadStats {
            requests_sent: self.requests_sent.load(Ordering::Relaxed),
            requests_served: self.requests_served.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            unanswered: self.unanswered.load(Ordering::Relaxed),
            device_destinations_mapped: self.device_destinations_mapped.load(Ordering::Relaxed),
        }
    }
}
