use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::control::{Control, CONTROL_MAGIC};
use super::*;
use crate::udp::{UdpConfig, UdpDatapath};

const PATHS: u16 = 3;
const DEADLINE: Duration = Duration::from_secs(10);

type Shm = ShmDatapath<UdpDatapath>;

fn config() -> ShmConfig {
    ShmConfig { dir: test_dir(), ring_bytes: ring::RING_DATA_BYTES_MIN, ..ShmConfig::default() }
}

fn make(config: ShmConfig) -> Shm {
    let udp = UdpDatapath::bind(UdpConfig { path_count: PATHS, ..UdpConfig::default() }).expect("bind loopback");
    ShmDatapath::new(udp, config).unwrap()
}

fn paths(d: &Shm) -> Vec<SocketAddr> {
    (0..d.path_count()).map(|p| d.local_addr(p).unwrap()).collect()
}

/// Receives on both sides (handling control datagrams) until `done` or the deadline.
fn pump(a: &mut Shm, b: &mut Shm, mut done: impl FnMut(&Shm, &Shm) -> bool) {
    let mut ra = a.alloc_rx_buffers(16).unwrap();
    let mut rb = b.alloc_rx_buffers(16).unwrap();
    let end = Instant::now() + DEADLINE;
    while !done(a, b) {
        assert!(Instant::now() < end, "gave up waiting; a {:?} b {:?}", a.stats(), b.stats());
        a.send_batch(&[]).unwrap();
        a.recv_batch(&mut ra, 16).unwrap();
        b.recv_batch(&mut rb, 16).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn attached_both_ways(a: &Shm, b: &Shm) -> bool {
    a.stats().rings_attached_tx == 1 && b.stats().rings_attached_tx == 1
}

/// Datagram `seq`: its number, then seeded bytes.
fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(4)];
    ChaCha8Rng::seed_from_u64(u64::from(seq)).fill(&mut v[4..]);
    v[..4].copy_from_slice(&seq.to_le_bytes());
    v
}

/// Sends `count` datagrams a -> b of seeded sizes over every path and checks each arrives once,
/// byte-exact, on the path it was sent to, from the address UDP would show (in any order:
/// UDP does not keep order across paths).
fn exchange(a: &mut Shm, b: &mut Shm, count: u32) {
    let b_paths = paths(b);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let sizes: Vec<usize> = (0..count).map(|_| rng.gen_range(1..=60_000)).collect();
    let mut rx = b.alloc_rx_buffers(32).unwrap();
    let (mut sent, mut got) = (0u32, 0u32);
    let mut seen = vec![false; count as usize];
    let end = Instant::now() + DEADLINE;
    while got < count {
        assert!(Instant::now() < end, "exchange stalled at {got}/{count}: a {:?} b {:?}", a.stats(), b.stats());
        if sent < count {
            let data: Vec<(u16, Vec<u8>)> = (sent..count.min(sent + 8))
                .map(|s| ((s % u32::from(PATHS)) as u16, payload(s, sizes[s as usize])))
                .collect();
            let batch: Vec<TxDatagram<'_>> =
                data.iter().map(|(p, bytes)| TxDatagram::new(*p, b_paths[usize::from(*p)], bytes)).collect();
            sent += a.send_batch(&batch).unwrap() as u32;
        }
        b.wait_readable(Duration::from_millis(1)).unwrap();
        b.recv_batch(&mut rx, 32).unwrap();
        for (bytes, meta) in rx.iter() {
            let seq = u32::from_le_bytes(bytes[..4].try_into().unwrap());
            assert!(seq < count && !seen[seq as usize], "datagram {seq} unexpected or duplicated");
            seen[seq as usize] = true;
            let path = (seq % u32::from(PATHS)) as u16;
            assert_eq!(meta.path, path, "datagram {seq} arrived on the wrong path");
            assert_eq!(meta.src, a.local_addr(path).unwrap(), "datagram {seq} from the wrong source");
            assert_eq!(bytes, &payload(seq, sizes[seq as usize])[..], "datagram {seq} bytes");
            got += 1;
        }
    }
}

