//! The credit pacer alone (fairness, bounds, rate, priority), and EQDS end to end between two
//! endpoints driven by hand: speculation, credit spending, Rts after a timeout, NACK of a trimmed
//! packet, and a whole transfer that places every byte once.

use super::*;
use crate::api::{Event, LocalMemory, RxMeta, WriteRequest};
use crate::cc::{CcKind, CongestionControl, Eqds, EqdsConfig};
use crate::config::{ConnectionConfig, EndpointConfig};
use crate::ids::{RecvBufferId, RegionId, RegionKey};
use crate::wire::{self, RejectReason, Repr};
use crate::Endpoint;

fn c(id: u32) -> ConnectionId {
    ConnectionId(id)
}

fn pacer(config: CreditConfig) -> CreditPacer {
    CreditPacer::new(config, 4096)
}

/// Grants until the pacer has nothing left, advancing time to each grant.
fn drain(p: &mut CreditPacer) -> Vec<Grant> {
    let mut out = vec![];
    while let Some(at) = p.poll_timeout() {
        out.push(p.poll_grant(at).expect("a grant is due at its own timeout"));
        p.check_invariants().unwrap();
    }
    out
}

#[test]
fn pacer_serves_active_senders_round_robin() {
    let mut p = pacer(CreditConfig { grant_quantum_bytes: 4096, ..Default::default() });
    for id in 1..=3 {
        p.add_demand(c(id), 3 * 4096, true);
    }
    let order: Vec<u32> = drain(&mut p).iter().map(|g| g.conn.0).collect();
    assert_eq!(order, [1, 2, 3, 1, 2, 3, 1, 2, 3]);
    assert_eq!((p.active_len(), p.idle_len()), (0, 3));
}

#[test]
fn pacer_is_fair_to_unequal_demands_and_grants_exactly_what_was_asked() {
    let mut p = CreditPacer::new(CreditConfig { grant_quantum_bytes: 1000, ..Default::default() }, 1000);
    p.add_demand(c(1), 10_000, true);
    p.add_demand(c(2), 2_500, true);
    let grants = drain(&mut p);
    let total = |id| grants.iter().filter(|g| g.conn == c(id)).map(|g| g.credit_bytes as u64).sum::<u64>();
    assert_eq!((total(1), total(2)), (10_000, 2_500));
    // While both wanted, they alternated.
    let first: Vec<u32> = grants.iter().take(6).map(|g| g.conn.0).collect();
    assert_eq!(first, [1, 2, 1, 2, 1, 2]);
}

#[test]
fn a_grant_covers_at_least_one_full_packet() {
    let mut p = CreditPacer::new(CreditConfig { grant_quantum_bytes: 1000, ..Default::default() }, 9000);
    p.add_demand(c(1), 20_000, true);
    assert_eq!(p.poll_grant(Instant::ZERO).unwrap().credit_bytes, 9000);
}

#[test]
fn retransmission_requests_go_before_new_credit() {
    let mut p = pacer(CreditConfig::default());
    p.add_demand(c(1), 100_000, true);
    p.add_nack(c(2), 77, 4096);
    let first = p.poll_grant(Instant::ZERO).unwrap();
    assert_eq!(first, Grant { conn: c(2), credit_bytes: 4096, nack: Some(77) });
    assert_eq!(p.poll_grant(p.poll_timeout().unwrap()).unwrap().conn, c(1));
}

#[test]
fn retransmission_requests_are_served_round_robin_over_senders() {
    let mut p = pacer(CreditConfig::default());
    for psn in 0..100 {
        p.add_nack(c(1), psn, 4096);
    }
    p.add_nack(c(2), 7, 4096);
    p.add_nack(c(2), 8, 4096);
    let first: Vec<(u32, Option<Psn>)> = drain(&mut p).iter().take(5).map(|g| (g.conn.0, g.nack)).collect();
    assert_eq!(first, [(1, Some(0)), (2, Some(7)), (1, Some(1)), (2, Some(8)), (1, Some(2))]);
    assert_eq!(p.rtx_len(), 0);
}

