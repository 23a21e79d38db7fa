//! Chunks that ride in their asks (`AskInline`): they land byte for byte with their immediate,
//! are refused as any ask is, fall back to the rendezvous above 8 bytes or when turned off,
//! and an ask delivered twice is answered twice but copied once.

use std::sync::atomic::Ordering;
use std::time::Duration;

use accord_proto::wire::RejectReason;

use super::tests::{device_dst, engine, fake_landing, pair, poke, receiver, wait_until};
use super::wire::{Body, Control, CONTROL_MESSAGE_BYTES};
use crate::error::TransferError;
use crate::{Engine, EngineConfig, WriteOp};

/// Writes `len` bytes of `value` (little-endian) from `a` at `offset` of `d`, with `imm`.
fn small_write(
    a: &Engine,
    d: &crate::MrDescriptor,
    offset: u64,
    value: u64,
    len: usize,
    imm: u32,
) -> Result<(), TransferError> {
    let src = a.alloc(8).unwrap();
    src.write_at(0, &value.to_le_bytes()).unwrap();
    let sh = src.handle();
    let op = WriteOp { src: &sh, src_offset: 0, dst: d, dst_offset: offset, len: len as u64, imm: Some(imm) };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(30))
}

/// A fake-landing receiver and a writer paired with it, and a "device" region of `len` bytes
/// at the receiver (its host buffer and its descriptor).
fn rig(len: usize) -> (super::tests::Receiver, Engine, crate::MrBuffer, crate::MrDescriptor) {
    let r = receiver(10_000);
    let a = engine(10_000);
    pair(&a, &r.b);
    let (dst, d) = device_dst(&r.b, len);
    (r, a, dst, d)
}

#[test]
fn writes_of_one_to_eight_bytes_ride_in_their_asks_and_land_exactly() {
    let (r, a, dst, d) = rig(4096);
    let mut expected = vec![0u8; 4096];
    for len in 1..=8usize {
        let (offset, value) = (100 * len as u64 + 3, 0x1122_3344_5566_7788u64.rotate_left(len as u32));
        small_write(&a, &d, offset, value, len, 5).unwrap();
        expected[offset as usize..offset as usize + len].copy_from_slice(&value.to_le_bytes()[..len]);
    }
    assert_eq!(r.b.imm_counter(5).wait(8, Duration::from_secs(10)), 8, "one immediate per write");
    assert_eq!(dst.to_vec(), expected, "each write's bytes and no others");
    assert_eq!(a.landing_stats().chunks_inline, 8, "every write went inline");
    assert_eq!(r.b.landing_stats().chunks_landed, 8);
    assert_eq!(r.copies.load(Ordering::SeqCst), 8, "one copy each");
    // Nine bytes take the rendezvous.
    small_write(&a, &d, 2000, 7, 8, 6).unwrap();
    let src = a.alloc(9).unwrap();
    src.write_at(0, &[0xee; 9]).unwrap();
    let sh = src.handle();
    let op = WriteOp { src: &sh, src_offset: 0, dst: &d, dst_offset: 3000, len: 9, imm: None };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(&dst.to_vec()[3000..3009], &[0xee; 9]);
    assert_eq!(a.landing_stats().chunks_inline, 9, "the 9-byte write was not inline");
}

#[test]
fn with_inline_asks_off_small_writes_take_the_rendezvous() {
    let r = receiver(10_000);
    let config = EngineConfig { device_landing_inline: false, ..super::tests::config(10_000) };
    let a = Engine::builder().ignore_env().config(config).force_network(true).build().unwrap();
    pair(&a, &r.b);
    let (dst, d) = device_dst(&r.b, 64);
    small_write(&a, &d, 8, 0xabcd, 8, 1).unwrap();
    assert_eq!(r.b.imm_counter(1).wait(1, Duration::from_secs(10)), 1);
    assert_eq!(&dst.to_vec()[8..16], &0xabcdu64.to_le_bytes());
    assert_eq!(a.landing_stats().chunks_inline, 0);
    assert_eq!(r.b.landing_stats().chunks_landed, 1);
}

