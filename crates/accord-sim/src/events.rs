//! The event queue: events in order of (time, insertion). Insertion order breaks ties, which
//! is what makes a run repeatable.
//!
//! Most events of a fabric run are due within a few microseconds of now (a packet's arrival
//! at the next hop) and a 1024-host run has ~80 of them per nanosecond, so the near future is a
//! timing wheel of one-nanosecond buckets, each a FIFO: popping walks the buckets in time order
//! and within a bucket in insertion order, which is exactly (time, insertion) order with no
//! comparisons. Events beyond the wheel's span (timers) or before its cursor go to a 4-ary heap
//! keyed by `time << 64 | sequence`. An overflow event due at the same nanosecond as a wheel
//! event was inserted before it (it was too far ahead when pushed, the wheel event was not), so
//! at equal times the heap goes first. Profiled at 1024 hosts, the heap alone was 12-17% of a
//! run.

use accord_proto::Instant;

/// Children per heap node.
const ARITY: usize = 4;

/// Nanoseconds (buckets) the wheel covers by default: a packet's hop (1 us of propagation plus
/// a full 100-packet switch queue at 400 Gbit/s, ~9 us) fits.
pub const WHEEL_SPAN_NS: u64 = 1 << 14;

/// End of a bucket's list.
const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Entry<E> {
    /// `time_ns << 64 | sequence`: ordering by key is ordering by (time, sequence).
    key: u128,
    event: E,
}

/// The overflow: a 4-ary implicit min-heap on `key`.
#[derive(Debug)]
struct Heap<E> {
    heap: Vec<Entry<E>>,
}

impl<E> Heap<E> {
    fn push(&mut self, key: u128, event: E) {
        self.heap.push(Entry { key, event });
        self.sift_up(self.heap.len() - 1);
    }

    fn pop(&mut self) -> Option<Entry<E>> {
        let last = self.heap.pop()?;
        if self.heap.is_empty() {
            return Some(last);
        }
        let top = core::mem::replace(&mut self.heap[0], last);
        self.sift_down(0);
        Some(top)
    }

    fn min_time(&self) -> Option<u64> {
        self.heap.first().map(|e| (e.key >> 64) as u64)
    }

    fn sift_up(&mut self, mut i: usize) {
        let key = self.heap[i].key;
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if self.heap[parent].key <= key {
                break;
            }
            self.heap.swap(i, parent);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        let key = self.heap[i].key;
        loop {
            let first = i * ARITY + 1;
            if first >= n {
                break;
            }
            let mut best = first;
            let mut best_key = self.heap[first].key;
            for c in first + 1..(first + ARITY).min(n) {
                let k = self.heap[c].key;
                if k < best_key {
                    best = c;
                    best_key = k;
                }
            }
            if key <= best_key {
                break;
            }
            self.heap.swap(i, best);
            i = best;
        }
    }
}

/// A wheel event: its slot in the slab and the next one in its bucket.
#[derive(Debug)]
struct Slot<E> {
    event: Option<E>,
    next: u32,
}

/// Pending events, earliest first.
#[derive(Debug)]
pub struct EventQueue<E> {
    /// Bucket `t & mask` holds the events due at `t` for `t` in `[cursor, cursor + span)`, as
    /// `[head, tail]` of a list through `slots`.
    buckets: Vec<[u32; 2]>,
    /// One bit per non-empty bucket.
    occupied: Vec<u64>,
    mask: u64,
    slots: Vec<Slot<E>>,
    free: Vec<u32>,
    wheel_len: usize,
    /// Time (ns) of the last event popped: nothing earlier is on the wheel.
    cursor: u64,
    overflow: Heap<E>,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::with_span(WHEEL_SPAN_NS)
    }
}

impl<E> EventQueue<E> {
    /// A queue whose wheel covers `span_ns` nanoseconds (rounded up to a power of two, at
    /// least 64); the span changes speed only, never the order.
    pub fn with_span(span_ns: u64) -> Self {
        let span = span_ns.max(64).next_power_of_two();
        EventQueue {
            buckets: vec![[NIL; 2]; span as usize],
            occupied: vec![0; (span / 64) as usize],
            mask: span - 1,
            slots: Vec::new(),
            free: Vec::new(),
            wheel_len: 0,
            cursor: 0,
            overflow: Heap { heap: Vec::new() },
            next_seq: 0,
        }
    }

    pub fn push(&mut self, at: Instant, event: E) {
        let t = at.as_nanos();
        let seq = self.next_seq;
        self.next_seq += 1;
        if t < self.cursor || t - self.cursor > self.mask {
            self.overflow.push((t as u128) << 64 | seq as u128, event);
            return;
        }
        let slot = Slot { event: Some(event), next: NIL };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        let b = (t & self.mask) as usize;
        let [head, tail] = self.buckets[b];
        if head == NIL {
            self.buckets[b] = [id, id];
            self.occupied[b / 64] |= 1 << (b % 64);
        } else {
            self.slots[tail as usize].next = id;
            self.buckets[b][1] = id;
        }
        self.wheel_len += 1;
    }