#[test]
fn peers_attach_both_ways_and_carry_datagrams_through_rings() {
    let (mut a, mut b) = (make(config()), make(config()));
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, attached_both_ways);
    exchange(&mut a, &mut b, 300);
    assert_eq!(a.stats().tx_datagrams, 300, "every datagram went through the ring: {:?}", a.stats());
    assert_eq!(b.stats().rx_datagrams, 300);
    // And back, through the ring b offered in return.
    exchange(&mut b, &mut a, 50);
    assert_eq!(b.stats().tx_datagrams, 50);
    // The syscall-free check a polling worker makes sees a ring datagram before it is read,
    // and nothing once it was.
    assert!(!b.local_channel_has_data());
    let one = payload(0, 100);
    assert_eq!(a.send_batch(&[TxDatagram::new(0, paths(&b)[0], &one)]).unwrap(), 1);
    assert!(b.local_channel_has_data(), "a datagram sits in the ring");
    let mut rx = b.alloc_rx_buffers(4).unwrap();
    assert_eq!(b.recv_batch(&mut rx, 4).unwrap(), 1);
    assert!(!b.local_channel_has_data());
}

#[test]
fn direct_sends_write_in_place_and_only_where_a_ring_is_attached() {
    let (mut a, mut b) = (make(config()), make(config()));
    let dst = paths(&b)[2];
    let mut fill = |buf: &mut [u8]| {
        buf.fill(9);
        true
    };
    assert_eq!(a.send_direct(2, dst, 100, &mut fill).unwrap(), DirectSend::Unsupported, "no ring yet");
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, |a, _| a.stats().rings_attached_tx == 1);
    assert_eq!(a.send_direct(2, dst, 100, &mut fill).unwrap(), DirectSend::Sent);
    assert_eq!(a.send_direct(2, dst, 100, &mut |_| false).unwrap(), DirectSend::Cancelled);
    assert!(a.send_direct(9, dst, 100, &mut fill).is_err(), "unknown path");
    assert!(a.send_direct(2, dst, 70_000, &mut fill).is_err(), "too large");
    let mut rx = b.alloc_rx_buffers(4).unwrap();
    let end = Instant::now() + DEADLINE;
    while b.recv_batch(&mut rx, 4).unwrap() == 0 {
        assert!(Instant::now() < end);
    }
    let (bytes, meta) = rx.get(0).unwrap();
    assert_eq!((bytes, meta.path, meta.src), (&[9u8; 100][..], 2, a.local_addr(2).unwrap()));
    assert_eq!(rx.len(), 1, "the cancelled one left nothing");
    let big = vec![0u8; 60_000];
    let mut sent = 0;
    while a
        .send_direct(0, paths(&b)[0], big.len(), &mut |buf: &mut [u8]| {
            buf.copy_from_slice(&big);
            true
        })
        .unwrap()
        == DirectSend::Sent
    {
        sent += 1;
        assert!(sent < 10);
    }
    assert_eq!(sent, 4, "then Full, like send_batch");
}

#[test]
fn a_full_ring_sends_a_prefix() {
    let (mut a, mut b) = (make(config()), make(config()));
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, |a, _| a.stats().rings_attached_tx == 1);
    let dst = paths(&b)[1];
    let big = vec![3u8; 60_000];
    let batch: Vec<TxDatagram<'_>> = (0..10).map(|_| TxDatagram::new(1, dst, &big)).collect();
    assert_eq!(a.send_batch(&batch).unwrap(), 4, "a 256 KiB ring holds four 60 KB datagrams");
    assert_eq!(a.send_batch(&batch).unwrap(), 0, "still full");
    assert!(a.stats().tx_ring_full >= 2);
    let mut rx = b.alloc_rx_buffers(16).unwrap();
    let mut got = 0;
    while got < 4 {
        got += b.recv_batch(&mut rx, 16).unwrap();
    }
    assert_eq!(a.send_batch(&batch).unwrap(), 4, "room again after the consumer drained");
}

