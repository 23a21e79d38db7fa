//! CUBIC (RFC 9438) with time measured in round trips instead of seconds.
//!
//! RFC 9438 grows the window as `W(t) = C·(t − K)³ + W_max` with `t` in seconds, tuned for
//! Internet RTTs of tens of milliseconds. At a datacenter RTT of 10 µs that clock makes the
//! window regrow over thousands of round trips. Here `t` is the time since the last reduction
//! divided by the smoothed RTT, so `C` is in packets per RTT³ and the window returns to `W_max`
//! after about `K` round trips whatever the RTT is. Everything else follows the RFC: slow start
//! until the first congestion signal or `ssthresh`, the multiplicative decrease by `beta`, at
//! most one reduction per round trip, and the Reno-friendly floor.
//!
//! Windows are kept in bytes as `f64` so fractional per-ACK increments accumulate; every input
//! is a plain number, so the result is deterministic.

use super::{AckEvent, CongestionControl, LossEvent};
use crate::time::Instant;
use core::time::Duration;

/// Parameters of [`Cubic`], with the defaults used when `cubic` is chosen by name.
///
/// Out-of-range values are clamped by [`Cubic::new`] rather than rejected, so a bad setting
/// degrades the policy instead of aborting the connection.
#[derive(Clone, Debug, PartialEq)]
pub struct CubicConfig {
    /// Window at connection start, in packets (default 32): large enough to fill a chunk
    /// pipeline on the first round trip, small enough not to swamp a shared switch buffer.
    pub initial_window_packets: u32,
    /// The window never goes below this many packets (default 2), so loss recovery always has
    /// a packet in flight to clock it.
    pub min_window_packets: u32,
    /// Multiplicative decrease factor (default 0.7, RFC 9438). Clamped to `[0.05, 0.95]`.
    pub beta: f64,
    /// Cubic growth constant in packets per RTT³ (default 0.4, RFC 9438's value with the RTT as
    /// the time unit). Clamped to at least `1e-12`.
    pub c: f64,
    /// Upper bound of the window in bytes (default 1 GiB), so an idle-then-busy connection
    /// cannot release an unbounded burst.
    pub max_window_bytes: u64,
    /// Treat ECN CE marks on acknowledged packets as a loss (default true): on a fabric that
    /// marks, this reacts before buffers overflow.
    pub ecn_as_loss: bool,
}

impl Default for CubicConfig {
    fn default() -> Self {
        CubicConfig {
            initial_window_packets: 32,
            min_window_packets: 2,
            beta: 0.7,
            c: 0.4,
            max_window_bytes: 1 << 30,
            ecn_as_loss: true,
        }
    }
}

/// CUBIC congestion control in RTT units; see the module documentation for why.
///
/// Growth only happens while the connection actually uses its window: an ACK frame grows the
/// window only when the bytes in flight before it (`bytes_in_flight + newly_acked_bytes`) were
/// at least half the window. Without this an application-limited connection would inflate its
/// window to the maximum and later send it as one burst.
#[derive(Clone, Debug)]
pub struct Cubic {
    mss_bytes: f64,
    beta: f64,
    c: f64,
    min_window_bytes: f64,
    max_window_bytes: f64,
    ecn_as_loss: bool,
    /// Congestion window, bytes.
    window_bytes: f64,
    /// Slow-start threshold, bytes; infinite until the first reduction.
    ssthresh_bytes: f64,
    /// Window just before the last reduction, bytes.
    w_max_bytes: f64,
    /// Round trips the cubic curve takes from the epoch start back to `w_max_bytes`.
    k_rtts: f64,
    /// Start of the current congestion-avoidance epoch; `None` in slow start.
    epoch_start: Option<Instant>,
    /// Reno-equivalent window estimate for the TCP-friendly floor, bytes.
    w_est_bytes: f64,
    /// When the window was last reduced, for the once-per-RTT rule.
    last_reduction: Option<Instant>,
    /// Latest smoothed RTT seen in an event; zero until one arrives.
    rtt_smoothed: Duration,
    /// An RTO fired and no ACK has acknowledged new data since: a further RTO (timer
    /// backoff) is the same episode and must not erase `ssthresh` and `W_max`.
    in_rto_episode: bool,
}

