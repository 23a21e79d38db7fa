//! The clear-to-send (CTS) entry a receiver writes into its sender's CTS ring, one per `irecv`:
//! which request slot it is, and for each of its receives the tag, the capacity, where the
//! bytes go (region, key, length and offset of the registered destination) and in how many
//! pieces the sender writes them (each piece its own write with the completion immediate).

use crate::error::PluginError;
use accord_proto::frame::{FrameError, FrameReader};

/// Most receives one grouped `irecv` may hold (`maxRecvs`).
pub const RECVS_MAX: usize = 8;
/// Most pieces one receive's bytes are written in (one write, and one immediate, per piece).
pub const PIECES_MAX: u32 = 16;
/// First word of every entry ("CTS2").
pub const CTS_MAGIC: u32 = 0x4354_5332;
const HEADER_BYTES: usize = 24;
const RECV_BYTES: usize = 44;
/// Bytes of one ring entry (header plus [`RECVS_MAX`] receives, rounded up to 64).
pub const ENTRY_BYTES: usize = (HEADER_BYTES + RECVS_MAX * RECV_BYTES).next_multiple_of(64);

/// Where one receive of a grouped `irecv` wants its bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct CtsRecv {
    /// NCCL's tag; the sender matches `isend` tags against it.
    pub tag: i32,
    /// Destination region id at the receiver's engine (0 with `size` 0: nothing to place).
    pub region: u32,
    /// The region's key.
    pub key: u64,
    /// The region's length.
    pub region_len: u64,
    /// Offset of the receive buffer in the region.
    pub offset: u64,
    /// Capacity of the receive buffer.
    pub size: u64,
    /// Data writes the sender makes into this receive, 1..=[`PIECES_MAX`] (the receiver counts
    /// that many immediates plus one for the size word).
    pub pieces: u32,
}

/// One clear-to-send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtsEntry {
    /// The receiver's request sequence number (the sender consumes entries in this order).
    pub seq: u64,
    /// The receiver's request slot (`seq % NET_REQUESTS_MAX`); completion immediates name it.
    pub slot: u32,
    /// The receives, 1..=[`RECVS_MAX`].
    pub recvs: Vec<CtsRecv>,
}

impl CtsEntry {
    /// Serialises into one ring entry.
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        assert!(!self.recvs.is_empty() && self.recvs.len() <= RECVS_MAX, "callers bound the receive count");
        let mut out = [0u8; ENTRY_BYTES];
        out[0..4].copy_from_slice(&CTS_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&(self.recvs.len() as u32).to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..20].copy_from_slice(&self.slot.to_le_bytes());
        for (i, r) in self.recvs.iter().enumerate() {
            let at = HEADER_BYTES + i * RECV_BYTES;
            out[at..at + 4].copy_from_slice(&r.tag.to_le_bytes());
            out[at + 4..at + 8].copy_from_slice(&r.region.to_le_bytes());
            out[at + 8..at + 16].copy_from_slice(&r.key.to_le_bytes());
            out[at + 16..at + 24].copy_from_slice(&r.region_len.to_le_bytes());
            out[at + 24..at + 32].copy_from_slice(&r.offset.to_le_bytes());
            out[at + 32..at + 40].copy_from_slice(&r.size.to_le_bytes());
            out[at + 40..at + 44].copy_from_slice(&r.pieces.to_le_bytes());
        }
        out
    }

    /// Parses one ring entry; `expected_seq` is the sequence number the sender waits for.
    pub fn decode(bytes: &[u8; ENTRY_BYTES], expected_seq: u64) -> Result<CtsEntry, PluginError> {
        let malformed =
            |e: FrameError| PluginError::Protocol(format!("clear-to-send entry {expected_seq} is malformed: {e}"));
        let mut header = FrameReader::new(bytes);
        let (magic, count, seq, slot) =
            (|| Ok((header.u32()?, header.u32()? as usize, header.u64()?, header.u32()?)))().map_err(malformed)?;
        if magic != CTS_MAGIC || count == 0 || count > RECVS_MAX || seq != expected_seq {
            return Err(PluginError::Protocol(format!(
                "clear-to-send entry {expected_seq} is malformed (magic {magic:#x}, {count} receives, sequence {seq})"
            )));
        }
        let recv = |i: usize| -> Result<CtsRecv, FrameError> {
            let mut r = FrameReader::at(bytes, HEADER_BYTES + i * RECV_BYTES);
            Ok(CtsRecv {
                tag: r.u32()? as i32,
                region: r.u32()?,
                key: r.u64()?,
                region_len: r.u64()?,
                offset: r.u64()?,
                size: r.u64()?,
                pieces: r.u32()?,
            })
        };
        let recvs = (0..count).map(recv).collect::<Result<Vec<_>, _>>().map_err(malformed)?;
        if let Some(r) = recvs.iter().find(|r| r.pieces == 0 || r.pieces > PIECES_MAX) {
            return Err(PluginError::Protocol(format!(
                "clear-to-send entry {expected_seq} asks for {} pieces (1..={PIECES_MAX})",
                r.pieces
            )));
        }
        Ok(CtsEntry { seq, slot, recvs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize) -> CtsEntry {
        let recvs = (0..n)
            .map(|i| CtsRecv {
                tag: -(i as i32) - 1,
                region: 7 + i as u32,
                key: u64::MAX - i as u64,
                region_len: 1 << 40,
                offset: 123 * i as u64,
                size: 1 << 30,
                pieces: 1 + i as u32,
            })
            .collect();
        CtsEntry { seq: 99, slot: 3, recvs }
    }

    #[test]
    fn entries_round_trip_and_fit_the_ring_slot() {
        const { assert!(ENTRY_BYTES >= HEADER_BYTES + RECVS_MAX * RECV_BYTES) };
        for n in 1..=RECVS_MAX {
            let e = entry(n);
            assert_eq!(CtsEntry::decode(&e.encode(), 99).unwrap(), e);
        }
    }

    #[test]
    fn stale_or_garbage_entries_are_refused() {
        let e = entry(2).encode();
        assert!(CtsEntry::decode(&e, 98).is_err(), "an old entry in the slot is not the awaited one");
        assert!(CtsEntry::decode(&[0u8; ENTRY_BYTES], 0).is_err());
        let mut bad = e;
        bad[4] = 200;
        assert!(CtsEntry::decode(&bad, 99).is_err());
        let mut zero_pieces = e;
        zero_pieces[HEADER_BYTES + 40..HEADER_BYTES + 44].copy_from_slice(&0u32.to_le_bytes());
        assert!(CtsEntry::decode(&zero_pieces, 99).is_err(), "a receive needs at least one piece");
        let mut many = e;
        many[HEADER_BYTES + 40..HEADER_BYTES + 44].copy_from_slice(&(PIECES_MAX + 1).to_le_bytes());
        assert!(CtsEntry::decode(&many, 99).is_err());
    }
}
