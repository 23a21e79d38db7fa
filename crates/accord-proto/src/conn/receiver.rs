//! The receiving half: validate, place, count immediates and sends, and acknowledge.

use super::{AckDue, Connection, PROBE_REPLIES_MAX};
use crate::api::{Event, LocalMemory, Placement, PlacementTarget, RxMeta, Transmit};
use crate::cc::{CongestionControl, RxDataEvent};
use crate::ids::Psn;
use crate::recv::{InboundProgress, InboundStart, PsnClass};
use crate::time::Instant;
use crate::wire::{AckRepr, DataKind, DataRepr, ProbeRepr, RejectReason, Rejection, Repr};
use core::ops::Range;
use std::collections::VecDeque;

/// What the receiver decided for one new data packet.
enum Verdict {
    Place(PlacementTarget),
    Refuse(RejectReason),
    /// Drop without acknowledging: transient (table full) or a protocol violation.
    Drop,
    /// Acknowledge without placing or counting: the operation already completed here under
    /// the same tag, over another connection (see `LocalMemory::already_completed`).
    Skip,
}

impl Connection {
    /// A data packet. Returns the copy the driver must perform, if the bytes are accepted.
    pub(crate) fn handle_data<M: LocalMemory + ?Sized>(
        &mut self,
        now: Instant,
        rx: RxMeta,
        data: &DataRepr,
        payload: Range<usize>,
        memory: &mut M,
        events: &mut VecDeque<Event>,
    ) -> Option<Placement> {
        if !self.is_established() || rx.path.0 as usize >= self.paths.len() {
            self.stats.packets_dropped += 1;
            return None;
        }
        self.stats.packets_received += 1;
        self.note_data_for_credit(rx, data);
        self.recv.advance_floor(data.ack_floor);
        match self.recv.classify(data.psn) {
            PsnClass::Below | PsnClass::Received => {
                self.stats.duplicates_received += 1;
                self.schedule_ack(now, rx, data, true);
                return None;
            }
            PsnClass::Rejected => {
                self.schedule_ack(now, rx, data, true);
                return None;
            }
            PsnClass::Beyond => {
                self.stats.packets_dropped += 1;
                return None;
            }
            PsnClass::New => {}
        }
        if rx.ecn_ce {
            self.ecn_ce_received = self.ecn_ce_received.wrapping_add(1);
            self.stats.ecn_ce_received += 1;
        }
        let hook_event = RxDataEvent { now, path: rx.path, payload_bytes: data.payload_len as u32, ecn_ce: rx.ecn_ce };
        if data.retransmission {
            self.cc.on_retransmission_received(&hook_event);
        } else {
            self.cc.on_data_received(&hook_event);
        }
        let len = data.payload_len as u64;
        match self.judge(data, memory) {
            Verdict::Drop => {
                self.stats.packets_dropped += 1;
                None
            }
            Verdict::Skip => {
                self.recv.mark_received(data.psn);
                self.stats.resent_skipped += 1;
                let immediate = self.ack_request_settled(data);
                self.schedule_ack(now, rx, data, immediate);
                None
            }
            Verdict::Refuse(reason) => {
                self.recv.mark_rejected(Rejection { psn: data.psn, op: data.op, reason });
                self.stats.packets_refused += 1;
                self.inbound.refuse(data.op, reason);
                self.schedule_ack(now, rx, data, true);
                None
            }
            Verdict::Place(target) => {
                self.recv.mark_received(data.psn);
                self.stats.bytes_placed += len;
                match self.inbound.record(data.op, len) {
                    InboundProgress::Complete(InboundStart::WriteWithImm { imm }) => {
                        events.push_back(Event::ImmReceived { conn: self.id, op: data.op, imm, tag: data.tag });
                    }
                    InboundProgress::Complete(InboundStart::Send { buffer }) => {
                        events.push_back(Event::RecvCompleted {
                            conn: self.id,
                            op: data.op,
                            buffer,
                            len: data.msg_len,
                            imm: data.imm,
                            tag: data.tag,
                        });
                    }
                    InboundProgress::Partial => {}
                }
                let immediate = self.ack_request_settled(data);
                self.schedule_ack(now, rx, data, immediate);
                Some(Placement { target, payload })
            }
        }
    }

