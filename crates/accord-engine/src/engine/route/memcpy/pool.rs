//! The engine's copy threads for large same-process writes ([`super::dispatch_local`]).
//!
//! A write is cut into chunks of [`LOCAL_COPY_CHUNK_BYTES`]; any copy thread takes any chunk,
//! so one large write is copied by several threads at once and many writes overlap. Each chunk
//! checks its destination again under the region table's read lock (a region deregistered
//! meanwhile refuses the rest: a deregistration waits for a chunk being copied, never for the
//! whole write). The last chunk to finish counts the immediate (only when every chunk landed)
//! and completes the part. The threads start on the first large write, at most
//! [`LOCAL_COPY_THREADS_MAX`], and stop when the engine drops, after the chunks queued.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::completion::TransferState;
use crate::error::TransferError;
use crate::memory::Source;
use accord_proto::wire::RejectReason;
use accord_proto::{RegionId, RegionKey};

/// Bytes of one chunk, the unit a copy thread takes.
pub const LOCAL_COPY_CHUNK_BYTES: u64 = 256 << 10;
/// Most copy threads one engine starts.
pub const LOCAL_COPY_THREADS_MAX: usize = 8;
/// Most chunks queued for the copy threads; a submitter waits for room beyond it.
pub const LOCAL_COPY_CHUNKS_QUEUED_MAX: usize = 4096;

/// The engine a write lands in, as the copy threads see it. A trait, so that the engine's shared
/// state can own the copy threads without this file naming that state (the state implements it
/// in [`super`]).
pub(crate) trait CopyTarget: Send + Sync {
    /// Checks `source.len()` bytes at `offset` of `region` as the transport's receiver checks a
    /// packet (region, key, bounds) and copies `source` there, under one read lock of the region
    /// table.
    fn place(&self, region: RegionId, key: RegionKey, offset: u64, source: &Source) -> Result<(), RejectReason>;
    /// Counts the immediate `imm` once.
    fn count_imm(&self, imm: u32);
}

/// A checked write into a same-process peer, as [`super::dispatch_local`] hands it over.
pub(crate) struct LocalWrite {
    pub(crate) peer: Arc<dyn CopyTarget>,
    pub(crate) region: RegionId,
    pub(crate) key: RegionKey,
    pub(crate) offset: u64,
    pub(crate) imm: Option<u32>,
    pub(crate) source: Source,
    pub(crate) transfer: Arc<TransferState>,
}

/// What the chunks of one write share: who finishes it.
struct WriteInProgress {
    peer: Arc<dyn CopyTarget>,
    imm: Option<u32>,
    transfer: Arc<TransferState>,
    chunks_left: AtomicUsize,
    failure: Mutex<Option<TransferError>>,
}

struct Chunk {
    write: Arc<WriteInProgress>,
    region: RegionId,
    key: RegionKey,
    offset: u64,
    source: Source,
}

struct Running {
    chunks: SyncSender<Chunk>,
    threads: Vec<JoinHandle<()>>,
}

/// The copy threads of one engine (none until the first large write).
pub(crate) struct LocalCopies {
    threads_wanted: usize,
    running: Mutex<Option<Running>>,
    stopped: std::sync::atomic::AtomicBool,
}

