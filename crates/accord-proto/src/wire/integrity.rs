//! The end-to-end check: a CRC32C in every packet's header, over the header and, in
//! [`Integrity::Full`], the payload.
//!
//! Why: the UDP checksum is 16 bits and a NIC or a kernel may skip it; a corrupted header that
//! passes it could name another connection's packet number or another offset. RoCE carries an
//! ICRC for the same reason. The check runs before anything else of the datagram is read, so a
//! corrupted packet is dropped and counted, and the sender's loss recovery repairs it like a
//! loss. It is not a MAC: it catches accidents, not an attacker who recomputes it.
//!
//! Coverage: bytes `0..CRC` and `CRC_END..end` ([`Integrity::Full`]), or only up to where a
//! Data packet's payload starts ([`Integrity::Header`]; every other packet type is covered
//! whole, having no payload). The mode byte (header byte 3) says which mode the sender used;
//! a receiver accepts only its own mode, so a bit flip cannot downgrade the check.
//!
//! [`Integrity::Mac`] authenticates instead of checking: a keyed tag in a trailer, under keys
//! only the job's ranks can derive (see [`super::mac`]); its CRC field is zero.

use super::field;
use super::{PacketType, WireError, DATA_HEADER_LEN, HEADER_LEN};

/// How much of each packet the CRC32C covers. Every rank of a job must use the same mode.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Integrity {
    /// No check: the CRC field is zero and not verified.
    Off,
    /// Header and body of every packet, not the Data payload.
    Header,
    /// Everything: header, body and payload. The default.
    #[default]
    Full,
    /// A 16-byte MAC over everything, under per-connection keys derived from the job secret
    /// (see [`super::mac`]): for networks outsiders can write to. Needs a job secret.
    Mac,
}

impl Integrity {
    /// The mode byte on the wire.
    pub const fn to_u8(self) -> u8 {
        match self {
            Integrity::Off => 0,
            Integrity::Header => 1,
            Integrity::Full => 2,
            Integrity::Mac => 3,
        }
    }

    /// Parses `off`, `header`, `full` or `mac` (the `ACCORD_INTEGRITY` values).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "off" | "none" => Some(Integrity::Off),
            "header" => Some(Integrity::Header),
            "full" | "crc" | "crc32c" => Some(Integrity::Full),
            "mac" => Some(Integrity::Mac),
            _ => None,
        }
    }

    /// The name [`Integrity::from_name`] reads.
    pub const fn name(self) -> &'static str {
        match self {
            Integrity::Off => "off",
            Integrity::Header => "header",
            Integrity::Full => "full",
            Integrity::Mac => "mac",
        }
    }

    /// Whether the check covers the payload, so a Data packet is sealed only once the driver
    /// has gathered it.
    pub const fn covers_payload(self) -> bool {
        matches!(self, Integrity::Full | Integrity::Mac)
    }

    /// Bytes the mode appends after a packet: the MAC's tag, nothing for the CRC modes.
    pub const fn trailer_len(self) -> usize {
        match self {
            Integrity::Mac => super::mac::MAC_TAG_LEN,
            _ => 0,
        }
    }
}

/// CRC32C of the bytes `mode` covers, the CRC field itself skipped.
fn checksum(datagram: &[u8], mode: Integrity) -> u32 {
    let end = match mode {
        Integrity::Full => datagram.len(),
        _ if datagram.get(field::TYPE) == Some(&(PacketType::Data as u8)) => DATA_HEADER_LEN.min(datagram.len()),
        _ => datagram.len(),
    };
    let before = datagram.get(..field::CRC.start).unwrap_or_default();
    let after = datagram.get(field::CRC.end..end).unwrap_or_default();
    crc32c::crc32c_append(crc32c::crc32c(before), after)
}

/// Writes the mode byte and the CRC into an emitted packet. For [`Integrity::Full`] call it
/// after the payload is in place (see [`crate::Transmit::seal_payload`]). A buffer shorter than
/// the header is left alone. [`Integrity::Mac`] needs a key: this writes its mode byte and a
/// zero CRC only, and [`super::mac::seal_mac`] the tag.
pub fn seal(datagram: &mut [u8], mode: Integrity) {
    if datagram.len() < HEADER_LEN {
        return;
    }
    datagram[field::INTEGRITY] = mode.to_u8();
    let crc = if matches!(mode, Integrity::Off | Integrity::Mac) { 0 } else { checksum(datagram, mode) };
    datagram[field::CRC].copy_from_slice(&crc.to_be_bytes());
}