    /// Validates a new data packet against local memory and the operation it belongs to.
    fn judge<M: LocalMemory + ?Sized>(&mut self, data: &DataRepr, memory: &mut M) -> Verdict {
        if let Some(reason) = self.inbound.refusal(data.op) {
            return Verdict::Refuse(reason);
        }
        let known = self.inbound.lookup(data.op);
        match data.kind {
            DataKind::Write { region, key, region_offset } => {
                // A resent copy of a write that completed here (its immediate counted) is
                // acknowledged before the region is looked at: the receiver may have
                // deregistered it since, and refusing would fail a write that succeeded.
                let resent = data.imm.is_some() && known.is_none() && data.tag != 0;
                if resent && memory.already_completed(data.tag) {
                    return Verdict::Skip;
                }
                // Every packet carries the whole write's range, so check all of it: a write that
                // does not fit is refused by every packet alike and places nothing, whatever
                // order its packets arrive in. (The parser proved the sums do not overflow.)
                if let Err(reason) = memory.check_write(region, key, region_offset, data.msg_len) {
                    return Verdict::Refuse(reason);
                }
                let offset = region_offset + data.msg_offset;
                if let Some(imm) = data.imm {
                    match known {
                        Some((InboundStart::WriteWithImm { imm: seen }, msg_len, tag))
                            if seen == imm && msg_len == data.msg_len && tag == data.tag => {}
                        Some(_) => return Verdict::Drop,
                        None if !self.inbound.has_room() => return Verdict::Drop,
                        None => self.inbound.start(data.op, InboundStart::WriteWithImm { imm }, data.msg_len, data.tag),
                    }
                }
                Verdict::Place(PlacementTarget::Region { region, offset })
            }
            DataKind::Send => match known {
                Some((InboundStart::Send { buffer }, msg_len, tag)) if msg_len == data.msg_len && tag == data.tag => {
                    Verdict::Place(PlacementTarget::RecvBuffer { buffer, offset: data.msg_offset })
                }
                Some(_) => Verdict::Drop,
                None if data.tag != 0 && memory.already_completed(data.tag) => Verdict::Skip,
                None if !self.inbound.has_room() => Verdict::Drop,
                None => match memory.claim_recv_buffer(self.id, data.msg_len) {
                    Ok(buffer) => {
                        self.inbound.start(data.op, InboundStart::Send { buffer }, data.msg_len, data.tag);
                        Verdict::Place(PlacementTarget::RecvBuffer { buffer, offset: data.msg_offset })
                    }
                    Err(reason) => Verdict::Refuse(reason),
                },
            },
        }
    }

    /// Whether the ACK for `data` (just placed) should go at once: the sender asked for it, or
    /// this arrival moved the cumulative point past an earlier request that arrived over a hole
    /// (see `ack_request_pending`).
    fn ack_request_settled(&mut self, data: &DataRepr) -> bool {
        let base = self.recv.base();
        if data.ack_now && data.psn >= base {
            self.ack_request_pending = Some(self.ack_request_pending.map_or(data.psn, |p| p.max(data.psn)));
        }
        match self.ack_request_pending {
            Some(pending) if base > pending => {
                self.ack_request_pending = None;
                true
            }
            _ => data.ack_now,
        }
    }

    /// Notes an ACK owed for `data`; sent at once when asked, every `ack_every_packets`, or
    /// after `ack_delay_max`.
    fn schedule_ack(&mut self, now: Instant, rx: RxMeta, data: &DataRepr, immediate: bool) {
        self.packets_since_ack = self.packets_since_ack.saturating_add(1);
        let immediate = immediate
            || self.ack_due.is_some_and(|a| a.immediate)
            || self.packets_since_ack >= self.config.ack_every_packets;
        let first_received_at = self.ack_due.map_or(now, |a| a.first_received_at);
        self.ack_due = Some(AckDue {
            psn: data.psn,
            tx_time_ns: data.tx_time_ns,
            path: rx.path,
            received_at: now,
            first_received_at,
            immediate,
        });
    }

    /// The ACK we owe, if it is due now.
    pub(super) fn poll_ack(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let due = self.ack_due?;
        if !due.immediate && now < due.first_received_at + self.config.ack_delay_max {
            return None;
        }
        let header = self.peer_header()?;
        self.ack_due = None;
        self.packets_since_ack = 0;
        let mut ack = AckRepr {
            cum_ack: 0,
            echo_psn: due.psn,
            echo_tx_time_ns: due.tx_time_ns,
            ack_delay_ns: now.saturating_duration_since(due.received_at).as_nanos().min(u32::MAX as u128) as u32,
            ecn_ce_count: self.ecn_ce_received,
            credit_bytes: 0,
            sack: Default::default(),
            rejections: Default::default(),
        };
        self.recv.fill_ack(&mut ack, Some(due.psn));
        self.stats.acks_sent += 1;
        self.emit_control(&header, &Repr::Ack(ack), due.path, buf)
    }

    /// Deadline of the ACK we owe.
    pub(super) fn ack_deadline(&self) -> Option<Instant> {
        self.ack_due.map(|a| if a.immediate { a.received_at } else { a.first_received_at + self.config.ack_delay_max })
    }

    /// A probe from the peer: answer on the path it came in on.
    pub(crate) fn handle_probe(&mut self, rx: RxMeta, probe: &ProbeRepr) {
        if rx.path.0 as usize >= self.paths.len() || self.probe_replies.len() >= PROBE_REPLIES_MAX {
            return;
        }
        self.probe_replies.push_back((rx.path, *probe));
    }

    /// Lowest packet number the receiver still waits for (for tests).
    #[allow(dead_code)]
    pub(crate) fn recv_base(&self) -> Psn {
        self.recv.base()
    }
}
