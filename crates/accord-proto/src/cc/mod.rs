//! Congestion control and the other per-connection control hooks.
//!
//! The transport makes its decisions per chunk (DESIGN §2, "control coalescing"); the hooks in
//! [`CongestionControl`] are where a policy plugs into those decisions. Every hook has a no-op
//! default so a new policy only writes what it changes. Built-ins are dispatched through the
//! [`Controller`] enum (no virtual call on the hot path); user code uses the boxed
//! [`Controller::Custom`] escape hatch.
//!
//! Hook order within one connection, as the connection calls them:
//! * sender, per chunk: [`chunk_bytes`](CongestionControl::chunk_bytes), then
//!   [`window_bytes`](CongestionControl::window_bytes) and
//!   [`pacing_rate_bytes_per_sec`](CongestionControl::pacing_rate_bytes_per_sec) to decide
//!   whether (and when) the chunk may leave; path choice is the path selector's (see `path`).
//! * sender, per ACK frame: [`on_ack`](CongestionControl::on_ack) once per frame that acked
//!   new bytes, then [`on_loss`](CongestionControl::on_loss) once per batch of packets the
//!   frame revealed as lost, then
//!   [`may_retransmit`](CongestionControl::may_retransmit) before each retransmission.
//! * sender, on timer: [`on_rto`](CongestionControl::on_rto).
//! * sender, on credit from a receiver-driven peer: [`on_credit`](CongestionControl::on_credit).
//! * sender, receiver-driven policies only (EQDS): [`send_allowance_bytes`](CongestionControl::send_allowance_bytes)
//!   before each packet, [`on_sent`](CongestionControl::on_sent) after it, and
//!   [`on_idle`](CongestionControl::on_idle) when the connection has nothing left to send or
//!   resolve.
//! * receiver, per data packet: [`on_data_received`](CongestionControl::on_data_received) or
//!   [`on_retransmission_received`](CongestionControl::on_retransmission_received).

mod cubic;
mod eqds;
mod fixed;
mod swift;
#[cfg(test)]
mod tests;

pub use cubic::{Cubic, CubicConfig};
pub use eqds::{Eqds, EqdsConfig};
pub use fixed::FixedWindow;
pub use swift::{Swift, SwiftConfig};

use crate::ids::PathId;
use crate::time::Instant;
use core::time::Duration;

/// What an ACK frame told the sender, handed to [`CongestionControl::on_ack`].
#[derive(Clone, Debug)]
pub struct AckEvent {
    pub now: Instant,
    /// Path the acknowledged packet that produced `rtt_sample` was sent on.
    pub path: PathId,
    /// Payload bytes newly acknowledged by this frame (all paths).
    pub newly_acked_bytes: u64,
    /// Packets newly acknowledged by this frame.
    pub newly_acked_packets: u64,
    /// Round-trip sample from the echoed transmit time, ACK delay removed, if the frame had one.
    pub rtt_sample: Option<Duration>,
    /// Smallest RTT seen on this connection (any path).
    pub rtt_min: Duration,
    /// Smoothed RTT of the connection.
    pub rtt_smoothed: Duration,
    /// Payload bytes still in flight after this frame was processed.
    pub bytes_in_flight: u64,
    /// Newly acknowledged packets that the fabric marked with ECN CE.
    pub ecn_ce_packets: u64,
    /// Maximum transmission unit payload (bytes per full packet).
    pub mss_bytes: u32,
}

/// Packets found lost (by per-path reordering evidence), handed to [`CongestionControl::on_loss`].
#[derive(Clone, Debug)]
pub struct LossEvent {
    pub now: Instant,
    pub path: PathId,
    pub lost_bytes: u64,
    pub lost_packets: u64,
    pub bytes_in_flight: u64,
    pub rtt_smoothed: Duration,
}

/// A data packet as the receiver saw it, handed to the receiver-side hooks.
#[derive(Clone, Debug)]
pub struct RxDataEvent {
    pub now: Instant,
    pub path: PathId,
    pub payload_bytes: u32,
    pub ecn_ce: bool,
}

