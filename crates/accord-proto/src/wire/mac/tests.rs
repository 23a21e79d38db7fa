//! The tag and the key schedule, on bytes alone.

use super::*;
use crate::wire::Integrity;

const SECRET: JobSecret = JobSecret([0x42; 32]);

fn side(conn: u32, token: u64) -> ConnSide {
    ConnSide { conn: ConnectionId(conn), token }
}

/// A Data packet with `payload` and room for the tag, sealed under `key`.
fn sealed_data(payload: &[u8], key: &MacKey) -> Vec<u8> {
    let mut buf = crate::wire::integrity::data_packet(payload);
    buf.resize(buf.len() + MAC_TAG_LEN, 0);
    seal_mac(&mut buf, key);
    buf
}

#[test]
fn both_sides_derive_each_others_keys_and_directions_differ() {
    let (i, a) = (side(3, 0x1111), side(8, 0x2222));
    let initiator = ConnKeys::derive(&SECRET, i, a, true);
    let acceptor = ConnKeys::derive(&SECRET, i, a, false);
    assert_eq!(initiator.tx, acceptor.rx);
    assert_eq!(initiator.rx, acceptor.tx);
    assert_ne!(initiator.tx, initiator.rx, "each direction has its own key");
    let other_token = ConnKeys::derive(&SECRET, side(3, 0x1112), a, true);
    assert_ne!(other_token.tx, initiator.tx, "a new nonce gives new keys");
    let other_secret = ConnKeys::derive(&JobSecret([0x43; 32]), i, a, true);
    assert_ne!(other_secret.tx, initiator.tx);
    assert_ne!(MacKey::handshake(&SECRET), initiator.tx);
    assert_eq!(format!("{:?}", initiator.tx), "MacKey(..)", "Debug never prints a key");
}

#[test]
fn a_sealed_packet_verifies_and_every_single_bit_flip_is_refused() {
    let key = ConnKeys::derive(&SECRET, side(1, 2), side(3, 4), true).tx;
    let d = sealed_data(&[0xa5; 48], &key);
    assert_eq!(d[crate::wire::field::INTEGRITY], Integrity::Mac.to_u8());
    assert_eq!(verify_mac(&d, &key), Ok(d.len() - MAC_TAG_LEN));
    assert!(crate::wire::parse(&d[..d.len() - MAC_TAG_LEN]).is_ok(), "without its trailer the packet parses");
    for bit in 0..d.len() * 8 {
        let mut bad = d.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(verify_mac(&bad, &key).is_err(), "flip of bit {bit} passed");
    }
}

#[test]
fn another_key_a_crc_seal_or_a_short_datagram_is_refused() {
    let keys = ConnKeys::derive(&SECRET, side(1, 2), side(3, 4), true);
    let d = sealed_data(&[1; 8], &keys.tx);
    assert_eq!(verify_mac(&d, &keys.rx), Err(WireError::BadTag), "the other direction's key");
    assert_eq!(verify_mac(&d, &MacKey::handshake(&SECRET)), Err(WireError::BadTag));
    let mut crc = d.clone();
    crate::wire::seal(&mut crc, Integrity::Full);
    assert!(matches!(verify_mac(&crc, &keys.tx), Err(WireError::IntegrityModeMismatch { sent: 2, expected: 3 })));
    assert!(matches!(verify_mac(&d[..HEADER_LEN + MAC_TAG_LEN - 1], &keys.tx), Err(WireError::Truncated { .. })));
    assert_eq!(crate::wire::verify(&d, Integrity::Mac), Err(WireError::BadTag), "the keyless check refuses mac");
    let mut short = [7u8; HEADER_LEN + MAC_TAG_LEN - 1];
    seal_mac(&mut short, &keys.tx);
    assert_eq!(short, [7u8; HEADER_LEN + MAC_TAG_LEN - 1], "too short to seal: left alone");
}