#[test]
fn inline_asks_with_bad_keys_or_ranges_are_refused_and_copy_nothing() {
    let (r, a, dst, d) = rig(64);
    let mut bad_key = d;
    bad_key.key ^= 1;
    let mut too_long = d;
    too_long.len = 1 << 20;
    assert_eq!(small_write(&a, &bad_key, 0, 1, 8, 2), Err(TransferError::Rejected(RejectReason::BadKey)));
    assert_eq!(small_write(&a, &too_long, 60, 1, 8, 2), Err(TransferError::Rejected(RejectReason::OutOfBounds)));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.b.imm_counter(2).value(), 0, "no immediate for a refused write");
    assert_eq!(r.copies.load(Ordering::SeqCst), 0, "nothing copied");
    assert!(dst.to_vec().iter().all(|&x| x == 0));
    assert_eq!(a.landing_stats().chunks_inline, 2);
    assert_eq!(r.b.landing_stats().asks_refused, 2);
}

/// An ask delivered again after its answer (a write resent on another lane) must not copy its
/// old bytes over a newer write to the same place.
#[test]
fn an_inline_ask_delivered_twice_is_answered_twice_and_copied_once() {
    let (r, a, dst, d) = rig(64);
    let ask =
        |value: u64| Body::AskInline { region: d.region, key: d.key, offset: 16, len: 8, bytes: value.to_le_bytes() };
    let msg = |req, body| Control { from: a.id(), req, body }.encode();
    let first: [u8; CONTROL_MESSAGE_BYTES] = msg(500, ask(1));
    poke(&a, &r.b, 0, &first);
    wait_until("the first copy", || r.b.landing_stats().chunks_landed == 1);
    poke(&a, &r.b, 0, &msg(501, ask(2)));
    wait_until("the newer copy", || r.b.landing_stats().chunks_landed == 2);
    poke(&a, &r.b, 0, &first);
    wait_until("the duplicate counted", || r.b.landing_stats().inline_duplicates == 1);
    assert_eq!(r.copies.load(Ordering::SeqCst), 2, "the duplicate was not copied");
    assert_eq!(&dst.to_vec()[16..24], &2u64.to_le_bytes(), "the newer value stays");
    // Each answer (the two Dones and the repeated one) reached `a`, which asked none of them:
    // stale there, counted, ignored.
    wait_until("the answers counted at the writer", || a.landing_stats().control_refused == 3);
}

#[test]
fn inline_chunks_fill_slots_as_any_chunk_and_wait_for_a_free_one() {
    // The receiver's three slots are held by copies that do not complete: an inline ask waits
    // in the queue, then lands once a slot is free.
    let r = fake_landing(engine(10_000));
    let a = engine(10_000);
    pair(&a, &r.b);
    let (dst, d) = device_dst(&r.b, 4 << 20);
    r.open.store(false, Ordering::SeqCst);
    let big = a.alloc(3 << 16).unwrap();
    big.fill(3);
    let bh = big.handle();
    let op = WriteOp { src: &bh, src_offset: 0, dst: &d, dst_offset: 1 << 20, len: 3 << 16, imm: None };
    let held = a.write(&op).unwrap();
    wait_until("three copies holding every slot", || r.copies.load(Ordering::SeqCst) == 3);
    let small = std::thread::scope(|s| {
        let t = s.spawn(|| small_write(&a, &d, 0, 0x77, 8, 4));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(r.copies.load(Ordering::SeqCst), 3, "the inline ask waits for a slot");
        r.open.store(true, Ordering::SeqCst);
        t.join().unwrap()
    });
    small.unwrap();
    held.wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(&dst.to_vec()[..8], &0x77u64.to_le_bytes());
    assert_eq!(r.b.imm_counter(4).wait(1, Duration::from_secs(10)), 1);
}

