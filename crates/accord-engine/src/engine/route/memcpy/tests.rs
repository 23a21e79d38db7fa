//! The same-process route's copy threads: large writes land byte for byte with their
//! immediate counted once, wrong destinations are refused before any byte moves, and an engine
//! dropped with copies queued finishes them.

use super::pool::{LOCAL_COPY_CHUNK_BYTES, LOCAL_COPY_THREADS_MAX};
use super::LOCAL_COPY_ASYNC_MIN_BYTES;
use crate::engine::tests::{pair_of, pattern};
use crate::{Engine, TransferError, WriteOp};
use accord_proto::wire::RejectReason;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn engines(workers: usize) -> (Engine, Engine) {
    pair_of(|| Engine::builder().ignore_env().workers_per_nic(workers).build().expect("engine builds"))
}

#[test]
fn a_large_write_is_copied_by_the_copy_threads_and_counts_its_immediate_once() {
    let (a, b) = engines(4);
    // Not a whole number of chunks, so the last chunk is short.
    let len = (5 * LOCAL_COPY_CHUNK_BYTES + 12_345) as usize;
    let src = a.alloc(len).unwrap();
    let dst = b.alloc(len).unwrap();
    let data = pattern(21, len);
    src.write_at(0, &data).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(31) };
    a.write_unsharded(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert_eq!(b.imm_counter(31).wait(1, WAIT), 1);
    assert!(dst.to_vec() == data, "bytes differ");
    let threads = a.shared.local_copies.threads_running();
    assert!((1..=LOCAL_COPY_THREADS_MAX).contains(&threads), "{threads} copy threads ran the write");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(b.imm_counter(31).value(), 1, "the immediate is counted once, not per chunk");
}

#[test]
fn many_overlapping_writes_each_land_where_they_were_sent() {
    let (a, b) = engines(3);
    let piece = (LOCAL_COPY_ASYNC_MIN_BYTES * 3 + 4096) as usize;
    let pieces = 24usize;
    let src = a.alloc(piece * pieces).unwrap();
    let dst = b.alloc(piece * pieces).unwrap();
    let data = pattern(22, piece * pieces);
    src.write_at(0, &data).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    // Submitted in reverse so the copies cannot finish in submission order by accident.
    let transfers: Vec<_> = (0..pieces)
        .rev()
        .map(|i| {
            let at = (i * piece) as u64;
            let op = WriteOp { src: &h, src_offset: at, dst: &d, dst_offset: at, len: piece as u64, imm: Some(32) };
            a.write_unsharded(&op).unwrap()
        })
        .collect();
    for t in transfers {
        t.wait_timeout(WAIT).unwrap();
    }
    assert_eq!(b.imm_counter(32).wait(pieces as u64, WAIT), pieces as u64);
    assert!(dst.to_vec() == data, "bytes differ");
}

#[test]
fn a_large_write_past_the_destination_is_refused_and_writes_nothing() {
    let (a, b) = engines(2);
    let len = (2 * LOCAL_COPY_CHUNK_BYTES) as usize;
    let src = a.alloc(len).unwrap();
    src.write_at(0, &pattern(23, len)).unwrap();
    let dst = b.alloc(len).unwrap();
    let mut d = dst.descriptor();
    d.len = 2 * len as u64; // a peer's descriptor claiming more than the region has
    let h = src.handle();
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: len as u64 / 2, len: len as u64, imm: Some(33) };
    match a.write_unsharded(&op) {
        Err(_) => {} // refused at submission
        Ok(t) => assert_eq!(t.wait_timeout(WAIT), Err(TransferError::Rejected(RejectReason::OutOfBounds))),
    }
    assert!(dst.to_vec().iter().all(|&b| b == 0), "no byte landed");
    assert_eq!(b.imm_counter(33).value(), 0);
}

#[test]
fn a_write_into_a_deregistered_region_is_refused() {
    let (a, b) = engines(2);
    let len = (3 * LOCAL_COPY_CHUNK_BYTES) as usize;
    let src = a.alloc(len).unwrap();
    let dst = b.alloc(len).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    drop(dst);
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(34) };
    let t = a.write_unsharded(&op).unwrap();
    assert_eq!(t.wait_timeout(WAIT), Err(TransferError::Rejected(RejectReason::UnknownRegion)));
    assert_eq!(b.imm_counter(34).value(), 0);
}

#[test]
fn copies_queued_when_the_sender_drops_still_land() {
    let (a, b) = engines(2);
    let piece = (4 * LOCAL_COPY_CHUNK_BYTES) as usize;
    let pieces = 16usize;
    let src = a.alloc(piece * pieces).unwrap();
    let dst = b.alloc(piece * pieces).unwrap();
    let data = pattern(24, piece * pieces);
    src.write_at(0, &data).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let transfers: Vec<_> = (0..pieces)
        .map(|i| {
            let at = (i * piece) as u64;
            let op = WriteOp { src: &h, src_offset: at, dst: &d, dst_offset: at, len: piece as u64, imm: Some(35) };
            a.write_unsharded(&op).unwrap()
        })
        .collect();
    drop(src);
    drop(a); // joins the copy threads after the queue drained
    for t in transfers {
        t.wait_timeout(WAIT).unwrap();
    }
    assert_eq!(b.imm_counter(35).wait(pieces as u64, WAIT), pieces as u64);
    assert!(dst.to_vec() == data, "bytes differ");
}
