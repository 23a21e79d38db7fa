//! The recorder's parts that need no global switch: the trace's cap and the slots' claims.

use super::*;

fn event(ts: u64) -> TransferEvent {
    TransferEvent { ts, dur: 1, tid: 1, ok: true }
}

fn empty_trace(kept: usize) -> Trace {
    Trace { path: None, formatted: vec![], transfers: vec![], loose: vec![], kept, dropped: 0 }
}

fn chunk_of(events: impl IntoIterator<Item = TransferEvent>) -> Arc<Chunk> {
    let chunk = Chunk::new();
    for e in events {
        assert!(chunk.push(e));
    }
    chunk
}

#[test]
fn the_trace_keeps_at_most_its_cap_and_counts_the_rest() {
    let mut t = empty_trace(TRACE_EVENTS_MAX - 3);
    t.take(&chunk_of((0..5).map(event)), 0, 5);
    assert_eq!((t.kept, t.dropped), (TRACE_EVENTS_MAX, 2));
    assert_eq!(t.transfer_events().map(|e| e.ts).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(t.admit(1), 0);
    assert_eq!(t.dropped, 3);
}

#[test]
fn a_chunk_gives_back_each_event_whole_and_refuses_past_its_size() {
    let chunk = Chunk::new();
    let odd = TransferEvent { ts: u64::MAX >> 1, dur: !OK_BIT, tid: 77, ok: false };
    assert!(chunk.push(odd));
    assert!(chunk.push(TransferEvent { ts: 5, dur: 0, tid: 1, ok: true }));
    let back = (chunk.event(0), chunk.event(1));
    assert_eq!((back.0.ts, back.0.dur, back.0.tid, back.0.ok), (odd.ts, odd.dur, 77, false));
    assert_eq!((back.1.ts, back.1.dur, back.1.tid, back.1.ok), (5, 0, 1, true));
    for i in 2..TRACE_CHUNK_EVENTS {
        assert!(chunk.push(event(i as u64)));
    }
    assert!(!chunk.push(event(0)), "full");
    assert_eq!(chunk.written(), TRACE_CHUNK_EVENTS);
}

/// What the trace's writer does while a thread records: hand over what is written so far,
/// again and again. The recording thread never waits for it, and every event reaches the
/// trace exactly once, in order, whole.
#[test]
fn events_handed_over_while_their_thread_writes_arrive_once_each() {
    let slot: &'static Slot = Box::leak(Box::new(Slot::empty()));
    let total = TRACE_CHUNK_EVENTS * 3 + 17;
    let trace = std::sync::Arc::new(Mutex::new(empty_trace(0)));
    let writer = {
        let trace = trace.clone();
        std::thread::spawn(move || {
            let mut chunk = slot.current();
            for i in 0..total {
                let e = TransferEvent { ts: i as u64, dur: i as u64 * 3, tid: 9, ok: i % 5 != 0 };
                if !chunk.push(e) {
                    chunk = Chunk::new();
                    slot.replace_full(&mut trace.lock().unwrap(), chunk.clone());
                    assert!(chunk.push(e));
                }
            }
        })
    };
    let mut rounds = 0;
    loop {
        let done = writer.is_finished();
        slot.hand_over(&mut trace.lock().unwrap());
        rounds += 1;
        if done {
            break;
        }
    }
    writer.join().unwrap();
    let t = trace.lock().unwrap();
    let mut seen: Vec<TransferEvent> = t.transfer_events().collect();
    seen.sort_by_key(|e| e.ts);
    assert_eq!(seen.len(), total, "each event once ({rounds} hand-overs)");
    for (i, e) in seen.iter().enumerate() {
        assert_eq!((e.ts, e.dur, e.tid, e.ok), (i as u64, i as u64 * 3, 9, i % 5 != 0), "event {i} whole");
    }
}

#[test]
fn threads_alive_at_once_own_different_slots_and_give_them_back() {
    let slot_address = |s: &'static Slot| s as *const Slot as usize;
    let (tx, rx) = std::sync::mpsc::channel();
    let release = std::sync::Arc::new(std::sync::Barrier::new(5));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (tx, release) = (tx.clone(), release.clone());
            std::thread::spawn(move || {
                tx.send(with_slot(|s, tid| (slot_address(s), tid))).unwrap();
                release.wait();
            })
        })
        .collect();
    let claims: Vec<(usize, u64)> = (0..4).map(|_| rx.recv().unwrap()).collect();
    let mut slots: Vec<usize> = claims.iter().map(|c| c.0).collect();
    let mut tids: Vec<u64> = claims.iter().map(|c| c.1).collect();
    slots.sort_unstable();
    slots.dedup();
    tids.sort_unstable();
    tids.dedup();
    assert_eq!((slots.len(), tids.len()), (4, 4), "four live threads, four slots and trace ids");
    assert!(!slots.contains(&slot_address(&SHARED_SLOT)));
    release.wait();
    for t in threads {
        t.join().unwrap();
    }
    let registry = SLOTS.lock().unwrap();
    for slot in registry.iter().filter(|s| slots.contains(&slot_address(s))) {
        assert!(!slot.owned.load(Ordering::Acquire), "an ended thread's slot is free again");
    }
}

#[test]
fn a_slot_hands_over_its_events_and_drops() {
    let slot = Slot::empty();
    let chunk = slot.current();
    for e in (0..7).map(event) {
        assert!(chunk.push(e));
    }
    slot.dropped.store(4, Ordering::Relaxed);
    let mut t = empty_trace(0);
    slot.hand_over(&mut t);
    assert_eq!((t.kept, t.dropped), (7, 4));
    slot.hand_over(&mut t);
    assert_eq!((t.kept, t.dropped, t.transfers.len()), (7, 4, 1), "nothing twice");
    assert!(chunk.push(event(7)));
    slot.hand_over(&mut t);
    assert_eq!(t.transfer_events().map(|e| e.ts).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>(), "then the rest");
}

#[test]
fn the_integer_buckets_are_the_seconds_buckets() {
    for (ns, s) in LATENCY_BUCKETS_NS.iter().zip(LATENCY_BUCKETS_S) {
        assert_eq!(*ns, (s * 1e9).round() as u64);
    }
    let h = AtomicHistogram::zero();
    for nanos in [0, 10_000, 10_001, 3_000_000_000, 3_000_000_001] {
        h.add(nanos, true);
    }
    let mut sum = Histogram::default();
    h.add_into(&mut sum);
    assert_eq!(sum.count, 5);
    assert_eq!((sum.buckets[0], sum.buckets[1], sum.buckets[11]), (2, 1, 1), "{:?}", sum.buckets);
    assert_eq!(sum.buckets.iter().sum::<u64>(), 4, "past the last bound: only in +Inf");
}
