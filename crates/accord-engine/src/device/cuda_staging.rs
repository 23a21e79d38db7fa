//! The CUDA side of staging ([`super::staging`]): the pool's pinned host memory and the copier
//! that moves chunks device-to-host on engine-owned staging streams (one per GPU, apart from
//! the copy route's streams, so staging copies do not queue behind device-to-device writes).

use std::collections::HashMap;

use accord_cuda::{DevicePtr, Event, EventKind, Gpu, PinnedHostBuffer, Stream};

use super::open_gpu;
use super::staging::driver::{ChunkCopier, StagedSource, Stager};
use super::staging::{SlotPool, StagingMemory};

/// The pool's memory: one pinned, portable allocation (usable from every GPU's context).
struct PinnedStaging(PinnedHostBuffer);

impl StagingMemory for PinnedStaging {
    fn base_addr(&self) -> usize {
        self.0.host_ptr() as usize
    }
    fn len_bytes(&self) -> usize {
        self.0.len_bytes()
    }
}

/// Copies chunks device-to-host with `cuMemcpyDtoHAsync` and an event per chunk.
#[derive(Default)]
struct CudaChunkCopier {
    streams: HashMap<u32, (Gpu, Stream)>,
    private_contexts: bool,
}

impl ChunkCopier for CudaChunkCopier {
    type Ticket = Event;

    fn start(&mut self, source: &StagedSource, src_offset: u64, dst_addr: usize, len: usize) -> Result<Event, String> {
        use std::collections::hash_map::Entry;
        let (gpu, stream) = match self.streams.entry(source.ordinal) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let gpu = open_gpu(source.ordinal, self.private_contexts)?;
                let stream = Stream::new(&gpu).map_err(|e| e.to_string())?;
                v.insert((gpu, stream))
            }
        };
        let src = DevicePtr(source.ptr + src_offset);
        // Safety: `dst_addr..+len` is a slot of the pinned pool leased to this copy; the lease
        // (and with it the pool's memory) is held until `poll` saw the event complete or fail,
        // and nothing else reads or writes the slot meanwhile.
        #[allow(unsafe_code)]
        unsafe { accord_cuda::copy_device_to_host_async(dst_addr as *mut u8, src, len, stream) }
            .map_err(|e| format!("staging copy: {e}"))?;
        let event = Event::new(gpu, EventKind::SyncOnly).map_err(|e| e.to_string())?;
        event.record(stream).map_err(|e| e.to_string())?;
        Ok(event)
    }

    fn poll(&mut self, ticket: &Event) -> Result<bool, String> {
        ticket.is_complete().map_err(|e| e.to_string())
    }
}

/// Starts an engine's staging thread: `chunks` pinned slots of `chunk_bytes`, allocated in the
/// context of GPU `ordinal` (portable, so every GPU's copies can use them); copies in private
/// contexts when `private_contexts` ([`crate::DeviceContext`]).
pub(crate) fn start_cuda_stager(
    ordinal: u32,
    chunk_bytes: u64,
    chunks: usize,
    private_contexts: bool,
    poll_window: std::time::Duration,
) -> Result<Stager, String> {
    let _restore = accord_cuda::CurrentContextGuard::save();
    let gpu = open_gpu(ordinal, private_contexts)?;
    let slot_bytes = usize::try_from(chunk_bytes).map_err(|_| "staging chunk size does not fit this machine")?;
    let total = slot_bytes.checked_mul(chunks).ok_or("staging pool size overflows")?;
    let memory = PinnedHostBuffer::alloc(&gpu, total)
        .map_err(|e| format!("could not allocate {total} bytes of pinned staging memory: {e}"))?;
    let copier = CudaChunkCopier { private_contexts, ..CudaChunkCopier::default() };
    Stager::start(copier, SlotPool::new(Box::new(PinnedStaging(memory)), slot_bytes), poll_window)
}

/// Host-to-device copies out of landing slots, one engine-owned stream per GPU, an event per copy.
#[derive(Default)]
struct CudaLandingCopier {
    streams: HashMap<u32, (Gpu, Stream)>,
    private_contexts: bool,
    events: HashMap<u64, Event>,
    next: u64,
}

impl super::staging::LandingCopier for CudaLandingCopier {
    fn start(&mut self, src: usize, dst: u64, ordinal: u32, len: usize) -> Result<u64, String> {
        use std::collections::hash_map::Entry;
        let (gpu, stream) = match self.streams.entry(ordinal) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let gpu = open_gpu(ordinal, self.private_contexts)?;
                let stream = Stream::new(&gpu).map_err(|e| e.to_string())?;
                v.insert((gpu, stream))
            }
        };
        // Safety: `src..+len` is a landing slot leased to this copy until `poll` saw its event
        // complete or fail; the writer's bytes are in it (acknowledged) and nothing is granted
        // into it meanwhile. The device range is checked by the copy.
        #[allow(unsafe_code)]
        unsafe { accord_cuda::copy_host_to_device_async(DevicePtr(dst), src as *const u8, len, stream) }
            .map_err(|e| format!("landing copy: {e}"))?;
        let event = Event::new(gpu, EventKind::SyncOnly).map_err(|e| e.to_string())?;
        event.record(stream).map_err(|e| e.to_string())?;
        self.next += 1;
        self.events.insert(self.next, event);
        Ok(self.next)
    }

    fn poll(&mut self, ticket: u64) -> Result<bool, String> {
        let event = self.events.get(&ticket).ok_or("unknown landing copy")?;
        let done = event.is_complete().map_err(|e| e.to_string());
        if !matches!(done, Ok(false)) {
            self.events.remove(&ticket);
        }
        done
    }
}

/// Opens a receiver's landing pool (pinned, as many slots as the staging pool) and its copier,
/// which copies in private contexts when `private_contexts` ([`crate::DeviceContext`]).
pub(crate) fn open_cuda_landing(
    ordinal: u32,
    slot_bytes: usize,
    slots: usize,
    private_contexts: bool,
) -> Result<super::staging::OpenedLanding, String> {
    let _restore = accord_cuda::CurrentContextGuard::save();
    let gpu = open_gpu(ordinal, private_contexts)?;
    let total = slot_bytes.checked_mul(slots).ok_or("landing pool size overflows")?;
    let memory = PinnedHostBuffer::alloc(&gpu, total)
        .map_err(|e| format!("could not allocate {total} bytes of pinned landing memory: {e}"))?;
    let copier = CudaLandingCopier { private_contexts, ..CudaLandingCopier::default() };
    Ok((Box::new(PinnedStaging(memory)), Box::new(copier)))
}
