//! Wire format of Accord's transport (DESIGN.md §2, "Wire format").
//!
//! Modelled on smoltcp's `wire`: a checked byte view ([`Packet`]) whose field offsets all live
//! in [`field`], typed representations (`*Repr`) with `parse` / `emit`, and top-level
//! [`parse`], [`peek`] and [`emit`] for the endpoint. Every integer is big-endian. Bad input
//! from a peer is always a [`WireError`], never a panic; the parser is fuzzed
//! (`tests.rs` in process, `crates/accord-proto/fuzz` with cargo-fuzz).
//!
//! Layout: a 20-byte common header (version, type, flags, integrity mode, `dst_conn`, `token`,
//! CRC32C) followed by a type-specific body; Data's payload follows its 88-byte body to the end
//! of the datagram. The CRC is checked ([`verify`]) before anything else is parsed; see
//! [`integrity`] for what it covers. Version 2 added the CRC (version 1 had a 16-byte header).
//! In the authenticated mode ([`Integrity::Mac`], see [`mac`]) a 16-byte tag follows the last
//! byte instead, verified with [`verify_mac`] and stripped before parsing; the header layout is
//! the same, so the version is too (a receiver accepts only its own mode, whatever the version).

mod ack;
mod control;
mod credit;
mod data;
pub mod field;
pub mod integrity;
pub mod mac;
mod packet;

#[cfg(test)]
mod tests;

pub use ack::{AckRepr, RejectReason, Rejection, Rejections, SackBitmap};
pub use control::{CloseRepr, HelloRepr, ProbeRepr};
pub use credit::{CreditRepr, RtsRepr};
pub use data::{DataKind, DataRepr};
pub use integrity::{seal, verify, Integrity};
pub use mac::{seal_mac, verify_mac, ConnKeys, ConnSide, MacKey, MAC_TAG_LEN};
use packet::check_header;
pub use packet::Packet;

use crate::ids::ConnectionId;

/// Wire version this build speaks; a datagram with another is dropped (no negotiation yet).
pub const VERSION: u8 = 2;
/// Length of the common header every packet starts with.
pub const HEADER_LEN: usize = field::HEADER_END;
/// Header plus data body: where a Data packet's payload starts.
pub const DATA_HEADER_LEN: usize = field::DATA_PAYLOAD;
/// Width of the SACK bitmap: how far above `cum_ack` one Ack can report.
pub const SACK_BITMAP_BITS: usize = 1024;
/// Most rejections one Ack carries; more wait for the next Ack.
pub const MAX_REJECTIONS_PER_ACK: usize = 16;
/// Largest Ack datagram (without the authenticated mode's trailer), for sizing transmit
/// buffers; see [`TRANSMIT_BUFFER_MIN`].
pub const MAX_ACK_LEN: usize = HEADER_LEN + 40 + 128 + 24 * 16;
/// Smallest buffer `Endpoint::poll_transmit` writes into: the largest Ack and a MAC trailer.
pub const TRANSMIT_BUFFER_MIN: usize = MAX_ACK_LEN + MAC_TAG_LEN;

/// Why a datagram could not be parsed or a packet not emitted. Every parse error means: drop
/// the datagram and count it; never tear down a connection over one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The datagram is shorter than its header declares.
    #[error("datagram truncated: needed {needed} bytes, got {got}; drop it")]
    Truncated {
        /// Bytes the packet needs.
        needed: usize,
        /// Bytes the datagram has.
        got: usize,
    },
    /// The version byte is not [`VERSION`].
    #[error("unsupported wire version {0} (this build speaks {VERSION}); drop the datagram")]
    BadVersion(u8),
    /// The type byte names no known packet type.
    #[error("unknown packet type {0}; drop the datagram")]
    UnknownType(u8),
    /// Lengths or fields are inconsistent.
    #[error("malformed packet: {0}; drop the datagram and count it")]
    Malformed(&'static str),
    /// The CRC32C does not match: the datagram was corrupted on the way.
    #[error("end-to-end checksum mismatch; drop the datagram and count it (the sender retransmits)")]
    BadChecksum,
    /// The authentication tag does not match: forged, corrupted, or for another connection.
    #[error("authentication tag mismatch (forged, corrupted, or another connection's packet); drop the datagram and count it")]
    BadTag,
    /// The sender sealed the packet in another integrity mode than this receiver checks.
    #[error("integrity mode {sent} on the wire, this endpoint checks mode {expected}: set ACCORD_INTEGRITY alike on every rank")]
    IntegrityModeMismatch {
        /// Mode byte in the packet.
        sent: u8,
        /// Mode this receiver is configured for.
        expected: u8,
    },
    /// The output buffer cannot hold the packet.
    #[error("output buffer too small: needed {needed} bytes, got {got}; pass at least Repr::buffer_len() bytes")]
    BufferTooSmall {
        /// Bytes emit writes.
        needed: usize,
        /// Bytes the buffer has.
        got: usize,
    },
}