impl LocalCopies {
    /// Copy threads for an engine with `workers` workers in all (one copy thread each, at most
    /// [`LOCAL_COPY_THREADS_MAX`]): the engine was sized for that many busy threads.
    pub(crate) fn new(workers: usize) -> LocalCopies {
        LocalCopies {
            threads_wanted: workers.clamp(1, LOCAL_COPY_THREADS_MAX),
            running: Mutex::new(None),
            stopped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Queues `write`'s chunks (waiting for room when [`LOCAL_COPY_CHUNKS_QUEUED_MAX`] are
    /// queued). After [`LocalCopies::stop`] the write is copied on this thread instead.
    pub(crate) fn submit(&self, write: LocalWrite) {
        let len = write.source.len();
        let chunk_count = len.div_ceil(LOCAL_COPY_CHUNK_BYTES).max(1) as usize;
        let shared = Arc::new(WriteInProgress {
            peer: write.peer,
            imm: write.imm,
            transfer: write.transfer,
            chunks_left: AtomicUsize::new(chunk_count),
            failure: Mutex::new(None),
        });
        let Some(sender) = self.sender() else {
            // Stopping: copy here, so nothing submitted is lost.
            for index in 0..chunk_count {
                copy_chunk(chunk_of(&shared, write.region, write.key, write.offset, &write.source, index));
            }
            return;
        };
        for index in 0..chunk_count {
            let chunk = chunk_of(&shared, write.region, write.key, write.offset, &write.source, index);
            if let Err(returned) = sender.send(chunk) {
                copy_chunk(returned.0); // the threads ended under us: copy here
            }
        }
    }

    /// The queue's sender, starting the threads on first use; None once stopped.
    fn sender(&self) -> Option<SyncSender<Chunk>> {
        if self.stopped.load(Ordering::Acquire) {
            return None;
        }
        let mut running = self.running.lock().unwrap();
        if running.is_none() {
            let (tx, rx) = sync_channel::<Chunk>(LOCAL_COPY_CHUNKS_QUEUED_MAX);
            let rx = Arc::new(Mutex::new(rx));
            let mut threads = Vec::with_capacity(self.threads_wanted);
            for index in 0..self.threads_wanted {
                let rx = rx.clone();
                let spawned =
                    std::thread::Builder::new().name(format!("accord-copy-{index}")).spawn(move || copy_thread(&rx));
                match spawned {
                    Ok(handle) => threads.push(handle),
                    Err(e) => tracing::warn!(error = %e, "could not start a local copy thread"),
                }
            }
            if threads.is_empty() {
                return None; // no thread: the submitter copies
            }
            *running = Some(Running { chunks: tx, threads });
        }
        running.as_ref().map(|r| r.chunks.clone())
    }

    /// Stops the threads once the queued chunks are copied; later writes copy on their
    /// submitter. Called when the engine drops.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let running = self.running.lock().unwrap().take();
        if let Some(Running { chunks, threads }) = running {
            drop(chunks);
            let me = std::thread::current().id();
            for handle in threads {
                if handle.thread().id() != me {
                    let _ = handle.join();
                }
            }
        }
    }

    /// Copy threads running now.
    #[cfg(test)]
    pub(crate) fn threads_running(&self) -> usize {
        self.running.lock().unwrap().as_ref().map_or(0, |r| r.threads.len())
    }
}

fn chunk_of(
    write: &Arc<WriteInProgress>,
    region: RegionId,
    key: RegionKey,
    offset: u64,
    source: &Source,
    index: usize,
) -> Chunk {
    let start = index as u64 * LOCAL_COPY_CHUNK_BYTES;
    let len = (source.len() - start).min(LOCAL_COPY_CHUNK_BYTES);
    Chunk { write: write.clone(), region, key, offset: offset + start, source: source.slice(start, len) }
}

fn copy_thread(chunks: &Mutex<Receiver<Chunk>>) {
    loop {
        // The lock is held only to take one chunk, never while copying.
        let next = chunks.lock().unwrap().recv();
        match next {
            Ok(chunk) => copy_chunk(chunk),
            Err(_) => return, // the engine dropped the sender and the queue is empty
        }
    }
}

/// Copies one chunk; the last chunk of its write counts the immediate and completes the part.
fn copy_chunk(chunk: Chunk) {
    let Chunk { write, region, key, offset, source } = chunk;
    let placed = write.peer.place(region, key, offset, &source);
    drop(source);
    if let Err(reason) = placed {
        write.failure.lock().unwrap().get_or_insert(TransferError::Rejected(reason));
    }
    if write.chunks_left.fetch_sub(1, Ordering::AcqRel) == 1 {
        let failure = write.failure.lock().unwrap().take();
        match failure {
            Some(error) => write.transfer.part_done(Err(error)),
            None => {
                if let Some(imm) = write.imm {
                    write.peer.count_imm(imm);
                }
                write.transfer.part_done(Ok(()));
            }
        }
    }
}
