//! The copy-engine route for device memory: GPU handles, engine-owned streams, cached CUDA IPC
//! mappings of same-host peers' regions, and a poller thread that completes a device write once
//! its copy finished.
//!
//! A device write is one `cuMemcpy*Async` on an engine-owned stream of the source GPU (no
//! kernel, no SM), followed by an event; a large paged write is spread over several streams
//! joined into one event ([`DeviceRoute::copy_many`]). The poller thread queries the events; when one
//! completed it finishes the transfer's only part, which releases the transfer's trailer: the
//! immediate goes as a zero-byte write over the ordinary route (memcpy route in this process,
//! the network transport across processes), so the receiver's exactly-once immediate counting
//! is the one the host path uses, and the immediate is counted only after every byte landed.
//!
//! Everything here loads CUDA dynamically ([`accord_cuda`]): an engine without a GPU builds,
//! runs and registers host memory as before; only device registration and device writes fail,
//! with an error that says why.

pub(crate) mod copy_plan;
pub(crate) mod cuda_staging;
pub(crate) mod staging;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use accord_cuda::{copy_peer_async, DevicePtr, Event, EventKind, Gpu, IpcHandle, IpcMapping, MappingCache, Stream};

use crate::address::{EngineId, MrDescriptor};
use crate::completion::TransferState;
use crate::error::TransferError;
use crate::memory::MemoryOwner;

/// Engine-owned copy streams per GPU and copy direction (device writes of one direction take
/// them in turn). Directions have streams of their own so that a device-to-host copy never
/// waits in a stream behind a host-to-device one: the GPU has a copy engine for each, and a
/// process that sends and receives at once (an NCCL ring) keeps both busy.
pub const DEVICE_STREAMS_PER_GPU: usize = 2;
/// Copy directions, each with its own streams (see [`DEVICE_STREAMS_PER_GPU`]).
const DIRECTIONS: usize = 3;

/// Which copy engine a copy uses: its streams are picked per direction.
#[derive(Copy, Clone)]
enum Direction {
    DeviceToDevice = 0,
    HostToDevice = 1,
    DeviceToHost = 2,
}
/// Most same-host peer regions kept mapped (least recently used unmapped first). Sized for a
/// weight push: a receiver of a 70B-like shard registers ~700 tensors, each a region; at 256
/// every update re-opened mappings, and dropping one synchronises its GPU. A mapping costs
/// address space and the driver's page tables, not memory.
pub const IPC_MAPPINGS_MAX: usize = 4096;
/// Most device copies in flight per engine; a further write blocks until one completed.
pub const DEVICE_COPIES_IN_FLIGHT_MAX: usize = 1024;
/// Sleep of the poller between event queries once copies have been pending for a while
/// ([`POLLS_BEFORE_SLEEP`]); before that it spins and yields, so a completion is seen within
/// microseconds.
const POLL_SLEEP_MAX: Duration = Duration::from_micros(20);
/// Event-query rounds without progress before the poller starts sleeping.
const POLLS_BEFORE_SLEEP: u32 = 1 << 16;

/// How a route spreads and batches its paged device writes (from the engine's configuration:
/// `ACCORD_DEVICE_COPY_STREAMS`, `ACCORD_DEVICE_COPY_BATCH_2D`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct CopyShape {
    /// Streams of a GPU one paged write is spread over (at least 1).
    pub(crate) streams: usize,
    /// 2D copies of one stream's share go in batched calls where the driver has them.
    pub(crate) batch_2d: bool,
}

impl CopyShape {
    /// Device-to-device streams a GPU gets: enough for a paged write's spread, and at least
    /// [`DEVICE_STREAMS_PER_GPU`] for single writes to take in turn.
    fn device_to_device_streams(&self) -> usize {
        self.streams.max(DEVICE_STREAMS_PER_GPU)
    }
}