/// A policy's answer to "may this lost packet be retransmitted now?".
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RetransmitDecision {
    /// Retransmit as soon as the window allows.
    Now,
    /// Hold it; the connection asks again on the next ACK or timer.
    Later,
}

/// Sender- and receiver-side control hooks (UCCL's extensibility points). All have defaults
/// except the window, which every policy must state.
pub trait CongestionControl: core::fmt::Debug + Send {
    /// Name used in configuration and statistics.
    fn name(&self) -> &'static str;

    /// Payload bytes the sender may have in flight.
    fn window_bytes(&self) -> u64;

    /// Pacing decision: the rate at which chunks may leave, or `None` to send as soon as the
    /// window allows.
    fn pacing_rate_bytes_per_sec(&self) -> Option<u64> {
        None
    }

    /// Chunk-size decision: bytes the next chunk should carry. `default_bytes` is the
    /// connection's adaptive choice (configured chunk, shrunk when the window is small or loss
    /// is heavy); the result is clamped by the caller to at least one MSS.
    fn chunk_bytes(&self, default_bytes: u32) -> u32 {
        default_bytes
    }

    /// Called once per ACK frame that acknowledged new data.
    fn on_ack(&mut self, _event: &AckEvent) {}

    /// Called once per batch of packets an ACK frame revealed as lost.
    fn on_loss(&mut self, _event: &LossEvent) {}

    /// Called when the retransmission timer fired (tail loss, or a dead path).
    fn on_rto(&mut self, _now: Instant) {}

    /// Whether a packet already found lost may be retransmitted now.
    fn may_retransmit(&self, _now: Instant, _path: PathId) -> RetransmitDecision {
        RetransmitDecision::Now
    }

    /// Receiver-driven credit arrived (EQDS). Bytes of new permission to send.
    fn on_credit(&mut self, _now: Instant, _credit_bytes: u64) {}

    /// Whether the receiver schedules this sender (EQDS): its packets are flagged so the
    /// receiver's credit pacer grants it credit, and trimmed headers are NACKed with credit.
    fn receiver_driven(&self) -> bool {
        false
    }

    /// Receiver-driven budget: payload bytes that may still be sent now (speculation plus
    /// credit), or `None` when only the window rules. A packet waits until this covers it.
    fn send_allowance_bytes(&self) -> Option<u64> {
        None
    }

    /// A data packet of `bytes` payload left (new or retransmission).
    fn on_sent(&mut self, _now: Instant, _bytes: u32) {}

    /// The connection has nothing left to send and nothing unresolved.
    fn on_idle(&mut self, _now: Instant) {}

    /// How long a receiver-driven sender with backlog waits for credit before it sends a
    /// request to send (Rts); `None` for sender-driven policies.
    fn rts_timeout(&self) -> Option<Duration> {
        None
    }

    /// The policy's own invariants (checked by tests and the simulator on every event).
    fn check_invariants(&self) -> Result<(), String> {
        Ok(())
    }

    /// Receiver side: a first transmission of a data packet arrived.
    fn on_data_received(&mut self, _event: &RxDataEvent) {}

    /// Receiver side: a packet flagged as a retransmission arrived.
    fn on_retransmission_received(&mut self, _event: &RxDataEvent) {}
}

/// Which built-in policy to run, chosen by name in configuration (`cubic`, `swift`, `eqds`,
/// `fixed`).
#[derive(Clone, Debug, PartialEq)]
pub enum CcKind {
    Cubic(CubicConfig),
    Swift(SwiftConfig),
    /// Receiver-driven: the receiver's credit pacer schedules the sender (needs the endpoint's
    /// [`CreditConfig`](crate::config::CreditConfig) line rate to be the NIC's).
    Eqds(EqdsConfig),
    /// A constant window, in bytes. For tests and for baselines.
    Fixed {
        window_bytes: u64,
    },
}

/// Error for an unknown congestion-control name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown congestion control {name:?}: use one of cubic, swift, eqds, fixed")]
pub struct UnknownCcError {
    pub name: String,
}

