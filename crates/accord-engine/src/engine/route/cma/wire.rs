//! The pull route's control messages, as frames of the engine's one control codec
//! ([`crate::engine::control`]): written into the peer's control region, which the receiving
//! worker hands to this route instead of placing. Decoding never trusts a byte: anything
//! malformed is an error value.

use accord_proto::wire::RejectReason;

use crate::address::EngineId;
use crate::engine::control::{ControlFrame, FrameError, RouteTag, CONTROL_MESSAGE_BYTES};

const FLAG_IMM: u8 = 1;
const HELLO: u8 = 1;
const PULL: u8 = 2;
const REPLY: u8 = 3;

/// One message; `from` is the sender's claim (checked against known same-host peers), `req`
/// the writer's request id (random start per engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PullMessage {
    pub(crate) from: EngineId,
    pub(crate) req: u64,
    pub(crate) body: Body,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// Writer -> receiver: read the 8 bytes at `id_addr` of my process; they are my engine id
    /// (proves the pid the receiver knows for me is this process, in this pid namespace).
    Hello { id_addr: u64 },
    /// Writer -> receiver: copy `len` bytes at `src_addr` of my process into region
    /// `region`/`key` at `offset`, then count `imm`.
    Pull { src_addr: u64, len: u64, region: u32, key: u64, offset: u64, imm: Option<u32> },
    /// Receiver -> writer: the outcome of a hello or a pull.
    Reply { outcome: Outcome },
}

/// What a receiver answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done: the hello verified, or the bytes landed (and the immediate was counted).
    Done,
    /// This route cannot serve the writer (no permission, unknown or unverified writer, the
    /// read failed): nothing was counted; the writer sends the bytes over the transport.
    Unavailable,
    /// The destination refused, as a transport write would have been.
    Refused(RejectReason),
}

impl Outcome {
    fn code(self) -> u32 {
        match self {
            Outcome::Done => 0,
            Outcome::Unavailable => 1,
            // Refusals take the codes a refused packet's ACK carries, shifted past ours.
            Outcome::Refused(r) => 2u32.saturating_add(r.to_u32()),
        }
    }

    fn from_code(code: u32) -> Outcome {
        match code {
            0 => Outcome::Done,
            1 => Outcome::Unavailable,
            c => Outcome::Refused(RejectReason::from_u32(c - 2)),
        }
    }
}

/// Whether a control message belongs to this route.
#[cfg(test)]
pub(crate) fn is_pull_message(bytes: &[u8]) -> bool {
    ControlFrame::route_of(0, bytes) == Some(RouteTag::Pull)
}

impl PullMessage {
    pub(crate) fn encode(&self) -> [u8; CONTROL_MESSAGE_BYTES] {
        let (kind, flags, words, region_or_code, imm) = match self.body {
            Body::Hello { id_addr } => (HELLO, 0u8, [id_addr, 0, 0, 0], 0u32, 0u32),
            Body::Pull { src_addr, len, region, key, offset, imm } => {
                (PULL, if imm.is_some() { FLAG_IMM } else { 0 }, [src_addr, len, key, offset], region, imm.unwrap_or(0))
            }
            Body::Reply { outcome } => (REPLY, 0, [0; 4], outcome.code(), 0),
        };
        let frame = ControlFrame::new(RouteTag::Pull, kind, self.from, self.req);
        ControlFrame { flags, words, halves: [region_or_code, imm], ..frame }.encode()
    }

    /// Parses one message placed at `offset` of the control region.
    pub(crate) fn decode(offset: u64, bytes: &[u8]) -> Result<PullMessage, FrameError> {
        let frame = ControlFrame::decode(offset, bytes)?;
        if frame.route != RouteTag::Pull {
            return Err(FrameError::UnknownRoute);
        }
        if frame.flags & !FLAG_IMM != 0 {
            return Err(FrameError::Reserved);
        }
        let [a, b, c, d] = frame.words;
        let [region_or_code, imm] = frame.halves;
        let body = match frame.kind {
            HELLO => Body::Hello { id_addr: a },
            PULL => Body::Pull {
                src_addr: a,
                len: b,
                key: c,
                offset: d,
                region: region_or_code,
                imm: (frame.flags & FLAG_IMM != 0).then_some(imm),
            },
            REPLY => Body::Reply { outcome: Outcome::from_code(region_or_code) },
            other => return Err(FrameError::Kind(other)),
        };
        Ok(PullMessage { from: frame.from, req: frame.req, body })
    }
}
