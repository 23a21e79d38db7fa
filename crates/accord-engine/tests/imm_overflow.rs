//! A full immediate-counter table loses work: writes land in memory and complete at their
//! sender, but their immediates are not counted. The receiver must see that as an error (the
//! counter's checked wait and the engine's poll), and releasing a counter must make room.

use accord_engine::{Engine, ImmError, WriteOp, IMM_COUNTERS_MAX};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn engine() -> Engine {
    Engine::builder().ignore_env().force_network(true).build().expect("engine builds")
}

#[test]
fn overflow_is_an_error_at_the_receiver_and_release_makes_room() {
    let (a, b) = (engine(), engine());
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let src = a.alloc(64).unwrap();
    let dst = b.alloc(64).unwrap();
    src.write_at(0, &[7u8; 64]).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let write = |imm: u32| {
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 64, imm: Some(imm) };
        a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    };

    // Fill the receiver's table: every counter held, none ever taken.
    for imm in 0..IMM_COUNTERS_MAX as u32 {
        drop(b.imm_counter(imm));
    }
    assert_eq!(b.imm_counters_held(), IMM_COUNTERS_MAX);
    let late: u32 = 1 << 30;
    let counter = b.imm_counter(late);
    write(late); // completes at the sender...
                 // ...but the receiver's checked wait says the write was lost, rather than timing out.
    match counter.wait_checked(1, WAIT) {
        Err(ImmError::Overflow { imm, lost, value }) => assert_eq!((imm, lost, value), (late, 1, 0)),
        other => panic!("expected an overflow error, got {other:?}"),
    }
    assert!(counter.wait_checked(1, WAIT).unwrap_err().to_string().contains("release_imm"));
    assert_eq!(b.stats().imm_overflow, 1);
    // The poll API reports it once.
    assert_eq!(b.imm_overflows(), vec![(late, 1)]);
    assert!(b.imm_overflows().is_empty());
    drop(counter);

    // Releasing one counter makes room: the next write with a new immediate is counted.
    assert_eq!(b.release_imm(0), Some(0));
    assert_eq!(b.release_imm(0), None);
    let fresh = late + 1;
    write(fresh);
    assert_eq!(b.imm_counter(fresh).wait_checked(1, WAIT), Ok(1));
    assert!(b.imm_overflows().is_empty());
}

#[test]
fn checked_wait_times_out_with_a_named_error() {
    let b = engine();
    match b.imm_counter(5).wait_checked(1, Duration::from_millis(50)) {
        Err(ImmError::Timeout { imm: 5, value: 0, target: 1 }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
}
