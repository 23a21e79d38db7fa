//! The receiver's credit pacer (EQDS): one per receiving NIC, owned by the [`Endpoint`].
//!
//! Senders that run a receiver-driven policy ask for credit implicitly (each arriving packet
//! flagged "wants more" asks for its own bytes again: the pull clock), with a NACK (a trimmed
//! header: resend exactly that packet), or explicitly with an Rts. The pacer turns those
//! requests into grants at `rate_fraction` of the NIC's line rate, counted in wire bytes (payload
//! plus per-packet overhead), so the data the grants release arrives just below what the NIC can
//! drain and the queue in front of it stays empty however many senders there are.
//!
//! Order: retransmission requests (NACKs) first, round robin over the senders that have some
//! (one packet each per turn, a sender's own oldest first, so a sender with a few trimmed
//! packets is not stuck behind one with thousands); then round robin over the active senders,
//! one quantum each. A sender whose demand is met moves to the idle list. Every list
//! is bounded: [`CreditConfig::senders_max`], [`CreditConfig::nack_queue_max`],
//! [`CreditConfig::idle_senders_max`]; what does not fit is refused and counted (the sender's Rts
//! timer recovers it). Time comes only from the `now` arguments.
//!
//! [`Endpoint`]: crate::Endpoint

#[cfg(test)]
mod tests;

use crate::config::{CreditConfig, PacerOrder};
use crate::ids::{ConnectionId, Psn};
use crate::time::Instant;
use core::time::Duration;
use std::collections::{BTreeMap, VecDeque};

/// One grant to send to a sender: `credit_bytes` of permission, and the packet to resend first.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub conn: ConnectionId,
    pub credit_bytes: u32,
    pub nack: Option<Psn>,
}

/// Counters of the pacer, readable at run time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PacerStats {
    pub grants: u64,
    pub credit_granted_bytes: u64,
    pub nacks_granted: u64,
    pub rts_received: u64,
    /// Requests refused because a list was full.
    pub requests_refused: u64,
    /// Pacing time lost because a grant that was due (with work waiting since the previous
    /// grant) was polled late: the pacer does not bank idle time, so a driver that polls late
    /// loses rate. Nanoseconds.
    pub grant_late_ns: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum List {
    Active,
    Idle,
}

#[derive(Clone, Debug)]
struct Sender {
    /// Bytes asked for and not yet granted.
    demand_bytes: u64,
    /// Bytes of the sender's current message still to come, from its latest packet (the
    /// shortest-remaining-first order's key; `u64::MAX` until a packet said).
    remaining_bytes: u64,
    /// Credit granted and not yet seen back as arriving data (grants minus pull demand,
    /// saturating): what the sender can still send for its message without another grant.
    credit_out_bytes: u64,
    list: List,
    /// The pull headroom of the current busy period was added.
    headroom_given: bool,
}

/// The credit pacer of one receiving NIC.
#[derive(Clone, Debug)]
pub struct CreditPacer {
    config: CreditConfig,
    /// Payload bytes per full packet, to charge per-packet overhead.
    mss_bytes: u32,
    senders: BTreeMap<ConnectionId, Sender>,
    /// Round-robin order of senders with demand.
    active: VecDeque<ConnectionId>,
    /// Senders with no demand, oldest first (evicted first when the table is full).
    idle: VecDeque<ConnectionId>,
    /// Senders with retransmission requests, in service order (served before any new credit).
    rtx: VecDeque<ConnectionId>,
    /// Each such sender's requests: (packet, payload bytes), oldest first.
    rtx_requests: BTreeMap<ConnectionId, VecDeque<(Psn, u32)>>,
    /// Requests held over all senders (bounded by `nack_queue_max`).
    rtx_count: usize,
    /// No grant before this instant (the pacing clock).
    next_grant_at: Instant,
    /// The latest grant left work waiting (so any delay of the next one is lost rate).
    work_left_after_grant: bool,
    /// New-data grants since the last round-robin turn of the shortest-remaining order.
    grants_since_fair_turn: u64,
    stats: PacerStats,
}

