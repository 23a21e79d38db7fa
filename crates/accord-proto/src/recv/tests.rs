use super::*;
use crate::ids::{OpId, RecvBufferId};
use crate::wire::{AckRepr, RejectReason, Rejection};

fn empty_ack() -> AckRepr {
    AckRepr {
        cum_ack: 0,
        echo_psn: 0,
        echo_tx_time_ns: 0,
        ack_delay_ns: 0,
        ecn_ce_count: 0,
        credit_bytes: 0,
        sack: Default::default(),
        rejections: Default::default(),
    }
}

#[test]
fn in_order_arrivals_slide_the_base() {
    let mut w = ReceiveWindow::new(64);
    for psn in 0..10 {
        assert_eq!(w.classify(psn), PsnClass::New);
        w.mark_received(psn);
    }
    assert_eq!(w.base(), 10);
    assert_eq!(w.classify(3), PsnClass::Below);
    assert_eq!(w.classify(74), PsnClass::Beyond);
}

#[test]
fn holes_show_in_the_sack_and_fill_later() {
    let mut w = ReceiveWindow::new(64);
    for psn in [0, 2, 3, 5] {
        w.mark_received(psn);
    }
    let mut ack = empty_ack();
    w.fill_ack(&mut ack, None);
    assert_eq!(ack.cum_ack, 1);
    let bits: Vec<usize> = ack.sack.iter_set().collect();
    assert_eq!(bits, vec![0, 1, 3]); // psn 2, 3, 5
    w.mark_received(1);
    assert_eq!(w.base(), 4);
    w.mark_received(4);
    assert_eq!(w.base(), 6);
}

#[test]
fn rejections_hold_the_base_until_the_sender_floor_passes() {
    let mut w = ReceiveWindow::new(64);
    w.mark_received(0);
    w.mark_rejected(Rejection { psn: 1, op: OpId(9), reason: RejectReason::BadKey });
    w.mark_received(2);
    assert_eq!(w.base(), 1);
    assert_eq!(w.classify(1), PsnClass::Rejected);
    let mut ack = empty_ack();
    w.fill_ack(&mut ack, Some(1));
    assert_eq!(ack.cum_ack, 1);
    assert_eq!(ack.rejections.iter().next().map(|r| r.psn), Some(1));
    w.advance_floor(2);
    assert_eq!(w.base(), 3, "floor passed the rejection, then psn 2 slid");
    assert_eq!(w.pending_rejections(), 0);
}

#[test]
fn floor_beyond_window_resets_cleanly() {
    let mut w = ReceiveWindow::new(16);
    w.mark_received(5);
    w.advance_floor(1000);
    assert_eq!(w.base(), 1000);
    assert_eq!(w.classify(1005), PsnClass::New);
    w.mark_received(1000);
    assert_eq!(w.base(), 1001);
}

#[test]
fn inbound_counts_bytes_once_and_completes() {
    let mut t = InboundOps::new(2);
    t.start(OpId(1), InboundStart::WriteWithImm { imm: 7 }, 10, 0);
    assert_eq!(t.record(OpId(1), 4), InboundProgress::Partial);
    assert_eq!(t.record(OpId(1), 6), InboundProgress::Complete(InboundStart::WriteWithImm { imm: 7 }));
    assert!(t.is_empty());
    t.start(OpId(3), InboundStart::WriteWithImm { imm: 1 }, 0, 0);
    assert_eq!(t.record(OpId(3), 0), InboundProgress::Complete(InboundStart::WriteWithImm { imm: 1 }));
}

#[test]
fn refusals_are_remembered_within_a_bound() {
    let mut t = InboundOps::new(4);
    t.start(OpId(2), InboundStart::Send { buffer: RecvBufferId(3) }, 8, 0);
    t.refuse(OpId(2), RejectReason::OutOfBounds);
    assert!(t.is_empty(), "a refused operation's progress is dropped");
    assert_eq!(t.refusal(OpId(2)), Some(RejectReason::OutOfBounds));
    for i in 0..REFUSED_OPS_REMEMBERED as u64 {
        t.refuse(OpId(100 + i), RejectReason::NoRecvBuffer);
    }
    assert_eq!(t.refusal(OpId(2)), None, "the oldest refusal is forgotten first");
    assert_eq!(t.refusal(OpId(100)), Some(RejectReason::NoRecvBuffer));
}

#[test]
fn inbound_capacity_is_bounded() {
    let mut t = InboundOps::new(1);
    t.start(OpId(1), InboundStart::WriteWithImm { imm: 0 }, 10, 0);
    assert!(!t.has_room());
}
