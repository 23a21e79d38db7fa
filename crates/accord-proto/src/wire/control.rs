//! Fixed-size control packets: Hello / HelloAck, Probe / ProbeAck, Close.

use super::field;
use super::packet::Packet;
use crate::ids::ConnectionId;

/// Handshake parameters one side announces (Hello) or answers with (HelloAck).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloRepr {
    /// Sender's own connection id: the peer addresses every later packet to it.
    pub src_conn: ConnectionId,
    /// Sender's random token: the peer echoes it so off-path packets are dropped.
    pub src_token: u64,
    /// Largest data payload the sender accepts.
    pub max_payload_bytes: u16,
    /// Paths the sender is willing to spray over.
    pub path_count: u16,
    /// Receive window the sender grants, in packets.
    pub recv_window_packets: u32,
    /// Proof that the sender holds the job secret ([`crate::admission`]); zero without one.
    pub proof: [u8; 16],
}

impl HelloRepr {
    /// Reads the body of a checked Hello / HelloAck packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Self {
        HelloRepr {
            src_conn: packet.hello_src_conn(),
            src_token: packet.hello_src_token(),
            max_payload_bytes: packet.hello_max_payload_bytes(),
            path_count: packet.hello_path_count(),
            recv_window_packets: packet.hello_recv_window_packets(),
            proof: packet.hello_proof(),
        }
    }

    /// Bytes of the body after the common header.
    pub const fn body_len() -> usize {
        field::HELLO_END - field::HEADER_END
    }

    /// Writes the body.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_hello_src_conn(self.src_conn);
        packet.set_hello_src_token(self.src_token);
        packet.set_hello_max_payload_bytes(self.max_payload_bytes);
        packet.set_hello_path_count(self.path_count);
        packet.set_hello_recv_window_packets(self.recv_window_packets);
        packet.set_hello_proof(self.proof);
    }
}

/// A path probe (or its echo): measures RTT on a quarantined or idle path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeRepr {
    /// Identifier the ProbeAck echoes, matching answer to question.
    pub probe_id: u64,
    /// Sender clock at transmission, echoed for an RTT sample.
    pub tx_time_ns: u64,
}

impl ProbeRepr {
    /// Reads the body of a checked Probe / ProbeAck packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Self {
        ProbeRepr { probe_id: packet.probe_id(), tx_time_ns: packet.probe_tx_time_ns() }
    }

    /// Bytes of the body after the common header.
    pub const fn body_len() -> usize {
        field::PROBE_END - field::HEADER_END
    }

    /// Writes the body.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_probe_id(self.probe_id);
        packet.set_probe_tx_time_ns(self.tx_time_ns);
    }
}

/// Connection teardown, so the peer frees its state without waiting for a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseRepr {
    /// Application-defined reason code.
    pub reason: u32,
}

impl CloseRepr {
    /// Reads the body of a checked Close packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Self {
        CloseRepr { reason: packet.close_reason() }
    }

    /// Bytes of the body after the common header.
    pub const fn body_len() -> usize {
        field::CLOSE_END - field::HEADER_END
    }

    /// Writes the body.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_close_reason(self.reason);
    }
}
