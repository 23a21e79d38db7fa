//! Endpoint tests without a network: handshake agreement, demux counters, and hostile input.

use super::*;
use crate::api::{ConnectionError, Placement, PlacementTarget, SendRequest};
use crate::config::ConnectionConfig;
use crate::ids::{PathId, RecvBufferId, RegionId, RegionKey};
use crate::wire::RejectReason;
use rand::{Rng, SeedableRng};
use std::time::Duration;

const KEY: RegionKey = RegionKey(0x1234_5678_9abc_def0);
const REGION_BYTES: u64 = 256 * 1024;

/// One region and unlimited receive buffers of 64 KiB; records every placement.
#[derive(Default)]
struct Memory {
    placements: Vec<Placement>,
    buffers_claimed: u64,
    /// Tags of operations this receiver completed (as the engine remembers them).
    completed: std::collections::HashSet<u64>,
    /// Region 1 was deregistered: every write is refused.
    deregistered: bool,
}

impl LocalMemory for Memory {
    fn check_write(&self, region: RegionId, key: RegionKey, offset: u64, len: u64) -> Result<(), RejectReason> {
        if region != RegionId(1) || self.deregistered {
            return Err(RejectReason::UnknownRegion);
        }
        if key != KEY {
            return Err(RejectReason::BadKey);
        }
        match offset.checked_add(len) {
            Some(end) if end <= REGION_BYTES => Ok(()),
            _ => Err(RejectReason::OutOfBounds),
        }
    }

    fn claim_recv_buffer(&mut self, _conn: ConnectionHandle, msg_len: u64) -> Result<RecvBufferId, RejectReason> {
        if msg_len > 64 * 1024 {
            return Err(RejectReason::MessageTooLarge);
        }
        self.buffers_claimed += 1;
        Ok(RecvBufferId(self.buffers_claimed))
    }

    fn already_completed(&self, tag: u64) -> bool {
        self.completed.contains(&tag)
    }
}

fn t(us: u64) -> Instant {
    Instant::from_nanos(us * 1000)
}

/// Moves every transmit between the two endpoints (payload bytes zero) until both are quiet;
/// returns the datagrams that went from `a` to `b`.
fn exchange(a: &mut Endpoint, b: &mut Endpoint, mem_b: &mut Memory, now: Instant) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut a_to_b = vec![];
    let mut mem_a = Memory::default();
    for _ in 0..10_000 {
        let mut moved = false;
        while let Some(tx) = a.poll_transmit(now, &mut buf) {
            let mut d = buf[..tx.header_len].to_vec();
            d.resize(tx.datagram_len(), 0);
            tx.seal_payload(&mut d);
            let out = b.handle_datagram(now, RxMeta { path: tx.path, ecn_ce: false }, &d, mem_b);
            if let Some(p) = out.placement {
                mem_b.placements.push(p);
            }
            a_to_b.push(d);
            moved = true;
        }
        while let Some(tx) = b.poll_transmit(now, &mut buf) {
            let mut d = buf[..tx.header_len].to_vec();
            d.resize(tx.datagram_len(), 0);
            tx.seal_payload(&mut d);
            a.handle_datagram(now, RxMeta { path: tx.path, ecn_ce: false }, &d, &mut mem_a);
            moved = true;
        }
        if !moved {
            break;
        }
    }
    a_to_b
}

fn pair(a_cfg: ConnectionConfig, b_cfg: ConnectionConfig) -> (Endpoint, Endpoint, ConnectionHandle) {
    let mut a = Endpoint::new(EndpointConfig { connection: a_cfg, ..Default::default() }, 1).unwrap();
    let b = Endpoint::new(EndpointConfig { connection: b_cfg, ..Default::default() }, 2).unwrap();
    let conn = a.connect(t(0)).unwrap();
    (a, b, conn)
}