/// One GPU the engine copies from.
struct GpuSlot {
    gpu: Gpu,
    /// Streams per direction, directions in [`Direction`] order: [`DEVICE_STREAMS_PER_GPU`]
    /// each, device-to-device as many as [`CopyShape::device_to_device_streams`].
    streams: [Vec<Stream>; DIRECTIONS],
    /// Round-robin position per direction.
    next: [usize; DIRECTIONS],
    /// Widest pitch of a 2D copy on this GPU (0 where the driver would not say: no 2D copies).
    max_pitch: u64,
}

/// Key of a mapping: (peer engine, region id, region key, GPU it is mapped on).
type MappingKey = (EngineId, u32, u64, u32);

struct RouteState {
    /// Open GPUs through contexts of the route's own ([`crate::DeviceContext::Private`]).
    private_contexts: bool,
    shape: CopyShape,
    gpus: HashMap<u32, GpuSlot>,
    peer_access: HashSet<(u32, u32)>,
    /// Same-host peers' regions mapped here; an evicted mapping is dropped at once and so
    /// unmapped when the last in-flight copy holding it is done.
    mappings: MappingCache<MappingKey, Arc<IpcMapping>>,
}

/// What runs once a copy completed: sends the immediate, whose part then completes the transfer.
pub(crate) type AfterCopy = Box<dyn FnOnce(Arc<TransferState>) + Send>;

/// A copy whose completion the poller waits for; holds what must outlive the copy.
struct InFlight {
    event: Event,
    transfer: Arc<TransferState>,
    after: Option<AfterCopy>,
    keep: Vec<MemoryOwner>,
    mapping: Option<Arc<IpcMapping>>,
}

/// The route. Created on the first device registration or write of an engine.
pub(crate) struct DeviceRoute {
    state: Mutex<RouteState>,
    inflight: SyncSender<InFlight>,
}

/// Where a device write goes.
pub(crate) enum DeviceTarget {
    /// A region of an engine in this process: its device address and GPU.
    SameProcess { ptr: u64, ordinal: u32 },
    /// A same-host peer's region, opened through its descriptor's IPC handle.
    SameHost { dst: MrDescriptor, offset: u64 },
}

/// The two ends of one copy-engine copy.
pub(crate) enum CopyEnds {
    /// Device memory of this process (GPU `src_ordinal`) into a device region.
    DeviceToDevice { src_ptr: u64, src_ordinal: u32, target: DeviceTarget },
    /// Host memory of this process (a registered region) into a device region.
    HostToDevice { src_addr: usize, target: DeviceTarget },
    /// Device memory of this process into a host region of this process.
    DeviceToHost { src_ptr: u64, src_ordinal: u32, dst_addr: usize },
}

/// What one device write copies.
pub(crate) struct DeviceCopy {
    pub(crate) ends: CopyEnds,
    pub(crate) len: u64,
    /// What keeps both ends' memory alive until the copy completed.
    pub(crate) keep: Vec<MemoryOwner>,
}

impl DeviceRoute {
    /// Loads the driver and starts the poller thread. With `private_contexts`, GPUs are opened
    /// through contexts of the route's own ([`crate::DeviceContext::Private`]); `shape` says
    /// how paged writes are spread and batched (logged once, with whether the driver batches
    /// 2D copies).
    pub(crate) fn open(private_contexts: bool, shape: CopyShape) -> Result<Arc<DeviceRoute>, String> {
        let availability = accord_cuda::probe();
        if availability.device_count == 0 {
            let why = availability.driver_problem.unwrap_or_else(|| "the driver reports no GPU".into());
            return Err(format!("no CUDA device is usable here: {why}"));
        }
        let (tx, rx) = sync_channel(DEVICE_COPIES_IN_FLIGHT_MAX);
        std::thread::Builder::new()
            .name("accord-device-poll".into())
            .spawn(move || poll_loop(rx))
            .map_err(|e| format!("could not start the device poller thread: {e}"))?;
        // The driver is asked about batched 2D copies only where they were asked for; the shape
        // keeps what will really apply, so a write is planned for the calls it will make.
        let (batch_2d, batching) = match shape.batch_2d.then(accord_cuda::copy_2d_batch_support) {
            Some(Ok(())) => (true, "batched (cuMemcpy3DBatchAsync)".to_string()),
            Some(Err(why)) => (false, format!("one call each ({why})")),
            None => (false, "one call each (ACCORD_DEVICE_COPY_BATCH_2D=0)".to_string()),
        };
        let shape = CopyShape { streams: shape.streams.max(1), batch_2d };
        tracing::info!(
            streams = shape.streams,
            "paged device writes: spread over {} copy streams, 2D copies {batching}",
            shape.streams
        );
        let state = RouteState {
            private_contexts,
            shape,
            gpus: HashMap::new(),
            peer_access: HashSet::new(),
            mappings: MappingCache::new(IPC_MAPPINGS_MAX),
        };
        Ok(Arc::new(DeviceRoute { state: Mutex::new(state), inflight: tx }))
    }

