//! The collectives over the TransferEngine: [`EngineTransport`] implements [`CollTransport`]
//! with registered memory regions, one-sided writes carrying immediates and two-sided sends,
//! so data lands straight in peers' user buffers over Accord's transport.
//!
//! Mapping:
//! - `register` pins the caller's `Vec` where it is and registers its address (no copy);
//!   the remote descriptor's token is the engine's memory-region descriptor.
//! - `write` is an engine write; `signal` a zero-byte write into the peer's control region.
//! - `wait_imm` takes from the engine's immediate counter (so counters never accumulate),
//!   in slices so that a peer's stuck report interrupts it.
//! - control messages and stuck reports are engine sends framed with sender and tag.
//!
//! [`EngineTransport::from_env`] bootstraps the torchrun way: the rendezvous store on rank 0
//! gathers every rank's engine address.
//!
//! Teardown: end a job with a barrier before dropping the communicator. A rank that leaves
//! right after its last collective completed may still owe peers acknowledgements of writes it
//! received; the barrier makes everyone finish first, and dropping the transport then waits (up
//! to [`DRAIN_ON_DROP`]) for its own writes and signals to be acknowledged.

mod frame;
mod pinned;
mod stats;
#[cfg(test)]
mod tests;

pub use stats::TransportStats;

use crate::error::TransportError;
use crate::store::{all_gather_through, Bootstrap, KeyValueStore};
use crate::transport::{BufSlice, CheckedWrite, CollTransport, LocalAccessFn, LocalBuf, RemoteBufDesc};
use crate::transport::{CTRL_MESSAGE_BYTES_MAX, WORLD_SIZE_MAX};
use crate::{CollConfig, CollError, Communicator, StoreError};
use accord_engine::{
    Engine, EngineAddress, MrBuffer, MrDescriptor, MrHandle, PeerWaitError, RecvMessage, Transfer, TransferError,
    WriteOp,
};
use frame::{Frame, FRAME_HEADER_BYTES};
use pinned::Pinned;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Receive buffers posted per peer for control messages (handshakes send a few per call).
pub const CTRL_BUFFERS_PER_PEER: usize = 16;
/// Control messages held before they are claimed; more are dropped and logged (a peer far
/// ahead or misbehaving).
pub const CTRL_PENDING_MAX: usize = 65_536;
/// Writes submitted and not yet flushed before the oldest is waited for.
pub const PENDING_TRANSFERS_MAX: usize = 4096;
/// Peers' region descriptors kept parsed (cleared when full; a miss only costs a parse).
pub const DESCRIPTOR_CACHE_MAX: usize = 4096;
/// Granularity of waits, so stuck reports interrupt them promptly.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// Why setting up an engine-backed communicator failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineSetupError {
    /// The rendezvous store could not be reached or did not complete.
    #[error("rendezvous failed: {0}")]
    Store(#[from] StoreError),
    /// The engine (sockets, threads) or its configuration failed.
    #[error("could not start the transfer engine: {0}")]
    Engine(String),
    /// A rank's published address did not parse.
    #[error(
        "rank {rank} published an unreadable engine address ({reason}); all ranks must run the same Accord version"
    )]
    BadAddress {
        /// The rank that published it.
        rank: usize,
        /// Why it did not parse.
        reason: String,
    },
    /// The transport refused its setup.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The communicator refused its configuration.
    #[error(transparent)]
    Coll(#[from] CollError),
}

struct Registered {
    /// Shared with the engine's in-flight transfers that read it (see `pinned::register`).
    pinned: Arc<Pinned>,
    /// The engine's handle and descriptor (none for an empty buffer: nothing to write into).
    region: Option<(MrHandle, MrDescriptor)>,
}

#[derive(Default)]
struct Inbox {
    ctrl: HashMap<(usize, u32), VecDeque<Vec<u8>>>,
    ctrl_held: usize,
    stuck: BTreeMap<usize, usize>,
}

