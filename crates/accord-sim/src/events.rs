//! The event queue: a min-heap on (time, sequence). The sequence breaks ties in insertion
//! order, which is what makes a run repeatable.

use accord_proto::Instant;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Pending events, earliest first.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<(Instant, u64, Slot<E>)>>,
    next_seq: u64,
}

/// Wrapper that keeps `E` out of the ordering.
#[derive(Debug)]
struct Slot<E>(E);

impl<E> PartialEq for Slot<E> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<E> Eq for Slot<E> {}
impl<E> PartialOrd for Slot<E> {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Slot<E> {
    fn cmp(&self, _: &Self) -> core::cmp::Ordering {
        core::cmp::Ordering::Equal
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue { heap: BinaryHeap::new(), next_seq: 0 }
    }
}

impl<E> EventQueue<E> {
    pub fn push(&mut self, at: Instant, event: E) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Reverse((at, seq, Slot(event))));
    }

    pub fn pop(&mut self) -> Option<(Instant, E)> {
        self.heap.pop().map(|Reverse((at, _, Slot(e)))| (at, e))
    }

    /// Time of the earliest pending event.
    pub fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
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
}
