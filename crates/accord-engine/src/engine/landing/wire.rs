//! The rendezvous' control messages: fixed 64-byte records written (one datagram, offset 0)
//! into the peer's control region, which the receiving worker hands to the landing thread
//! instead of placing. Decoding never trusts a byte: anything malformed is an error value.

use accord_proto::wire::RejectReason;

use crate::address::EngineId;

/// Bytes of every control message (and of the control region).
pub const CONTROL_MESSAGE_BYTES: usize = 64;
const MAGIC: [u8; 4] = *b"ACDL";
const VERSION: u8 = 1;

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

impl Control {
    pub(crate) fn encode(&self) -> [u8; CONTROL_MESSAGE_BYTES] {
        let mut b = [0u8; CONTROL_MESSAGE_BYTES];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        let (kind, words): (u8, [u64; 4]) = match self.body {
            Body::Ask { region, key, offset, len } => (1, [u64::from(region), key, offset, len]),
            Body::Grant { region, key, offset, len } => (2, [u64::from(region), key, offset, len]),
            Body::Refuse { reason } => (3, [u64::from(reason.to_u32()), 0, 0, 0]),
            Body::Landed => (4, [0; 4]),
            Body::Abandon => (5, [0; 4]),
            Body::Done => (6, [0; 4]),
        };
        b[5] = kind;
        b[8..16].copy_from_slice(&self.from.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.req.to_le_bytes());
        for (i, w) in words.iter().enumerate() {
            b[24 + 8 * i..32 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Parses one message placed at `offset` of the control region.
    pub(crate) fn decode(offset: u64, bytes: &[u8]) -> Result<Control, &'static str> {
        if offset != 0 || bytes.len() != CONTROL_MESSAGE_BYTES {
            return Err("not one whole control message at offset 0");
        }
        if bytes[..4] != MAGIC || bytes[4] != VERSION {
            return Err("bad magic or version");
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let (from, req) = (EngineId(word(8)), word(16));
        let [a, b, c, d] = [word(24), word(32), word(40), word(48)];
        let region = || u32::try_from(a).map_err(|_| "region id out of range");
        let body = match bytes[5] {
            1 => Body::Ask { region: region()?, key: b, offset: c, len: d },
            2 => Body::Grant { region: region()?, key: b, offset: c, len: d },
            // The same codes as a refused packet's ACK; bits above 32 carry nothing.
            3 => Body::Refuse { reason: RejectReason::from_u32(a as u32) },
            4 => Body::Landed,
            5 => Body::Abandon,
            6 => Body::Done,
            _ => return Err("unknown control message kind"),
        };
        Ok(Control { from, req, body })
    }
}
