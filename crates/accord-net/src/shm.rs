//! Shared-memory datapath for peers on the same host: a wrapper around a UDP datapath that
//! moves datagrams through single-producer/single-consumer rings in shared files instead of the
//! kernel, and keeps the sockets for discovery, doorbells and fallback.
//!
//! Only the carrier changes: the transport above still runs its full protocol (sequence
//! numbers, acknowledgements, congestion control, multipath) over these datagrams, so a ring
//! that disappears mid-transfer costs retransmissions over UDP, not data.
//!
//! How a ring comes up (one per direction between a lane here and a lane there):
//! 1. the engine says a peer is on this host ([`Datapath::offer_local_channel`] with the
//!    peer's path addresses), or the peer offered a ring first (then we offer one back);
//! 2. we create `dir/accord-<pid>-<random>-<n>` (mode 0600), and send an *attach* control
//!    datagram (see `control`) from our path 0 to the peer's path 0;
//! 3. the peer opens, maps and validates it (size, magic, nonce, owner), unlinks the name and
//!    answers *attached*, or *refused*; until *attached* arrives (retried, then given up) we
//!    keep sending over UDP.
//!
//! Sending: datagrams whose destination belongs to an attached peer are appended to its ring
//! (a full ring ends the batch early, like a full socket); the rest go to UDP in order.
//! Receiving: `recv_batch` takes UDP datagrams, strips control datagrams, then drains the
//! rings, presenting each entry with the path and source address UDP would have given.
//! Sleeping: a consumer sets a flag in the ring header before it sleeps in `poll`; a producer
//! that sees the flag after publishing sends a doorbell datagram to its path 0 (a SeqCst fence
//! on each side, so one of them always sees the other).
//!
//! Failure: a consumer that finds garbage in a ring (or is dropped) marks it closed; a producer
//! that sees the mark, or whose ring stays full while the consumer process no longer exists,
//! abandons the ring and goes back to UDP. A ring full for [`RING_STALL_DROP`] with a live
//! consumer has its datagrams dropped (the protocol retransmits or times out) so one stuck peer
//! cannot stall the sends to everyone else.
//!
//! Copies per byte: the sender gathers each datagram straight into a ring slot
//! ([`Datapath::send_direct`]; datagrams that went through `send_batch` take one more copy),
//! the receiver copies the entry into a receive slot (the copy-out that makes the bytes safe to
//! parse) and then places the payload. Placing straight from the ring (parsing a copied-out
//! header only) would save one more; it needs a receive API that lends ring memory.

mod config;
pub mod control;
pub mod ring;
pub(crate) mod stats;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use config::{ShmConfig, SHM_RING_BYTES_DEFAULT, SHM_SPIN_DEFAULT, SHM_SPIN_MAX};
use control::Control;
use ring::{Consumer, Producer, Push};
pub use stats::ShmStats;

use crate::{Datapath, DatapathError, DirectSend, RxBuffers, RxMeta, TxDatagram, RX_SLOT_BYTES_MAX};

/// Most peers (remote lanes) one datapath keeps ring state for; beyond it, peers use UDP.
pub const REMOTES_MAX: usize = 1024;
/// Wait before an unanswered attach is sent again.
pub const ATTACH_RETRY: Duration = Duration::from_millis(20);
/// Attach attempts before giving up on a peer (it stays on UDP).
pub const ATTACH_TRIES_MAX: u32 = 25;
/// A ring full this long makes the producer check whether the consumer still exists.
pub const RING_STALL_CHECK: Duration = Duration::from_millis(10);
/// A ring full this long with its consumer alive has its datagrams dropped, not queued.
pub const RING_STALL_DROP: Duration = Duration::from_secs(1);
/// Control datagrams handled per receive call (more are dropped; attach is retried).
pub const CONTROL_PER_RECV_MAX: usize = 64;
/// Control datagrams waiting for socket room (more are dropped).
pub const CONTROL_QUEUED_MAX: usize = 256;
/// A ring file older than this whose creating process is gone is removed at startup: a live
/// offer is answered (or abandoned) within [`ATTACH_RETRY`] x [`ATTACH_TRIES_MAX`], so only
/// files left by a crash are that old.
pub const STALE_RING_AGE: Duration = Duration::from_secs(60);
/// A receiver spins on its rings before sleeping only if a ring delivered something this
/// recently: a stream is active. Idle engines (many per process in tests, one per peer
/// group in production) then sleep at once instead of burning cores.
pub const SPIN_AFTER_RX_WITHIN: Duration = Duration::from_millis(1);
/// Directory entries looked at by one stale-file sweep.
pub const SWEEP_ENTRIES_MAX: usize = 4096;

