//! State shared by an engine's API, its workers and its completion thread: lanes, peers,
//! routing and failover.

use super::part::{Command, Part};
use crate::address::{EngineAddress, EngineId};
use crate::completion::JobSender;
use crate::config::EngineConfig;
use crate::error::TransferError;
use crate::imm::ImmTable;
use crate::memory::Regions;
use crate::recv::RecvPool;
use crate::worker::stats::WAKE_BYTE;
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

/// Submissions queued per worker; a submitter that finds the queue full waits.
pub const SUBMISSIONS_QUEUED_MAX: usize = 4096;
/// Peers one engine knows at once.
pub const PEERS_MAX: usize = 1 << 16;
pub use crate::config::LANE_AVOID_AFTER_FAILURE;

/// The API's handle on one worker.
pub(crate) struct Lane {
    pub(crate) nic: usize,
    pub(crate) worker: usize,
    pub(crate) commands: SyncSender<Command>,
    pub(crate) sleeping: AtomicBool,
    /// Wake datagrams sent to the worker (a command came while it slept).
    pub(crate) wakes_sent: std::sync::atomic::AtomicU64,
    /// The worker's path-0 address, where wake datagrams go.
    pub(crate) wake_target: SocketAddr,
    /// Parts promised to this lane soon ([`LaneExpectation`]s alive): while any is, the worker
    /// polls instead of sleeping.
    pub(crate) expected: std::sync::atomic::AtomicUsize,
}

/// A promise that a lane will soon be given a part: the immediate of a device write whose
/// copy is in flight. While one is alive the lane's worker polls rather than sleeps (see
/// `Worker::poll_while_awaiting`), so the immediate leaves within microseconds of the copy's
/// completion instead of after a wake-up, which on a virtual machine costs tens of
/// microseconds and, for a copy longer than the worker's poll window, came on top of every
/// one-at-a-time device write to another process. Dropping it (once the part was queued, or
/// when the copy failed and no part will come) ends the promise.
pub(crate) struct LaneExpectation {
    shared: Arc<Shared>,
    lane: usize,
}

impl LaneExpectation {
    /// The lane the part must be routed to (the one that polls for it).
    pub(crate) fn lane(&self) -> usize {
        self.lane
    }
}

impl Drop for LaneExpectation {
    fn drop(&mut self) {
        self.shared.lanes[self.lane].expected.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) struct Shared {
    pub(crate) id: EngineId,
    /// This engine's zero-length control region (barrier immediates land there).
    pub(crate) control: crate::address::MrDescriptor,
    pub(crate) config: EngineConfig,
    pub(crate) epoch: std::time::Instant,
    pub(crate) regions: Regions,
    pub(crate) imms: ImmTable,
    pub(crate) recv: RecvPool,
    pub(crate) jobs: JobSender,
    pub(crate) lanes: Vec<Lane>,
    pub(crate) waker: UdpSocket,
    pub(crate) waker_addr: SocketAddr,
    pub(crate) peers: RwLock<HashMap<EngineId, EngineAddress>>,
    /// Lanes not used towards a peer now (failed, or probing after a failure).
    pub(crate) dead_lanes: Mutex<super::lane_outages::LaneOutages>,
    /// Whether `dead_lanes` holds any outage, kept beside it so that the lane choice of every
    /// part, in the usual case of none, reads one atomic instead of the clock and the lock.
    pub(crate) lane_outages_any: AtomicBool,
    pub(crate) next_lane: AtomicUsize,
    pub(crate) tags: crate::tags::TagSource,
    pub(crate) seen_tags: crate::tags::SeenTags,
    /// The landing rendezvous of device writes across hosts (`engine::route::landing`).
    pub(crate) landing: super::route::landing::state::Landing,
    /// The pull route between processes of this host (`engine::route::cma`).
    pub(crate) cma: super::route::cma::state::Cma,
    /// Which peers died, and who is waiting on whom (`crate::liveness`).
    pub(crate) liveness: crate::liveness::state::Liveness,
    /// READ's pending reads (reader side) and served requests (owner side) (`engine::route::read`).
    pub(crate) read: super::route::read::state::ReadState,
    /// Copy threads for large writes into engines of this process (`engine::route::memcpy`).
    pub(crate) local_copies: super::route::memcpy::pool::LocalCopies,
    /// What the device routes share (copy-engine handle, staging thread, peers' shared files):
    /// here rather than in `Engine` so that a READ's owner, serving a request on a worker with
    /// no `Engine` at hand, writes through the same routes (`engine::device::DeviceWriter`).
    pub(crate) devices: super::device_paths::DevicePaths,
}

impl Shared {
    /// Queues a command for `lane` and wakes its worker if it sleeps.
    pub(crate) fn send_command(&self, lane: usize, cmd: Command) -> Result<(), Command> {
        let l = &self.lanes[lane];
        l.commands.send(cmd).map_err(|e| e.0)?;
        if l.sleeping.swap(false, Ordering::SeqCst) {
            l.wakes_sent.fetch_add(1, Ordering::Relaxed);
            let _ = self.waker.send_to(&[WAKE_BYTE], l.wake_target);
        }
        Ok(())
    }

