use super::hostile;
use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::AtomicU64 as Counter;

static NEXT: Counter = Counter::new(0);

fn name() -> String {
    format!("accord-ringtest-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn pair(data_bytes: usize) -> (Producer, Consumer) {
    let dir = crate::shm::test_dir();
    let n = name();
    let p = Producer::create(&dir, &n, data_bytes, 42).unwrap();
    let c = Consumer::attach(&dir, &n, data_bytes as u64, 42).unwrap();
    (p, c)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

#[test]
fn entries_round_trip_across_many_wraps() {
    for seed in 0..4u64 {
        let (mut p, mut c) = pair(RING_DATA_BYTES_MIN);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = vec![0u8; ENTRY_PAYLOAD_BYTES_MAX];
        let (mut sent, mut got) = (0u64, 0u64);
        let total = 400u64;
        while got < total {
            // Push a random number of entries, then pop a random number.
            for _ in 0..rng.gen_range(0..6) {
                if sent == total {
                    break;
                }
                let len =
                    if rng.gen_bool(0.2) { rng.gen_range(0..=ENTRY_PAYLOAD_BYTES_MAX) } else { rng.gen_range(0..3000) };
                let bytes = pattern(seed * 10_000 + sent, len);
                match p.push(&bytes, sent as u32, (sent % 7) as u16, (sent % 5) as u16).unwrap() {
                    Push::Written => sent += 1,
                    Push::Full | Push::Cancelled => break,
                }
            }
            p.publish();
            for _ in 0..rng.gen_range(0..6) {
                let Some(e) = c.pop(&mut out).unwrap() else { break };
                let bytes = pattern(seed * 10_000 + got, e.len);
                assert_eq!(&out[..e.len], &bytes[..], "entry {got} bytes");
                assert_eq!((e.segment_bytes, e.src_path, e.dst_path), (got as u32, (got % 7) as u16, (got % 5) as u16));
                got += 1;
            }
            c.release();
        }
        assert!(p.head > 4 * RING_DATA_BYTES_MIN as u64, "wrapped several times: head {}", p.head);
        assert_eq!(c.pop(&mut out).unwrap(), None);
    }
}

#[test]
fn a_full_ring_refuses_until_the_consumer_frees_room() {
    let (mut p, mut c) = pair(RING_DATA_BYTES_MIN);
    let payload = vec![7u8; 60_000];
    let mut written = 0;
    while p.push(&payload, 0, 0, 0).unwrap() == Push::Written {
        written += 1;
        assert!(written < 100, "a 256 KiB ring cannot take 100 entries of 60 KB");
    }
    assert_eq!(written, 4);
    p.publish();
    // Unpublished tail reads do not free room.
    assert_eq!(p.push(&payload, 0, 0, 0).unwrap(), Push::Full);
    let mut out = vec![0u8; ENTRY_PAYLOAD_BYTES_MAX];
    assert!(c.pop(&mut out).unwrap().is_some());
    assert_eq!(p.push(&payload, 0, 0, 0).unwrap(), Push::Full, "room is freed only on release");
    c.release();
    assert_eq!(p.push(&payload, 0, 0, 0).unwrap(), Push::Written);
}

#[test]
fn entries_written_in_place_and_cancelled_ones_leave_no_trace() {
    let (mut p, mut c) = pair(RING_DATA_BYTES_MIN);
    assert_eq!(p.push_with(100, 0, 1, 2, |_| false).unwrap(), Push::Cancelled);
    let written = p.push_with(5, 0, 1, 2, |slot| {
        slot.copy_from_slice(b"hello");
        true
    });
    assert_eq!(written.unwrap(), Push::Written);
    p.publish();
    let mut out = vec![0u8; ENTRY_PAYLOAD_BYTES_MAX];
    let e = c.pop(&mut out).unwrap().unwrap();
    assert_eq!((&out[..e.len], e.src_path, e.dst_path), (&b"hello"[..], 1, 2));
    assert_eq!(c.pop(&mut out).unwrap(), None);
}

#[test]
fn the_sleep_flag_is_seen_by_exactly_one_publish() {
    let (mut p, c) = pair(RING_DATA_BYTES_MIN);
    assert!(!c.prepare_sleep(), "empty ring: go to sleep");
    p.push(b"x", 0, 0, 0).unwrap();
    assert!(p.publish(), "the producer sees the sleeper and rings");
    assert!(!p.publish(), "one doorbell per sleep");
    assert!(c.prepare_sleep(), "data already there: do not sleep");
    c.woke();
}

#[test]
fn closing_either_side_is_visible_to_the_other() {
    let (p, c) = pair(RING_DATA_BYTES_MIN);
    assert!(!p.consumer_closed());
    drop(c);
    assert!(p.consumer_closed());
    let (p, c) = pair(RING_DATA_BYTES_MIN);
    drop(p);
    assert!(c.producer_closed());
}

#[test]
fn attach_refuses_bad_names_sizes_nonces_and_headers() {
    let dir = crate::shm::test_dir();
    for bad in ["../etc/passwd", "accord-../../x", "notaccord-1", "accord-a/b", ""] {
        assert!(
            matches!(Consumer::attach(&dir, bad, RING_DATA_BYTES_MIN as u64, 1), Err(RingError::Refused(_))),
            "{bad}"
        );
    }
    let missing = Consumer::attach(&dir, "accord-does-not-exist", RING_DATA_BYTES_MIN as u64, 1);
    assert!(matches!(missing, Err(RingError::Io { .. })));
    // Wrong nonce, wrong size, sizes out of range.
    let n = name();
    let _p = Producer::create(&dir, &n, RING_DATA_BYTES_MIN, 5).unwrap();
    assert!(matches!(Consumer::attach(&dir, &n, RING_DATA_BYTES_MIN as u64, 6), Err(RingError::Refused(_))));
    let n = name();
    let _p = Producer::create(&dir, &n, RING_DATA_BYTES_MIN, 5).unwrap();
    assert!(matches!(Consumer::attach(&dir, &n, 2 * RING_DATA_BYTES_MIN as u64, 5), Err(RingError::Refused(_))));
    for size in [0u64, 1000, 1 << 40] {
        assert!(matches!(Consumer::attach(&dir, &n, size, 5), Err(RingError::Refused(_))));
    }
    // Header values changed after creation.
    let n = name();
    let p = Producer::create(&dir, &n, RING_DATA_BYTES_MIN, 5).unwrap();
    hostile::set_magic(&p, 0xdead);
    assert!(matches!(Consumer::attach(&dir, &n, RING_DATA_BYTES_MIN as u64, 5), Err(RingError::Refused(_))));
    let n = name();
    let p = Producer::create(&dir, &n, RING_DATA_BYTES_MIN, 5).unwrap();
    hostile::set_data_bytes(&p, 1 << 30);
    assert!(matches!(Consumer::attach(&dir, &n, RING_DATA_BYTES_MIN as u64, 5), Err(RingError::Refused(_))));
    let n = name();
    let p = Producer::create(&dir, &n, RING_DATA_BYTES_MIN, 5).unwrap();
    hostile::set_head(&p, 10 * RING_DATA_BYTES_MIN as u64);
    assert!(matches!(Consumer::attach(&dir, &n, RING_DATA_BYTES_MIN as u64, 5), Err(RingError::Refused(_))));
}

fn corrupt(setup: impl FnOnce(&mut Producer)) -> RingError {
    let (mut p, mut c) = pair(RING_DATA_BYTES_MIN);
    setup(&mut p);
    let mut out = vec![0u8; ENTRY_PAYLOAD_BYTES_MAX];
    let mut result = Ok(None);
    for _ in 0..4 {
        result = c.pop(&mut out);
        if result.is_err() {
            break;
        }
    }
    result.expect_err("a hostile ring must be reported")
}

#[test]
fn hostile_producers_are_reported_not_followed() {
    let cap = RING_DATA_BYTES_MIN as u64;
    // Head far beyond what the ring holds.
    assert!(matches!(corrupt(|p| hostile::set_head(p, cap + 16)), RingError::Corrupt(_)));
    // Head not covering a whole entry header.
    assert!(matches!(corrupt(|p| hostile::set_head(p, 8)), RingError::Corrupt(_)));
    // An entry longer than was published (truncated).
    assert!(matches!(
        corrupt(|p| {
            hostile::write_entry_header(p, 0, KIND_DATA, 1000);
            hostile::set_head(p, 64);
        }),
        RingError::Corrupt(_)
    ));
    // An entry running past the end of the area.
    assert!(matches!(
        corrupt(|p| {
            hostile::write_entry_header(p, 0, KIND_DATA, u32::MAX);
            hostile::set_head(p, cap);
        }),
        RingError::Corrupt(_)
    ));
    // A pad that does not reach the end.
    assert!(matches!(
        corrupt(|p| {
            hostile::write_entry_header(p, 0, KIND_PAD, 100);
            hostile::set_head(p, cap);
        }),
        RingError::Corrupt(_)
    ));
    // An unknown kind.
    assert!(matches!(
        corrupt(|p| {
            hostile::write_entry_header(p, 0, 99, 0);
            hostile::set_head(p, 16);
        }),
        RingError::Corrupt(_)
    ));
}

#[test]
fn a_consumer_writing_a_bad_tail_is_reported() {
    let (mut p, _c) = pair(RING_DATA_BYTES_MIN);
    let payload = vec![1u8; 60_000];
    while p.push(&payload, 0, 0, 0).unwrap() == Push::Written {}
    hostile::set_tail(&p, p.head + 4096);
    assert!(matches!(p.push(&payload, 0, 0, 0), Err(RingError::Corrupt(_))));
}

#[test]
fn attach_refuses_a_link_in_place_of_a_ring_file() {
    let dir = crate::shm::test_dir();
    let real = name();
    let _p = Producer::create(&dir, &real, RING_DATA_BYTES_MIN, 9).unwrap();
    let link = name();
    std::os::unix::fs::symlink(dir.join(&real), dir.join(&link)).unwrap();
    let err = Consumer::attach(&dir, &link, RING_DATA_BYTES_MIN as u64, 9).unwrap_err();
    assert!(matches!(err, RingError::Io { .. } | RingError::Refused(_)), "{err}");
    assert!(dir.join(&real).exists(), "the real ring file is untouched");
    let _ = std::fs::remove_file(dir.join(&link));
}
