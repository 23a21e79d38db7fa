//! The two frames the collectives send each other through the engine's messages: a control
//! message (a tagged body for a rank's handshake or algorithm) and a stuck notice (this rank
//! waits on that one and will give up).
//!
//! Layout, little-endian, the same since the frames were introduced: kind (`u8`), sender rank
//! (`u32`), value (`u32`: the control tag, or the rank waited on), then the control body.
//! Read through [`accord_proto::frame`], so bytes that are not such a frame (truncated, a
//! stuck notice with a body, a body past the control limit, an unknown kind) are an error value
//! the receive handler logs and drops, never a panic on the engine's receive path.

use crate::transport::CTRL_MESSAGE_BYTES_MAX;
use accord_proto::frame::{FrameError, FrameReader, FrameWriter};

const KIND_CTRL: u8 = 1;
const KIND_STUCK: u8 = 2;
/// Kind, sender and value.
pub(super) const FRAME_HEADER_BYTES: usize = 9;

/// One decoded frame.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Frame<'a> {
    /// A control message from `sender` under `tag`.
    Ctrl { sender: usize, tag: u32, body: &'a [u8] },
    /// `sender` reports it is stuck waiting on rank `waiting_on`.
    Stuck { sender: usize, waiting_on: usize },
}

impl Frame<'_> {
    /// The frame's bytes.
    pub(super) fn encode(&self) -> Vec<u8> {
        let (kind, sender, value, body) = match *self {
            Frame::Ctrl { sender, tag, body } => (KIND_CTRL, sender, tag, body),
            Frame::Stuck { sender, waiting_on } => (KIND_STUCK, sender, waiting_on as u32, &[][..]),
        };
        let mut w = FrameWriter::with_capacity(FRAME_HEADER_BYTES + body.len());
        w.put_u8(kind).put_u32(sender as u32).put_u32(value).put_bytes(body);
        w.into_bytes()
    }

    /// Reads a received frame; everything a peer could send wrongly is an error.
    pub(super) fn decode(data: &[u8]) -> Result<Frame<'_>, FrameError> {
        let mut r = FrameReader::new(data);
        let kind = r.u8()?;
        let sender = r.u32()? as usize;
        let value = r.u32()?;
        match kind {
            KIND_CTRL => {
                let body = r.rest();
                if body.len() > CTRL_MESSAGE_BYTES_MAX {
                    return Err(FrameError::Invalid("control message body exceeds CTRL_MESSAGE_BYTES_MAX"));
                }
                Ok(Frame::Ctrl { sender, tag: value, body })
            }
            KIND_STUCK => {
                r.finish()?;
                Ok(Frame::Stuck { sender, waiting_on: value as usize })
            }
            _ => Err(FrameError::Invalid("unknown collectives frame kind")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_keep_their_bytes_and_round_trip() {
        let ctrl = Frame::Ctrl { sender: 3, tag: 0x0102_0304, body: b"hi" };
        let bytes = ctrl.encode();
        assert_eq!(bytes, [&[1u8][..], &3u32.to_le_bytes(), &0x0102_0304u32.to_le_bytes(), b"hi"].concat());
        assert_eq!(Frame::decode(&bytes), Ok(ctrl));
        let stuck = Frame::Stuck { sender: 7, waiting_on: 2 };
        let bytes = stuck.encode();
        assert_eq!(bytes, [&[2u8][..], &7u32.to_le_bytes(), &2u32.to_le_bytes()].concat());
        assert_eq!(Frame::decode(&bytes), Ok(stuck));
        let empty = Frame::Ctrl { sender: 0, tag: 0, body: &[] };
        assert_eq!(Frame::decode(&empty.encode()), Ok(empty));
    }

    #[test]
    fn truncated_frames_are_errors() {
        let bytes = Frame::Stuck { sender: 7, waiting_on: 2 }.encode();
        for cut in 0..bytes.len() {
            assert!(
                matches!(Frame::decode(&bytes[..cut]), Err(FrameError::Truncated { .. })),
                "cut at {cut}: {:?}",
                Frame::decode(&bytes[..cut])
            );
        }
    }

    #[test]
    fn oversized_and_unknown_frames_are_errors() {
        let mut stuck_with_body = Frame::Stuck { sender: 1, waiting_on: 0 }.encode();
        stuck_with_body.push(0);
        assert_eq!(Frame::decode(&stuck_with_body), Err(FrameError::Trailing { extra: 1 }));
        let big = vec![0u8; CTRL_MESSAGE_BYTES_MAX + 1];
        let too_long = Frame::Ctrl { sender: 1, tag: 0, body: &big }.encode();
        assert!(matches!(Frame::decode(&too_long), Err(FrameError::Invalid(_))));
        let fits = Frame::Ctrl { sender: 1, tag: 0, body: &big[1..] }.encode();
        assert!(Frame::decode(&fits).is_ok(), "the limit itself is allowed");
        let mut unknown = Frame::Stuck { sender: 1, waiting_on: 0 }.encode();
        unknown[0] = 9;
        assert!(matches!(Frame::decode(&unknown), Err(FrameError::Invalid(_))));
    }
}
