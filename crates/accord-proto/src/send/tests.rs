use super::*;
use crate::ids::{OpId, PathId, RegionId, RegionKey};
use crate::time::Instant;
use crate::wire::{DataKind, RejectReason};
use core::time::Duration;

fn packet(op: u64, path: u16, seq: u64, at_us: u64) -> SentPacket {
    SentPacket {
        op: OpId(op),
        msg_offset: 0,
        len: 100,
        path: PathId(path),
        path_seq: seq,
        sent_at: Instant::from_nanos(at_us * 1000),
        transmissions: 1,
        lost: false,
    }
}

#[test]
fn floor_advances_over_resolved_prefix() {
    let mut w = SendWindow::new(2);
    for i in 0..4 {
        w.on_sent_new(packet(0, 0, i, i));
    }
    assert_eq!(w.bytes_in_flight(), 400);
    w.resolve(1);
    assert_eq!(w.floor(), 0);
    w.resolve(0);
    assert_eq!(w.floor(), 2);
    assert_eq!(w.bytes_in_flight(), 200);
    assert_eq!(w.unresolved_below(10).collect::<Vec<_>>(), vec![2, 3]);
}

#[test]
fn reordering_on_one_path_reveals_loss_but_not_across_paths() {
    let mut w = SendWindow::new(2);
    // psn 0..4 on path 0 (seq 0..4), psn 4 on path 1.
    for i in 0..4 {
        w.on_sent_new(packet(0, 0, i, i));
    }
    w.on_sent_new(packet(0, 1, 0, 4));
    // Path 1's ack says nothing about path 0.
    assert_eq!(w.detect_reorder_losses(PathId(0), 0, 3), (0, 0));
    // psn 3 (seq 3) acked on path 0: seq 0 is 3 behind -> lost; seq 1, 2 not yet.
    w.resolve(3);
    assert_eq!(w.detect_reorder_losses(PathId(0), 3, 3), (1, 100));
    assert_eq!(w.bytes_in_flight(), 300);
    assert_eq!(w.pop_retransmit(), Some(0));
    w.on_retransmitted(0, PathId(1), 1, Instant::from_nanos(9000));
    assert_eq!(w.bytes_in_flight(), 400);
    assert_eq!(w.get(0).unwrap().transmissions, 2);
}

#[test]
fn timeouts_take_only_overdue_packets() {
    let mut w = SendWindow::new(1);
    w.on_sent_new(packet(0, 0, 0, 0));
    w.on_sent_new(packet(0, 0, 1, 50));
    let now = Instant::from_nanos(120_000);
    assert_eq!(w.detect_timeouts(PathId(0), now, Duration::from_micros(100)), (1, 100));
    assert_eq!(w.oldest_outstanding(PathId(0)), Some(Instant::from_nanos(50_000)));
}

#[test]
fn abandon_resolves_all_packets_of_an_op() {
    let mut w = SendWindow::new(1);
    w.on_sent_new(packet(1, 0, 0, 0));
    w.on_sent_new(packet(2, 0, 1, 0));
    w.on_sent_new(packet(1, 0, 2, 0));
    assert_eq!(w.abandon_op(OpId(1)), 2);
    assert_eq!(w.bytes_in_flight(), 100);
    assert_eq!(w.recount_bytes_in_flight(), 100);
}

#[test]
fn ops_packetise_and_complete() {
    let mut ops = OutboundOps::new(2);
    let kind = DataKind::Write { region: RegionId(1), key: RegionKey(2), region_offset: 0 };
    let a = ops.submit(kind, Some(5), 0, 250).unwrap();
    let b = ops.submit(DataKind::Send, None, 0, 0).unwrap();
    assert_eq!(ops.submit(DataKind::Send, None, 0, 1), Err(SubmitError::TooManyOps(2)));
    let mut plans = vec![];
    while let Some(p) = ops.peek_packet(100) {
        ops.take_packet(p);
        plans.push(p);
    }
    assert_eq!(plans.iter().map(|p| (p.op, p.len)).collect::<Vec<_>>(), vec![(a, 100), (a, 100), (a, 50), (b, 0)]);
    assert_eq!(ops.on_packet_resolved(a), None);
    assert_eq!(ops.on_packet_resolved(b), Some(OpCompletion { op: b, result: Ok(()) }));
    assert_eq!(ops.on_packet_resolved(a), None);
    assert_eq!(ops.on_packet_resolved(a), Some(OpCompletion { op: a, result: Ok(()) }));
}

#[test]
fn failed_op_stops_and_reports_error() {
    let mut ops = OutboundOps::new(4);
    let op = ops.submit(DataKind::Send, None, 0, 1000).unwrap();
    let p = ops.peek_packet(100).unwrap();
    ops.take_packet(p);
    ops.fail(op, OpError::Rejected(RejectReason::NoRecvBuffer));
    assert!(!ops.has_new_data());
    assert_eq!(
        ops.settle(op, 1),
        Some(OpCompletion { op, result: Err(OpError::Rejected(RejectReason::NoRecvBuffer)) })
    );
}

#[test]
fn offset_overflow_is_refused_at_submit() {
    let mut ops = OutboundOps::new(4);
    let kind = DataKind::Write { region: RegionId(1), key: RegionKey(2), region_offset: u64::MAX };
    assert!(matches!(ops.submit(kind, None, 0, 2), Err(SubmitError::OffsetOverflow { .. })));
}

#[test]
fn path_deadlines_track_the_earliest_through_updates() {
    let mut d = PathDeadlines::new(256);
    assert_eq!(d.earliest(), None);
    let at = |ns: u64| Some(Instant::from_nanos(ns));
    d.set(PathId(7), at(500));
    d.set(PathId(200), at(300));
    d.set(PathId(3), at(900));
    assert_eq!(d.earliest(), Some((PathId(200), Instant::from_nanos(300))));
    // Raising the earliest hands the lead to the next one; lowering another takes it back.
    d.set(PathId(200), at(1000));
    assert_eq!(d.earliest(), Some((PathId(7), Instant::from_nanos(500))));
    d.set(PathId(3), at(100));
    assert_eq!(d.earliest_at(), at(100));
    d.set(PathId(3), None);
    d.set(PathId(7), None);
    assert_eq!(d.earliest(), Some((PathId(200), Instant::from_nanos(1000))));
    assert_eq!(d.get(PathId(200)), at(1000));
    assert_eq!(d.get(PathId(7)), None);
    // Out-of-table paths are ignored, never a panic.
    d.set(PathId(300), at(1));
    assert_eq!(d.earliest_at(), at(1000));
    d.clear();
    assert_eq!(d.earliest(), None);
}

/// Against a linear scan over random updates, including a table that is not a power of two.
#[test]
fn path_deadlines_match_a_scan() {
    let mut d = PathDeadlines::new(37);
    let mut reference = [None::<u64>; 37];
    let mut state = 11u64;
    for _ in 0..10_000 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let path = ((state >> 33) % 37) as usize;
        let value = if (state >> 20) & 3 == 0 { None } else { Some((state >> 40) % 1000) };
        reference[path] = value;
        d.set(PathId(path as u16), value.map(Instant::from_nanos));
        let min = reference.iter().flatten().min().copied();
        assert_eq!(d.earliest_at().map(Instant::as_nanos), min);
        if let Some((p, t)) = d.earliest() {
            assert_eq!(reference[p.0 as usize], Some(t.as_nanos()));
        }
    }
}