#[test]
fn handshake_agrees_on_the_smaller_proposal() {
    let a_cfg = ConnectionConfig { path_count: 16, max_datagram_bytes: 9000, ..Default::default() };
    let b_cfg =
        ConnectionConfig { path_count: 4, max_datagram_bytes: 4192, recv_window_packets: 256, ..Default::default() };
    let (mut a, mut b, conn) = pair(a_cfg, b_cfg);
    exchange(&mut a, &mut b, &mut Memory::default(), t(1));
    assert!(a.is_established(conn));
    assert_eq!(a.poll_event(), Some(Event::Connected { conn }));
    let Some(Event::Accepted { conn: accepted }) = b.poll_event() else { panic!("no Accepted event") };
    for cfg in [a.connection_config(conn).unwrap(), b.connection_config(accepted).unwrap()] {
        assert_eq!((cfg.path_count, cfg.max_datagram_bytes, cfg.recv_window_packets), (4, 4192, 256));
    }
}

#[test]
fn lost_hello_is_retried_then_the_connection_fails() {
    // rto_min 1 ms, rto_max 4 ms, 20 ms of budget: hellos at 0, 1, 3, 7, 11, 15, 19 ms, then
    // one last check at the 20 ms deadline fails the connection.
    let cfg = ConnectionConfig {
        handshake_timeout: Duration::from_millis(20),
        rto_min: Duration::from_millis(1),
        rto_max: Duration::from_millis(4),
        ..Default::default()
    };
    let mut a = Endpoint::new(EndpointConfig { connection: cfg, ..Default::default() }, 1).unwrap();
    let conn = a.connect(t(0)).unwrap();
    let mut buf = vec![0u8; 9000];
    let mut hellos = 0;
    let mut now = t(0);
    for _ in 0..100 {
        while a.poll_transmit(now, &mut buf).is_some() {
            hellos += 1;
        }
        let Some(next) = a.poll_timeout() else { break };
        now = next;
        a.handle_timeout(now);
    }
    assert_eq!(hellos, 7, "backoff 1, 2, 4, then capped at rto_max 4 ms");
    assert_eq!(now, t(0) + Duration::from_millis(20), "failed at the deadline, not later");
    let events: Vec<Event> = std::iter::from_fn(|| a.poll_event()).collect();
    assert!(matches!(
        events.last(),
        Some(Event::ConnectionFailed { error: ConnectionError::HandshakeTimeout { attempts: 7, waited }, .. })
            if *waited == Duration::from_millis(20)
    ));
    assert_eq!(
        a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 1, imm: None, tag: 0 }),
        Err(SubmitError::ConnectionDown)
    );
}

/// A peer starved of CPU for 3 s (every Hello before then is lost) still gets connected: the
/// handshake retries by time (default 10 s), backing off to `rto_max`, rather than giving up
/// after a few quick retries (which took 255 ms and failed overloaded starts).
#[test]
fn a_peer_that_answers_only_after_seconds_still_connects() {
    let (mut a, mut b, conn) = pair(ConnectionConfig::default(), ConnectionConfig::default());
    let mut buf = vec![0u8; 9000];
    let mut now = t(0);
    let mut hellos = 0;
    while now < t(3_000_000) {
        while a.poll_transmit(now, &mut buf).is_some() {
            hellos += 1; // lost: the peer does not run yet
        }
        now = a.poll_timeout().expect("the handshake keeps a timer");
        a.handle_timeout(now);
        assert!(a.poll_event().is_none(), "no failure within the handshake budget (at {now:?})");
    }
    assert!(hellos > 8, "kept retrying: {hellos} hellos in 3 s");
    assert!(hellos < 40, "backed off to rto_max: {hellos} hellos in 3 s");
    // The peer is up: the Hello now due is answered.
    exchange(&mut a, &mut b, &mut Memory::default(), now);
    assert!(a.is_established(conn));
    assert_eq!(a.poll_event(), Some(Event::Connected { conn }));
}