impl Cubic {
    /// A controller for a connection whose full packets carry `mss_bytes` of payload (zero is
    /// treated as one byte so the arithmetic stays defined).
    pub fn new(cfg: CubicConfig, mss_bytes: u32) -> Self {
        let mss = f64::from(mss_bytes.max(1));
        let beta = if cfg.beta.is_finite() { cfg.beta.clamp(0.05, 0.95) } else { 0.7 };
        let c = if cfg.c.is_finite() { cfg.c.max(1e-12) } else { 0.4 };
        let min_window_bytes = f64::from(cfg.min_window_packets.max(1)) * mss;
        let max_window_bytes = (cfg.max_window_bytes as f64).max(min_window_bytes);
        let initial = (f64::from(cfg.initial_window_packets) * mss).clamp(min_window_bytes, max_window_bytes);
        Cubic {
            mss_bytes: mss,
            beta,
            c,
            min_window_bytes,
            max_window_bytes,
            ecn_as_loss: cfg.ecn_as_loss,
            window_bytes: initial,
            ssthresh_bytes: f64::INFINITY,
            w_max_bytes: 0.0,
            k_rtts: 0.0,
            epoch_start: None,
            w_est_bytes: initial,
            last_reduction: None,
            rtt_smoothed: Duration::ZERO,
            in_rto_episode: false,
        }
    }

    /// Slow-start threshold in bytes (`u64::MAX` before the first reduction); exposed for
    /// statistics and tests, since it tells whether the connection is still in slow start.
    pub fn ssthresh_bytes(&self) -> u64 {
        self.ssthresh_bytes as u64
    }

    /// Window before the last reduction, in bytes: the plateau the cubic curve aims for.
    pub fn w_max_bytes(&self) -> u64 {
        self.w_max_bytes as u64
    }

    /// Round trips from the last reduction until the curve is back at `W_max` (`K` of
    /// RFC 9438, in RTT units); exposed so tests and statistics can check the recovery time.
    pub fn k_rtts(&self) -> f64 {
        self.k_rtts
    }

    /// Whether the window is still growing exponentially (no congestion signal yet, or below
    /// the threshold after an RTO).
    pub fn in_slow_start(&self) -> bool {
        self.window_bytes < self.ssthresh_bytes
    }

    /// Records the RTT estimate of an event; a zero estimate means "none yet" and is ignored.
    fn note_rtt(&mut self, rtt_smoothed: Duration) {
        if !rtt_smoothed.is_zero() {
            self.rtt_smoothed = rtt_smoothed;
        }
    }

    fn clamp_window(&mut self) {
        self.window_bytes = self.window_bytes.clamp(self.min_window_bytes, self.max_window_bytes);
    }

    /// `K = ∛((W_max − W_epoch) / C)` in RTTs, with both windows in packets.
    fn compute_k(&self) -> f64 {
        let gap_packets = (self.w_max_bytes - self.window_bytes).max(0.0) / self.mss_bytes;
        (gap_packets / self.c).cbrt()
    }

    /// A congestion signal (loss or ECN). Returns whether the window was reduced; signals
    /// within one smoothed RTT of the last reduction belong to the same congestion event and
    /// are ignored.
    fn reduce(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last_reduction {
            if now < last + self.rtt_smoothed {
                return false;
            }
        }
        self.last_reduction = Some(now);
        self.w_max_bytes = self.window_bytes;
        self.window_bytes *= self.beta;
        self.clamp_window();
        self.ssthresh_bytes = self.window_bytes;
        self.k_rtts = self.compute_k();
        self.epoch_start = Some(now);
        self.w_est_bytes = self.window_bytes;
        true
    }

