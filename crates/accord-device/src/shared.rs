//! [`Shared`]: what a device communicator's proxy threads share with it (the engine, the
//! windows, the signal board and cells, the lanes, counters, errors and statistics). Its own
//! module so that the proxy (`proxy/`) and the communicator (`comm.rs`) both depend on it
//! and not on each other.

use crate::error::DescriptorError;
use crate::lane::PeerLane;
use crate::memory::Block;
use crate::signals::SignalBoard;
use crate::window::Window;
use accord_cuda::Gpu;
use accord_engine::{Engine, MrBuffer, MrDescriptor};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Descriptor errors kept for [`crate::DeviceComm::errors`]; later ones are counted only.
pub const ERRORS_KEPT_MAX: usize = 4096;

/// The proxies' running totals, read by [`crate::DeviceComm::stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) descriptors_executed: AtomicU64,
    pub(crate) bytes_put: AtomicU64,
    pub(crate) signal_writes_issued: AtomicU64,
    pub(crate) signal_writes_coalesced: AtomicU64,
    pub(crate) descriptor_errors: AtomicU64,
    pub(crate) lane_batches: AtomicU64,
    pub(crate) lane_driver_ops: AtomicU64,
    pub(crate) lane_items: AtomicU64,
    pub(crate) lane_copies: AtomicU64,
    pub(crate) lane_queue_ns: AtomicU64,
    pub(crate) take_ns: AtomicU64,
    pub(crate) lane_retire_ns: AtomicU64,
    pub(crate) lane_submit_ns: AtomicU64,
    pub(crate) lane_complete_ns: AtomicU64,
}

/// What the proxies share.
pub(crate) struct Shared {
    pub(crate) engine: Arc<Engine>,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) signal_count: u32,
    pub(crate) counter_count: u32,
    pub(crate) windows: RwLock<Vec<Window>>,
    /// `windows.len()`, published after each registration completed (the proxies compare it
    /// with their view instead of taking the lock per descriptor).
    pub(crate) window_count: AtomicUsize,
    pub(crate) signal_board: SignalBoard,
    /// This rank's cells, one per (peer, signal): the source of its signal writes.
    pub(crate) signal_cells: MrBuffer,
    /// Every rank's incoming signal slots.
    pub(crate) peer_signals: Vec<MrDescriptor>,
    /// The GPU the stream lanes run on (None: no lanes).
    pub(crate) lane_gpu: Option<Gpu>,
    /// Each peer's stream lane, where this rank's GPU reaches its signal slots.
    pub(crate) lanes: Vec<Option<PeerLane>>,
    /// A lane batch copying at least this many bytes queues its stores on a second stream
    /// (`lane/`; 0: never).
    pub(crate) lane_stores_aside_bytes: u64,
    /// `u64[counter_count]`, bumped by the proxies, read by GPU code.
    pub(crate) counters: Block,
    /// Descriptor errors, the first [`ERRORS_KEPT_MAX`] of them.
    pub(crate) errors: Mutex<Vec<DescriptorError>>,
    pub(crate) stats: Counters,
}

impl Shared {
    pub(crate) fn record_error(&self, error: DescriptorError) {
        self.stats.descriptor_errors.fetch_add(1, Ordering::Relaxed);
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if errors.len() < ERRORS_KEPT_MAX {
            errors.push(error);
        }
    }

    /// Adds one to counter `id` (checked by the caller). Counters are shared by every ring's
    /// proxy, so this is a host atomic add on host (or mapped) memory; GPU code only reads them.
    pub(crate) fn bump_counter(&self, id: u32) {
        if let Some(w) = self.counters.word(id as usize) {
            w.fetch_add(1, Ordering::Release);
        }
    }

    /// Offset of this rank's cell for (`peer`, `signal`).
    pub(crate) fn signal_cell_offset(&self, peer: u32, signal: u32) -> u64 {
        (u64::from(peer) * u64::from(self.signal_count) + u64::from(signal)) * 8
    }

    /// Offset of this rank's slot `[signal][rank]` in a peer's incoming slots.
    pub(crate) fn signal_slot_offset(&self, signal: u32) -> u64 {
        (u64::from(signal) * u64::from(self.world) + u64::from(self.rank)) * 8
    }
}
