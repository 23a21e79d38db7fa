//! The ring's one consumer: takes descriptors in ticket order, tracks out-of-order
//! completions, and publishes the watermarks with plain release stores.
#![allow(unsafe_code)]

use super::Ring;
use crate::layout::Descriptor;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The consumer side of a [`Ring`]; exactly one per ring (the proxy thread owns it).
#[derive(Debug)]
pub struct RingConsumer {
    ring: Arc<Ring>,
    /// The next ticket to take.
    next: u64,
    /// Every ticket below this is complete (the value last published).
    completed: u64,
    /// Bit `t % slot_count` set when ticket `t` (in `completed..next`) completed out of order.
    done: Vec<u64>,
}

impl RingConsumer {
    /// The consumer of `ring`, which must be fresh (nothing taken yet).
    pub fn new(ring: Arc<Ring>) -> RingConsumer {
        let words = (ring.slot_count() as usize).div_ceil(64);
        RingConsumer { ring, next: 0, completed: 0, done: vec![0; words] }
    }

    /// The ring.
    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    /// The next ticket [`RingConsumer::poll`] would take.
    pub fn next_ticket(&self) -> u64 {
        self.next
    }

    /// Tickets taken but not yet completed.
    pub fn in_flight(&self) -> u64 {
        self.next - self.completed
    }

    /// Takes the next descriptor if its producer finished writing it: `(ticket, copy)`.
    pub fn poll(&mut self) -> Option<(u64, Descriptor)> {
        let ticket = self.next;
        if self.ring.seq(ticket).load(Ordering::Acquire) != ticket.wrapping_add(1) {
            return None;
        }
        // Safety: the slot is in bounds and the acquire load above saw its producer's release
        // store of `seq`, so every field is written; no producer writes this slot again until
        // `consumed` passes `ticket`, which only this consumer publishes, after the copy.
        let desc = unsafe { std::ptr::read_volatile(self.ring.slot_ptr(ticket)) };
        self.next += 1;
        Some((ticket, desc))
    }

    /// Marks `ticket` (taken, not yet completed) complete; returns whether the watermark moved.
    /// A ticket outside `completed..next`, or completed twice, is ignored (returns false).
    pub fn complete(&mut self, ticket: u64) -> bool {
        if ticket < self.completed || ticket >= self.next {
            return false;
        }
        let n = u64::from(self.ring.slot_count());
        let bit = (ticket % n) as usize;
        self.done[bit / 64] |= 1 << (bit % 64);
        let before = self.completed;
        while self.completed < self.next {
            let bit = (self.completed % n) as usize;
            if self.done[bit / 64] & (1 << (bit % 64)) == 0 {
                break;
            }
            self.done[bit / 64] &= !(1 << (bit % 64));
            self.completed += 1;
        }
        if self.completed == before {
            return false;
        }
        // `completed` first: when a producer sees a slot freed, `flush` already sees its work.
        self.ring.completed().store(self.completed, Ordering::Release);
        self.ring.consumed().store(self.completed, Ordering::Release);
        true
    }

    /// Records `ticket` as the ring's first error, if none is recorded yet.
    pub fn record_error(&mut self, ticket: u64) {
        let error = self.ring.error();
        if error.load(Ordering::Acquire) == 0 {
            error.store(ticket + 1, Ordering::Release);
        }
    }
}
