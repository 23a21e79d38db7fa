//! A part: one protocol operation of a transfer (a write or a send of one source range to one
//! peer), and the commands a worker is given. Kept apart from the engine's shared state so that
//! routes, the worker and the shared state can all name them without importing one another.

use crate::address::{EngineId, MrDescriptor};
use crate::completion::TransferState;
use crate::error::TransferError;
use crate::memory::Source;
use crate::worker::stats::LaneStats;
use accord_proto::{RegionId, RegionKey};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

/// What a part does at the peer.
#[derive(Copy, Clone, Debug)]
pub(crate) enum PartKind {
    /// One-sided write of the whole source.
    Write { region: RegionId, key: RegionKey, offset: u64, imm: Option<u32> },
    /// Two-sided send of the whole source.
    Send { imm: Option<u32> },
}

/// One protocol operation of a transfer.
pub(crate) struct Part {
    pub(crate) peer: EngineId,
    pub(crate) kind: PartKind,
    pub(crate) source: Source,
    pub(crate) transfer: Arc<TransferState>,
    /// Names this part across connections; kept when it fails over (see `tags`).
    pub(crate) tag: u64,
    /// Lanes tried so far.
    pub(crate) attempts: usize,
    /// When the connection carrying this part was lost without the peer being known dead,
    /// and nothing was heard from the peer since: the part is resent on a fresh connection
    /// until [`crate::EngineConfig::peer_dead_after`] from then (see `Worker::connection_lost`).
    pub(crate) stranded_since: Option<std::time::Instant>,
}

impl Part {
    /// Completes this part, releasing its source first: whoever the completion wakes may reuse
    /// or free the memory at once (the source may be what keeps it alive).
    pub(crate) fn finish(self, result: Result<(), TransferError>) {
        let Part { transfer, source, .. } = self;
        drop(source);
        transfer.part_done(result);
    }
}

/// What a worker is told.
pub(crate) enum Command {
    Submit(Part),
    Stats(SyncSender<LaneStats>),
    /// Per-connection counters (with per-path ones) of this lane, for one peer or all.
    ConnStats(Option<EngineId>, SyncSender<Vec<(Option<EngineId>, accord_proto::ConnectionStats)>>),
    /// A peer on this host was added: set up shared memory to it before the first transfer.
    OfferShm(EngineId),
    /// The lane was avoided for this peer after a failure and the period ended: connect to the
    /// peer (no part), so that the lane carries parts again only once a handshake succeeded.
    Probe(EngineId),
    /// The peer was declared dead: fail its operations in flight and queued.
    PeerDead(EngineId, crate::peer_death::PeerDeath),
    Shutdown,
}

/// The kind of a one-sided write of `dst` at `offset`, counting `imm` at the peer if set.
pub(crate) fn write_kind(dst: &MrDescriptor, offset: u64, imm: Option<u32>) -> PartKind {
    PartKind::Write { region: RegionId(dst.region), key: RegionKey(dst.key), offset, imm }
}
