//! The staging thread: runs every staged write of an engine over one bounded [`SlotPool`].
//!
//! Each turn it hands free slots to the writes in progress (one per write per round, so a large
//! write cannot starve a small one), polls the device-to-host copies, sends a copied chunk as a
//! host write from its slot, polls those writes, and finishes a write once its [`StagePlan`]
//! says it is over. It spins, then yields, then sleeps briefly when nothing moves, as the
//! device poller does.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Chunk, SlotLease, SlotPool, StagePlan, STAGED_WRITES_ACTIVE_MAX};
use crate::completion::Transfer;
use crate::error::TransferError;
use crate::memory::{MemoryOwner, Source};

/// Sleep between polls once nothing moved for [`POLLS_BEFORE_SLEEP`] rounds.
const POLL_SLEEP_MAX: Duration = Duration::from_micros(20);
/// Rounds without progress before the thread sleeps between polls.
const POLLS_BEFORE_SLEEP: u32 = 1 << 14;

/// What a staged write reads: a device address (for the fake copier of tests, a host address)
/// and its GPU, and what keeps the memory alive until the write is over.
pub(crate) struct StagedSource {
    pub(crate) ptr: u64,
    pub(crate) ordinal: u32,
    /// Held, never read: the memory outlives the write.
    pub(crate) _keep: Vec<MemoryOwner>,
}

/// Copies chunks of a staged write's source into slots.
pub(crate) trait ChunkCopier: Send + 'static {
    /// A copy in progress.
    type Ticket: Send;
    /// Starts copying `len` bytes at `src_offset` of `source` to host address `dst_addr`, which
    /// stays valid (leased to this copy) until [`ChunkCopier::poll`] returned `Ok(true)` or an
    /// error.
    fn start(
        &mut self,
        source: &StagedSource,
        src_offset: u64,
        dst_addr: usize,
        len: usize,
    ) -> Result<Self::Ticket, String>;
    /// Whether the copy completed.
    fn poll(&mut self, ticket: &Self::Ticket) -> Result<bool, String>;
}

/// Sends one chunk (bytes at `offset` of the write, in `source`) as a host write; the returned
/// transfer completes when the peer acknowledged it (or it failed).
pub(crate) type SendChunk = Box<dyn FnMut(u64, Source) -> Transfer + Send>;
/// Ends the write: on success sends the immediate (if any) and completes the user's transfer;
/// on failure completes it with the error.
pub(crate) type FinishWrite = Box<dyn FnOnce(Result<(), TransferError>) + Send>;

/// One staged write as submitted.
pub(crate) struct StagedJob {
    pub(crate) source: StagedSource,
    pub(crate) len: u64,
    pub(crate) send: SendChunk,
    pub(crate) finish: FinishWrite,
}

/// The handle on an engine's staging thread; dropping it lets the thread exit once the writes
/// in progress are over.
pub(crate) struct Stager {
    jobs: SyncSender<StagedJob>,
}

impl Stager {
    /// Starts the thread over `pool`, copying with `copier`; with nothing to do it polls for
    /// `poll_window` after its last progress before it blocks ([`crate::backoff::recv_hot`]).
    pub(crate) fn start<C: ChunkCopier>(
        copier: C,
        pool: Arc<SlotPool>,
        poll_window: Duration,
    ) -> Result<Stager, String> {
        if pool.slot_count() == 0 {
            return Err("the staging pool has no slot: give it at least one chunk".into());
        }
        let (tx, rx) = sync_channel(STAGED_WRITES_ACTIVE_MAX);
        std::thread::Builder::new()
            .name("accord-device-stage".into())
            .spawn(move || run(rx, copier, pool, poll_window))
            .map_err(|e| format!("could not start the staging thread: {e}"))?;
        Ok(Stager { jobs: tx })
    }

    /// Queues a staged write (waits while [`STAGED_WRITES_ACTIVE_MAX`] are queued).
    pub(crate) fn submit(&self, job: StagedJob) -> Result<(), String> {
        self.jobs.send(job).map_err(|_| "the staging thread has exited".to_string())
    }
}

/// A write in progress.
struct Active<T> {
    source: StagedSource,
    plan: StagePlan,
    send: SendChunk,
    finish: Option<FinishWrite>,
    copies: VecDeque<(Chunk, T, SlotLease)>,
    sends: Vec<(Chunk, Transfer)>,
}