#[test]
fn wrong_token_and_unknown_connection_are_dropped_and_counted() {
    let (mut a, mut b, conn) = pair(ConnectionConfig::default(), ConnectionConfig::default());
    let mut mem = Memory::default();
    exchange(&mut a, &mut b, &mut mem, t(1));
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 100, imm: None, tag: 0 }).unwrap();
    let mut buf = vec![0u8; 9000];
    let tx = a.poll_transmit(t(2), &mut buf).expect("a data packet");
    let mut datagram = buf[..tx.header_len].to_vec();
    datagram.resize(tx.datagram_len(), 0);
    tx.seal_payload(&mut datagram);
    let reseal = |d: &mut Vec<u8>| wire::seal(d, wire::Integrity::Full);
    let mut forged = datagram.clone();
    forged[8] ^= 0x40; // token
    assert_eq!(b.handle_datagram(t(2), RxMeta::default(), &forged, &mut mem).placement, None);
    assert_eq!(b.stats().bad_checksum, 1, "a flipped bit fails the end-to-end check first");
    reseal(&mut forged);
    assert_eq!(b.handle_datagram(t(2), RxMeta::default(), &forged, &mut mem).placement, None);
    assert_eq!(b.stats().bad_token, 1);
    let mut stray = datagram.clone();
    stray[4] ^= 0x01; // connection id
    reseal(&mut stray);
    assert_eq!(b.handle_datagram(t(2), RxMeta::default(), &stray, &mut mem).placement, None);
    assert_eq!(b.stats().unknown_connection, 1);
    let mut payload_flip = datagram.clone();
    *payload_flip.last_mut().unwrap() ^= 0x80;
    assert_eq!(b.handle_datagram(t(2), RxMeta::default(), &payload_flip, &mut mem).placement, None);
    assert_eq!(b.stats().bad_checksum, 2, "the default check covers the payload");
    assert!(b.handle_datagram(t(2), RxMeta::default(), &datagram, &mut mem).placement.is_some());
}

#[test]
fn random_bytes_never_panic_and_never_place() {
    let (mut a, mut b, _) = pair(ConnectionConfig::default(), ConnectionConfig::default());
    let mut mem = Memory::default();
    exchange(&mut a, &mut b, &mut mem, t(1));
    let conn_id = b.connections().next().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    for i in 0..200_000u32 {
        let len = rng.gen_range(0..1200);
        let mut d: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        // Most strings fail the version check; make half of them look like ours.
        if len >= wire::HEADER_LEN && i % 2 == 0 {
            d[0] = crate::wire::VERSION;
            d[1] = rng.gen_range(1..=7);
            d[4..8].copy_from_slice(&conn_id.0.to_be_bytes());
            // Half of those pass the end-to-end check too, to reach the parser.
            if i % 4 == 0 {
                wire::seal(&mut d, wire::Integrity::Full);
            }
        }
        let out =
            b.handle_datagram(t(2), RxMeta { path: PathId(rng.gen_range(0..20)), ecn_ce: rng.gen() }, &d, &mut mem);
        assert_eq!(out.placement, None, "random bytes were placed");
        b.handle_timeout(t(2));
        while b.poll_transmit(t(2), &mut [0u8; 9000]).is_some() {}
    }
    let s = b.stats();
    assert!(
        s.malformed + s.bad_token + s.unknown_connection + s.bad_checksum + s.integrity_mismatch > 100_000,
        "{s:?}"
    );
    assert!(s.malformed + s.bad_token + s.unknown_connection > 20_000, "sealed junk reached the parser: {s:?}");
    assert!(mem.placements.is_empty());
}

#[test]
fn mutated_valid_packets_never_escape_registered_memory() {
    let (mut a, mut b, conn) = pair(ConnectionConfig::default(), ConnectionConfig::default());
    let mut mem = Memory::default();
    exchange(&mut a, &mut b, &mut mem, t(1));
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 1000, len: 50_000, imm: Some(3), tag: 0 })
        .unwrap();
    a.send(conn, SendRequest { len: 9000, imm: None, tag: 0 }).unwrap();
    let captured = exchange(&mut a, &mut b, &mut mem, t(2));
    assert!(captured.len() > 10);
    mem.placements.clear();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..100_000 {
        let mut d = captured[rng.gen_range(0..captured.len())].clone();
        match rng.gen_range(0..4) {
            0 => {
                for _ in 0..rng.gen_range(1..4) {
                    let i = rng.gen_range(0..d.len().max(1));
                    if let Some(byte) = d.get_mut(i) {
                        *byte ^= 1 << rng.gen_range(0..8);
                    }
                }
            }
            1 => d.truncate(rng.gen_range(0..d.len().max(1))),
            2 => d.extend((0..rng.gen_range(1..64)).map(|_| rng.gen::<u8>())),
            _ => {
                // Rewrite one 8-byte field of the data header with a random value.
                let at = wire::HEADER_LEN + 8 * rng.gen_range(0..10);
                if d.len() >= at + 8 {
                    d[at..at + 8].copy_from_slice(&rng.gen::<u64>().to_be_bytes());
                }
            }
        }
        // Mutated after the end-to-end check (as a hostile sender would, or a fault that a
        // weaker checksum missed): the parser and the receiver's checks must still hold.
        wire::seal(&mut d, wire::Integrity::Full);
        let out = b.handle_datagram(t(3), RxMeta { path: PathId(rng.gen_range(0..16)), ecn_ce: false }, &d, &mut mem);
        if let Some(p) = out.placement {
            assert!(p.payload.end <= d.len());
            match p.target {
                PlacementTarget::Region { region, offset } => {
                    assert_eq!(region, RegionId(1));
                    assert!(offset + p.payload.len() as u64 <= REGION_BYTES, "placement escapes the region");
                }
                PlacementTarget::RecvBuffer { offset, .. } => assert!(offset + p.payload.len() as u64 <= 64 * 1024),
            }
        }
        while b.poll_transmit(t(3), &mut [0u8; 9000]).is_some() {}
    }
    b.check_invariants().unwrap();
}