#[test]
fn pacer_grants_at_the_configured_fraction_of_line_rate() {
    let config = CreditConfig {
        line_rate_bytes_per_sec: 10_000_000_000,
        rate_fraction: 0.5,
        grant_quantum_bytes: 4096,
        wire_overhead_bytes_per_packet: 0,
        ..Default::default()
    };
    let mut p = pacer(config);
    p.add_demand(c(1), 4096 * 100, true);
    assert!(p.poll_grant(Instant::ZERO).is_some());
    // 4096 bytes at 5 GB/s take 819.2 ns: nothing earlier.
    assert!(p.poll_grant(Instant::from_nanos(800)).is_none());
    let grants = drain(&mut p);
    assert_eq!(grants.len(), 99);
    let end = p.next_grant_at.as_nanos();
    let rate = 100.0 * 4096.0 / (end as f64 * 1e-9);
    assert!((rate / 5e9 - 1.0).abs() < 0.01, "paced at {rate} B/s");
}

#[test]
fn pacer_lists_stay_within_their_bounds() {
    let config = CreditConfig { senders_max: 8, idle_senders_max: 4, nack_queue_max: 3, ..Default::default() };
    let mut p = pacer(config);
    for id in 0..8 {
        p.add_demand(c(id), 4096, true);
    }
    // Table full of active senders: a ninth is refused, not stored.
    p.add_demand(c(100), 4096, true);
    assert_eq!(p.demand_bytes(c(100)), 0);
    assert_eq!(p.stats().requests_refused, 1);
    for i in 0..10 {
        p.add_nack(c(1), i, 100);
    }
    assert_eq!(p.rtx_len(), 3);
    drain(&mut p);
    assert!(p.idle_len() <= 4);
    // Idle senders make room for new ones.
    for id in 200..220 {
        p.add_demand(c(id), 1, true);
        p.check_invariants().unwrap();
    }
    assert!(p.active_len() + p.idle_len() <= 8);
}

#[test]
fn headroom_is_granted_once_per_busy_period() {
    let mut p = pacer(CreditConfig { pull_headroom_bytes: 10_000, ..Default::default() });
    p.add_demand(c(1), 4096, true);
    p.add_demand(c(1), 4096, true);
    assert_eq!(p.demand_bytes(c(1)), 18_192);
    p.clear_demand(c(1));
    assert_eq!(p.demand_bytes(c(1)), 0);
    p.check_invariants().unwrap();
    // A straggler from before the end asks for its own bytes only.
    p.add_demand(c(1), 4096, false);
    assert_eq!(p.demand_bytes(c(1)), 4096);
    p.add_demand(c(1), 4096, true);
    assert_eq!(p.demand_bytes(c(1)), 18_192);
}

#[test]
fn rts_asks_for_at_most_its_cap_and_never_lowers_demand() {
    let mut p = pacer(CreditConfig { rts_demand_max_bytes: 10_000, ..Default::default() });
    p.on_rts(c(1), 1 << 30);
    assert_eq!(p.demand_bytes(c(1)), 10_000);
    p.add_demand(c(1), 50_000, true);
    p.on_rts(c(1), 5);
    assert_eq!(p.demand_bytes(c(1)), 60_000);
    p.remove(c(1));
    assert!(!p.has_work());
}

// ---- the sender's account ----

#[test]
fn eqds_spends_speculation_then_credit_and_never_goes_negative() {
    let mut e = Eqds::new(EqdsConfig { speculative_bytes: 8192, window_bytes_max: 20_000, ..Default::default() });
    let now = Instant::ZERO;
    assert_eq!(e.send_allowance_bytes(), Some(8192));
    e.on_sent(now, 4096);
    e.on_sent(now, 4096);
    assert_eq!(e.send_allowance_bytes(), Some(0));
    e.on_credit(now, 30_000); // capped at window_bytes_max
    assert_eq!(e.credit_bytes(), 20_000);
    e.on_sent(now, 4096);
    assert_eq!(e.send_allowance_bytes(), Some(20_000 - 4096));
    e.check_invariants().unwrap();
    e.on_idle(now);
    assert_eq!((e.credit_bytes(), e.speculative_left_bytes()), (0, 8192));
    e.check_invariants().unwrap();
}

// ---- two endpoints ----

const KEY: RegionKey = RegionKey(0x5eed);

/// One region of `len` bytes; counts placed bytes per offset to prove exactly-once.
struct Region {
    placed: Vec<u8>,
}