fn run<C: ChunkCopier>(rx: Receiver<StagedJob>, mut copier: C, pool: Arc<SlotPool>, poll_window: Duration) {
    let chunk_bytes = pool.slot_bytes() as u64;
    let mut active: Vec<Active<C::Ticket>> = vec![];
    let mut open = true;
    let mut backoff = crate::backoff::IdleBackoff::new(POLLS_BEFORE_SLEEP, POLL_SLEEP_MAX);
    let mut last_progress = Instant::now();
    loop {
        if active.is_empty() {
            if !open {
                return;
            }
            match crate::backoff::recv_hot(&rx, last_progress, poll_window, Duration::from_millis(100)) {
                Ok(job) => active.push(activate(job, chunk_bytes)),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        while open && active.len() < STAGED_WRITES_ACTIVE_MAX {
            match rx.try_recv() {
                Ok(job) => active.push(activate(job, chunk_bytes)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        let mut progress = issue_copies(&mut active, &mut copier, &pool);
        for write in &mut active {
            progress |= poll_copies(write, &mut copier);
            progress |= poll_sends(write);
        }
        let before = active.len();
        active.retain_mut(|write| match write.plan.outcome() {
            Some(result) => {
                if let Some(finish) = write.finish.take() {
                    finish(result);
                }
                false
            }
            None => true,
        });
        progress |= active.len() < before;
        if progress {
            last_progress = Instant::now();
        }
        backoff.after_round(progress);
    }
}

fn activate<T>(job: StagedJob, chunk_bytes: u64) -> Active<T> {
    Active {
        plan: StagePlan::new(job.len, chunk_bytes),
        source: job.source,
        send: job.send,
        finish: Some(job.finish),
        copies: VecDeque::new(),
        sends: vec![],
    }
}

/// Hands free slots out round robin, one per write per round, and starts their copies.
fn issue_copies<C: ChunkCopier>(active: &mut [Active<C::Ticket>], copier: &mut C, pool: &Arc<SlotPool>) -> bool {
    let mut progress = false;
    loop {
        let mut issued = false;
        for write in active.iter_mut() {
            let Some(lease) = pool.take() else { return progress };
            let Some(chunk) = write.plan.next_chunk() else { continue }; // the lease goes back
            issued = true;
            progress = true;
            debug_assert!(chunk.len as usize <= lease.len_bytes());
            match copier.start(&write.source, chunk.offset, lease.addr(), chunk.len as usize) {
                Ok(ticket) => write.copies.push_back((chunk, ticket, lease)),
                Err(e) => {
                    tracing::error!(error = %e, "staging copy could not start");
                    write.plan.copied(chunk, Err(TransferError::PeerUnreachable));
                }
            }
        }
        if !issued {
            return progress;
        }
    }
}

/// Sends the chunks whose copies completed.
fn poll_copies<C: ChunkCopier>(write: &mut Active<C::Ticket>, copier: &mut C) -> bool {
    let mut progress = false;
    let mut still = VecDeque::with_capacity(write.copies.len());
    for (chunk, ticket, lease) in write.copies.drain(..) {
        match copier.poll(&ticket) {
            Ok(false) => still.push_back((chunk, ticket, lease)),
            Ok(true) => {
                progress = true;
                if write.plan.copied(chunk, Ok(())) {
                    let base = lease.addr();
                    let keep: MemoryOwner = Arc::new(lease);
                    let source = Source::Region { base, len: chunk.len, _keep: Some(keep) };
                    let transfer = (write.send)(chunk.offset, source);
                    write.sends.push((chunk, transfer));
                }
            }
            Err(e) => {
                progress = true;
                tracing::error!(error = %e, "staging copy failed");
                write.plan.copied(chunk, Err(TransferError::PeerUnreachable));
            }
        }
    }
    write.copies = still;
    progress
}

/// Records the chunks whose host writes ended.
fn poll_sends<T>(write: &mut Active<T>) -> bool {
    let before = write.sends.len();
    let plan = &mut write.plan;
    write.sends.retain(|(chunk, transfer)| match transfer.poll() {
        Some(result) => {
            plan.sent(*chunk, result);
            false
        }
        None => true,
    });
    write.sends.len() < before
}