    /// The GPU with `ordinal` (opened once).
    pub(crate) fn gpu(&self, ordinal: u32) -> Result<Gpu, String> {
        let mut state = self.state.lock().unwrap();
        Ok(slot(&mut state, ordinal)?.gpu.clone())
    }

    /// Exports the allocation holding `ptr..ptr + len` of GPU `ordinal`; `None` if the driver
    /// refuses the export (the region then serves same-process peers only).
    pub(crate) fn export(&self, ptr: u64, len: usize, ordinal: u32) -> Result<Option<(IpcHandle, u64)>, String> {
        let gpu = self.gpu(ordinal)?;
        accord_cuda::check_device_range(DevicePtr(ptr), len)
            .map_err(|e| format!("{ptr:#x}+{len} is not device memory of GPU {ordinal}: {e}"))?;
        match IpcHandle::export_range(&gpu, DevicePtr(ptr), len) {
            Ok(exported) => Ok(Some(exported)),
            Err(e) => {
                tracing::warn!(error = %e, "device region not exportable through CUDA IPC; same-process peers only");
                Ok(None)
            }
        }
    }

    /// Mappings opened so far (cache misses).
    pub(crate) fn mappings_opened(&self) -> u64 {
        self.state.lock().unwrap().mappings.opened_total()
    }

    /// Byte 0 of the same-host peer region `dst`, mapped through its IPC handle into GPU
    /// `on`'s context (the cached mapping the copy route uses), and the mapping.
    pub(crate) fn map_peer_region(&self, dst: &MrDescriptor, on: u32) -> Result<(u64, Arc<IpcMapping>), String> {
        let _restore = accord_cuda::CurrentContextGuard::save();
        let mut state = self.state.lock().unwrap();
        if state.private_contexts {
            return Err("the engine opens GPUs through contexts of its own (DeviceContext::Private): its mappings \
                        are not usable from the caller's context"
                .into());
        }
        let gpu = slot(&mut state, on)?.gpu.clone();
        mapped(&mut state, &gpu, dst, 0, on)
    }