/// What one append to a ring came to.
enum RingPush {
    Written,
    Cancelled,
    /// No room; retry later.
    Full,
    /// Full for so long that the datagram was dropped.
    Dropped,
    /// The ring was given up; the datagram goes to UDP.
    Abandoned,
}

enum TxRing {
    /// Not offered yet.
    Idle,
    /// Offered, waiting for the answer.
    Pending { producer: Producer, sent_at: Instant, tries: u32 },
    /// In use.
    Attached { producer: Producer, full_since: Option<Instant> },
    /// Refused, failed or abandoned: this peer stays on UDP.
    Off,
}

struct Remote {
    /// The peer lane's path addresses; index = its path id.
    paths: Vec<SocketAddr>,
    tx: TxRing,
    /// The ring the peer writes to us, with its nonce.
    rx: Option<(Consumer, u64)>,
}

/// The wrapper. See the module documentation.
pub struct ShmDatapath<D> {
    inner: D,
    config: ShmConfig,
    local_paths: Vec<SocketAddr>,
    name_prefix: String,
    rings_made: u64,
    remotes: Vec<Remote>,
    /// Peer path address -> (remote index, its path id).
    routes: HashMap<SocketAddr, (usize, u16)>,
    dirty: Vec<usize>,
    control_out: Vec<(SocketAddr, Vec<u8>)>,
    rx_next: usize,
    /// When a ring last delivered an entry (spinning is worth it only during a stream).
    last_ring_rx: Option<Instant>,
    /// Rings whose consumed space is not handed back yet: entries of the last batch were lent
    /// in place (see [`crate::LentBytes`]), so the space is released at our next call.
    unreleased: bool,
    /// Consumers replaced or abandoned while entries of theirs may be lent: unmapped at our
    /// next call, not before.
    retired: Vec<Consumer>,
    stats: ShmStats,
}

impl<D> std::fmt::Debug for ShmDatapath<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmDatapath").field("config", &self.config).field("stats", &self.stats).finish_non_exhaustive()
    }
}

impl<D: Datapath> ShmDatapath<D> {
    /// Wraps `inner` (whose path 0 carries control datagrams).
    pub fn new(inner: D, config: ShmConfig) -> Result<Self, DatapathError> {
        config.validate()?;
        if config.enabled {
            sweep_stale_rings(&config.dir);
        }
        let local_paths = (0..inner.path_count()).filter_map(|p| inner.local_addr(p)).collect();
        let name_prefix = format!("accord-{}-{:016x}", std::process::id(), random_u64());
        Ok(ShmDatapath {
            inner,
            config,
            local_paths,
            name_prefix,
            rings_made: 0,
            remotes: vec![],
            routes: HashMap::new(),
            dirty: vec![],
            control_out: vec![],
            rx_next: 0,
            last_ring_rx: None,
            unreleased: false,
            retired: vec![],
            stats: ShmStats::default(),
        })
    }

    /// Counters since creation.
    pub fn stats(&self) -> ShmStats {
        self.stats
    }

    /// The wrapped datapath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The remote whose path 0 is `paths[0]`, registered if new (None when the table is full).
    fn remote_for(&mut self, paths: &[SocketAddr]) -> Option<usize> {
        let first = *paths.first()?;
        if let Some(&(idx, 0)) = self.routes.get(&first) {
            if self.remotes[idx].paths == paths {
                return Some(idx);
            }
            // Same path 0, different lane layout: a new engine reusing the port.
            let old =
                std::mem::replace(&mut self.remotes[idx], Remote { paths: paths.to_vec(), tx: TxRing::Idle, rx: None });
            self.retired.extend(old.rx.map(|(c, _)| c));
            self.routes.retain(|_, (i, _)| *i != idx);
            for (p, a) in paths.iter().enumerate() {
                self.routes.insert(*a, (idx, p as u16));
            }
            return Some(idx);
        }
        if self.remotes.len() >= REMOTES_MAX {
            return None;
        }
        let idx = self.remotes.len();
        self.remotes.push(Remote { paths: paths.to_vec(), tx: TxRing::Idle, rx: None });
        for (p, a) in paths.iter().enumerate() {
            self.routes.insert(*a, (idx, p as u16));
        }
        Some(idx)
    }

