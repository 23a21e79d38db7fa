//! The engine's internal control frames: the one codec for every message a route sends to its
//! counterpart in a peer engine (the landing rendezvous' asks and grants, the pull route's
//! hellos and pulls, READ's requests and replies).
//!
//! Why one codec: these messages travel as ordinary 64-byte writes into the peer's control
//! region, so the transport delivers them reliably and exactly once, and the receiving worker
//! hands them to the route they name instead of placing them. One frame layout, parsed in one
//! place, means one set of checks on bytes that came from the wire, and a worker that knows
//! frames, not routes.
//!
//! Layout (little-endian, 64 bytes):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | route tag (`ACDL` landing, `ACPL` pull, `ACRD` read) |
//! | 4 | version ([`CONTROL_FRAME_VERSION`]) |
//! | 5 | kind (per route) |
//! | 6 | flags (per route) |
//! | 7 | reserved, zero |
//! | 8..16 | sender's engine id (a claim the route checks against its known peers) |
//! | 16..24 | request id |
//! | 24..56 | four words (per route and kind) |
//! | 56..64 | two half-words (per route and kind) |
//!
//! Decoding never trusts a byte: anything malformed is a [`FrameError`], never a panic.

use crate::address::EngineId;
use accord_proto::frame::FrameReader;

/// Bytes of every control frame (and of the control region).
pub const CONTROL_MESSAGE_BYTES: usize = 64;
/// The layout's version; a frame of another version is refused.
pub const CONTROL_FRAME_VERSION: u8 = 1;

/// Which route a frame belongs to.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RouteTag {
    /// The landing rendezvous (device writes the copy engine cannot reach).
    Landing,
    /// The cross-memory pull route between processes of one host.
    Pull,
    /// READ, a one-sided pull: a reader's request and the owner's answer (`route/read.rs`).
    Read,
}

impl RouteTag {
    /// Every tag, for tables and tests.
    pub(crate) const ALL: [RouteTag; 3] = [RouteTag::Landing, RouteTag::Pull, RouteTag::Read];

    const fn magic(self) -> [u8; 4] {
        match self {
            RouteTag::Landing => *b"ACDL",
            RouteTag::Pull => *b"ACPL",
            RouteTag::Read => *b"ACRD",
        }
    }

    fn from_magic(magic: &[u8]) -> Option<RouteTag> {
        RouteTag::ALL.into_iter().find(|tag| tag.magic() == magic)
    }
}

/// One control frame, decoded; the route gives `kind`, `flags`, `words` and `halves` meaning.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct ControlFrame {
    pub(crate) route: RouteTag,
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) from: EngineId,
    pub(crate) req: u64,
    pub(crate) words: [u64; 4],
    pub(crate) halves: [u32; 2],
}

/// Why bytes in the control region are not a frame.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// Not one whole frame written at offset 0.
    #[error("not one whole control frame at offset 0")]
    NotWhole,
    /// The first four bytes name no route.
    #[error("the frame names no known route")]
    UnknownRoute,
    /// Another layout version.
    #[error("control frame version {0} is not {CONTROL_FRAME_VERSION}")]
    Version(u8),
    /// The reserved byte is not zero.
    #[error("reserved bits set")]
    Reserved,
    /// The route does not know this kind (or these flags).
    #[error("unknown control frame kind {0}")]
    Kind(u8),
    /// A field holds a value its route refuses.
    #[error("{0}")]
    Field(&'static str),
}

impl ControlFrame {
    /// A frame of `route` with every route-specific field zero.
    pub(crate) fn new(route: RouteTag, kind: u8, from: EngineId, req: u64) -> ControlFrame {
        ControlFrame { route, kind, flags: 0, from, req, words: [0; 4], halves: [0; 2] }
    }