impl CreditPacer {
    /// A pacer for a NIC whose data packets carry at most `mss_bytes` of payload.
    pub fn new(config: CreditConfig, mss_bytes: u32) -> Self {
        CreditPacer {
            config,
            mss_bytes: mss_bytes.max(1),
            senders: BTreeMap::new(),
            active: VecDeque::new(),
            idle: VecDeque::new(),
            rtx: VecDeque::new(),
            rtx_requests: BTreeMap::new(),
            rtx_count: 0,
            next_grant_at: Instant::ZERO,
            work_left_after_grant: false,
            grants_since_fair_turn: 0,
            stats: PacerStats::default(),
        }
    }

    pub fn stats(&self) -> &PacerStats {
        &self.stats
    }

    /// Senders with demand, in service order.
    pub fn active_len(&self) -> usize {
        self.active.len()
    }

    /// Senders known without demand.
    pub fn idle_len(&self) -> usize {
        self.idle.len()
    }

    /// Retransmission requests waiting.
    pub fn rtx_len(&self) -> usize {
        self.rtx_count
    }

    /// Bytes asked for by `conn` and not yet granted.
    pub fn demand_bytes(&self, conn: ConnectionId) -> u64 {
        self.senders.get(&conn).map_or(0, |s| s.demand_bytes)
    }

    /// Whether a grant is waiting for its turn.
    pub fn has_work(&self) -> bool {
        !self.rtx.is_empty() || !self.active.is_empty()
    }

