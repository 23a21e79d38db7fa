//! The recorder's parts that need no global switch: the trace's cap and the slots' claims.

use super::*;

fn event(ts: u64) -> TransferEvent {
    TransferEvent { ts, dur: 1, tid: 1, ok: true }
}

#[test]
fn the_trace_keeps_at_most_its_cap_and_counts_the_rest() {
    let mut t = Trace { path: None, formatted: vec![], transfers: vec![], kept: TRACE_EVENTS_MAX - 3, dropped: 0 };
    t.take_transfers((0..5).map(event).collect());
    assert_eq!((t.kept, t.dropped), (TRACE_EVENTS_MAX, 2));
    assert_eq!(t.transfers.iter().flatten().map(|e| e.ts).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(t.admit(1), 0);
    assert_eq!(t.dropped, 3);
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
    slot.events.lock().unwrap().extend((0..7).map(event));
    slot.dropped.store(4, Ordering::Relaxed);
    let mut t = Trace { path: None, formatted: vec![], transfers: vec![], kept: 0, dropped: 0 };
    slot.hand_over(&mut t);
    assert_eq!((t.kept, t.dropped), (7, 4));
    assert!(slot.events.lock().unwrap().is_empty());
    slot.hand_over(&mut t);
    assert_eq!((t.kept, t.dropped, t.transfers.len()), (7, 4, 1), "nothing twice");
}
