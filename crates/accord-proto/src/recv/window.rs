//! The receive window over packet numbers.
//!
//! `base` is the lowest packet number not yet resolved: below it everything either arrived or
//! was given up by the sender (its `ack_floor` passed it). A refused packet is *not* marked as
//! received: it is reported in the ACK's rejection list instead, so the sender can never take
//! it for delivered, and it stays in the window until the sender's floor moves past it.

use crate::ids::Psn;
use crate::wire::{AckRepr, Rejection, Rejections, SackBitmap, SACK_BITMAP_BITS};
use std::collections::BTreeMap;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Slot {
    Missing,
    Received,
    Rejected,
}

/// Where a packet number falls relative to the window.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PsnClass {
    /// Below the window: resolved long ago, a duplicate.
    Below,
    /// Inside the window and not seen yet.
    New,
    /// Inside the window and already received: a duplicate.
    Received,
    /// Inside the window and refused earlier: report the refusal again.
    Rejected,
    /// At or past `base + size`: the sender overran the window it agreed to.
    Beyond,
}

/// Received/refused state of packet numbers `[base, base + size)`.
#[derive(Clone, Debug)]
pub struct ReceiveWindow {
    base: Psn,
    slots: Vec<Slot>,
    rejections: BTreeMap<Psn, Rejection>,
    received_in_window: usize,
}

impl ReceiveWindow {
    /// A window of `size` packets (at most `SACK_BITMAP_BITS`), starting at packet 0.
    pub fn new(size: u32) -> Self {
        let size = (size as usize).clamp(1, SACK_BITMAP_BITS);
        ReceiveWindow { base: 0, slots: vec![Slot::Missing; size], rejections: BTreeMap::new(), received_in_window: 0 }
    }

    pub fn base(&self) -> Psn {
        self.base
    }

    pub fn size(&self) -> usize {
        self.slots.len()
    }

    fn index(&self, psn: Psn) -> usize {
        (psn % self.slots.len() as u64) as usize
    }

    /// Classifies `psn` without changing anything.
    pub fn classify(&self, psn: Psn) -> PsnClass {
        if psn < self.base {
            return PsnClass::Below;
        }
        if psn - self.base >= self.slots.len() as u64 {
            return PsnClass::Beyond;
        }
        match self.slots[self.index(psn)] {
            Slot::Missing => PsnClass::New,
            Slot::Received => PsnClass::Received,
            Slot::Rejected => PsnClass::Rejected,
        }
    }

    /// The sender resolved everything below `floor`: slide the window up to it.
    pub fn advance_floor(&mut self, floor: Psn) {
        if floor <= self.base {
            return;
        }
        let span = (floor - self.base).min(self.slots.len() as u64);
        for offset in 0..span {
            let i = self.index(self.base + offset);
            if self.slots[i] == Slot::Received {
                self.received_in_window -= 1;
            }
            self.slots[i] = Slot::Missing;
        }
        self.base = floor;
        self.rejections = self.rejections.split_off(&floor);
        self.slide();
    }

    /// Records the arrival of a packet classified [`PsnClass::New`].
    pub fn mark_received(&mut self, psn: Psn) {
        debug_assert_eq!(self.classify(psn), PsnClass::New);
        let i = self.index(psn);
        self.slots[i] = Slot::Received;
        self.received_in_window += 1;
        self.slide();
    }

    /// Records the refusal of a packet classified [`PsnClass::New`].
    pub fn mark_rejected(&mut self, rejection: Rejection) {
        debug_assert_eq!(self.classify(rejection.psn), PsnClass::New);
        let i = self.index(rejection.psn);
        self.slots[i] = Slot::Rejected;
        self.rejections.insert(rejection.psn, rejection);
    }

    /// The refusal recorded for `psn`, if any.
    pub fn rejection(&self, psn: Psn) -> Option<Rejection> {
        self.rejections.get(&psn).copied()
    }

    /// Refusals the sender has not acknowledged by moving its floor past them.
    pub fn pending_rejections(&self) -> usize {
        self.rejections.len()
    }

    fn slide(&mut self) {
        while self.received_in_window > 0 {
            let i = self.index(self.base);
            if self.slots[i] != Slot::Received {
                break;
            }
            self.slots[i] = Slot::Missing;
            self.received_in_window -= 1;
            self.base += 1;
        }
    }

    /// Fills the cumulative point, the SACK bitmap and up to 16 rejections of an ACK,
    /// the rejection of `prefer` first (the packet that triggered the ACK).
    pub fn fill_ack(&self, ack: &mut AckRepr, prefer: Option<Psn>) {
        ack.cum_ack = self.base;
        let mut sack = SackBitmap::new();
        if self.received_in_window > 0 {
            // Walk the ring from base + 1 without a division per slot, and stop once every
            // received packet is reported (the scan was a sixth of a 256-host run).
            let limit = (self.slots.len() - 1).min(SACK_BITMAP_BITS);
            let len = self.slots.len();
            let mut i = self.index(self.base + 1);
            let mut left = self.received_in_window;
            for bit in 0..limit {
                if self.slots[i] == Slot::Received {
                    sack.set(bit);
                    left -= 1;
                    if left == 0 {
                        break;
                    }
                }
                i += 1;
                if i == len {
                    i = 0;
                }
            }
        }
        ack.sack = sack;
        let mut rejections = Rejections::default();
        if let Some(r) = prefer.and_then(|p| self.rejections.get(&p)) {
            rejections.push(*r);
        }
        for r in self.rejections.values() {
            if Some(r.psn) == prefer {
                continue;
            }
            if !rejections.push(*r) {
                break;
            }
        }
        ack.rejections = rejections;
    }
}
