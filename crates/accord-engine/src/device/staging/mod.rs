//! Staging device bytes through pinned host memory, for destinations the copy engine cannot
//! reach: a host region of another process, or anything on another host (until a GPUDirect
//! datapath exists).
//!
//! A staged write is cut into chunks of at most the slot size. Each chunk is copied
//! device-to-host into a slot of a bounded pool of pinned host memory, then sent as an
//! ordinary engine host write from that slot; the slot returns to the pool when the write's
//! source is released (after its last byte was acknowledged, or it failed). Copies of later
//! chunks run while earlier ones are on the wire, as far as free slots allow. The user's
//! immediate goes once every chunk was delivered, as a zero-byte write (exactly once, like a
//! sharded write's trailer); a failed chunk stops further copies and fails the write once
//! nothing of it is in flight.
//!
//! Split for testing: [`StagePlan`] is the pure bookkeeping of one write, [`SlotPool`] the
//! bounded pool over any memory, and [`driver`] the thread that runs them over a
//! [`driver::ChunkCopier`] (the CUDA one in [`crate::device`], a fake on host memory in tests).

pub(crate) mod driver;

use std::sync::{Arc, Mutex};

use crate::error::TransferError;

/// Bytes per staging slot by default (`ACCORD_DEVICE_STAGING_CHUNK_BYTES`).
pub const DEVICE_STAGING_CHUNK_BYTES_DEFAULT: u64 = 4 << 20;
/// Slots per engine by default (`ACCORD_DEVICE_STAGING_CHUNKS`): with 4 MiB slots, 32 MiB of
/// pinned host memory per engine.
pub const DEVICE_STAGING_CHUNKS_DEFAULT: usize = 8;
/// Smallest slot allowed (one shard alignment unit; smaller slots cost a write per few datagrams).
pub const DEVICE_STAGING_CHUNK_BYTES_MIN: u64 = 64 << 10;
/// Largest slot allowed.
pub const DEVICE_STAGING_CHUNK_BYTES_MAX: u64 = 1 << 30;
/// Most slots per engine.
pub const DEVICE_STAGING_CHUNKS_MAX: usize = 1024;
/// Most pinned bytes one engine's pool may hold (slots x slot bytes).
pub const DEVICE_STAGING_POOL_BYTES_MAX: u64 = 4 << 30;
/// Most staged writes in progress per engine; a further one waits in a queue of this size,
/// and a submitter that finds that full waits too.
pub const STAGED_WRITES_ACTIVE_MAX: usize = 1024;

/// One chunk of a staged write: `len` bytes at `offset` of the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) index: u64,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// The bookkeeping of one staged write: which chunk comes next, how many are being copied or
/// are on the wire, and whether the write is over.
#[derive(Debug)]
pub(crate) struct StagePlan {
    len: u64,
    chunk_bytes: u64,
    next_offset: u64,
    next_index: u64,
    copying: usize,
    on_wire: usize,
    delivered_bytes: u64,
    error: Option<TransferError>,
}

impl StagePlan {
    /// A write of `len` bytes in chunks of at most `chunk_bytes` (non-zero).
    pub(crate) fn new(len: u64, chunk_bytes: u64) -> StagePlan {
        assert!(chunk_bytes > 0, "staging chunks must be non-empty");
        StagePlan {
            len,
            chunk_bytes,
            next_offset: 0,
            next_index: 0,
            copying: 0,
            on_wire: 0,
            delivered_bytes: 0,
            error: None,
        }
    }

    /// Chunks the whole write takes.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn chunk_count(&self) -> u64 {
        self.len.div_ceil(self.chunk_bytes)
    }

    /// The next chunk to copy, if any is left and nothing failed (it then counts as copying).
    pub(crate) fn next_chunk(&mut self) -> Option<Chunk> {
        if self.error.is_some() || self.next_offset >= self.len {
            return None;
        }
        let len = self.chunk_bytes.min(self.len - self.next_offset);
        let chunk = Chunk { index: self.next_index, offset: self.next_offset, len };
        self.next_offset += len;
        self.next_index += 1;
        self.copying += 1;
        Some(chunk)
    }

    /// A chunk's device-to-host copy ended. Returns whether to send it now: not after a
    /// failure (its own or an earlier one's), so nothing more goes once the write is lost.
    pub(crate) fn copied(&mut self, chunk: Chunk, result: Result<(), TransferError>) -> bool {
        assert!(self.copying > 0, "copy of chunk {} ended but none was copying", chunk.index);
        self.copying -= 1;
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
        if self.error.is_some() {
            return false;
        }
        self.on_wire += 1;
        true
    }

    /// A chunk's host write ended.
    pub(crate) fn sent(&mut self, chunk: Chunk, result: Result<(), TransferError>) {
        assert!(self.on_wire > 0, "send of chunk {} ended but none was on the wire", chunk.index);
        self.on_wire -= 1;
        match result {
            Ok(()) => self.delivered_bytes += chunk.len,
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
    }

    /// Chunks being copied or on the wire.
    pub(crate) fn in_flight(&self) -> usize {
        self.copying + self.on_wire
    }

    /// The write's result once it is over: every byte delivered, or a failure with nothing of
    /// the write still in flight (so no slot of it is in use when the user hears of it).
    pub(crate) fn outcome(&self) -> Option<Result<(), TransferError>> {
        if self.in_flight() > 0 {
            return None;
        }
        match self.error {
            Some(e) => Some(Err(e)),
            None if self.delivered_bytes == self.len => Some(Ok(())),
            None => None,
        }
    }
}