/// A message's last packet asks for an immediate ACK; when it overtakes an earlier packet, the
/// ACK it gets still shows a hole, so the arrival that fills the hole is acknowledged at once
/// too instead of after `ack_delay_max` (the sender's completion waits on that ACK).
#[test]
fn filling_the_hole_under_an_ack_request_is_acknowledged_at_once() {
    let (mut a, mut b, conn) = pair(ConnectionConfig::default(), ConnectionConfig::default());
    let mut mem = Memory::default();
    exchange(&mut a, &mut b, &mut mem, t(1));
    let mss = a.connection_config(conn).unwrap().mss_bytes() as u64;
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 3 * mss, imm: Some(1), tag: 0 })
        .unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    let mut data = vec![];
    while let Some(tx) = a.poll_transmit(t(2), &mut buf) {
        let mut d = buf[..tx.header_len].to_vec();
        d.resize(tx.datagram_len(), 0);
        tx.seal_payload(&mut d);
        data.push((tx.path, d));
    }
    assert_eq!(data.len(), 3, "three data packets");
    let mut deliver = |i: usize| {
        let (path, d) = &data[i];
        b.handle_datagram(t(3), RxMeta { path: *path, ecn_ce: false }, d, &mut mem);
        let mut acks = 0;
        while b.poll_transmit(t(3), &mut [0u8; 9000]).is_some() {
            acks += 1;
        }
        acks
    };
    assert_eq!(deliver(2), 1, "the last packet asks for an ACK");
    assert_eq!(deliver(0), 0, "an earlier packet alone waits for the delayed ACK");
    assert_eq!(deliver(1), 1, "the packet that completes the picture is acknowledged at once");
}

/// Moves transmits both ways, one datagram every 10 µs of simulated time, until both sides are
/// quiet; returns the datagrams that went from `b` back to `a` (ACKs, mostly).
fn exchange_timed(a: &mut Endpoint, b: &mut Endpoint, mem_b: &mut Memory, now: &mut Instant) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut b_to_a = vec![];
    let mut mem_a = Memory::default();
    for _ in 0..10_000 {
        let mut moved = false;
        a.handle_timeout(*now);
        b.handle_timeout(*now);
        while let Some(tx) = a.poll_transmit(*now, &mut buf) {
            let mut d = buf[..tx.header_len].to_vec();
            d.resize(tx.datagram_len(), 0);
            tx.seal_payload(&mut d);
            *now = *now + Duration::from_micros(10);
            b.handle_datagram(*now, RxMeta { path: tx.path, ecn_ce: false }, &d, mem_b);
            moved = true;
        }
        while let Some(tx) = b.poll_transmit(*now, &mut buf) {
            let mut d = buf[..tx.header_len].to_vec();
            d.resize(tx.datagram_len(), 0);
            tx.seal_payload(&mut d);
            *now = *now + Duration::from_micros(10);
            a.handle_datagram(*now, RxMeta { path: tx.path, ecn_ce: false }, &d, &mut mem_a);
            b_to_a.push(d);
            moved = true;
        }
        if !moved {
            // Quiet: jump to the next timer (a delayed ACK, say), unless only the idle
            // timeout or nothing is left.
            let next = [a.poll_timeout(), b.poll_timeout()].into_iter().flatten().min();
            match next {
                Some(at) if at <= *now + Duration::from_millis(50) => *now = (*now).max(at),
                _ => break,
            }
        }
    }
    b_to_a
}

