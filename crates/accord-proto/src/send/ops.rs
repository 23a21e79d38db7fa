//! Operations submitted by the application on the sending side, their packetisation and their
//! completion.

use crate::ids::OpId;
use crate::wire::{DataKind, RejectReason};
use std::collections::{BTreeMap, VecDeque};

/// Why an operation could not be submitted. Nothing was queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("no such connection: it was never opened, or it closed")]
    UnknownConnection,
    #[error("connection has failed or closed: open a new one")]
    ConnectionDown,
    #[error("{0} operations already outstanding on this connection: wait for completions, or raise ops_in_flight_max")]
    TooManyOps(u32),
    #[error("destination offset {offset} + length {len} overflows 64 bits")]
    OffsetOverflow { offset: u64, len: u64 },
}

/// Why a submitted operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    #[error("receiver refused the operation: {}", describe_reject(*.0))]
    Rejected(RejectReason),
    #[error("connection lost: the peer stopped acknowledging within the idle timeout")]
    ConnectionLost,
    #[error("connection closed before the operation completed")]
    Closed,
}

fn describe_reject(reason: RejectReason) -> &'static str {
    match reason {
        RejectReason::UnknownRegion => "no such memory region (never registered, or deregistered)",
        RejectReason::BadKey => "wrong key for the memory region",
        RejectReason::OutOfBounds => "write falls outside the memory region",
        RejectReason::NoRecvBuffer => "no receive buffer posted: post more receives",
        RejectReason::MessageTooLarge => "message larger than the posted receive buffers",
        RejectReason::TooManyMessages => "receiver is tracking too many messages",
        RejectReason::Other(_) => "reason unknown to this version",
    }
}

/// An operation that has finished, one way or the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpCompletion {
    pub op: OpId,
    pub result: Result<(), OpError>,
}

/// Sender-side state of one operation.
#[derive(Debug, Clone)]
pub struct OutboundOp {
    pub kind: DataKind,
    pub imm: Option<u32>,
    pub tag: u64,
    pub len: u64,
    /// Bytes before this offset have been put in packets.
    pub next_offset: u64,
    /// A zero-length operation still sends one packet; this says whether it went.
    pub first_packet_planned: bool,
    pub packets_unresolved: u32,
    pub failure: Option<OpError>,
}

impl OutboundOp {
    fn fully_planned(&self) -> bool {
        self.first_packet_planned && self.next_offset >= self.len
    }
}

/// The next packet of new data to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketPlan {
    pub op: OpId,
    pub msg_offset: u64,
    pub len: u32,
}

/// Outstanding operations, bounded by `capacity`.
#[derive(Debug, Clone)]
pub struct OutboundOps {
    ops: BTreeMap<OpId, OutboundOp>,
    pending: VecDeque<OpId>,
    next_op: u64,
    capacity: u32,
}

impl OutboundOps {
    pub fn new(capacity: u32) -> Self {
        OutboundOps { ops: BTreeMap::new(), pending: VecDeque::new(), next_op: 0, capacity }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn get(&self, op: OpId) -> Option<&OutboundOp> {
        self.ops.get(&op)
    }

    /// Queues an operation for sending.
    pub fn submit(&mut self, kind: DataKind, imm: Option<u32>, tag: u64, len: u64) -> Result<OpId, SubmitError> {
        if self.ops.len() >= self.capacity as usize {
            return Err(SubmitError::TooManyOps(self.capacity));
        }
        if let DataKind::Write { region_offset, .. } = kind {
            if region_offset.checked_add(len).is_none() {
                return Err(SubmitError::OffsetOverflow { offset: region_offset, len });
            }
        }
        let op = OpId(self.next_op);
        self.next_op += 1;
        self.ops.insert(
            op,
            OutboundOp {
                kind,
                imm,
                tag,
                len,
                next_offset: 0,
                first_packet_planned: false,
                packets_unresolved: 0,
                failure: None,
            },
        );
        self.pending.push_back(op);
        Ok(op)
    }

    /// Whether any operation has bytes not yet put in packets.
    pub fn has_new_data(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Bytes not yet put in packets, over every pending operation (a zero-length operation
    /// counts as one byte: it still owes a packet). O(pending operations): for occasional use
    /// (a receiver-driven sender's request to send), not per packet.
    pub fn unsent_bytes(&self) -> u64 {
        self.pending
            .iter()
            .filter_map(|op| self.ops.get(op))
            .map(|s| (s.len - s.next_offset.min(s.len)).max(u64::from(!s.first_packet_planned)))
            .sum()
    }

    /// The next packet of new data (at most `mss` bytes), without taking it.
    pub fn peek_packet(&self, mss: u32) -> Option<PacketPlan> {
        let &op = self.pending.front()?;
        let state = self.ops.get(&op)?;
        let len = (state.len - state.next_offset).min(mss as u64) as u32;
        Some(PacketPlan { op, msg_offset: state.next_offset, len })
    }

    /// Takes the packet [`peek_packet`](Self::peek_packet) returned.
    pub fn take_packet(&mut self, plan: PacketPlan) {
        let Some(state) = self.ops.get_mut(&plan.op) else { return };
        debug_assert_eq!(state.next_offset, plan.msg_offset);
        state.next_offset += plan.len as u64;
        state.first_packet_planned = true;
        state.packets_unresolved += 1;
        if state.fully_planned() {
            self.pending.pop_front();
        }
    }

    /// One packet of `op` was resolved; returns the completion when it was the last.
    pub fn on_packet_resolved(&mut self, op: OpId) -> Option<OpCompletion> {
        let state = self.ops.get_mut(&op)?;
        state.packets_unresolved = state.packets_unresolved.saturating_sub(1);
        self.complete_if_done(op)
    }

    /// Marks `op` failed and stops planning its bytes; the caller abandons its packets in
    /// flight, then calls [`settle`](Self::settle).
    pub fn fail(&mut self, op: OpId, error: OpError) {
        let Some(state) = self.ops.get_mut(&op) else { return };
        if state.failure.is_none() {
            state.failure = Some(error);
        }
        if !state.fully_planned() {
            state.next_offset = state.len;
            state.first_packet_planned = true;
            self.pending.retain(|&p| p != op);
        }
    }

    /// After `abandoned` packets of a failed op were resolved: completes it if nothing is left.
    pub fn settle(&mut self, op: OpId, abandoned: u32) -> Option<OpCompletion> {
        let state = self.ops.get_mut(&op)?;
        state.packets_unresolved = state.packets_unresolved.saturating_sub(abandoned);
        self.complete_if_done(op)
    }

    fn complete_if_done(&mut self, op: OpId) -> Option<OpCompletion> {
        let state = self.ops.get(&op)?;
        if !state.fully_planned() || state.packets_unresolved > 0 {
            return None;
        }
        let state = self.ops.remove(&op)?;
        Some(OpCompletion { op, result: state.failure.map_or(Ok(()), Err) })
    }

    /// Fails every operation (the connection ended), in operation order.
    pub fn fail_all(&mut self, error: OpError) -> Vec<OpCompletion> {
        self.pending.clear();
        std::mem::take(&mut self.ops)
            .into_iter()
            .map(|(op, state)| OpCompletion { op, result: Err(state.failure.unwrap_or(error)) })
            .collect()
    }
}