/// Host-to-device copies out of landing slots (the landing route's receiving half; CUDA in
/// `cuda_staging`, a host-memory fake in the route's tests). Here beside [`StagingMemory`] so
/// that the device layer defines what the route uses and never imports the route.
pub(crate) trait LandingCopier: Send {
    /// Starts copying `len` bytes from host address `src` (a leased slot, valid until `poll`
    /// said done or failed) to device address `dst` of GPU `ordinal`; returns a ticket.
    fn start(&mut self, src: usize, dst: u64, ordinal: u32, len: usize) -> Result<u64, String>;
    /// Whether the copy of `ticket` completed (forgotten once it said true or failed).
    fn poll(&mut self, ticket: u64) -> Result<bool, String>;
}

/// A receiver's landing pool memory and its copier.
pub(crate) type OpenedLanding = (Box<dyn StagingMemory>, Box<dyn LandingCopier>);

/// Memory a [`SlotPool`] hands out in slots: pinned host memory, or plain host memory in tests.
pub(crate) trait StagingMemory: Send + Sync + 'static {
    /// Host address of the first byte; valid as long as the memory lives.
    fn base_addr(&self) -> usize;
    /// Size in bytes.
    fn len_bytes(&self) -> usize;
}

/// A bounded pool of equal slots over one piece of memory. Slots come back when their lease is
/// dropped (by whichever thread released the write reading it); the memory lives until the
/// pool and every lease are gone.
pub(crate) struct SlotPool {
    memory: Box<dyn StagingMemory>,
    slot_bytes: usize,
    slot_count: usize,
    free: Mutex<Vec<usize>>,
}

impl SlotPool {
    /// Cuts `memory` into slots of `slot_bytes` (non-zero; a remainder is unused).
    pub(crate) fn new(memory: Box<dyn StagingMemory>, slot_bytes: usize) -> Arc<SlotPool> {
        assert!(slot_bytes > 0, "slots must be non-empty");
        let slot_count = memory.len_bytes() / slot_bytes;
        Arc::new(SlotPool { memory, slot_bytes, slot_count, free: Mutex::new((0..slot_count).rev().collect()) })
    }

    /// A free slot, if any.
    pub(crate) fn take(self: &Arc<Self>) -> Option<SlotLease> {
        let index = self.free.lock().unwrap().pop()?;
        Some(SlotLease { pool: Arc::clone(self), index })
    }

    /// Slots not leased now.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn free_count(&self) -> usize {
        self.free.lock().unwrap().len()
    }

    /// Slots in all.
    pub(crate) fn slot_count(&self) -> usize {
        self.slot_count
    }

    /// Host address of the first slot.
    pub(crate) fn base_addr(&self) -> usize {
        self.memory.base_addr()
    }

    /// Bytes per slot.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }
}

/// One leased slot; returns to its pool when dropped.
pub(crate) struct SlotLease {
    pool: Arc<SlotPool>,
    index: usize,
}

impl SlotLease {
    /// Host address of the slot's first byte (valid while the lease lives).
    pub(crate) fn addr(&self) -> usize {
        self.pool.memory.base_addr() + self.index * self.pool.slot_bytes
    }
    /// Bytes in the slot.
    pub(crate) fn len_bytes(&self) -> usize {
        self.pool.slot_bytes
    }

    /// Copies `bytes` to the start of the slot; false (nothing written) when they do not fit.
    /// The landing receiver's way to stage a chunk that came inside its ask.
    pub(crate) fn fill(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() > self.len_bytes() {
            return false;
        }
        // Safety: the slot is `len_bytes()` bytes of the pool's memory, alive while this lease
        // is, and leased to this holder alone (a slot is in the free list or in one lease); no
        // peer writes it, since it is granted to none while its lease is held here.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.addr() as *mut u8, bytes.len())
        };
        true
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().unwrap();
        debug_assert!(!free.contains(&self.index), "slot {} returned twice", self.index);
        free.push(self.index);
    }
}

#[cfg(test)]
pub(crate) mod tests;