/// The packet type byte: selects the body layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PacketType {
    /// Opens a connection.
    Hello = 1,
    /// Answers a Hello.
    HelloAck,
    /// Carries payload of a write or send.
    Data,
    /// Acknowledges data, reports rejections, echoes timing.
    Ack,
    /// Probes a path.
    Probe,
    /// Answers a Probe.
    ProbeAck,
    /// Closes a connection.
    Close,
    /// Receiver-driven credit, optionally with a NACK of a trimmed packet (EQDS).
    Credit,
    /// A sender's request to send when it has backlog and no credit (EQDS).
    Rts,
}

impl PacketType {
    /// Decodes a type byte; `None` for codes this build does not know.
    pub const fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => PacketType::Hello,
            2 => PacketType::HelloAck,
            3 => PacketType::Data,
            4 => PacketType::Ack,
            5 => PacketType::Probe,
            6 => PacketType::ProbeAck,
            7 => PacketType::Close,
            8 => PacketType::Credit,
            9 => PacketType::Rts,
            _ => return None,
        })
    }
}

/// Addressing fields of the common header: who the packet is for and proof it is on-path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Receiver's connection id (0 in Hello, which has none yet).
    pub dst_conn: ConnectionId,
    /// Receiver's per-connection random token (0 in Hello).
    pub token: u64,
}

impl Header {
    /// Reads the addressing fields of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Self {
        Header { dst_conn: packet.dst_conn(), token: packet.token() }
    }
}

/// A typed packet body: what the endpoint reasons about instead of bytes.
///
/// `Copy` and allocation-free by design: the Ack variant holds its bitmap and rejections
/// inline (about 570 bytes), which is cheaper than a heap allocation per ack.
#[allow(clippy::large_enum_variant)] // inline Ack is deliberate, see above
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// Connection request.
    Hello(HelloRepr),
    /// Connection answer.
    HelloAck(HelloRepr),
    /// Payload-carrying packet.
    Data(DataRepr),
    /// Acknowledgment.
    Ack(AckRepr),
    /// Path probe.
    Probe(ProbeRepr),
    /// Path probe answer.
    ProbeAck(ProbeRepr),
    /// Connection close.
    Close(CloseRepr),
    /// Receiver-driven credit (and NACK).
    Credit(CreditRepr),
    /// Request to send.
    Rts(RtsRepr),
}

impl Repr {
    /// The type byte this body is sent with.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Repr::Hello(_) => PacketType::Hello,
            Repr::HelloAck(_) => PacketType::HelloAck,
            Repr::Data(_) => PacketType::Data,
            Repr::Ack(_) => PacketType::Ack,
            Repr::Probe(_) => PacketType::Probe,
            Repr::ProbeAck(_) => PacketType::ProbeAck,
            Repr::Close(_) => PacketType::Close,
            Repr::Credit(_) => PacketType::Credit,
            Repr::Rts(_) => PacketType::Rts,
        }
    }

    /// Bytes [`emit`] writes: header plus body. For Data this is [`DATA_HEADER_LEN`]; the
    /// caller appends `payload_len` payload bytes after it.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Repr::Hello(_) | Repr::HelloAck(_) => HelloRepr::body_len(),
                Repr::Data(_) => DataRepr::body_len(),
                Repr::Ack(ack) => ack.body_len(),
                Repr::Probe(_) | Repr::ProbeAck(_) => ProbeRepr::body_len(),
                Repr::Close(_) => CloseRepr::body_len(),
                Repr::Credit(_) => CreditRepr::body_len(),
                Repr::Rts(_) => RtsRepr::body_len(),
            }
    }

    /// Reads the body of a packet that passed [`Packet::new_checked`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, WireError> {
        let raw_type = packet.packet_type_raw();
        let packet_type = PacketType::from_u8(raw_type).ok_or(WireError::UnknownType(raw_type))?;
        Ok(match packet_type {
            PacketType::Hello => Repr::Hello(HelloRepr::parse(packet)),
            PacketType::HelloAck => Repr::HelloAck(HelloRepr::parse(packet)),
            PacketType::Data => Repr::Data(DataRepr::parse(packet)?),
            PacketType::Ack => Repr::Ack(AckRepr::parse(packet)),
            PacketType::Probe => Repr::Probe(ProbeRepr::parse(packet)),
            PacketType::ProbeAck => Repr::ProbeAck(ProbeRepr::parse(packet)),
            PacketType::Close => Repr::Close(CloseRepr::parse(packet)),
            PacketType::Credit => Repr::Credit(CreditRepr::parse(packet)),
            PacketType::Rts => Repr::Rts(RtsRepr::parse(packet)),
        })
    }
}

