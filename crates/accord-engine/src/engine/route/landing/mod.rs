//! The landing rendezvous: writes into a device region of another process that the copy engine
//! cannot reach (another host, or this host with `ACCORD_DEVICE_IPC=0`).
//!
//! Per chunk (at most one landing slot): the writer asks ([`wire::Body::Ask`]); the receiver
//! checks region, key and bounds (a refusal reaches the writer as `TransferError::Rejected`),
//! grants a slot of its own bounded pinned pool (each slot a host region of its own, its key
//! sent in the grant only; a slot reclaimed from a quiet writer is registered again under a
//! new id and key, so a late write is refused by the transport) or queues the ask; the writer writes the chunk into the slot as an ordinary host
//! write and says `Landed` once acknowledged; the receiver copies the slot host-to-device,
//! frees it (granting the next queued ask) and says `Done`. The writer sends the user's
//! immediate as a zero-byte write into the device region only after every chunk was `Done`,
//! so the receiver counts it once and after the last host-to-device copy.
//!
//! A chunk of at most [`wire::INLINE_BYTES_MAX`] bytes (a signal, a flag, a `put_value`) skips
//! the grant: its bytes ride in the ask (`AskInline`), the receiver checks it as any ask, puts
//! the bytes in a slot of its pool and starts the copy at once, then says `Done`. One message
//! each way instead of five; `EngineConfig::device_landing_inline` turns it off. The receiver
//! remembers the answers of the last [`INLINE_ANSWERS_KEPT`] inline asks, so an ask delivered
//! twice (a write resent on another lane after its first copy landed) is answered again and
//! never copied twice: a second copy of old bytes could undo a newer write to the same place.
//!
//! Control messages travel as 64-byte writes into the peer's control region; the receiving
//! worker hands them here instead of placing them, so they never meet user sends or
//! immediates. Malformed, stale or foreign ones are refused and counted
//! ([`LandingStats`]), never acted on. Tables are bounded; a writer that stops answering has
//! its slots reclaimed after `ACCORD_DEVICE_LANDING_TIMEOUT_MS`, a receiver that stops
//! answering fails the writer's chunk with `PeerUnreachable` after the same time.
//!
//! One thread per engine runs both halves (started on first use); the host-to-device copies
//! go through a [`LandingCopier`] (CUDA, or a host-memory fake in tests).

mod receiver;
pub(crate) mod state;
pub(crate) mod wire;
mod writer;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError, TrySendError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use accord_proto::wire::RejectReason;
use accord_proto::{RegionId, RegionKey};

use crate::address::{EngineId, MrDescriptor};
use crate::completion::{Transfer, TransferState};
use crate::device::staging::{SlotLease, SlotPool};
use crate::engine::part::{write_kind, Part};
use crate::engine::route::dispatch::{dispatch_part, PartSpec};
use crate::engine::shared::Shared;
use crate::error::TransferError;
use crate::memory::{MemoryOwner, Region, Source};
use receiver::{InState, Incoming, InlineAnswers, Pool};
use wire::{Body, Control, INLINE_BYTES_MAX};
use writer::{OutState, Outgoing};

const POLL_SLEEP: Duration = Duration::from_micros(20);
/// How long the thread blocks for a message when it has nothing in progress.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// The offset of the wake-up a chunk submission queues behind its request (never a placement:
/// those are checked against the 64-byte control region).
const WAKE_OFFSET: u64 = u64::MAX;
const POLLS_BEFORE_SLEEP: u32 = 1 << 12;
/// Inline asks whose answer the receiver remembers (see the module's doc): as many as it may
/// hold asks at once, so a duplicate is recognised as long as asks that were in flight with
/// its first copy can still arrive.
pub(crate) const INLINE_ANSWERS_KEPT: usize = LANDING_ASKS_MAX;

use state::ControlRx;
pub(crate) use state::{ChunkRequest, LandingCopier};
pub use state::{
    LandingStats, LANDING_ASKS_MAX, LANDING_ASKS_PER_PEER_MAX, LANDING_CONTROL_QUEUE_MAX, LANDING_REQUESTS_MAX,
    LANDING_TIMEOUT_DEFAULT,
};

/// The worker's hand-off of a frame of this route (never placed): queued for the landing
/// thread, which decodes and checks it. Never a reply here: the thread answers itself.
pub(crate) fn deliver_control(shared: &Arc<Shared>, offset: u64, payload: &[u8]) -> Option<Part> {
    start(shared);
    match shared.landing.control_tx.try_send((offset, payload.to_vec())) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
            shared.landing.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
    None
}