    /// Per-connection counters of every lane, for `peer` or all (see
    /// [`crate::Engine::connection_stats`]).
    pub(crate) fn connection_stats(
        &self,
        peer: Option<EngineId>,
    ) -> Vec<(usize, Option<EngineId>, accord_proto::ConnectionStats)> {
        let mut out = Vec::new();
        for lane in 0..self.lanes.len() {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            if self.send_command(lane, Command::ConnStats(peer, tx)).is_ok() {
                for (p, s) in rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default() {
                    out.push((lane, p, s));
                }
            }
        }
        out
    }

    /// Promises `lane` a part soon: its worker polls until the promise is dropped, and a
    /// sleeping one is woken now, while the copy runs, rather than when the part comes.
    pub(crate) fn expect_on_lane(self: &Arc<Self>, lane: usize) -> LaneExpectation {
        let l = &self.lanes[lane];
        l.expected.fetch_add(1, Ordering::AcqRel);
        if l.sleeping.swap(false, Ordering::SeqCst) {
            l.wakes_sent.fetch_add(1, Ordering::Relaxed);
            let _ = self.waker.send_to(&[WAKE_BYTE], l.wake_target);
        }
        LaneExpectation { shared: self.clone(), lane }
    }

    /// The peer's path addresses that pair with our `lane`.
    pub(crate) fn peer_lane_addrs(&self, peer: EngineId, lane: usize) -> Option<Vec<SocketAddr>> {
        let peers = self.peers.read().unwrap();
        let addr = peers.get(&peer)?;
        let l = &self.lanes[lane];
        let nic = addr.nics.get(l.nic % addr.nics.len().max(1))?;
        nic.get(l.worker % nic.len().max(1)).cloned()
    }

    /// Whether `peer` advertised this host's name (and so may share memory with us).
    /// Whether writes to `peer` can be submitted: a peer in this process (unless the network
    /// is forced), or one added with `Engine::add_peer`.
    /// The engine `peer` when it lives in this process (this one included), unless
    /// `force_network`: then the bytes go as they would between hosts.
    pub(crate) fn same_process_engine(self: &Arc<Self>, peer: EngineId, force_network: bool) -> Option<Arc<Shared>> {
        match () {
            _ if force_network => None,
            _ if peer == self.id => Some(self.clone()),
            _ => local_engine(peer),
        }
    }

    pub(crate) fn check_peer(&self, peer: EngineId) -> Result<(), crate::error::SubmitError> {
        let local = peer == self.id || local_engine(peer).is_some();
        if (local && !self.config.force_network) || self.peers.read().unwrap().contains_key(&peer) {
            Ok(())
        } else {
            Err(crate::error::SubmitError::UnknownPeer(peer.0))
        }
    }

    pub(crate) fn peer_on_this_host(&self, peer: EngineId) -> bool {
        let host = crate::address::this_host();
        !host.is_empty() && self.peers.read().unwrap().get(&peer).is_some_and(|a| a.host == host)
    }

    pub(crate) fn mark_lane_dead(&self, peer: EngineId, lane: usize) {
        if self.lanes.len() > 1 {
            let now = std::time::Instant::now();
            let mut outages = self.dead_lanes.lock().unwrap();
            outages.failed(peer, lane, now, self.config.lane_avoid);
            self.lane_outages_any.store(!outages.is_empty(), Ordering::Release);
        }
    }

    /// `lane` finished a handshake with `peer`: a lane probing after a failure carries parts again.
    pub(crate) fn lane_connected(&self, peer: EngineId, lane: usize) {
        if !self.lane_outages_any.load(Ordering::Acquire) {
            return;
        }
        let mut outages = self.dead_lanes.lock().unwrap();
        outages.connected(peer, lane);
        self.lane_outages_any.store(!outages.is_empty(), Ordering::Release);
    }

