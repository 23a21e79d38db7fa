//! Output ports: a queue in front of a link, with its drop / mark / trim policy.
//!
//! A port is a work-conserving FIFO at a fixed rate, so it needs no event per queued packet:
//! when a packet is enqueued its departure is known at once (`max(now, busy_until) +
//! serialisation`) and its arrival at the far end is that plus the propagation delay. The
//! packet goes straight onto the port's `wire`, a FIFO whose arrival times never decrease
//! (linked through the packet pool, [`Wire`]), and only the head of the wire has an event in
//! the simulator's queue. The backlog a policy sees is
//! `(busy_until - now) × rate`: exactly the bytes queued or still serialising.
//!
//! Trimmed headers travel in a priority lane with its own wire and busy time. A modelling
//! shortcut: headers do not delay the data lane (a header is about 4% of a 4 KiB packet, and
//! only trimmed packets use the lane); this keeps departures computable at enqueue time.

use super::packet::{PacketPool, Wire};
use core::time::Duration;

/// Picoseconds, the resolution of serialisation arithmetic (at 400 Gbit/s a byte is 20 ps).
pub type Picos = u64;

/// What a switch output queue does when it fills.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum QueuePolicy {
    /// Drop arrivals that do not fit in the buffer.
    DropTail,
    /// Mark ECN-capable arrivals Congestion Experienced when the backlog exceeds `kmin_bytes`
    /// (with probability rising linearly to 1 at `kmax_bytes`, RED-style; equal thresholds mark
    /// as a step, DCTCP-style); drop when the buffer is full.
    Ecn { kmin_bytes: u64, kmax_bytes: u64 },
    /// Cut a data packet to its header when the backlog exceeds `threshold_bytes` and send the
    /// header in the priority lane (NDP-style); headers beyond `header_buffer_bytes` drop.
    Trim { threshold_bytes: u64, header_buffer_bytes: u64 },
}

/// A switch output queue: buffer size and policy.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct QueueConfig {
    /// Bytes of buffer per output port (framing included).
    pub capacity_bytes: u64,
    pub policy: QueuePolicy,
}

impl QueueConfig {
    /// Drop-tail with `capacity_bytes`.
    pub fn drop_tail(capacity_bytes: u64) -> Self {
        QueueConfig { capacity_bytes, policy: QueuePolicy::DropTail }
    }

    /// ECN step marking at `kmin` (fraction of capacity), dropping when full.
    pub fn ecn(capacity_bytes: u64, kmin_bytes: u64, kmax_bytes: u64) -> Self {
        QueueConfig { capacity_bytes, policy: QueuePolicy::Ecn { kmin_bytes, kmax_bytes } }
    }

    /// Trimming above `threshold_bytes`, with a header lane of `capacity_bytes / 8`.
    pub fn trim(capacity_bytes: u64, threshold_bytes: u64) -> Self {
        QueueConfig {
            capacity_bytes,
            policy: QueuePolicy::Trim { threshold_bytes, header_buffer_bytes: (capacity_bytes / 8).max(4096) },
        }
    }

    /// Parses `droptail`, `ecn` or `trim`, with thresholds as fractions of `capacity_bytes`
    /// (ECN marks from 20% to 80%; trimming from 50%).
    pub fn from_name(name: &str, capacity_bytes: u64) -> Option<Self> {
        match name.trim().to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "droptail" | "drop" => Some(Self::drop_tail(capacity_bytes)),
            "ecn" | "red" => Some(Self::ecn(capacity_bytes, capacity_bytes / 5, capacity_bytes * 4 / 5)),
            "trim" | "trimming" | "ndp" => Some(Self::trim(capacity_bytes, capacity_bytes / 2)),
            _ => None,
        }
    }
}

/// What a port decided for an arriving packet.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Queue it in the data lane; `mark_ce` sets Congestion Experienced.
    Queue { mark_ce: bool },
    /// Cut it to its header and queue the header in the priority lane.
    Trim,
    /// Drop it.
    Drop,
}

/// Counters of one port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    pub packets: u64,
    pub bytes: u64,
    pub drops: u64,
    pub ecn_marks: u64,
    pub trims: u64,
    /// Largest backlog seen at an arrival, bytes.
    pub backlog_bytes_max: u64,
}

/// One direction of a link and the queue in front of it.
///
/// Laid out in declaration order in two cache lines (128 bytes, aligned): everything an
/// arrival reads and writes, counters included, and nothing else; at 1024 hosts the fabric's
/// ports do not fit in cache and each line is a miss.
#[derive(Debug)]
#[repr(C, align(128))]
pub struct Port {
    busy_until: Picos,
    picos_per_byte: Picos,
    priority_busy_until: Picos,
    /// Propagation delay; [`Port::new`] saturates it at `u32::MAX` ns (4.29 s).
    latency_ns: u32,
    /// Node at the far end.
    pub to: u32,
    /// Packets queued or on the link, earliest arrival at `to` first. Bounded by the buffer
    /// plus the link's bandwidth-delay product.
    pub wire: Wire,
    /// The priority (trimmed header) lane, likewise.
    pub priority_wire: Wire,
    queue: QueueConfig,
    /// What went through this port.
    pub counters: PortCounters,
}