    fn queue_control(&mut self, dst: SocketAddr, msg: &Control) {
        if self.control_out.len() < CONTROL_QUEUED_MAX {
            self.control_out.push((dst, msg.encode()));
        }
    }

    /// Sends queued control datagrams from path 0; what the socket has no room for, or a send
    /// error, drops them (attach is retried, a lost doorbell costs at most the sleeper's
    /// timeout), so a control hiccup never fails the data call it rides on.
    fn flush_control(&mut self) {
        if self.control_out.is_empty() {
            return;
        }
        let batch: Vec<TxDatagram<'_>> =
            self.control_out.iter().map(|(dst, bytes)| TxDatagram::new(0, *dst, bytes)).collect();
        if let Err(e) = self.inner.send_batch(&batch) {
            tracing::debug!(error = %e, "shared-memory control datagrams dropped");
        }
        self.control_out.clear();
    }

    fn start_attach(&mut self, idx: usize) {
        if self.local_paths.is_empty() {
            return;
        }
        self.rings_made += 1;
        let name = format!("{}-{}", self.name_prefix, self.rings_made);
        let nonce = random_u64();
        match Producer::create(&self.config.dir, &name, self.config.ring_bytes, nonce) {
            Ok(producer) => {
                let msg = Control::Attach {
                    nonce,
                    data_bytes: self.config.ring_bytes as u64,
                    name,
                    paths: self.local_paths.clone(),
                };
                let dst = self.remotes[idx].paths[0];
                self.queue_control(dst, &msg);
                self.remotes[idx].tx = TxRing::Pending { producer, sent_at: Instant::now(), tries: 1 };
            }
            Err(e) => {
                tracing::info!(error = %e, dir = %self.config.dir.display(), "no shared-memory ring; peer stays on UDP");
                self.stats.attach_failed_local += 1;
                self.remotes[idx].tx = TxRing::Off;
            }
        }
    }

    /// Retries unanswered offers; gives up after [`ATTACH_TRIES_MAX`].
    fn tick(&mut self) {
        let now = Instant::now();
        for idx in 0..self.remotes.len() {
            let TxRing::Pending { producer, sent_at, tries } = &mut self.remotes[idx].tx else { continue };
            if now.duration_since(*sent_at) < ATTACH_RETRY {
                continue;
            }
            if *tries >= ATTACH_TRIES_MAX {
                self.stats.attach_refused += 1;
                self.remotes[idx].tx = TxRing::Off;
                continue;
            }
            *tries += 1;
            *sent_at = now;
            let name = producer.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let msg = Control::Attach {
                nonce: producer.nonce(),
                data_bytes: self.config.ring_bytes as u64,
                name,
                paths: self.local_paths.clone(),
            };
            let dst = self.remotes[idx].paths[0];
            self.queue_control(dst, &msg);
        }
    }

    fn handle_control(&mut self, msg: Control, src: SocketAddr, path: u16) {
        match msg {
            Control::Attach { nonce, data_bytes, name, paths } => {
                // The offer must come from the path 0 it names, to our path 0.
                if path != 0 || paths.first() != Some(&src) {
                    self.stats.control_ignored += 1;
                    return;
                }
                if !self.config.enabled {
                    self.queue_control(src, &Control::Refused { nonce });
                    return;
                }
                let Some(idx) = self.remote_for(&paths) else {
                    self.queue_control(src, &Control::Refused { nonce });
                    return;
                };
                if self.remotes[idx].rx.as_ref().is_some_and(|(_, n)| *n == nonce) {
                    // A retry whose answer was lost.
                    self.queue_control(src, &Control::Attached { nonce });
                    return;
                }
                match Consumer::attach(&self.config.dir, &name, data_bytes, nonce) {
                    Ok(consumer) => {
                        let old = self.remotes[idx].rx.replace((consumer, nonce));
                        self.retired.extend(old.map(|(c, _)| c));
                        self.stats.rings_attached_rx += 1;
                        self.queue_control(src, &Control::Attached { nonce });
                        if matches!(self.remotes[idx].tx, TxRing::Idle) {
                            self.start_attach(idx);
                        }
                    }
                    Err(e) => {
                        tracing::info!(error = %e, peer = %src, "refused a peer's shared-memory ring");
                        self.queue_control(src, &Control::Refused { nonce });
                    }
                }
            }
            Control::Attached { nonce } | Control::Refused { nonce } => {
                let attached = matches!(msg, Control::Attached { .. });
                let Some(&(idx, 0)) = self.routes.get(&src) else {
                    self.stats.control_ignored += 1;
                    return;
                };
                let remote = &mut self.remotes[idx];
                let pending = matches!(&remote.tx, TxRing::Pending { producer, .. } if producer.nonce() == nonce);
                if !pending {
                    self.stats.control_ignored += 1;
                    return;
                }
                let TxRing::Pending { producer, .. } = std::mem::replace(&mut remote.tx, TxRing::Off) else {
                    unreachable!("checked above")
                };
                if attached {
                    remote.tx = TxRing::Attached { producer, full_since: None };
                    self.stats.rings_attached_tx += 1;
                } else {
                    self.stats.attach_refused += 1;
                }
            }
            Control::Doorbell => {}
        }
    }

