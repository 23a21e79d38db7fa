//! Errors, one enum per family of operations; every message says what to do.

use accord_proto::wire::RejectReason;

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A setting is out of range.
    #[error("invalid engine configuration: {0}")]
    Invalid(String),
    /// An `ACCORD_*` variable could not be parsed.
    #[error("environment override {0}: fix or unset it")]
    Knob(#[from] accord_knobs::KnobError),
    /// A NIC's sockets could not be opened.
    #[error("opening NIC {nic}: {source}: check the address is assigned to this host")]
    Datapath {
        /// Index of the NIC.
        nic: usize,
        /// The driver's error.
        source: accord_net::DatapathError,
    },
    /// A thread could not be started.
    #[error("starting a thread: {0}: the process may be out of resources")]
    Thread(std::io::Error),
}

/// Why memory could not be registered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegisterError {
    /// Zero-length or oversized region.
    #[error("cannot register {len} bytes: regions must be 1..={max} bytes")]
    BadLength {
        /// Asked length.
        len: u64,
        /// Largest allowed.
        max: u64,
    },
    /// The region table is full.
    #[error("{0} regions already registered: deregister some first")]
    TableFull(usize),
    /// The allocator refused.
    #[error("could not allocate {0} bytes: free memory or ask for less")]
    OutOfMemory(usize),
    /// Device memory could not be registered (no CUDA driver, bad device, not device memory).
    #[error("cannot register device memory: {0}")]
    Device(String),
    /// A shared-memory region file could not be made (directory missing, full, not writable).
    #[error("cannot allocate shared host memory: {0}; check ACCORD_SHM_DIR (default /dev/shm) and its free space")]
    Shared(String),
}

/// Why a transfer was refused at submission (nothing was sent).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    /// The source range falls outside the local region.
    #[error("source bytes {offset}..{offset}+{len} fall outside the local region of {region_len} bytes: fix the offset or length")]
    SourceOutOfBounds {
        /// Offset in the source region.
        offset: u64,
        /// Length of the transfer.
        len: u64,
        /// Length of the source region.
        region_len: u64,
    },
    /// The destination range falls outside the remote region (as its descriptor states).
    #[error("destination bytes {offset}..{offset}+{len} fall outside the remote region of {region_len} bytes: fix the offset or length")]
    DestinationOutOfBounds {
        /// Offset in the destination region.
        offset: u64,
        /// Length of the transfer.
        len: u64,
        /// Length of the destination region.
        region_len: u64,
    },
    /// The local handle is not (or no longer) registered with this engine.
    #[error("the source region is not registered with this engine: register it first")]
    UnknownSource,
    /// The destination engine was never introduced.
    #[error("engine {0:x} is unknown: call add_peer with its address first")]
    UnknownPeer(u64),
    /// Bad arguments (page lists of different length, zero page size, ...).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The engine is shutting down.
    #[error("the engine is shutting down: submit to a live engine")]
    ShutDown,
}

/// Why a submitted transfer failed.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum TransferError {
    /// The receiver refused the write (unknown or deregistered region, wrong key, bounds):
    /// nothing was placed.
    #[error("the receiver refused it: {0:?}: check the descriptor is current (region registered, key right)")]
    Rejected(RejectReason),
    /// Every NIC to the peer failed.
    #[error("the peer stopped answering on every NIC: is it alive and reachable?")]
    PeerUnreachable,
    /// The peer was declared dead (its process exited, or it answered no keepalive probe):
    /// see [`crate::PeerDeath`].
    #[error("peer engine {:x} is dead: {cause}", peer.0)]
    PeerDied {
        /// The peer.
        peer: crate::EngineId,
        /// Why it was declared dead.
        cause: crate::PeerDeath,
    },
    /// Nothing reached the peer for `waited_ms` after the connection carrying this transfer
    /// was lost (its idle timeout), though the peer was not known dead: every fresh connection
    /// to it went unanswered for [`crate::EngineConfig::peer_dead_after`]. The path to it is
    /// down, or it is stopped. Outages shorter than that heal by themselves.
    #[error(
        "engine {:x} stopped answering: nothing for {waited_ms} ms after its connection timed out (reconnecting got \
         no answer); the path to it is down, or it is stopped. ACCORD_PEER_DEAD_MS bounds the outages that heal",
        peer.0
    )]
    PeerUnresponsive {
        /// The peer.
        peer: crate::EngineId,
        /// How long the transfer was resent without an answer.
        waited_ms: u64,
    },
    /// The engine shut down first.
    #[error("the engine shut down before the transfer completed")]
    ShutDown,
    /// [`crate::Transfer::wait_timeout`] gave up.
    #[error("not complete within the timeout: wait longer, or check the peer")]
    Timeout,
    /// A READ's owner did not answer within the read's bound (it died, or its answer was lost):
    /// the destination range may hold some of the bytes, or none.
    #[error("engine {peer:x} did not answer the read within {waited_ms} ms: is it alive, and did it add this engine as a peer?")]
    NoReply {
        /// The engine read from.
        peer: u64,
        /// How long the reader waited.
        waited_ms: u64,
    },
}

/// Why an address or descriptor could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error("malformed {what}: {source}: pass the exact string the peer produced")]
pub struct ParseError {
    pub(crate) what: &'static str,
    pub(crate) source: serde_json::Error,
}

/// Why a barrier failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BarrierError {
    /// Sending to a member failed.
    #[error("barrier notification failed: {0}")]
    Submit(#[from] SubmitError),
    /// A member's notification failed.
    #[error("barrier notification failed: {0}")]
    Transfer(#[from] TransferError),
    /// Not every member arrived in time.
    #[error("barrier timed out: {arrived} of {expected} peers arrived: check the missing peers")]
    Timeout {
        /// Peers seen.
        arrived: u64,
        /// Peers expected.
        expected: u64,
    },
}

/// A local copy into or out of an engine-owned buffer fell outside it.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
#[error("bytes {offset}..{offset}+{len} fall outside the {region_len}-byte buffer: fix the offset or length")]
pub struct RangeError {
    /// Offset asked for.
    pub offset: u64,
    /// Length asked for.
    pub len: u64,
    /// Length of the buffer.
    pub region_len: u64,
}