/// Two endpoints with default configurations, connected over `exchange_timed` from 1 µs: the
/// connection, `b`'s memory and the time reached.
fn connected() -> (Endpoint, Endpoint, ConnectionHandle, Memory, Instant) {
    let (mut a, mut b, conn) = pair(ConnectionConfig::default(), ConnectionConfig::default());
    let mut mem_b = Memory::default();
    let mut now = t(1);
    exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);
    (a, b, conn, mem_b, now)
}

/// The issue-25 attack: ACKs captured during a transfer, replayed seconds later. Before the
/// stale-frame rule each took an RTT sample of seconds; now none resolves anything, so RTT and
/// RTO stay as the live traffic set them, every replay is counted, and later writes complete.
#[test]
fn replayed_old_acks_do_not_inflate_rtt_or_rto() {
    let (mut a, mut b, conn, mut mem_b, mut now) = connected();
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 100_000, imm: None, tag: 0 }).unwrap();
    let captured = exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);
    assert!(!captured.is_empty(), "the transfer produced ACKs to replay");
    let before = a.connection_stats(conn).unwrap();
    assert!(before.rtt_smoothed < Duration::from_millis(1), "live RTT {:?}", before.rtt_smoothed);

    now = now + Duration::from_secs(5);
    for _ in 0..20 {
        for d in &captured {
            a.handle_datagram(now, RxMeta { path: PathId(0), ecn_ce: false }, d, &mut Memory::default());
        }
    }
    let after = a.connection_stats(conn).unwrap();
    assert_eq!(after.stale_frames - before.stale_frames, 20 * captured.len() as u64);
    assert_eq!((after.rtt_smoothed, after.rtt_min), (before.rtt_smoothed, before.rtt_min));
    let rto = |s: &ConnectionStats| s.paths.iter().map(|p| p.rto).collect::<Vec<_>>();
    assert_eq!(rto(&after), rto(&before));
    assert_eq!(after.packets_lost, before.packets_lost);

    // The connection still works, with no timeout inflated by the replay.
    while a.poll_event().is_some() {}
    let op = a
        .write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 50_000, imm: None, tag: 0 })
        .unwrap();
    exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);
    let completed = core::iter::from_fn(|| a.poll_event())
        .any(|e| matches!(e, Event::OpCompleted { op: done, result: Ok(()), .. } if done == op));
    assert!(completed, "a write after the replay completes");
    assert!(a.connection_stats(conn).unwrap().rtt_smoothed < Duration::from_millis(1));
}

/// A probe answer nobody asked for (forged or replayed) neither revives nor samples a path.
#[test]
fn unsolicited_probe_answers_are_stale() {
    let (mut a, b, conn, _mem_b, now) = connected();
    let b_conn = b.connections().next().unwrap();
    // b's name for a's connection is in the header of b's datagrams to a; forge from b's view.
    let mut buf = vec![0u8; 256];
    let header = wire::Header { dst_conn: conn, token: a.conns[&conn].local_token() };
    let probe = wire::ProbeRepr { probe_id: 7, tx_time_ns: 1 };
    let len = wire::emit(&header, &Repr::ProbeAck(probe), &mut buf).unwrap();
    wire::seal(&mut buf[..len], wire::Integrity::Full);
    let before = a.connection_stats(conn).unwrap();
    a.handle_datagram(now, RxMeta { path: PathId(0), ecn_ce: false }, &buf[..len], &mut Memory::default());
    let after = a.connection_stats(conn).unwrap();
    assert_eq!(after.stale_frames, before.stale_frames + 1);
    assert_eq!(after.rtt_smoothed, before.rtt_smoothed);
    assert!(b.is_established(b_conn));
}

fn secret_pair(a_secret: Option<[u8; 32]>, b_secret: Option<[u8; 32]>) -> (Endpoint, Endpoint, ConnectionHandle) {
    let cfg = |s: Option<[u8; 32]>| EndpointConfig { secret: s.map(crate::JobSecret), ..Default::default() };
    let mut a = Endpoint::new(cfg(a_secret), 1).unwrap();
    let b = Endpoint::new(cfg(b_secret), 2).unwrap();
    let conn = a.connect(t(0)).unwrap();
    (a, b, conn)
}

