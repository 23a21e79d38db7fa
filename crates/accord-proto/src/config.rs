//! Typed configuration of an endpoint and its connections, with documented defaults.
//!
//! Environment overrides (`ACCORD_*`) are applied by the layers that own a process
//! (`accord-engine`, the CLI); this crate reads no environment, like it reads no clock.

use crate::cc::CcKind;
use crate::path::SelectorKind;
use core::time::Duration;

/// Largest path table a connection may have (paths are numbered by a `u16` on our side, and
/// 256 entropy values are what DESIGN §2 asks for).
pub const PATH_COUNT_MAX: u16 = 256;

/// Largest receive window in packets: the ACK's SACK bitmap reports this many packets past the
/// cumulative point, so a larger window could hold packets the sender can never learn about.
pub const RECV_WINDOW_PACKETS_MAX: u32 = crate::wire::SACK_BITMAP_BITS as u32;

/// Settings of one connection. Both sides propose; the handshake agrees on the minimum of
/// datagram size, path count and receive window.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionConfig {
    /// Largest datagram (our header plus payload) the datapath can carry. Default 4096 + 96
    /// (a 4 KiB payload: the MTU of the fabrics Accord targets, and cheap on loopback).
    pub max_datagram_bytes: u16,
    /// Paths (entropy values) to spray over. Default 16, at most [`PATH_COUNT_MAX`].
    pub path_count: u16,
    /// Bytes per control decision (chunk). Default 32 KiB; the connection shrinks it when the
    /// window is small or loss is heavy.
    pub chunk_bytes: u32,
    /// Congestion control. Default CUBIC.
    pub cc: CcKind,
    /// Path selection policy. Default power-of-two choices on RTT.
    pub selector: SelectorKind,
    /// RTT assumed for a path before its first sample. Default 100 µs.
    pub initial_rtt: Duration,
    /// Floor of a path's retransmission timeout. Default 1 ms (loopback under load on a
    /// small host jitters by hundreds of µs; simulations use less).
    pub rto_min: Duration,
    /// Ceiling of a path's retransmission timeout after backoff. Default 200 ms.
    pub rto_max: Duration,
    /// A packet is lost when one sent this many packets later on the same path was acked.
    /// Default 3.
    pub reorder_threshold_packets: u32,
    /// Whether a loss found wrong (its packet acknowledged after all) raises the paths' RTO
    /// floor to cover that late acknowledgement (`PathTable::raise_rto_floor`). Default on; off
    /// only to measure what it brings (`accord sim late-acks`). Found losses are counted either
    /// way.
    pub learn_rto_floor: bool,
    /// Consecutive timeouts after which a path is quarantined and only probed. Default 2.
    pub quarantine_after_timeouts: u32,
    /// Interval between probes of a quarantined path. Default 5 ms.
    pub probe_interval: Duration,
    /// Acknowledge at least every this many data packets. Default 8.
    pub ack_every_packets: u16,
    /// Longest an ACK may be held back. Default 20 µs.
    pub ack_delay_max: Duration,
    /// Packets the receiver tracks past its cumulative point (sender's window of packet
    /// numbers). Default and maximum [`RECV_WINDOW_PACKETS_MAX`].
    pub recv_window_packets: u32,
    /// Operations a sender may have outstanding on the connection. Default 4096.
    pub ops_in_flight_max: u32,
    /// Partially received operations (writes with an immediate, sends) the receiver tracks.
    /// Default 4096; a packet that would start one more is dropped and retransmitted later.
    pub inbound_ops_max: u32,
    /// How long a connection keeps retrying its handshake (backing off from `rto_min` to
    /// `rto_max`) before it fails. Default 10 s: a peer that is alive but starved of CPU must
    /// get time to answer (see `Connection::handle_handshake_timeout`).
    pub handshake_timeout: Duration,
    /// With data outstanding and no acknowledgement for this long, the connection fails and
    /// every operation on it errors. Default 10 s.
    pub idle_timeout: Duration,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            max_datagram_bytes: 4096 + crate::wire::DATA_HEADER_LEN as u16,
            path_count: 16,
            chunk_bytes: 32 * 1024,
            cc: CcKind::Cubic(Default::default()),
            selector: SelectorKind::PowerOfTwoChoices,
            initial_rtt: Duration::from_micros(100),
            rto_min: Duration::from_millis(1),
            rto_max: Duration::from_millis(200),
            reorder_threshold_packets: 3,
            learn_rto_floor: true,
            quarantine_after_timeouts: 2,
            probe_interval: Duration::from_millis(5),
            ack_every_packets: 8,
            ack_delay_max: Duration::from_micros(20),
            recv_window_packets: RECV_WINDOW_PACKETS_MAX,
            ops_in_flight_max: 4096,
            inbound_ops_max: 4096,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("path_count {0} is outside 1..={PATH_COUNT_MAX}: choose a value in range")]
    PathCount(u16),
    #[error("max_datagram_bytes {0} leaves no payload after the {hdr}-byte data header: raise it", hdr = crate::wire::DATA_HEADER_LEN)]
    DatagramTooSmall(u16),
    #[error("recv_window_packets {0} is outside 16..={RECV_WINDOW_PACKETS_MAX}")]
    RecvWindow(u32),
    #[error("chunk_bytes must be at least 1")]
    ChunkBytes,
    #[error("credit.rate_fraction must be in (0, 1]")]
    RateFraction,
    #[error("{0} must be non-zero")]
    Zero(&'static str),
    #[error("integrity mode mac (ACCORD_INTEGRITY=mac) derives its keys from the job secret, and none is set: set ACCORD_JOB_SECRET to the same 64 hex digits on every rank (accord run and accord.run draw one per job), or choose another integrity mode")]
    MacWithoutSecret,
}

