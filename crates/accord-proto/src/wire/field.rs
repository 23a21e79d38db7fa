//! Byte offsets of every field of every packet, in one place.
//!
//! All offsets are absolute (from the first byte of the datagram), so a reader can check any
//! accessor in [`super::Packet`] against this table alone. Body offsets are written as
//! `BODY + n` with `n` the offset the design table gives within the body.

/// A byte range within a datagram.
pub type Field = core::ops::Range<usize>;

/// Offset of the body: the common header is 20 bytes.
const BODY: usize = 20;

// ---- Common header (every packet) ----

/// Wire version; a receiver drops anything it does not speak.
pub const VERSION: usize = 0;
/// Packet type, see [`super::PacketType`].
pub const TYPE: usize = 1;
/// Type-specific flags, see [`flags`].
pub const FLAGS: usize = 2;
/// Integrity mode the sender sealed the packet with (see [`super::Integrity`]); covered by
/// the CRC, and a receiver accepts only its own mode.
pub const INTEGRITY: usize = 3;
/// Receiver's connection id, for demultiplexing before any other work.
pub const DST_CONN: Field = 4..8;
/// Receiver's per-connection random token, so off-path packets are dropped cheaply.
pub const TOKEN: Field = 8..16;
/// CRC32C over the header and (in `Integrity::Full`) the payload, this field skipped.
pub const CRC: Field = 16..20;
/// First byte after the common header.
pub const HEADER_END: usize = BODY;

// ---- Hello / HelloAck ----

/// Sender's own connection id: where the peer must address replies.
pub const HELLO_SRC_CONN: Field = BODY..BODY + 4;
/// Sender's own token: the peer must echo it in every later header.
pub const HELLO_SRC_TOKEN: Field = BODY + 4..BODY + 12;
/// Largest data payload the sender accepts.
pub const HELLO_MAX_PAYLOAD_BYTES: Field = BODY + 12..BODY + 14;
/// Number of paths the sender is willing to use.
pub const HELLO_PATH_COUNT: Field = BODY + 14..BODY + 16;
/// Receive window the sender grants, in packets.
pub const HELLO_RECV_WINDOW_PACKETS: Field = BODY + 16..BODY + 20;
/// Proof of the job secret: a truncated HMAC-SHA256 over the packet's addressing and fields
/// (see `crate::admission`); zero when the job has no secret.
pub const HELLO_PROOF: Field = BODY + 20..BODY + 36;
/// Exact length of a Hello / HelloAck datagram.
pub const HELLO_END: usize = BODY + 36;

// ---- Data ----

/// Packet sequence number.
pub const DATA_PSN: Field = BODY..BODY + 8;
/// Sender's lowest unresolved psn: lets the receiver forget state below it.
pub const DATA_ACK_FLOOR: Field = BODY + 8..BODY + 16;
/// Sender clock at transmission, echoed in the Ack for RTT samples.
pub const DATA_TX_TIME_NS: Field = BODY + 16..BODY + 24;
/// Operation the payload belongs to.
pub const DATA_OP: Field = BODY + 24..BODY + 32;
/// Operation kind: 1 Write, 2 Send.
pub const DATA_KIND: usize = BODY + 32;
/// Reserved byte in the data body.
pub const DATA_RESERVED: usize = BODY + 33;
/// Payload length; must equal the datagram length minus [`DATA_PAYLOAD`].
pub const DATA_PAYLOAD_LEN: Field = BODY + 34..BODY + 36;
/// Immediate value, meaningful only with [`flags::HAS_IMM`].
pub const DATA_IMM: Field = BODY + 36..BODY + 40;
/// Total bytes of the operation.
pub const DATA_MSG_LEN: Field = BODY + 40..BODY + 48;
/// Offset of this payload within the operation.
pub const DATA_MSG_OFFSET: Field = BODY + 48..BODY + 56;
/// Destination region (Write only).
pub const DATA_REGION_ID: Field = BODY + 56..BODY + 60;
/// Reserved word in the data body.
pub const DATA_RESERVED2: Field = BODY + 60..BODY + 64;
/// Remote key authorising the write (Write only).
pub const DATA_REGION_KEY: Field = BODY + 64..BODY + 72;
/// Destination offset of the operation's byte 0 (Write only).
pub const DATA_REGION_OFFSET: Field = BODY + 72..BODY + 80;
/// Sender-chosen operation tag (opaque, identical in every packet of the operation). It
/// names the operation across connections, so a receiver can count an immediate once even when
/// a sender resends the operation on another connection after a failover.
pub const DATA_TAG: Field = BODY + 80..BODY + 88;
/// First payload byte.
pub const DATA_PAYLOAD: usize = BODY + 88;

// ---- Ack ----

