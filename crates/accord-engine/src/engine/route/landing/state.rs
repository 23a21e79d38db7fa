//! The landing rendezvous' state and limits: the engine's handle on its landing thread (queues,
//! counters, how the receiver's pool is opened). Apart from the rendezvous' logic so that the
//! engine's shared state can hold it without importing the route.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use crate::address::{EngineId, MrDescriptor};
use crate::completion::TransferState;
use crate::device::staging::StagingMemory;
use crate::memory::Source;

/// Control messages queued for the landing thread; more are dropped and counted.
pub const LANDING_CONTROL_QUEUE_MAX: usize = 4096;
/// Chunk requests a writer has outstanding per engine; a further submission waits.
pub const LANDING_REQUESTS_MAX: usize = 1024;
/// Chunks a writer has asked for and not finished, per receiving peer; later chunks wait here
/// (so a long queue at a busy receiver does not run into the timeout).
pub const LANDING_ASKS_PER_PEER_MAX: usize = 64;
/// Asks a receiver holds (queued, granted or copying) per engine; more are refused.
pub const LANDING_ASKS_MAX: usize = 4096;
pub use crate::config::LANDING_TIMEOUT_DEFAULT;

pub(crate) use crate::device::staging::LandingCopier;
/// Control messages as placed: (offset in the control region, bytes).
pub(super) type ControlRx = Receiver<(u64, Vec<u8>)>;

/// Opens a receiver's landing pool (GPU of the first ask, slot bytes, slots) and copier.
pub(crate) type LandingOpener =
    Box<dyn Fn(u32, usize, usize) -> Result<(Box<dyn StagingMemory>, Box<dyn LandingCopier>), String> + Send + Sync>;

/// Counters of the rendezvous (both halves).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LandingStats {
    /// Control messages refused: malformed, from an unknown peer, stale or duplicate.
    pub control_refused: u64,
    /// Control messages dropped because the queue was full.
    pub control_dropped: u64,
    /// Asks refused (region, key, bounds, chunk too large, table full, no pool).
    pub asks_refused: u64,
    /// Chunks copied host-to-device here (inline ones included).
    pub chunks_landed: u64,
    /// Chunks this engine sent inside their asks (at most 8 bytes each: no grant, no write).
    pub chunks_inline: u64,
    /// Inline asks delivered again after they were answered: answered again, not copied.
    pub inline_duplicates: u64,
    /// Granted slots reclaimed because the writer went quiet.
    pub slots_reclaimed: u64,
}

/// A writer's chunk: land `source` at `dst_offset` of device region `dst` of `peer`.
pub(crate) struct ChunkRequest {
    pub(crate) peer: EngineId,
    pub(crate) dst: MrDescriptor,
    pub(crate) dst_offset: u64,
    pub(crate) source: Source,
    pub(crate) done: Arc<TransferState>,
}

/// The engine's handle on its landing thread.
pub(crate) struct Landing {
    pub(super) control_tx: SyncSender<(u64, Vec<u8>)>,
    pub(super) chunk_tx: SyncSender<ChunkRequest>,
    pub(super) ends: Mutex<Option<(ControlRx, Receiver<ChunkRequest>)>>,
    /// The thread is started on first use, once (an atomic read after that, not a lock).
    pub(super) started: std::sync::Once,
    pub(super) opener: Mutex<Option<LandingOpener>>,
    pub(super) stats: Mutex<LandingStats>,
    pub(super) dropped: AtomicU64,
}

impl Landing {
    pub(crate) fn new(opener: LandingOpener) -> Landing {
        let (control_tx, control_rx) = sync_channel(LANDING_CONTROL_QUEUE_MAX);
        let (chunk_tx, chunk_rx) = sync_channel(LANDING_REQUESTS_MAX);
        Landing {
            control_tx,
            chunk_tx,
            ends: Mutex::new(Some((control_rx, chunk_rx))),
            started: std::sync::Once::new(),
            opener: Mutex::new(Some(opener)),
            stats: Mutex::new(LandingStats::default()),
            dropped: AtomicU64::new(0),
        }
    }

    /// Replaces how the receiver's pool and copier are opened (tests: a fake over host memory).
    /// False once the thread has opened them.
    #[cfg(test)]
    pub(crate) fn set_opener(&self, opener: LandingOpener) -> bool {
        let mut slot = self.opener.lock().unwrap();
        slot.is_some().then(|| *slot = Some(opener)).is_some()
    }

    pub(crate) fn stats(&self) -> LandingStats {
        let mut s = *self.stats.lock().unwrap();
        s.control_dropped = self.dropped.load(Ordering::Relaxed);
        s
    }
}