/// Two holders of the secret connect and move data; the secret's proof travels, not it.
#[test]
fn holders_of_the_job_secret_connect_and_the_secret_never_travels() {
    let secret = [0x5c; 32];
    let (mut a, mut b, conn) = secret_pair(Some(secret), Some(secret));
    let mut mem = Memory::default();
    let to_b = exchange(&mut a, &mut b, &mut mem, t(1));
    assert!(a.is_established(conn));
    assert!(to_b.iter().all(|d| !d.windows(32).any(|w| w == secret)), "the secret is not on the wire");
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 5000, imm: None, tag: 0 }).unwrap();
    exchange(&mut a, &mut b, &mut mem, t(2));
    assert!(!mem.placements.is_empty());
    assert_eq!(b.stats().unadmitted, 0);
}

/// A process without the secret (or with another) gets no connection, so no token, so it can
/// deliver nothing; the side with the secret refuses the outsider's answer too.
#[test]
fn outsiders_without_the_secret_are_refused_both_ways() {
    let secret = [0x33; 32];
    for (a_secret, b_secret) in [(None, Some(secret)), (Some([0x34; 32]), Some(secret)), (Some(secret), None)] {
        let (mut a, mut b, conn) = secret_pair(a_secret, b_secret);
        exchange(&mut a, &mut b, &mut Memory::default(), t(1));
        assert!(!a.is_established(conn), "{a_secret:?} -> {b_secret:?}");
        let refused = a.stats().unadmitted + b.stats().unadmitted;
        assert!(refused >= 1, "{a_secret:?} -> {b_secret:?}: refusal counted");
        if b_secret.is_some() {
            assert_eq!(b.connections().count(), 0, "the unproven Hello allocated nothing");
        }
    }
}

/// 100,000 forged Hellos (random ids, tokens and proofs) leave the table empty; a holder of
/// the secret then connects at once.
#[test]
fn a_hello_flood_costs_no_memory_and_never_blocks_a_legitimate_peer() {
    let secret = [0x77; 32];
    let (mut a, mut b, conn) = secret_pair(Some(secret), Some(secret));
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut buf = [0u8; 128];
    for _ in 0..100_000 {
        let hello = wire::HelloRepr {
            src_conn: crate::ConnectionId(rng.gen()),
            src_token: rng.gen(),
            max_payload_bytes: 9000,
            path_count: 4,
            recv_window_packets: 256,
            proof: rng.gen(),
        };
        let header = wire::Header { dst_conn: crate::ConnectionId(0), token: 0 };
        let len = wire::emit(&header, &Repr::Hello(hello), &mut buf).unwrap();
        wire::seal(&mut buf[..len], wire::Integrity::Full);
        b.handle_datagram(t(1), RxMeta::default(), &buf[..len], &mut Memory::default());
    }
    assert_eq!(b.stats().unadmitted, 100_000);
    assert_eq!(b.connections().count(), 0);
    exchange(&mut a, &mut b, &mut Memory::default(), t(2));
    assert!(a.is_established(conn));
    assert_eq!(b.connections().count(), 1);
}

/// Credit frames replayed verbatim grant nothing twice: each frame number is acted on once.
#[test]
fn replayed_credit_grants_nothing() {
    let eqds = ConnectionConfig { cc: crate::cc::CcKind::Eqds(Default::default()), ..Default::default() };
    let (mut a, mut b, conn) = pair(eqds.clone(), eqds);
    let mut mem_b = Memory::default();
    let mut now = t(1);
    exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 200_000, imm: None, tag: 0 }).unwrap();
    let to_a = exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);
    let credits: Vec<&Vec<u8>> = to_a.iter().filter(|d| d[1] == wire::PacketType::Credit as u8).collect();
    assert!(!credits.is_empty(), "the receiver granted credit");
    let before = a.connection_stats(conn).unwrap();
    for d in &credits {
        a.handle_datagram(now, RxMeta::default(), d, &mut Memory::default());
    }
    let after = a.connection_stats(conn).unwrap();
    assert_eq!(after.credit_received_bytes, before.credit_received_bytes, "no credit from a replay");
    assert_eq!(after.stale_frames, before.stale_frames + credits.len() as u64);
}