/// Checks a received datagram against the receiver's own mode, before anything else of it is
/// parsed. An error means: drop it and count it. [`Integrity::Mac`] is checked with the
/// connection's key ([`super::mac::verify_mac`]); here it is always refused.
pub fn verify(datagram: &[u8], mode: Integrity) -> Result<(), WireError> {
    if datagram.len() < HEADER_LEN {
        return Err(WireError::Truncated { needed: HEADER_LEN, got: datagram.len() });
    }
    let sent_mode = datagram[field::INTEGRITY];
    if sent_mode != mode.to_u8() {
        return Err(WireError::IntegrityModeMismatch { sent: sent_mode, expected: mode.to_u8() });
    }
    match mode {
        Integrity::Off => return Ok(()),
        Integrity::Mac => return Err(WireError::BadTag),
        Integrity::Header | Integrity::Full => {}
    }
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&datagram[field::CRC]);
    if u32::from_be_bytes(stored) != checksum(datagram, mode) {
        return Err(WireError::BadChecksum);
    }
    Ok(())
}

/// A Data packet carrying `payload`, not sealed: the sample the CRC and the MAC tests seal
/// and flip.
#[cfg(test)]
pub(crate) fn data_packet(payload: &[u8]) -> Vec<u8> {
    use crate::ids::{ConnectionId, OpId};
    use crate::wire::{emit, DataKind, DataRepr, Header, Repr};
    let repr = DataRepr {
        psn: 7,
        ack_floor: 0,
        tx_time_ns: 1,
        op: OpId(3),
        kind: DataKind::Send,
        imm: None,
        tag: 0,
        msg_len: payload.len() as u64,
        msg_offset: 0,
        payload_len: payload.len() as u16,
        ack_now: false,
        retransmission: false,
        receiver_driven: false,
        wants_more: false,
    };
    let mut buf = vec![0u8; DATA_HEADER_LEN + payload.len()];
    let n = emit(&Header { dst_conn: ConnectionId(9), token: 5 }, &Repr::Data(repr), &mut buf).unwrap();
    buf[n..].copy_from_slice(payload);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_single_bit_flip_is_caught_in_its_mode() {
        for mode in [Integrity::Header, Integrity::Full] {
            let mut d = data_packet(&[0xa5; 64]);
            seal(&mut d, mode);
            assert_eq!(verify(&d, mode), Ok(()));
            let covered = if mode == Integrity::Full { d.len() } else { DATA_HEADER_LEN };
            for bit in 0..covered * 8 {
                let mut bad = d.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                assert!(verify(&bad, mode).is_err(), "{mode:?}: flip of bit {bit} passed");
            }
        }
    }

    #[test]
    fn header_mode_leaves_the_payload_unchecked_and_off_checks_nothing() {
        let mut d = data_packet(&[1; 32]);
        seal(&mut d, Integrity::Header);
        let last = d.len() - 1;
        d[last] ^= 0xff;
        assert_eq!(verify(&d, Integrity::Header), Ok(()));
        let mut d = data_packet(&[1; 32]);
        seal(&mut d, Integrity::Off);
        d[field::TOKEN.start] ^= 1;
        assert_eq!(verify(&d, Integrity::Off), Ok(()));
    }

    #[test]
    fn a_packet_sealed_in_another_mode_is_refused() {
        let mut d = data_packet(&[1; 8]);
        seal(&mut d, Integrity::Off);
        assert_eq!(verify(&d, Integrity::Full), Err(WireError::IntegrityModeMismatch { sent: 0, expected: 2 }));
        assert!(matches!(verify(&d[..5], Integrity::Full), Err(WireError::Truncated { .. })));
    }

    #[test]
    fn names_round_trip() {
        for mode in [Integrity::Off, Integrity::Header, Integrity::Full, Integrity::Mac] {
            assert_eq!(Integrity::from_name(mode.name()), Some(mode));
        }
        assert_eq!(Integrity::from_name("sha"), None);
        assert_eq!(Integrity::default(), Integrity::Full);
    }
}
