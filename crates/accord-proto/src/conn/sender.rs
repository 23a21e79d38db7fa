//! The sending half: chunks, path choice, window and pacing, ACK processing, loss detection.

use super::{Chunk, Connection, PROBES_OUTSTANDING_MAX};
use crate::api::{Event, PayloadRef, RxMeta, Transmit};
use crate::cc::{AckEvent, CongestionControl, LossEvent, RetransmitDecision};
use crate::ids::{OpId, PathId, Psn};
use crate::path::PathSelector;
use crate::send::{OpError, OutboundOp, SentPacket};
use crate::time::Instant;
use crate::wire::{self, AckRepr, DataRepr, ProbeRepr, Repr};
use core::time::Duration;
use std::collections::VecDeque;

/// Result of trying to send one packet of the current chunk.
enum Step {
    Sent(Transmit),
    /// Window, receive window or pacing says wait; keep the chunk.
    Blocked,
    /// Nothing of this chunk's kind is left; end the chunk.
    Empty,
}

/// Paths touched by one ACK frame, as a bitmask over the 256 possible paths.
#[derive(Default)]
struct PathSet([u64; 4]);

impl PathSet {
    fn insert(&mut self, path: PathId) {
        let i = path.0 as usize;
        self.0[i / 64] |= 1 << (i % 64);
    }
    /// Members in increasing order, visiting set bits only.
    fn iter(&self) -> impl Iterator<Item = PathId> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            core::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    PathId((w * 64 + b) as u16)
                })
            })
        })
    }
}

impl Connection {
    /// The window the sender enforces: the policy's, but never below one packet so a
    /// connection can always make progress.
    fn window_limit(&self) -> u64 {
        self.cc.window_bytes().max(self.config.mss_bytes() as u64)
    }

    /// Chunk size for the next decision: the configured chunk, shrunk so that a window holds
    /// at least four chunks, halved under heavy loss, then offered to the policy's hook.
    fn chunk_bytes(&self) -> u32 {
        let mss = self.config.mss_bytes();
        let quarter_window = (self.cc.window_bytes() / 4).min(u32::MAX as u64) as u32;
        let mut bytes = self.config.chunk_bytes.min(quarter_window);
        let loss = self.paths.mean_active_loss_score();
        if loss > 0.01 {
            bytes /= 2;
        }
        if loss > 0.05 {
            bytes /= 2;
        }
        self.cc.chunk_bytes(bytes.max(mss)).max(mss)
    }

    /// Re-derives `path`'s oldest outstanding send time (the selector's age signal) and its
    /// loss deadline. Call after anything that may change the path's oldest outstanding packet
    /// (a send on a path, an acknowledgement, a loss) or its RTO (an RTT sample, a backoff
    /// change); everything else leaves both as they are, so no call scans the path table.
    pub(super) fn refresh_path_timer(&mut self, path: PathId) {
        let oldest = self.send.oldest_outstanding(path);
        let Some(rto) = self.paths.rto(path, self.config.rto_min, self.config.rto_max) else { return };
        let Some(p) = self.paths.get_mut(path) else { return };
        p.oldest_outstanding_sent_at = oldest;
        self.loss_deadlines.set(path, oldest.map(|sent| sent + rto));
    }

    /// `refresh_path_timer` for every path (after changes that touch many at once).
    fn refresh_all_path_timers(&mut self) {
        for path in 0..self.paths.len() {
            self.refresh_path_timer(PathId(path as u16));
        }
    }

    /// When pacing lets the next chunk go: the last paced chunk's start plus its bytes at the
    /// rate the policy asks for *now*. Computed afresh each time, so a rate that rose (or pacing
    /// that stopped, once the window is back above a packet) takes effect at once instead of a
    /// deadline set while the rate was low.
    fn paced_until(&self) -> Option<Instant> {
        let rate = self.cc.pacing_rate_bytes_per_sec().filter(|&r| r > 0)?;
        let (started, bytes) = self.last_chunk?;
        let nanos = (bytes as u128 * 1_000_000_000 / rate as u128).min(u64::MAX as u128) as u64;
        Some(started + Duration::from_nanos(nanos))
    }