/// The reconnect rule at the receiver: an operation that completed here (immediate counted,
/// message delivered) and is resent under the same tag on a new connection, because the
/// sender lost the old one before the acknowledgement came, is acknowledged (so the sender
/// completes it) but places no byte, claims no buffer and raises no second event.
#[test]
fn an_operation_resent_on_a_new_connection_after_completing_is_acked_not_placed() {
    let (mut a, mut b, first) = pair(ConnectionConfig::default(), ConnectionConfig::default());
    let mut mem = Memory::default();
    exchange(&mut a, &mut b, &mut mem, t(1));
    let write = WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 20_000, imm: Some(4), tag: 77 };
    let send = SendRequest { len: 3000, imm: None, tag: 78 };
    a.write(first, write).unwrap();
    a.send(first, send).unwrap();
    exchange(&mut a, &mut b, &mut mem, t(2));
    let mut completed_events = 0;
    while let Some(e) = b.poll_event() {
        match e {
            Event::ImmReceived { tag, .. } | Event::RecvCompleted { tag, .. } => {
                mem.completed.insert(tag);
                completed_events += 1;
            }
            _ => {}
        }
    }
    assert_eq!(completed_events, 2, "the first copies completed");
    let (placed, claimed) = (mem.placements.len(), mem.buffers_claimed);
    // The receiver, done with the write's memory, deregistered it: the resend must still
    // succeed (a refusal would fail a write that landed).
    mem.deregistered = true;
    // The sender lost the connection (say its ACKs were all lost) and resends both on a new one.
    let second = a.connect(t(3)).unwrap();
    let (w2, s2) = (a.write(second, write).unwrap(), a.send(second, send).unwrap());
    while a.poll_event().is_some() {}
    exchange(&mut a, &mut b, &mut mem, t(4));
    assert_eq!(mem.placements.len(), placed, "no byte of a completed operation placed again");
    assert_eq!(mem.buffers_claimed, claimed, "no receive buffer claimed for the resent message");
    while let Some(e) = b.poll_event() {
        assert!(!matches!(e, Event::ImmReceived { .. } | Event::RecvCompleted { .. }), "counted twice: {e:?}");
    }
    let mut done = vec![];
    while let Some(e) = a.poll_event() {
        if let Event::OpCompleted { conn, op, result } = e {
            assert_eq!((conn, result), (second, Ok(())));
            done.push(op);
        }
    }
    done.sort();
    let mut want = vec![w2, s2];
    want.sort();
    assert_eq!(done, want, "the sender's resent operations complete");
    let skipped: u64 = b.connections().filter_map(|c| b.connection_stats(c)).map(|s| s.resent_skipped).sum();
    assert!(skipped > 0);
    // A tag the receiver has not completed (a different operation) is placed as usual.
    mem.deregistered = false;
    a.write(second, WriteRequest { tag: 79, ..write }).unwrap();
    exchange(&mut a, &mut b, &mut mem, t(5));
    assert!(mem.placements.len() > placed);
}

mod mac;

/// Sends one write from `a` to `b` at `now` and returns `b`'s answers unsent (the ACKs), so a
/// test decides when they arrive.
fn write_and_hold_acks(
    a: &mut Endpoint,
    b: &mut Endpoint,
    mem_b: &mut Memory,
    conn: ConnectionHandle,
    now: Instant,
) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 16 * 1024];
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 1000, imm: None, tag: 0 }).unwrap();
    while let Some(tx) = a.poll_transmit(now, &mut buf) {
        let mut d = buf[..tx.header_len].to_vec();
        d.resize(tx.datagram_len(), 0);
        tx.seal_payload(&mut d);
        b.handle_datagram(now, RxMeta { path: tx.path, ecn_ce: false }, &d, mem_b);
    }
    b.handle_timeout(now + Duration::from_millis(1)); // any delayed ACK is due
    let mut held = vec![];
    while let Some(tx) = b.poll_transmit(now, &mut buf) {
        let mut d = buf[..tx.header_len].to_vec();
        d.resize(tx.datagram_len(), 0);
        tx.seal_payload(&mut d);
        held.push(d);
    }
    held
}