#[test]
fn inline_asks_with_bad_lengths_or_stray_bytes_do_not_decode() {
    let good = Control {
        from: crate::EngineId(9),
        req: 4,
        body: Body::AskInline { region: 1, key: 2, offset: 3, len: 2, bytes: [5, 6, 0, 0, 0, 0, 0, 0] },
    }
    .encode();
    assert!(Control::decode(0, &good).is_ok());
    let with = |at: usize, byte: u8| {
        let mut m = good;
        m[at] = byte;
        m
    };
    // 56..60: the length; 60..64: zero; 48..56: the bytes, zero past the length.
    for (what, m) in [
        ("length 0", with(56, 0)),
        ("length 9", with(56, 9)),
        ("second half-word", with(60, 1)),
        ("a byte past the length", with(50, 1)),
    ] {
        assert!(Control::decode(0, &m).is_err(), "{what} decoded");
    }
    assert!(Control::decode(0, &with(49, 0xff)).is_ok(), "a byte within the length is data");
}

/// Not a test of correctness: the latency of one small write at a time into a fake device
/// region (memcpy standing in for the host-to-device copy) with its bytes inside the ask and
/// through the full rendezvous, against a plain host write of the same bytes over the same
/// loopback transport, in one run. Prints a table; run with
/// `cargo test --release -p accord-engine --lib small_landed_writes_inline_vs_rendezvous -- --ignored --nocapture`.
#[test]
#[ignore]
fn small_landed_writes_inline_vs_rendezvous() {
    let iters = 2000;
    let build = |inline: bool| {
        let config = EngineConfig { device_landing_inline: inline, ..super::tests::config(10_000) };
        Engine::builder().ignore_env().config(config).force_network(true).build().unwrap()
    };
    let (inline_writer, rendezvous_writer, r) = (build(true), build(false), fake_landing(build(true)));
    pair(&inline_writer, &r.b);
    pair(&rendezvous_writer, &r.b);
    let (_dst, d) = device_dst(&r.b, 4096);
    let host_dst = r.b.alloc(4096).unwrap();
    let hd = host_dst.descriptor();
    let time = |a: &Engine, d: &crate::MrDescriptor, round: usize| {
        let src = a.alloc(8).unwrap();
        let sh = src.handle();
        let op = WriteOp { src: &sh, src_offset: 0, dst: d, dst_offset: 8 * round as u64, len: 8, imm: None };
        let mut samples: Vec<f64> = (0..iters)
            .map(|_| {
                let t = std::time::Instant::now();
                a.write(&op).unwrap().wait_timeout(Duration::from_secs(30)).unwrap();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        samples.sort_by(f64::total_cmp);
        (samples[iters / 2], samples[iters * 9 / 10])
    };
    println!("8-byte writes one at a time, until the writer's completion, microseconds (p50 / p90)");
    println!(
        "{:>5} {:>16} {:>16} {:>16} {:>14}",
        "round", "host write", "landed inline", "landed rendezvous", "rdv / inline"
    );
    for round in 0..3 {
        let host = time(&inline_writer, &hd, round);
        let inline = time(&inline_writer, &d, round);
        let rendezvous = time(&rendezvous_writer, &d, round);
        println!(
            "{round:>5} {:>8.1} / {:>5.1} {:>8.1} / {:>5.1} {:>8.1} / {:>5.1} {:>14.2}",
            host.0,
            host.1,
            inline.0,
            inline.1,
            rendezvous.0,
            rendezvous.1,
            rendezvous.0 / inline.0
        );
    }
}

#[test]
fn the_receiver_remembers_a_bounded_number_of_inline_answers() {
    let mut answers = super::receiver::InlineAnswers::default();
    let id = |n: u64| (crate::EngineId(1), n);
    for n in 0..super::INLINE_ANSWERS_KEPT as u64 + 10 {
        answers.insert(id(n), Body::Done);
    }
    answers.insert(id(20), Body::Done); // again: not a second entry
    assert_eq!(answers.len(), super::INLINE_ANSWERS_KEPT);
    assert_eq!(answers.get(&id(9)), None, "the oldest are forgotten");
    assert_eq!(answers.get(&id(10)), Some(&Body::Done));
}
