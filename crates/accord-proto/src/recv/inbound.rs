//! Progress of operations at the receiver that need their completion noticed: a write with an
//! immediate (its counter may move only once every byte is placed) and a send (its buffer is
//! handed to the application once full). Plain writes need no entry.
//!
//! Each packet is counted once: the receive window filters duplicates by packet number before
//! anything reaches this table, and retransmissions reuse their packet number.

use crate::ids::{OpId, RecvBufferId};
use crate::wire::RejectReason;
use std::collections::{HashMap, VecDeque};

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
    tag: u64,
    bytes_seen: u64,
}

/// What one packet did to its operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum InboundProgress {
    /// More bytes are due.
    Partial,
    /// Every byte arrived and was placed: the operation is complete.
    Complete(InboundStart),
}

/// Refused operations remembered, so that their straggling packets are refused alike (a send's
/// later packet must not claim a buffer its first packet could not). The sender stops an
/// operation at its first refusal, so stragglers arrive within about one RTT.
pub const REFUSED_OPS_REMEMBERED: usize = 1024;

/// Table of partially received operations, bounded by `capacity`, and the most recently
/// refused ones, bounded by [`REFUSED_OPS_REMEMBERED`].
#[derive(Clone, Debug)]
pub struct InboundOps {
    entries: HashMap<OpId, Entry>,
    capacity: usize,
    refused: HashMap<OpId, RejectReason>,
    refused_order: VecDeque<OpId>,
}

impl InboundOps {
    pub fn new(capacity: u32) -> Self {
        InboundOps {
            entries: HashMap::new(),
            capacity: capacity as usize,
            refused: HashMap::new(),
            refused_order: VecDeque::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry's start if the operation is in progress, its message length and tag.
    pub fn lookup(&self, op: OpId) -> Option<(InboundStart, u64, u64)> {
        self.entries.get(&op).map(|e| (e.start, e.msg_len, e.tag))
    }

    /// Whether a new entry fits.
    pub fn has_room(&self) -> bool {
        self.entries.len() < self.capacity
    }

    /// Starts tracking `op`. The caller checked [`has_room`](Self::has_room) and that the op
    /// is not known.
    pub fn start(&mut self, op: OpId, start: InboundStart, msg_len: u64, tag: u64) {
        debug_assert!(self.has_room() && !self.entries.contains_key(&op));
        self.entries.insert(op, Entry { start, msg_len, tag, bytes_seen: 0 });
    }

    /// Why `op` was refused, if it was recently.
    pub fn refusal(&self, op: OpId) -> Option<RejectReason> {
        self.refused.get(&op).copied()
    }

    /// Remembers that `op` was refused; forgets its progress, and the oldest refusal when full.
    pub fn refuse(&mut self, op: OpId, reason: RejectReason) {
        self.entries.remove(&op);
        if self.refused.insert(op, reason).is_none() {
            self.refused_order.push_back(op);
            if self.refused_order.len() > REFUSED_OPS_REMEMBERED {
                if let Some(oldest) = self.refused_order.pop_front() {
                    self.refused.remove(&oldest);
                }
            }
        }
    }

    /// Counts `len` placed bytes of `op`.
    pub fn record(&mut self, op: OpId, len: u64) -> InboundProgress {
        let Some(entry) = self.entries.get_mut(&op) else { return InboundProgress::Partial };
        entry.bytes_seen = entry.bytes_seen.saturating_add(len);
        // A zero-length operation is complete with its one (empty) packet.
        if entry.bytes_seen >= entry.msg_len {
            let done = self.entries.remove(&op).expect("entry present");
            return InboundProgress::Complete(done.start);
        }
        InboundProgress::Partial
    }
}