type Shared<T> = Arc<(Mutex<T>, Condvar)>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The [`CollTransport`] of one rank over an [`Engine`].
pub struct EngineTransport {
    engine: Arc<Engine>,
    rank: usize,
    peers: Vec<EngineAddress>,
    bufs: Mutex<HashMap<u64, Arc<Registered>>>,
    next_id: AtomicU64,
    /// Transfers not yet known complete, with the rank each goes to.
    pending: Mutex<VecDeque<(usize, Transfer)>>,
    /// Peers' descriptor tokens already parsed, so the many segment writes of a collective
    /// do not parse the same text each time. Holds only what the token says (engine, region,
    /// key, length), never a reference to memory: a stale entry is refused by the peer's key
    /// check exactly as the re-parsed token would be.
    parsed_descs: Mutex<HashMap<Vec<u8>, MrDescriptor>>,
    counters: stats::Counters,
    inbox: Shared<Inbox>,
    /// A small registered buffer whose zero-byte slices source signals.
    signal_source: MrBuffer,
    /// The rendezvous this transport joined through, kept for the transport's lifetime: on
    /// rank 0 it hosts the store, which other ranks may still be reading when rank 0 is done.
    bootstrap: Option<Bootstrap>,
}

impl EngineTransport {
    /// First half of setup: posts the control receive buffers, so that by the time anyone
    /// learns this engine's address (second half, [`PreparedEngine::connect`]) it can take
    /// their messages. `world_size` sizes the buffer pool.
    pub fn prepare(engine: Arc<Engine>, world_size: usize) -> Result<PreparedEngine, TransportError> {
        if world_size == 0 || world_size > WORLD_SIZE_MAX {
            return Err(TransportError::BadRank { rank: 0, world_size });
        }
        let inbox: Shared<Inbox> = Arc::new((Mutex::new(Inbox::default()), Condvar::new()));
        let sink = inbox.clone();
        let buffers = CTRL_BUFFERS_PER_PEER * world_size.max(2);
        engine.post_recvs(CTRL_MESSAGE_BYTES_MAX + FRAME_HEADER_BYTES, buffers, move |m| deliver(&sink, m));
        let signal_source = engine.alloc(64).map_err(|e| TransportError::NotRegistered { what: e.to_string() })?;
        Ok(PreparedEngine { engine, inbox, signal_source, world_size })
    }

    /// Both halves at once, for callers whose peers prepared before `addresses` was known.
    pub fn new(engine: Arc<Engine>, rank: usize, addresses: Vec<EngineAddress>) -> Result<Self, TransportError> {
        Self::prepare(engine, addresses.len())?.connect(rank, addresses)
    }

    /// Joins the job described by the torchrun variables: starts an engine (with `ACCORD_*`
    /// overrides), publishes its address through the rendezvous store and collects everyone's.
    pub fn from_env() -> Result<Self, EngineSetupError> {
        let bootstrap = Bootstrap::from_env()?;
        let engine = Engine::builder().build().map_err(|e| EngineSetupError::Engine(e.to_string()))?;
        Self::join(bootstrap, Arc::new(engine))
    }

    /// As [`EngineTransport::from_env`], with a bootstrap and an engine the caller made. The
    /// transport keeps the bootstrap (rank 0's store must outlive everyone's rendezvous).
    pub fn join(mut bootstrap: Bootstrap, engine: Arc<Engine>) -> Result<Self, EngineSetupError> {
        let rank = bootstrap.config().rank;
        let prepared = Self::prepare(engine.clone(), bootstrap.config().world_size)?;
        let blobs = bootstrap.all_gather(engine.address().to_string_compact().as_bytes())?;
        let mut transport = prepared.connect(rank, parse_addresses(&blobs)?)?;
        transport.bootstrap = Some(bootstrap);
        Ok(transport)
    }

    /// As [`EngineTransport::join`], exchanging engine addresses through a store the caller
    /// runs (PyTorch's c10d store, say) under keys starting with `prefix`, so that no port is
    /// opened for the rendezvous. `timeout` bounds the wait for each rank's address.
    pub fn join_through(
        store: &mut dyn KeyValueStore,
        prefix: &str,
        rank: usize,
        world_size: usize,
        engine: Arc<Engine>,
        timeout: Duration,
    ) -> Result<Self, EngineSetupError> {
        let prepared = Self::prepare(engine.clone(), world_size)?;
        let blob = engine.address().to_string_compact();
        let blobs = all_gather_through(store, prefix, rank, world_size, blob.as_bytes(), timeout)?;
        Ok(prepared.connect(rank, parse_addresses(&blobs)?)?)
    }