impl LocalMemory for Region {
    fn check_write(&self, region: RegionId, key: RegionKey, offset: u64, len: u64) -> Result<(), RejectReason> {
        if region != RegionId(1) || key != KEY {
            return Err(RejectReason::BadKey);
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.placed.len() as u64 => Ok(()),
            _ => Err(RejectReason::OutOfBounds),
        }
    }
    fn claim_recv_buffer(&mut self, _: ConnectionId, _: u64) -> Result<RecvBufferId, RejectReason> {
        Err(RejectReason::NoRecvBuffer)
    }
}

const MSS: u32 = 4096;
const SPECULATIVE: u64 = 8 * MSS as u64;

fn eqds_endpoint(seed: u64) -> Endpoint {
    let connection = ConnectionConfig {
        cc: CcKind::Eqds(EqdsConfig {
            speculative_bytes: SPECULATIVE,
            rts_timeout: core::time::Duration::from_micros(50),
            ..Default::default()
        }),
        path_count: 4,
        ..Default::default()
    };
    let credit = CreditConfig { line_rate_bytes_per_sec: 12_500_000_000, ..Default::default() };
    Endpoint::new(EndpointConfig { connection, credit, ..Default::default() }, seed).unwrap()
}

struct Wire {
    buf: Vec<u8>,
}

impl Wire {
    /// The next datagram `from` wants to send, as bytes (payload zeros).
    fn next(&mut self, from: &mut Endpoint, now: Instant) -> Option<(RxMeta, Vec<u8>)> {
        let tx = from.poll_transmit(now, &mut self.buf)?;
        let mut d = self.buf[..tx.header_len].to_vec();
        d.resize(tx.datagram_len(), 0);
        tx.seal_payload(&mut d);
        Some((RxMeta { path: tx.path, ecn_ce: false }, d))
    }
}

fn deliver(to: &mut Endpoint, now: Instant, rx: RxMeta, d: &[u8], mem: &mut Region) {
    let out = to.handle_datagram(now, rx, d, mem);
    if let Some(p) = out.placement {
        let crate::api::PlacementTarget::Region { offset, .. } = p.target else { panic!("a write") };
        for b in &mut mem.placed[offset as usize..offset as usize + p.payload.len()] {
            *b += 1;
        }
    }
}

/// Connects `a` to `b`, returns a's connection.
fn connected(a: &mut Endpoint, b: &mut Endpoint, w: &mut Wire, mem: &mut Region) -> ConnectionId {
    let conn = a.connect(Instant::ZERO).unwrap();
    let now = Instant::ZERO;
    let mut none = Region { placed: vec![] };
    while let Some((rx, d)) = w.next(a, now) {
        deliver(b, now, rx, &d, mem);
        while let Some((rx, d)) = w.next(b, now) {
            deliver(a, now, rx, &d, &mut none);
        }
    }
    assert!(a.is_established(conn));
    conn
}

fn data_of(d: &[u8]) -> Option<wire::DataRepr> {
    match wire::parse(d).ok()?.repr {
        Repr::Data(data) => Some(data),
        _ => None,
    }
}

#[test]
fn sender_speculates_one_bdp_then_waits_and_asks_with_rts() {
    let mut w = Wire { buf: vec![0; 16 * 1024] };
    let (mut a, mut b) = (eqds_endpoint(1), eqds_endpoint(2));
    let mut mem = Region { placed: vec![0; 1 << 20] };
    let conn = connected(&mut a, &mut b, &mut w, &mut mem);
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 1 << 20, imm: None, tag: 0 }).unwrap();
    let now = Instant::from_nanos(1000);
    let mut sent = 0u64;
    while let Some((_, d)) = w.next(&mut a, now) {
        let data = data_of(&d).expect("only data before any credit");
        assert!(data.receiver_driven && data.wants_more);
        sent += data.payload_len as u64;
    }
    assert_eq!(sent, SPECULATIVE, "exactly one speculative BDP leaves before credit");
    // Nothing comes back (all lost): the Rts timer is armed and fires after 50 µs.
    let due = a.poll_timeout().expect("an Rts timer");
    assert!(due <= now + core::time::Duration::from_micros(50));
    a.handle_timeout(due);
    let (_, rts_bytes) = w.next(&mut a, due).expect("an Rts once the timeout passed");
    let Repr::Rts(rts) = wire::parse(&rts_bytes).unwrap().repr else { panic!("expected an Rts") };
    assert_eq!(rts.backlog_bytes, (1 << 20) - SPECULATIVE);
    assert_eq!(a.connection_stats(conn).unwrap().rts_sent, 1);
    // The receiver answers an Rts with credit.
    deliver(&mut b, due, RxMeta::default(), &rts_bytes, &mut mem);
    let (_, credit) = w.next(&mut b, due).expect("a grant");
    assert!(matches!(wire::parse(&credit).unwrap().repr, Repr::Credit(c) if c.credit_bytes > 0 && c.nack.is_none()));
}