    /// The frame's 64 bytes.
    pub(crate) fn encode(&self) -> [u8; CONTROL_MESSAGE_BYTES] {
        let mut b = [0u8; CONTROL_MESSAGE_BYTES];
        b[..4].copy_from_slice(&self.route.magic());
        b[4] = CONTROL_FRAME_VERSION;
        b[5] = self.kind;
        b[6] = self.flags;
        b[8..16].copy_from_slice(&self.from.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.req.to_le_bytes());
        for (i, w) in self.words.iter().enumerate() {
            b[24 + 8 * i..32 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        b[56..60].copy_from_slice(&self.halves[0].to_le_bytes());
        b[60..64].copy_from_slice(&self.halves[1].to_le_bytes());
        b
    }

    /// Parses the bytes a peer placed at `offset` of our control region.
    pub(crate) fn decode(offset: u64, bytes: &[u8]) -> Result<ControlFrame, FrameError> {
        let bytes: &[u8; CONTROL_MESSAGE_BYTES] = match (offset, bytes.try_into()) {
            (0, Ok(whole)) => whole,
            _ => return Err(FrameError::NotWhole),
        };
        let route = RouteTag::from_magic(&bytes[..4]).ok_or(FrameError::UnknownRoute)?;
        if bytes[4] != CONTROL_FRAME_VERSION {
            return Err(FrameError::Version(bytes[4]));
        }
        if bytes[7] != 0 {
            return Err(FrameError::Reserved);
        }
        let mut fields = FrameReader::at(bytes, 5);
        let read = |fields: &mut FrameReader<'_>| -> Result<ControlFrame, accord_proto::frame::FrameError> {
            let (kind, flags, _reserved) = (fields.u8()?, fields.u8()?, fields.u8()?);
            let (from, req) = (EngineId(fields.u64()?), fields.u64()?);
            let words = [fields.u64()?, fields.u64()?, fields.u64()?, fields.u64()?];
            let halves = [fields.u32()?, fields.u32()?];
            Ok(ControlFrame { route, kind, flags, from, req, words, halves })
        };
        // The frame is exactly 64 bytes (checked above), so no read can run past its end.
        read(&mut fields).map_err(|_| FrameError::NotWhole)
    }

    /// The route a message names, if it is a whole frame of a known route (the worker's
    /// dispatch; the route decodes it in full).
    pub(crate) fn route_of(offset: u64, bytes: &[u8]) -> Option<RouteTag> {
        if offset != 0 || bytes.len() != CONTROL_MESSAGE_BYTES {
            return None;
        }
        RouteTag::from_magic(&bytes[..4])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_for_every_route() {
        for route in RouteTag::ALL {
            let frame = ControlFrame {
                route,
                kind: 3,
                flags: 1,
                from: EngineId(0x0102_0304_0506_0708),
                req: u64::MAX,
                words: [1, u64::MAX, 3, 4],
                halves: [5, u32::MAX],
            };
            let bytes = frame.encode();
            assert_eq!(ControlFrame::decode(0, &bytes), Ok(frame));
            assert_eq!(ControlFrame::route_of(0, &bytes), Some(route));
        }
    }

    #[test]
    fn malformed_bytes_are_errors() {
        let good = ControlFrame::new(RouteTag::Pull, 1, EngineId(7), 9).encode();
        assert_eq!(ControlFrame::decode(8, &good), Err(FrameError::NotWhole));
        assert_eq!(ControlFrame::decode(0, &good[..63]), Err(FrameError::NotWhole));
        assert_eq!(ControlFrame::decode(0, &[]), Err(FrameError::NotWhole));
        let mut bad = good;
        bad[0] ^= 0xff;
        assert_eq!(ControlFrame::decode(0, &bad), Err(FrameError::UnknownRoute));
        assert_eq!(ControlFrame::route_of(0, &bad), None);
        let mut bad = good;
        bad[4] = 2;
        assert_eq!(ControlFrame::decode(0, &bad), Err(FrameError::Version(2)));
        let mut bad = good;
        bad[7] = 1;
        assert_eq!(ControlFrame::decode(0, &bad), Err(FrameError::Reserved));
    }

    #[test]
    fn no_byte_string_panics_the_decoder() {
        // Every length up to two frames, and every single-byte change of a good frame.
        let good = ControlFrame::new(RouteTag::Landing, 1, EngineId(1), 2).encode();
        for len in 0..=2 * CONTROL_MESSAGE_BYTES {
            let bytes: Vec<u8> = (0..len).map(|i| good.get(i).copied().unwrap_or(0xa5)).collect();
            let _ = ControlFrame::decode(0, &bytes);
        }
        for i in 0..CONTROL_MESSAGE_BYTES {
            for value in [0u8, 1, 0x7f, 0xff] {
                let mut bytes = good;
                bytes[i] = value;
                let _ = ControlFrame::decode(0, &bytes);
            }
        }
    }
}