impl ConnectionConfig {
    /// Checks the ranges; every constructor of a connection calls this first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.path_count == 0 || self.path_count > PATH_COUNT_MAX {
            return Err(ConfigError::PathCount(self.path_count));
        }
        if (self.max_datagram_bytes as usize) <= crate::wire::DATA_HEADER_LEN
            || (self.max_datagram_bytes as usize) < crate::wire::MAX_ACK_LEN
        {
            return Err(ConfigError::DatagramTooSmall(self.max_datagram_bytes));
        }
        if self.recv_window_packets < 16 || self.recv_window_packets > RECV_WINDOW_PACKETS_MAX {
            return Err(ConfigError::RecvWindow(self.recv_window_packets));
        }
        if self.chunk_bytes == 0 {
            return Err(ConfigError::ChunkBytes);
        }
        for (name, zero) in [
            ("ops_in_flight_max", self.ops_in_flight_max == 0),
            ("inbound_ops_max", self.inbound_ops_max == 0),
            ("ack_every_packets", self.ack_every_packets == 0),
            ("reorder_threshold_packets", self.reorder_threshold_packets == 0),
            ("rto_min", self.rto_min.is_zero()),
            ("initial_rtt", self.initial_rtt.is_zero()),
        ] {
            if zero {
                return Err(ConfigError::Zero(name));
            }
        }
        Ok(())
    }

    /// Payload bytes of a full data packet.
    pub fn mss_bytes(&self) -> u32 {
        self.max_datagram_bytes as u32 - crate::wire::DATA_HEADER_LEN as u32
    }
}

/// Settings of an endpoint: the defaults for its connections and its own bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointConfig {
    /// Applied to every connection this endpoint opens or accepts.
    pub connection: ConnectionConfig,
    /// Connections the endpoint holds at once; a Hello beyond this is dropped and counted.
    /// Default 65536.
    pub connections_max: u32,
    /// The receiver's credit pacer for receiver-driven senders (EQDS). One endpoint is one
    /// NIC, so `line_rate_bytes_per_sec` must be that NIC's.
    pub credit: CreditConfig,
    /// The end-to-end check every packet carries and every received one must pass (see
    /// [`crate::wire::integrity`]). Every endpoint of a job must use the same. Default
    /// [`Integrity::Full`](crate::wire::Integrity::Full): header and payload.
    pub integrity: crate::wire::Integrity,
    /// The job secret: when set, only peers that prove they hold it may connect (see
    /// [`crate::admission`]). Every endpoint of a job must hold the same. Default: none.
    pub secret: Option<crate::admission::JobSecret>,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            connection: ConnectionConfig::default(),
            connections_max: 65536,
            credit: CreditConfig::default(),
            integrity: crate::wire::Integrity::default(),
            secret: None,
        }
    }
}

/// Which active sender the credit pacer serves next (retransmission requests always first).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum PacerOrder {
    /// Round robin, one quantum each: max-min fair.
    #[default]
    RoundRobin,
    /// The sender with the fewest bytes left of its current message first (as each data
    /// packet says: message length minus its end offset), with a round-robin grant every
    /// `fair_grant_every` grants. Short messages (MoE tokens, RPCs) finish at nearly their
    /// unloaded latency beside a large incast, and the incast's flows finish one after the
    /// other instead of all at the end; the total is the same.
    ShortestRemaining,
}