    /// Enables GPU `from`'s access to GPU `to`'s memory (once per pair).
    pub(crate) fn reach(&self, from: u32, to: u32) -> Result<(), String> {
        let _restore = accord_cuda::CurrentContextGuard::save();
        let mut state = self.state.lock().unwrap();
        let from_gpu = slot(&mut state, from)?.gpu.clone();
        let to_gpu = slot(&mut state, to)?.gpu.clone();
        if from != to && state.peer_access.insert((from, to)) {
            from_gpu.enable_peer_access(&to_gpu).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Queues many device-to-device copies out of GPU `src_ordinal`'s memory into one device
    /// region (`target`, offsets relative to its byte 0) on engine-owned streams, with one event
    /// after all of them: `pieces` are (destination offset, source offset from `src_base`,
    /// bytes), every one checked by the caller against both regions. Runs of equal pieces at constant strides go
    /// as one 2D copy each (batched, with [`CopyShape::batch_2d`], through
    /// [`Stream::copy_2d_many_unchecked`]), the rest through [`Stream::copy_many_unchecked`]
    /// (batched calls) ([`copy_plan`]: a KV request of 2,048 scattered blocks is 327,680 pieces,
    /// and the copy engine's cost per copy exceeds the bytes of one; listed block by block they
    /// are 2,048 2D copies). On one stream (the default) the plan is made and queued in steps
    /// ([`copy_plan::issue_streamed`]); with more, the plan is spread by bytes over [`CopyShape::streams`] streams
    /// ([`copy_plan::spread`]; one for writes under twice [`copy_plan::SHARE_BYTES_MIN`]), forked
    /// from and joined into the first, whose event the poller watches. The pitch limit is the
    /// source GPU's, the one whose copy engine runs them. Once all completed the poller runs
    /// `after` or completes the transfer's one part.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy_many(
        &self,
        src_ordinal: u32,
        target: DeviceTarget,
        src_base: u64,
        pieces: &[(u64, u64, u64)],
        keep: Vec<MemoryOwner>,
        transfer: Arc<TransferState>,
        after: Option<AfterCopy>,
    ) -> Result<(), String> {
        if pieces.iter().any(|&(_, _, len)| usize::try_from(len).is_err()) {
            return Err("length does not fit this machine".into());
        }
        let _restore = accord_cuda::CurrentContextGuard::save();
        let mut state = self.state.lock().unwrap();
        let src_gpu = slot(&mut state, src_ordinal)?.gpu.clone();
        // The destination is reached by address (peer access enabled there where needed).
        let (dst_base, _, mapping) = device_destination(&mut state, &src_gpu, src_ordinal, target)?;
        let max_pitch = slot(&mut state, src_ordinal)?.max_pitch;
        let shape = state.shape;
        // Offsets become device addresses on the way into the planner: no list of them is made.
        let at =
            move |&(dst_offset, src_offset, len): &(u64, u64, u64)| (dst_base + dst_offset, src_base + src_offset, len);
        // Runs at constant strides as 2D copies, the rest in batched 1D calls. Every range was
        // checked by the caller against its region (the source against this engine's
        // registration, the destination against its descriptor, which `mapped` checked against
        // what the IPC handle maps, or against the owner's registration in this process); `keep`
        // and `mapping` hold both until the event after these copies completed.
        // The default shape (one stream, a call per 2D copy) plans and queues in steps, so the
        // copy engine starts on the first blocks while the host plans the rest; the opt-in
        // shapes plan the whole write first (to spread it by bytes over `shape.streams` streams,
        // joined into the first before its event, or to batch its 2D copies).
        let streamed = shape.streams <= 1 && !shape.batch_2d;
        let shares = if streamed {
            vec![]
        } else {
            let list: Vec<(u64, u64, u64)> = pieces.iter().map(at).collect();
            copy_plan::spread(copy_plan::plan(&list, max_pitch), shape.streams, copy_plan::SHARE_BYTES_MIN)
        };
        let (gpu, streams) = next_streams(&mut state, src_ordinal, shares.len().max(1))?;
        gpu.bind().map_err(|e| e.to_string())?;
        let (mut failure, mut lost) = (None, false);
        if streamed {
            // One stream: the event recorded after it covers whatever a failure left queued.
            let steps = copy_plan::STREAM_COPIES_PER_STEP;
            if let Err(e) =
                copy_plan::issue_streamed(pieces.iter().map(at), max_pitch, &mut StreamSink(streams[0]), steps)
            {
                failure = Some(format!("device copy: {e}"));
            }
        } else {
            let mut lanes: Vec<StreamSink<'_>> = streams.iter().map(|s| StreamSink(s)).collect();
            if let Err(e) = copy_plan::issue_spread(&mut lanes, &shares, shape.batch_2d) {
                failure = Some(format!("device copy: {}", e.reason));
                lost = e.untracked;
            }
        }
        let event = match record(&gpu, streams[0]) {
            Ok(event) => event,
            Err(e) => {
                // Copies may be queued and nothing marks their end: what they touch is never
                // released (leaked), so no copy can run into freed or unmapped memory.
                leak_in_flight_memory(keep, mapping, &e);
                return Err(e);
            }
        };
        drop(state);
        if lost {
            let reason = failure.clone().unwrap_or_default();
            leak_in_flight_memory(keep, mapping, &reason);
            return Err(reason);
        }
        // After a failure part-way, what was queued still runs: the memory stays held until it
        // did, and the transfer fails then.
        let after = match failure {
            None => after,
            Some(reason) => Some(Box::new(move |st: Arc<TransferState>| {
                tracing::error!(error = %reason, "device pieces failed part-way");
                st.part_done(Err(crate::error::TransferError::PeerUnreachable));
            }) as AfterCopy),
        };
        let job = InFlight { event, transfer, after, keep, mapping };
        self.inflight.send(job).map_err(|_| "the device poller thread has exited".to_string())
    }

    /// Queues the copy on an engine-owned stream. Once it completed, the poller runs `after`
    /// (which must complete `transfer`'s one part), or completes the part itself.
    pub(crate) fn copy(
        &self,
        copy: DeviceCopy,
        transfer: Arc<TransferState>,
        after: Option<AfterCopy>,
    ) -> Result<(), String> {
        let len = usize::try_from(copy.len).map_err(|_| "length does not fit this machine")?;
        // The caller's thread may be a library's (NCCL's proxy): leave its context as it was.
        let _restore = accord_cuda::CurrentContextGuard::save();
        let mut state = self.state.lock().unwrap();
        let (event, mapping) = match copy.ends {
            CopyEnds::DeviceToDevice { src_ptr, src_ordinal, target } => {
                let src_gpu = slot(&mut state, src_ordinal)?.gpu.clone();
                let (dst_ptr, dst_gpu, mapping) = device_destination(&mut state, &src_gpu, src_ordinal, target)?;
                let (gpu, stream) = next_stream(&mut state, src_ordinal, Direction::DeviceToDevice)?;
                copy_peer_async(DevicePtr(dst_ptr), &dst_gpu, DevicePtr(src_ptr), &src_gpu, len, stream)
                    .map_err(|e| format!("device copy: {e}"))?;
                (record(&gpu, stream)?, mapping)
            }
            CopyEnds::HostToDevice { src_addr, target } => {
                let (dst_ptr, on, mapping) = match target {
                    DeviceTarget::SameProcess { ptr, ordinal } => (ptr, ordinal, None),
                    DeviceTarget::SameHost { dst, offset } => {
                        let wanted = dst.device.map_or(0, |info| info.ordinal);
                        let on = host_to_peer_gpu(&mut state, wanted);
                        let gpu = slot(&mut state, on)?.gpu.clone();
                        let (ptr, mapping) = mapped(&mut state, &gpu, &dst, offset, on)?;
                        (ptr, on, Some(mapping))
                    }
                };
                let (gpu, stream) = next_stream(&mut state, on, Direction::HostToDevice)?;
                // Safety: `src_addr..+len` is a registered host region of this process, checked
                // against the region by the caller and kept alive by `copy.keep` (held by the
                // poller until the event after this copy completed).
                #[allow(unsafe_code)]
                unsafe {
                    accord_cuda::copy_host_to_device_async(DevicePtr(dst_ptr), src_addr as *const u8, len, stream)
                }
                .map_err(|e| format!("host to device copy: {e}"))?;
                (record(&gpu, stream)?, mapping)
            }
            CopyEnds::DeviceToHost { src_ptr, src_ordinal, dst_addr } => {
                let (gpu, stream) = next_stream(&mut state, src_ordinal, Direction::DeviceToHost)?;
                // Safety: `dst_addr..+len` is a registered host region of this process, checked
                // by the caller under the region table's lock and kept alive by `copy.keep` until
                // the copy completed; the engine places nothing else there for this write.
                #[allow(unsafe_code)]
                unsafe { accord_cuda::copy_device_to_host_async(dst_addr as *mut u8, DevicePtr(src_ptr), len, stream) }
                    .map_err(|e| format!("device to host copy: {e}"))?;
                (record(&gpu, stream)?, None)
            }
        };
        drop(state);
        let job = InFlight { event, transfer, after, keep: copy.keep, mapping };
        self.inflight.send(job).map_err(|_| "the device poller thread has exited".to_string())
    }
}

/// A route stream as a [`copy_plan::CopySink`] and [`copy_plan::SpreadLane`] (its marks are
/// events of its GPU); every piece handed to it was checked by [`DeviceRoute::copy_many`]'s
/// caller against both regions, which stay held until the event recorded after the copies
/// completed.
struct StreamSink<'a>(&'a Stream);