#[test]
fn trimmed_packet_is_nacked_with_credit_and_resent_first() {
    let mut w = Wire { buf: vec![0; 16 * 1024] };
    let (mut a, mut b) = (eqds_endpoint(3), eqds_endpoint(4));
    let mut mem = Region { placed: vec![0; 1 << 20] };
    let conn = connected(&mut a, &mut b, &mut w, &mut mem);
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: 1 << 20, imm: None, tag: 0 }).unwrap();
    let now = Instant::from_nanos(1000);
    let (rx, first) = w.next(&mut a, now).unwrap();
    let trimmed_psn = data_of(&first).unwrap().psn;
    // The switch cut the payload: only the header reaches b, through the trimmed entry point.
    let header = &first[..wire::DATA_HEADER_LEN];
    assert_eq!(b.handle_datagram(now, rx, header, &mut mem).placement, None, "a socket path drops it");
    b.handle_trimmed_datagram(rx, header);
    assert!(mem.placed.iter().all(|&n| n == 0), "nothing of a trimmed packet is placed");
    // The pacer answers with a NACK for exactly that packet, carrying its credit.
    let (_, credit_bytes) = w.next(&mut b, now).expect("a NACK");
    let Repr::Credit(credit) = wire::parse(&credit_bytes).unwrap().repr else { panic!("expected a Credit") };
    assert_eq!(credit.nack, Some(trimmed_psn));
    assert_eq!(credit.credit_bytes, MSS);
    // Drain a's speculation, then hand it the NACK: the next packet is that psn again.
    while w.next(&mut a, now).is_some() {}
    deliver(&mut a, now, RxMeta::default(), &credit_bytes, &mut Region { placed: vec![] });
    let (_, again) = w.next(&mut a, now).expect("the retransmission");
    let again = data_of(&again).unwrap();
    assert_eq!((again.psn, again.retransmission), (trimmed_psn, true));
    assert_eq!(a.connection_stats(conn).unwrap().nacks_received, 1);
}

/// Runs `a` writing `len` bytes to `b` to completion over a lossless wire with virtual time;
/// returns the sender's stats.
#[test]
fn whole_transfer_places_every_byte_once_and_credit_balances() {
    let mut w = Wire { buf: vec![0; 16 * 1024] };
    let (mut a, mut b) = (eqds_endpoint(5), eqds_endpoint(6));
    let len = 3 << 20;
    let mut mem = Region { placed: vec![0; len] };
    let conn = connected(&mut a, &mut b, &mut w, &mut mem);
    a.write(conn, WriteRequest { region: RegionId(1), key: KEY, offset: 0, len: len as u64, imm: Some(9), tag: 0 })
        .unwrap();
    let mut now = Instant::from_nanos(1000);
    let mut done = false;
    let mut none = Region { placed: vec![] };
    for _ in 0..200_000 {
        while let Some((rx, d)) = w.next(&mut a, now) {
            deliver(&mut b, now, rx, &d, &mut mem);
        }
        while let Some((rx, d)) = w.next(&mut b, now) {
            deliver(&mut a, now, rx, &d, &mut none);
        }
        a.check_invariants().unwrap();
        b.check_invariants().unwrap();
        while let Some(e) = a.poll_event() {
            if let Event::OpCompleted { result, .. } = e {
                result.unwrap();
                done = true;
            }
        }
        if done {
            break;
        }
        let next = [a.poll_timeout(), b.poll_timeout()].into_iter().flatten().min().expect("work pending");
        now = next.max(now);
        a.handle_timeout(now);
        b.handle_timeout(now);
    }
    assert!(done, "the write completed");
    assert!(mem.placed.iter().all(|&n| n == 1), "every byte placed exactly once");
    let s = a.connection_stats(conn).unwrap();
    // Everything beyond the speculation was paid for with credit the receiver granted.
    assert!(s.bytes_sent <= SPECULATIVE + s.credit_received_bytes, "{s:?}");
    assert!(b.pacer_stats().credit_granted_bytes >= len as u64 - SPECULATIVE);
    // The pacer kept to its rate: 3 MiB at 0.98 of 12.5 GB/s takes at least ~250 µs.
    assert!(now.as_nanos() > 200_000, "finished at {now:?}");
}

