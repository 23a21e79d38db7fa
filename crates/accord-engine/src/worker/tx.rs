//! The transmit side of a worker: polls the endpoint into an arena, gathers payload bytes, merges
//! runs of equal-size datagrams to the same destination into one GSO send, and sends in batches,
//! keeping what the socket had no room for.
//!
//! A datagram to a peer reached through shared memory is instead assembled in place in the ring
//! (`Datapath::send_direct`): header and payload are written where the receiver reads them,
//! one copy fewer. That happens only while nothing for the same destination waits in the
//! arena, so datagrams to one peer keep their order.

use super::stats::LaneStats;
use accord_net::{Datapath, DirectSend, TxDatagram};
use accord_proto::{Endpoint, Instant, Transmit};
use std::net::SocketAddr;

/// Most datagrams polled per batch (fewer when large: see `BATCH_BYTES_TARGET`).
pub const TX_BATCH_DATAGRAMS: usize = 64;
/// Batches sent per worker loop turn, so receiving is never starved.
pub const TX_BATCHES_PER_TURN_MAX: usize = 8;

struct Group {
    start: usize,
    len: usize,
    segment_len: usize,
    count: usize,
    closed: bool,
    path: u16,
    dst: SocketAddr,
    ecn: bool,
}

pub(crate) struct TxQueue {
    datagram_max: usize,
    batch_datagrams: usize,
    arena: Vec<u8>,
    groups: Vec<Group>,
    sent: usize,
}

impl TxQueue {
    pub(crate) fn new(datagram_max: usize) -> Self {
        let batch_datagrams = (super::BATCH_BYTES_TARGET / datagram_max.max(1)).clamp(8, TX_BATCH_DATAGRAMS);
        TxQueue {
            datagram_max,
            batch_datagrams,
            arena: vec![0u8; batch_datagrams * datagram_max],
            groups: vec![],
            sent: 0,
        }
    }

    /// Whether datagrams wait for socket room.
    pub(crate) fn is_empty(&self) -> bool {
        self.sent >= self.groups.len()
    }

    /// Sends what is pending, then polls and sends more. `route` names a transmit's destination
    /// (None drops it); `gather` copies its payload into the slice (false drops it).
    pub(crate) fn fill_and_send(
        &mut self,
        now: Instant,
        ep: &mut Endpoint,
        dp: &mut dyn Datapath,
        stats: &mut LaneStats,
        route: impl Fn(&Transmit) -> Option<SocketAddr>,
        mut gather: impl FnMut(&Transmit, &mut [u8]) -> bool,
    ) -> bool {
        let caps = dp.caps();
        let mut progress = false;
        for _ in 0..TX_BATCHES_PER_TURN_MAX {
            if !self.is_empty() {
                let batch: Vec<TxDatagram<'_>> = self.groups[self.sent..]
                    .iter()
                    .map(|g| TxDatagram {
                        path: g.path,
                        dst: g.dst,
                        bytes: &self.arena[g.start..g.start + g.len],
                        segment_bytes: (g.count > 1).then_some(g.segment_len as u16),
                        ecn_capable: g.ecn,
                    })
                    .collect();
                match dp.send_batch(&batch) {
                    Ok(n) => {
                        progress |= n > 0;
                        self.sent += n;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "send failed; dropping the batch (the protocol retransmits)");
                        stats.tx_errors += 1;
                        self.sent = self.groups.len();
                    }
                }
                if !self.is_empty() {
                    return progress;
                }
            }
            self.groups.clear();
            self.sent = 0;
            let mut pos = 0;
            let mut direct_sent = false;
            for _ in 0..self.batch_datagrams {
                let slot = &mut self.arena[pos..pos + self.datagram_max];
                let Some(t) = ep.poll_transmit(now, slot) else { break };
                let Some(dst) = route(&t) else {
                    stats.tx_no_route += 1;
                    continue;
                };
                // A ring of this job needs only the header sealed (see `for_local_channel`).
                let t = if dp.is_local_channel(dst) { t.for_local_channel() } else { t };
                let len = t.datagram_len();
                let payload_end = t.payload_end();
                let path = t.path.0;
                if !self.groups.iter().any(|g| g.dst == dst) {
                    let header = &slot[..t.header_len];
                    let mut fill = |buf: &mut [u8]| {
                        buf[..header.len()].copy_from_slice(header);
                        let gathered = gather(&t, &mut buf[header.len()..payload_end]);
                        t.seal_payload(buf);
                        gathered
                    };
                    match dp.send_direct(path, dst, len, &mut fill) {
                        Ok(DirectSend::Sent) => {
                            direct_sent = true;
                            continue;
                        }
                        Ok(DirectSend::Cancelled) => {
                            stats.tx_no_route += 1;
                            continue;
                        }
                        Ok(DirectSend::Full | DirectSend::Unsupported) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "direct send failed; dropping the datagram (the protocol retransmits)");
                            stats.tx_errors += 1;
                            continue;
                        }
                    }
                }
                if !gather(&t, &mut slot[t.header_len..payload_end]) {
                    stats.tx_no_route += 1;
                    continue;
                }
                t.seal_payload(&mut slot[..len]);
                let merge = caps.gso_max_segments > 1
                    && self.groups.last().is_some_and(|g| {
                        !g.closed
                            && g.path == path
                            && g.dst == dst
                            && g.ecn == t.ecn_capable
                            && g.start + g.len == pos
                            && len <= g.segment_len
                            && g.len + len <= caps.max_payload_bytes
                            && g.count < usize::from(caps.gso_max_segments)
                    });
                if merge {
                    let g = self.groups.last_mut().expect("checked above");
                    g.len += len;
                    g.count += 1;
                    g.closed = len < g.segment_len;
                } else {
                    self.groups.push(Group {
                        start: pos,
                        len,
                        segment_len: len,
                        count: 1,
                        closed: false,
                        path,
                        dst,
                        ecn: t.ecn_capable,
                    });
                }
                pos += len;
            }
            if self.groups.is_empty() && !direct_sent {
                return progress;
            }
            progress = true;
        }
        progress
    }
}
