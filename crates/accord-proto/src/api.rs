//! The sans-IO surface: what goes into an endpoint and what comes out.
//!
//! The driver loop, after any input (`handle_datagram`, `handle_timeout`, an application call):
//! 1. perform the [`Placement`] `handle_datagram` returned, if any (copy the payload bytes);
//! 2. drain [`Endpoint::poll_transmit`](crate::Endpoint::poll_transmit) until `None`, sending
//!    each [`Transmit`] (header bytes, then the named payload bytes);
//! 3. drain [`Endpoint::poll_event`](crate::Endpoint::poll_event) until `None`;
//! 4. arm a timer for [`Endpoint::poll_timeout`](crate::Endpoint::poll_timeout) and call
//!    `handle_timeout` when it expires.
//!
//! Events that announce received data (`ImmReceived`, `RecvCompleted`) are queued while the
//! datagram is handled; step 1 must run before step 3 so the bytes are in place when the
//! application hears of them.

use crate::ids::{ConnectionId, OpId, PathId, RecvBufferId, RegionId, RegionKey};
use crate::path::PathStats;
use crate::send::OpError;
use crate::wire::RejectReason;
use core::ops::Range;
use core::time::Duration;

/// An endpoint's handle on one of its connections (its local connection id).
pub type ConnectionHandle = ConnectionId;

/// What the datapath knows about a received datagram.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct RxMeta {
    /// The local path (entropy port) it arrived on; replies go back on the same path.
    pub path: PathId,
    /// The fabric marked it Congestion Experienced.
    pub ecn_ce: bool,
}

/// The receiver's memory, as the protocol needs to see it: checks before anything is placed.
/// Implemented by the engine over its registration table, and by tests and the simulator over
/// virtual regions.
pub trait LocalMemory {
    /// May `len` bytes at `offset` of `region` be written by a peer holding `key`?
    fn check_write(&self, region: RegionId, key: RegionKey, offset: u64, len: u64) -> Result<(), RejectReason>;

    /// Claims a posted receive buffer for a message of `msg_len` bytes arriving on `conn`.
    fn claim_recv_buffer(&mut self, conn: ConnectionHandle, msg_len: u64) -> Result<RecvBufferId, RejectReason>;

    /// Whether an operation carrying `tag` (never 0) already completed here, on any
    /// connection: its immediate was counted or its message delivered. A sender resends an
    /// operation under its original tag after the connection that carried it was lost (the
    /// acknowledgement may have been all that was lost), so a new connection can bring it
    /// again. The receiver then acknowledges its packets without placing a byte or counting it
    /// again (the memory may have been reused since). The default remembers nothing.
    fn already_completed(&self, tag: u64) -> bool {
        let _ = tag;
        false
    }
}

/// Where received payload bytes go.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PlacementTarget {
    /// Into a registered region (one-sided write), at this byte offset of the region.
    Region { region: RegionId, offset: u64 },
    /// Into a claimed receive buffer (two-sided send), at this byte offset of the buffer.
    RecvBuffer { buffer: RecvBufferId, offset: u64 },
}

/// A copy the driver must perform: `datagram[payload]` to `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub target: PlacementTarget,
    pub payload: Range<usize>,
}

/// What handling one datagram produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatagramOutcome {
    /// The connection it belonged to (new ones included): the driver records the sender's
    /// address for it when it first sees it.
    pub conn: Option<ConnectionHandle>,
    pub placement: Option<Placement>,
}

/// Payload bytes a transmit names instead of carrying: bytes `offset..offset+len` of
/// operation `op` (the driver maps the operation to its source buffer).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PayloadRef {
    pub op: OpId,
    pub offset: u64,
    pub len: u32,
}

/// One datagram to send: the header the protocol wrote into the caller's buffer, then payload.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub conn: ConnectionHandle,
    pub path: PathId,
    /// Bytes of the caller's buffer that hold the header.
    pub header_len: usize,
    pub payload: Option<PayloadRef>,
    /// Data packets may be marked ECT by the datapath.
    pub ecn_capable: bool,
    /// What the driver must still do to seal the datagram once the payload is in place
    /// ([`Transmit::seal_payload`]): the end-to-end check may cover the payload, which the
    /// protocol never sees. Every packet without payload leaves `poll_transmit` sealed.
    pub seal: PendingSeal,
}

