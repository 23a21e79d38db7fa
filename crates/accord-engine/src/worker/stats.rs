//! What a worker reports and the one byte that wakes it: kept apart from the worker's loop so
//! that the engine's shared state can name them without importing the worker.

/// Marker byte of the datagram that wakes a sleeping worker.
pub(crate) const WAKE_BYTE: u8 = 0xA5;

/// Counters of one worker (one lane), read through [`crate::Engine::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// The protocol endpoint's counters (malformed datagrams and the like included).
    pub endpoint: accord_proto::EndpointStats,
    /// Connections held.
    pub connections: usize,
    /// Transmits dropped because the peer's address for that path is unknown.
    pub tx_no_route: u64,
    /// Datagram batches the datapath refused (errors, not short sends).
    pub tx_errors: u64,
    /// Parts moved to another lane after their connection failed.
    pub failovers: u64,
    /// Connections this lane closed because every path of theirs had been quarantined for
    /// [`crate::LANE_CUT_OFF_AFTER`] while another lane to the peer was live (their parts
    /// failed over at once, see `worker/cutoff.rs`).
    pub lane_cut_offs: u64,
    /// Immediates and messages not counted again because their tag was already seen (the
    /// first copy landed before its connection failed).
    pub duplicates_suppressed: u64,
    /// Sum over connections: packets retransmitted.
    pub retransmits: u64,
    /// Sum over connections: packets declared lost and then acknowledged (late ACKs).
    pub spurious_losses: u64,
    /// Parts resent on a fresh connection of this lane after theirs timed out with the peer
    /// not known dead (an outage longer than the idle timeout; see `crate::tags`).
    pub reconnect_resends: u64,
    /// Parts failed with [`crate::TransferError::PeerUnresponsive`]: resent for
    /// `peer_dead_after` without an answer.
    pub unresponsive_failures: u64,
    /// Sum over connections: packets of operations that had already completed here under
    /// the same tag (resent after a reconnect), acknowledged without being placed.
    pub resent_skipped: u64,
    /// Shared-memory datapath counters (rings attached, datagrams through them).
    pub shm: Option<accord_net::shm::ShmStats>,
    /// Credit this lane's pacer granted to receiver-driven (EQDS) senders, in bytes.
    pub credit_granted_bytes: u64,
    /// Wake datagrams the engine sent this worker: a command came while it slept (a worker
    /// polling while it awaits traffic needs none).
    pub wakes: u64,
    /// Messages written into this engine's control region that no route claims (not a whole
    /// control frame of a known route): counted, never acted on.
    pub control_unrouted: u64,
    /// Where the worker's time went, phase by phase; zero unless `ACCORD_ENGINE_DEBUG` is set.
    pub time: super::phase_clock::WorkerTime,
}
