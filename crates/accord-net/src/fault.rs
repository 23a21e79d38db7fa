//! A seeded fault injector that wraps any datapath.
//!
//! Faults are decided per packet (a segmented send is split, so loss hits
//! single packets as on a real wire) on the send side; cut paths swallow
//! traffic in both directions. Every decision comes from one ChaCha stream
//! seeded by the caller, drawing the same number of values per packet, so a
//! seed replays the same faults for the same traffic. Time comes from an
//! injectable [`Clock`], so delays are deterministic under a `ManualClock`.

mod control;

use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use control::{FaultControl, FaultStats, BLACKHOLE_MAX};

use crate::clock::{Clock, SystemClock};
use crate::{Datapath, DatapathError, RxBuffers, TxDatagram};

/// Default bound on packets held for reordering or delay.
pub const HELD_PACKETS_MAX_DEFAULT: usize = 4096;

/// What faults to inject. Probabilities are per packet, in `[0, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Probability a packet vanishes.
    pub drop: f64,
    /// Probability a packet is sent twice.
    pub duplicate: f64,
    /// Probability a packet is held back and sent after later ones.
    pub reorder: f64,
    /// How many later packets overtake a reordered one.
    pub reorder_delay_packets: u32,
    /// Longest a reordered packet waits for those later packets, so a
    /// sender that goes quiet still gets it out. Default 10 ms.
    pub reorder_hold_max: Duration,
    /// Probability one byte of a packet is flipped.
    pub corrupt: f64,
    /// Hold every packet this long before sending it (released on a later
    /// call once the clock has passed the deadline).
    pub delay: Option<Duration>,
    /// Paths cut from the start; change at run time through [`FaultControl`].
    pub cut_paths: BTreeSet<u16>,
    /// Most packets held at once for reordering or delay; beyond it packets
    /// go out at once (counted neither reordered nor delayed).
    pub held_packets_max: usize,
    /// Probability a packet is captured and sent again, verbatim, `replay_delay` later (a
    /// late duplicate from the network, or a replay by a hostile host). The original goes out
    /// as usual.
    pub replay: f64,
    /// How long after the original a replay goes out. Default 2 s: long after whatever the
    /// packet acknowledged or asked for was settled.
    pub replay_delay: Duration,
    /// Probability one bit within the packet's first `header_bytes` is flipped. The injector
    /// runs before the socket, so the kernel computes the UDP checksum over the flipped bytes
    /// and it passes: only the protocol's own end-to-end check can catch it.
    pub corrupt_header: f64,
    /// Bytes `corrupt_header` aims at. Default 108 (Accord's data header).
    pub header_bytes: usize,
}

impl Default for FaultConfig {
    /// No faults at all: the wrapper is transparent.
    fn default() -> Self {
        FaultConfig {
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay_packets: 3,
            reorder_hold_max: Duration::from_millis(10),
            corrupt: 0.0,
            delay: None,
            cut_paths: BTreeSet::new(),
            held_packets_max: HELD_PACKETS_MAX_DEFAULT,
            replay: 0.0,
            replay_delay: Duration::from_secs(2),
            corrupt_header: 0.0,
            header_bytes: 108,
        }
    }
}

impl FaultConfig {
    /// Checks that probabilities are in `[0, 1]` and bounds are sane.
    pub fn validate(&self) -> Result<(), DatapathError> {
        for (name, p) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
            ("replay", self.replay),
            ("corrupt_header", self.corrupt_header),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(DatapathError::InvalidConfig(format!(
                    "fault probability {name} = {p} must be within 0..=1"
                )));
            }
        }
        if self.held_packets_max == 0 || self.held_packets_max > 1 << 20 {
            return Err(DatapathError::InvalidConfig(format!(
                "held_packets_max {} must be in 1..={}",
                self.held_packets_max,
                1 << 20
            )));
        }
        Ok(())
    }
}

/// A packet the injector owns (held, altered, or waiting for socket space).
#[derive(Debug, Clone)]
struct OwnedPacket {
    path: u16,
    dst: SocketAddr,
    bytes: Vec<u8>,
    segment_bytes: Option<u16>,
    ecn_capable: bool,
}

impl OwnedPacket {
    fn as_tx(&self) -> TxDatagram<'_> {
        TxDatagram {
            path: self.path,
            dst: self.dst,
            bytes: &self.bytes,
            segment_bytes: self.segment_bytes,
            ecn_capable: self.ecn_capable,
        }
    }
}