/// A fully parsed datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Addressing fields.
    pub header: Header,
    /// Typed body.
    pub repr: Repr,
    /// Payload bytes within the datagram (`DATA_HEADER_LEN..len` for Data, empty otherwise),
    /// so the caller can place them without a copy.
    pub payload: core::ops::Range<usize>,
}

/// Parses and validates a received datagram. Errors mean: drop it and count it.
pub fn parse(datagram: &[u8]) -> Result<Parsed, WireError> {
    let packet = Packet::new_checked(datagram)?;
    let header = Header::parse(&packet);
    let repr = Repr::parse(&packet)?;
    let payload = match repr {
        Repr::Data(_) => DATA_HEADER_LEN..datagram.len(),
        _ => 0..0,
    };
    Ok(Parsed { header, repr, payload })
}

/// Parses a Data packet whose payload a switch trimmed: exactly the data header, with
/// `payload_len` still naming the bytes that were cut. Only a datapath that knows the fabric
/// trimmed the packet may call this (the simulator does; a UDP socket never can, because a
/// short datagram is indistinguishable from a truncated one there and is dropped by [`parse`]).
/// The result carries no payload: nothing of it may ever be placed.
pub fn parse_trimmed(datagram: &[u8]) -> Result<(Header, DataRepr), WireError> {
    if check_header(datagram)? != PacketType::Data {
        return Err(WireError::Malformed("a trimmed packet must be Data"));
    }
    if datagram.len() != DATA_HEADER_LEN {
        return Err(WireError::Malformed("a trimmed packet is exactly the data header"));
    }
    let packet = Packet::new_unchecked(datagram);
    let header = Header::parse(&packet);
    let data = DataRepr::parse(&packet)?;
    Ok((header, data))
}

/// Cheap demultiplexing before a full parse: checks only version, type and that the common
/// header is present.
pub fn peek(datagram: &[u8]) -> Result<(PacketType, Header), WireError> {
    let packet_type = packet::check_header(datagram)?;
    let header = Header::parse(&Packet::new_unchecked(datagram));
    Ok((packet_type, header))
}

/// Writes header and body into `out` and returns the bytes written ([`Repr::buffer_len`]).
///
/// For Data the caller then writes `payload_len` payload bytes at [`DATA_HEADER_LEN`]. A Data
/// repr that a receiver would reject ([`DataRepr::check`]) is refused with `Malformed`, so a
/// bug surfaces at the sender. The SACK bitmap is trimmed of trailing all-zero bytes.
pub fn emit(header: &Header, repr: &Repr, out: &mut [u8]) -> Result<usize, WireError> {
    if let Repr::Data(data) = repr {
        data.check()?;
    }
    let needed = repr.buffer_len();
    let got = out.len();
    let buffer = out.get_mut(..needed).ok_or(WireError::BufferTooSmall { needed, got })?;
    let mut packet = Packet::new_unchecked(buffer);
    packet.set_version(VERSION);
    packet.set_packet_type(repr.packet_type());
    packet.set_flags(0);
    packet.set_integrity_mode(0);
    packet.set_crc(0);
    packet.set_dst_conn(header.dst_conn);
    packet.set_token(header.token);
    match repr {
        Repr::Hello(hello) | Repr::HelloAck(hello) => hello.emit(&mut packet),
        Repr::Data(data) => data.emit(&mut packet),
        Repr::Ack(ack) => ack.emit(&mut packet),
        Repr::Probe(probe) | Repr::ProbeAck(probe) => probe.emit(&mut packet),
        Repr::Close(close) => close.emit(&mut packet),
        Repr::Credit(credit) => credit.emit(&mut packet),
        Repr::Rts(rts) => rts.emit(&mut packet),
    }
    Ok(needed)
}