    /// When the next grant may go, if any is waiting.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.has_work().then_some(self.next_grant_at)
    }

    /// `conn` asks for `bytes` more (a packet that wants more arrived). `new_period`: the packet
    /// is newer than the one that ended the sender's last busy period, so the period's headroom
    /// may be granted (a straggler reordered past the end must not re-grant it).
    pub fn add_demand(&mut self, conn: ConnectionId, bytes: u64, new_period: bool) {
        if bytes == 0 {
            return;
        }
        let cap = self.config.demand_bytes_max;
        let headroom = self.config.pull_headroom_bytes;
        if let Some(sender) = self.sender_mut(conn) {
            let extra = if sender.headroom_given || !new_period { 0 } else { headroom };
            sender.headroom_given |= new_period;
            sender.credit_out_bytes = sender.credit_out_bytes.saturating_sub(bytes);
            sender.demand_bytes = sender.demand_bytes.saturating_add(bytes).saturating_add(extra).min(cap);
            self.activate(conn);
        }
    }

    /// `conn`'s latest packet said `bytes` of its current message are still to come (ordering
    /// only: demand is what the pull clock and Rts ask for).
    pub fn set_remaining(&mut self, conn: ConnectionId, bytes: u64) {
        if let Some(sender) = self.senders.get_mut(&conn) {
            sender.remaining_bytes = bytes;
        }
    }

    /// `conn` said it has nothing more waiting (a packet without "wants more" arrived): its
    /// busy period is over, so no demand is left to grant (its next period gets headroom again).
    pub fn clear_demand(&mut self, conn: ConnectionId) {
        let Some(sender) = self.senders.get_mut(&conn) else { return };
        sender.demand_bytes = 0;
        sender.credit_out_bytes = 0;
        sender.headroom_given = false;
        if sender.list == List::Active {
            sender.list = List::Idle;
            self.active.retain(|&c| c != conn);
            self.idle.push_back(conn);
            self.trim_idle();
        }
    }

    /// `conn` sent an Rts announcing `backlog_bytes`: make sure at least part of it is asked for
    /// (the packets whose arrival would have asked were lost).
    pub fn on_rts(&mut self, conn: ConnectionId, backlog_bytes: u64) {
        self.stats.rts_received += 1;
        let want = backlog_bytes.min(self.config.rts_demand_max_bytes);
        if want == 0 {
            return;
        }
        if let Some(sender) = self.sender_mut(conn) {
            sender.demand_bytes = sender.demand_bytes.max(want);
            self.activate(conn);
        }
    }

    /// A trimmed header of `conn`'s packet `psn` (`bytes` of payload) arrived: ask for exactly
    /// that packet again, ahead of new data.
    pub fn add_nack(&mut self, conn: ConnectionId, psn: Psn, bytes: u32) {
        if self.rtx_count >= self.config.nack_queue_max {
            self.stats.requests_refused += 1;
            return;
        }
        let queue = self.rtx_requests.entry(conn).or_default();
        if queue.is_empty() {
            self.rtx.push_back(conn);
        }
        queue.push_back((psn, bytes));
        self.rtx_count += 1;
    }

    /// Forgets a connection that ended.
    pub fn remove(&mut self, conn: ConnectionId) {
        if self.senders.remove(&conn).is_some() {
            self.active.retain(|&c| c != conn);
            self.idle.retain(|&c| c != conn);
        }
        if let Some(queue) = self.rtx_requests.remove(&conn) {
            self.rtx_count -= queue.len();
            self.rtx.retain(|&c| c != conn);
        }
    }

    /// The next grant, if one is due at `now`.
    pub fn poll_grant(&mut self, now: Instant) -> Option<Grant> {
        if now < self.next_grant_at || !self.has_work() {
            return None;
        }
        let grant = if let Some(conn) = self.next_rtx() {
            let queue = self.rtx_requests.get_mut(&conn)?;
            let (psn, bytes) = queue.pop_front()?;
            self.rtx_count -= 1;
            if queue.is_empty() {
                self.rtx_requests.remove(&conn);
            } else {
                self.rtx.push_back(conn);
            }
            self.stats.nacks_granted += 1;
            Grant { conn, credit_bytes: bytes, nack: Some(psn) }
        } else {
            let conn = self.next_active()?;
            // At least one full packet, so one grant always lets the sender send.
            let quantum = self.config.grant_quantum_bytes.max(self.mss_bytes) as u64;
            let sender = self.senders.get_mut(&conn)?;
            let bytes = sender.demand_bytes.min(quantum);
            sender.demand_bytes -= bytes;
            sender.credit_out_bytes = sender.credit_out_bytes.saturating_add(bytes);
            if sender.demand_bytes > 0 {
                self.active.push_back(conn);
            } else {
                sender.list = List::Idle;
                self.idle.push_back(conn);
                self.trim_idle();
            }
            Grant { conn, credit_bytes: bytes as u32, nack: None }
        };
        self.stats.grants += 1;
        self.stats.credit_granted_bytes += grant.credit_bytes as u64;
        // The pacing clock: never banks idle time, so a burst of requests after a quiet spell
        // gets one grant now and the rest at the rate.
        if self.work_left_after_grant {
            self.stats.grant_late_ns += now.saturating_duration_since(self.next_grant_at).as_nanos() as u64;
        }
        let start = self.next_grant_at.max(now);
        self.next_grant_at = start + self.grant_duration(grant.credit_bytes);
        self.work_left_after_grant = self.has_work();
        Some(grant)
    }

    /// The sender whose retransmission request goes next, taken off the list: round robin, or
    /// under [`PacerOrder::ShortestRemaining`] the sender with the least left of its message
    /// (a short message's trimmed packet is all that stands between it and completion).
    fn next_rtx(&mut self) -> Option<ConnectionId> {
        if self.config.order != PacerOrder::ShortestRemaining || self.rtx.len() < 2 {
            return self.rtx.pop_front();
        }
        let key = |c: &ConnectionId| self.senders.get(c).map_or(u64::MAX, |s| s.remaining_bytes);
        let (index, _) = self.rtx.iter().enumerate().min_by_key(|&(i, c)| (key(c), i))?;
        self.rtx.remove(index)
    }

    /// The active sender whose turn it is, taken off the active list: the head of the round
    /// robin, or under [`PacerOrder::ShortestRemaining`] the sender closest to the end of its
    /// message, except every `fair_grant_every`-th new-data grant, which goes to the
    /// round-robin head so that no sender starves behind a stream of short messages.
    fn next_active(&mut self) -> Option<ConnectionId> {
        let srpt = self.config.order == PacerOrder::ShortestRemaining && self.active.len() > 1;
        self.grants_since_fair_turn += 1;
        let fair_turn = self.config.fair_grant_every > 0 && self.grants_since_fair_turn >= self.config.fair_grant_every;
        if fair_turn {
            self.grants_since_fair_turn = 0;
        }
        if !srpt || fair_turn {
            return self.active.pop_front();
        }
        // A sender whose outstanding credit already covers the rest of its message needs no
        // more for it (its pull demand is the loop's headroom, wasted if granted first): last.
        let key = |c: &ConnectionId| {
            self.senders.get(c).map_or(u64::MAX, |s| {
                let allowed = s.remaining_bytes.saturating_add(self.config.srpt_beyond_message_bytes);
                if s.credit_out_bytes < allowed {
                    s.remaining_bytes.saturating_sub(s.credit_out_bytes)
                } else {
                    u64::MAX
                }
            })
        };
        // First minimum in round-robin order, so equal keys still take turns.
        let (index, _) = self.active.iter().enumerate().min_by_key(|&(i, c)| (key(c), i))?;
        self.active.remove(index)
    }

    /// Time the NIC needs to receive what `credit_bytes` releases, at the paced rate.
    fn grant_duration(&self, credit_bytes: u32) -> Duration {
        let packets = (credit_bytes.max(1)).div_ceil(self.mss_bytes) as u64;
        let wire = credit_bytes as u64 + packets * self.config.wire_overhead_bytes_per_packet as u64;
        let rate = (self.config.line_rate_bytes_per_sec as f64 * self.config.rate_fraction).max(1.0);
        Duration::from_nanos((wire as f64 * 1e9 / rate).ceil() as u64)
    }

    /// The sender's entry, created (on the idle list) if the table has room.
    fn sender_mut(&mut self, conn: ConnectionId) -> Option<&mut Sender> {
        if !self.senders.contains_key(&conn) {
            if self.senders.len() >= self.config.senders_max {
                // Make room by forgetting the longest-idle sender, if any.
                match self.idle.pop_front() {
                    Some(old) => {
                        self.senders.remove(&old);
                    }
                    None => {
                        self.stats.requests_refused += 1;
                        return None;
                    }
                }
            }
            self.senders.insert(
                conn,
                Sender {
                    demand_bytes: 0,
                    remaining_bytes: u64::MAX,
                    credit_out_bytes: 0,
                    list: List::Idle,
                    headroom_given: false,
                },
            );
            self.idle.push_back(conn);
        }
        self.senders.get_mut(&conn)
    }

    /// Moves `conn` (which has demand) from idle to the back of the active list.
    fn activate(&mut self, conn: ConnectionId) {
        let Some(sender) = self.senders.get_mut(&conn) else { return };
        if sender.list == List::Idle && sender.demand_bytes > 0 {
            sender.list = List::Active;
            self.idle.retain(|&c| c != conn);
            self.active.push_back(conn);
        }
    }

    fn trim_idle(&mut self) {
        while self.idle.len() > self.config.idle_senders_max {
            if let Some(old) = self.idle.pop_front() {
                self.senders.remove(&old);
            }
        }
    }

    /// The pacer's own invariants: lists partition the table and stay within their bounds.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.active.len() + self.idle.len() != self.senders.len() {
            return Err(format!(
                "pacer lists hold {} + {} senders, table {}",
                self.active.len(),
                self.idle.len(),
                self.senders.len()
            ));
        }
        let held: usize = self.rtx_requests.values().map(VecDeque::len).sum();
        if held != self.rtx_count || self.rtx.len() != self.rtx_requests.len() {
            return Err(format!("pacer holds {held} NACKs of {} senders, counted {}", self.rtx.len(), self.rtx_count));
        }
        if self.senders.len() > self.config.senders_max || self.rtx_count > self.config.nack_queue_max {
            return Err("pacer over its bounds".into());
        }
        if self.active.iter().any(|c| self.senders.get(c).is_none_or(|s| s.demand_bytes == 0 || s.list != List::Active))
        {
            return Err("an active sender without demand".into());
        }
        Ok(())
    }
}
