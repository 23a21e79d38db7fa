//! Swift (Kumar et al., "Swift: Delay is Simple and Effective for Congestion Control in the
//! Datacenter", SIGCOMM 2020).
//!
//! Swift keeps the measured round-trip delay near a target: below it the window grows
//! additively, above it the window shrinks in proportion to how far the delay overshoots. The
//! target is a base delay plus a per-hop allowance plus a flow-scaling term that is larger for
//! small windows, so many small flows sharing a bottleneck still converge to fairness. Below one
//! packet the window is enforced by pacing, which is what lets Swift handle large incasts.
//!
//! Differences from the paper, because the transport gives less information: there is one
//! delay (no split into fabric and endpoint delay), and the hop count is a configured constant
//! instead of one measured from the IP TTL.

use super::cubic::window_limited;
use super::{AckEvent, CongestionControl, LossEvent};
use crate::time::Instant;
use core::time::Duration;

/// Parameters of [`Swift`], with the defaults used when `swift` is chosen by name.
///
/// Out-of-range values are clamped by [`Swift::new`] rather than rejected, so a bad setting
/// degrades the policy instead of aborting the connection.
#[derive(Clone, Debug, PartialEq)]
pub struct SwiftConfig {
    /// Target delay on an empty fabric path (default 25 µs): the RTT a lightly loaded
    /// connection should tolerate without backing off.
    pub base_target_delay: Duration,
    /// Extra target per switch hop (default 1 µs), since each hop adds serialisation and a
    /// little queueing even when nothing is congested.
    pub hop_scale_per_hop: Duration,
    /// Switch hops assumed on every path (default 2: a leaf-spine round trip's one-way hops).
    pub hops: u32,
    /// Largest flow-scaling addition to the target (default 50 µs), granted to the smallest
    /// windows so that flows with small windows are not starved by large ones.
    pub fs_range: Duration,
    /// Window (packets) at or below which the full `fs_range` is added (default 0.1).
    pub fs_min_window_packets: f64,
    /// Window (packets) at or above which no flow scaling is added (default 100).
    pub fs_max_window_packets: f64,
    /// Additive increase per round trip, in packets (default 1.0).
    pub additive_increase_packets: f64,
    /// Multiplicative-decrease gain per unit of relative overshoot (default 0.8). Clamped to
    /// `[0, 1]`.
    pub beta: f64,
    /// Largest fraction of the window one decrease may remove (default 0.5); also the decrease
    /// applied on loss. Clamped to `[0, 0.99]`.
    pub max_decrease_factor: f64,
    /// Window at connection start, in packets (default 32).
    pub initial_window_packets: f64,
    /// Smallest window, in packets (default 0.01). Fractional on purpose: below one packet
    /// Swift sends one packet every `RTT / window` via pacing. Clamped to at least `1e-6`.
    pub min_window_packets: f64,
    /// Upper bound of the window in bytes (default 1 GiB).
    pub max_window_bytes: u64,
    /// Cut the window on loss only when the latest delay sample is at or above target
    /// (default true). A departure from the paper, which cuts on every loss: on a fabric that
    /// corrupts or drops packets at random, a loss while queues are below target says nothing
    /// about congestion, and cutting for it starves the connection (the loss sweep measured
    /// 55% goodput at 1/256 loss with the paper's rule; see the README).
    pub loss_needs_delay: bool,
}

impl Default for SwiftConfig {
    fn default() -> Self {
        SwiftConfig {
            base_target_delay: Duration::from_micros(25),
            hop_scale_per_hop: Duration::from_micros(1),
            hops: 2,
            fs_range: Duration::from_micros(50),
            fs_min_window_packets: 0.1,
            fs_max_window_packets: 100.0,
            additive_increase_packets: 1.0,
            beta: 0.8,
            max_decrease_factor: 0.5,
            initial_window_packets: 32.0,
            min_window_packets: 0.01,
            max_window_bytes: 1 << 30,
            loss_needs_delay: true,
        }
    }
}