    /// Publishes every ring written since the last call, ringing sleeping consumers.
    fn publish(&mut self) {
        while let Some(idx) = self.dirty.pop() {
            let remote = &mut self.remotes[idx];
            let TxRing::Attached { producer, .. } = &mut remote.tx else { continue };
            if producer.publish() {
                self.stats.doorbells_sent += 1;
                let dst = remote.paths[0];
                self.queue_control(dst, &Control::Doorbell);
            }
        }
    }

    fn abandon_tx(&mut self, idx: usize, why: &str) {
        tracing::warn!(peer = %self.remotes[idx].paths[0], why, "abandoning a shared-memory ring; back to UDP");
        self.remotes[idx].tx = TxRing::Off;
        self.stats.rings_abandoned += 1;
    }

    /// Appends `len` bytes that `fill` writes to the ring of remote `idx` (attached).
    fn push_ring(
        &mut self,
        idx: usize,
        len: usize,
        entry: (u32, u16, u16),
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> RingPush {
        let TxRing::Attached { producer, full_since } = &mut self.remotes[idx].tx else { return RingPush::Abandoned };
        if producer.consumer_closed() {
            self.abandon_tx(idx, "the consumer closed it");
            return RingPush::Abandoned;
        }
        let (segment_bytes, src_path, dst_path) = entry;
        match producer.push_with(len, segment_bytes, src_path, dst_path, fill) {
            Ok(Push::Written) => {
                *full_since = None;
                if !self.dirty.contains(&idx) {
                    self.dirty.push(idx);
                }
                self.stats.tx_datagrams += 1;
                self.stats.tx_bytes += len as u64;
                RingPush::Written
            }
            Ok(Push::Cancelled) => RingPush::Cancelled,
            Ok(Push::Full) => {
                self.stats.tx_ring_full += 1;
                let now = Instant::now();
                let since = *full_since.get_or_insert(now);
                let stalled = now.duration_since(since);
                if stalled >= RING_STALL_CHECK && !accord_sys::process_alive(producer.consumer_pid()) {
                    self.abandon_tx(idx, "its consumer process is gone");
                    return RingPush::Abandoned;
                }
                if stalled >= RING_STALL_DROP {
                    self.stats.tx_dropped_stalled += 1;
                    return RingPush::Dropped;
                }
                RingPush::Full
            }
            Err(e) => {
                self.abandon_tx(idx, &e.to_string());
                RingPush::Abandoned
            }
        }
    }

    /// The attached ring and the peer's path id for `dst`, if any.
    fn ring_route(&self, dst: &SocketAddr) -> Option<(usize, u16)> {
        self.routes.get(dst).copied().filter(|&(idx, _)| matches!(self.remotes[idx].tx, TxRing::Attached { .. }))
    }

    /// Drains attached rings into `bufs` until it holds `max`.
    fn recv_rings(&mut self, bufs: &mut RxBuffers, max: usize) {
        let count = self.remotes.len();
        let path_count = self.inner.path_count();
        let mut got_any = false;
        for step in 0..count {
            if bufs.len() >= max {
                break;
            }
            let idx = (self.rx_next + step) % count;
            let remote = &mut self.remotes[idx];
            let Some((consumer, _)) = remote.rx.as_mut() else { continue };
            let mut failure = None;
            let lend = self.config.lend && bufs.lending_allowed();
            while bufs.len() < max {
                let Some(slot) = bufs.free_slots_mut().next() else { break };
                match consumer.pop_lending(slot, lend) {
                    Ok(Some((e, lent))) => {
                        let Some(&src) = remote.paths.get(usize::from(e.src_path)) else {
                            failure = Some(format!("entry names source path {}", e.src_path));
                            break;
                        };
                        if e.dst_path >= path_count {
                            failure = Some(format!("entry names our path {}", e.dst_path));
                            break;
                        }
                        let seg = e.segment_bytes as usize;
                        let segment_bytes = if seg == 0 || seg >= e.len { e.len } else { seg };
                        let meta = RxMeta {
                            path: e.dst_path,
                            src,
                            len: e.len,
                            segment_bytes,
                            ecn_ce: false,
                            local_channel: true,
                        };
                        match lent {
                            Some(lent) => {
                                bufs.commit_lent(meta, lent);
                                self.stats.rx_lent += 1;
                            }
                            None => {
                                bufs.commit(meta);
                            }
                        }
                        self.stats.rx_datagrams += 1;
                        self.stats.rx_bytes += e.len as u64;
                        got_any = true;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        failure = Some(e.to_string());
                        break;
                    }
                }
            }
            if lend {
                self.unreleased = true;
            } else {
                consumer.release();
            }
            if let Some(why) = failure {
                tracing::warn!(peer = %remote.paths[0], why, "a peer's shared-memory ring is corrupt; closed it");
                self.retired.extend(remote.rx.take().map(|(c, _)| c));
                self.stats.rings_abandoned += 1;
            }
        }
        self.rx_next = (self.rx_next + 1) % count.max(1);
        if got_any {
            self.last_ring_rx = Some(Instant::now());
        }
    }

    /// Hands the space of entries lent by the last batch back to the producers and unmaps
    /// retired rings: the caller is done with what it was lent once it calls us again.
    fn release_lent(&mut self) {
        if self.unreleased {
            for remote in &mut self.remotes {
                if let Some((consumer, _)) = remote.rx.as_mut() {
                    consumer.release();
                }
            }
            self.unreleased = false;
        }
        self.retired.clear();
    }

    fn rings_have_data(&self) -> bool {
        self.remotes.iter().any(|r| r.rx.as_ref().is_some_and(|(c, _)| c.has_data()))
    }
}

impl<D: Datapath> Datapath for ShmDatapath<D> {
    crate::datapath::wrapped_identity!(inner);

    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DatapathError> {
        self.validate_batch(batch)?;
        self.tick();
        let mut done = 0;
        let mut udp_from: Option<usize> = None;
        let mut result = Ok(());
        for (i, d) in batch.iter().enumerate() {
            let Some((idx, dst_path)) = self.ring_route(&d.dst) else {
                udp_from.get_or_insert(i);
                continue;
            };
            if let Some(from) = udp_from.take() {
                match self.inner.send_batch(&batch[from..i]) {
                    Ok(n) => {
                        done = from + n;
                        if n < i - from {
                            break;
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            let entry = (d.segment_bytes.map_or(0, u32::from), d.path, dst_path);
            let copy = |slot: &mut [u8]| {
                slot.copy_from_slice(d.bytes);
                true
            };
            match self.push_ring(idx, d.bytes.len(), entry, copy) {
                RingPush::Written | RingPush::Dropped | RingPush::Cancelled => done = i + 1,
                RingPush::Full | RingPush::Abandoned => break,
            }
        }
        if let (Some(from), Ok(())) = (udp_from, &result) {
            match self.inner.send_batch(&batch[from..]) {
                Ok(n) => done = from + n,
                Err(e) => result = Err(e),
            }
        }
        self.publish();
        self.flush_control();
        result.map(|()| done)
    }

    fn recv_batch(&mut self, bufs: &mut RxBuffers, max: usize) -> Result<usize, DatapathError> {
        bufs.check_slot_bytes(RX_SLOT_BYTES_MAX)?;
        self.release_lent();
        self.tick();
        let max = max.min(bufs.slot_count());
        let rings = self.remotes.iter().any(|r| r.rx.is_some());
        let udp_max = if rings { (max / 2).max(1) } else { max };
        self.inner.recv_batch(bufs, udp_max)?;
        let mut controls = vec![];
        if bufs.iter().any(|(b, _)| control::is_control(b)) {
            for (bytes, meta) in bufs.iter() {
                if control::is_control(bytes) && controls.len() < CONTROL_PER_RECV_MAX {
                    controls.push((Control::parse(bytes), meta.src, meta.path));
                }
            }
            bufs.retain(|b, _| !control::is_control(b));
        }
        for (msg, src, path) in controls {
            match msg {
                Some(msg) => self.handle_control(msg, src, path),
                None => self.stats.control_ignored += 1,
            }
        }
        if rings {
            self.recv_rings(bufs, max);
        }
        self.flush_control();
        Ok(bufs.len())
    }

    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, DatapathError> {
        self.release_lent();
        if !self.remotes.iter().any(|r| r.rx.is_some()) {
            return self.inner.wait_readable(timeout);
        }
        if timeout.is_zero() {
            // A non-blocking check (a caller polling between turns): look, but never mark a
            // ring's consumer as sleeping, which would make its producer ring a doorbell.
            return Ok(self.rings_have_data() || self.inner.wait_readable(Duration::ZERO)?);
        }
        let start = Instant::now();
        let streaming = self.last_ring_rx.is_some_and(|t| start.duration_since(t) < SPIN_AFTER_RX_WITHIN);
        let spin = if streaming { self.config.spin.min(timeout) } else { Duration::ZERO };
        // While spinning, the sockets are polled too (without blocking): they carry the owner's
        // wake-ups (a command queued for a worker that said it sleeps) and UDP-only peers, which
        // a ring-only spin would leave waiting until the spin ends, on every message of a chain.
        // Each turn yields the core, so on a host with more threads than cores the spin does not
        // starve the thread that is about to produce what we wait for.
        if !spin.is_zero() {
            loop {
                if self.rings_have_data() || self.inner.wait_readable(Duration::ZERO)? {
                    return Ok(true);
                }
                if start.elapsed() >= spin {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let consumers = || self.remotes.iter().filter_map(|r| r.rx.as_ref().map(|(c, _)| c));
        let mut early = false;
        for c in consumers() {
            early |= c.prepare_sleep();
        }
        let result = if early { Ok(true) } else { self.inner.wait_readable(timeout.saturating_sub(start.elapsed())) };
        for c in self.remotes.iter().filter_map(|r| r.rx.as_ref().map(|(c, _)| c)) {
            c.woke();
        }
        result
    }

    fn local_channel_has_data(&self) -> bool {
        self.rings_have_data()
    }

    fn is_local_channel(&self, dst: SocketAddr) -> bool {
        self.ring_route(&dst).is_some()
    }

    fn rx_slot_bytes(&self) -> usize {
        RX_SLOT_BYTES_MAX
    }

    fn send_direct(
        &mut self,
        path: u16,
        dst: SocketAddr,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<DirectSend, DatapathError> {
        if path >= self.path_count() {
            return Err(DatapathError::UnknownPath { path, path_count: self.path_count() });
        }
        let max = self.caps().max_payload_bytes.min(ring::ENTRY_PAYLOAD_BYTES_MAX);
        if len > max {
            return Err(DatapathError::MessageTooLarge { len, max });
        }
        let Some((idx, dst_path)) = self.ring_route(&dst) else { return Ok(DirectSend::Unsupported) };
        let outcome = match self.push_ring(idx, len, (0, path, dst_path), fill) {
            RingPush::Written | RingPush::Dropped => DirectSend::Sent,
            RingPush::Cancelled => DirectSend::Cancelled,
            RingPush::Full => DirectSend::Full,
            RingPush::Abandoned => DirectSend::Unsupported,
        };
        self.publish();
        self.flush_control();
        Ok(outcome)
    }

    fn offer_local_channel(&mut self, peer_paths: &[SocketAddr]) {
        if !self.config.enabled || peer_paths.is_empty() {
            return;
        }
        if let Some(idx) = self.remote_for(peer_paths) {
            if matches!(self.remotes[idx].tx, TxRing::Idle) {
                self.start_attach(idx);
                self.flush_control();
            }
        }
    }

    fn local_channel_stats(&self) -> Option<ShmStats> {
        Some(self.stats)
    }
}

/// Removes ring files a crashed process left behind: named `accord-<pid>-...`, that pid gone,
/// and older than [`STALE_RING_AGE`] (the age rule also spares files of a process in another
/// pid namespace sharing the directory). Files of other users cannot be removed and are left.
pub fn sweep_stale_rings(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.take(SWEEP_ENTRIES_MAX).flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("accord-")) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_RING_AGE);
        if old && !accord_sys::process_alive(pid) && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(removed, dir = %dir.display(), "removed ring files left by crashed processes");
    }
    removed
}

/// 64 random bits from the kernel (ring names and nonces must not be guessable by position);
/// falls back to the clock and pid if /dev/urandom cannot be read.
fn random_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
        }
    }
}

/// The ring directory a test would use instead of /dev/shm (unused outside tests).
#[cfg(test)]
pub(crate) fn test_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("accord-shm-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

#[cfg(test)]
mod tests;
