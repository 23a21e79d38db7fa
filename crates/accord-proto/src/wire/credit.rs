//! Packets of receiver-driven congestion control (EQDS): the receiver's Credit (a grant of bytes
//! to send, optionally with a NACK of a trimmed packet) and the sender's Rts (request to send,
//! when it has bytes waiting and no credit arrived for a while).

use super::field::{self, credit_flags};
use super::packet::Packet;
use crate::ids::Psn;

/// A grant from the receiver's credit pacer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditRepr {
    /// Bytes of new permission to send (may be zero for a bare NACK).
    pub credit_bytes: u32,
    /// A packet whose payload a switch trimmed: the sender resends it before new data.
    pub nack: Option<Psn>,
    /// This frame's number on its connection (from 1): the sender acts on each number once.
    pub seq: u32,
}

impl CreditRepr {
    /// Reads the body of a checked Credit packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Self {
        let nack = (packet.flags() & credit_flags::HAS_NACK != 0).then(|| packet.credit_nack_psn());
        CreditRepr { credit_bytes: packet.credit_bytes(), nack, seq: packet.credit_seq() }
    }

    /// Bytes of the body after the common header.
    pub const fn body_len() -> usize {
        field::CREDIT_END - field::HEADER_END
    }

    /// Writes flags and body.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_flags(if self.nack.is_some() { credit_flags::HAS_NACK } else { 0 });
        packet.set_credit_bytes(self.credit_bytes);
        packet.set_credit_seq(self.seq);
        packet.set_credit_nack_psn(self.nack.unwrap_or(0));
    }
}

/// A sender's request to send: it has `backlog_bytes` waiting and no credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsRepr {
    /// Bytes (new data and retransmissions) the sender still has to send.
    pub backlog_bytes: u64,
}

impl RtsRepr {
    /// Reads the body of a checked Rts packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Self {
        RtsRepr { backlog_bytes: packet.rts_backlog_bytes() }
    }

    /// Bytes of the body after the common header.
    pub const fn body_len() -> usize {
        field::RTS_END - field::HEADER_END
    }

    /// Writes the body.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_rts_backlog_bytes(self.backlog_bytes);
    }
}