/// Swift delay-based congestion control; see the module documentation for what it does.
///
/// The window is kept in packets, fractional. [`window_bytes`](CongestionControl::window_bytes)
/// never reports less than one MSS, so a connection that gates on the window can always send
/// one packet; below one packet the real limit is the rate from
/// [`pacing_rate_bytes_per_sec`](CongestionControl::pacing_rate_bytes_per_sec). Growth, as for
/// CUBIC, only happens while the window is in use (bytes in flight before an ACK frame at least
/// half the window).
#[derive(Clone, Debug)]
pub struct Swift {
    mss_bytes: f64,
    /// Fixed part of the target (base plus hops), nanoseconds.
    fixed_target_nanos: f64,
    fs_range_nanos: f64,
    /// Flow-scaling curve `fs_alpha / sqrt(window) + fs_beta`, nanoseconds.
    fs_alpha: f64,
    fs_beta: f64,
    additive_increase_packets: f64,
    beta: f64,
    max_decrease_factor: f64,
    min_window_packets: f64,
    max_window_packets: f64,
    /// Congestion window, packets.
    window_packets: f64,
    /// When the window was last decreased, for the once-per-RTT rule.
    last_decrease: Option<Instant>,
    /// Latest smoothed RTT seen in an event; zero until one arrives.
    rtt_smoothed: Duration,
    loss_needs_delay: bool,
    /// Latest delay sample, nanoseconds (`None` before the first).
    last_delay_nanos: Option<f64>,
}

fn nanos(d: Duration) -> f64 {
    d.as_nanos() as f64
}

fn finite_or(value: f64, fallback: f64) -> f64 {
    if value.is_finite() {
        value
    } else {
        fallback
    }
}

impl Swift {
    /// A controller for a connection whose full packets carry `mss_bytes` of payload (zero is
    /// treated as one byte so the arithmetic stays defined).
    pub fn new(cfg: SwiftConfig, mss_bytes: u32) -> Self {
        let mss = f64::from(mss_bytes.max(1));
        let min_window_packets = finite_or(cfg.min_window_packets, 0.01).max(1e-6);
        let max_window_packets = (cfg.max_window_bytes as f64 / mss).max(min_window_packets);
        let fs_min = finite_or(cfg.fs_min_window_packets, 0.1).max(1e-6);
        let fs_max = finite_or(cfg.fs_max_window_packets, 100.0);
        let fs_range_nanos = nanos(cfg.fs_range);
        // fs_alpha/sqrt(w) + fs_beta is fs_range at fs_min and 0 at fs_max (paper, §3.5).
        let (fs_alpha, fs_beta) = if fs_max > fs_min {
            let alpha = fs_range_nanos / (1.0 / fs_min.sqrt() - 1.0 / fs_max.sqrt());
            (alpha, -alpha / fs_max.sqrt())
        } else {
            (0.0, 0.0)
        };
        let fixed_target_nanos = nanos(cfg.base_target_delay) + f64::from(cfg.hops) * nanos(cfg.hop_scale_per_hop);
        Swift {
            mss_bytes: mss,
            fixed_target_nanos,
            fs_range_nanos,
            fs_alpha,
            fs_beta,
            additive_increase_packets: finite_or(cfg.additive_increase_packets, 1.0).max(0.0),
            beta: finite_or(cfg.beta, 0.8).clamp(0.0, 1.0),
            max_decrease_factor: finite_or(cfg.max_decrease_factor, 0.5).clamp(0.0, 0.99),
            min_window_packets,
            max_window_packets,
            window_packets: finite_or(cfg.initial_window_packets, 32.0).clamp(min_window_packets, max_window_packets),
            last_decrease: None,
            rtt_smoothed: Duration::ZERO,
            loss_needs_delay: cfg.loss_needs_delay,
            last_delay_nanos: None,
        }
    }

    /// The window in packets, fractional: the value Swift actually reasons about, where
    /// [`window_bytes`](CongestionControl::window_bytes) is rounded up to one MSS.
    pub fn window_packets(&self) -> f64 {
        self.window_packets
    }

    /// The delay Swift currently aims for: base plus hops plus the flow-scaling term for the
    /// current window. Exposed for statistics and tests.
    pub fn target_delay(&self) -> Duration {
        Duration::from_nanos(self.target_delay_nanos() as u64)
    }