#[derive(Debug)]
struct Held {
    /// Not before the clock reaches this (the delay; hold time if none).
    release_at: Duration,
    /// Reordered: then also wait until `packets_out` reaches `.0`, or the
    /// clock reaches `.1`, whichever is first.
    reorder: Option<(u64, Duration)>,
    packet: OwnedPacket,
}

impl Held {
    fn due(&self, now: Duration, packets_out: u64) -> bool {
        now >= self.release_at
            && self.reorder.is_none_or(|(after, give_up_at)| packets_out >= after || now >= give_up_at)
    }

    /// Earliest clock time at which this packet may become due.
    fn next_deadline(&self, now: Duration) -> Duration {
        match self.reorder {
            _ if now < self.release_at => self.release_at,
            Some((_, give_up_at)) => give_up_at,
            None => now,
        }
    }
}

/// The fate of one packet, drawn by [`FaultInjector::decide`].
#[derive(Debug, Default)]
struct Decision {
    gone: bool,
    /// Replacement bytes when corrupted.
    altered: Option<Vec<u8>>,
    /// Send one extra copy now.
    duplicate: bool,
    /// Send one verbatim copy at this clock time.
    replay_at: Option<Duration>,
    /// Hold: (delay deadline, reorder condition), as in [`Held`].
    hold: Option<(Duration, Option<(u64, Duration)>)>,
}

impl Decision {
    fn untouched(&self) -> bool {
        !self.gone && self.altered.is_none() && !self.duplicate && self.hold.is_none() && self.replay_at.is_none()
    }
}

/// One packet (or whole datagram) to hand to the inner datapath now.
enum Out {
    /// `batch[index]` as it came.
    Whole(usize),
    /// Bytes `start..end` of `batch[index]`, as an unsegmented packet.
    Segment(usize, usize, usize),
    /// A packet the injector owns (corrupted).
    Owned(OwnedPacket),
}

/// Wraps a datapath and injects faults. See the module documentation.
pub struct FaultInjector<D: Datapath> {
    inner: D,
    config: FaultConfig,
    rng: ChaCha8Rng,
    control: Arc<FaultControl>,
    clock: Arc<dyn Clock>,
    held: Vec<Held>,
    /// Packets the inner datapath had no room for, sent first next time.
    /// Bounded by one call's output, since a non-empty backlog refuses input.
    backlog: VecDeque<OwnedPacket>,
    packets_out: u64,
}

impl<D: Datapath> std::fmt::Debug for FaultInjector<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultInjector")
            .field("config", &self.config)
            .field("held", &self.held.len())
            .field("backlog", &self.backlog.len())
            .field("stats", &self.control.stats())
            .finish_non_exhaustive()
    }
}

impl<D: Datapath> FaultInjector<D> {
    /// Wraps `inner` with faults drawn from `seed`, on the system clock.
    pub fn new(inner: D, config: FaultConfig, seed: u64) -> Result<Self, DatapathError> {
        Self::with_clock(inner, config, seed, Arc::new(SystemClock::new()))
    }

    /// Wraps `inner` with faults drawn from `seed`, timed by `clock`.
    pub fn with_clock(inner: D, config: FaultConfig, seed: u64, clock: Arc<dyn Clock>) -> Result<Self, DatapathError> {
        config.validate()?;
        let control = Arc::new(FaultControl::new(inner.path_count(), clock.clone()));
        for &path in &config.cut_paths {
            if !control.cut_path(path) {
                return Err(DatapathError::UnknownPath { path, path_count: inner.path_count() });
            }
        }
        Ok(FaultInjector {
            inner,
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            control,
            clock,
            held: Vec::new(),
            backlog: VecDeque::new(),
            packets_out: 0,
        })
    }

    /// Handle for cutting and restoring paths and reading counters from any thread.
    pub fn control(&self) -> Arc<FaultControl> {
        self.control.clone()
    }

    /// Counters so far.
    pub fn stats(&self) -> FaultStats {
        self.control.stats()
    }

    /// Cuts `path` (same as through [`FaultInjector::control`]); false if unknown.
    pub fn cut_path(&self, path: u16) -> bool {
        self.control.cut_path(path)
    }

    /// Restores `path`; false if unknown.
    pub fn restore_path(&self, path: u16) -> bool {
        self.control.restore_path(path)
    }

    /// The wrapped datapath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Mutable access to the wrapped datapath.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// Packets held for reordering or delay, plus those waiting for room.
    pub fn pending_packets(&self) -> usize {
        self.held.len() + self.backlog.len()
    }

