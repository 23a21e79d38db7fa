//! The authenticated mode between two endpoints, and the header-only seal of shared-memory
//! rings.

use super::*;

fn mac_config(secret: Option<[u8; 32]>) -> EndpointConfig {
    EndpointConfig { integrity: wire::Integrity::Mac, secret: secret.map(crate::JobSecret), ..Default::default() }
}

fn mac_pair(a_secret: [u8; 32], b_secret: [u8; 32]) -> (Endpoint, Endpoint, ConnectionHandle) {
    let mut a = Endpoint::new(mac_config(Some(a_secret)), 1).unwrap();
    let b = Endpoint::new(mac_config(Some(b_secret)), 2).unwrap();
    let conn = a.connect(t(0)).unwrap();
    (a, b, conn)
}

/// Datagrams `b` refused before reading them, whatever the reason.
fn refused(b: &Endpoint) -> u64 {
    let s = b.stats();
    s.malformed + s.unknown_connection + s.bad_token + s.bad_tag + s.integrity_mismatch + s.bad_checksum
}

/// One data packet of a 100-byte write from `a`, sealed as a driver seals it.
fn data_datagram(a: &mut Endpoint, conn: ConnectionHandle, now: Instant) -> (Transmit, Vec<u8>) {
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 100, imm: None, tag: 0 }).unwrap();
    let mut buf = vec![0u8; 9000];
    let tx = a.poll_transmit(now, &mut buf).expect("a data packet");
    assert!(tx.payload.is_some());
    let mut d = buf[..tx.header_len].to_vec();
    d.resize(tx.datagram_len(), 0);
    d[tx.header_len..tx.payload_end()].fill(0xab);
    tx.seal_payload(&mut d);
    (tx, d)
}

#[test]
fn mac_mode_without_a_secret_is_a_configuration_error() {
    let Err(e) = Endpoint::new(mac_config(None), 1) else { panic!("mac without a secret accepted") };
    assert_eq!(e, ConfigError::MacWithoutSecret);
    assert!(e.to_string().contains("ACCORD_JOB_SECRET"), "{e}");
}

/// Two holders of the secret connect and move data; every packet carries a tag (mode byte
/// 3, zero CRC field) and the tag budget comes out of the datagram size.
#[test]
fn holders_of_the_secret_move_data_with_a_tag_on_every_packet() {
    let (mut a, mut b, conn) = mac_pair([9; 32], [9; 32]);
    let mut mem = Memory::default();
    let mut to_b = exchange(&mut a, &mut b, &mut mem, t(1));
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 20_000, imm: Some(1), tag: 0 })
        .unwrap();
    to_b.extend(exchange(&mut a, &mut b, &mut mem, t(2)));
    let placed: usize = mem.placements.iter().map(|p| p.payload.len()).sum();
    assert_eq!(placed, 20_000);
    assert_eq!(refused(&b), 0);
    let max = ConnectionConfig::default().max_datagram_bytes as usize;
    for d in &to_b {
        assert_eq!(d[wire::field::INTEGRITY], wire::Integrity::Mac.to_u8());
        assert_eq!(&d[wire::field::CRC], &[0; 4]);
        assert!(d.len() <= max, "{} bytes exceed the {max}-byte datagram", d.len());
    }
}

/// Any one bit flipped anywhere in a data packet (header, body, payload, tag) and it is
/// refused before anything is read, and counted; the intact packet still lands.
#[test]
fn one_flipped_bit_anywhere_is_refused_and_counted() {
    let (mut a, mut b, conn) = mac_pair([9; 32], [9; 32]);
    let mut mem = Memory::default();
    exchange(&mut a, &mut b, &mut mem, t(1));
    let (_, d) = data_datagram(&mut a, conn, t(2));
    for bit in 0..d.len() * 8 {
        let mut bad = d.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        let before = refused(&b);
        assert_eq!(b.handle_datagram(t(2), RxMeta::default(), &bad, &mut mem).placement, None, "bit {bit}");
        assert_eq!(refused(&b), before + 1, "bit {bit}: counted");
    }
    assert!(b.stats().bad_tag >= (d.len() * 8 - 200) as u64, "most flips fail the tag itself");
    assert!(b.handle_datagram(t(2), RxMeta::default(), &d, &mut mem).placement.is_some());
}