    fn target_delay_nanos(&self) -> f64 {
        let fs = (self.fs_alpha / self.window_packets.sqrt() + self.fs_beta).clamp(0.0, self.fs_range_nanos);
        self.fixed_target_nanos + fs
    }

    fn clamp_window(&mut self) {
        self.window_packets = self.window_packets.clamp(self.min_window_packets, self.max_window_packets);
    }

    /// Whether a decrease is allowed now: at most one per RTT, so the reaction to one queue
    /// build-up is not repeated for every ACK that saw the same queue.
    fn can_decrease(&self, now: Instant, rtt: Duration) -> bool {
        match self.last_decrease {
            Some(last) => now >= last + rtt,
            None => true,
        }
    }

    fn decrease(&mut self, now: Instant, factor: f64) {
        self.window_packets *= factor;
        self.clamp_window();
        self.last_decrease = Some(now);
    }

    /// The RTT for the once-per-RTT rule and pacing: the smoothed one when known, else
    /// `fallback`.
    fn rtt_or(&self, fallback: Duration) -> Duration {
        if self.rtt_smoothed.is_zero() {
            fallback
        } else {
            self.rtt_smoothed
        }
    }
}

impl CongestionControl for Swift {
    fn name(&self) -> &'static str {
        "swift"
    }

    fn window_bytes(&self) -> u64 {
        (self.window_packets * self.mss_bytes).max(self.mss_bytes) as u64
    }

    fn pacing_rate_bytes_per_sec(&self) -> Option<u64> {
        if self.window_packets >= 1.0 {
            return None;
        }
        // One window per RTT; before any RTT sample the target delay is the best guess.
        let rtt = self.rtt_or(self.target_delay()).max(Duration::from_nanos(1));
        let rate = self.window_packets * self.mss_bytes / rtt.as_secs_f64();
        Some((rate as u64).max(1))
    }

    fn on_ack(&mut self, event: &AckEvent) {
        if !event.rtt_smoothed.is_zero() {
            self.rtt_smoothed = event.rtt_smoothed;
        }
        let acked_packets = if event.newly_acked_packets > 0 {
            event.newly_acked_packets as f64
        } else {
            event.newly_acked_bytes as f64 / self.mss_bytes
        };
        let target_nanos = self.target_delay_nanos();
        if let Some(delay) = event.rtt_sample {
            self.last_delay_nanos = Some(nanos(delay));
        }
        match event.rtt_sample {
            Some(delay) if nanos(delay) >= target_nanos => {
                if self.can_decrease(event.now, self.rtt_or(delay)) {
                    let delay_nanos = nanos(delay).max(1.0);
                    let factor = (1.0 - self.beta * (delay_nanos - target_nanos) / delay_nanos)
                        .max(1.0 - self.max_decrease_factor);
                    self.decrease(event.now, factor);
                }
            }
            // Under target, or no sample to judge by: only ever increase.
            _ => {
                if acked_packets <= 0.0 || !window_limited(event, self.window_packets * self.mss_bytes) {
                    return;
                }
                let ai = self.additive_increase_packets;
                if self.window_packets >= 1.0 {
                    self.window_packets += ai * acked_packets / self.window_packets;
                } else {
                    self.window_packets += ai * acked_packets;
                }
                self.clamp_window();
            }
        }
    }

    fn on_loss(&mut self, event: &LossEvent) {
        if !event.rtt_smoothed.is_zero() {
            self.rtt_smoothed = event.rtt_smoothed;
        }
        if event.lost_packets == 0 && event.lost_bytes == 0 {
            return;
        }
        let queues_below_target = self.last_delay_nanos.is_some_and(|d| d < self.target_delay_nanos());
        if self.loss_needs_delay && queues_below_target {
            return;
        }
        if self.can_decrease(event.now, self.rtt_smoothed) {
            self.decrease(event.now, 1.0 - self.max_decrease_factor);
        }
    }

    fn on_rto(&mut self, now: Instant) {
        // Persistent loss: fall back to the minimum and let pacing probe.
        self.window_packets = self.min_window_packets;
        self.last_decrease = Some(now);
    }
}
