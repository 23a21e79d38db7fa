//! [`Packet`]: a checked view over a datagram's bytes.
//!
//! [`Packet::new_checked`] validates version, type and every length the type implies (fixed
//! body size, `payload_len`, the Ack's bitmap and rejection counts). After it passed, no
//! accessor can panic: every read and write goes through a bounds-checked helper, and an
//! accessor for a field of another packet type reads zero (writes are dropped) instead of
//! panicking. Semantic checks (data kind, offsets) belong to the `Repr` parsers.

use super::field::{self, Field};
use super::{PacketType, RejectReason, Rejection, WireError, HEADER_LEN, VERSION};
use super::{MAX_REJECTIONS_PER_ACK, SACK_BITMAP_BITS};
use crate::ids::{ConnectionId, OpId, Psn, RegionId, RegionKey};

/// Largest SACK bitmap on the wire, in bytes.
pub(super) const SACK_BITMAP_BYTES_MAX: usize = SACK_BITMAP_BITS / 8;

fn read<const N: usize>(data: &[u8], f: Field) -> [u8; N] {
    data.get(f).and_then(|s| <[u8; N]>::try_from(s).ok()).unwrap_or([0; N])
}

fn read_u8(data: &[u8], at: usize) -> u8 {
    data.get(at).copied().unwrap_or(0)
}

fn read_u16(data: &[u8], f: Field) -> u16 {
    u16::from_be_bytes(read(data, f))
}

fn read_u32(data: &[u8], f: Field) -> u32 {
    u32::from_be_bytes(read(data, f))
}

fn read_u64(data: &[u8], f: Field) -> u64 {
    u64::from_be_bytes(read(data, f))
}

fn write<const N: usize>(data: &mut [u8], f: Field, bytes: [u8; N]) {
    if let Some(dst) = data.get_mut(f).and_then(|s| <&mut [u8; N]>::try_from(s).ok()) {
        *dst = bytes;
    }
}

fn write_u8(data: &mut [u8], at: usize, value: u8) {
    if let Some(dst) = data.get_mut(at) {
        *dst = value;
    }
}

/// Checks version, type and minimum length; shared by [`Packet::check_len`] and
/// [`super::peek`].
pub(super) fn check_header(data: &[u8]) -> Result<PacketType, WireError> {
    if data.len() < HEADER_LEN {
        return Err(WireError::Truncated { needed: HEADER_LEN, got: data.len() });
    }
    let version = read_u8(data, field::VERSION);
    if version != VERSION {
        return Err(WireError::BadVersion(version));
    }
    let raw_type = read_u8(data, field::TYPE);
    PacketType::from_u8(raw_type).ok_or(WireError::UnknownType(raw_type))
}

/// A fixed-size body must be exactly `end` bytes long: shorter is truncation, longer is junk.
fn check_fixed(len: usize, end: usize) -> Result<(), WireError> {
    if len < end {
        Err(WireError::Truncated { needed: end, got: len })
    } else if len > end {
        Err(WireError::Malformed("trailing bytes after fixed-size body"))
    } else {
        Ok(())
    }
}

