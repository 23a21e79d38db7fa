//! The authenticated mode ([`Integrity::Mac`](super::Integrity::Mac)): a 16-byte tag per packet
//! under per-connection keys, for jobs whose packets cross a network that outsiders can write to.
//!
//! Why: the CRC catches accidents, not an attacker, who recomputes it; the admission proof
//! guards only the handshake, so a host on the path that learns a connection's token can forge
//! any later frame. Under a MAC no outsider can forge a packet, and a packet of one connection
//! or direction cannot be replayed into another (each has its own key).
//!
//! Primitive: BLAKE3 in keyed mode, truncated to 128 bits. On x86-64 it runs SIMD over the
//! 1 KiB chunks of a large datagram in parallel (SSE4.1, AVX2, AVX-512, picked at run time) and
//! needs one compression per 64 bytes for a small one; HMAC-SHA256 costs two extra compressions
//! per packet and runs serially, and Poly1305 needs a fresh one-time key per packet, which packets
//! without a sequence number (Acks, Probes) could not give safely.
//!
//! Key schedule (BLAKE3's key derivation mode, an extract-and-expand KDF in one call):
//! - handshake key = KDF("accord wire mac v1 handshake", job secret): Hello and HelloAck, sent
//!   before the peer's nonce is known, are tagged with it;
//! - connection key, one per direction = KDF("accord wire mac v1 connection", job secret ‖
//!   direction ‖ initiator's connection id and token ‖ acceptor's connection id and token).
//!   The tokens are each side's 64-bit random nonce, exchanged in the handshake; a new
//!   connection (a reconnect included) gets new keys.
//!
//! Placement: a trailer after the last byte of the datagram (after the payload for Data), so
//! the header layout is the CRC modes' and no other mode pays for the tag. The tag covers every
//! byte before it: header (the mode byte, and the CRC field, zero in this mode, among them),
//! body and payload. A receiver verifies it before it reads anything but the type byte and
//! `dst_conn` (to choose the key), then parses the datagram without its trailer.
//!
//! Replays: an authentic packet replayed on its own connection and direction changes nothing,
//! by the transport's rules rather than by the MAC: a Data packet's number is already received
//! (a duplicate: dropped, at most acknowledged again), and an Ack, Credit, Probe answer or
//! handshake frame that resolves nothing is a stale frame (dropped and counted, no RTT sample,
//! no state). Replayed into another connection or the other direction, it fails the tag.

use super::{field, WireError, HEADER_LEN};
use crate::admission::JobSecret;
use crate::ids::ConnectionId;

/// Bytes of the tag trailer.
pub const MAC_TAG_LEN: usize = 16;

const HANDSHAKE_CONTEXT: &str = "accord wire mac v1 handshake";
const CONNECTION_CONTEXT: &str = "accord wire mac v1 connection";

/// A 256-bit key for packet tags. `Debug` never prints it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MacKey([u8; 32]);

impl core::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

/// One side of a connection: its connection id and its random token (the handshake nonce).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConnSide {
    pub conn: ConnectionId,
    pub token: u64,
}

/// Which way a key's packets go.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Direction {
    InitiatorToAcceptor = 1,
    AcceptorToInitiator = 2,
}

impl MacKey {
    /// The key of the handshake packets (Hello, HelloAck), from the job secret alone.
    pub fn handshake(secret: &JobSecret) -> MacKey {
        MacKey(blake3::derive_key(HANDSHAKE_CONTEXT, &secret.0))
    }

    fn connection(secret: &JobSecret, direction: Direction, initiator: ConnSide, acceptor: ConnSide) -> MacKey {
        let mut material = [0u8; 32 + 1 + 2 * 12];
        material[..32].copy_from_slice(&secret.0);
        material[32] = direction as u8;
        for (i, side) in [initiator, acceptor].iter().enumerate() {
            let at = 33 + 12 * i;
            material[at..at + 4].copy_from_slice(&side.conn.0.to_be_bytes());
            material[at + 4..at + 12].copy_from_slice(&side.token.to_be_bytes());
        }
        MacKey(blake3::derive_key(CONNECTION_CONTEXT, &material))
    }

    /// The tag of `covered`, truncated to [`MAC_TAG_LEN`].
    fn tag(&self, covered: &[u8]) -> [u8; MAC_TAG_LEN] {
        let hash = blake3::keyed_hash(&self.0, covered);
        let mut tag = [0u8; MAC_TAG_LEN];
        tag.copy_from_slice(&hash.as_bytes()[..MAC_TAG_LEN]);
        tag
    }
}

/// The two keys of one connection, seen from one side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnKeys {
    /// Tags what this side sends.
    pub tx: MacKey,
    /// Checks what this side receives.
    pub rx: MacKey,
}

impl ConnKeys {
    /// Both keys of the connection between `initiator` and `acceptor`; `we_initiated` says
    /// which of them this side is.
    pub fn derive(secret: &JobSecret, initiator: ConnSide, acceptor: ConnSide, we_initiated: bool) -> ConnKeys {
        let forward = MacKey::connection(secret, Direction::InitiatorToAcceptor, initiator, acceptor);
        let backward = MacKey::connection(secret, Direction::AcceptorToInitiator, initiator, acceptor);
        if we_initiated {
            ConnKeys { tx: forward, rx: backward }
        } else {
            ConnKeys { tx: backward, rx: forward }
        }
    }
}

/// Seals a datagram whose last [`MAC_TAG_LEN`] bytes are room for the tag: writes the mode
/// byte, zeroes the CRC field, and writes the tag over everything before the trailer. A buffer
/// too short to hold a header and a tag is left alone (the receiver refuses it).
pub fn seal_mac(datagram: &mut [u8], key: &MacKey) {
    let Some(covered_len) = datagram.len().checked_sub(MAC_TAG_LEN).filter(|&n| n >= HEADER_LEN) else {
        return;
    };
    datagram[field::INTEGRITY] = super::Integrity::Mac.to_u8();
    datagram[field::CRC].fill(0);
    let tag = key.tag(&datagram[..covered_len]);
    datagram[covered_len..].copy_from_slice(&tag);
}

/// Checks a datagram's tag under `key`; on success, the length of the datagram without its
/// trailer (what the parser reads). The comparison takes the same time wherever the tags
/// differ.
pub fn verify_mac(datagram: &[u8], key: &MacKey) -> Result<usize, WireError> {
    let needed = HEADER_LEN + MAC_TAG_LEN;
    if datagram.len() < needed {
        return Err(WireError::Truncated { needed, got: datagram.len() });
    }
    let sent_mode = datagram[field::INTEGRITY];
    if sent_mode != super::Integrity::Mac.to_u8() {
        return Err(WireError::IntegrityModeMismatch { sent: sent_mode, expected: super::Integrity::Mac.to_u8() });
    }
    let covered_len = datagram.len() - MAC_TAG_LEN;
    let expected = key.tag(&datagram[..covered_len]);
    let difference = expected.iter().zip(&datagram[covered_len..]).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if difference != 0 {
        return Err(WireError::BadTag);
    }
    Ok(covered_len)
}

#[cfg(test)]
mod tests;
