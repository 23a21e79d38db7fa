//! The rendezvous' control messages, as frames of the engine's one control codec
//! ([`crate::engine::control`]): written (one datagram, offset 0) into the peer's control
//! region, which the receiving worker hands to the landing thread instead of placing. Decoding
//! never trusts a byte: anything malformed is an error value.

use accord_proto::wire::RejectReason;

use crate::address::EngineId;

pub(crate) use crate::engine::control::CONTROL_MESSAGE_BYTES;
use crate::engine::control::{ControlFrame, FrameError, RouteTag};

/// One control message; `from` is the sender's claim (checked against known peers), `req` the
/// writer's request id (random start per engine, so stale or forged ids miss).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Control {
    pub(crate) from: EngineId,
    pub(crate) req: u64,
    pub(crate) body: Body,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// Writer -> receiver: land `len` bytes at `offset` of device region `region`/`key`.
    Ask { region: u32, key: u64, offset: u64, len: u64 },
    /// Writer -> receiver: land the first `len` (1..=[`INLINE_BYTES_MAX`]) of `bytes` (the rest
    /// zero) at `offset` of device region `region`/`key`; the bytes travel in this message (its
    /// last word; `len` is the first half-word), so no slot is granted and no `Landed` follows:
    /// the receiver copies and says `Done`.
    AskInline { region: u32, key: u64, offset: u64, len: u8, bytes: [u8; INLINE_BYTES_MAX] },
    /// Receiver -> writer: write the chunk at `offset` of landing region `region`/`key`.
    Grant { region: u32, key: u64, offset: u64, len: u64 },
    /// Receiver -> writer: the ask was refused (or its copy failed).
    Refuse { reason: RejectReason },
    /// Writer -> receiver: the chunk's bytes are in the granted slot.
    Landed,
    /// Writer -> receiver: the chunk will not come (its write failed); free the slot.
    Abandon,
    /// Receiver -> writer: the chunk is in device memory.
    Done,
}

const ASK: u8 = 1;
const GRANT: u8 = 2;
const REFUSE: u8 = 3;
const LANDED: u8 = 4;
const ABANDON: u8 = 5;
const DONE: u8 = 6;
const ASK_INLINE: u8 = 7;

/// Most bytes a chunk may carry inside its ask ([`Body::AskInline`]): the frame's last word.
/// A signal, a flag or a `put_value` fits; a chunk this small would otherwise cost a grant, a
/// write, its acknowledgement and a `Landed` before its copy could start.
pub(crate) const INLINE_BYTES_MAX: usize = 8;

impl Control {
    pub(crate) fn encode(&self) -> [u8; CONTROL_MESSAGE_BYTES] {
        let mut halves = [0u32; 2];
        let (kind, words): (u8, [u64; 4]) = match self.body {
            Body::Ask { region, key, offset, len } => (ASK, [u64::from(region), key, offset, len]),
            Body::AskInline { region, key, offset, len, bytes } => {
                halves[0] = u32::from(len);
                (ASK_INLINE, [u64::from(region), key, offset, u64::from_le_bytes(bytes)])
            }
            Body::Grant { region, key, offset, len } => (GRANT, [u64::from(region), key, offset, len]),
            Body::Refuse { reason } => (REFUSE, [u64::from(reason.to_u32()), 0, 0, 0]),
            Body::Landed => (LANDED, [0; 4]),
            Body::Abandon => (ABANDON, [0; 4]),
            Body::Done => (DONE, [0; 4]),
        };
        ControlFrame { words, halves, ..ControlFrame::new(RouteTag::Landing, kind, self.from, self.req) }.encode()
    }

    /// Parses one message placed at `offset` of the control region.
    pub(crate) fn decode(offset: u64, bytes: &[u8]) -> Result<Control, FrameError> {
        let frame = ControlFrame::decode(offset, bytes)?;
        if frame.route != RouteTag::Landing {
            return Err(FrameError::UnknownRoute);
        }
        if frame.flags != 0 {
            return Err(FrameError::Kind(frame.kind));
        }
        let [a, b, c, d] = frame.words;
        let region = || u32::try_from(a).map_err(|_| FrameError::Field("region id out of range"));
        let body = match frame.kind {
            ASK => Body::Ask { region: region()?, key: b, offset: c, len: d },
            ASK_INLINE => {
                // The length is the first half-word; the bytes past it and the second half-word
                // must be zero, so that one message has one meaning.
                let len = frame.halves[0] as usize;
                if !(1..=INLINE_BYTES_MAX).contains(&len) || frame.halves[1] != 0 {
                    return Err(FrameError::Field("inline length out of range"));
                }
                if len < INLINE_BYTES_MAX && d >> (8 * len) != 0 {
                    return Err(FrameError::Field("inline bytes past the length"));
                }
                Body::AskInline { region: region()?, key: b, offset: c, len: len as u8, bytes: d.to_le_bytes() }
            }
            GRANT => Body::Grant { region: region()?, key: b, offset: c, len: d },
            // The same codes as a refused packet's ACK; bits above 32 carry nothing.
            REFUSE => Body::Refuse { reason: RejectReason::from_u32(a as u32) },
            LANDED => Body::Landed,
            ABANDON => Body::Abandon,
            DONE => Body::Done,
            other => return Err(FrameError::Kind(other)),
        };
        Ok(Control { from: frame.from, req: frame.req, body })
    }
}
