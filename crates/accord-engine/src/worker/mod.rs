//! A worker: one thread owning one datapath (a NIC's sockets) and one protocol endpoint, run
//! to completion: drain submissions, receive and place, timers, transmit, events, sleep.

pub(crate) mod control;
pub(crate) mod cutoff;
pub(crate) mod phase_clock;
pub(crate) mod stats;
mod tx;

use phase_clock::PhaseClock;
pub use phase_clock::WorkerTime;
pub use stats::LaneStats;
pub(crate) use stats::WAKE_BYTE;

use crate::engine::part::{Command, Part, PartKind};
use crate::engine::shared::Shared;
use crate::error::TransferError;
use crate::memory::RegionTable;
use crate::recv::RecvPool;
use accord_net::{Datapath, RxBuffers};
use accord_proto::wire::RejectReason;
use accord_proto::{
    ConnectionHandle, Endpoint, Event, Instant, LocalMemory, OpError, OpId, PlacementTarget, RecvBufferId, RegionId,
    RegionKey, SendRequest, SubmitError as ProtoSubmitError, WriteRequest,
};
use control::{ControlRoutes, Delivery};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use crate::address::EngineId;

pub use crate::config::RX_BATCH_SLOTS;
/// Bytes of receive (and transmit) slots one batch may span: small enough to stay in a core's
/// L2 cache, so the copy out of a slot reads what the kernel just wrote.
pub const BATCH_BYTES_TARGET: usize = 512 * 1024;
/// Commands taken from the queue per loop turn, so receive and transmit are never starved.
pub const COMMANDS_PER_TURN_MAX: usize = 256;
/// Parts waiting for room on a connection (the protocol's ops-in-flight bound).
pub const BACKLOG_PARTS_MAX: usize = 4096;
/// How long the wire must stay quiet before a shutting-down worker closes its connections.
pub const LINGER_QUIET: Duration = Duration::from_millis(30);
/// Longest a shutting-down worker lingers (a peer that keeps sending does not hold it).
pub const LINGER_MAX: Duration = Duration::from_secs(2);
/// Longest an idle worker sleeps before re-checking its queue and timers.
pub const IDLE_WAIT_MAX: Duration = Duration::from_millis(2);
// A lent datagram's slot holds only its first bytes: every header the protocol parses must fit.
const _: () = assert!(accord_proto::wire::DATA_HEADER_LEN <= accord_net::LENT_HEAD_BYTES);
/// Checks of the command queue and the shared-memory rings (no system call) per turn of a
/// polling worker, before the turn's socket poll and yield.
const LIGHT_POLLS_PER_TURN: usize = 16;

/// Receive slots per batch for `config` and a datapath whose slots are `slot_bytes` long (see
/// [`crate::EngineConfig::rx_batch_slots`]).
pub(crate) fn rx_batch_slots(config: &crate::EngineConfig, slot_bytes: usize) -> usize {
    if config.rx_batch_slots != 0 {
        config.rx_batch_slots.min(RX_BATCH_SLOTS)
    } else if config.shm.enabled && config.shm.lend {
        crate::config::LENDING_RX_BATCH_SLOTS
    } else {
        (BATCH_BYTES_TARGET / slot_bytes.max(1)).clamp(8, RX_BATCH_SLOTS)
    }
}

struct ConnInfo {
    peer: Option<EngineId>,
    addrs: Vec<Option<SocketAddr>>,
    /// When a datagram of this connection last arrived (the receive batch's time).
    last_heard: Option<std::time::Instant>,
}

/// The region table, receive pool and completed tags, as the protocol checks them.
struct Memory<'a> {
    regions: &'a RegionTable,
    recv: &'a RecvPool,
    seen: &'a crate::tags::SeenTags,
}