/// The part of sealing a transmit left to the driver, because it covers the payload.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum PendingSeal {
    /// Sealed already.
    #[default]
    Done,
    /// A CRC32C over the whole datagram ([`crate::wire::Integrity::Full`]).
    Crc,
    /// A CRC32C over the header only: a datagram that crosses only a shared-memory ring of
    /// this job ([`Transmit::for_local_channel`]).
    HeaderCrc,
    /// A MAC trailer over the whole datagram under this key ([`crate::wire::Integrity::Mac`]).
    Mac(crate::wire::MacKey),
}

impl Transmit {
    /// Total datagram length: header, payload and the MAC trailer if the seal adds one.
    pub fn datagram_len(&self) -> usize {
        self.payload_end() + if matches!(self.seal, PendingSeal::Mac(_)) { crate::wire::MAC_TAG_LEN } else { 0 }
    }

    /// Where the payload ends within the datagram: the driver gathers it into
    /// `header_len..payload_end()`.
    pub fn payload_end(&self) -> usize {
        self.header_len + self.payload.map_or(0, |p| p.len as usize)
    }

    /// Completes the seal over the whole datagram (header the protocol wrote, payload the
    /// driver gathered, room for a trailer: `datagram_len` bytes). A no-op when the seal is
    /// done, so drivers call it on every transmit.
    pub fn seal_payload(&self, datagram: &mut [u8]) {
        match &self.seal {
            PendingSeal::Done => {}
            PendingSeal::Crc => crate::wire::seal(datagram, crate::wire::Integrity::Full),
            PendingSeal::HeaderCrc => crate::wire::seal(datagram, crate::wire::Integrity::Header),
            PendingSeal::Mac(key) => crate::wire::seal_mac(datagram, key),
        }
    }

    /// This transmit re-sealed for a datagram that goes through a shared-memory ring of this
    /// job instead of a network: a payload-covering seal (CRC or MAC) becomes a CRC of the
    /// header alone, and the MAC trailer is dropped. Why: ring files are mode 0600 and belong
    /// to the job's own processes, so nothing corrupts or forges a payload in them, and the
    /// full check would cost the ring's throughput; the header still decides where bytes go,
    /// so it stays checked. The receiver accepts the header-only seal only from a ring
    /// (`Endpoint::handle_local_datagram`), never from a network.
    pub fn for_local_channel(mut self) -> Transmit {
        if matches!(self.seal, PendingSeal::Crc | PendingSeal::Mac(_)) {
            self.seal = PendingSeal::HeaderCrc;
        }
        self
    }
}

/// A one-sided write: `len` bytes of the sender's operation go to `region` at `offset` on the
/// peer, optionally followed by an immediate the peer counts when all bytes are placed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WriteRequest {
    pub region: RegionId,
    pub key: RegionKey,
    pub offset: u64,
    pub len: u64,
    pub imm: Option<u32>,
    /// Opaque name of the operation across connections (0: none), reported with the peer's
    /// `ImmReceived`/`RecvCompleted`. A sender that may resend an operation on another
    /// connection (failover) gives both copies one tag so the receiver can count it once.
    pub tag: u64,
}

/// A two-sided send of `len` bytes into one of the peer's posted buffers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SendRequest {
    pub len: u64,
    pub imm: Option<u32>,
    /// As [`WriteRequest::tag`].
    pub tag: u64,
}

/// Why a connection ended abnormally.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionError {
    #[error("handshake got no answer in {waited:?} ({attempts} attempts): is the peer running and reachable?")]
    HandshakeTimeout { attempts: u32, waited: Duration },
    #[error("peer stopped acknowledging for {0:?}: it died, or every path to it is cut")]
    IdleTimeout(Duration),
}