    /// Releases every held packet now, regardless of deadlines, and tries to
    /// send them; returns how many are still pending (inner datapath full).
    pub fn flush(&mut self) -> Result<usize, DatapathError> {
        for held in self.held.drain(..) {
            self.backlog.push_back(held.packet);
        }
        self.send_backlog()?;
        Ok(self.pending_packets())
    }

    /// Moves due held packets to the backlog and sends the backlog.
    fn release_due(&mut self) -> Result<(), DatapathError> {
        if !self.held.is_empty() {
            let now = self.clock.now();
            let packets_out = self.packets_out;
            // Release keeps hold order among the packets that are due.
            let (due, keep): (Vec<Held>, Vec<Held>) = self.held.drain(..).partition(|h| h.due(now, packets_out));
            self.held = keep;
            self.backlog.extend(due.into_iter().map(|h| h.packet));
        }
        self.send_backlog()
    }

    fn send_backlog(&mut self) -> Result<(), DatapathError> {
        // Bounded: each round sends at least one packet or stops.
        while !self.backlog.is_empty() {
            let (front, back) = self.backlog.as_slices();
            let slice = if front.is_empty() { back } else { front };
            let batch: Vec<TxDatagram<'_>> = slice.iter().map(OwnedPacket::as_tx).collect();
            let sent = self.inner.send_batch(&batch)?;
            let packets: usize = batch[..sent].iter().map(TxDatagram::segment_count).sum();
            let all_sent = sent == batch.len();
            drop(batch);
            self.packets_out += packets as u64;
            self.backlog.drain(..sent);
            if !all_sent {
                break;
            }
        }
        Ok(())
    }

    /// Draws the fate of one packet. Always draws four numbers (plus two
    /// when corrupting) so decisions line up across runs with one seed.
    fn decide(&mut self, path: u16, bytes: &[u8], now: Duration) -> Decision {
        let drop_draw: f64 = self.rng.gen();
        let duplicate_draw: f64 = self.rng.gen();
        let reorder_draw: f64 = self.rng.gen();
        let corrupt_draw: f64 = self.rng.gen();
        let mut decision = Decision::default();
        if self.control.is_cut(path) {
            self.control.count_cut(1);
            decision.gone = true;
            return decision;
        }
        if drop_draw < self.config.drop {
            self.control.count_dropped();
            decision.gone = true;
            return decision;
        }
        if corrupt_draw < self.config.corrupt && !bytes.is_empty() {
            let mut copy = bytes.to_vec();
            let index = self.rng.gen_range(0..copy.len());
            let flip: u8 = self.rng.gen_range(1..=u8::MAX);
            copy[index] ^= flip;
            decision.altered = Some(copy);
            self.control.count_corrupted();
        }
        // Drawn only when configured, so earlier configurations keep their streams.
        if self.config.corrupt_header > 0.0 && !bytes.is_empty() && self.rng.gen::<f64>() < self.config.corrupt_header {
            let mut copy = decision.altered.take().unwrap_or_else(|| bytes.to_vec());
            let bit = self.rng.gen_range(0..copy.len().min(self.config.header_bytes.max(1)) * 8);
            copy[bit / 8] ^= 1 << (bit % 8);
            decision.altered = Some(copy);
            self.control.count_header_corrupted();
        }
        if self.config.replay > 0.0 && self.rng.gen::<f64>() < self.config.replay {
            decision.replay_at = Some(now + self.config.replay_delay);
        }
        if duplicate_draw < self.config.duplicate {
            decision.duplicate = true;
            self.control.count_duplicated();
        }
        if self.held.len() >= self.config.held_packets_max {
            return decision;
        }
        let release_at = match self.config.delay {
            Some(delay) => {
                self.control.count_delayed();
                now + delay
            }
            None => now,
        };
        let reorder = (reorder_draw < self.config.reorder).then(|| {
            self.control.count_reordered();
            let after = self.packets_out + u64::from(self.config.reorder_delay_packets);
            (after, release_at + self.config.reorder_hold_max)
        });
        if self.config.delay.is_some() || reorder.is_some() {
            decision.hold = Some((release_at, reorder));
        }
        decision
    }
}

impl<D: Datapath> Datapath for FaultInjector<D> {
    crate::datapath::wrapped_identity!(inner);