fn srpt(config: CreditConfig) -> CreditPacer {
    pacer(CreditConfig { order: PacerOrder::ShortestRemaining, grant_quantum_bytes: 4096, ..config })
}

#[test]
fn shortest_remaining_serves_the_sender_closest_to_done_first() {
    let mut p = srpt(CreditConfig { fair_grant_every: 0, srpt_beyond_message_bytes: 0, ..Default::default() });
    // Three senders with demand; messages of 1 MB, 12 KB and 100 KB left.
    for (id, left) in [(1, 1 << 20), (2, 3 * 4096), (3, 100 * 1024)] {
        p.add_demand(c(id), 1 << 20, true);
        p.set_remaining(c(id), left);
    }
    let order: Vec<u32> = (0..30).map(|i| p.poll_grant(t(i * 10)).unwrap().conn.0).collect();
    // 2 until its 12 KB are covered by outstanding credit, then 3 (25 grants of 4 KiB), then 1.
    assert_eq!(&order[..3], &[2, 2, 2]);
    assert!(order[3..28].iter().all(|&id| id == 3), "{order:?}");
    assert_eq!(&order[28..], &[1, 1]);
    p.check_invariants().unwrap();
}

#[test]
fn shortest_remaining_gives_every_nth_grant_round_robin_so_none_starves() {
    let mut p = srpt(CreditConfig { fair_grant_every: 4, srpt_beyond_message_bytes: 0, ..Default::default() });
    p.add_demand(c(1), 1 << 20, true);
    p.set_remaining(c(1), 1 << 20);
    p.add_demand(c(2), 1 << 20, true);
    p.set_remaining(c(2), 512 * 1024);
    let order: Vec<u32> = (0..40).map(|i| p.poll_grant(t(i * 10)).unwrap().conn.0).collect();
    let long = order.iter().filter(|&&id| id == 1).count();
    assert!((8..=12).contains(&long), "the long sender gets about one grant in four: {order:?}");
}

#[test]
fn shortest_remaining_resends_the_short_message_first() {
    let mut p = srpt(CreditConfig::default());
    for (id, left) in [(1, 1 << 20), (2, 8192)] {
        p.add_demand(c(id), 4096, true);
        p.set_remaining(c(id), left);
    }
    p.add_nack(c(1), 10, 4096);
    p.add_nack(c(1), 11, 4096);
    p.add_nack(c(2), 20, 4096);
    let nacks: Vec<(u32, Option<Psn>)> = (0..3)
        .map(|i| p.poll_grant(t(i * 10)))
        .map(|g| {
            let g = g.unwrap();
            (g.conn.0, g.nack)
        })
        .collect();
    assert_eq!(nacks, [(2, Some(20)), (1, Some(10)), (1, Some(11))]);
    // Round robin would have alternated: 1, 2, 1.
    let mut rr = pacer(CreditConfig::default());
    rr.add_nack(c(1), 10, 4096);
    rr.add_nack(c(1), 11, 4096);
    rr.add_nack(c(2), 20, 4096);
    assert_eq!(rr.poll_grant(t(0)).unwrap().conn, c(1));
}

#[test]
fn a_late_poll_is_counted_as_lost_pacing_time() {
    let mut p = pacer(CreditConfig { grant_quantum_bytes: 4096, ..Default::default() });
    p.add_demand(c(1), 3 * 4096, true);
    let first = p.poll_grant(t(0)).unwrap();
    assert_eq!(first.credit_bytes, 4096);
    let due = p.poll_timeout().unwrap();
    assert_eq!(p.stats().grant_late_ns, 0);
    p.poll_grant(due + Duration::from_micros(2)).unwrap();
    assert_eq!(p.stats().grant_late_ns, 2000);
}

fn t(us: u64) -> Instant {
    Instant::from_nanos(us * 1000)
}