impl copy_plan::SpreadLane for StreamSink<'_> {
    type Mark = Event;

    fn mark(&mut self) -> Result<Event, String> {
        record(self.0.gpu(), self.0)
    }

    fn wait_for(&mut self, mark: &Event) -> Result<(), String> {
        self.0.wait_event(mark).map_err(|e| e.to_string())
    }
}

impl copy_plan::CopySink for StreamSink<'_> {
    fn copy_flat(&mut self, pieces: &[(u64, u64, u64)]) -> Result<usize, String> {
        let list: Vec<(DevicePtr, DevicePtr, usize)> =
            pieces.iter().map(|&(d, s, l)| (DevicePtr(d), DevicePtr(s), l as usize)).collect();
        // Safety: see the type's doc (lengths were checked to fit `usize` by `copy_many`).
        #[allow(unsafe_code)]
        unsafe { self.0.copy_many_unchecked(&list) }.map_err(|e| e.to_string())
    }

    fn copy_2d_batch(&mut self, copies: &[copy_plan::Strided]) -> Result<usize, (usize, String)> {
        let mut list = Vec::with_capacity(copies.len());
        for c in copies {
            let size =
                |v: u64| usize::try_from(v).map_err(|_| (0, "a 2D copy's size does not fit this machine".to_string()));
            list.push(accord_cuda::Copy2d {
                dst: DevicePtr(c.dst),
                dst_pitch: size(c.dst_pitch)?,
                src: DevicePtr(c.src),
                src_pitch: size(c.src_pitch)?,
                width: size(c.width)?,
                height: size(c.height)?,
            });
        }
        // Safety: see the type's doc: the rows are the checked pieces the plan was made of.
        #[allow(unsafe_code)]
        unsafe { self.0.copy_2d_many_unchecked(&list) }.map_err(|(queued, e)| (queued, e.to_string()))
    }

    fn copy_2d(&mut self, c: &copy_plan::Strided) -> Result<(), String> {
        let size = |v: u64| usize::try_from(v).map_err(|_| "a 2D copy's size does not fit this machine".to_string());
        let (dst_pitch, src_pitch, width, height) =
            (size(c.dst_pitch)?, size(c.src_pitch)?, size(c.width)?, size(c.height)?);
        // Safety: see the type's doc: the rows are the checked pieces the plan was made of.
        #[allow(unsafe_code)]
        unsafe { self.0.copy_2d_unchecked(DevicePtr(c.dst), dst_pitch, DevicePtr(c.src), src_pitch, width, height) }
            .map_err(|e| e.to_string())
    }
}

