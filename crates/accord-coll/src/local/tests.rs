use std::time::{Duration, Instant};

use super::*;
use crate::transport::RemoteSlice;

fn soon() -> Instant {
    Instant::now() + Duration::from_millis(100)
}

#[test]
fn write_lands_and_counts_immediates() {
    let ts = LocalFabric::create(2).unwrap();
    let src = ts[0].register(vec![1, 2, 3, 4]).unwrap();
    let dst = ts[1].register(vec![0; 8]).unwrap();
    let desc = dst.remote_desc().clone();
    ts[0].write(1, src.slice(1, 3), RemoteSlice { desc: &desc, offset: 4 }, Some(7)).unwrap();
    ts[0].signal(1, 7).unwrap();
    ts[1].wait_imm(7, 2, soon()).unwrap();
    assert!(matches!(ts[1].wait_imm(7, 1, soon()), Err(TransportError::Timeout { .. })));
    assert_eq!(ts[1].deregister(dst).unwrap(), vec![0, 0, 0, 0, 2, 3, 4, 0]);
}

#[test]
fn bad_writes_are_errors() {
    let ts = LocalFabric::create(2).unwrap();
    let src = ts[0].register(vec![0; 4]).unwrap();
    let dst = ts[1].register(vec![0; 4]).unwrap();
    let desc = dst.remote_desc().clone();
    let out_of_bounds = ts[0].write(1, src.all(), RemoteSlice { desc: &desc, offset: 1 }, None);
    assert!(matches!(out_of_bounds, Err(TransportError::OutOfBounds { .. })));
    let wrong_peer = ts[0].write(0, src.all(), RemoteSlice { desc: &desc, offset: 0 }, None);
    assert!(matches!(wrong_peer, Err(TransportError::NotRegistered { .. })));
    let forged = RemoteBufDesc { token: vec![0; 16], ..desc.clone() };
    assert!(ts[0].write(1, src.all(), RemoteSlice { desc: &forged, offset: 0 }, None).is_err());
    assert!(matches!(ts[0].signal(9, 1), Err(TransportError::BadRank { .. })));
    ts[1].deregister(dst).unwrap();
    assert!(ts[0].write(1, src.all(), RemoteSlice { desc: &desc, offset: 0 }, None).is_err());
    assert!(LocalFabric::create(0).is_err());
}

#[test]
fn ctrl_messages_by_sender_and_tag() {
    let ts = LocalFabric::create(3).unwrap();
    ts[0].send_ctrl(2, 5, b"from0").unwrap();
    ts[1].send_ctrl(2, 5, b"from1").unwrap();
    assert_eq!(ts[2].recv_ctrl(1, 5, soon()).unwrap(), b"from1");
    assert_eq!(ts[2].recv_ctrl(0, 5, soon()).unwrap(), b"from0");
    assert!(ts[2].recv_ctrl(0, 5, soon()).is_err());
    let blobs = std::thread::scope(|s| {
        let hs: Vec<_> =
            ts.iter().map(|t| s.spawn(move || t.exchange_blobs(9, &[t.rank() as u8], soon()).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    assert!(blobs.iter().all(|b| b == &vec![vec![0], vec![1], vec![2]]));
}

#[test]
fn local_access_handles_one_buffer_and_rejects_overlap() {
    let ts = LocalFabric::create(1).unwrap();
    let b = ts[0].register((0..8).collect()).unwrap();
    ts[0].access_local(b.slice(4, 4), b.slice(0, 4), &mut |s, d| d.copy_from_slice(s)).unwrap();
    ts[0].access_local(b.slice(0, 2), b.slice(6, 2), &mut |s, d| d.copy_from_slice(s)).unwrap();
    let mut out = [0u8; 8];
    ts[0].read_local(b.all(), &mut out).unwrap();
    assert_eq!(out, [4, 5, 6, 7, 4, 5, 4, 5]);
    let e = ts[0].access_local(b.slice(0, 4), b.slice(2, 4), &mut |_, _| {});
    assert!(matches!(e, Err(TransportError::Overlap { .. })));
}

#[test]
fn abort_notice_wakes_waiters_and_stop_drops_traffic() {
    let ts = LocalFabric::create(3).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ts[1].wait_imm(1, 1, Instant::now() + Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        ts[0].report_stuck(2);
        let e = waiter.join().unwrap().unwrap_err();
        assert!(matches!(e, TransportError::Aborted { reported_by: 0, waiting_on: 2 }), "{e}");
    });
    assert_eq!(ts[2].stuck_reports(), vec![(0, 2)]);
    assert!(ts[0].stuck_reports().is_empty());
    ts[1].stop_after_writes(1);
    ts[1].signal(0, 3).unwrap();
    ts[1].signal(0, 3).unwrap(); // dropped
    assert!(ts[1].is_stopped());
    assert!(matches!(ts[1].flush(soon()), Err(TransportError::Stopped)));
}