/// Something the application should hear about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Our `connect` completed.
    Connected { conn: ConnectionHandle },
    /// A peer opened a connection to us.
    Accepted { conn: ConnectionHandle },
    /// The connection failed; every outstanding operation completed with an error first.
    ConnectionFailed { conn: ConnectionHandle, error: ConnectionError },
    /// The connection was closed (by us or the peer).
    Closed { conn: ConnectionHandle },
    /// A write or send we submitted completed: acknowledged in full, or failed.
    OpCompleted { conn: ConnectionHandle, op: OpId, result: Result<(), OpError> },
    /// Every byte of a peer's write with immediate `imm` was placed.
    ImmReceived { conn: ConnectionHandle, op: OpId, imm: u32, tag: u64 },
    /// A peer's send filled `len` bytes of `buffer`.
    RecvCompleted { conn: ConnectionHandle, op: OpId, buffer: RecvBufferId, len: u64, imm: Option<u32>, tag: u64 },
    /// A path stopped delivering and is now only probed.
    PathQuarantined { conn: ConnectionHandle, path: PathId },
    /// A quarantined path answered a probe and carries traffic again.
    PathRevived { conn: ConnectionHandle, path: PathId },
}

/// Counters of one connection, readable at any time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConnectionStats {
    pub cc: &'static str,
    pub bytes_sent: u64,
    pub bytes_acked: u64,
    pub packets_sent: u64,
    pub packets_retransmitted: u64,
    pub packets_lost: u64,
    /// Of `packets_lost`, those whose earlier transmission was acknowledged after all: before
    /// the retransmission went out, or by an acknowledgement echoing the first copy (a timeout
    /// that fired on a late acknowledgement; see `PathStats::spurious_losses`).
    pub packets_lost_spurious: u64,
    pub acks_sent: u64,
    pub acks_received: u64,
    pub packets_received: u64,
    pub bytes_placed: u64,
    pub duplicates_received: u64,
    pub packets_refused: u64,
    /// Data packets dropped without acknowledgement (beyond the window, table full, malformed
    /// operation fields); the sender retransmits them.
    pub packets_dropped: u64,
    pub ecn_ce_received: u64,
    pub window_bytes: u64,
    pub bytes_in_flight: u64,
    /// Data headers whose payload the fabric trimmed (receiver side).
    pub trimmed_received: u64,
    /// Packets the peer NACKed after a trim (sender side).
    pub nacks_received: u64,
    /// Receiver-driven credit granted to the peer and received from it, in bytes.
    pub credit_sent_bytes: u64,
    pub credit_received_bytes: u64,
    /// Requests to send sent (a receiver-driven sender waited for credit too long) and received.
    pub rts_sent: u64,
    pub rts_received: u64,
    /// Data packets of an operation that had already completed here under the same tag (resent
    /// after a reconnect), acknowledged without being placed or counted again.
    pub resent_skipped: u64,
    /// Times a packet was sent with the window already full. An invariant: always zero.
    pub window_overruns: u64,
    /// Frames that resolved nothing (an ACK of nothing outstanding, the answer to no
    /// outstanding probe, a NACK of nothing in flight, a repeated HelloAck) and so changed
    /// nothing: late duplicates, replays. See the stale-frame rule in the crate doc.
    pub stale_frames: u64,
    pub rtt_min: Duration,
    pub rtt_smoothed: Duration,
    pub ops_outstanding: u64,
    pub paths: Vec<PathStats>,
}

/// Counters of an endpoint: what could not be attributed to a connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    pub datagrams_received: u64,
    pub datagrams_sent: u64,
    /// Failed to parse (truncated, wrong version, bad fields).
    pub malformed: u64,
    /// Addressed to a connection id we do not have.
    pub unknown_connection: u64,
    /// Right connection id, wrong token.
    pub bad_token: u64,
    /// Hellos refused because the connection table is full.
    pub connections_refused: u64,
    /// End-to-end checksum mismatches (corrupted on the way); the sender retransmits.
    pub bad_checksum: u64,
    /// Sealed in another integrity mode than this endpoint checks (a rank configured
    /// differently, or a corrupted mode byte).
    pub integrity_mismatch: u64,
    /// Hellos and HelloAcks without a valid proof of the job secret (see
    /// [`crate::admission`]); refused before anything was allocated.
    pub unadmitted: u64,
    /// Packets whose MAC tag failed ([`crate::wire::Integrity::Mac`]): forged, corrupted, or
    /// replayed from another connection or direction. Refused before anything was read.
    pub bad_tag: u64,
    /// Datagrams lent in place from a shared-memory ring with a seal that covers a payload
    /// the receiver did not copy, so only the ring's own checks stood for them (a datagram
    /// sealed before its ring came up; senders seal ring datagrams header-only).
    pub local_unverified: u64,
}
