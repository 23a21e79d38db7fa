//! Malformed descriptors become errors naming the bad field, write nothing anywhere, and do
//! not wedge the ring: later good descriptors still execute. Bounded waits fail naming what
//! they waited for.

mod common;

use accord_device::layout::{Descriptor, Op, SignalOp, FLAG_COUNTER};
use accord_device::{DescriptorErrorKind as K, DeviceCommConfig, DeviceError, WaitError};
use common::*;
use std::time::Duration;

const WINDOW: usize = 4096;

fn config() -> DeviceCommConfig {
    DeviceCommConfig { rings: 1, slot_count: 8, user_signals: 2, counters: 2, ..DeviceCommConfig::default() }
}

/// Every malformed descriptor rank 0 sends (to rank 1 or itself), with the error it must give.
fn malformed() -> Vec<(Descriptor, K)> {
    let good = with_counter(with_signal(put(1, 0, 0, 0, 0, 16), SignalOp::Add, 0, 1), 0);
    let len = WINDOW as u64;
    vec![
        (Descriptor { peer: 2, ..good }, K::BadPeer { peer: 2, world: 2 }),
        (Descriptor { op: 9, ..good }, K::BadOp { op: 9 }),
        (Descriptor { op: 0, ..good }, K::BadOp { op: 0 }),
        (Descriptor { signal_op: 7, ..good }, K::BadSignalOp { signal_op: 7 }),
        (Descriptor { flags: FLAG_COUNTER | 0x8, ..good }, K::ReservedFlags { flags: FLAG_COUNTER | 0x8 }),
        (Descriptor { window: 5, ..good }, K::BadWindow { window: 5, count: 2 }),
        (Descriptor { src_window: 2, ..good }, K::BadSrcWindow { src_window: 2, count: 2 }),
        (
            Descriptor { dst_offset: len - 10, bytes: 11, ..good },
            K::DstOutOfRange { window: 0, dst_offset: len - 10, bytes: 11, window_bytes: len },
        ),
        (
            Descriptor { dst_offset: u64::MAX - 2, bytes: 8, ..good },
            K::DstOutOfRange { window: 0, dst_offset: u64::MAX - 2, bytes: 8, window_bytes: len },
        ),
        (
            Descriptor { src_offset: len, bytes: 1, ..good },
            K::SrcOutOfRange { src_window: 0, src_offset: len, bytes: 1, window_bytes: len },
        ),
        (Descriptor { bytes: 0, ..good }, K::ZeroBytes),
        (Descriptor { op: Op::PutValue as u8, bytes: 9, ..good }, K::BadValueBytes { bytes: 9 }),
        (Descriptor { op: Op::PutValue as u8, bytes: 0, ..good }, K::BadValueBytes { bytes: 0 }),
        (Descriptor { signal_id: 3, ..good }, K::BadSignal { signal_id: 3, count: 3 }),
        (Descriptor { counter_id: 2, ..good }, K::BadCounter { counter_id: 2, count: 2 }),
        (Descriptor { op: Op::Signal as u8, signal_op: SignalOp::None as u8, ..good }, K::SignalWithoutAction),
        (Descriptor { peer: 0, window: 2, ..good }, K::BadWindow { window: 2, count: 2 }),
    ]
}

#[test]
fn malformed_descriptors_are_reported_write_nothing_and_later_ones_still_run() {
    let bad = malformed();
    on_ranks(2, Route::Memcpy, config(), |rank, dc| {
        let src = dc.alloc_window(WINDOW).unwrap();
        let dst = dc.alloc_window(WINDOW / 2).unwrap();
        assert_eq!((src, dst), (0, 1));
        dc.write_window(src, 0, &[0xee; WINDOW]).unwrap();
        dc.communicator().barrier().unwrap();
        if rank == 0 {
            let p = dc.host_producer(0).unwrap();
            for (d, _) in &bad {
                p.push(d).unwrap();
            }
            // A good put of 16 bytes into rank 1's window 1 at 100, with signal and counter.
            let good = with_counter(with_signal(put(1, dst, 100, src, 0, 16), SignalOp::Add, 0, 1), 0);
            p.push(&good).unwrap();
            let total = bad.len() as u64 + 1;
            dc.wait_completed(0, total, WAIT).unwrap();
            let errors = dc.errors();
            assert_eq!(errors.len(), bad.len(), "{errors:?}");
            for (ticket, (e, (_, kind))) in errors.iter().zip(&bad).enumerate() {
                assert_eq!((e.ring, e.ticket), (0, ticket as u64));
                assert_eq!(&e.kind, kind, "ticket {ticket}");
                assert!(!e.to_string().is_empty());
            }
            let (consumed, completed, error) = dc.ring_control(0).unwrap();
            assert_eq!((consumed, completed), (total, total), "the ring is not wedged");
            assert_eq!(error, 1, "control.error names the first bad ticket plus one");
            assert_eq!(dc.counter(0).unwrap(), 1, "only the good put counted");
            assert_eq!(dc.counter(1).unwrap(), 0);
            assert_eq!(dc.stats().descriptor_errors, bad.len() as u64);
            assert_eq!(dc.take_errors().len(), bad.len());
            assert!(dc.errors().is_empty());
        }
        if rank == 1 {
            assert_eq!(dc.wait_signal(0, 1, WAIT).unwrap(), 1);
        }
        dc.communicator().barrier().unwrap();
        // Nothing but the good put's 16 bytes was written, anywhere.
        let mut expect_dst = vec![0u8; WINDOW / 2];
        if rank == 1 {
            expect_dst[100..116].fill(0xee);
        }
        assert!(read(dc, dst, 0, WINDOW / 2) == expect_dst, "rank {rank}: stray bytes in window 1");
        assert!(read(dc, src, 0, WINDOW) == vec![0xee; WINDOW], "rank {rank}: window 0 changed");
        for s in 0..dc.signal_count() {
            let want = u64::from(rank == 1 && s == 0);
            assert_eq!(dc.read_signal(s).unwrap(), want, "rank {rank}: signal {s}");
        }
    });
}

