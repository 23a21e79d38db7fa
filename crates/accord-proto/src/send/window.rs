//! Packets in flight.
//!
//! Every packet keeps its packet number for life: a retransmission reuses it, so the receiver
//! filters duplicates exactly and the SACK bitmap means one thing. Each transmission also gets a
//! per-path sequence number; a packet is lost when a packet sent `threshold` later *on the same
//! path* was acknowledged (packets on one path arrive in order, across paths they need not), or
//! when it outlived its path's retransmission timeout.

use crate::ids::{OpId, PathId, Psn};
use crate::time::Instant;
use core::time::Duration;
use std::collections::VecDeque;

/// One packet not yet resolved (acknowledged, refused, or abandoned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentPacket {
    pub op: OpId,
    pub msg_offset: u64,
    pub len: u32,
    /// Path and per-path sequence of the latest transmission.
    pub path: PathId,
    pub path_seq: u64,
    pub sent_at: Instant,
    pub transmissions: u16,
    /// Declared lost and waiting in the retransmission queue; not counted in flight.
    pub lost: bool,
}

/// The sender's window of packet numbers `[floor, next_psn)`.
#[derive(Clone, Debug)]
pub struct SendWindow {
    floor: Psn,
    next_psn: Psn,
    slots: VecDeque<Option<SentPacket>>,
    bytes_in_flight: u64,
    per_path: Vec<VecDeque<(u64, Psn)>>,
    /// Bit `i` set while `per_path[i]` is non-empty, so per-path scans visit only those.
    busy_paths: [u64; 4],
    retransmit_queue: VecDeque<Psn>,
}

impl SendWindow {
    pub fn new(path_count: u16) -> Self {
        SendWindow {
            floor: 0,
            next_psn: 0,
            slots: VecDeque::new(),
            bytes_in_flight: 0,
            per_path: vec![VecDeque::new(); path_count as usize],
            busy_paths: [0; 4],
            retransmit_queue: VecDeque::new(),
        }
    }

    /// Lowest unresolved packet number (every lower one is resolved); sent as `ack_floor`.
    pub fn floor(&self) -> Psn {
        self.floor
    }

    pub fn next_psn(&self) -> Psn {
        self.next_psn
    }

    /// Packet numbers in use, resolved holes included.
    pub fn span(&self) -> u64 {
        self.next_psn - self.floor
    }

    /// Payload bytes sent, not resolved, and not declared lost.
    pub fn bytes_in_flight(&self) -> u64 {
        self.bytes_in_flight
    }

    /// Whether any packet awaits resolution. The front slot is never a resolved hole
    /// (`resolve` trims them), so this reads only the length: `poll_timeout` asks after every
    /// input, and the slots' first line is a cache miss at 1024 hosts.
    pub fn has_unresolved(&self) -> bool {
        debug_assert_eq!(
            !self.slots.is_empty(),
            self.slots.iter().any(Option::is_some),
            "a resolved hole at the front"
        );
        !self.slots.is_empty()
    }

    pub fn get(&self, psn: Psn) -> Option<&SentPacket> {
        if psn < self.floor {
            return None;
        }
        self.slots.get((psn - self.floor) as usize).and_then(Option::as_ref)
    }

    /// Records a first transmission; returns its packet number.
    pub fn on_sent_new(&mut self, packet: SentPacket) -> Psn {
        let psn = self.next_psn;
        self.next_psn += 1;
        self.bytes_in_flight += packet.len as u64;
        self.push_path(packet.path, packet.path_seq, psn);
        self.slots.push_back(Some(packet));
        psn
    }

    /// Records a retransmission of a lost packet on `path`.
    pub fn on_retransmitted(&mut self, psn: Psn, path: PathId, path_seq: u64, now: Instant) {
        let Some(slot) = self.slot_mut(psn) else { return };
        debug_assert!(slot.lost);
        slot.lost = false;
        slot.path = path;
        slot.path_seq = path_seq;
        slot.sent_at = now;
        slot.transmissions = slot.transmissions.saturating_add(1);
        let len = slot.len as u64;
        self.bytes_in_flight += len;
        self.push_path(path, path_seq, psn);
    }

    fn push_path(&mut self, path: PathId, path_seq: u64, psn: Psn) {
        let i = path.0 as usize;
        self.per_path[i].push_back((path_seq, psn));
        self.busy_paths[i / 64] |= 1 << (i % 64);
    }