/// Knowing the connection's id and token is not enough: a packet forged with them, or one
/// moved from another connection, fails the tag.
#[test]
fn a_forger_who_knows_the_token_is_refused() {
    let (mut a, mut b, conn) = mac_pair([9; 32], [9; 32]);
    let mut mem = Memory::default();
    exchange(&mut a, &mut b, &mut mem, t(1));
    let (_, d) = data_datagram(&mut a, conn, t(2));
    let len = d.len() - wire::MAC_TAG_LEN;
    let mut forged = d.clone();
    forged[len - 1] ^= 1; // last payload byte
    wire::seal(&mut forged[..len], wire::Integrity::Full); // a CRC recomputed as an attacker could
    forged[wire::field::INTEGRITY] = wire::Integrity::Mac.to_u8();
    assert_eq!(b.handle_datagram(t(2), RxMeta::default(), &forged, &mut mem).placement, None);
    // A second connection between the same endpoints: a's packet of the first, readdressed.
    let second = a.connect(t(3)).unwrap();
    exchange(&mut a, &mut b, &mut mem, t(3));
    assert!(a.is_established(second));
    let b_second = b.connections().last().unwrap();
    let mut moved = d.clone();
    moved[wire::field::DST_CONN].copy_from_slice(&b_second.0.to_be_bytes());
    moved[wire::field::TOKEN].copy_from_slice(&b.conns[&b_second].local_token().to_be_bytes());
    let before = b.stats().bad_tag;
    assert_eq!(b.handle_datagram(t(3), RxMeta::default(), &moved, &mut mem).placement, None);
    assert_eq!(b.stats().bad_tag, before + 1);
    assert_eq!(b.stats().bad_tag, 2);
}

/// Every authentic packet of a finished transfer replayed verbatim, both ways: nothing more is
/// placed, the sender's RTT does not move, and the replays are counted as duplicates or stale.
#[test]
fn replayed_authentic_packets_change_nothing() {
    let (mut a, mut b, conn) = mac_pair([9; 32], [9; 32]);
    let mut mem_b = Memory::default();
    let mut now = t(1);
    exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 50_000, imm: Some(3), tag: 0 })
        .unwrap();
    // Capture a's datagrams as they go to b.
    let mut a_to_b = vec![];
    let mut placed = 0;
    let mut buf = vec![0u8; 16 * 1024];
    let b_to_a = {
        while let Some(tx) = a.poll_transmit(now, &mut buf) {
            let mut d = buf[..tx.header_len].to_vec();
            d.resize(tx.datagram_len(), 0);
            tx.seal_payload(&mut d);
            if b.handle_datagram(now, RxMeta::default(), &d, &mut mem_b).placement.is_some() {
                placed += 1;
            }
            a_to_b.push(d);
        }
        exchange_timed(&mut a, &mut b, &mut mem_b, &mut now)
    };
    while let Some(Event::OpCompleted { .. } | Event::Connected { .. }) = a.poll_event() {}
    assert!(placed > 0 && !b_to_a.is_empty(), "{placed} placed, {} answers", b_to_a.len());
    let (a_before, b_conn) = (a.connection_stats(conn).unwrap(), b.connections().next().unwrap());
    let b_before = b.connection_stats(b_conn).unwrap();
    now = now + Duration::from_secs(2);
    for d in &a_to_b {
        assert_eq!(b.handle_datagram(now, RxMeta::default(), d, &mut mem_b).placement, None, "no byte placed twice");
    }
    for d in &b_to_a {
        a.handle_datagram(now, RxMeta::default(), d, &mut Memory::default());
    }
    let (a_after, b_after) = (a.connection_stats(conn).unwrap(), b.connection_stats(b_conn).unwrap());
    assert_eq!(a_after.rtt_smoothed, a_before.rtt_smoothed, "no RTT sample from a replayed ACK");
    assert!(a_after.stale_frames > a_before.stale_frames, "replayed ACKs counted stale");
    assert!(b_after.duplicates_received > b_before.duplicates_received, "replayed data counted");
    assert_eq!(refused(&b), 0, "authentic packets pass the tag; the transport drops them");
    assert!(a.poll_event().is_none(), "no event from a replay");
}

