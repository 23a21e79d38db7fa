//! What the proxy's signal ordering rests on: when an engine write completes at the sender,
//! its bytes are already placed at the receiver, on every route a CPU test reaches. The
//! proxy issues a signal write only after its put completed here, so the receiver sees the
//! signal after the bytes.
//!
//! Each iteration writes a new pattern over the same destination range, then reads the
//! receiver's memory as soon as the sender's `Transfer::wait` returns: a stale byte is the
//! previous pattern.

mod common;

use accord_engine::WriteOp;
use common::*;

fn check_route(route: Route) {
    let a = engine(route, 1);
    let b = engine(route, 2);
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    const MAX: usize = 256 * 1024;
    let src = a.alloc(MAX).unwrap();
    let dst = b.alloc(MAX).unwrap();
    let sizes = [8usize, 64, 1500, 9000, 64 * 1024, MAX];
    for i in 0..120usize {
        let len = sizes[i % sizes.len()];
        let data: Vec<u8> = (0..len).map(|k| (i * 37 + k * 11 + k / 253) as u8).collect();
        src.write_at(0, &data).unwrap();
        let op = WriteOp {
            src: &src.handle(),
            src_offset: 0,
            dst: &dst.descriptor(),
            dst_offset: 0,
            len: len as u64,
            imm: None,
        };
        a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
        let mut got = vec![0u8; len];
        dst.read_at(0, &mut got).unwrap();
        assert!(got == data, "{route:?}: write {i} of {len} bytes completed at the sender before it was placed");
    }
    // The route really was the one named.
    let shm = a.stats().shm_datagrams_sent();
    match route {
        Route::Shm => assert!(shm > 0, "no datagram went over shared memory"),
        Route::Udp | Route::UdpFaulty => assert_eq!(shm, 0, "{route:?} used shared memory"),
        _ => {}
    }
}

#[test]
fn a_completed_write_is_placed_over_memcpy() {
    check_route(Route::Memcpy);
}

#[test]
fn a_completed_write_is_placed_over_shared_memory() {
    check_route(Route::Shm);
}

#[test]
fn a_completed_write_is_placed_over_udp() {
    check_route(Route::Udp);
}

#[test]
fn a_completed_write_is_placed_over_udp_under_faults() {
    check_route(Route::UdpFaulty);
}
