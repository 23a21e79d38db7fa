//! A connection's part in receiver-driven congestion control (EQDS), both halves:
//! * receiving: turn arriving packets that want more into pull demand, trimmed headers into
//!   NACK requests, and Rts packets into demand, all handed to the endpoint's credit pacer
//!   ([`crate::credit::CreditPacer`]) by [`Connection::drain_credit_requests`]; emit the grants
//!   the pacer picks for this connection;
//! * sending: take credit and NACKs, and send an Rts when backlog waits for credit too long.
//!
//! A trimmed header from a sender-driven peer is NACKed at once, without credit: it still
//! saves that sender a timeout.

use super::Connection;
use crate::api::{Event, RxMeta, Transmit};
use crate::cc::CongestionControl;
use crate::credit::{CreditPacer, Grant};
use crate::ids::{PathId, Psn};
use crate::recv::PsnClass;
use crate::time::Instant;
use crate::wire::{CreditRepr, DataRepr, Repr, RtsRepr};
use std::collections::VecDeque;

/// NACKs for sender-driven peers queued at most (more are dropped; the peer's own loss
/// detection covers them).
const NACKS_OUT_MAX: usize = 256;
/// NACK requests held between two drains by the endpoint (it drains after every datagram).
const NACK_REQUESTS_MAX: usize = 64;

/// Receiver-driven state of one connection.
#[derive(Debug, Default)]
pub(super) struct CreditState {
    /// Receiver: bytes of pull demand not yet handed to the pacer.
    pull_bytes: u64,
    /// Receiver: the peer's latest packet said it has nothing more waiting.
    pull_done: bool,
    /// Receiver: the pull demand comes from packets newer than the one that ended the peer's
    /// last busy period (see `done_psn`).
    pull_new_period: bool,
    /// Receiver: packet number of the first transmission that ended the peer's last busy
    /// period.
    done_psn: Option<Psn>,
    /// Receiver: trimmed packets of a receiver-driven peer, for the pacer's retransmission list.
    nack_requests: VecDeque<(Psn, u32)>,
    /// Receiver: backlog announced by the peer's latest Rts, for the pacer.
    rts_backlog: Option<u64>,
    /// Receiver: bytes of the peer's current message still to come, from its newest packet
    /// for the pacer's shortest-remaining order; taken by the drain.
    remaining: Option<u64>,
    /// Receiver: packet number the latest `remaining` came from (older packets do not update it).
    remaining_psn: Option<Psn>,
    /// Receiver: NACKs owed to a sender-driven peer, sent at once.
    nacks_out: VecDeque<Psn>,
    /// Receiver: path of the latest data packet; credit goes back on it.
    last_data_path: PathId,
    /// Sender: since when a packet has waited for credit (cleared by credit or a send).
    blocked_since: Option<Instant>,
    /// Sender: latest credit received or Rts sent (the Rts timer restarts from it).
    last_credit_or_rts_at: Option<Instant>,
    /// Receiver: number of the last Credit frame sent.
    seq_out: u32,
    /// Sender: which Credit frame numbers were acted on.
    seen: ReplayWindow,
}

/// Anti-replay window over Credit frame numbers: the highest seen and a bitmap of the 64 below
/// it. A number above the highest, or inside the window and not seen, is fresh; anything else
/// (seen, or older than the window, or 0) is a duplicate or replay. A legitimate frame delayed
/// past 64 newer ones is refused too: a lost grant, which the Rts timer repairs.
#[derive(Clone, Copy, Debug, Default)]
struct ReplayWindow {
    highest: u32,
    seen: u64,
}

impl ReplayWindow {
    fn accept(&mut self, seq: u32) -> bool {
        let ahead = seq.wrapping_sub(self.highest) as i32;
        if seq == 0 {
            return false;
        }
        if ahead > 0 {
            self.seen = if ahead >= 64 { 0 } else { self.seen << ahead };
            self.seen |= 1;
            self.highest = seq;
            return true;
        }
        let back = self.highest.wrapping_sub(seq);
        if back >= 64 || self.seen & (1 << back) != 0 {
            return false;
        }
        self.seen |= 1 << back;
        true
    }
}

impl Connection {
    // ---- receiving side ----