#[test]
fn a_refused_ring_leaves_the_peer_on_udp() {
    // b looks for ring files in a directory where a does not create them: attach fails there.
    let missing = test_dir().join("not-there");
    let (mut a, mut b) = (make(config()), make(ShmConfig { dir: missing, ..config() }));
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, |a, _| a.stats().attach_refused == 1);
    exchange(&mut a, &mut b, 40);
    assert_eq!(a.stats().tx_datagrams, 0);
    assert_eq!(a.stats().rings_attached_tx, 0);
}

#[test]
fn a_ring_that_cannot_be_created_leaves_the_peer_on_udp() {
    let missing = test_dir().join("not-there");
    let (mut a, mut b) = (make(ShmConfig { dir: missing, ..config() }), make(config()));
    a.offer_local_channel(&paths(&b));
    assert_eq!(a.stats().attach_failed_local, 1);
    exchange(&mut a, &mut b, 40);
    assert_eq!(a.stats().tx_datagrams, 0);
}

#[test]
fn disabled_neither_offers_nor_accepts() {
    let (mut a, mut b) = (make(config()), make(ShmConfig { enabled: false, ..config() }));
    b.offer_local_channel(&paths(&a));
    assert_eq!(b.stats(), ShmStats::default());
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, |a, _| a.stats().attach_refused == 1);
    exchange(&mut a, &mut b, 20);
    assert_eq!(a.stats().tx_datagrams, 0);
}

#[test]
fn a_sleeping_receiver_is_woken_by_the_doorbell() {
    let (mut a, mut b) = (make(config()), make(config()));
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, attached_both_ways);
    let dst = paths(&b)[2];
    let waiter = std::thread::spawn(move || {
        let mut rx = b.alloc_rx_buffers(4).unwrap();
        // Long timeout: returns true only if something woke it (a missed doorbell sleeps 20 s).
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let readable = b.wait_readable(Duration::from_secs(20)).unwrap();
            if b.recv_batch(&mut rx, 4).unwrap() > 0 {
                return (readable, b.stats());
            }
            assert!(Instant::now() < end, "never received the datagram");
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    a.send_batch(&[TxDatagram::new(2, dst, b"wake up")]).unwrap();
    let (readable, stats) = waiter.join().unwrap();
    assert!(readable);
    assert_eq!(stats.rx_datagrams, 1);
    assert_eq!(a.stats().doorbells_sent, 1, "the receiver was asleep, so exactly one doorbell");
}

#[test]
fn a_closed_consumer_sends_the_producer_back_to_udp() {
    let (mut a, mut b) = (make(config()), make(config()));
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, attached_both_ways);
    let dst = paths(&b)[0];
    drop(b);
    let d = [TxDatagram::new(0, dst, b"to nobody")];
    assert_eq!(a.send_batch(&d).unwrap(), 0, "the ring is found closed and abandoned");
    assert_eq!(a.stats().rings_abandoned, 1);
    assert_eq!(a.send_batch(&d).unwrap(), 1, "then UDP (which the kernel reports unreachable)");
    assert_eq!(a.stats().tx_datagrams, 0);
}