    /// Decides the next chunk: retransmissions first, then new data; the window and pacing
    /// must allow it. Returns `None` when nothing can start now.
    /// A lost packet waits and the policy lets it go now.
    fn retransmission_ready(&mut self, now: Instant) -> bool {
        let lost_path = self.send.peek_retransmit().map(|p| p.path);
        lost_path.is_some_and(|path| self.cc.may_retransmit(now, path) == RetransmitDecision::Now)
    }

    fn start_chunk(&mut self, now: Instant) -> Option<()> {
        let lost_path = self.send.peek_retransmit().map(|p| p.path);
        let retransmit = self.retransmission_ready(now);
        let new_data = self.ops.has_new_data() && self.send.span() < self.config.recv_window_packets as u64;
        if !retransmit && !new_data {
            return None;
        }
        if self.send.bytes_in_flight() >= self.window_limit() {
            return None;
        }
        if let Some(allowed_at) = self.paced_until() {
            if now < allowed_at {
                self.next_send_at = allowed_at;
                self.pacing_blocked = true;
                return None;
            }
        }
        let chunk_bytes = self.chunk_bytes();
        let packets = chunk_bytes.div_ceil(self.config.mss_bytes()).max(1);
        let avoid = if retransmit { lost_path } else { None };
        let path = self.selector.select(now, &self.paths, &mut self.rng, avoid);
        // Only a chunk sent under pacing leaves a gap to keep; one sent while the window alone
        // ruled (no pacing) owes nothing when pacing starts later (e.g. after a timeout).
        self.last_chunk = self.cc.pacing_rate_bytes_per_sec().filter(|&r| r > 0).map(|_| (now, chunk_bytes));
        self.chunk = Some(Chunk { path, packets_left: packets, retransmission: retransmit });
        Some(())
    }

    /// Next data packet, if the window, pacing and receive window allow one.
    pub(super) fn poll_data(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.pacing_blocked = false;
        // Retransmissions preempt new data: they are what frees the windows.
        if self.chunk.is_some_and(|c| !c.retransmission) && self.retransmission_ready(now) {
            self.chunk = None;
        }
        // Two rounds: a chunk that ran dry is replaced once.
        for _ in 0..2 {
            if self.chunk.is_none_or(|c| c.packets_left == 0) {
                self.chunk = None;
                self.start_chunk(now)?;
            }
            let chunk = self.chunk?;
            let step = if chunk.retransmission {
                self.send_retransmission(now, chunk, buf)
            } else {
                self.send_new_data(now, chunk, buf)
            };
            match step {
                Step::Sent(t) => {
                    if let Some(c) = self.chunk.as_mut() {
                        c.packets_left -= 1;
                    }
                    return Some(t);
                }
                Step::Blocked => return None,
                Step::Empty => self.chunk = None,
            }
        }
        None
    }

    fn window_allows(&self, len: u32) -> bool {
        let in_flight = self.send.bytes_in_flight();
        in_flight == 0 || in_flight + len as u64 <= self.window_limit()
    }

    fn send_new_data(&mut self, now: Instant, chunk: Chunk, buf: &mut [u8]) -> Step {
        let Some(plan) = self.ops.peek_packet(self.config.mss_bytes()) else { return Step::Empty };
        if self.send.span() >= self.config.recv_window_packets as u64 {
            // End the chunk: the next decision may be a retransmission, which can free it.
            return Step::Empty;
        }
        if !self.window_allows(plan.len) || !self.credit_allows(now, plan.len) {
            return Step::Blocked;
        }
        let Some(op) = self.ops.get(plan.op).cloned() else { return Step::Empty };
        self.ops.take_packet(plan);
        self.on_data_sent(now, plan.len);
        if !self.send.has_unresolved() {
            self.last_progress = now;
        }
        let path_seq = self.next_path_seq(chunk.path);
        let psn = self.send.on_sent_new(SentPacket {
            op: plan.op,
            msg_offset: plan.msg_offset,
            len: plan.len,
            path: chunk.path,
            path_seq,
            sent_at: now,
            transmissions: 1,
            lost: false,
        });
        self.refresh_path_timer(chunk.path);
        // Ask for an immediate ACK at the end of a chunk (each path decision gets its feedback)
        // and at the tail, but not more often than every half `ack_every_packets`: with chunks
        // of one or two packets (per-packet spraying) an ACK per chunk doubled the packets on
        // the fabric while adding little information over the SACK of a slightly later ACK.
        self.packets_since_ack_request = self.packets_since_ack_request.saturating_add(1);
        let ack_spacing = (self.config.ack_every_packets / 2).max(1);
        let last_of_chunk =
            !self.ops.has_new_data() || (chunk.packets_left <= 1 && self.packets_since_ack_request >= ack_spacing);
        if last_of_chunk {
            self.packets_since_ack_request = 0;
        }
        let repr = self.data_repr(now, psn, plan.op, &op, plan.msg_offset, plan.len, last_of_chunk);
        self.emit_data(chunk.path, &repr, buf)
    }