/// An endpoint with another secret: the Hello fails the handshake tag before anything else.
#[test]
fn a_peer_with_another_secret_is_refused_by_the_tag() {
    let (mut a, mut b, conn) = mac_pair([9; 32], [10; 32]);
    exchange(&mut a, &mut b, &mut Memory::default(), t(1));
    assert!(!a.is_established(conn));
    assert!(b.stats().bad_tag >= 1);
    assert_eq!(b.connections().count(), 0);
}

/// A ring of this job may carry a data packet sealed over its header only; the same bytes
/// from a network are refused (no downgrade there), in the CRC mode and in the MAC mode. A
/// header-only seal still catches a flipped header bit, and a lent datagram (payload not
/// copied) is checked on its header.
#[test]
fn a_header_only_seal_is_accepted_from_a_ring_and_refused_from_a_network() {
    for config in [EndpointConfig::default(), mac_config(Some([9; 32]))] {
        let mode = config.integrity;
        let mut a = Endpoint::new(config.clone(), 1).unwrap();
        let mut b = Endpoint::new(config, 2).unwrap();
        let conn = a.connect(t(0)).unwrap();
        let mut mem = Memory::default();
        exchange(&mut a, &mut b, &mut mem, t(1));
        let (tx, full) = data_datagram(&mut a, conn, t(2));
        let local = tx.for_local_channel();
        assert_eq!(local.seal, crate::api::PendingSeal::HeaderCrc, "{mode:?}");
        assert_eq!(local.datagram_len(), local.payload_end(), "{mode:?}: no trailer on a ring");
        // What the driver writes into a ring: the header, the payload, a header-only seal.
        let mut ring = full[..tx.payload_end()].to_vec();
        local.seal_payload(&mut ring);
        assert_eq!(ring[wire::field::INTEGRITY], wire::Integrity::Header.to_u8());
        let before = b.stats().integrity_mismatch;
        assert_eq!(b.handle_datagram(t(3), RxMeta::default(), &ring, &mut mem).placement, None, "{mode:?}");
        assert_eq!(b.stats().integrity_mismatch, before + 1, "{mode:?}: a network never downgrades");
        let mut flipped = ring.clone();
        flipped[wire::field::DATA_MSG_OFFSET.start] ^= 4;
        let before = b.stats().bad_checksum;
        assert_eq!(b.handle_local_datagram(t(3), RxMeta::default(), &flipped, true, &mut mem).placement, None);
        assert_eq!(b.stats().bad_checksum, before + 1, "{mode:?}: the header stays checked");
        let mut lent = ring.clone();
        lent[wire::DATA_HEADER_LEN..].fill(0x11); // what a lent slot holds past the header
        let out = b.handle_local_datagram(t(3), RxMeta::default(), &lent, false, &mut mem);
        assert!(out.placement.is_some(), "{mode:?}: header-only seal accepted from a ring");
        // The endpoint's own mode is accepted from a ring too (a datagram sealed before its
        // ring came up), checked in full when the payload was copied.
        let (_, second) = data_datagram(&mut a, conn, t(4));
        assert!(b.handle_local_datagram(t(4), RxMeta::default(), &second, true, &mut mem).placement.is_some());
        assert_eq!(b.stats().local_unverified, 0);
    }
}