    /// Every data packet, before it is classified: a receiver-driven packet that wants more
    /// asks for its bytes again (rounded up to whole packets, so credit never strands a
    /// fraction of a packet).
    pub(super) fn note_data_for_credit(&mut self, rx: RxMeta, data: &DataRepr) {
        self.credit.last_data_path = rx.path;
        if data.receiver_driven && self.credit.remaining_psn.is_none_or(|seen| data.psn > seen) {
            // The parser proved msg_offset + payload_len <= msg_len.
            let left = data.msg_len.saturating_sub(data.msg_offset + data.payload_len as u64);
            self.credit.remaining_psn = Some(data.psn);
            self.credit.remaining = Some(left);
        }
        if data.receiver_driven && data.wants_more {
            let mss = self.config.mss_bytes() as u64;
            let bytes = (data.payload_len as u64).max(1).div_ceil(mss) * mss;
            self.credit.pull_bytes = self.credit.pull_bytes.saturating_add(bytes);
            self.credit.pull_done = false;
            if self.credit.done_psn.is_none_or(|done| data.psn > done) {
                self.credit.pull_new_period = true;
            }
        } else if data.receiver_driven && !data.retransmission {
            self.credit.done_psn = Some(self.credit.done_psn.map_or(data.psn, |d| d.max(data.psn)));
            // The sender's last new packet: nothing more waits (a retransmission's flag can be
            // stale, so only a first transmission ends the busy period).
            self.credit.pull_bytes = 0;
            self.credit.pull_done = true;
        }
    }

    /// A data header whose payload a switch trimmed. Nothing is placed; a packet not yet
    /// received is NACKed: through the pacer (with credit for it) for a receiver-driven sender,
    /// at once otherwise.
    pub(crate) fn handle_trimmed(&mut self, rx: RxMeta, data: &DataRepr) {
        if !self.is_established() || rx.path.0 as usize >= self.paths.len() {
            self.stats.packets_dropped += 1;
            return;
        }
        self.stats.trimmed_received += 1;
        self.credit.last_data_path = rx.path;
        if self.recv.classify(data.psn) != PsnClass::New {
            return;
        }
        if data.receiver_driven {
            if self.credit.nack_requests.len() < NACK_REQUESTS_MAX {
                self.credit.nack_requests.push_back((data.psn, data.payload_len as u32));
            }
        } else if self.credit.nacks_out.len() < NACKS_OUT_MAX {
            self.credit.nacks_out.push_back(data.psn);
        }
    }

    /// The peer asks to send `rts.backlog_bytes`.
    pub(crate) fn handle_rts(&mut self, rts: &RtsRepr) {
        if self.is_established() {
            self.stats.rts_received += 1;
            self.credit.rts_backlog = Some(rts.backlog_bytes);
        }
    }

    /// Hands what this connection's peer asked for to the endpoint's pacer.
    pub(crate) fn drain_credit_requests(&mut self, pacer: &mut CreditPacer) {
        let c = &mut self.credit;
        if c.pull_done {
            pacer.clear_demand(self.id);
            c.pull_done = false;
        }
        if c.pull_bytes > 0 {
            pacer.add_demand(self.id, c.pull_bytes, c.pull_new_period);
            c.pull_bytes = 0;
            c.pull_new_period = false;
        }
        while let Some((psn, bytes)) = c.nack_requests.pop_front() {
            pacer.add_nack(self.id, psn, bytes);
        }
        if let Some(backlog) = c.rts_backlog.take() {
            pacer.on_rts(self.id, backlog);
        }
        // After the demand, which creates the pacer's entry for a new sender.
        if let Some(left) = c.remaining.take() {
            pacer.set_remaining(self.id, left);
        }
    }

    /// Writes the Credit packet of a grant the pacer chose for this connection.
    pub(crate) fn emit_grant(&mut self, grant: &Grant, buf: &mut [u8]) -> Option<Transmit> {
        if !self.is_established() {
            return None;
        }
        let header = self.peer_header()?;
        self.stats.credit_sent_bytes += grant.credit_bytes as u64;
        let seq = self.next_credit_seq();
        let repr = Repr::Credit(CreditRepr { credit_bytes: grant.credit_bytes, nack: grant.nack, seq });
        self.emit_control(&header, &repr, self.credit.last_data_path, buf)
    }

    /// Number for the next Credit frame (from 1; 0 is never sent).
    fn next_credit_seq(&mut self) -> u32 {
        self.credit.seq_out = self.credit.seq_out.wrapping_add(1).max(1);
        self.credit.seq_out
    }

    // ---- sending side ----

    /// Credit (and perhaps a NACK) from the peer's pacer.
    pub(crate) fn handle_credit(&mut self, now: Instant, credit: &CreditRepr, _events: &mut VecDeque<Event>) {
        if !self.is_established() {
            return;
        }
        if !self.credit.seen.accept(credit.seq) {
            // A duplicate or a replay: it granted (or NACKed) once already.
            self.stats.stale_frames += 1;
            return;
        }
        if let Some(psn) = credit.nack {
            if let Some((path, bytes)) = self.send.nack(psn) {
                self.stats.nacks_received += 1;
                self.note_losses(now, path, 1, bytes as u64, false);
                // The NACKed packet left the path's flight: its loss deadline moves.
                self.refresh_path_timer(path);
            } else if credit.credit_bytes == 0 {
                // A NACK of nothing in flight (resolved, already lost, never sent): stale.
                self.stats.stale_frames += 1;
                return;
            }
        }
        if credit.credit_bytes > 0 {
            self.stats.credit_received_bytes += credit.credit_bytes as u64;
            self.cc.on_credit(now, credit.credit_bytes as u64);
        }
        self.credit.blocked_since = None;
        self.credit.last_credit_or_rts_at = Some(now);
    }

