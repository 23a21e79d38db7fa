//! The Data packet: one payload of a write or a send, self-describing so the receiver can
//! place it on arrival, in any order.

use super::field::{self, flags};
use super::packet::Packet;
use super::WireError;
use crate::ids::{OpId, Psn, RegionId, RegionKey};

const KIND_WRITE: u8 = 1;
const KIND_SEND: u8 = 2;

/// What the payload is part of, and where a write lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    /// One-sided write: every packet names the destination, so any packet can be placed
    /// without the others.
    Write {
        /// Destination region at the receiver.
        region: RegionId,
        /// Key authorising access to `region`.
        key: RegionKey,
        /// Destination offset of the operation's byte 0 within the region.
        region_offset: u64,
    },
    /// Two-sided message into the receiver's posted buffer pool.
    Send,
}

/// A data packet's fields (the payload itself stays in the datagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRepr {
    /// Packet sequence number.
    pub psn: Psn,
    /// Sender's lowest unresolved psn: the receiver may forget state below it.
    pub ack_floor: Psn,
    /// Sender clock at transmission, echoed in the Ack.
    pub tx_time_ns: u64,
    /// Operation this payload belongs to.
    pub op: OpId,
    /// Write (with its destination) or send.
    pub kind: DataKind,
    /// Immediate delivered when the whole operation has landed.
    pub imm: Option<u32>,
    /// Sender-chosen tag naming the operation across connections (0: none). Receivers use it
    /// to count an immediate once when a sender resends an operation after a failover.
    pub tag: u64,
    /// Total bytes of the operation.
    pub msg_len: u64,
    /// Offset of this payload within the operation.
    pub msg_offset: u64,
    /// Payload bytes following the data header.
    pub payload_len: u16,
    /// Ask the receiver to ack at once.
    pub ack_now: bool,
    /// This is a retransmission: its RTT sample is ambiguous.
    pub retransmission: bool,
    /// The sender runs receiver-driven congestion control (EQDS).
    pub receiver_driven: bool,
    /// The sender has more bytes waiting for credit after this one (EQDS).
    pub wants_more: bool,
}

impl DataRepr {
    /// Checks the semantic rules a receiver relies on before placing bytes: the payload lies
    /// within the operation, and a write's destination range does not overflow.
    pub fn check(&self) -> Result<(), WireError> {
        let end = self
            .msg_offset
            .checked_add(u64::from(self.payload_len))
            .ok_or(WireError::Malformed("msg_offset + payload_len overflows"))?;
        if end > self.msg_len {
            return Err(WireError::Malformed("payload extends past msg_len"));
        }
        if let DataKind::Write { region_offset, .. } = self.kind {
            if region_offset.checked_add(self.msg_len).is_none() {
                return Err(WireError::Malformed("region_offset + msg_len overflows"));
            }
        }
        Ok(())
    }

    /// Reads a Data packet from a checked packet and applies [`DataRepr::check`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, WireError> {
        let kind = match packet.data_kind_raw() {
            KIND_WRITE => DataKind::Write {
                region: packet.data_region_id(),
                key: packet.data_region_key(),
                region_offset: packet.data_region_offset(),
            },
            // Region fields of a send are ignored, like reserved ones.
            KIND_SEND => DataKind::Send,
            _ => return Err(WireError::Malformed("unknown data kind")),
        };
        let packet_flags = packet.flags();
        let repr = DataRepr {
            psn: packet.data_psn(),
            ack_floor: packet.data_ack_floor(),
            tx_time_ns: packet.data_tx_time_ns(),
            op: packet.data_op(),
            kind,
            imm: (packet_flags & flags::HAS_IMM != 0).then(|| packet.data_imm()),
            tag: packet.data_tag(),
            msg_len: packet.data_msg_len(),
            msg_offset: packet.data_msg_offset(),
            payload_len: packet.data_payload_len(),
            ack_now: packet_flags & flags::ACK_NOW != 0,
            retransmission: packet_flags & flags::RETRANSMISSION != 0,
            receiver_driven: packet_flags & flags::RECEIVER_DRIVEN != 0,
            wants_more: packet_flags & flags::WANTS_MORE != 0,
        };
        repr.check()?;
        Ok(repr)
    }

    /// Header flags this packet carries.
    pub fn flags(&self) -> u8 {
        let mut bits = 0;
        if self.imm.is_some() {
            bits |= flags::HAS_IMM;
        }
        if self.ack_now {
            bits |= flags::ACK_NOW;
        }
        if self.retransmission {
            bits |= flags::RETRANSMISSION;
        }
        if self.receiver_driven {
            bits |= flags::RECEIVER_DRIVEN;
        }
        if self.wants_more {
            bits |= flags::WANTS_MORE;
        }
        bits
    }

    /// Bytes of the body after the common header (payload not included).
    pub const fn body_len() -> usize {
        field::DATA_PAYLOAD - field::HEADER_END
    }

    /// Writes flags and body (not the payload) into a packet of at least `DATA_HEADER_LEN`
    /// bytes. Call [`DataRepr::check`] first: emit does not validate.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_flags(self.flags());
        packet.set_data_psn(self.psn);
        packet.set_data_ack_floor(self.ack_floor);
        packet.set_data_tx_time_ns(self.tx_time_ns);
        packet.set_data_op(self.op);
        packet.set_data_reserved(0);
        packet.set_data_payload_len(self.payload_len);
        packet.set_data_imm(self.imm.unwrap_or(0));
        packet.set_data_msg_len(self.msg_len);
        packet.set_data_msg_offset(self.msg_offset);
        let (kind, region, key, region_offset) = match self.kind {
            DataKind::Write { region, key, region_offset } => (KIND_WRITE, region, key, region_offset),
            DataKind::Send => (KIND_SEND, RegionId(0), RegionKey(0), 0),
        };
        packet.set_data_kind_raw(kind);
        packet.set_data_region_id(region);
        packet.set_data_region_key(key);
        packet.set_data_region_offset(region_offset);
        packet.set_data_tag(self.tag);
    }
}
