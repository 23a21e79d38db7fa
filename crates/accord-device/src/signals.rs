//! Signals: the slots peers write into, and the running values this rank's proxies own.
//!
//! Rank `r`'s contribution to signal `s` at rank `p` lives in slot `[s][r]` of `p`'s incoming
//! slots and is written only by `r`'s proxies, with `r`'s running value: `Add` adds to it, `Set`
//! sets it. So a receiver sums its slots to read a signal, no remote atomic is needed, and a
//! write resent by the transport is harmless.
//!
//! At most one write per (peer, signal) is in flight. A newer value while one is in flight is
//! remembered and written when the earlier completes (coalescing), so the receiver's slot never
//! goes back to an older value and the latest value always lands. The source of each write is
//! this rank's cell for (peer, signal) in a registered buffer, which is not modified while its
//! write is in flight. The board is shared by every ring's proxy: they all write the same slots.

use crate::layout::SignalOp;
use std::sync::Mutex;

/// Most signals per rank (the barrier's included).
pub const SIGNALS_MAX: u32 = 1 << 16;

#[derive(Copy, Clone, Debug, Default)]
struct Entry {
    /// This rank's running contribution.
    value: u64,
    /// A write of it is in flight.
    in_flight: bool,
    /// The value changed since the write in flight was issued.
    dirty: bool,
}

/// The running values and in-flight state of every (peer, signal) this rank writes.
#[derive(Debug)]
pub(crate) struct SignalBoard {
    signal_count: u32,
    entries: Mutex<Vec<Entry>>,
}

/// What the caller must do after a change to the board.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Write this value now (the caller owns the cell and the in-flight write).
    Write(u64),
    /// A write is in flight; the new value will follow it (coalesced).
    Coalesced,
    /// Nothing to write.
    Idle,
}

impl SignalBoard {
    pub(crate) fn new(world: u32, signal_count: u32) -> SignalBoard {
        let n = world as usize * signal_count as usize;
        SignalBoard { signal_count, entries: Mutex::new(vec![Entry::default(); n]) }
    }

    fn index(&self, peer: u32, signal: u32) -> usize {
        peer as usize * self.signal_count as usize + signal as usize
    }

    /// Applies `op` with `operand` to this rank's contribution to `signal` at `peer`.
    pub(crate) fn apply(&self, peer: u32, signal: u32, op: SignalOp, operand: u64) -> Next {
        let i = self.index(peer, signal);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut entries[i];
        match op {
            SignalOp::None => return Next::Idle,
            SignalOp::Add => e.value = e.value.wrapping_add(operand),
            SignalOp::Set => e.value = operand,
        }
        if e.in_flight {
            e.dirty = true;
            Next::Coalesced
        } else {
            e.in_flight = true;
            Next::Write(e.value)
        }
    }

    /// Applies `op` with `operand` and returns the new running value, tracking no write in
    /// flight: for peers whose signal writes go through a stream lane, where the stream's own
    /// order keeps the slot monotone (the caller enqueues the write under the lane's lock).
    pub(crate) fn advance(&self, peer: u32, signal: u32, op: SignalOp, operand: u64) -> u64 {
        let i = self.index(peer, signal);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut entries[i];
        match op {
            SignalOp::None => {}
            SignalOp::Add => e.value = e.value.wrapping_add(operand),
            SignalOp::Set => e.value = operand,
        }
        e.value
    }

    /// The write in flight for (`peer`, `signal`) finished (`ok` says how). If the value moved
    /// meanwhile and the write succeeded, the caller writes the newest value next; after a
    /// failure nothing more is written (the peer is dead or refused us; the error is recorded).
    pub(crate) fn written(&self, peer: u32, signal: u32, ok: bool) -> Next {
        let i = self.index(peer, signal);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut entries[i];
        if ok && e.dirty {
            e.dirty = false;
            Next::Write(e.value)
        } else {
            e.in_flight = false;
            e.dirty = false;
            Next::Idle
        }
    }

    /// Writes in flight, over all (peer, signal).
    pub(crate) fn in_flight(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|e| e.in_flight).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_write_in_flight_newer_values_coalesce_and_the_latest_lands() {
        let b = SignalBoard::new(2, 3);
        assert_eq!(b.apply(1, 2, SignalOp::Add, 5), Next::Write(5));
        assert_eq!(b.apply(1, 2, SignalOp::Add, 1), Next::Coalesced);
        assert_eq!(b.apply(1, 2, SignalOp::Add, 1), Next::Coalesced);
        // Another (peer, signal) is independent.
        assert_eq!(b.apply(0, 2, SignalOp::Set, 9), Next::Write(9));
        assert_eq!(b.written(1, 2, true), Next::Write(7), "the newest value follows");
        assert_eq!(b.written(1, 2, true), Next::Idle);
        assert_eq!(b.apply(1, 2, SignalOp::Set, 3), Next::Write(3), "Set replaces the running value");
        assert_eq!(b.apply(1, 2, SignalOp::None, 100), Next::Idle);
        assert_eq!(b.in_flight(), 2);
        assert_eq!(b.apply(1, 2, SignalOp::Add, 1), Next::Coalesced);
        assert_eq!(b.written(1, 2, false), Next::Idle, "a failed write stops the chain");
        assert_eq!(b.written(0, 2, true), Next::Idle);
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn advance_keeps_the_running_value_without_a_write_in_flight() {
        let b = SignalBoard::new(2, 1);
        assert_eq!(b.advance(1, 0, SignalOp::Add, 2), 2);
        assert_eq!(b.advance(1, 0, SignalOp::Add, 3), 5);
        assert_eq!(b.advance(1, 0, SignalOp::None, 9), 5);
        assert_eq!(b.advance(1, 0, SignalOp::Set, 1), 1);
        assert_eq!(b.in_flight(), 0);
    }
}