    fn pop_path(&mut self, i: usize) {
        self.per_path[i].pop_front();
        if self.per_path[i].is_empty() {
            self.busy_paths[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Paths that may have packets outstanding (a superset: stale entries count until purged),
    /// in increasing order. Every path not listed has none.
    pub fn busy_paths(&self) -> impl Iterator<Item = PathId> {
        let mask = self.busy_paths;
        (0..4usize).flat_map(move |w| {
            let mut bits = mask[w];
            core::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    PathId((w * 64 + b) as u16)
                })
            })
        })
    }

    fn slot_mut(&mut self, psn: Psn) -> Option<&mut SentPacket> {
        if psn < self.floor {
            return None;
        }
        self.slots.get_mut((psn - self.floor) as usize).and_then(Option::as_mut)
    }

    /// Resolves `psn` (acknowledged, refused, or abandoned), returning what it was.
    pub fn resolve(&mut self, psn: Psn) -> Option<SentPacket> {
        if psn < self.floor {
            return None;
        }
        let packet = self.slots.get_mut((psn - self.floor) as usize)?.take()?;
        if !packet.lost {
            self.bytes_in_flight -= packet.len as u64;
        }
        // Keep idle paths' queues empty, so per-path scans (poll_timeout) skip them cheaply.
        self.purge_front(packet.path);
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.floor += 1;
        }
        Some(packet)
    }

    /// Unresolved packet numbers in `[from, to)`, for cumulative acknowledgements.
    pub fn unresolved_below(&self, to: Psn) -> impl Iterator<Item = Psn> + '_ {
        let end = to.min(self.next_psn).saturating_sub(self.floor) as usize;
        self.slots.iter().take(end).enumerate().filter(|(_, s)| s.is_some()).map(move |(i, _)| self.floor + i as u64)
    }

    fn is_current(&self, path: PathId, path_seq: u64, psn: Psn) -> bool {
        matches!(self.get(psn), Some(p) if !p.lost && p.path == path && p.path_seq == path_seq)
    }

    fn purge_front(&mut self, path: PathId) {
        let i = path.0 as usize;
        while let Some(&(seq, psn)) = self.per_path[i].front() {
            if self.is_current(path, seq, psn) {
                break;
            }
            self.pop_path(i);
        }
    }

    fn mark_lost(&mut self, psn: Psn) -> u32 {
        let Some(slot) = self.slot_mut(psn) else { return 0 };
        slot.lost = true;
        let len = slot.len;
        self.bytes_in_flight -= len as u64;
        self.retransmit_queue.push_back(psn);
        len
    }

    /// The receiver says packet `psn` was trimmed in the fabric (a NACK): it is lost now,
    /// whatever its path's order says. Returns its path and length, or `None` when it is
    /// already resolved or already waiting for retransmission (a duplicate or stale NACK).
    pub fn nack(&mut self, psn: Psn) -> Option<(PathId, u32)> {
        let packet = self.get(psn)?;
        if packet.lost {
            return None;
        }
        let path = packet.path;
        Some((path, self.mark_lost(psn)))
    }

    /// Payload bytes waiting in the retransmission queue.
    pub fn retransmit_bytes(&self) -> u64 {
        self.retransmit_queue.iter().filter_map(|&psn| self.get(psn)).filter(|p| p.lost).map(|p| p.len as u64).sum()
    }

    /// Declares lost every packet on `path` sent `threshold` or more before the largest
    /// acknowledged path sequence. Returns (packets, bytes) lost.
    pub fn detect_reorder_losses(&mut self, path: PathId, largest_acked_seq: u64, threshold: u32) -> (u64, u64) {
        let (mut packets, mut bytes) = (0, 0);
        loop {
            self.purge_front(path);
            let Some(&(seq, psn)) = self.per_path[path.0 as usize].front() else { break };
            if seq.saturating_add(threshold as u64) > largest_acked_seq {
                break;
            }
            self.pop_path(path.0 as usize);
            bytes += self.mark_lost(psn) as u64;
            packets += 1;
        }
        (packets, bytes)
    }

    /// Declares lost every packet on `path` sent at or before `now - rto`. Returns (packets,
    /// bytes) lost.
    pub fn detect_timeouts(&mut self, path: PathId, now: Instant, rto: Duration) -> (u64, u64) {
        let (mut packets, mut bytes) = (0, 0);
        loop {
            self.purge_front(path);
            let Some(&(_, psn)) = self.per_path[path.0 as usize].front() else { break };
            let sent_at = self.get(psn).map(|p| p.sent_at).unwrap_or(now);
            if sent_at + rto > now {
                break;
            }
            self.pop_path(path.0 as usize);
            bytes += self.mark_lost(psn) as u64;
            packets += 1;
        }
        (packets, bytes)
    }

    /// Send time of the oldest packet in flight on `path`.
    pub fn oldest_outstanding(&mut self, path: PathId) -> Option<Instant> {
        self.purge_front(path);
        let &(_, psn) = self.per_path[path.0 as usize].front()?;
        self.get(psn).map(|p| p.sent_at)
    }

    /// Send time of the oldest packet in flight on `path`, without purging (invariant checks).
    pub fn oldest_outstanding_peek(&self, path: PathId) -> Option<Instant> {
        let queue = self.per_path.get(path.0 as usize)?;
        let &(_, psn) = queue.iter().find(|&&(seq, psn)| self.is_current(path, seq, psn))?;
        self.get(psn).map(|p| p.sent_at)
    }

    /// Next lost packet to retransmit (without taking it).
    pub fn peek_retransmit(&mut self) -> Option<&SentPacket> {
        while let Some(&psn) = self.retransmit_queue.front() {
            if matches!(self.get(psn), Some(p) if p.lost) {
                return self.get(psn);
            }
            self.retransmit_queue.pop_front();
        }
        None
    }

    /// Takes the next lost packet to retransmit.
    pub fn pop_retransmit(&mut self) -> Option<Psn> {
        self.peek_retransmit()?;
        self.retransmit_queue.pop_front()
    }

    pub fn has_retransmit(&mut self) -> bool {
        self.peek_retransmit().is_some()
    }

    /// Resolves every unresolved packet of `op` (it failed; its bytes need not arrive).
    pub fn abandon_op(&mut self, op: OpId) -> u32 {
        let psns: Vec<Psn> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Some(p) if p.op == op))
            .map(|(i, _)| self.floor + i as u64)
            .collect();
        for &psn in &psns {
            self.resolve(psn);
        }
        psns.len() as u32
    }

    /// Sum of in-flight lengths recomputed from scratch (invariant check).
    pub fn recount_bytes_in_flight(&self) -> u64 {
        self.slots.iter().flatten().filter(|p| !p.lost).map(|p| p.len as u64).sum()
    }

    /// Resolves everything (the connection ended).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.floor = self.next_psn;
        self.bytes_in_flight = 0;
        self.retransmit_queue.clear();
        for q in &mut self.per_path {
            q.clear();
        }
        self.busy_paths = [0; 4];
    }
}