    /// Consumes the whole batch (each packet is sent, dropped, held, or
    /// queued for room) unless packets from an earlier call still wait for
    /// room in the inner datapath, in which case it returns 0.
    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DatapathError> {
        self.inner.validate_batch(batch)?;
        self.release_due()?;
        if !self.backlog.is_empty() {
            return Ok(0);
        }
        let now = self.clock.now();
        let mut out: Vec<Out> = Vec::with_capacity(batch.len());
        let mut decisions: Vec<Decision> = Vec::new();
        for (index, dgram) in batch.iter().enumerate() {
            decisions.clear();
            for segment in dgram.segments() {
                let decision = self.decide(dgram.path, segment, now);
                decisions.push(decision);
            }
            if decisions.iter().all(Decision::untouched) {
                out.push(Out::Whole(index));
                continue;
            }
            let owned = |bytes: Vec<u8>| OwnedPacket {
                path: dgram.path,
                dst: dgram.dst,
                bytes,
                segment_bytes: None,
                ecn_capable: dgram.ecn_capable,
            };
            let stride = dgram.segment_bytes.map_or(dgram.bytes.len(), usize::from).max(1);
            for (k, decision) in decisions.drain(..).enumerate() {
                if decision.gone {
                    continue;
                }
                let start = k * stride;
                let end = (start + stride).min(dgram.bytes.len());
                let now_copies = usize::from(decision.duplicate) + usize::from(decision.hold.is_none());
                for _ in 0..now_copies {
                    out.push(match &decision.altered {
                        Some(bytes) => Out::Owned(owned(bytes.clone())),
                        None => Out::Segment(index, start, end),
                    });
                }
                if let Some(release_at) = decision.replay_at {
                    // Replays ride the hold queue and its bound: a full queue loses them.
                    if self.held.len() < self.config.held_packets_max {
                        self.control.count_replayed();
                        let bytes = dgram.bytes[start..end].to_vec();
                        self.held.push(Held { release_at, reorder: None, packet: owned(bytes) });
                    }
                }
                if let Some((release_at, reorder)) = decision.hold {
                    let bytes = decision.altered.unwrap_or_else(|| dgram.bytes[start..end].to_vec());
                    self.held.push(Held { release_at, reorder, packet: owned(bytes) });
                }
            }
        }
        let tx: Vec<TxDatagram<'_>> = out
            .iter()
            .map(|o| match o {
                Out::Whole(i) => batch[*i],
                Out::Segment(i, start, end) => {
                    TxDatagram { bytes: &batch[*i].bytes[*start..*end], segment_bytes: None, ..batch[*i] }
                }
                Out::Owned(packet) => packet.as_tx(),
            })
            .collect();
        let sent = if tx.is_empty() { 0 } else { self.inner.send_batch(&tx)? };
        let packets: usize = tx[..sent].iter().map(TxDatagram::segment_count).sum();
        self.packets_out += packets as u64;
        for dgram in &tx[sent..] {
            self.backlog.push_back(OwnedPacket {
                path: dgram.path,
                dst: dgram.dst,
                bytes: dgram.bytes.to_vec(),
                segment_bytes: dgram.segment_bytes,
                ecn_capable: dgram.ecn_capable,
            });
        }
        Ok(batch.len())
    }

    /// Receives from the inner datapath and discards what arrived on cut
    /// paths; also releases held packets that are due.
    fn recv_batch(&mut self, bufs: &mut RxBuffers, max: usize) -> Result<usize, DatapathError> {
        self.release_due()?;
        self.inner.recv_batch(bufs, max)?;
        let control = &self.control;
        if control.any_cut() {
            bufs.retain(|_, meta| {
                let cut = control.drops_arrivals(meta.path);
                if cut {
                    control.count_cut(meta.segment_count() as u64);
                }
                !cut
            });
        }
        Ok(bufs.len())
    }

    fn local_channel_has_data(&self) -> bool {
        self.inner.local_channel_has_data()
    }

    /// Never: this wrapper stands for a network that corrupts, so whatever it carries (a
    /// ring underneath included) is sealed as for a network.
    fn is_local_channel(&self, _dst: SocketAddr) -> bool {
        false
    }

    /// Waits on the inner datapath, but no longer than until the next held
    /// packet is due, so held packets go out even when the caller is idle.
    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, DatapathError> {
        self.release_due()?;
        let now = self.clock.now();
        let timeout = match self.held.iter().map(|h| h.next_deadline(now)).min() {
            Some(next) => timeout.min(next.saturating_sub(now)),
            None => timeout,
        };
        let readable = self.inner.wait_readable(timeout)?;
        self.release_due()?;
        Ok(readable)
    }

    crate::datapath::wrapped_local_channel!(inner);
}

#[cfg(test)]
mod tests;