    fn send_retransmission(&mut self, now: Instant, chunk: Chunk, buf: &mut [u8]) -> Step {
        let Some(lost) = self.send.peek_retransmit().cloned() else { return Step::Empty };
        if self.cc.may_retransmit(now, lost.path) == RetransmitDecision::Later {
            return Step::Empty;
        }
        if !self.window_allows(lost.len) || !self.credit_allows(now, lost.len) {
            return Step::Blocked;
        }
        let Some(op) = self.ops.get(lost.op).cloned() else {
            // Cannot happen: an operation lives while it has unresolved packets.
            debug_assert!(false, "lost packet of unknown op");
            let psn = self.send.pop_retransmit();
            if let Some(psn) = psn {
                self.send.resolve(psn);
            }
            return Step::Empty;
        };
        let Some(psn) = self.send.pop_retransmit() else { return Step::Empty };
        let path_seq = self.next_path_seq(chunk.path);
        self.send.on_retransmitted(psn, chunk.path, path_seq, now);
        self.on_data_sent(now, lost.len);
        self.refresh_path_timer(chunk.path);
        self.stats.packets_retransmitted += 1;
        if let Some(p) = self.paths.get_mut(chunk.path) {
            p.stats.retransmits_sent += 1;
        }
        let last_of_chunk = chunk.packets_left <= 1 || !self.send.has_retransmit();
        let repr = DataRepr {
            retransmission: true,
            ..self.data_repr(now, psn, lost.op, &op, lost.msg_offset, lost.len, last_of_chunk)
        };
        self.emit_data(chunk.path, &repr, buf)
    }

    /// The DATA header of bytes `msg_offset..msg_offset + len` of operation `op_id` sent as
    /// `psn` now: what new data and retransmissions share (a retransmission then says so),
    /// the receiver-driven request included.
    #[allow(clippy::too_many_arguments)]
    fn data_repr(
        &mut self,
        now: Instant,
        psn: Psn,
        op_id: OpId,
        op: &OutboundOp,
        msg_offset: u64,
        len: u32,
        ack_now: bool,
    ) -> DataRepr {
        let receiver_driven = self.cc.receiver_driven();
        DataRepr {
            psn,
            ack_floor: self.send.floor(),
            tx_time_ns: now.as_nanos(),
            op: op_id,
            kind: op.kind,
            imm: op.imm,
            tag: op.tag,
            msg_len: op.len,
            msg_offset,
            payload_len: len as u16,
            ack_now,
            retransmission: false,
            receiver_driven,
            wants_more: receiver_driven && (self.ops.has_new_data() || self.send.has_retransmit()),
        }
    }

    fn next_path_seq(&mut self, path: PathId) -> u64 {
        let p = self.paths.get_mut(path).expect("selector returns paths of the table");
        let seq = p.next_path_seq;
        p.next_path_seq += 1;
        seq
    }