    /// What this transport has issued so far (writes, control messages).
    pub fn stats(&self) -> TransportStats {
        self.counters.snapshot()
    }

    /// The engine underneath (statistics, tuning).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Registers host memory this transport does not own (a tensor's), without copying it:
    /// collectives then read and write it in place. `owner` keeps the memory alive: the
    /// transport holds it while registered, and the engine holds it with every transfer
    /// still reading the memory after [`CollTransport::deregister`] (which gives back an
    /// empty `Vec` for such a buffer).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes for as long as `owner` lives, and
    /// nothing may write it or hold a Rust reference to it while a collective uses it.
    #[allow(unsafe_code)]
    pub unsafe fn register_external(
        &self,
        ptr: *mut u8,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<LocalBuf, TransportError> {
        if ptr.is_null() && len > 0 {
            return Err(TransportError::NotRegistered { what: format!("a null pointer of {len} bytes") });
        }
        // Safety: forwarded to the caller.
        self.register_pinned(unsafe { Pinned::external(ptr, len, owner) })
    }

    fn register_pinned(&self, pinned: Pinned) -> Result<LocalBuf, TransportError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let len = pinned.len();
        let pinned = Arc::new(pinned);
        let region = if len == 0 {
            None
        } else {
            Some(
                pinned::register(&pinned, &self.engine)
                    .map_err(|e| TransportError::NotRegistered { what: e.to_string() })?,
            )
        };
        let token = match &region {
            Some((_, desc)) => desc.to_string_compact().into_bytes(),
            None => vec![],
        };
        lock(&self.bufs).insert(id, Arc::new(Registered { pinned, region }));
        Ok(LocalBuf::new(id, len, RemoteBufDesc { rank: self.rank, len: len as u64, token }))
    }

    fn registered(&self, buf: &LocalBuf) -> Result<Arc<Registered>, TransportError> {
        lock(&self.bufs)
            .get(&buf.id())
            .cloned()
            .ok_or_else(|| TransportError::NotRegistered { what: format!("local buffer {}", buf.id()) })
    }

    fn aborted(&self) -> Option<TransportError> {
        let inbox = lock(&self.inbox.0);
        inbox.stuck.iter().next().map(|(&reported_by, &waiting_on)| TransportError::Aborted { reported_by, waiting_on })
    }

    fn track(&self, peer: usize, transfer: Transfer) -> Result<(), TransportError> {
        let oldest = {
            let mut pending = lock(&self.pending);
            while pending.front().is_some_and(|(_, t)| t.is_done()) {
                let (to, done) = pending.pop_front().expect("front exists");
                if let Some(Err(e)) = done.poll() {
                    return Err(map_transfer_error(to, e));
                }
            }
            pending.push_back((peer, transfer));
            if pending.len() > PENDING_TRANSFERS_MAX {
                pending.pop_front()
            } else {
                None
            }
        };
        if let Some((to, t)) = oldest {
            t.wait().map_err(|e| map_transfer_error(to, e))?;
        }
        Ok(())
    }

    /// The engine descriptor a peer's token names (parsed once per distinct token).
    fn parse_desc(&self, peer: usize, token: &[u8]) -> Result<MrDescriptor, TransportError> {
        if let Some(desc) = lock(&self.parsed_descs).get(token) {
            return Ok(*desc);
        }
        let text = std::str::from_utf8(token).map_err(|e| TransportError::Malformed { peer, reason: e.to_string() })?;
        let desc = MrDescriptor::parse(text).map_err(|e| TransportError::Malformed { peer, reason: e.to_string() })?;
        let mut cache = lock(&self.parsed_descs);
        if cache.len() >= DESCRIPTOR_CACHE_MAX {
            cache.clear();
        }
        cache.insert(token.to_vec(), desc);
        Ok(desc)
    }

    fn send_frame(&self, peer: usize, frame: &[u8]) -> Result<Transfer, TransportError> {
        self.engine
            .send(self.peers[peer].id, frame, None)
            .map_err(|e| TransportError::Malformed { peer, reason: format!("send refused: {e}") })
    }
}

