//! A proxy's stream-lane bookkeeping: the batch it gathers for each peer during a turn, the
//! batches queued on a peer's lane and not yet seen done (numbered so that a done word says
//! exactly which), and the little of each descriptor a ticket's completion needs.

use crate::lane::LaneItem;
use crate::layout::{Descriptor, Op, FLAG_COUNTER};
use std::collections::VecDeque;
use std::time::Instant;

/// Stream-lane batches of one peer queued and not yet seen completed.
#[derive(Default)]
pub(super) struct LanePending {
    /// The done value of the last batch queued. Batches are numbered 1, 2, ... in the order they
    /// are queued (per proxy and peer), so the done word only grows and a batch is done exactly
    /// when the word reaches its number. (Ticket-based done values went backwards when a later
    /// batch held an older ticket, the signal of a put the engine completed late, and completed
    /// that ticket before its signal was stored.)
    pub(super) queued_done: u64,
    /// Batches queued and not yet seen done: (done value, when queued, its tickets).
    pub(super) batches: VecDeque<LaneBatch>,
    /// When the proxy last saw this peer's lane make progress (or queued into an idle one).
    pub(super) since: Option<Instant>,
}

/// What a lane ticket's completion needs of its descriptor: the bytes it counts, the counter it
/// bumps, the peer an error names. A third of a descriptor's 64 bytes, so a 1,024-put batch's
/// tickets stay in a few pages.
#[derive(Copy, Clone, Debug, Default)]
pub(super) struct LaneTicket {
    pub(super) ticket: u64,
    /// Bytes put (0 for a signal alone).
    pub(super) bytes: u64,
    pub(super) peer: u32,
    /// The counter to bump once done, if any.
    pub(super) counter: Option<u32>,
}

impl LaneTicket {
    pub(super) fn of(ticket: u64, d: &Descriptor) -> LaneTicket {
        LaneTicket {
            ticket,
            bytes: if d.op == Op::Signal as u8 { 0 } else { d.bytes },
            peer: d.peer,
            counter: (d.flags & FLAG_COUNTER != 0).then_some(d.counter_id),
        }
    }
}

/// The lane batch being gathered for one peer: the items to queue and, in the same order, their
/// tickets (kept until the batch is done). `items` keeps its capacity from turn to turn.
#[derive(Default)]
pub(super) struct Gathered {
    pub(super) items: Vec<LaneItem>,
    pub(super) tickets: Vec<LaneTicket>,
}

impl Gathered {
    pub(super) fn push(&mut self, item: LaneItem, desc: &Descriptor) {
        self.tickets.push(LaneTicket::of(item.ticket, desc));
        self.items.push(item);
    }
}

/// Emptied ticket lists kept at most (one per batch in flight is plenty).
pub(super) const SPARE_TICKET_LISTS_MAX: usize = 64;

/// One queued lane batch: its done value, when it was queued, and its (ticket, descriptor)s.
pub(super) struct LaneBatch {
    pub(super) done: u64,
    pub(super) queued: Instant,
    pub(super) tickets: Vec<LaneTicket>,
}

impl LanePending {
    /// The done value the next batch queued gets.
    pub(super) fn next_done(&self) -> u64 {
        self.queued_done + 1
    }

    /// Records a batch queued with done value `done` (from [`LanePending::next_done`]).
    pub(super) fn queued(&mut self, done: u64, now: Instant, tickets: Vec<LaneTicket>) {
        if self.batches.is_empty() {
            self.since = Some(now);
        }
        self.batches.push_back(LaneBatch { done, queued: now, tickets });
        self.queued_done = done;
    }

    /// The batches the done word `seen` says are done, oldest first, taken off the queue.
    pub(super) fn take_done(&mut self, seen: u64) -> Vec<LaneBatch> {
        let mut done = Vec::new();
        while self.batches.front().is_some_and(|b| b.done <= seen) {
            done.extend(self.batches.pop_front());
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tickets(list: &[u64]) -> Vec<LaneTicket> {
        list.iter().map(|&t| LaneTicket::of(t, &Descriptor::default())).collect()
    }

    #[test]
    fn a_batch_is_done_by_its_number_not_by_its_tickets() {
        // Batch 1 holds tickets 10 and 11; batch 2 only ticket 5, the signal of a put the engine
        // completed late. Done words are batch numbers, so batch 1's word does not complete 5.
        let mut p = LanePending::default();
        let now = Instant::now();
        let first = p.next_done();
        p.queued(first, now, tickets(&[10, 11]));
        let second = p.next_done();
        p.queued(second, now, tickets(&[5]));
        assert_eq!((first, second), (1, 2));
        let done: Vec<u64> = p.take_done(1).into_iter().flat_map(|b| b.tickets).map(|t| t.ticket).collect();
        assert_eq!(done, vec![10, 11]);
        assert!(p.take_done(1).is_empty(), "nothing more at the same word");
        let done: Vec<u64> = p.take_done(2).into_iter().flat_map(|b| b.tickets).map(|t| t.ticket).collect();
        assert_eq!(done, vec![5]);
        assert!(p.batches.is_empty() && p.next_done() == 3);
    }

    #[test]
    fn a_lane_ticket_keeps_what_its_completion_counts() {
        let put = Descriptor {
            op: Op::Put as u8,
            peer: 3,
            bytes: 4096,
            flags: FLAG_COUNTER,
            counter_id: 7,
            ..Descriptor::default()
        };
        let t = LaneTicket::of(42, &put);
        assert_eq!((t.ticket, t.bytes, t.peer, t.counter), (42, 4096, 3, Some(7)));
        let signal = Descriptor { op: Op::Signal as u8, peer: 1, bytes: 99, ..Descriptor::default() };
        let t = LaneTicket::of(43, &signal);
        assert_eq!((t.bytes, t.peer, t.counter), (0, 1, None), "a signal alone counts no bytes");
    }
}