    /// Lanes towards `peer` whose connection did not fail recently (possibly none). A lane
    /// whose avoid period just ended is not among them yet: its worker is asked to connect
    /// to the peer first (`Command::Probe`), and it returns once that handshake succeeded.
    pub(crate) fn live_lanes(&self, peer: EngineId) -> Vec<usize> {
        if !self.lane_outages_any.load(Ordering::Acquire) {
            return (0..self.lanes.len()).collect();
        }
        let now = std::time::Instant::now();
        // A handshake gives up after the idle timeout; a probe still pending well after that
        // lost its command (a full queue) or its outcome.
        let probe_again_after = self.config.idle_timeout * 2 + Duration::from_secs(1);
        let (live, probes) = self.dead_lanes.lock().unwrap().live(peer, self.lanes.len(), now, probe_again_after);
        for lane in probes {
            // Never blocks: a worker calls this too, and its own queue may be full.
            let l = &self.lanes[lane];
            match l.commands.try_send(Command::Probe(peer)) {
                Ok(()) => {
                    if l.sleeping.swap(false, Ordering::SeqCst) {
                        l.wakes_sent.fetch_add(1, Ordering::Relaxed);
                        let _ = self.waker.send_to(&[WAKE_BYTE], l.wake_target);
                    }
                }
                Err(_) => tracing::debug!(lane, "lane probe not queued (queue full or closed); retried later"),
            }
        }
        live
    }

    /// The lane for the next part to `peer`: round robin over live lanes, or over every lane
    /// when all failed recently (an outage that hit every NIC: each lane reconnects, and a
    /// part must not fail at once for the [`LANE_AVOID_AFTER_FAILURE`] after it healed).
    pub(crate) fn pick_lane(&self, peer: EngineId) -> Option<usize> {
        if !self.lane_outages_any.load(Ordering::Acquire) {
            // Every lane is live: no list to build.
            let n = self.lanes.len();
            return (n > 0).then(|| self.next_lane.fetch_add(1, Ordering::Relaxed) % n);
        }
        let mut live = self.live_lanes(peer);
        if live.is_empty() {
            live = (0..self.lanes.len()).collect();
        }
        if live.is_empty() {
            return None;
        }
        Some(live[self.next_lane.fetch_add(1, Ordering::Relaxed) % live.len()])
    }

    /// The state of a new user-visible transfer of `parts` parts: the one telemetry records
    /// (its latency and trace event), once, whatever pieces the engine splits it into.
    pub(crate) fn new_transfer(&self, parts: usize) -> Arc<crate::completion::TransferState> {
        crate::completion::TransferState::new(parts, self.jobs.clone(), self.config.wait_spin, true)
    }

    /// The state of a transfer the engine makes for its own use: a chunk of a staged or landed
    /// write, a control frame, an owner's answer to a read, a keepalive probe. Not recorded:
    /// the `transfer` histogram and trace events count what users submitted, and recording
    /// every chunk and frame too cost a clock read and an event per piece.
    pub(crate) fn new_internal_transfer(&self, parts: usize) -> Arc<crate::completion::TransferState> {
        crate::completion::TransferState::new(parts, self.jobs.clone(), self.config.wait_spin, false)
    }

    /// Routes a part to a lane (blocking while its queue is full).
    pub(crate) fn route(&self, part: Part, lane: Option<usize>) {
        if let Some(cause) = self.liveness.death(part.peer) {
            let peer = part.peer;
            part.finish(Err(TransferError::PeerDied { peer, cause }));
            return;
        }
        let lane = lane.or_else(|| self.pick_lane(part.peer));
        let Some(lane) = lane else {
            part.finish(Err(TransferError::PeerUnreachable));
            return;
        };
        if let Err(Command::Submit(part)) = self.send_command(lane, Command::Submit(part)) {
            part.finish(Err(TransferError::ShutDown));
        }
    }

    /// A part whose connection failed: try another live lane, up to one attempt per lane.
    pub(crate) fn resubmit(&self, mut part: Part, error: TransferError) {
        part.attempts += 1;
        if let Some(cause) = self.liveness.death(part.peer) {
            let peer = part.peer;
            part.finish(Err(TransferError::PeerDied { peer, cause }));
            return;
        }
        // A stranded part (its connection timed out, see `Worker::connection_lost`) is routed
        // even when every lane failed: its lane reconnects, within its own deadline.
        let no_lane = self.live_lanes(part.peer).is_empty() && part.stranded_since.is_none();
        if part.attempts >= self.lanes.len() || no_lane {
            part.finish(Err(error));
            return;
        }
        self.route(part, None);
    }
}

/// Engines alive in this process, for memcpy between same-process peers.
static LOCAL_ENGINES: Mutex<Option<HashMap<EngineId, Weak<Shared>>>> = Mutex::new(None);

pub(crate) fn register_local(shared: &Arc<Shared>) {
    LOCAL_ENGINES.lock().unwrap().get_or_insert_with(HashMap::new).insert(shared.id, Arc::downgrade(shared));
}

pub(crate) fn unregister_local(id: EngineId) {
    if let Some(map) = LOCAL_ENGINES.lock().unwrap().as_mut() {
        map.remove(&id);
    }
}

pub(crate) fn local_engine(id: EngineId) -> Option<Arc<Shared>> {
    LOCAL_ENGINES.lock().unwrap().as_ref()?.get(&id)?.upgrade()
}