#[test]
fn control_messages_round_trip_and_garbage_is_rejected() {
    let attach = Control::Attach {
        nonce: 9,
        data_bytes: 1 << 20,
        name: "accord-1-2-3".into(),
        paths: vec!["127.0.0.1:5".parse().unwrap(), "[::1]:6".parse().unwrap()],
    };
    for msg in [attach, Control::Attached { nonce: 1 }, Control::Refused { nonce: 2 }, Control::Doorbell] {
        let bytes = msg.encode();
        assert_eq!(Control::parse(&bytes), Some(msg.clone()));
        for cut in 0..bytes.len() {
            assert_eq!(Control::parse(&bytes[..cut]), None, "truncated {msg:?} at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Control::parse(&long), None);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for _ in 0..20_000 {
        let mut bytes = CONTROL_MAGIC.to_vec();
        let len = rng.gen_range(0..200);
        bytes.extend((0..len).map(|_| rng.gen::<u8>()));
        if rng.gen_bool(0.5) {
            let at = CONTROL_MAGIC.len().min(bytes.len() - 1);
            bytes[at] = rng.gen_range(0..6);
        }
        let _ = Control::parse(&bytes);
    }
    assert_ne!(CONTROL_MAGIC[0], 1, "distinct from accord-proto's version byte");
}

#[test]
fn forged_attach_messages_are_ignored_or_refused() {
    let (mut a, mut b) = (make(config()), make(config()));
    // Names a path 0 that is not its source: ignored.
    let forged = Control::Attach {
        nonce: 1,
        data_bytes: ring::RING_DATA_BYTES_MIN as u64,
        name: "accord-nope".into(),
        paths: vec!["127.0.0.1:9".parse().unwrap()],
    };
    let bytes = forged.encode();
    a.inner.send_batch(&[TxDatagram::new(0, paths(&b)[0], &bytes)]).unwrap();
    // Names its true source but a file that is not there: refused.
    let honest = Control::Attach {
        nonce: 2,
        data_bytes: ring::RING_DATA_BYTES_MIN as u64,
        name: "accord-../../etc/passwd".into(),
        paths: paths(&a),
    };
    let bytes = honest.encode();
    a.inner.send_batch(&[TxDatagram::new(0, paths(&b)[0], &bytes)]).unwrap();
    pump(&mut a, &mut b, |_, b| b.stats().control_ignored >= 1 && b.remotes.len() == 1);
    assert_eq!(b.stats().rings_attached_rx, 0);
}

#[test]
fn stale_ring_files_of_dead_processes_are_swept_and_others_kept() {
    let dir = test_dir().join("sweep");
    std::fs::create_dir_all(&dir).unwrap();
    let old = std::time::SystemTime::now() - STALE_RING_AGE - Duration::from_secs(5);
    let touch = |name: &str, mtime: std::time::SystemTime| {
        let f = std::fs::File::create(dir.join(name)).unwrap();
        f.set_modified(mtime).unwrap();
    };
    let me = std::process::id();
    touch("accord-4294967295-dead-1", old); // no such pid: removed
    touch("accord-4294967294-young-1", std::time::SystemTime::now()); // too young: kept
    touch(&format!("accord-{me}-alive-1"), old); // our own pid: kept
    touch("other-4294967295-x", old); // not ours: kept
    assert_eq!(sweep_stale_rings(&dir), 1);
    let mut left: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    // Sorted too: where our own pid's name falls depends on its digits.
    let mut kept =
        vec![format!("accord-{me}-alive-1"), "accord-4294967294-young-1".into(), "other-4294967295-x".into()];
    kept.sort();
    assert_eq!(left, kept);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lent_datagrams_read_back_exactly_and_keep_their_ring_space_until_the_next_call() {
    let (mut a, mut b) = (make(config()), make(config()));
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, attached_both_ways);
    let dst = paths(&b)[1];
    let sizes = [100usize, crate::LEND_MIN_BYTES - 1, crate::LEND_MIN_BYTES, 30_000, 60_000, 5_000, 45_000];
    let mut rx = b.alloc_rx_buffers(16).unwrap();
    rx.allow_lending(true);
    let mut sent = 0;
    for (seq, len) in sizes.iter().enumerate() {
        let bytes = payload(seq as u32, *len);
        sent += a.send_batch(&[TxDatagram::new(1, dst, &bytes)]).unwrap();
    }
    assert_eq!(sent, sizes.len(), "the ring holds them all");
    let end = Instant::now() + DEADLINE;
    while rx.len() < sizes.len() {
        assert!(Instant::now() < end, "datagrams did not arrive: {:?}", b.stats());
        b.recv_batch(&mut rx, 16).unwrap();
    }
    let whole = |rx: &RxBuffers, i: usize| match rx.lent(i) {
        Some(l) => {
            let mut v = vec![0u8; l.len()];
            assert!(l.copy_to_slice(0, &mut v));
            assert!(!l.copy_to_slice(1, &mut v), "a range past the datagram is refused");
            assert_eq!(&rx.get(i).unwrap().0[..crate::LENT_HEAD_BYTES], &v[..crate::LENT_HEAD_BYTES]);
            v
        }
        None => rx.get(i).unwrap().0.to_vec(),
    };
    let lent: Vec<bool> = (0..sizes.len()).map(|i| rx.lent(i).is_some()).collect();
    let expected: Vec<bool> = sizes.iter().map(|&l| l >= crate::LEND_MIN_BYTES).collect();
    assert_eq!(lent, expected, "large datagrams are lent, small ones copied");
    assert_eq!(b.stats().rx_lent, expected.iter().filter(|l| **l).count() as u64);
    // The producer fills the ring while we still read what was lent: nothing of it is reused.
    let filler = vec![0xEEu8; 60_000];
    let mut pushed = 0;
    while a.send_batch(&[TxDatagram::new(1, dst, &filler)]).unwrap() == 1 {
        pushed += 1;
        assert!(pushed < 10_000, "the ring never filled");
    }
    for (i, len) in sizes.iter().enumerate() {
        assert_eq!(whole(&rx, i), payload(i as u32, *len), "datagram {i} intact while lent");
    }
    // Our next call hands the space back: the producer finds room again.
    b.recv_batch(&mut rx, 16).unwrap();
    let end = Instant::now() + DEADLINE;
    loop {
        assert!(Instant::now() < end, "the lent space never came back");
        b.recv_batch(&mut rx, 16).unwrap();
        if a.send_batch(&[TxDatagram::new(1, dst, &filler)]).unwrap() == 1 {
            break;
        }
    }
}

#[test]
fn a_receiver_polling_without_blocking_never_costs_a_doorbell() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    // Many sends while the receiver polls, so a poll that briefly marked the consumer as
    // sleeping (as a blocking wait does) would be seen by some send and cost a doorbell.
    const COUNT: u32 = 5000;
    const IN_FLIGHT_MAX: u32 = 64;
    let (mut a, mut b) = (make(config()), make(config()));
    a.offer_local_channel(&paths(&b));
    pump(&mut a, &mut b, attached_both_ways);
    let dst = paths(&b)[1];
    let received = Arc::new(AtomicU32::new(0));
    let seen = received.clone();
    let poller = std::thread::spawn(move || {
        let mut rx = b.alloc_rx_buffers(16).unwrap();
        let mut polls_with_data = 0u32;
        let end = Instant::now() + DEADLINE;
        while seen.load(Ordering::Acquire) < COUNT {
            assert!(Instant::now() < end, "received {} of {COUNT}", seen.load(Ordering::Relaxed));
            if b.wait_readable(Duration::ZERO).unwrap() {
                polls_with_data += 1;
            }
            let n = b.recv_batch(&mut rx, 16).unwrap() as u32;
            seen.fetch_add(n, Ordering::AcqRel);
        }
        (polls_with_data, b.stats())
    });
    let end = Instant::now() + DEADLINE;
    for seq in 0..COUNT {
        // The ring holds a few thousand small entries: stay well inside it.
        while seq - received.load(Ordering::Acquire) >= IN_FLIGHT_MAX {
            assert!(Instant::now() < end, "the poller stopped receiving");
            std::thread::yield_now();
        }
        a.send_batch(&[TxDatagram::new(1, dst, &payload(seq, 100))]).unwrap();
    }
    let (polls_with_data, stats) = poller.join().unwrap();
    assert_eq!(stats.rx_datagrams, u64::from(COUNT));
    assert!(polls_with_data > 0, "a zero-timeout poll reports waiting ring entries");
    assert_eq!(a.stats().doorbells_sent, 0, "the poller never said it sleeps, so no doorbell was due");
}

#[test]
fn the_parser_reads_exactly_the_registered_knobs() {
    use accord_knobs::{check_reads, names_read_by, Component};
    let read = names_read_by(|lookup| {
        crate::shm::ShmConfig::default().with_overrides_from(|n| lookup(n)).expect("an empty environment parses");
    });
    check_reads(Component::SharedMemory, &read).unwrap();
}
