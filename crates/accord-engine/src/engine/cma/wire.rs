//! The pull route's control messages: fixed 64-byte records written into the peer's control
//! region (as the landing rendezvous' are, told apart by their magic), which the receiving
//! worker serves instead of placing. Decoding never trusts a byte: anything malformed is an
//! error value.

use accord_proto::wire::RejectReason;

use crate::address::EngineId;
use crate::engine::landing::wire::CONTROL_MESSAGE_BYTES;

const MAGIC: [u8; 4] = *b"ACPL";
const VERSION: u8 = 1;
const FLAG_IMM: u8 = 1;

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
pub(crate) fn is_pull_message(bytes: &[u8]) -> bool {
    bytes.len() == CONTROL_MESSAGE_BYTES && bytes[..4] == MAGIC
}

impl PullMessage {
    pub(crate) fn encode(&self) -> [u8; CONTROL_MESSAGE_BYTES] {
        let mut b = [0u8; CONTROL_MESSAGE_BYTES];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        let (kind, flags, words, region_or_code, imm) = match self.body {
            Body::Hello { id_addr } => (1u8, 0u8, [id_addr, 0, 0, 0], 0u32, 0u32),
            Body::Pull { src_addr, len, region, key, offset, imm } => {
                (2, if imm.is_some() { FLAG_IMM } else { 0 }, [src_addr, len, key, offset], region, imm.unwrap_or(0))
            }
            Body::Reply { outcome } => (3, 0, [0; 4], outcome.code(), 0),
        };
        b[5] = kind;
        b[6] = flags;
        b[8..16].copy_from_slice(&self.from.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.req.to_le_bytes());
        for (i, w) in words.iter().enumerate() {
            b[24 + 8 * i..32 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        b[56..60].copy_from_slice(&region_or_code.to_le_bytes());
        b[60..64].copy_from_slice(&imm.to_le_bytes());
        b
    }

    /// Parses one message placed at `offset` of the control region.
    pub(crate) fn decode(offset: u64, bytes: &[u8]) -> Result<PullMessage, &'static str> {
        if offset != 0 || bytes.len() != CONTROL_MESSAGE_BYTES {
            return Err("not one whole control message at offset 0");
        }
        if bytes[..4] != MAGIC || bytes[4] != VERSION {
            return Err("bad magic or version");
        }
        if bytes[7] != 0 || bytes[6] & !FLAG_IMM != 0 {
            return Err("reserved bits set");
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let half = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let (from, req) = (EngineId(word(8)), word(16));
        let [a, b, c, d] = [word(24), word(32), word(40), word(48)];
        let (region_or_code, imm) = (half(56), half(60));
        let body = match bytes[5] {
            1 => Body::Hello { id_addr: a },
            2 => Body::Pull {
                src_addr: a,
                len: b,
                key: c,
                offset: d,
                region: region_or_code,
                imm: (bytes[6] & FLAG_IMM != 0).then_some(imm),
            },
            3 => Body::Reply { outcome: Outcome::from_code(region_or_code) },
            _ => return Err("unknown pull message kind"),
        };
        Ok(PullMessage { from, req, body })
    }
}
