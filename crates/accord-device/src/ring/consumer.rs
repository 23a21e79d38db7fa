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

    /// Asks the CPU to start loading the slots of the `ahead` tickets after the next one. A
    /// GPU's descriptor write evicts its line from the host's caches, so each slot read is a
    /// miss; overlapping the misses of the slots coming next is what lets one proxy thread take
    /// millions of descriptors a second. A hint only: it reads nothing.
    pub fn prefetch(&self, ahead: u64) {
        #[cfg(target_arch = "x86_64")]
        for t in self.next + 1..=self.next + ahead {
            // Safety: a prefetch never faults and does not read memory into any Rust value; the
            // pointer is in the ring's slots.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(self.ring.slot_ptr(t) as *const i8)
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = ahead;
    }

    /// Asks the CPU to start loading the one slot `distance` tickets after the next one: after
    /// [`RingConsumer::prefetch`] of `distance` at a turn's first descriptor, one of these a
    /// descriptor keeps the same window of slots in flight without asking again for the slots
    /// already asked for.
    pub fn prefetch_one(&self, distance: u64) {
        #[cfg(target_arch = "x86_64")]
        // Safety: as in `prefetch`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                self.ring.slot_ptr(self.next + distance) as *const i8,
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = distance;
    }

    /// Marks `ticket` (taken, not yet completed) complete; returns whether the watermark moved.
    /// A ticket outside `completed..next`, or completed twice, is ignored (returns false).
    pub fn complete(&mut self, ticket: u64) -> bool {
        let moved = self.complete_quietly(ticket);
        if moved {
            self.publish();
        }
        moved
    }

    /// Marks every ticket of `tickets` complete and publishes the watermark once (each
    /// publication is two stores into lines a GPU polls); whether it moved.
    pub fn complete_many(&mut self, tickets: impl IntoIterator<Item = u64>) -> bool {
        let mut moved = false;
        for t in tickets {
            moved |= self.complete_quietly(t);
        }
        if moved {
            self.publish();
        }
        moved
    }

    /// Publishes the watermark: `completed` first, so that when a producer sees a slot freed,
    /// `flush` already sees its work.
    fn publish(&self) {
        self.ring.completed().store(self.completed, Ordering::Release);
        self.ring.consumed().store(self.completed, Ordering::Release);
    }

    /// Marks `ticket` complete and advances the watermark here, without publishing it.
    fn complete_quietly(&mut self, ticket: u64) -> bool {
        if ticket < self.completed || ticket >= self.next {
            return false;
        }
        let bit = self.ring.slot_of(ticket);
        self.done[bit / 64] |= 1 << (bit % 64);
        let before = self.completed;
        while self.completed < self.next {
            let bit = self.ring.slot_of(self.completed);
            if self.done[bit / 64] & (1 << (bit % 64)) == 0 {
                break;
            }
            self.done[bit / 64] &= !(1 << (bit % 64));
            self.completed += 1;
        }
        self.completed != before
    }

    /// Records `ticket` as the ring's first error, if none is recorded yet.
    pub fn record_error(&mut self, ticket: u64) {
        let error = self.ring.error();
        if error.load(Ordering::Acquire) == 0 {
            error.store(ticket + 1, Ordering::Release);
        }
    }
}
