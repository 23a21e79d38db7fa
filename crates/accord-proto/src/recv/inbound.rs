//! Progress of operations at the receiver that need their completion noticed: a write with an
//! immediate (its counter may move only once every byte is placed) and a send (its buffer is
//! handed to the application once full). Plain writes need no entry.
//!
//! Each packet is counted once: the receive window filters duplicates by packet number before
//! anything reaches this table, and retransmissions reuse their packet number.

use crate::ids::{OpId, RecvBufferId};
use crate::wire::RejectReason;
use std::collections::HashMap;

/// What the receiver does with an operation's bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum InboundStart {
    /// A one-sided write; `imm` is counted when the last byte lands.
    WriteWithImm { imm: u32 },
    /// A two-sided send into a posted buffer claimed by its first arriving packet.
    Send { buffer: RecvBufferId },
}

#[derive(Clone, Debug)]
struct Entry {
    start: InboundStart,
    msg_len: u64,
    bytes_seen: u64,
    refused: Option<RejectReason>,
}

/// What one packet did to its operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum InboundProgress {
    /// More bytes are due.
    Partial,
    /// Every byte arrived and was placed: the operation is complete.
    Complete(InboundStart),
    /// Every byte arrived, but some were refused: nothing completes at the receiver.
    CompleteRefused,
}

/// Table of partially received operations, bounded by `capacity`.
#[derive(Clone, Debug)]
pub struct InboundOps {
    entries: HashMap<OpId, Entry>,
    capacity: usize,
}

impl InboundOps {
    pub fn new(capacity: u32) -> Self {
        InboundOps { entries: HashMap::new(), capacity: capacity as usize }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry's start if the operation is known: its message length and what it does.
    pub fn lookup(&self, op: OpId) -> Option<(InboundStart, u64, Option<RejectReason>)> {
        self.entries.get(&op).map(|e| (e.start, e.msg_len, e.refused))
    }

    /// Whether a new entry fits.
    pub fn has_room(&self) -> bool {
        self.entries.len() < self.capacity
    }

    /// Starts tracking `op`. The caller checked [`has_room`](Self::has_room) and that the op
    /// is not known.
    pub fn start(&mut self, op: OpId, start: InboundStart, msg_len: u64) {
        debug_assert!(self.has_room() && !self.entries.contains_key(&op));
        self.entries.insert(op, Entry { start, msg_len, bytes_seen: 0, refused: None });
    }

    /// Starts tracking an operation whose first packet was refused (e.g. no receive buffer),
    /// so that its later packets are refused the same way.
    pub fn start_refused(&mut self, op: OpId, start: InboundStart, msg_len: u64, reason: RejectReason) {
        self.entries.insert(op, Entry { start, msg_len, bytes_seen: 0, refused: Some(reason) });
    }

    /// Counts `len` bytes of `op` (placed, or refused when `refused` is set).
    pub fn record(&mut self, op: OpId, len: u64, refused: Option<RejectReason>) -> InboundProgress {
        let Some(entry) = self.entries.get_mut(&op) else { return InboundProgress::Partial };
        entry.bytes_seen = entry.bytes_seen.saturating_add(len);
        if entry.refused.is_none() {
            entry.refused = refused;
        }
        // A zero-length operation is complete with its one (empty) packet.
        if entry.bytes_seen >= entry.msg_len {
            let done = self.entries.remove(&op).expect("entry present");
            return match done.refused {
                None => InboundProgress::Complete(done.start),
                Some(_) => InboundProgress::CompleteRefused,
            };
        }
        InboundProgress::Partial
    }
}