/// A timeout that fires on a late acknowledgement (a descheduled worker, a queue in a
/// shared-memory ring) declared a packet lost that was not. The late ACK shows it: the packet
/// is counted as a spurious loss, and its path's RTO rises above how late that ACK was, so the
/// next ACK as late is waited for. The floor halves after a second without another.
#[test]
fn a_late_acknowledgement_teaches_its_path_a_longer_timeout() {
    let (mut a, mut b, conn, mut mem_b, mut now) = connected();
    let late = Duration::from_millis(8);
    let deliver = |a: &mut Endpoint, acks: &[Vec<u8>], at: Instant| {
        for d in acks {
            a.handle_datagram(at, RxMeta { path: PathId(0), ecn_ce: false }, d, &mut Memory::default());
        }
    };

    let acks = write_and_hold_acks(&mut a, &mut b, &mut mem_b, conn, now);
    assert!(!acks.is_empty(), "the receiver acknowledged the write");
    let sent_at = now;
    now = now + late;
    a.handle_timeout(now);
    let lost = a.connection_stats(conn).unwrap();
    assert!(lost.packets_lost >= 1, "the default 1 ms minimum RTO declared the packet lost");
    deliver(&mut a, &acks, now); // before the retransmission went out
    let learned = a.connection_stats(conn).unwrap();
    assert_eq!(learned.packets_lost_spurious, lost.packets_lost, "every loss declared was acknowledged after all");
    let path = learned.paths.iter().max_by_key(|p| p.spurious_losses).unwrap();
    assert!(path.spurious_losses >= 1);
    assert!(
        path.rto >= now.saturating_duration_since(sent_at),
        "the path's RTO {:?} now covers an ACK {late:?} late",
        path.rto
    );
    exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);

    // The same lateness again: waited for, nothing declared lost.
    let acks = write_and_hold_acks(&mut a, &mut b, &mut mem_b, conn, now);
    now = now + late;
    a.handle_timeout(now);
    deliver(&mut a, &acks, now);
    let again = a.connection_stats(conn).unwrap();
    assert_eq!(again.packets_lost, learned.packets_lost, "an ACK as late as before is no longer a loss");
    exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);

    // Seconds later, prompt traffic brings the timeout back down.
    let late_path = path.path;
    let rto_of = |s: &ConnectionStats| s.paths.iter().find(|p| p.path == late_path).unwrap().rto;
    let floor_rto = rto_of(&again);
    for _ in 0..3 {
        now = now + Duration::from_millis(1100);
        a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 1000, imm: None, tag: 0 }).unwrap();
        exchange_timed(&mut a, &mut b, &mut mem_b, &mut now);
    }
    let later = rto_of(&a.connection_stats(conn).unwrap());
    assert!(later <= floor_rto / 4, "the learned floor decays: {later:?} after {floor_rto:?}");
}

/// The late acknowledgement can arrive after the retransmission went out: it echoes the first
/// copy's transmit time, older than the retransmission's, and that tells the loss was spurious.
#[test]
fn a_late_acknowledgement_after_the_retransmission_is_known_by_its_echo() {
    let (mut a, mut b, conn, mut mem_b, mut now) = connected();
    let acks = write_and_hold_acks(&mut a, &mut b, &mut mem_b, conn, now);
    now = now + Duration::from_millis(8);
    a.handle_timeout(now);
    let mut buf = vec![0u8; 16 * 1024];
    let mut resent = 0;
    while a.poll_transmit(now, &mut buf).is_some() {
        resent += 1; // the retransmission, dropped here: the first copy's ACK is what arrives
    }
    assert!(resent >= 1, "the timeout sent the packet again");
    let before = a.connection_stats(conn).unwrap();
    assert!(before.packets_retransmitted >= 1);
    for d in &acks {
        a.handle_datagram(now, RxMeta { path: PathId(0), ecn_ce: false }, d, &mut Memory::default());
    }
    let after = a.connection_stats(conn).unwrap();
    assert!(after.packets_lost_spurious >= 1, "the echo of the first copy shows the loss was not one");
    assert!(after.paths.iter().all(|p| p.rto >= Duration::from_millis(8)), "every path learned the late ACK");
}
