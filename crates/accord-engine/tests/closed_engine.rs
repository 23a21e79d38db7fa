//! Blocking calls on an engine that shut down end with `ShutDown` at once, not at their
//! timeout: counter waits (started before or after the shutdown) and transfer waits.
//! Every wait here has a long timeout, so a wait that missed the shutdown reports `Timeout`
//! and the test fails on the value, never on a clock.

use accord_engine::{Engine, FaultConfig, ImmError, TransferError, WriteOp};
use std::time::Duration;

/// Far longer than a wait that saw the shutdown takes.
const LONG: Duration = Duration::from_secs(120);

fn engine() -> Engine {
    Engine::builder().ignore_env().force_network(true).build().expect("engine builds")
}

#[test]
fn a_counter_wait_after_shutdown_ends_at_once_with_shutdown() {
    let e = engine();
    let counter = e.imm_counter(7);
    drop(e);
    assert!(counter.engine_closed());
    assert_eq!(counter.wait_checked(1, LONG), Err(ImmError::ShutDown { imm: 7, value: 0 }));
    assert_eq!(counter.wait(1, LONG), 0, "the plain wait returns the value, short of the target");
    assert_eq!(counter.wait_checked(0, LONG), Ok(0), "a target already reached is no error");
}

#[test]
fn a_counter_wait_in_progress_is_woken_by_the_shutdown() {
    let e = engine();
    let counter = e.imm_counter(8);
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        started_tx.send(()).unwrap();
        counter.wait_checked(1, LONG)
    });
    started_rx.recv().unwrap();
    drop(e);
    assert_eq!(waiter.join().unwrap(), Err(ImmError::ShutDown { imm: 8, value: 0 }));
}

#[test]
fn a_transfer_wait_ends_with_shutdown_when_the_engine_goes() {
    // Every packet of `a` is dropped, so the write can only end by the shutdown.
    let a = Engine::builder()
        .ignore_env()
        .force_network(true)
        .fault_injection(FaultConfig { drop: 1.0, ..FaultConfig::default() }, 1)
        .build()
        .unwrap();
    let b = engine();
    a.add_peer(&b.address()).unwrap();
    let src = a.alloc(4096).unwrap();
    let dst = b.alloc(4096).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let transfer = a.write(&WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 4096, imm: None }).unwrap();
    drop(a);
    assert_eq!(transfer.wait_timeout(LONG), Err(TransferError::ShutDown));
    assert_eq!(transfer.wait(), Err(TransferError::ShutDown));
}