impl PacerOrder {
    /// `rr` / `round-robin` / `fair`, or `srpt` / `shortest-remaining`.
    pub fn from_name(name: &str) -> Option<PacerOrder> {
        match name.trim().to_ascii_lowercase().as_str() {
            "rr" | "round-robin" | "fair" => Some(PacerOrder::RoundRobin),
            "srpt" | "shortest-remaining" => Some(PacerOrder::ShortestRemaining),
            _ => None,
        }
    }
}

/// Settings of the receiver's credit pacer (EQDS, see [`crate::credit`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CreditConfig {
    /// Line rate of the receiving NIC. Default 12.5e9 (100 Gbit/s).
    pub line_rate_bytes_per_sec: u64,
    /// Fraction of the line rate granted, just under 1 so the NIC's queue drains. Default 0.98.
    pub rate_fraction: f64,
    /// Most bytes one grant gives a sender (the round-robin quantum). Default 16 KiB.
    pub grant_quantum_bytes: u32,
    /// Bytes on the wire per data packet beyond its payload (headers, framing), charged by the
    /// pacer. Default 96 + 64.
    pub wire_overhead_bytes_per_packet: u32,
    /// Demand granted once per busy period of a sender, ahead of its pull clock: the pull
    /// clock only replaces what arrives, so without headroom a sender keeps just its
    /// speculative bytes outstanding, which falls short of the loop's own delays (the grant,
    /// NIC queues, queues in the fabric). Paced like any credit, so it adds no burst. Default
    /// 0 (none); the simulator sets one BDP.
    pub pull_headroom_bytes: u64,
    /// Service order among senders with demand. Default round robin.
    pub order: PacerOrder,
    /// Under [`PacerOrder::ShortestRemaining`], one new-data grant in this many goes to the
    /// round-robin head instead (0: never). Default 8: a long flow keeps at least an eighth
    /// of its round-robin share however many short messages arrive.
    pub fair_grant_every: u64,
    /// Under [`PacerOrder::ShortestRemaining`], credit a sender may have outstanding beyond
    /// the rest of its current message and keep its priority (for the next message it may
    /// have queued; the pacer cannot see one). Beyond it the sender is served last: its pull
    /// demand there is mostly the loop's headroom, wasted at the end of its last message.
    pub srpt_beyond_message_bytes: u64,
    /// Most demand an Rts can create (the rest is asked for by the pull clock). Default 256 KiB.
    pub rts_demand_max_bytes: u64,
    /// Most demand one sender can have outstanding. Default 64 MiB.
    pub demand_bytes_max: u64,
    /// Senders the pacer tracks (active plus idle). Default 65536.
    pub senders_max: usize,
    /// Idle senders remembered. Default 1024.
    pub idle_senders_max: usize,
    /// Retransmission requests (NACKs) waiting at most. Default 4096.
    pub nack_queue_max: usize,
}

impl Default for CreditConfig {
    fn default() -> Self {
        CreditConfig {
            line_rate_bytes_per_sec: 12_500_000_000,
            rate_fraction: 0.98,
            grant_quantum_bytes: 16 * 1024,
            wire_overhead_bytes_per_packet: crate::wire::DATA_HEADER_LEN as u32 + 64,
            pull_headroom_bytes: 0,
            order: PacerOrder::RoundRobin,
            fair_grant_every: 8,
            srpt_beyond_message_bytes: 64 * 1024,
            rts_demand_max_bytes: 256 * 1024,
            demand_bytes_max: 64 << 20,
            senders_max: 65536,
            idle_senders_max: 1024,
            nack_queue_max: 4096,
        }
    }
}

impl CreditConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.rate_fraction > 0.0 && self.rate_fraction <= 1.0) {
            return Err(ConfigError::RateFraction);
        }
        for (name, zero) in [
            ("credit.line_rate_bytes_per_sec", self.line_rate_bytes_per_sec == 0),
            ("credit.grant_quantum_bytes", self.grant_quantum_bytes == 0),
            ("credit.senders_max", self.senders_max == 0),
            ("credit.nack_queue_max", self.nack_queue_max == 0),
        ] {
            if zero {
                return Err(ConfigError::Zero(name));
            }
        }
        Ok(())
    }
}