    /// Whether the receiver-driven budget covers a packet of `len` bytes; notes when a packet
    /// starts waiting for credit (the Rts timer runs from then).
    pub(super) fn credit_allows(&mut self, now: Instant, len: u32) -> bool {
        match self.cc.send_allowance_bytes() {
            None => true,
            Some(allowance) if allowance >= len as u64 => true,
            Some(_) => {
                self.credit.blocked_since.get_or_insert(now);
                false
            }
        }
    }

    /// A data packet left: spend its bytes.
    pub(super) fn on_data_sent(&mut self, now: Instant, len: u32) {
        self.cc.on_sent(now, len);
        self.credit.blocked_since = None;
    }

    /// When the Rts is due: the rts timeout after a packet started waiting for credit (or
    /// after the latest credit or Rts, whichever is later).
    pub(super) fn rts_deadline(&self) -> Option<Instant> {
        let timeout = self.cc.rts_timeout()?;
        let since = self.credit.blocked_since?;
        let base = self.credit.last_credit_or_rts_at.map_or(since, |t| t.max(since));
        Some(base + timeout)
    }

    /// NACKs owed to a sender-driven peer, then an Rts if one is due.
    pub(super) fn poll_credit_control(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if let Some(psn) = self.credit.nacks_out.pop_front() {
            let header = self.peer_header()?;
            let seq = self.next_credit_seq();
            let repr = Repr::Credit(CreditRepr { credit_bytes: 0, nack: Some(psn), seq });
            return self.emit_control(&header, &repr, self.credit.last_data_path, buf);
        }
        let due = self.rts_deadline()?;
        if now < due {
            return None;
        }
        let backlog = self.ops.unsent_bytes() + self.send.retransmit_bytes();
        if backlog == 0 {
            self.credit.blocked_since = None;
            return None;
        }
        let header = self.peer_header()?;
        self.credit.last_credit_or_rts_at = Some(now);
        self.stats.rts_sent += 1;
        let path = self.rts_path();
        self.emit_control(&header, &Repr::Rts(RtsRepr { backlog_bytes: backlog }), path, buf)
    }

    /// The path for the next Rts: the receiver needs only one, but the path data last came in
    /// on may since have died (a cut with nothing in flight is never noticed by a timeout), and
    /// every Rts sent into it was lost: the sender then waited for credit forever. So each Rts
    /// after the first goes on the next path in turn, quarantined ones skipped while any other
    /// is active.
    fn rts_path(&self) -> PathId {
        let count = self.paths.len().max(1) as u64;
        let first = self.credit.last_data_path.0 as u64;
        let active = |p: PathId| self.paths.get(p).is_some_and(|s| s.is_active());
        let sent_before = self.stats.rts_sent.saturating_sub(1);
        let turn = |k: u64| PathId(((first + sent_before + k) % count) as u16);
        (0..count).map(turn).find(|&p| active(p)).unwrap_or(turn(0))
    }

    /// Tells a receiver-driven policy the connection went idle (nothing to send or resolve).
    pub(super) fn note_idle_if_done(&mut self, now: Instant) {
        if !self.send.has_unresolved() && !self.ops.has_new_data() {
            self.cc.on_idle(now);
            self.credit.blocked_since = None;
        }
    }
}

#[cfg(test)]
mod replay_window_tests {
    use super::ReplayWindow;

    #[test]
    fn each_number_is_accepted_once_in_any_order_within_the_window() {
        let mut w = ReplayWindow::default();
        assert!(!w.accept(0), "0 is never sent");
        for seq in [1, 3, 2, 5, 4] {
            assert!(w.accept(seq), "{seq} first time");
        }
        for seq in 1..=5 {
            assert!(!w.accept(seq), "{seq} again");
        }
        assert!(w.accept(100));
        assert!(!w.accept(36), "older than the window");
        assert!(w.accept(37), "inside the window, unseen");
        assert!(!w.accept(37));
        let mut wrap = ReplayWindow { highest: u32::MAX, seen: 1 };
        assert!(wrap.accept(1), "numbers wrap");
        assert!(!wrap.accept(u32::MAX));
    }
}
