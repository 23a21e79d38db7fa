use super::*;
use crate::error::ProducerError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ring(slots: u32) -> Arc<Ring> {
    Arc::new(Ring::new(0, slots, &Placement::Host).unwrap())
}

fn producer(ring: &Arc<Ring>, timeout: Duration) -> (HostProducer, Arc<AtomicU64>) {
    let full = Arc::new(AtomicU64::new(0));
    (HostProducer::new(ring.clone(), timeout, full.clone()).unwrap(), full)
}

/// A descriptor that says who produced it and its index there.
fn tagged(producer: u32, index: u64) -> Descriptor {
    Descriptor { op: 1, peer: producer, dst_offset: index, bytes: 0xabcd_0000 + index, ..Descriptor::default() }
}

/// Takes the next descriptor, polling a bounded number of times.
fn take(consumer: &mut RingConsumer) -> (u64, Descriptor) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(got) = consumer.poll() {
            return got;
        }
        assert!(Instant::now() < deadline, "ticket {} never published", consumer.next_ticket());
        std::thread::yield_now();
    }
}

#[test]
fn bad_slot_counts_are_refused() {
    for slots in [0, 3, 12, RING_SLOTS_MAX * 2] {
        assert!(matches!(Ring::new(0, slots, &Placement::Host), Err(DeviceError::Config { .. })), "{slots}");
    }
}

#[test]
fn device_view_points_into_the_ring_memory() {
    let r = ring(8);
    let d = r.device();
    assert_eq!(d.slot_count, 8);
    assert_eq!(d.control, d.slots + 8 * 64);
    assert_eq!(d.control, r.consumed() as *const AtomicU64 as u64);
    assert_eq!(d.control + 64, r.completed() as *const AtomicU64 as u64);
    assert_eq!(d.control + 128, r.error() as *const AtomicU64 as u64);
    let (reserved, cached) = r.producer_words().unwrap();
    assert_eq!(d.reserved, reserved as *const AtomicU64 as u64);
    assert_eq!(d.cached_consumed, cached as *const AtomicU64 as u64);
    assert_eq!(d.cached_consumed - d.reserved, 64, "each producer word on its own line");
}

#[test]
fn single_producer_descriptors_arrive_in_ticket_order_with_every_field() {
    let r = ring(8);
    let (p, _) = producer(&r, Duration::from_secs(20));
    let mut c = RingConsumer::new(r.clone());
    for i in 0..100u64 {
        let d = Descriptor { signal_value: i * 3, counter_id: 7, signal_id: 2, ..tagged(5, i) };
        assert_eq!(p.push(&d).unwrap(), i);
        let (ticket, got) = take(&mut c);
        assert_eq!(ticket, i);
        assert_eq!(got, Descriptor { seq: i + 1, ..d });
        assert!(c.complete(ticket));
        assert_eq!(r.completed().load(Ordering::Acquire), i + 1);
        assert_eq!(r.consumed().load(Ordering::Acquire), i + 1);
    }
}