impl CcKind {
    /// Parses a configuration name with default parameters.
    pub fn from_name(name: &str) -> Result<CcKind, UnknownCcError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "cubic" => Ok(CcKind::Cubic(CubicConfig::default())),
            "swift" => Ok(CcKind::Swift(SwiftConfig::default())),
            "eqds" => Ok(CcKind::Eqds(EqdsConfig::default())),
            "fixed" => Ok(CcKind::Fixed { window_bytes: FixedWindow::DEFAULT_WINDOW_BYTES }),
            _ => Err(UnknownCcError { name: name.to_string() }),
        }
    }

    /// Builds the controller for one connection.
    pub fn build(&self, mss_bytes: u32) -> Controller {
        match self {
            CcKind::Cubic(cfg) => Controller::Cubic(Cubic::new(cfg.clone(), mss_bytes)),
            CcKind::Swift(cfg) => Controller::Swift(Swift::new(cfg.clone(), mss_bytes)),
            CcKind::Eqds(cfg) => Controller::Eqds(Eqds::new(cfg.clone())),
            CcKind::Fixed { window_bytes } => Controller::Fixed(FixedWindow::new(*window_bytes)),
        }
    }
}

/// A connection's controller: the built-ins by value, user code boxed.
#[derive(Debug)]
pub enum Controller {
    Cubic(Cubic),
    Swift(Swift),
    Eqds(Eqds),
    Fixed(FixedWindow),
    Custom(Box<dyn CongestionControl>),
}

macro_rules! dispatch {
    ($self:ident, $c:ident => $body:expr) => {
        match $self {
            Controller::Cubic($c) => $body,
            Controller::Swift($c) => $body,
            Controller::Eqds($c) => $body,
            Controller::Fixed($c) => $body,
            Controller::Custom($c) => $body,
        }
    };
}

impl CongestionControl for Controller {
    fn name(&self) -> &'static str {
        dispatch!(self, c => c.name())
    }
    fn window_bytes(&self) -> u64 {
        dispatch!(self, c => c.window_bytes())
    }
    fn pacing_rate_bytes_per_sec(&self) -> Option<u64> {
        dispatch!(self, c => c.pacing_rate_bytes_per_sec())
    }
    fn chunk_bytes(&self, default_bytes: u32) -> u32 {
        dispatch!(self, c => c.chunk_bytes(default_bytes))
    }
    fn on_ack(&mut self, event: &AckEvent) {
        dispatch!(self, c => c.on_ack(event))
    }
    fn on_loss(&mut self, event: &LossEvent) {
        dispatch!(self, c => c.on_loss(event))
    }
    fn on_rto(&mut self, now: Instant) {
        dispatch!(self, c => c.on_rto(now))
    }
    fn may_retransmit(&self, now: Instant, path: PathId) -> RetransmitDecision {
        dispatch!(self, c => c.may_retransmit(now, path))
    }
    fn on_credit(&mut self, now: Instant, credit_bytes: u64) {
        dispatch!(self, c => c.on_credit(now, credit_bytes))
    }
    fn receiver_driven(&self) -> bool {
        dispatch!(self, c => c.receiver_driven())
    }
    fn send_allowance_bytes(&self) -> Option<u64> {
        dispatch!(self, c => c.send_allowance_bytes())
    }
    fn on_sent(&mut self, now: Instant, bytes: u32) {
        dispatch!(self, c => c.on_sent(now, bytes))
    }
    fn on_idle(&mut self, now: Instant) {
        dispatch!(self, c => c.on_idle(now))
    }
    fn rts_timeout(&self) -> Option<Duration> {
        dispatch!(self, c => c.rts_timeout())
    }
    fn check_invariants(&self) -> Result<(), String> {
        dispatch!(self, c => c.check_invariants())
    }
    fn on_data_received(&mut self, event: &RxDataEvent) {
        dispatch!(self, c => c.on_data_received(event))
    }
    fn on_retransmission_received(&mut self, event: &RxDataEvent) {
        dispatch!(self, c => c.on_retransmission_received(event))
    }
}