impl Port {
    /// A port at `rate_bps` with `latency` to node `to`.
    pub fn new(to: u32, rate_bps: u64, latency: Duration, queue: QueueConfig) -> Self {
        Port {
            to,
            picos_per_byte: (8_000_000_000_000u128 / rate_bps.max(1) as u128).max(1) as Picos,
            latency_ns: latency.as_nanos().min(u32::MAX as u128) as u32,
            queue,
            busy_until: 0,
            priority_busy_until: 0,
            wire: Wire::default(),
            priority_wire: Wire::default(),
            counters: PortCounters::default(),
        }
    }

    /// Picoseconds to serialise one byte.
    pub fn picos_per_byte(&self) -> Picos {
        self.picos_per_byte
    }

    /// Bytes queued or serialising at `now_ps`.
    pub fn backlog_bytes(&self, now_ps: Picos) -> u64 {
        self.busy_until.saturating_sub(now_ps) / self.picos_per_byte
    }

    /// The instant (ps) at which the backlog falls to `bytes`.
    pub fn backlog_falls_to(&self, bytes: u64) -> Picos {
        self.busy_until.saturating_sub(bytes * self.picos_per_byte)
    }

    /// The policy's verdict on a packet of `wire_bytes` (`data`: it has payload that trimming
    /// could cut; `ecn_capable`: it may be marked). `uniform` is a fresh draw in `[0, 1)`, used
    /// only between RED thresholds.
    pub fn admit(&mut self, now_ps: Picos, wire_bytes: u64, data: bool, ecn_capable: bool, uniform: f64) -> Admission {
        let backlog = self.backlog_bytes(now_ps);
        self.counters.backlog_bytes_max = self.counters.backlog_bytes_max.max(backlog);
        let full = backlog + wire_bytes > self.queue.capacity_bytes;
        match self.queue.policy {
            QueuePolicy::DropTail if full => Admission::Drop,
            QueuePolicy::DropTail => Admission::Queue { mark_ce: false },
            QueuePolicy::Ecn { .. } if full => Admission::Drop,
            QueuePolicy::Ecn { kmin_bytes, kmax_bytes } => {
                let mark = ecn_capable
                    && backlog > kmin_bytes
                    && (backlog >= kmax_bytes
                        || uniform < (backlog - kmin_bytes) as f64 / (kmax_bytes - kmin_bytes).max(1) as f64);
                Admission::Queue { mark_ce: mark }
            }
            QueuePolicy::Trim { threshold_bytes, header_buffer_bytes } => {
                if data && backlog + wire_bytes > threshold_bytes.min(self.queue.capacity_bytes) {
                    let header_backlog = self.priority_busy_until.saturating_sub(now_ps) / self.picos_per_byte;
                    if header_backlog > header_buffer_bytes {
                        Admission::Drop
                    } else {
                        Admission::Trim
                    }
                } else if full {
                    Admission::Drop
                } else {
                    Admission::Queue { mark_ce: false }
                }
            }
        }
    }

    /// Whether this queue serves header-only packets (trimmed headers, and control packets:
    /// ACKs, credit, requests to send) in its priority lane, as NDP/EQDS switches do.
    pub fn prioritises_headers(&self) -> bool {
        matches!(self.queue.policy, QueuePolicy::Trim { .. })
    }

    /// Whether the priority lane takes one more trimmed header (its backlog is under the
    /// header buffer; non-trimming queues give headers the data buffer's size).
    pub fn admit_header(&self, now_ps: Picos) -> bool {
        let limit = match self.queue.policy {
            QueuePolicy::Trim { header_buffer_bytes, .. } => header_buffer_bytes,
            _ => self.queue.capacity_bytes,
        };
        self.priority_busy_until.saturating_sub(now_ps) / self.picos_per_byte <= limit
    }

    /// Queues `packet` of `wire_bytes` at `now_ps` in the data lane (or the priority lane),
    /// linking it into the lane's wire in `pool`. Returns its arrival time (ns) at the far end
    /// if it became the head of its wire, i.e. when the caller must schedule an arrival event.
    pub fn transmit(
        &mut self,
        now_ps: Picos,
        packet: u32,
        wire_bytes: u64,
        priority: bool,
        pool: &mut PacketPool,
    ) -> Option<u64> {
        let (busy, wire) = if priority {
            (&mut self.priority_busy_until, &mut self.priority_wire)
        } else {
            (&mut self.busy_until, &mut self.wire)
        };
        let finish = (*busy).max(now_ps) + wire_bytes * self.picos_per_byte;
        *busy = finish;
        let arrive_ns = finish.div_ceil(1000) + self.latency_ns as u64;
        let head = pool.wire_push(wire, packet, arrive_ns);
        self.counters.packets += 1;
        self.counters.bytes += wire_bytes;
        head.then_some(arrive_ns)
    }

    /// The head `packet` of a lane arrived at `to`: takes it off the wire. Returns the next
    /// head and its arrival time (ns), if any, for the caller to schedule.
    pub fn arrive(&mut self, packet: u32, priority: bool, pool: &mut PacketPool) -> Option<(u32, u64)> {
        let wire = if priority { &mut self.priority_wire } else { &mut self.wire };
        pool.wire_pop(wire, packet)
    }
}