    fn emit_data(&mut self, path: PathId, repr: &DataRepr, buf: &mut [u8]) -> Step {
        let Some(header) = self.peer_header() else { return Step::Empty };
        let header_len = match wire::emit(&header, &Repr::Data(*repr), buf) {
            Ok(n) => n,
            Err(_) => {
                debug_assert!(false, "transmit buffer too small for a data header");
                return Step::Blocked;
            }
        };
        if self.send.bytes_in_flight() > self.window_limit() + self.config.mss_bytes() as u64 {
            self.stats.window_overruns += 1;
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += repr.payload_len as u64;
        if let Some(p) = self.paths.get_mut(path) {
            p.stats.packets_sent += 1;
            p.stats.bytes_sent += repr.payload_len as u64;
        }
        let payload = PayloadRef { op: repr.op, offset: repr.msg_offset, len: repr.payload_len as u32 };
        Step::Sent(Transmit {
            conn: self.id,
            path,
            header_len,
            payload: Some(payload),
            ecn_capable: true,
            seal: crate::api::PendingSeal::Done,
        })
    }

    /// Probe answers first, then a probe for a quarantined path whose turn has come.
    pub(super) fn poll_probe(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let header = self.peer_header()?;
        if let Some((path, probe)) = self.probe_replies.pop_front() {
            return self.emit_control(&header, &Repr::ProbeAck(probe), path, buf);
        }
        let path = self.paths.take_due_probe(now, self.config.probe_interval)?;
        let probe = ProbeRepr { probe_id: self.next_probe_id, tx_time_ns: now.as_nanos() };
        self.next_probe_id += 1;
        if self.probes_outstanding.len() >= PROBES_OUTSTANDING_MAX {
            self.probes_outstanding.pop_front();
        }
        self.probes_outstanding.push_back((path, probe));
        self.emit_control(&header, &Repr::Probe(probe), path, buf)
    }

    /// A probe answer: the path it came back on is alive. Only the answer to a probe still
    /// outstanding on that path counts; any other (late, replayed, forged) is stale.
    pub(crate) fn handle_probe_ack(
        &mut self,
        now: Instant,
        rx: RxMeta,
        probe: &ProbeRepr,
        events: &mut VecDeque<Event>,
    ) {
        let outstanding = self.probes_outstanding.iter().position(|&(path, sent)| path == rx.path && sent == *probe);
        let Some(index) = outstanding else {
            self.stats.stale_frames += 1;
            return;
        };
        self.probes_outstanding.remove(index);
        let Some(state) = self.paths.get(rx.path) else { return };
        if state.is_active() || probe.tx_time_ns > now.as_nanos() {
            return;
        }
        let sample = now.saturating_duration_since(Instant::from_nanos(probe.tx_time_ns));
        let revived = self.paths.on_probe_answered(rx.path, sample);
        self.refresh_path_timer(rx.path);
        if revived {
            events.push_back(Event::PathRevived { conn: self.id, path: rx.path });
        }
    }

    /// An ACK frame: resolve what it acknowledges or refuses, sample RTT, detect loss, and
    /// tell the congestion control.
    ///
    /// The stale-frame rule (crate doc): an ACK that newly resolves no
    /// packet and refuses no live operation changes nothing. A late duplicate or a replay
    /// carries an old echoed time and an old CE count; believing them pushed RTT and RTO to
    /// seconds and let one ACK rewind the ECN counter.
    pub(crate) fn handle_ack(&mut self, now: Instant, rx: RxMeta, ack: &AckRepr, events: &mut VecDeque<Event>) {
        self.stats.acks_received += 1;
        let mut touched = PathSet::default();
        let (mut acked_bytes, mut acked_packets) = (0u64, 0u64);
        // The echoed packet, if this ACK resolved it and the echo names its latest
        // transmission (Karn: an echo of an earlier copy says nothing about this one).
        let mut echo_matches = false;
        // Everything below the cumulative point, then the SACKed ones; `resolve` skips what is
        // already resolved. A plain range: no allocation per ACK.
        let cumulative = self.send.floor()..ack.cum_ack.min(self.send.next_psn());
        let selective = ack.sack.iter_set().map(|bit| ack.cum_ack + 1 + bit as u64);
        let mut floor_moved = false;
        for psn in cumulative.chain(selective) {
            if let Some(packet) = self.send.resolve(psn) {
                if let Some(first_sent_at) = spurious_loss(psn, &packet, ack) {
                    self.stats.packets_lost_spurious += 1;
                    self.paths.note_spurious_loss(packet.path);
                    if self.config.learn_rto_floor {
                        floor_moved |= self.paths.raise_rto_floor(first_sent_at, now, self.config.rto_max);
                    }
                }
                acked_bytes += packet.len as u64;
                acked_packets += 1;
                echo_matches |= psn == ack.echo_psn && packet.sent_at.as_nanos() == ack.echo_tx_time_ns;
                touched.insert(packet.path);
                self.paths.on_acked(packet.path, packet.path_seq);
                if let Some(done) = self.ops.on_packet_resolved(packet.op) {
                    events.push_back(Event::OpCompleted { conn: self.id, op: done.op, result: done.result });
                }
            }
        }
        let mut rejected = false;
        for rejection in ack.rejections.iter() {
            if self.send.get(rejection.psn).is_none_or(|p| p.op != rejection.op) {
                continue;
            }
            rejected = true;
            self.send.resolve(rejection.psn);
            self.ops.fail(rejection.op, OpError::Rejected(rejection.reason));
            let abandoned = self.send.abandon_op(rejection.op);
            if let Some(done) = self.ops.settle(rejection.op, 1 + abandoned) {
                events.push_back(Event::OpCompleted { conn: self.id, op: done.op, result: done.result });
            }
        }
        if acked_packets == 0 && !rejected {
            self.stats.stale_frames += 1;
            return;
        }
        self.stats.bytes_acked += acked_bytes;

        let rtt_sample = if echo_matches { self.rtt_sample(now, rx.path, ack) } else { None };
        if rtt_sample.is_some() {
            floor_moved |= self.paths.decay_rto_floor(now);
        }
        // The CE count only moves forward; an older count (a reordered ACK that still resolved
        // something) reports no new marks and leaves ours as it is.
        let ce_forward = ack.ecn_ce_count.wrapping_sub(self.peer_ecn_ce_count);
        let ce_delta = if ce_forward < 1 << 31 { ce_forward as u64 } else { 0 };
        if ce_delta > 0 {
            self.peer_ecn_ce_count = ack.ecn_ce_count;
        }
        if acked_packets > 0 {
            self.last_progress = now;
            self.last_ack_at = Some(now);
            let event = AckEvent {
                now,
                path: rx.path,
                newly_acked_bytes: acked_bytes,
                newly_acked_packets: acked_packets,
                rtt_sample,
                rtt_min: self.rtt.min(),
                rtt_smoothed: self.rtt.smoothed(),
                bytes_in_flight: self.send.bytes_in_flight(),
                ecn_ce_packets: ce_delta.min(acked_packets),
                mss_bytes: self.config.mss_bytes(),
            };
            self.cc.on_ack(&event);
        }
        // Paths whose packets this ACK covered delivered cleanly unless it reports a new mark
        // (not attributable to a path, so none is recycled then).
        if ce_delta == 0 {
            for path in touched.iter() {
                self.selector.on_feedback(path, true);
            }
        }
        for path in touched.iter() {
            let Some(largest) = self.paths.get(path).and_then(|p| p.largest_acked_path_seq) else { continue };
            let (packets, bytes) =
                self.send.detect_reorder_losses(path, largest, self.config.reorder_threshold_packets);
            if packets > 0 {
                self.note_losses(now, path, packets, bytes, false);
            }
        }
        if ack.credit_bytes > 0 {
            self.cc.on_credit(now, ack.credit_bytes as u64);
        }
        // Resolutions, losses, backoff resets and the RTT sample changed these paths' timers; a
        // rejection, or a move of the learned RTO floor, changed every path's.
        if rejected || floor_moved {
            self.refresh_all_path_timers();
        } else {
            for path in touched.iter() {
                self.refresh_path_timer(path);
            }
            self.refresh_path_timer(rx.path);
        }
        if acked_packets > 0 {
            self.note_idle_if_done(now);
        }
    }

    /// RTT from the echoed transmit time (our own clock), ACK delay removed. Attributed to the
    /// path the ACK came back on, which is the path the echoed packet went out on. Called only
    /// for an ACK that resolved the echoed packet's latest transmission.
    fn rtt_sample(&mut self, now: Instant, path: PathId, ack: &AckRepr) -> Option<Duration> {
        if ack.echo_tx_time_ns == 0 || ack.echo_tx_time_ns > now.as_nanos() {
            return None;
        }
        let raw = now.saturating_duration_since(Instant::from_nanos(ack.echo_tx_time_ns));
        let sample = raw.saturating_sub(Duration::from_nanos(ack.ack_delay_ns as u64));
        if sample.is_zero() {
            return None;
        }
        self.rtt.on_sample(sample);
        if let Some(p) = self.paths.get_mut(path) {
            p.rtt.on_sample(sample);
        }
        Some(sample)
    }

    pub(super) fn note_losses(&mut self, now: Instant, path: PathId, packets: u64, bytes: u64, timeout: bool) {
        self.stats.packets_lost += packets;
        self.selector.on_feedback(path, false);
        for _ in 0..packets {
            self.paths.on_lost(path);
        }
        // A timeout while other paths still deliver is a path problem, not congestion collapse.
        let others_alive = self.last_ack_at.is_some_and(|t| now.saturating_duration_since(t) < self.rtt.rto());
        if timeout && !others_alive {
            self.cc.on_rto(now);
        } else {
            self.cc.on_loss(&LossEvent {
                now,
                path,
                lost_bytes: bytes,
                lost_packets: packets,
                bytes_in_flight: self.send.bytes_in_flight(),
                rtt_smoothed: self.rtt.smoothed(),
            });
        }
    }

    /// Packets that outlived their path's RTO are lost; repeated timeouts quarantine the path.
    /// Visits only the paths whose deadline has come, earliest first.
    pub(super) fn handle_loss_timeouts(&mut self, now: Instant, events: &mut VecDeque<Event>) {
        // Each pass moves one path's deadline past `now` or clears it; the bound only guards
        // against a deadline that does not move (a bug), which would otherwise spin here.
        for _ in 0..=self.paths.len() {
            // The root first (kept beside the tree): most passes find nothing due, and finding
            // the path walks the tree's cold lines.
            if self.loss_deadlines.earliest_at().is_none_or(|due| due > now) {
                break;
            }
            let Some((path, _)) = self.loss_deadlines.earliest() else { break };
            self.handle_path_timeout(now, path, events);
            self.refresh_path_timer(path);
        }
    }

    fn handle_path_timeout(&mut self, now: Instant, path: PathId, events: &mut VecDeque<Event>) {
        let Some(rto) = self.paths.rto(path, self.config.rto_min, self.config.rto_max) else { return };
        let (packets, bytes) = self.send.detect_timeouts(path, now, rto);
        if packets == 0 {
            return;
        }
        self.note_losses(now, path, packets, bytes, true);
        let quarantined =
            self.paths.on_timeout(now, path, self.config.quarantine_after_timeouts, self.config.probe_interval);
        if quarantined {
            // Everything still in flight on a dead path is lost: resend it elsewhere now
            // rather than after the path's backed-off timeout.
            let (stranded, _) = self.send.detect_timeouts(path, now, Duration::ZERO);
            if stranded > 0 {
                self.stats.packets_lost += stranded;
                for _ in 0..stranded {
                    self.paths.on_lost(path);
                }
            }
            events.push_back(Event::PathQuarantined { conn: self.id, path });
            if self.chunk.is_some_and(|c| c.path == path) {
                self.chunk = None;
            }
        }
    }

    /// When the oldest packet of some path times out.
    pub(super) fn earliest_loss_timeout(&self) -> Option<Instant> {
        self.loss_deadlines.earliest_at()
    }
}

/// When `packet`, just resolved by `ack`, had been declared lost wrongly: the send time of the
/// transmission that arrived after all. Two cases show it:
/// - it was still waiting for its retransmission (`lost`): its only transmission was
///   acknowledged;
/// - it was retransmitted, and the acknowledgement echoes it with an earlier transmit time than
///   the retransmission's (the receiver got the first copy; the echo is our own clock's value).
///
/// After a timeout either means a late acknowledgement, which the paths' RTO floor learns; after
/// reordering within a path the time taken is about an RTT, under any floor that matters.
fn spurious_loss(psn: Psn, packet: &SentPacket, ack: &AckRepr) -> Option<Instant> {
    if packet.lost {
        return Some(packet.sent_at);
    }
    let echoes_an_earlier_copy = psn == ack.echo_psn
        && packet.transmissions > 1
        && ack.echo_tx_time_ns != 0
        && ack.echo_tx_time_ns < packet.sent_at.as_nanos();
    echoes_an_earlier_copy.then(|| Instant::from_nanos(ack.echo_tx_time_ns))
}