impl LocalMemory for Memory<'_> {
    fn check_write(&self, region: RegionId, key: RegionKey, offset: u64, len: u64) -> Result<(), RejectReason> {
        self.regions.check_write(region, key, offset, len)
    }
    fn claim_recv_buffer(&mut self, _conn: ConnectionHandle, msg_len: u64) -> Result<RecvBufferId, RejectReason> {
        self.recv.claim(msg_len)
    }
    fn already_completed(&self, tag: u64) -> bool {
        self.seen.contains(tag)
    }
}

pub(crate) struct Worker {
    lane: usize,
    shared: Arc<Shared>,
    /// The routes that take control frames (the worker names none of them).
    control: ControlRoutes,
    commands: Receiver<Command>,
    stashed: Option<Command>,
    dp: Box<dyn Datapath>,
    ep: Endpoint,
    peers: HashMap<EngineId, ConnectionHandle>,
    conns: HashMap<ConnectionHandle, ConnInfo>,
    ops: HashMap<(ConnectionHandle, OpId), Part>,
    backlog: VecDeque<Part>,
    tx: tx::TxQueue,
    rx: RxBuffers,
    stats: LaneStats,
    /// When the loop last made progress, and when a datagram last arrived (for [`Worker::awaiting`]).
    last_progress: std::time::Instant,
    last_rx: Option<std::time::Instant>,
    /// [`crate::EngineConfig::await_poll`].
    await_poll: Duration,
    /// Connections with every path quarantined, to be cut off once that lasts.
    cut_offs: cutoff::CutOffs,
}