    /// Congestion avoidance for one ACK frame that acknowledged `acked_bytes`.
    fn avoid_congestion(&mut self, now: Instant, acked_bytes: f64) {
        let epoch_start = match self.epoch_start {
            Some(start) => start,
            None => {
                // Left slow start without a reduction (at ssthresh after an RTO, or never
                // reduced): start the curve here, on a plateau if we are above W_max.
                if self.w_max_bytes <= self.window_bytes {
                    self.w_max_bytes = self.window_bytes;
                }
                self.k_rtts = self.compute_k();
                self.w_est_bytes = self.window_bytes;
                self.epoch_start = Some(now);
                now
            }
        };
        // Share of a window this frame acknowledged; capped so one huge ACK cannot overshoot.
        let acked_share = (acked_bytes / self.window_bytes).min(1.0);

        // Reno-friendly estimate (RFC 9438 §4.3): grows by alpha packets per window acked,
        // alpha = 3(1 − β)/(1 + β) below W_max so it matches Reno's average rate, 1 above.
        let alpha = if self.w_est_bytes < self.w_max_bytes { 3.0 * (1.0 - self.beta) / (1.0 + self.beta) } else { 1.0 };
        self.w_est_bytes += alpha * self.mss_bytes * acked_share;

        if self.rtt_smoothed.is_zero() {
            // No RTT yet, so no cubic clock: grow like Reno.
            self.window_bytes = self.window_bytes.max(self.w_est_bytes);
            self.clamp_window();
            return;
        }
        let t_rtts = (now - epoch_start).as_nanos() as f64 / self.rtt_smoothed.as_nanos() as f64;
        let w_cubic_bytes = |t: f64| (self.c * (t - self.k_rtts).powi(3) * self.mss_bytes + self.w_max_bytes).max(0.0);
        if w_cubic_bytes(t_rtts) < self.w_est_bytes {
            // Reno-friendly region: a Reno flow would have a larger window by now.
            self.window_bytes = self.window_bytes.max(self.w_est_bytes);
        } else {
            // Aim at where the curve will be one RTT from now, never more than 1.5× per RTT.
            let target = w_cubic_bytes(t_rtts + 1.0).clamp(self.window_bytes, 1.5 * self.window_bytes);
            self.window_bytes += (target - self.window_bytes) * acked_share;
        }
        self.clamp_window();
    }
}

/// Whether the sender was using enough of its window for an ACK to justify growth: the bytes
/// in flight before this frame were at least half the window.
pub(super) fn window_limited(event: &AckEvent, window_bytes: f64) -> bool {
    let in_flight_before = event.bytes_in_flight.saturating_add(event.newly_acked_bytes);
    2.0 * in_flight_before as f64 >= window_bytes
}

impl CongestionControl for Cubic {
    fn name(&self) -> &'static str {
        "cubic"
    }

    fn window_bytes(&self) -> u64 {
        self.window_bytes as u64
    }

    fn on_ack(&mut self, event: &AckEvent) {
        self.note_rtt(event.rtt_smoothed);
        if event.newly_acked_bytes > 0 {
            // Data got through, so a later RTO starts a new episode.
            self.in_rto_episode = false;
        }
        if self.ecn_as_loss && event.ecn_ce_packets > 0 {
            // Marks mean the queue is building: no growth on this frame, and at most one
            // reduction per RTT like a loss.
            self.reduce(event.now);
            return;
        }
        if event.newly_acked_bytes == 0 || !window_limited(event, self.window_bytes) {
            return;
        }
        let acked = event.newly_acked_bytes as f64;
        if self.in_slow_start() {
            // Exponential growth, stopping at ssthresh; the next frame continues in avoidance.
            let ceiling = self.ssthresh_bytes.min(self.max_window_bytes);
            self.window_bytes = (self.window_bytes + acked).min(ceiling.max(self.window_bytes));
            self.clamp_window();
        } else {
            self.avoid_congestion(event.now, acked);
        }
    }

    fn on_loss(&mut self, event: &LossEvent) {
        self.note_rtt(event.rtt_smoothed);
        if event.lost_packets == 0 && event.lost_bytes == 0 {
            return;
        }
        self.reduce(event.now);
    }

    fn on_rto(&mut self, now: Instant) {
        // The whole window was lost or the path died: restart from the minimum, remembering
        // where congestion started so avoidance aims back at it after slow start. A backed-off
        // RTO with no ACK in between keeps what the first one remembered.
        self.last_reduction = Some(now);
        if self.in_rto_episode {
            self.window_bytes = self.min_window_bytes;
            return;
        }
        self.in_rto_episode = true;
        let old = self.window_bytes;
        self.w_max_bytes = old;
        self.ssthresh_bytes = (old * self.beta).max(self.min_window_bytes);
        self.window_bytes = self.min_window_bytes;
        self.epoch_start = None;
        self.w_est_bytes = self.window_bytes;
    }
}