/// Queues a writer's chunk (waits while [`LANDING_REQUESTS_MAX`] are queued).
pub(crate) fn submit_chunk(shared: &Arc<Shared>, request: ChunkRequest) -> Result<(), String> {
    start(shared);
    shared.landing.chunk_tx.send(request).map_err(|_| "the landing thread has exited".to_string())?;
    let _ = shared.landing.control_tx.try_send((WAKE_OFFSET, Vec::new())); // full: it is awake
    Ok(())
}

fn start(shared: &Arc<Shared>) {
    shared.landing.started.call_once(|| {
        let Some((control_rx, chunk_rx)) = shared.landing.ends.lock().unwrap().take() else { return };
        let weak = Arc::downgrade(shared);
        let (timeout, inline) = (shared.config.device_landing_timeout, shared.config.device_landing_inline);
        let poll_window = shared.config.await_poll;
        let spawned = std::thread::Builder::new().name("accord-device-land".into()).spawn(move || {
            LandingThread::new(weak, timeout, inline, poll_window).run(control_rx, chunk_rx);
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the landing thread");
        }
    });
}

struct LandingThread {
    shared: Weak<Shared>,
    timeout: Duration,
    /// Send chunks of at most [`INLINE_BYTES_MAX`] bytes inside their asks.
    inline: bool,
    /// How long after its last progress the thread polls before it blocks
    /// ([`crate::EngineConfig::await_poll`]).
    poll_window: Duration,
    next_req: u64,
    outgoing: HashMap<u64, Outgoing>,
    /// Chunk requests not asked yet (their peer has [`LANDING_ASKS_PER_PEER_MAX`] out).
    waiting: VecDeque<ChunkRequest>,
    asked_per_peer: HashMap<EngineId, usize>,
    incoming: HashMap<(EngineId, u64), Incoming>,
    queued: VecDeque<(EngineId, u64)>,
    /// What the last inline asks were answered (a duplicate gets the same answer, no copy).
    inline_answers: InlineAnswers,
    pool: Option<Result<Pool, String>>,
    stats: LandingStats,
    /// Engines whose control messages were refused because they are not peers here, already
    /// named in a warning (bounded: see [`UNKNOWN_SENDERS_WARNED_MAX`]).
    unknown_senders_warned: Vec<EngineId>,
}

/// How many distinct unknown senders a landing thread names in warnings (one each), so a flood
/// of foreign messages cannot grow memory or the log without bound.
const UNKNOWN_SENDERS_WARNED_MAX: usize = 16;

impl LandingThread {
    fn new(shared: Weak<Shared>, timeout: Duration, inline: bool, poll_window: Duration) -> LandingThread {
        let mut seed = [0u8; 8];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut seed);
        LandingThread {
            shared,
            timeout,
            inline,
            poll_window,
            next_req: u64::from_le_bytes(seed) >> 1,
            outgoing: HashMap::new(),
            waiting: VecDeque::new(),
            asked_per_peer: HashMap::new(),
            incoming: HashMap::new(),
            queued: VecDeque::new(),
            inline_answers: InlineAnswers::default(),
            pool: None,
            stats: LandingStats::default(),
            unknown_senders_warned: Vec::new(),
        }
    }

    fn run(mut self, control_rx: ControlRx, chunk_rx: Receiver<ChunkRequest>) {
        let mut idle: u32 = 0;
        let mut parked: Option<(u64, Vec<u8>)> = None;
        let mut last_progress = Instant::now();
        loop {
            let Some(shared) = self.shared.upgrade() else { return };
            let mut progress = false;
            if let Some((offset, bytes)) = parked.take() {
                progress = true;
                self.on_control(&shared, offset, &bytes);
            }
            loop {
                match control_rx.try_recv() {
                    Ok((offset, bytes)) => {
                        progress = true;
                        self.on_control(&shared, offset, &bytes);
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            while self.outgoing.len() + self.waiting.len() < LANDING_REQUESTS_MAX {
                match chunk_rx.try_recv() {
                    Ok(request) => {
                        progress = true;
                        self.waiting.push_back(request);
                    }
                    Err(_) => break,
                }
            }
            progress |= self.ask_waiting(&shared);
            progress |= self.poll_writes(&shared);
            progress |= self.poll_copies(&shared);
            progress |= self.expire(&shared);
            *shared.landing.stats.lock().unwrap() = self.stats;
            drop(shared);
            if progress {
                idle = 0;
                last_progress = Instant::now();
            } else if self.outgoing.is_empty() && self.waiting.is_empty() && self.incoming.is_empty() {
                // Nothing in progress: block until a control message or a submission's wake-up,
                // after polling a while since the last progress (`recv_hot` says why).
                match crate::backoff::recv_hot(&control_rx, last_progress, self.poll_window, IDLE_WAIT) {
                    Ok(message) => parked = Some(message),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                }
            } else {
                idle = idle.saturating_add(1);
                if idle < POLLS_BEFORE_SLEEP {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(POLL_SLEEP);
                }
            }
        }
    }

    /// Sends a control message to `peer`'s control region (best effort: a lost one ends in the
    /// other side's timeout).
    fn send(&self, shared: &Arc<Shared>, peer: EngineId, req: u64, body: Body) -> bool {
        let Some(control) = shared.peers.read().unwrap().get(&peer).map(|a| a.control) else { return false };
        let bytes = Control { from: shared.id, req, body }.encode();
        let spec = PartSpec {
            peer,
            kind: write_kind(&control, 0, None),
            source: Source::Bytes(Arc::from(&bytes[..])),
            lane: None,
        };
        dispatch_part(shared, spec, shared.new_internal_transfer(1));
        true
    }

    fn on_control(&mut self, shared: &Arc<Shared>, offset: u64, bytes: &[u8]) {
        if offset == WAKE_OFFSET && bytes.is_empty() {
            return;
        }
        let message = match Control::decode(offset, bytes) {
            Ok(m) if shared.peers.read().unwrap().contains_key(&m.from) => m,
            Ok(m) => {
                // The writer waits for an answer this engine cannot send (it has no address for
                // it): name the cause once, or the writer only sees its own timeout.
                self.stats.control_refused += 1;
                if !self.unknown_senders_warned.contains(&m.from)
                    && self.unknown_senders_warned.len() < UNKNOWN_SENDERS_WARNED_MAX
                {
                    self.unknown_senders_warned.push(m.from);
                    tracing::warn!(
                        writer = ?m.from,
                        "a device write over the network from an engine that is not a peer here was refused: add the \
                         writer with add_peer on this engine too (the landing route answers it)"
                    );
                }
                return;
            }
            Err(_) => {
                self.stats.control_refused += 1;
                return;
            }
        };
        let accepted = match message.body {
            Body::Ask { .. } | Body::AskInline { .. } => self.on_ask(shared, message),
            Body::Landed => self.on_landed(message),
            Body::Abandon => self.on_abandon(message),
            Body::Grant { .. } => self.on_grant(shared, message),
            Body::Refuse { reason } => self.finish_out(message, Err(TransferError::Rejected(reason))),
            Body::Done => self.finish_out(message, Ok(())),
        };
        if !accepted {
            self.stats.control_refused += 1;
        }
    }

    /// Fails writer requests whose peer went quiet and reclaims slots granted to quiet writers.
    fn expire(&mut self, shared: &Arc<Shared>) -> bool {
        let now = Instant::now();
        let mut progress = false;
        let quiet: Vec<u64> = self
            .outgoing
            .iter()
            .filter(|(_, o)| !matches!(o.state, OutState::Writing(_)) && o.deadline <= now)
            .map(|(r, _)| *r)
            .collect();
        for req in quiet {
            if let Some(out) = self.remove_out(req) {
                out.done.part_done(Err(TransferError::PeerUnreachable));
                progress = true;
            }
        }
        let quiet: Vec<(EngineId, u64)> = self
            .incoming
            .iter()
            .filter(|(_, entry)| !matches!(entry.state, InState::Copying(..)) && entry.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &quiet {
            let Some(entry) = self.incoming.remove(id) else { continue };
            if let (InState::Granted(lease), Some(Ok(pool))) = (entry.state, self.pool.as_mut()) {
                self.stats.slots_reclaimed += 1;
                pool.reclaim(shared, lease);
            }
        }
        if !quiet.is_empty() {
            progress = true;
            self.grant_queued(shared);
        }
        progress
    }
}

/// A chunk request's transfer: completes when the receiver said `Done` (or it failed).
pub(crate) fn land_chunk(
    shared: &Arc<Shared>,
    peer: EngineId,
    dst: MrDescriptor,
    dst_offset: u64,
    source: Source,
) -> Transfer {
    let done = shared.new_internal_transfer(1);
    let request = ChunkRequest { peer, dst, dst_offset, source, done: done.clone() };
    if let Err(e) = submit_chunk(shared, request) {
        tracing::error!(error = %e, "landing unavailable");
        done.part_done(Err(TransferError::ShutDown));
    }
    Transfer { state: done }
}

#[cfg(test)]
mod inline_tests;
#[cfg(test)]
pub(crate) mod tests;
