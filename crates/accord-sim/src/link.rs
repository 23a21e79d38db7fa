//! Links: a sending NIC that serialises at a rate, then per-path propagation with faults.
//!
//! All paths of a host share its NIC (the bottleneck, as on a real host); each path has its own
//! propagation and can be cut on its own. A corrupted frame is caught by the link's frame check
//! and dropped (counted as corrupted), as Ethernet's FCS and the UDP checksum do on real hosts;
//! `corrupt_undetected` flips a bit past that check, for the protocol's own CRC to catch, and
//! `replay` delivers late verbatim copies.

use accord_proto::Instant;
use core::time::Duration;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Bytes of framing (Ethernet, IP, UDP) added to each datagram on the wire.
pub const FRAMING_BYTES: u64 = 64;

/// Rate and delay of the links between two hosts.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkConfig {
    /// NIC line rate, bits per second.
    pub rate_bps: u64,
    /// One-way propagation per path (RTT is twice this plus serialisation).
    pub propagation: Duration,
    /// Bytes the driver lets queue in the NIC before it stops asking the protocol for more
    /// (what BQL or a TX ring does on a real host).
    pub nic_queue_bytes_max: u64,
}

impl LinkConfig {
    /// 100 Gbit/s, 10 µs RTT: the reference pair.
    pub fn datacenter_100g() -> Self {
        LinkConfig { rate_bps: 100_000_000_000, propagation: Duration::from_micros(5), nic_queue_bytes_max: 64 * 1024 }
    }

    /// Time to serialise `bytes` datagram bytes (framing added).
    pub fn serialisation(&self, bytes: u64) -> Duration {
        let bits = (bytes + FRAMING_BYTES) * 8;
        Duration::from_nanos(((bits as u128 * 1_000_000_000) / self.rate_bps.max(1) as u128) as u64)
    }
}

/// Seeded faults applied to every datagram in both directions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultConfig {
    pub loss: f64,
    pub duplicate: f64,
    /// Probability a datagram is held back by up to `reorder_delay` extra.
    pub reorder: f64,
    pub reorder_delay: Duration,
    pub corrupt: f64,
    /// Probability a delivered datagram is captured and delivered once more, verbatim, up to
    /// `replay_delay_max` later: a late duplicate from the network or a hostile replay. Many
    /// RTTs late, so what it acknowledges or asks for has long been settled.
    pub replay: f64,
    pub replay_delay_max: Duration,
    /// Probability a delivered datagram has one bit flipped *after* the link's frame check (a
    /// fault the UDP checksum misses, or one past it): only the protocol's end-to-end check
    /// can catch it.
    pub corrupt_undetected: f64,
    /// Probability that a host, about to send a datagram, first stalls for up to `stall_max`
    /// (uniformly): everything it sends waits, in order, nothing is lost. A receiver whose
    /// worker was descheduled, or whose shared-memory ring queued up, acknowledges so late.
    pub stall: f64,
    pub stall_max: Duration,
}

/// What the fault model decided for one datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    Lost,
    Corrupted,
    /// Deliver after these extra delays (two entries for a duplicate).
    Deliver(Vec<Duration>),
}

impl FaultConfig {
    pub fn decide(&self, rng: &mut ChaCha8Rng) -> Fate {
        if self.loss > 0.0 && rng.gen_bool(self.loss.min(1.0)) {
            return Fate::Lost;
        }
        if self.corrupt > 0.0 && rng.gen_bool(self.corrupt.min(1.0)) {
            return Fate::Corrupted;
        }
        let mut delays = vec![self.extra_delay(rng)];
        if self.duplicate > 0.0 && rng.gen_bool(self.duplicate.min(1.0)) {
            delays.push(self.extra_delay(rng));
        }
        Fate::Deliver(delays)
    }

    /// For a datagram being delivered: when to deliver its replay, if it gets one. Draws from
    /// `rng` only when replays are configured, so other configurations keep their streams.
    pub fn decide_replay(&self, rng: &mut ChaCha8Rng) -> Option<Duration> {
        if self.replay <= 0.0 || self.replay_delay_max.is_zero() || !rng.gen_bool(self.replay.min(1.0)) {
            return None;
        }
        Some(Duration::from_nanos(rng.gen_range(1..=self.replay_delay_max.as_nanos() as u64)))
    }

    /// For a datagram about to be sent: how long its host stalls first, if it does. Draws only
    /// when stalls are configured, so other configurations keep their streams.
    pub fn decide_stall(&self, rng: &mut ChaCha8Rng) -> Option<Duration> {
        if self.stall <= 0.0 || self.stall_max.is_zero() || !rng.gen_bool(self.stall.min(1.0)) {
            return None;
        }
        Some(Duration::from_nanos(rng.gen_range(1..=self.stall_max.as_nanos() as u64)))
    }

    /// For a datagram of `len` bytes being delivered: the bit to flip past the frame check, if
    /// any. Draws only when such corruption is configured.
    pub fn decide_undetected_flip(&self, rng: &mut ChaCha8Rng, len: usize) -> Option<usize> {
        if self.corrupt_undetected <= 0.0 || len == 0 || !rng.gen_bool(self.corrupt_undetected.min(1.0)) {
            return None;
        }
        Some(rng.gen_range(0..len * 8))
    }

    fn extra_delay(&self, rng: &mut ChaCha8Rng) -> Duration {
        if self.reorder > 0.0 && !self.reorder_delay.is_zero() && rng.gen_bool(self.reorder.min(1.0)) {
            Duration::from_nanos(rng.gen_range(0..=self.reorder_delay.as_nanos() as u64))
        } else {
            Duration::ZERO
        }
    }
}

/// One host's NIC: a FIFO that serialises at the line rate.
#[derive(Clone, Debug, Default)]
pub struct Nic {
    free_at: Instant,
    queued_bytes: u64,
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
}

impl Nic {
    /// Queues a datagram at `now`; returns when its last bit leaves.
    pub fn enqueue(&mut self, now: Instant, bytes: u64, link: &LinkConfig) -> Instant {
        let start = self.free_at.max(now);
        self.free_at = start + link.serialisation(bytes);
        self.queued_bytes += bytes;
        self.datagrams_sent += 1;
        self.bytes_sent += bytes;
        self.free_at
    }

    /// The host stalls from `now` (or from when the NIC frees up) for `pause`: later datagrams
    /// start serialising after it.
    pub fn stall(&mut self, now: Instant, pause: Duration) {
        self.free_at = self.free_at.max(now) + pause;
    }

    /// A datagram of `bytes` finished serialising.
    pub fn dequeued(&mut self, bytes: u64) {
        self.queued_bytes = self.queued_bytes.saturating_sub(bytes);
    }

    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes
    }

    pub fn free_at(&self) -> Instant {
        self.free_at
    }
}