/// Every psn below this is resolved at the receiver.
pub const ACK_CUM_ACK: Field = BODY..BODY + 8;
/// Psn of the data packet that triggered this ack.
pub const ACK_ECHO_PSN: Field = BODY + 8..BODY + 16;
/// That packet's `tx_time_ns`, echoed for an RTT sample without sender state.
pub const ACK_ECHO_TX_TIME_NS: Field = BODY + 16..BODY + 24;
/// Time the receiver held the packet before acking, subtracted from the RTT sample.
pub const ACK_DELAY_NS: Field = BODY + 24..BODY + 28;
/// Cumulative count of CE-marked data packets received (wraps).
pub const ACK_ECN_CE_COUNT: Field = BODY + 28..BODY + 32;
/// Receiver-driven credit in bytes (0 when unused).
pub const ACK_CREDIT_BYTES: Field = BODY + 32..BODY + 36;
/// Length in bytes of the SACK bitmap that follows the fixed part.
pub const ACK_SACK_LEN_BYTES: Field = BODY + 36..BODY + 38;
/// Number of rejection entries after the bitmap.
pub const ACK_REJECTION_COUNT: usize = BODY + 38;
/// Reserved byte in the ack body.
pub const ACK_RESERVED: usize = BODY + 39;
/// First byte of the SACK bitmap (end of the fixed part of an Ack).
pub const ACK_SACK: usize = BODY + 40;

/// Fields of one rejection entry, relative to the entry's first byte.
pub mod rejection {
    use super::Field;
    /// Rejected data packet's psn.
    pub const PSN: Field = 0..8;
    /// Operation the rejected packet belonged to.
    pub const OP: Field = 8..16;
    /// Reason code, see [`crate::wire::RejectReason`].
    pub const REASON: Field = 16..20;
    /// Reserved word.
    pub const RESERVED: Field = 20..24;
    /// Length of one entry.
    pub const LEN: usize = 24;
}

// ---- Probe / ProbeAck ----

/// Probe identifier, echoed by the ProbeAck.
pub const PROBE_ID: Field = BODY..BODY + 8;
/// Sender clock at transmission, echoed for an RTT sample.
pub const PROBE_TX_TIME_NS: Field = BODY + 8..BODY + 16;
/// Exact length of a Probe / ProbeAck datagram.
pub const PROBE_END: usize = BODY + 16;

// ---- Credit (receiver-driven congestion control, EQDS) ----

/// Bytes of new permission to send that the receiver's pacer grants.
pub const CREDIT_BYTES: Field = BODY..BODY + 4;
/// Sequence number of the Credit frame (1, 2, ... per connection), so a replayed or
/// duplicated frame grants nothing twice.
pub const CREDIT_SEQ: Field = BODY + 4..BODY + 8;
/// Packet number whose payload a switch trimmed, meaningful only with [`credit_flags::HAS_NACK`]:
/// the sender resends it first.
pub const CREDIT_NACK_PSN: Field = BODY + 8..BODY + 16;
/// Exact length of a Credit datagram.
pub const CREDIT_END: usize = BODY + 16;

// ---- Rts (request to send) ----

/// Bytes the sender still has to send and no credit for.
pub const RTS_BACKLOG_BYTES: Field = BODY..BODY + 8;
/// Exact length of an Rts datagram.
pub const RTS_END: usize = BODY + 8;

// ---- Close ----

/// Application-defined close reason.
pub const CLOSE_REASON: Field = BODY..BODY + 4;
/// Exact length of a Close datagram.
pub const CLOSE_END: usize = BODY + 4;

/// Bits of the header flags byte of a Data packet. Types other than Data and Credit emit zero.
pub mod flags {
    /// The Data packet carries an immediate in its `imm` field.
    pub const HAS_IMM: u8 = 0x01;
    /// The sender asks for an Ack without delay (e.g. last packet of a chunk).
    pub const ACK_NOW: u8 = 0x02;
    /// The packet is a retransmission, so its RTT sample is ambiguous.
    pub const RETRANSMISSION: u8 = 0x04;
    /// The sender runs receiver-driven congestion control (EQDS): the receiver's credit pacer
    /// schedules it, and a trimmed header of this packet is answered with a NACK and credit.
    pub const RECEIVER_DRIVEN: u8 = 0x08;
    /// The sender has more bytes waiting for credit after this packet: the receiver's pacer
    /// replaces this packet's bytes with credit.
    pub const WANTS_MORE: u8 = 0x10;
}

/// Bits of the header flags byte of a Credit packet.
pub mod credit_flags {
    /// The Credit packet names a trimmed packet to resend (`CREDIT_NACK_PSN`).
    pub const HAS_NACK: u8 = 0x01;
}