/// Where a device-to-device copy from GPU `src_ordinal` writes `target`: the destination's
/// address as that GPU's context reaches it, the GPU to name as the destination's in a copy,
/// and the IPC mapping to hold until the copy completed (peer access enabled once per pair
/// for a region of another GPU in this process).
fn device_destination(
    state: &mut RouteState,
    src_gpu: &Gpu,
    src_ordinal: u32,
    target: DeviceTarget,
) -> Result<(u64, Gpu, Option<Arc<IpcMapping>>), String> {
    match target {
        DeviceTarget::SameProcess { ptr, ordinal } => {
            let dst_gpu = slot(state, ordinal)?.gpu.clone();
            if ordinal != src_ordinal && state.peer_access.insert((src_ordinal, ordinal)) {
                src_gpu.enable_peer_access(&dst_gpu).map_err(|e| e.to_string())?;
            }
            Ok((ptr, dst_gpu, None))
        }
        DeviceTarget::SameHost { dst, offset } => {
            let (ptr, mapping) = mapped(state, src_gpu, &dst, offset, src_ordinal)?;
            Ok((ptr, src_gpu.clone(), Some(mapping)))
        }
    }
}

/// Keeps `keep` and `mapping` alive for the rest of the process: for copies that may still run
/// when nothing says when they end (a CUDA call that marks or joins them failed, which happens
/// only in a broken context). A leak, never a copy into released memory.
fn leak_in_flight_memory(keep: Vec<MemoryOwner>, mapping: Option<Arc<IpcMapping>>, why: &str) {
    tracing::error!(error = %why, "device copies may still run untracked: their memory is kept for good");
    std::mem::forget(keep);
    std::mem::forget(mapping);
}