#[test]
fn four_producers_into_eight_slots_lose_nothing_and_duplicate_nothing() {
    const PER_PRODUCER: u64 = 10_000;
    let r = ring(8);
    let (p, full) = producer(&r, Duration::from_secs(60));
    let seen = std::thread::scope(|s| {
        for who in 0..4u32 {
            let p = p.clone();
            s.spawn(move || {
                for i in 0..PER_PRODUCER {
                    p.push(&tagged(who, i)).unwrap();
                }
            });
        }
        let mut c = RingConsumer::new(r.clone());
        let mut next_index = [0u64; 4];
        let mut held = Vec::new();
        for expect in 0..4 * PER_PRODUCER {
            let (ticket, d) = take(&mut c);
            assert_eq!(ticket, expect, "tickets are taken in order");
            assert_eq!(d.seq, ticket + 1);
            // Each producer's own descriptors keep its order; none is lost or repeated.
            assert_eq!(d.dst_offset, next_index[d.peer as usize], "producer {}", d.peer);
            assert_eq!(d.bytes, 0xabcd_0000 + d.dst_offset);
            next_index[d.peer as usize] += 1;
            // Complete out of order: hold every third ticket until the next one.
            if ticket % 3 == 0 {
                held.push(ticket);
            } else {
                c.complete(ticket);
                for t in held.drain(..) {
                    c.complete(t);
                }
            }
        }
        for t in held.drain(..) {
            c.complete(t);
        }
        assert_eq!(c.in_flight(), 0);
        next_index
    });
    assert_eq!(seen, [PER_PRODUCER; 4]);
    assert_eq!(r.completed().load(Ordering::Acquire), 4 * PER_PRODUCER);
    // 40k descriptors through 8 slots: producers must have found the ring full at least once
    // (at most 8 pushes succeed before the first slot is freed).
    assert!(full.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_full_ring_blocks_the_producer_until_the_watermark_frees_a_slot() {
    let r = ring(8);
    let (p, full) = producer(&r, Duration::from_secs(20));
    for i in 0..8 {
        p.push(&tagged(0, i)).unwrap();
    }
    let mut c = RingConsumer::new(r.clone());
    std::thread::scope(|s| {
        let blocked = s.spawn(|| p.push(&tagged(0, 8)));
        let taken: Vec<u64> = (0..8).map(|_| take(&mut c).0).collect();
        assert_eq!(taken, (0..8).collect::<Vec<_>>());
        // Taking does not free: the ninth ticket cannot be written until ticket 0 completes.
        for _ in 0..1000 {
            assert!(c.poll().is_none(), "slot 0 was overwritten before its work completed");
        }
        assert!(!c.complete(3), "an out-of-order completion does not move the watermark");
        assert_eq!(r.consumed().load(Ordering::Acquire), 0);
        assert!(c.poll().is_none());
        assert!(c.complete(0));
        assert_eq!(r.consumed().load(Ordering::Acquire), 1);
        let (ticket, d) = take(&mut c);
        assert_eq!((ticket, d.dst_offset), (8, 8));
        assert_eq!(blocked.join().unwrap(), Ok(8));
    });
    assert_eq!(full.load(Ordering::Relaxed), 1);
    // Completing 1, 2 (3 already done) moves the watermark to 4 at once.
    c.complete(2);
    c.complete(1);
    assert_eq!(r.completed().load(Ordering::Acquire), 4);
}

#[test]
fn a_ring_that_stays_full_gives_a_producer_error_naming_the_ring_and_ticket() {
    let r = ring(8);
    let (p, _) = producer(&r, Duration::from_millis(20));
    for i in 0..8 {
        p.push(&tagged(0, i)).unwrap();
    }
    match p.push(&tagged(0, 8)) {
        Err(ProducerError::RingFull { ring: 0, ticket: 8, consumed: 0, slot_count: 8, .. }) => {}
        other => panic!("expected RingFull, got {other:?}"),
    }
}

#[test]
fn a_slot_whose_seq_is_not_written_is_not_taken() {
    let r = ring(8);
    let mut c = RingConsumer::new(r.clone());
    assert!(c.poll().is_none(), "an empty ring has nothing");
    // A stale seq from another lap, or a future one, is not this ticket's.
    for wrong in [9u64, 2, u64::MAX] {
        r.seq(0).store(wrong, Ordering::Release);
        assert!(c.poll().is_none(), "seq {wrong} taken for ticket 0");
    }
    r.seq(0).store(1, Ordering::Release);
    assert_eq!(c.poll().map(|(t, _)| t), Some(0));
    assert!(c.poll().is_none());
}

#[test]
fn completions_outside_the_taken_range_are_ignored_and_errors_keep_the_first() {
    let r = ring(8);
    let (p, _) = producer(&r, Duration::from_secs(20));
    let mut c = RingConsumer::new(r.clone());
    p.push(&tagged(0, 0)).unwrap();
    assert!(!c.complete(0), "not taken yet");
    take(&mut c);
    assert!(c.complete(0));
    assert!(!c.complete(0), "twice");
    assert!(!c.complete(100));
    c.record_error(5);
    c.record_error(2);
    assert_eq!(r.error().load(Ordering::Acquire), 6);
}