/// A read-only (`T: AsRef<[u8]>`) or writable (`T: AsMut<[u8]>`) view of one datagram.
///
/// Field offsets come from [`field`]; see the module documentation for the no-panic rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without any check, for emitting into a buffer of the right size.
    /// Accessors still never panic on it, but they may read zeros.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps a received datagram after [`Packet::check_len`] accepted it.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Validates version, type and every length the type implies, so that each field of the
    /// packet's own type lies inside the buffer.
    pub fn check_len(&self) -> Result<(), WireError> {
        let data = self.buffer.as_ref();
        let len = data.len();
        match check_header(data)? {
            PacketType::Hello | PacketType::HelloAck => check_fixed(len, field::HELLO_END),
            PacketType::Probe | PacketType::ProbeAck => check_fixed(len, field::PROBE_END),
            PacketType::Close => check_fixed(len, field::CLOSE_END),
            PacketType::Credit => check_fixed(len, field::CREDIT_END),
            PacketType::Rts => check_fixed(len, field::RTS_END),
            PacketType::Data => {
                if len < field::DATA_PAYLOAD {
                    return Err(WireError::Truncated { needed: field::DATA_PAYLOAD, got: len });
                }
                if usize::from(self.data_payload_len()) != len - field::DATA_PAYLOAD {
                    return Err(WireError::Malformed("payload_len does not match datagram length"));
                }
                Ok(())
            }
            PacketType::Ack => {
                if len < field::ACK_SACK {
                    return Err(WireError::Truncated { needed: field::ACK_SACK, got: len });
                }
                let sack_len = usize::from(self.ack_sack_len_bytes());
                if sack_len > SACK_BITMAP_BYTES_MAX {
                    return Err(WireError::Malformed("sack_len_bytes above 128"));
                }
                let rejection_count = usize::from(self.ack_rejection_count());
                if rejection_count > MAX_REJECTIONS_PER_ACK {
                    return Err(WireError::Malformed("rejection_count above 16"));
                }
                let needed = field::ACK_SACK + sack_len + field::rejection::LEN * rejection_count;
                if len < needed {
                    Err(WireError::Truncated { needed, got: len })
                } else if len > needed {
                    Err(WireError::Malformed("trailing bytes after ack"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole datagram.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn data(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    // ---- Common header ----

    /// Wire version byte.
    pub fn version(&self) -> u8 {
        read_u8(self.data(), field::VERSION)
    }
    /// Raw packet type byte.
    pub fn packet_type_raw(&self) -> u8 {
        read_u8(self.data(), field::TYPE)
    }
    /// Packet type; always `Some` once [`Packet::new_checked`] passed.
    pub fn packet_type(&self) -> Option<PacketType> {
        PacketType::from_u8(self.packet_type_raw())
    }
    /// Raw flags byte, see [`field::flags`].
    pub fn flags(&self) -> u8 {
        read_u8(self.data(), field::FLAGS)
    }
    /// Receiver's connection id.
    pub fn dst_conn(&self) -> ConnectionId {
        ConnectionId(read_u32(self.data(), field::DST_CONN))
    }
    /// Receiver's per-connection token.
    pub fn token(&self) -> u64 {
        read_u64(self.data(), field::TOKEN)
    }

    // ---- Hello / HelloAck ----

    /// Sender's connection id.
    pub fn hello_src_conn(&self) -> ConnectionId {
        ConnectionId(read_u32(self.data(), field::HELLO_SRC_CONN))
    }
    /// Sender's token.
    pub fn hello_src_token(&self) -> u64 {
        read_u64(self.data(), field::HELLO_SRC_TOKEN)
    }
    /// Largest payload the sender accepts.
    pub fn hello_max_payload_bytes(&self) -> u16 {
        read_u16(self.data(), field::HELLO_MAX_PAYLOAD_BYTES)
    }
    /// Paths the sender is willing to use.
    pub fn hello_path_count(&self) -> u16 {
        read_u16(self.data(), field::HELLO_PATH_COUNT)
    }
    /// Proof of the job secret (zero without one).
    pub fn hello_proof(&self) -> [u8; 16] {
        read(self.data(), field::HELLO_PROOF)
    }
    /// Receive window the sender grants, in packets.
    pub fn hello_recv_window_packets(&self) -> u32 {
        read_u32(self.data(), field::HELLO_RECV_WINDOW_PACKETS)
    }

    // ---- Data ----

    /// Packet sequence number.
    pub fn data_psn(&self) -> Psn {
        read_u64(self.data(), field::DATA_PSN)
    }
    /// Sender's lowest unresolved psn.
    pub fn data_ack_floor(&self) -> Psn {
        read_u64(self.data(), field::DATA_ACK_FLOOR)
    }
    /// Sender's transmit time.
    pub fn data_tx_time_ns(&self) -> u64 {
        read_u64(self.data(), field::DATA_TX_TIME_NS)
    }
    /// Operation id.
    pub fn data_op(&self) -> OpId {
        OpId(read_u64(self.data(), field::DATA_OP))
    }
    /// Raw kind byte (1 Write, 2 Send).
    pub fn data_kind_raw(&self) -> u8 {
        read_u8(self.data(), field::DATA_KIND)
    }
    /// Declared payload length.
    pub fn data_payload_len(&self) -> u16 {
        read_u16(self.data(), field::DATA_PAYLOAD_LEN)
    }
    /// Immediate field (meaningful only with `HAS_IMM`).
    pub fn data_imm(&self) -> u32 {
        read_u32(self.data(), field::DATA_IMM)
    }
    /// Total bytes of the operation.
    pub fn data_msg_len(&self) -> u64 {
        read_u64(self.data(), field::DATA_MSG_LEN)
    }
    /// Offset of this payload within the operation.
    pub fn data_msg_offset(&self) -> u64 {
        read_u64(self.data(), field::DATA_MSG_OFFSET)
    }
    /// Destination region (Write only).
    pub fn data_region_id(&self) -> RegionId {
        RegionId(read_u32(self.data(), field::DATA_REGION_ID))
    }
    /// Remote key (Write only).
    pub fn data_region_key(&self) -> RegionKey {
        RegionKey(read_u64(self.data(), field::DATA_REGION_KEY))
    }
    /// Destination offset of the operation's byte 0 (Write only).
    pub fn data_region_offset(&self) -> u64 {
        read_u64(self.data(), field::DATA_REGION_OFFSET)
    }
    /// Sender-chosen operation tag.
    pub fn data_tag(&self) -> u64 {
        read_u64(self.data(), field::DATA_TAG)
    }
    /// Payload bytes: everything after the data header (empty if the buffer is shorter).
    pub fn data_payload(&self) -> &[u8] {
        self.data().get(field::DATA_PAYLOAD..).unwrap_or(&[])
    }

    // ---- Ack ----

    /// Cumulative ack point.
    pub fn ack_cum_ack(&self) -> Psn {
        read_u64(self.data(), field::ACK_CUM_ACK)
    }
    /// Psn of the packet that triggered the ack.
    pub fn ack_echo_psn(&self) -> Psn {
        read_u64(self.data(), field::ACK_ECHO_PSN)
    }
    /// That packet's transmit time.
    pub fn ack_echo_tx_time_ns(&self) -> u64 {
        read_u64(self.data(), field::ACK_ECHO_TX_TIME_NS)
    }
    /// Time the receiver held the packet.
    pub fn ack_delay_ns(&self) -> u32 {
        read_u32(self.data(), field::ACK_DELAY_NS)
    }
    /// Cumulative CE-marked packet count (wraps).
    pub fn ack_ecn_ce_count(&self) -> u32 {
        read_u32(self.data(), field::ACK_ECN_CE_COUNT)
    }
    /// Receiver-driven credit.
    pub fn ack_credit_bytes(&self) -> u32 {
        read_u32(self.data(), field::ACK_CREDIT_BYTES)
    }
    /// Declared SACK bitmap length in bytes.
    pub fn ack_sack_len_bytes(&self) -> u16 {
        read_u16(self.data(), field::ACK_SACK_LEN_BYTES)
    }
    /// Declared number of rejection entries.
    pub fn ack_rejection_count(&self) -> u8 {
        read_u8(self.data(), field::ACK_REJECTION_COUNT)
    }
    /// SACK bitmap bytes (empty if the buffer is shorter than declared).
    pub fn ack_sack_bytes(&self) -> &[u8] {
        let end = field::ACK_SACK + usize::from(self.ack_sack_len_bytes());
        self.data().get(field::ACK_SACK..end).unwrap_or(&[])
    }
    fn ack_rejection_entry(&self, index: usize) -> Option<&[u8]> {
        if index >= usize::from(self.ack_rejection_count()) {
            return None;
        }
        let start = field::ACK_SACK + usize::from(self.ack_sack_len_bytes()) + field::rejection::LEN * index;
        self.data().get(start..start + field::rejection::LEN)
    }
    /// Rejection entry `index`, or `None` past the declared count or the buffer.
    pub fn ack_rejection(&self, index: usize) -> Option<Rejection> {
        let entry = self.ack_rejection_entry(index)?;
        Some(Rejection {
            psn: read_u64(entry, field::rejection::PSN),
            op: OpId(read_u64(entry, field::rejection::OP)),
            reason: RejectReason::from_u32(read_u32(entry, field::rejection::REASON)),
        })
    }

    // ---- Probe / ProbeAck ----

    /// Probe identifier.
    pub fn probe_id(&self) -> u64 {
        read_u64(self.data(), field::PROBE_ID)
    }
    /// Probe transmit time.
    pub fn probe_tx_time_ns(&self) -> u64 {
        read_u64(self.data(), field::PROBE_TX_TIME_NS)
    }

    // ---- Credit / Rts ----

    /// Credit granted, in bytes.
    pub fn credit_bytes(&self) -> u32 {
        read_u32(self.data(), field::CREDIT_BYTES)
    }
    /// Sequence number of a Credit frame.
    pub fn credit_seq(&self) -> u32 {
        read_u32(self.data(), field::CREDIT_SEQ)
    }
    /// Packet number a Credit NACKs (meaningful with its HAS_NACK flag).
    pub fn credit_nack_psn(&self) -> Psn {
        read_u64(self.data(), field::CREDIT_NACK_PSN)
    }
    /// Backlog an Rts announces.
    pub fn rts_backlog_bytes(&self) -> u64 {
        read_u64(self.data(), field::RTS_BACKLOG_BYTES)
    }

    // ---- Close ----

    /// Close reason.
    pub fn close_reason(&self) -> u32 {
        read_u32(self.data(), field::CLOSE_REASON)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn data_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the version byte.
    pub fn set_version(&mut self, value: u8) {
        write_u8(self.data_mut(), field::VERSION, value)
    }
    /// Sets the packet type.
    pub fn set_packet_type(&mut self, value: PacketType) {
        write_u8(self.data_mut(), field::TYPE, value as u8)
    }
    /// Sets the flags byte.
    pub fn set_flags(&mut self, value: u8) {
        write_u8(self.data_mut(), field::FLAGS, value)
    }
    /// Sets the CRC field (emit writes zero; [`super::seal`] the real CRC).
    pub fn set_crc(&mut self, value: u32) {
        write(self.data_mut(), field::CRC, value.to_be_bytes())
    }
    /// Sets the integrity mode byte (emit writes zero; [`super::seal`] the real mode).
    pub fn set_integrity_mode(&mut self, value: u8) {
        write_u8(self.data_mut(), field::INTEGRITY, value)
    }
    /// Sets the receiver's connection id.
    pub fn set_dst_conn(&mut self, value: ConnectionId) {
        write(self.data_mut(), field::DST_CONN, value.0.to_be_bytes())
    }
    /// Sets the receiver's token.
    pub fn set_token(&mut self, value: u64) {
        write(self.data_mut(), field::TOKEN, value.to_be_bytes())
    }

    /// Sets the Hello sender connection id.
    pub fn set_hello_src_conn(&mut self, value: ConnectionId) {
        write(self.data_mut(), field::HELLO_SRC_CONN, value.0.to_be_bytes())
    }
    /// Sets the Hello sender token.
    pub fn set_hello_src_token(&mut self, value: u64) {
        write(self.data_mut(), field::HELLO_SRC_TOKEN, value.to_be_bytes())
    }
    /// Sets the Hello maximum payload.
    pub fn set_hello_max_payload_bytes(&mut self, value: u16) {
        write(self.data_mut(), field::HELLO_MAX_PAYLOAD_BYTES, value.to_be_bytes())
    }
    /// Sets the Hello path count.
    pub fn set_hello_path_count(&mut self, value: u16) {
        write(self.data_mut(), field::HELLO_PATH_COUNT, value.to_be_bytes())
    }
    /// Sets the proof of the job secret.
    pub fn set_hello_proof(&mut self, value: [u8; 16]) {
        write(self.data_mut(), field::HELLO_PROOF, value)
    }
    /// Sets the Hello receive window.
    pub fn set_hello_recv_window_packets(&mut self, value: u32) {
        write(self.data_mut(), field::HELLO_RECV_WINDOW_PACKETS, value.to_be_bytes())
    }

    /// Sets the data psn.
    pub fn set_data_psn(&mut self, value: Psn) {
        write(self.data_mut(), field::DATA_PSN, value.to_be_bytes())
    }
    /// Sets the data ack floor.
    pub fn set_data_ack_floor(&mut self, value: Psn) {
        write(self.data_mut(), field::DATA_ACK_FLOOR, value.to_be_bytes())
    }
    /// Sets the data transmit time.
    pub fn set_data_tx_time_ns(&mut self, value: u64) {
        write(self.data_mut(), field::DATA_TX_TIME_NS, value.to_be_bytes())
    }
    /// Sets the operation id.
    pub fn set_data_op(&mut self, value: OpId) {
        write(self.data_mut(), field::DATA_OP, value.0.to_be_bytes())
    }
    /// Sets the raw kind byte.
    pub fn set_data_kind_raw(&mut self, value: u8) {
        write_u8(self.data_mut(), field::DATA_KIND, value)
    }
    /// Sets the reserved fields of the data body (emit writes zero).
    pub fn set_data_reserved(&mut self, value: u8) {
        write_u8(self.data_mut(), field::DATA_RESERVED, value);
        write(self.data_mut(), field::DATA_RESERVED2, u32::from(value).to_be_bytes())
    }
    /// Sets the declared payload length.
    pub fn set_data_payload_len(&mut self, value: u16) {
        write(self.data_mut(), field::DATA_PAYLOAD_LEN, value.to_be_bytes())
    }
    /// Sets the immediate field.
    pub fn set_data_imm(&mut self, value: u32) {
        write(self.data_mut(), field::DATA_IMM, value.to_be_bytes())
    }
    /// Sets the operation length.
    pub fn set_data_msg_len(&mut self, value: u64) {
        write(self.data_mut(), field::DATA_MSG_LEN, value.to_be_bytes())
    }
    /// Sets the payload's offset within the operation.
    pub fn set_data_msg_offset(&mut self, value: u64) {
        write(self.data_mut(), field::DATA_MSG_OFFSET, value.to_be_bytes())
    }
    /// Sets the destination region.
    pub fn set_data_region_id(&mut self, value: RegionId) {
        write(self.data_mut(), field::DATA_REGION_ID, value.0.to_be_bytes())
    }
    /// Sets the remote key.
    pub fn set_data_region_key(&mut self, value: RegionKey) {
        write(self.data_mut(), field::DATA_REGION_KEY, value.0.to_be_bytes())
    }
    /// Sets the destination offset of the operation's byte 0.
    pub fn set_data_region_offset(&mut self, value: u64) {
        write(self.data_mut(), field::DATA_REGION_OFFSET, value.to_be_bytes())
    }
    /// Sets the operation tag.
    pub fn set_data_tag(&mut self, value: u64) {
        write(self.data_mut(), field::DATA_TAG, value.to_be_bytes())
    }
    /// Payload bytes, writable (empty if the buffer is shorter than the data header).
    pub fn data_payload_mut(&mut self) -> &mut [u8] {
        self.data_mut().get_mut(field::DATA_PAYLOAD..).unwrap_or(&mut [])
    }

    /// Sets the cumulative ack point.
    pub fn set_ack_cum_ack(&mut self, value: Psn) {
        write(self.data_mut(), field::ACK_CUM_ACK, value.to_be_bytes())
    }
    /// Sets the echoed psn.
    pub fn set_ack_echo_psn(&mut self, value: Psn) {
        write(self.data_mut(), field::ACK_ECHO_PSN, value.to_be_bytes())
    }
    /// Sets the echoed transmit time.
    pub fn set_ack_echo_tx_time_ns(&mut self, value: u64) {
        write(self.data_mut(), field::ACK_ECHO_TX_TIME_NS, value.to_be_bytes())
    }
    /// Sets the ack delay.
    pub fn set_ack_delay_ns(&mut self, value: u32) {
        write(self.data_mut(), field::ACK_DELAY_NS, value.to_be_bytes())
    }
    /// Sets the CE count.
    pub fn set_ack_ecn_ce_count(&mut self, value: u32) {
        write(self.data_mut(), field::ACK_ECN_CE_COUNT, value.to_be_bytes())
    }
    /// Sets the credit.
    pub fn set_ack_credit_bytes(&mut self, value: u32) {
        write(self.data_mut(), field::ACK_CREDIT_BYTES, value.to_be_bytes())
    }
    /// Sets the declared SACK bitmap length; set before [`Packet::ack_sack_bytes_mut`].
    pub fn set_ack_sack_len_bytes(&mut self, value: u16) {
        write(self.data_mut(), field::ACK_SACK_LEN_BYTES, value.to_be_bytes())
    }
    /// Sets the declared rejection count; set before [`Packet::set_ack_rejection`].
    pub fn set_ack_rejection_count(&mut self, value: u8) {
        write_u8(self.data_mut(), field::ACK_REJECTION_COUNT, value)
    }
    /// Sets the reserved ack byte (emit writes zero).
    pub fn set_ack_reserved(&mut self, value: u8) {
        write_u8(self.data_mut(), field::ACK_RESERVED, value)
    }
    /// SACK bitmap bytes as declared by `sack_len_bytes`, writable.
    pub fn ack_sack_bytes_mut(&mut self) -> &mut [u8] {
        let end = field::ACK_SACK + usize::from(self.ack_sack_len_bytes());
        self.data_mut().get_mut(field::ACK_SACK..end).unwrap_or(&mut [])
    }
    /// Writes rejection entry `index` (dropped past the declared count or the buffer).
    pub fn set_ack_rejection(&mut self, index: usize, value: &Rejection) {
        if index >= usize::from(self.ack_rejection_count()) {
            return;
        }
        let start = field::ACK_SACK + usize::from(self.ack_sack_len_bytes()) + field::rejection::LEN * index;
        if let Some(entry) = self.data_mut().get_mut(start..start + field::rejection::LEN) {
            write(entry, field::rejection::PSN, value.psn.to_be_bytes());
            write(entry, field::rejection::OP, value.op.0.to_be_bytes());
            write(entry, field::rejection::REASON, value.reason.to_u32().to_be_bytes());
            write(entry, field::rejection::RESERVED, 0u32.to_be_bytes());
        }
    }

    /// Sets the probe id.
    pub fn set_probe_id(&mut self, value: u64) {
        write(self.data_mut(), field::PROBE_ID, value.to_be_bytes())
    }
    /// Sets the probe transmit time.
    pub fn set_probe_tx_time_ns(&mut self, value: u64) {
        write(self.data_mut(), field::PROBE_TX_TIME_NS, value.to_be_bytes())
    }

    /// Sets the credit granted.
    pub fn set_credit_bytes(&mut self, value: u32) {
        write(self.data_mut(), field::CREDIT_BYTES, value.to_be_bytes())
    }
    /// Sets the Credit frame's sequence number.
    pub fn set_credit_seq(&mut self, value: u32) {
        write(self.data_mut(), field::CREDIT_SEQ, value.to_be_bytes())
    }
    /// Sets the packet number a Credit NACKs.
    pub fn set_credit_nack_psn(&mut self, value: Psn) {
        write(self.data_mut(), field::CREDIT_NACK_PSN, value.to_be_bytes())
    }
    /// Sets the backlog an Rts announces.
    pub fn set_rts_backlog_bytes(&mut self, value: u64) {
        write(self.data_mut(), field::RTS_BACKLOG_BYTES, value.to_be_bytes())
    }

    /// Sets the close reason.
    pub fn set_close_reason(&mut self, value: u32) {
        write(self.data_mut(), field::CLOSE_REASON, value.to_be_bytes())
    }
}