    /// The earliest non-empty bucket at or after the cursor and its time.
    fn wheel_min(&self) -> Option<(usize, u64)> {
        if self.wheel_len == 0 {
            return None;
        }
        let start = (self.cursor & self.mask) as usize;
        let words = self.occupied.len();
        let mut w = start / 64;
        let mut bits = self.occupied[w] & (u64::MAX << (start % 64));
        // At most one lap, plus the low bits of the first word.
        for _ in 0..=words {
            if bits != 0 {
                let b = w * 64 + bits.trailing_zeros() as usize;
                let ahead = (b as u64).wrapping_sub(start as u64) & self.mask;
                return Some((b, self.cursor + ahead));
            }
            w = (w + 1) % words;
            bits = self.occupied[w];
        }
        unreachable!("wheel_len > 0 but no bucket is occupied")
    }

    pub fn pop(&mut self) -> Option<(Instant, E)> {
        let wheel = self.wheel_min();
        let overflow_first = match (self.overflow.min_time(), wheel) {
            (None, None) => return None,
            (Some(o), Some((_, w))) => o <= w,
            (o, _) => o.is_some(),
        };
        if overflow_first {
            let top = self.overflow.pop()?;
            let t = (top.key >> 64) as u64;
            self.cursor = self.cursor.max(t);
            return Some((Instant::from_nanos(t), top.event));
        }
        let (b, t) = wheel?;
        let id = self.buckets[b][0];
        let slot = &mut self.slots[id as usize];
        let event = slot.event.take().expect("a listed slot holds an event");
        let next = slot.next;
        if next == NIL {
            self.buckets[b] = [NIL; 2];
            self.occupied[b / 64] &= !(1 << (b % 64));
        } else {
            self.buckets[b][0] = next;
        }
        self.free.push(id);
        self.wheel_len -= 1;
        self.cursor = t;
        Some((Instant::from_nanos(t), event))
    }

    /// The event `pop` would return next (without taking it).
    pub fn peek(&self) -> Option<&E> {
        let wheel = self.wheel_min();
        match (self.overflow.heap.first(), wheel) {
            (Some(o), Some((_, w))) if (o.key >> 64) as u64 <= w => Some(&o.event),
            (Some(o), None) => Some(&o.event),
            (_, Some((b, _))) => self.slots[self.buckets[b][0] as usize].event.as_ref(),
            (None, None) => None,
        }
    }

    /// Time of the earliest pending event.
    pub fn peek_time(&self) -> Option<Instant> {
        let t = match (self.overflow.min_time(), self.wheel_min()) {
            (Some(o), Some((_, w))) => o.min(w),
            (o, w) => o.or(w.map(|(_, w)| w))?,
        };
        Some(Instant::from_nanos(t))
    }

    pub fn len(&self) -> usize {
        self.wheel_len + self.overflow.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Events processed so far plus those pending (a run's size).
    pub fn pushed(&self) -> u64 {
        self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_time_then_insertion() {
        let mut q = EventQueue::default();
        q.push(Instant::from_nanos(5), "b");
        q.push(Instant::from_nanos(1), "a");
        q.push(Instant::from_nanos(5), "c");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(order, vec!["a", "b", "c"]);
    }

    /// Against a sorted reference over many random pushes and interleaved pops.
    #[test]
    fn matches_a_sorted_reference() {
        let mut q = EventQueue::default();
        let mut reference: Vec<(u64, u64)> = Vec::new();
        let mut state = 7u64;
        let mut popped = Vec::new();
        let mut expected = Vec::new();
        for seq in 0..5000u64 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let at = (state >> 40) % 300;
            q.push(Instant::from_nanos(at), seq);
            reference.push((at, seq));
            if (state >> 7) & 3 == 0 {
                reference.sort_unstable();
                expected.push(reference.remove(0));
                popped.push(q.pop().map(|(t, e)| (t.as_nanos(), e)).unwrap());
            }
        }
        reference.sort_unstable();
        expected.extend(reference);
        popped.extend(std::iter::from_fn(|| q.pop()).map(|(t, e)| (t.as_nanos(), e)));
        assert_eq!(popped, expected);
    }

    /// A 64-ns wheel under pushes near now, far ahead (the overflow), at now, and in the past,
    /// interleaved with pops: the order is (time, insertion) throughout, and peek agrees.
    #[test]
    fn wheel_and_overflow_match_a_sorted_reference() {
        for seed in 1..40u64 {
            let mut q = EventQueue::with_span(64);
            let mut reference: Vec<(u64, u64)> = Vec::new();
            let mut state = seed;
            let mut now = 0u64;
            for seq in 0..3000u64 {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let r = state >> 33;
                let at = match r % 8 {
                    0 => now + 64 + r % 500,        // beyond the wheel
                    1 => now.saturating_sub(r % 5), // in the past or now
                    2 => now,
                    _ => now + r % 70, // near, some just past the span
                };
                q.push(Instant::from_nanos(at), seq);
                reference.push((at, seq));
                if (state >> 7) % 3 != 0 {
                    reference.sort_unstable();
                    let expected = reference.remove(0);
                    assert_eq!(q.peek_time().map(|t| t.as_nanos()), Some(expected.0), "seed {seed}");
                    let got = q.pop().map(|(t, e)| (t.as_nanos(), e)).unwrap();
                    assert_eq!(got, expected, "seed {seed}");
                    now = now.max(got.0);
                }
                assert_eq!(q.len(), reference.len());
            }
            reference.sort_unstable();
            let rest: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(t, e)| (t.as_nanos(), e)).collect();
            assert_eq!(rest, reference, "seed {seed}");
            assert!(q.is_empty() && q.peek_time().is_none());
        }
    }
}