/// The next engine-owned stream of GPU `ordinal` for copies in `direction` (round robin), and
/// the GPU.
fn next_stream(state: &mut RouteState, ordinal: u32, direction: Direction) -> Result<(Gpu, &Stream), String> {
    let gpu_slot = slot(state, ordinal)?;
    let d = direction as usize;
    let streams = &gpu_slot.streams[d];
    let index = gpu_slot.next[d] % streams.len();
    gpu_slot.next[d] = gpu_slot.next[d].wrapping_add(1);
    Ok((gpu_slot.gpu.clone(), &streams[index]))
}

/// `count` distinct device-to-device streams of GPU `ordinal` (at most as many as it has), the
/// first the next in turn, and the GPU.
fn next_streams(state: &mut RouteState, ordinal: u32, count: usize) -> Result<(Gpu, Vec<&Stream>), String> {
    let gpu_slot = slot(state, ordinal)?;
    let d = Direction::DeviceToDevice as usize;
    let streams = &gpu_slot.streams[d];
    let start = gpu_slot.next[d];
    gpu_slot.next[d] = start.wrapping_add(1);
    let count = count.clamp(1, streams.len());
    Ok((gpu_slot.gpu.clone(), (0..count).map(|i| &streams[(start + i) % streams.len()]).collect()))
}

/// An event recorded after what was just queued on `stream`.
fn record(gpu: &Gpu, stream: &Stream) -> Result<Event, String> {
    let event = Event::new(gpu, EventKind::SyncOnly).map_err(|e| e.to_string())?;
    event.record(stream).map_err(|e| e.to_string())?;
    Ok(event)
}

/// The device address of byte `offset` of a same-host peer's region, through its cached mapping
/// on `gpu` (ordinal `on`).
fn mapped(
    state: &mut RouteState,
    gpu: &Gpu,
    dst: &MrDescriptor,
    offset: u64,
    on: u32,
) -> Result<(u64, Arc<IpcMapping>), String> {
    let mapping = mapping(state, gpu, dst, on)?;
    let info = dst.device.ok_or("the destination descriptor is not of device memory")?;
    Ok((mapping.ptr().0 + info.alloc_offset + offset, mapping))
}

/// Opens GPU `ordinal` through its primary context, or a context of the engine's own
/// ([`crate::DeviceContext::Private`]) when `private`.
pub(crate) fn open_gpu(ordinal: u32, private: bool) -> Result<Gpu, String> {
    let opened = if private { Gpu::open_private(ordinal as usize) } else { Gpu::open(ordinal as usize) };
    opened.map_err(|e| format!("GPU {ordinal}: {e}"))
}

fn slot(state: &mut RouteState, ordinal: u32) -> Result<&mut GpuSlot, String> {
    use std::collections::hash_map::Entry;
    let private = state.private_contexts;
    let device_to_device = state.shape.device_to_device_streams();
    match state.gpus.entry(ordinal) {
        Entry::Occupied(slot) => Ok(slot.into_mut()),
        Entry::Vacant(vacant) => {
            let gpu = open_gpu(ordinal, private)?;
            let made = |count: usize| {
                (0..count).map(|_| Stream::new(&gpu)).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())
            };
            let streams = [made(device_to_device)?, made(DEVICE_STREAMS_PER_GPU)?, made(DEVICE_STREAMS_PER_GPU)?];
            let max_pitch = gpu.max_pitch().unwrap_or(0);
            Ok(vacant.insert(GpuSlot { gpu, streams, next: [0; DIRECTIONS], max_pitch }))
        }
    }
}