impl Worker {
    pub(crate) fn new(
        lane: usize,
        shared: Arc<Shared>,
        commands: Receiver<Command>,
        dp: Box<dyn Datapath>,
        ep: Endpoint,
        control: ControlRoutes,
    ) -> Result<Self, accord_net::DatapathError> {
        let rx_slots = rx_batch_slots(&shared.config, dp.rx_slot_bytes());
        let mut rx = dp.alloc_rx_buffers(rx_slots)?;
        // Shared-memory datagrams are placed straight from the ring (`receive` reads payloads
        // through `RxBuffers::lent`), saving the copy into a receive slot.
        rx.allow_lending(true);
        let tx = tx::TxQueue::new(ep.datagram_len_max());
        let await_poll = shared.config.await_poll;
        Ok(Worker {
            lane,
            shared,
            control,
            commands,
            stashed: None,
            dp,
            ep,
            peers: HashMap::new(),
            conns: HashMap::new(),
            ops: HashMap::new(),
            backlog: VecDeque::new(),
            tx,
            rx,
            stats: LaneStats::default(),
            last_progress: std::time::Instant::now(),
            last_rx: None,
            await_poll,
            cut_offs: cutoff::CutOffs::default(),
        })
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.shared.epoch.elapsed().as_nanos() as u64)
    }

    /// The thread body; returns at shutdown.
    pub(crate) fn run(mut self) {
        let debug = self.shared.config.debug_stats;
        let mut last_dump = std::time::Instant::now();
        let mut clock = PhaseClock::new(debug);
        loop {
            let (exit, mut progress) = self.drain_commands();
            clock.lap(&mut self.stats.time.commands_ns);
            if exit {
                break;
            }
            progress |= self.receive();
            clock.lap(&mut self.stats.time.receive_ns);
            let now = self.now();
            if self.ep.poll_timeout().is_some_and(|t| t <= now) {
                self.ep.handle_timeout(now);
                progress = true;
            }
            clock.lap(&mut self.stats.time.timers_ns);
            progress |= self.transmit();
            clock.lap(&mut self.stats.time.transmit_ns);
            progress |= self.drain_events();
            if !self.cut_offs.is_empty() {
                progress |= self.cut_off_dead_lanes();
            }
            // Routes expire what quiet peers left outstanding (one atomic load when none).
            self.control.sweep(&self.shared);
            if debug && last_dump.elapsed() > Duration::from_millis(250) {
                last_dump = std::time::Instant::now();
                self.dump_connections();
            }
            clock.lap(&mut self.stats.time.events_ns);
            if progress {
                self.last_progress = std::time::Instant::now();
            } else if !self.poll_while_awaiting() {
                clock.lap(&mut self.stats.time.poll_ns);
                self.sleep();
                clock.lap(&mut self.stats.time.sleep_ns);
            } else {
                clock.lap(&mut self.stats.time.poll_ns);
            }
        }
        self.linger();
        self.shut_down();
    }

    /// Before closing: keep receiving and acknowledging until our own operations are done and
    /// the wire has been quiet for [`LINGER_QUIET`], at most [`LINGER_MAX`]. A peer whose last
    /// write or barrier signal landed here, but whose acknowledgement was still due (or lost
    /// and about to be asked for again), would otherwise see the connection close under it.
    fn linger(&mut self) {
        let start = std::time::Instant::now();
        let mut last_activity = start;
        while start.elapsed() < LINGER_MAX {
            let mut progress = self.receive();
            let now = self.now();
            if self.ep.poll_timeout().is_some_and(|t| t <= now) {
                self.ep.handle_timeout(now);
            }
            progress |= self.transmit();
            progress |= self.drain_events();
            if progress {
                last_activity = std::time::Instant::now();
            }
            let own_work_done = self.ops.is_empty() && self.backlog.is_empty() && self.tx.is_empty();
            if own_work_done && last_activity.elapsed() >= LINGER_QUIET {
                return;
            }
            if !progress {
                let _ = self.dp.wait_readable(Duration::from_millis(1));
            }
        }
    }

    /// `ACCORD_ENGINE_DEBUG`: one line per connection on stderr, and where this worker's time
    /// went.
    fn dump_connections(&self) {
        eprintln!("[pid {} lane {}] time: {}", std::process::id(), self.lane, self.stats.time.shares());
        for c in self.ep.connections() {
            if let Some(st) = self.ep.connection_stats(c) {
                eprintln!(
                    "[pid {} lane {}] {c:?} sent {} acked_bytes {} retransmitted {} lost {} (spurious {}) received {} placed_bytes {} \
                     dropped {} refused {} window {} in_flight {} srtt {:?} ops {}",
                    std::process::id(),
                    self.lane,
                    st.packets_sent,
                    st.bytes_acked,
                    st.packets_retransmitted,
                    st.packets_lost,
                    st.packets_lost_spurious,
                    st.packets_received,
                    st.bytes_placed,
                    st.packets_dropped,
                    st.packets_refused,
                    st.window_bytes,
                    st.bytes_in_flight,
                    st.rtt_smoothed,
                    st.ops_outstanding
                );
            }
        }
    }

    /// Whether this worker awaits traffic soon: its operations are unacknowledged, it has parts
    /// or datagrams waiting to go, or a datagram arrived within the poll window (a stream is
    /// running, so its next piece, or the data a clear-to-send asked for, is due).
    fn awaiting(&self, now: std::time::Instant) -> bool {
        !self.ops.is_empty()
            || !self.backlog.is_empty()
            || !self.tx.is_empty()
            || self.last_rx.is_some_and(|t| now.duration_since(t) < self.await_poll)
    }

    /// Instead of sleeping: while [`Worker::awaiting`] and within the poll window after the
    /// last progress, polls the command queue, the datapath (without blocking) and the timers,
    /// yielding the core each turn. Returns true when there is something to do (the caller
    /// loops again), false when the window ran out (the caller sleeps). The lane does not say
    /// it sleeps meanwhile, so submitters queue without a wake datagram, and shared-memory
    /// producers see no sleeping consumer and ring no doorbell. See
    /// [`crate::config::AWAIT_POLL_DEFAULT`] for the choice.
    fn poll_while_awaiting(&mut self) -> bool {
        if self.await_poll.is_zero() {
            return false;
        }
        loop {
            let now = std::time::Instant::now();
            // A part promised to this lane (a device copy's immediate) keeps it polling past
            // the window: the copy may take longer than the window, and the part is due then.
            let promised = self.shared.lanes[self.lane].expected.load(Ordering::Acquire) > 0;
            if !promised && (now.duration_since(self.last_progress) >= self.await_poll || !self.awaiting(now)) {
                return false;
            }
            // Parts or datagrams held back (no room), or a command the loop could not take yet
            // (a full backlog): the loop retries them.
            if self.stashed.is_some() || !self.backlog.is_empty() || !self.tx.is_empty() {
                std::thread::yield_now();
                return true;
            }
            // Light turns first: the command queue and the shared-memory rings are looked at
            // without a system call, so a command or a ring datagram is seen within about a
            // hundred nanoseconds; then one full check that also polls the sockets, and a yield.
            for _ in 0..LIGHT_POLLS_PER_TURN {
                match self.commands.try_recv() {
                    Ok(cmd) => {
                        self.stashed = Some(cmd);
                        return true;
                    }
                    Err(TryRecvError::Disconnected) => {
                        self.stashed = Some(Command::Shutdown);
                        return true;
                    }
                    Err(TryRecvError::Empty) => {}
                }
                if self.dp.local_channel_has_data() {
                    return true;
                }
                std::hint::spin_loop();
            }
            if self.dp.wait_readable(Duration::ZERO).unwrap_or(true) {
                return true;
            }
            let at = self.now();
            if self.ep.poll_timeout().is_some_and(|t| t <= at) {
                return true;
            }
            std::thread::yield_now();
        }
    }

    fn sleep(&mut self) {
        let lane = &self.shared.lanes[self.lane];
        lane.sleeping.store(true, Ordering::SeqCst);
        // A command still stashed (the backlog was full) is kept, never overwritten, and it
        // is no reason to skip the wait: room comes with acknowledgements.
        let mut fresh_command = false;
        if self.stashed.is_none() {
            match self.commands.try_recv() {
                Ok(cmd) => self.stashed = Some(cmd),
                Err(TryRecvError::Disconnected) => self.stashed = Some(Command::Shutdown),
                Err(TryRecvError::Empty) => {}
            }
            fresh_command = self.stashed.is_some();
        }
        if !fresh_command {
            let now = self.now();
            let mut wait = IDLE_WAIT_MAX;
            if let Some(t) = self.ep.poll_timeout() {
                wait = wait.min(t.saturating_duration_since(now));
            }
            if !self.tx.is_empty() {
                wait = wait.min(Duration::from_micros(50));
            }
            if !wait.is_zero() {
                let _ = self.dp.wait_readable(wait);
            }
        }
        lane.sleeping.store(false, Ordering::SeqCst);
    }

    fn drain_commands(&mut self) -> (bool, bool) {
        let mut progress = false;
        while let Some(part) = self.backlog.pop_front() {
            if let Err(part) = self.submit(part) {
                self.backlog.push_front(part);
                break;
            }
            progress = true;
        }
        for _ in 0..COMMANDS_PER_TURN_MAX {
            if self.backlog.len() >= BACKLOG_PARTS_MAX {
                break;
            }
            let cmd = match self.stashed.take() {
                Some(c) => c,
                None => match self.commands.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return (true, progress),
                },
            };
            progress = true;
            match cmd {
                Command::Shutdown => return (true, progress),
                Command::Stats(reply) => {
                    let _ = reply.try_send(self.lane_stats());
                }
                Command::PeerDead(peer, cause) => self.fail_peer(peer, cause),
                Command::ConnStats(only, reply) => {
                    let stats = self
                        .conns
                        .iter()
                        .filter(|(_, info)| only.is_none() || info.peer == only)
                        .filter_map(|(c, info)| Some((info.peer, self.ep.connection_stats(*c)?)))
                        .collect();
                    let _ = reply.try_send(stats);
                }
                Command::Probe(peer) => {
                    if let Some(conn) = self.connection(peer) {
                        if self.ep.is_established(conn) {
                            self.shared.lane_connected(peer, self.lane);
                        }
                    }
                }
                Command::OfferShm(peer) => {
                    if let Some(addrs) = self.shared.peer_lane_addrs(peer, self.lane) {
                        self.dp.offer_local_channel(&addrs);
                    }
                }
                Command::Submit(part) => {
                    if !self.backlog.is_empty() {
                        self.backlog.push_back(part);
                    } else if let Err(part) = self.submit(part) {
                        self.backlog.push_back(part);
                    }
                }
            }
        }
        (false, progress)
    }

    fn lane_stats(&self) -> LaneStats {
        let mut s = self.stats.clone();
        s.endpoint = self.ep.stats().clone();
        s.connections = self.conns.len();
        s.shm = self.dp.local_channel_stats();
        for c in self.ep.connections().filter_map(|c| self.ep.connection_stats(c)) {
            s.retransmits += c.packets_retransmitted;
            s.spurious_losses += c.packets_lost_spurious;
            s.resent_skipped += c.resent_skipped;
        }
        s.credit_granted_bytes = self.ep.pacer_stats().credit_granted_bytes;
        s
    }

    /// The connection to `peer` on this lane, opened on first use.
    fn connection(&mut self, peer: EngineId) -> Option<ConnectionHandle> {
        if let Some(&c) = self.peers.get(&peer) {
            return Some(c);
        }
        let addrs = self.shared.peer_lane_addrs(peer, self.lane)?;
        let conn = self.ep.connect(self.now()).ok()?;
        if self.shared.peer_on_this_host(peer) {
            // Datagrams go over UDP until the peer has mapped the ring (the protocol does not
            // notice the switch beyond some reordering).
            self.dp.offer_local_channel(&addrs);
        }
        let addrs = addrs.into_iter().map(Some).collect();
        self.conns.insert(conn, ConnInfo { peer: Some(peer), addrs, last_heard: None });
        self.peers.insert(peer, conn);
        Some(conn)
    }

    /// Hands a part to the protocol; gives it back when the connection has no room.
    fn submit(&mut self, part: Part) -> Result<(), Part> {
        for _attempt in 0..2 {
            let Some(conn) = self.connection(part.peer) else {
                self.fail_over(part, TransferError::PeerUnreachable);
                return Ok(());
            };
            let result = match part.kind {
                PartKind::Write { region, key, offset, imm } => {
                    let req = WriteRequest { region, key, offset, len: part.source.len(), imm, tag: part.tag };
                    self.ep.write(conn, req)
                }
                PartKind::Send { imm } => {
                    self.ep.send(conn, SendRequest { len: part.source.len(), imm, tag: part.tag })
                }
            };
            match result {
                Ok(op) => {
                    self.ops.insert((conn, op), part);
                    return Ok(());
                }
                Err(ProtoSubmitError::TooManyOps(_)) => return Err(part),
                Err(ProtoSubmitError::OffsetOverflow { .. }) => {
                    part.finish(Err(TransferError::Rejected(RejectReason::OutOfBounds)));
                    return Ok(());
                }
                Err(_) => {
                    // The connection ended: forget it and open a fresh one.
                    self.peers.remove(&part.peer);
                }
            }
        }
        self.fail_over(part, TransferError::PeerUnreachable);
        Ok(())
    }

    /// `peer` was declared dead: its operations in flight and queued fail now (the protocol
    /// would otherwise retransmit into the void until its idle timeout), and its connection
    /// is dropped.
    fn fail_peer(&mut self, peer: EngineId, cause: crate::peer_death::PeerDeath) {
        let error = TransferError::PeerDied { peer, cause };
        let doomed: Vec<(ConnectionHandle, OpId)> =
            self.ops.iter().filter(|(_, part)| part.peer == peer).map(|(k, _)| *k).collect();
        for key in doomed {
            if let Some(part) = self.ops.remove(&key) {
                part.finish(Err(error));
            }
        }
        let (doomed, kept): (VecDeque<Part>, VecDeque<Part>) =
            std::mem::take(&mut self.backlog).into_iter().partition(|p| p.peer == peer);
        self.backlog = kept;
        for part in doomed {
            part.finish(Err(error));
        }
        if let Some(conn) = self.peers.remove(&peer) {
            self.conns.remove(&conn);
            self.ep.close(conn);
        }
    }

    /// The connection carrying `part` timed out (idle, or a handshake unanswered) and the peer
    /// is not known dead. Death is the liveness thread's to declare (a pidfd on this host,
    /// keepalives elsewhere), never one connection's timeout, so the part is resent: over
    /// another lane if one is live towards the peer, else on a fresh connection of this lane
    /// (opened by `submit`), which gets through once the path heals. It fails, naming the
    /// peer, once nothing was heard from the peer for `peer_dead_after` since it was
    /// stranded. The receiver keeps it exactly-once by its tag (see `crate::tags`).
    fn connection_lost(&mut self, conn: ConnectionHandle, mut part: Part) {
        let peer = part.peer;
        if let Some(cause) = self.shared.liveness.death(peer) {
            part.finish(Err(TransferError::PeerDied { peer, cause }));
            return;
        }
        let now = std::time::Instant::now();
        let heard = self.conns.get(&conn).and_then(|info| info.last_heard);
        let since = match part.stranded_since {
            // Stranded before, and the peer was silent since: the same outage.
            Some(since) if heard.is_none_or(|h| h <= since) => since,
            _ => now,
        };
        part.stranded_since = Some(since);
        let waited = now.duration_since(since);
        if waited >= self.shared.config.peer_dead_after {
            self.stats.unresponsive_failures += 1;
            part.finish(Err(TransferError::PeerUnresponsive { peer, waited_ms: waited.as_millis() as u64 }));
            return;
        }
        let other_lane = self.shared.live_lanes(peer).iter().any(|&lane| lane != self.lane);
        if other_lane && part.attempts + 1 < self.shared.lanes.len() {
            self.fail_over(part, TransferError::PeerUnreachable);
            return;
        }
        self.stats.reconnect_resends += 1;
        self.backlog.push_back(part);
    }

    /// The part's connection failed: let the engine route it over another lane.
    fn fail_over(&mut self, part: Part, error: TransferError) {
        self.stats.failovers += 1;
        self.shared.mark_lane_dead(part.peer, self.lane);
        let shared = self.shared.clone();
        crate::completion::dispatch(&self.shared.jobs, move || shared.resubmit(part, error));
    }

    fn receive(&mut self) -> bool {
        let slots = self.rx.slot_count();
        let n = match self.dp.recv_batch(&mut self.rx, slots) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "receive failed");
                return false;
            }
        };
        if n == 0 {
            return false;
        }
        let arrived = std::time::Instant::now();
        self.last_rx = Some(arrived);
        let now = self.now();
        let waker = self.shared.waker_addr;
        let regions = self.shared.regions.read().unwrap();
        let mut memory = Memory { regions: &regions, recv: &self.shared.recv, seen: &self.shared.seen_tags };
        let mut controls: Vec<(u64, Vec<u8>)> = Vec::new();
        for i in 0..self.rx.len() {
            let Some((bytes, meta)) = self.rx.get(i) else { continue };
            let lent = self.rx.lent(i);
            let meta = *meta;
            if meta.src == waker && bytes == [WAKE_BYTE] {
                continue;
            }
            let stride = meta.segment_bytes.max(1);
            for seg in bytes.chunks(stride) {
                let rx_meta = accord_proto::RxMeta { path: accord_proto::PathId(meta.path), ecn_ce: meta.ecn_ce };
                // A datagram from a shared-memory ring may carry a header-only seal, which one
                // from a network never may; a lent one is read in place, its payload not in
                // `seg`.
                let outcome = if meta.local_channel || lent.is_some() {
                    self.ep.handle_local_datagram(now, rx_meta, seg, lent.is_none(), &mut memory)
                } else {
                    self.ep.handle_datagram(now, rx_meta, seg, &mut memory)
                };
                if let Some(p) = outcome.placement {
                    // A lent datagram is never segmented, so its one segment is the whole of it.
                    let placed = match (lent, p.target) {
                        (lent, PlacementTarget::Region { region, offset })
                            if region.0 == self.shared.control.region =>
                        {
                            // Control frames go to their route after this batch (outside the
                            // region table's lock), never into memory.
                            let mut message = vec![0u8; p.payload.len()];
                            let whole = match lent {
                                Some(l) => l.copy_to_slice(p.payload.start, &mut message),
                                None => {
                                    message.copy_from_slice(&seg[p.payload.clone()]);
                                    true
                                }
                            };
                            if whole {
                                controls.push((offset, message));
                            }
                            whole
                        }
                        (Some(l), PlacementTarget::Region { region, offset }) => {
                            regions.place_lent(region, offset, l, p.payload.start, p.payload.len())
                        }
                        (Some(l), PlacementTarget::RecvBuffer { buffer, offset }) => {
                            self.shared.recv.place_lent(buffer, offset, l, p.payload.start, p.payload.len())
                        }
                        (None, PlacementTarget::Region { region, offset }) => {
                            regions.place(region, offset, &seg[p.payload.clone()])
                        }
                        (None, PlacementTarget::RecvBuffer { buffer, offset }) => {
                            self.shared.recv.place(buffer, offset, &seg[p.payload.clone()])
                        }
                    };
                    debug_assert!(placed, "placement the protocol approved fell outside memory");
                }
                if let Some(conn) = outcome.conn {
                    let paths = usize::from(self.ep.config().connection.path_count);
                    let info = self.conns.entry(conn).or_insert_with(|| ConnInfo {
                        peer: None,
                        addrs: vec![None; paths],
                        last_heard: None,
                    });
                    if let Some(slot) = info.addrs.get_mut(usize::from(meta.path)) {
                        *slot = Some(meta.src);
                    }
                    info.last_heard = Some(arrived);
                }
            }
        }
        drop(regions); // a route's handler may take the table's lock itself (`memory` borrowed it)
        for (offset, message) in controls {
            match self.control.deliver(&self.shared, offset, &message) {
                Delivery::Reply(reply) => self.backlog.push_back(reply),
                Delivery::Taken => {}
                Delivery::Unrouted => self.stats.control_unrouted += 1,
            }
        }
        true
    }

    fn transmit(&mut self) -> bool {
        let now = self.now();
        let Worker { tx, ep, ops, conns, dp, stats, .. } = self;
        let route = |t: &accord_proto::Transmit| {
            conns.get(&t.conn).and_then(|c| c.addrs.get(usize::from(t.path.0)).copied().flatten())
        };
        let gather = |t: &accord_proto::Transmit, payload: &mut [u8]| match t.payload {
            Some(p) => ops.get(&(t.conn, p.op)).is_some_and(|part| part.source.read(p.offset, payload)),
            None => true,
        };
        tx.fill_and_send(now, ep, dp.as_mut(), stats, route, gather)
    }

    fn drain_events(&mut self) -> bool {
        let mut progress = false;
        // The transfers this drain finishes share clock readings for telemetry's end times.
        let _end_times = crate::telemetry::SharedReading::begin_if(crate::telemetry::on());
        while let Some(event) = self.ep.poll_event() {
            progress = true;
            match event {
                Event::OpCompleted { conn, op, result } => {
                    let Some(part) = self.ops.remove(&(conn, op)) else { continue };
                    match result {
                        Ok(()) => part.finish(Ok(())),
                        Err(OpError::Rejected(reason)) => part.finish(Err(TransferError::Rejected(reason))),
                        Err(OpError::ConnectionLost) => self.connection_lost(conn, part),
                        Err(OpError::Closed) => self.fail_over(part, TransferError::PeerUnreachable),
                    }
                }
                Event::ImmReceived { imm, tag, .. } => {
                    if self.shared.seen_tags.first_time(tag) {
                        self.shared.imms.bump(imm, &self.shared.jobs);
                    } else {
                        self.stats.duplicates_suppressed += 1;
                    }
                }
                Event::RecvCompleted { buffer, len, imm, tag, .. } => {
                    if self.shared.seen_tags.first_time(tag) {
                        self.shared.recv.complete(buffer, len, imm, &self.shared.jobs)
                    } else {
                        self.stats.duplicates_suppressed += 1;
                        self.shared.recv.discard(buffer);
                    }
                }
                Event::ConnectionFailed { conn, error } => {
                    tracing::warn!(lane = self.lane, %error, "connection failed");
                    self.forget(conn, true);
                }
                Event::Closed { conn } => self.forget(conn, false),
                Event::Connected { conn } => {
                    if let Some(peer) = self.conns.get(&conn).and_then(|info| info.peer) {
                        self.shared.lane_connected(peer, self.lane);
                    }
                }
                Event::Accepted { .. } => {}
                Event::PathQuarantined { conn, path } => {
                    tracing::debug!(lane = self.lane, ?path, "path quarantined");
                    let all = self.ep.connection_stats(conn).is_some_and(|s| s.paths.iter().all(|p| p.quarantined));
                    self.cut_offs.quarantined(conn, all, std::time::Instant::now());
                }
                Event::PathRevived { conn, path } => {
                    tracing::debug!(lane = self.lane, ?path, "path revived");
                    self.cut_offs.clear(conn);
                }
            }
        }
        progress
    }

    /// Closes the connections whose every path has been quarantined for
    /// [`cutoff::LANE_CUT_OFF_AFTER`] while another lane to their peer is live: their parts fail
    /// over now instead of at the idle timeout (see [`cutoff`]). Returns whether it closed any.
    fn cut_off_dead_lanes(&mut self) -> bool {
        let mut closed = false;
        for conn in self.cut_offs.due(std::time::Instant::now()) {
            let whole = self.ep.connection_stats(conn).is_some_and(|s| s.paths.iter().all(|p| p.quarantined));
            let Some(peer) = self.conns.get(&conn).and_then(|info| info.peer).filter(|_| whole) else {
                self.cut_offs.clear(conn);
                continue;
            };
            if !self.shared.live_lanes(peer).iter().any(|&lane| lane != self.lane) {
                continue; // No lane to move to: the probes may revive a path, or the idle timeout rules.
            }
            tracing::warn!(
                lane = self.lane,
                peer = format_args!("{:016x}", peer.0),
                "every path to the peer on this lane quarantined for {:?}: moving its writes to another lane",
                cutoff::LANE_CUT_OFF_AFTER
            );
            self.stats.lane_cut_offs += 1;
            self.cut_offs.clear(conn);
            self.shared.mark_lane_dead(peer, self.lane);
            // Fails the connection's operations with `Closed`: `drain_events` fails them over.
            self.ep.close(conn);
            closed = true;
        }
        if closed {
            self.drain_events();
        }
        closed
    }

    fn forget(&mut self, conn: ConnectionHandle, failed: bool) {
        self.cut_offs.clear(conn);
        if let Some(info) = self.conns.remove(&conn) {
            if let Some(peer) = info.peer {
                if self.peers.get(&peer) == Some(&conn) {
                    self.peers.remove(&peer);
                }
                if failed {
                    self.shared.mark_lane_dead(peer, self.lane);
                }
            }
        }
    }

    fn shut_down(&mut self) {
        for conn in self.ep.connections().collect::<Vec<_>>() {
            self.ep.close(conn);
        }
        self.transmit();
        for (_, part) in self.ops.drain() {
            part.finish(Err(TransferError::ShutDown));
        }
        for part in self.backlog.drain(..) {
            part.finish(Err(TransferError::ShutDown));
        }
        while let Ok(cmd) = self.commands.try_recv() {
            if let Command::Submit(part) = cmd {
                part.finish(Err(TransferError::ShutDown));
            }
        }
    }
}