/// Connects `engines` as ranks `0..engines.len()` of one group inside this process (tests and
/// benches that run every rank here): every engine is prepared before any address is shared,
/// as `join` does through its store, then each is introduced to the others. The transports
/// come in rank order, each ready to move to its rank's thread.
pub fn connect_in_process(engines: Vec<Arc<Engine>>) -> Result<Vec<EngineTransport>, TransportError> {
    let n = engines.len();
    let prepared = engines.into_iter().map(|e| EngineTransport::prepare(e, n)).collect::<Result<Vec<_>, _>>()?;
    let addresses: Vec<EngineAddress> = prepared.iter().map(PreparedEngine::address).collect();
    prepared.into_iter().enumerate().map(|(rank, p)| p.connect(rank, addresses.clone())).collect()
}

/// An engine ready to receive control messages, not yet introduced to its peers.
pub struct PreparedEngine {
    engine: Arc<Engine>,
    inbox: Shared<Inbox>,
    signal_source: MrBuffer,
    world_size: usize,
}

impl PreparedEngine {
    /// The address to publish to the other ranks.
    pub fn address(&self) -> EngineAddress {
        self.engine.address()
    }

    /// Second half of setup: `rank` among the engines at `addresses` (indexed by rank, our
    /// own included); introduces every peer to the engine.
    pub fn connect(self, rank: usize, addresses: Vec<EngineAddress>) -> Result<EngineTransport, TransportError> {
        let world_size = addresses.len();
        if rank >= world_size || world_size != self.world_size {
            return Err(TransportError::BadRank { rank, world_size });
        }
        for (r, addr) in addresses.iter().enumerate().filter(|(r, _)| *r != rank) {
            self.engine.add_peer(addr).map_err(|e| TransportError::Malformed { peer: r, reason: e.to_string() })?;
        }
        Ok(EngineTransport {
            engine: self.engine,
            rank,
            peers: addresses,
            bufs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            pending: Mutex::new(VecDeque::new()),
            parsed_descs: Mutex::new(HashMap::new()),
            counters: stats::Counters::default(),
            inbox: self.inbox,
            signal_source: self.signal_source,
            bootstrap: None,
        })
    }
}

/// Engine addresses from the blobs a rendezvous gathered, by rank.
fn parse_addresses(blobs: &[Vec<u8>]) -> Result<Vec<EngineAddress>, EngineSetupError> {
    blobs
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let text =
                std::str::from_utf8(b).map_err(|e| EngineSetupError::BadAddress { rank: r, reason: e.to_string() })?;
            EngineAddress::parse(text).map_err(|e| EngineSetupError::BadAddress { rank: r, reason: e.to_string() })
        })
        .collect()
}

/// The engine's view of `rank` for a stuck report: whether it was declared dead, and every
/// path of every connection to it.
fn peer_report(engine: &Engine, ids: &[accord_engine::EngineId], rank: usize) -> crate::report::PeerReport {
    let Some(&id) = ids.get(rank) else { return crate::report::PeerReport { rank, ..Default::default() } };
    let mut paths = Vec::new();
    for (lane, _, conn) in engine.connection_stats(Some(id)) {
        for p in &conn.paths {
            paths.push(crate::report::PathReport {
                lane,
                path: p.path.0,
                packets_sent: p.packets_sent,
                packets_acked: p.packets_acked,
                packets_lost: p.packets_lost,
                loss_pct: p.loss_score * 100.0,
                rtt_us: p.rtt_smoothed.as_micros() as u64,
                quarantined: p.quarantined,
                quarantines: p.quarantines,
            });
        }
    }
    crate::report::PeerReport { rank, dead: engine.peer_death(id).map(|d| d.to_string()), paths }
}

fn map_transfer_error(peer: usize, e: TransferError) -> TransportError {
    match e {
        TransferError::Rejected(reason) => {
            TransportError::NotRegistered { what: format!("rank {peer} refused a write ({reason:?})") }
        }
        TransferError::PeerUnreachable | TransferError::NoReply { .. } | TransferError::PeerUnresponsive { .. } => {
            TransportError::PeerUnreachable { peer }
        }
        TransferError::PeerDied { cause, .. } => TransportError::PeerDied { peer, reason: cause.to_string() },
        other => {
            TransportError::Timeout { what: format!("a transfer to rank {peer} ({other})"), waited: Duration::ZERO }
        }
    }
}