/// The cached mapping of `dst`'s allocation on `gpu`, opened on a miss.
fn mapping(state: &mut RouteState, gpu: &Gpu, dst: &MrDescriptor, on: u32) -> Result<Arc<IpcMapping>, String> {
    dst.device.ok_or("the destination descriptor is not of device memory")?;
    let key = (dst.engine, dst.region, dst.key, on);
    // The evicted mapping, if any, drops here: unmapped once no in-flight copy holds it.
    let (mapping, _evicted) = state.mappings.get_or_open(key, || open_mapping(gpu, dst))?;
    Ok(mapping)
}

/// Maps `dst`'s allocation on `gpu` through the IPC handle of its descriptor; checks that the
/// region the descriptor claims lies inside what the handle maps.
fn open_mapping(gpu: &Gpu, dst: &MrDescriptor) -> Result<Arc<IpcMapping>, String> {
    let info = dst.device.ok_or("the destination descriptor is not of device memory")?;
    let ipc = info.ipc.ok_or(
        "the peer's device region could not be exported through CUDA IPC (pool or VMM memory): \
         same-host writes into it are not supported; register cuMemAlloc memory",
    )?;
    let handle = IpcHandle::from_bytes(&ipc.0).map_err(|e| format!("bad IPC handle in descriptor: {e}"))?;
    match info.alloc_offset.checked_add(dst.len) {
        Some(end) if end <= handle.len_bytes() => {}
        _ => {
            return Err(format!(
                "descriptor claims {}+{} bytes but its IPC handle maps {}: refusing a malformed descriptor",
                info.alloc_offset,
                dst.len,
                handle.len_bytes()
            ))
        }
    }
    let mapping = Arc::new(IpcMapping::open(gpu, &handle).map_err(|e| e.to_string())?);
    if (mapping.len_bytes() as u64) < info.alloc_offset + dst.len {
        return Err("the mapped allocation is shorter than the descriptor claims".into());
    }
    Ok(mapping)
}

/// The GPU whose copy engine writes host bytes into another process's memory on GPU `wanted`.
/// Any of our GPUs can reach the mapping. A GPU this process already drives comes first: opening
/// a context on the peer's own GPU puts a second process's context there, and while the peer's
/// kernel spins in a device-side wait the GPU time-slices between the two contexts, so the copy
/// waits out the slice (a kernel-to-kernel ping-pong through the device API took a constant
/// 1.19 ms one way on the 2xH200 host, every signal being such a copy;
/// docs/results/2026-11-26-device-api.md). Without an open GPU: `wanted` if this process sees
/// it, else GPU 0, as before.
fn host_to_peer_gpu(state: &mut RouteState, wanted: u32) -> u32 {
    if state.gpus.contains_key(&wanted) {
        return wanted;
    }
    if let Some(&open) = state.gpus.keys().min() {
        return open;
    }
    if slot(state, wanted).is_ok() {
        wanted
    } else {
        0
    }
}

/// Completes transfers as their copies finish (in any order); exits when the route is dropped
/// and nothing is left in flight.
fn poll_loop(rx: Receiver<InFlight>) {
    let mut pending: VecDeque<InFlight> = VecDeque::new();
    let mut backoff = crate::backoff::IdleBackoff::new(POLLS_BEFORE_SLEEP, POLL_SLEEP_MAX);
    loop {
        if pending.is_empty() {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(job) => pending.push_back(job),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        while let Ok(job) = rx.try_recv() {
            pending.push_back(job);
        }
        let before = pending.len();
        let mut still = VecDeque::with_capacity(pending.len());
        for job in pending.drain(..) {
            match job.event.is_complete() {
                Ok(false) => still.push_back(job),
                Ok(true) => {
                    let InFlight { transfer, after, keep, mapping, .. } = job;
                    drop((keep, mapping)); // released before completion, as host parts do
                    match after {
                        Some(after) => after(transfer),
                        None => transfer.part_done(Ok(())),
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "device copy failed");
                    job.transfer.part_done(Err(TransferError::PeerUnreachable));
                }
            }
        }
        pending = still;
        backoff.after_round(pending.len() < before);
    }
}

#[cfg(test)]
mod tests;