#[test]
fn a_wait_on_a_signal_nobody_sends_times_out_naming_it() {
    on_ranks(2, Route::Memcpy, config(), |_, dc| {
        match dc.wait_signal(1, 1, Duration::from_millis(50)) {
            Err(WaitError::SignalTimeout { signal: 1, reached: 0, wanted: 1, silent, slots, .. }) => {
                assert_eq!(silent, vec![0, 1], "no rank moved");
                assert_eq!(slots, vec![0, 0]);
            }
            other => panic!("expected a timeout naming signal 1, got {other:?}"),
        }
        let e = dc.wait_signal(1, 1, Duration::from_millis(1)).unwrap_err().to_string();
        assert!(e.contains("signal 1"), "{e}");
        // The barrier signal is the last one, and ids past it are refused.
        assert_eq!(dc.barrier_signal(), 2);
        assert!(matches!(
            dc.wait_signal(3, 1, Duration::from_millis(1)),
            Err(WaitError::Device(DeviceError::NoSuch { what: "signal", id: 3, count: 3 }))
        ));
        assert!(matches!(dc.counter(2), Err(DeviceError::NoSuch { what: "counter", .. })));
        assert!(matches!(dc.host_producer(1), Err(DeviceError::NoSuch { what: "ring", .. })));
    });
}

#[test]
fn ranks_registering_different_window_lengths_get_an_error_naming_the_rank() {
    on_ranks(3, Route::Memcpy, config(), |rank, dc| {
        let len = if rank == 2 { 200 } else { 100 };
        match dc.alloc_window(len) {
            Err(DeviceError::WindowLengthMismatch { window: 0, rank: 2, len: 200, first_rank: 0, first_len: 100 }) => {}
            other => panic!("rank {rank}: expected a mismatch naming rank 2, got {other:?}"),
        }
        assert_eq!(dc.window_count(), 0, "no window is added on any rank");
        // The next registration gets id 0 on every rank.
        assert_eq!(dc.alloc_window(64).unwrap(), 0);
    });
}

#[test]
fn reset_signal_starts_it_again_from_zero() {
    on_ranks(2, Route::Memcpy, config(), |rank, dc| {
        let p = dc.host_producer(0).unwrap();
        p.push(&signal(1 - rank, SignalOp::Add, 0, 5)).unwrap();
        assert_eq!(dc.wait_signal(0, 5, WAIT).unwrap(), 5);
        dc.reset_signal(0).unwrap();
        assert_eq!(dc.read_signal(0).unwrap(), 0);
        dc.communicator().barrier().unwrap();
        p.push(&signal(1 - rank, SignalOp::Add, 0, 2)).unwrap();
        assert_eq!(dc.wait_signal(0, 2, WAIT).unwrap(), 2);
        assert_eq!(dc.signal_slots(0).unwrap()[1 - rank], 7, "the slot keeps the running value");
    });
}

#[test]
fn a_put_whose_transfer_fails_is_reported_naming_the_peer_and_frees_its_slot() {
    // Every hand-off between the two ranks is a bounded wait: a rank that failed drops its
    // sender, and the other goes on (the test then reports the failure, never hangs).
    let (barrier_passed, wait_barrier) = std::sync::mpsc::channel::<()>();
    let (cut_done, wait_cut) = std::sync::mpsc::channel::<()>();
    let (checks_done, wait_checks) = std::sync::mpsc::channel::<()>();
    let waits = std::sync::Mutex::new((Some(wait_barrier), Some(wait_cut), Some(wait_checks)));
    let bound = Duration::from_secs(60);
    on_ranks_then(2, Route::UdpCuttable, config(), false, |rank, dc| {
        let w = dc.alloc_window(WINDOW).unwrap();
        dc.communicator().barrier().unwrap();
        if rank == 0 {
            // Rank 1 cuts its link only once rank 0 is out of the barrier too (the barrier's
            // last writes must not be the ones cut).
            let _ = barrier_passed.send(());
            let wait_cut = waits.lock().unwrap().1.take().unwrap();
            wait_cut.recv_timeout(bound).expect("rank 1 cut its link");
            let p = dc.host_producer(0).unwrap();
            let d = with_counter(with_signal(put(1, w, 0, w, 0, 64), SignalOp::Add, 0, 1), 0);
            p.push(&d).unwrap();
            dc.wait_completed(0, 1, bound).unwrap();
            let errors = dc.errors();
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(matches!(errors[0].kind, K::Transfer { what: "put", peer: 1, .. }), "{:?}", errors[0]);
            assert_eq!(dc.ring_control(0).unwrap(), (1, 1, 1));
            assert_eq!(dc.counter(0).unwrap(), 0, "a failed put is not counted");
            assert_eq!(dc.stats().signal_writes_issued, 0, "nor signalled");
            let _ = checks_done.send(());
        } else {
            let (wait_barrier, wait_checks) = {
                let mut w = waits.lock().unwrap();
                (w.0.take().unwrap(), w.2.take().unwrap())
            };
            if wait_barrier.recv_timeout(bound).is_ok() {
                assert!(dc.communicator().transport().engine().cut_nic(0), "rank 1 has a fault injector");
                let _ = cut_done.send(());
                // Rank 1 stays open until rank 0 checked (its close would fail the put otherwise).
                let _ = wait_checks.recv_timeout(bound);
            }
        }
    });
}