/// The receive handler: files control messages and stuck reports in the inbox.
fn deliver(inbox: &Shared<Inbox>, m: RecvMessage<'_>) {
    let frame = match Frame::decode(m.data) {
        Ok(frame) => frame,
        Err(error) => {
            tracing::warn!(len = m.data.len(), %error, "dropping a malformed collectives frame");
            return;
        }
    };
    let (mutex, arrived) = &**inbox;
    let mut inbox = lock(mutex);
    match frame {
        Frame::Ctrl { sender, tag, body } => {
            if inbox.ctrl_held >= CTRL_PENDING_MAX {
                tracing::error!(sender, "control inbox full; dropping a message");
                return;
            }
            inbox.ctrl_held += 1;
            inbox.ctrl.entry((sender, tag)).or_default().push_back(body.to_vec());
        }
        Frame::Stuck { sender, waiting_on } => {
            inbox.stuck.entry(sender).or_insert(waiting_on);
        }
    }
    arrived.notify_all();
}

impl CollTransport for EngineTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.peers.len()
    }

    fn register(&self, memory: Vec<u8>) -> Result<LocalBuf, TransportError> {
        self.register_pinned(Pinned::new(memory))
    }
    fn deregister(&self, buf: LocalBuf) -> Result<Vec<u8>, TransportError> {
        let entry = lock(&self.bufs)
            .remove(&buf.id())
            .ok_or_else(|| TransportError::NotRegistered { what: format!("local buffer {}", buf.id()) })?;
        if let Some((handle, _)) = &entry.region {
            self.engine.deregister(handle);
        }
        // The memory comes back only once no transfer reads it any more; otherwise it stays
        // alive with those transfers and is freed after the last one.
        let pinned = Arc::try_unwrap(entry).ok().and_then(|registered| Arc::try_unwrap(registered.pinned).ok());
        match pinned {
            Some(pinned) => Ok(pinned.into_vec()),
            None => Err(TransportError::NotRegistered {
                what: format!("local buffer {} (still read by transfers in flight; flush first)", buf.id()),
            }),
        }
    }

    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<(), TransportError> {
        let CheckedWrite { peer, src, dst, imm } = write;
        if src.len == 0 {
            return match imm {
                Some(imm) => self.signal(peer, imm),
                None => Ok(()),
            };
        }
        let registered = self.registered(src.buf)?;
        let (handle, _) = registered.region.as_ref().expect("non-empty buffers are registered");
        let desc = self.parse_desc(peer, &dst.desc.token)?;
        let op = WriteOp {
            src: handle,
            src_offset: src.offset as u64,
            dst: &desc,
            dst_offset: dst.offset as u64,
            len: src.len as u64,
            imm,
        };
        let transfer = self
            .engine
            .write(&op)
            .map_err(|e| TransportError::Malformed { peer, reason: format!("write refused: {e}") })?;
        self.counters.write(op.len, imm.is_some() && op.len >= self.engine.config().shard_bytes_min);
        self.track(peer, transfer)
    }

    fn signal(&self, peer: usize, imm: u32) -> Result<(), TransportError> {
        self.check_peer(peer)?;
        let source = self.signal_source.handle();
        let op = WriteOp {
            src: &source,
            src_offset: 0,
            dst: &self.peers[peer].control,
            dst_offset: 0,
            len: 0,
            imm: Some(imm),
        };
        let transfer = self
            .engine
            .write(&op)
            .map_err(|e| TransportError::Malformed { peer, reason: format!("signal refused: {e}") })?;
        self.counters.signal();
        self.track(peer, transfer)
    }

    /// The engine's shared-memory ring directory (`ACCORD_SHM_DIR`), unless shared memory is
    /// off (`ACCORD_SHM=0`) or `ACCORD_FORCE_NETWORK` asks for every byte on the network routes.
    fn host_memory_dir(&self) -> Option<std::path::PathBuf> {
        let c = self.engine.config();
        (c.shm.enabled && !c.force_network).then(|| c.shm.dir.clone())
    }

    fn flush(&self, deadline: Instant) -> Result<(), TransportError> {
        let start = Instant::now();
        let transfers: Vec<(usize, Transfer)> = lock(&self.pending).drain(..).collect();
        for (peer, t) in transfers {
            loop {
                if let Some(result) = t.poll() {
                    result.map_err(|e| map_transfer_error(peer, e))?;
                    break;
                }
                if let Some(e) = self.aborted() {
                    return Err(e);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(TransportError::AckTimeout { peer, waited: start.elapsed() });
                }
                let _ = t.wait_timeout(left.min(WAIT_SLICE));
            }
        }
        Ok(())
    }

    fn wait_imm(&self, imm: u32, count: u32, deadline: Instant) -> Result<(), TransportError> {
        let start = Instant::now();
        loop {
            if let Some(e) = self.aborted() {
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let what = format!("{count} immediate(s) {:?}", crate::transport::Imm::decode(imm));
                return Err(TransportError::Timeout { what, waited: start.elapsed() });
            }
            // The sender is in the immediate: a wait on a rank that died ends within the
            // engine's liveness slice, naming it.
            let sender = crate::transport::Imm::decode(imm).sender as usize;
            let result = match self.peers.get(sender).filter(|_| sender != self.rank) {
                Some(addr) => self.engine.take_imm_from(imm, u64::from(count), left.min(WAIT_SLICE), addr.id),
                None => self
                    .engine
                    .take_imm(imm, u64::from(count), left.min(WAIT_SLICE))
                    .map_err(|value| PeerWaitError::Timeout { value }),
            };
            match result {
                Ok(()) => return Ok(()),
                Err(PeerWaitError::PeerDied { cause, .. }) => {
                    return Err(TransportError::PeerDied { peer: sender, reason: cause.to_string() })
                }
                Err(PeerWaitError::Timeout { .. }) => {}
            }
        }
    }

    fn send_ctrl(&self, peer: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError> {
        self.check_peer(peer)?;
        if bytes.len() > CTRL_MESSAGE_BYTES_MAX {
            return Err(TransportError::LimitReached { what: "control message bytes", limit: CTRL_MESSAGE_BYTES_MAX });
        }
        let transfer = self.send_frame(peer, &Frame::Ctrl { sender: self.rank, tag, body: bytes }.encode())?;
        self.counters.ctrl();
        self.track(peer, transfer)
    }

    fn recv_ctrl(&self, peer: usize, tag: u32, deadline: Instant) -> Result<Vec<u8>, TransportError> {
        self.check_peer(peer)?;
        let start = Instant::now();
        let peer_id = self.peers[peer].id;
        let _watch = (peer != self.rank).then(|| self.engine.watch_peer(peer_id));
        let (mutex, arrived) = &*self.inbox;
        let mut inbox = lock(mutex);
        loop {
            if let Some((&reported_by, &waiting_on)) = inbox.stuck.iter().next() {
                return Err(TransportError::Aborted { reported_by, waiting_on });
            }
            if let Some(queue) = inbox.ctrl.get_mut(&(peer, tag)) {
                if let Some(message) = queue.pop_front() {
                    if queue.is_empty() {
                        inbox.ctrl.remove(&(peer, tag));
                    }
                    inbox.ctrl_held -= 1;
                    return Ok(message);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let what = format!("control message {:?} from rank {peer}", crate::transport::Imm::decode(tag));
                return Err(TransportError::Timeout { what, waited: start.elapsed() });
            }
            if let Some(cause) = self.engine.peer_death(peer_id).filter(|_| peer != self.rank) {
                return Err(TransportError::PeerDied { peer, reason: cause.to_string() });
            }
            let slice = left.min(accord_engine::liveness::WAIT_SLICE);
            inbox = arrived.wait_timeout(inbox, slice).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn access_local(
        &self,
        src: BufSlice<'_>,
        dst: BufSlice<'_>,
        f: &mut LocalAccessFn<'_>,
    ) -> Result<(), TransportError> {
        let s = self.registered(src.buf)?;
        let d = self.registered(dst.buf)?;
        crate::transport::check_local_access(src, dst, Arc::ptr_eq(&s, &d))?;
        f(s.pinned.view(src.offset, src.len), d.pinned.view_mut(dst.offset, dst.len));
        Ok(())
    }

    fn read_local(&self, src: BufSlice<'_>, out: &mut [u8]) -> Result<(), TransportError> {
        src.check("local read")?;
        let s = self.registered(src.buf)?;
        let n = out.len().min(src.len);
        out[..n].copy_from_slice(s.pinned.view(src.offset, n));
        Ok(())
    }

    fn write_local(&self, dst: BufSlice<'_>, data: &[u8]) -> Result<(), TransportError> {
        dst.check("local write")?;
        let d = self.registered(dst.buf)?;
        let n = data.len().min(dst.len);
        d.pinned.view_mut(dst.offset, n).copy_from_slice(&data[..n]);
        Ok(())
    }

    fn report_stuck(&self, waiting_on: usize) {
        let f = Frame::Stuck { sender: self.rank, waiting_on }.encode();
        for peer in (0..self.peers.len()).filter(|&p| p != self.rank) {
            // Best effort: a dead peer cannot be told, which is how the others find it.
            let _ = self.send_frame(peer, &f);
        }
    }

    fn comm_id(&self) -> String {
        // Rank 0's engine identity: every rank knows it, and a new communicator has a new one.
        format!("{:016x}", self.peers[0].id.0)
    }

    fn peer_reporter(&self) -> Option<crate::report::PeerReporter> {
        let engine = self.engine.clone();
        let ids: Vec<accord_engine::EngineId> = self.peers.iter().map(|a| a.id).collect();
        Some(Arc::new(move |rank| peer_report(&engine, &ids, rank)))
    }

    fn stuck_reports(&self) -> Vec<(usize, usize)> {
        lock(&self.inbox.0).stuck.iter().map(|(&r, &w)| (r, w)).collect()
    }

    fn peer_death(&self, rank: usize) -> Option<String> {
        let peer = self.peers.get(rank)?;
        self.engine.peer_death(peer.id).map(|cause| cause.to_string())
    }
}

/// How long dropping a transport waits for its writes and signals in flight to be
/// acknowledged (a rank leaving right after a barrier still owes its peers its signals). Past
/// it, registered memory still read by a transfer stays alive with that transfer.
pub const DRAIN_ON_DROP: Duration = Duration::from_secs(5);

impl Drop for EngineTransport {
    fn drop(&mut self) {
        if let Err(e) = self.flush(Instant::now() + DRAIN_ON_DROP) {
            tracing::warn!(error = %e, "transport dropped with operations still unacknowledged");
        }
        for (_, entry) in lock(&self.bufs).drain() {
            if let Some((handle, _)) = &entry.region {
                self.engine.deregister(handle);
            }
        }
    }
}

/// A communicator for the job the torchrun variables describe, over the TransferEngine,
/// configured from `ACCORD_*` variables.
pub fn communicator_from_env() -> Result<Communicator<EngineTransport>, EngineSetupError> {
    let config = CollConfig::from_env().map_err(|e| EngineSetupError::Engine(e.to_string()))?;
    communicator_from_config(crate::store::BootstrapConfig::from_env()?, config)
}

/// A communicator for the job `bootstrap` describes (rank, world, rendezvous address,
/// timeout), over a new engine built with its `ACCORD_*` overrides, with collective settings
/// `config`. For callers that take the job from somewhere other than the environment.
pub fn communicator_from_config(
    bootstrap: crate::store::BootstrapConfig,
    config: CollConfig,
) -> Result<Communicator<EngineTransport>, EngineSetupError> {
    let bootstrap = Bootstrap::connect(bootstrap)?;
    let engine = Engine::builder().build().map_err(|e| EngineSetupError::Engine(e.to_string()))?;
    let transport = EngineTransport::join(bootstrap, Arc::new(engine))?;
    Ok(Communicator::new(transport, config)?)
}

/// A communicator of `rank` among `world_size`, rendezvousing through `store` (see
/// [`EngineTransport::join_through`]) over a new engine built with its `ACCORD_*` overrides.
/// `rendezvous_timeout` bounds the wait for each rank's address.
pub fn communicator_through(
    store: &mut dyn KeyValueStore,
    prefix: &str,
    rank: usize,
    world_size: usize,
    rendezvous_timeout: Duration,
    config: CollConfig,
) -> Result<Communicator<EngineTransport>, EngineSetupError> {
    let engine = Engine::builder().build().map_err(|e| EngineSetupError::Engine(e.to_string()))?;
    let transport =
        EngineTransport::join_through(store, prefix, rank, world_size, Arc::new(engine), rendezvous_timeout)?;
    Ok(Communicator::new(transport, config)?)
}
