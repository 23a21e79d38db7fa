//! Admission: only holders of the job secret open connections.
//!
//! Why: anyone who could reach a port used to get a connection and a token with one Hello, and
//! could then deliver a `recv()` or a control message. With a [`JobSecret`] configured
//! ([`crate::EndpointConfig::secret`]), a Hello carries a proof, a truncated HMAC-SHA256 under
//! the secret over its own fields (among them the sender's fresh random token, the nonce);
//! the acceptor checks it *before* it allocates anything, so unproven Hellos cost no memory
//! and a flood of them cannot fill the connection table. The HelloAck's proof covers the
//! initiator's connection id and token from its header too, binding the answer to that Hello;
//! the initiator accepts no answer without it. The secret itself never travels. Every later
//! packet must carry the token learnt in this exchange, so control frames reach only admitted
//! connections.
//!
//! Not covered: a Hello captured and replayed verbatim by a host on the path opens a
//! connection that only the original sender could use (it alone knows the packets' tokens
//! are its own). The authenticated mode ([`crate::wire::mac`]) does not change that (the
//! Hello is authentic), but there nothing can be sent on such a connection without keys
//! derived from the secret, so it costs a table entry until it times out, and no more.

use crate::wire::{Header, HelloRepr};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The secret a job's ranks share (32 random bytes), distributed by the launcher. `Debug`
/// never prints it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct JobSecret(pub [u8; 32]);

impl core::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("JobSecret(..)")
    }
}

impl JobSecret {
    /// Parses 64 hex digits (the form `ACCORD_JOB_SECRET` takes).
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.len() != 64 || !text.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(JobSecret(bytes))
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Which handshake packet a proof is for: a Hello's proof never passes as a HelloAck's.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProofKind {
    Hello = 1,
    HelloAck = 2,
}

fn mac(secret: &JobSecret, kind: ProofKind, header: &Header, hello: &HelloRepr) -> Hmac<Sha256> {
    // `new_from_slice` accepts any key length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&secret.0).expect("HMAC takes any key length");
    mac.update(b"accord admission v1");
    mac.update(&[kind as u8]);
    mac.update(&header.dst_conn.0.to_be_bytes());
    mac.update(&header.token.to_be_bytes());
    mac.update(&hello.src_conn.0.to_be_bytes());
    mac.update(&hello.src_token.to_be_bytes());
    mac.update(&hello.max_payload_bytes.to_be_bytes());
    mac.update(&hello.path_count.to_be_bytes());
    mac.update(&hello.recv_window_packets.to_be_bytes());
    mac
}

/// The proof a Hello (header zero) or HelloAck (header naming the initiator) carries.
pub(crate) fn prove(secret: &JobSecret, kind: ProofKind, header: &Header, hello: &HelloRepr) -> [u8; 16] {
    let tag = mac(secret, kind, header, hello).finalize().into_bytes();
    let mut proof = [0u8; 16];
    proof.copy_from_slice(&tag[..16]);
    proof
}

/// Whether `hello.proof` is right, compared in constant time.
pub(crate) fn verify(secret: &JobSecret, kind: ProofKind, header: &Header, hello: &HelloRepr) -> bool {
    mac(secret, kind, header, hello).verify_truncated_left(&hello.proof).is_ok()
}

/// Proof for a challenge-response outside the transport (the bootstrap store): HMAC-SHA256
/// under the secret over a domain label and the challenger's fresh nonce.
pub fn challenge_proof(secret: &JobSecret, label: &[u8], nonce: &[u8]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&secret.0).expect("HMAC takes any key length");
    mac.update(label);
    mac.update(nonce);
    mac.finalize().into_bytes().into()
}

/// Checks a [`challenge_proof`] in constant time.
pub fn verify_challenge(secret: &JobSecret, label: &[u8], nonce: &[u8], proof: &[u8]) -> bool {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&secret.0).expect("HMAC takes any key length");
    mac.update(label);
    mac.update(nonce);
    mac.verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ConnectionId;

    fn hello() -> HelloRepr {
        HelloRepr {
            src_conn: ConnectionId(7),
            src_token: 0x1234,
            max_payload_bytes: 9000,
            path_count: 4,
            recv_window_packets: 256,
            proof: [0; 16],
        }
    }

    #[test]
    fn a_proof_verifies_only_under_its_secret_kind_and_fields() {
        let secret = JobSecret([7; 32]);
        let header = Header { dst_conn: ConnectionId(0), token: 0 };
        let mut h = hello();
        h.proof = prove(&secret, ProofKind::Hello, &header, &h);
        assert!(verify(&secret, ProofKind::Hello, &header, &h));
        assert!(!verify(&JobSecret([8; 32]), ProofKind::Hello, &header, &h), "another secret");
        assert!(!verify(&secret, ProofKind::HelloAck, &header, &h), "a Hello's proof is no HelloAck's");
        let other_header = Header { dst_conn: ConnectionId(1), token: 5 };
        assert!(!verify(&secret, ProofKind::Hello, &other_header, &h), "bound to the header");
        let mut tampered = h;
        tampered.src_token ^= 1;
        assert!(!verify(&secret, ProofKind::Hello, &header, &tampered), "bound to the token");
        let mut zero = h;
        zero.proof = [0; 16];
        assert!(!verify(&secret, ProofKind::Hello, &header, &zero));
    }

    #[test]
    fn hex_round_trips_and_debug_hides_the_secret() {
        let secret = JobSecret(core::array::from_fn(|i| i as u8 * 7));
        assert_eq!(JobSecret::from_hex(&secret.to_hex()), Some(secret));
        assert_eq!(JobSecret::from_hex("abc"), None);
        assert_eq!(JobSecret::from_hex(&"g".repeat(64)), None);
        assert_eq!(format!("{secret:?}"), "JobSecret(..)");
    }
}
