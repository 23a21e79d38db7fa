//! GPU collectives for the ranks of one host (one process and one GPU per
//! rank), driven by a host thread and moved entirely by copy engines.
//!
//! [`GpuCommunicator`] bootstraps the torchrun way ([`crate::store::Bootstrap`];
//! `LOCAL_RANK` picks the GPU) or through a store a framework already runs
//! ([`GpuCommunicator::join`], for PyTorch's c10d store), and offers
//! all_gather, all_to_all, sendrecv (ring pair), broadcast, all_reduce and
//! reduce_scatter on device buffers, ordered on the caller's CUDA stream like
//! NCCL's.
//!
//! # Data movement: push, copy engine, no staging
//!
//! Every byte moves with `cuMemcpyDtoDAsync` on an engine-owned stream, from
//! the sender's buffer straight into the receiver's registered buffer mapped
//! through CUDA IPC (the push model). No kernel copies anything, so
//! all_gather, all_to_all, sendrecv and broadcast use zero SMs. all_reduce
//! and reduce_scatter push blocks into the owner's scratch buffer, reduce
//! them with the NVRTC kernels of [`accord_cuda::Reducer`] (the one SM user,
//! see [`GpuCommunicator::sms_used`]), and all_reduce pushes the reduced
//! blocks back out. Calls larger than the scratch run in rounds; each round
//! is pipelined in chunks (scatter of chunk k+1, reduction of chunk k and
//! gather of chunk k-1 overlap), see [`pipeline`].
//!
//! # Ordering between ranks: a flag board in shared memory
//!
//! Rank 0 creates a small segment of 64-bit words under `/dev/shm`, passes its
//! name through the store, and unlinks it once every rank mapped it. A rank
//! that reached a collective (its stream finished the prior work) publishes
//! which registered buffer it receives into and sets `ready`; a sender waits
//! for `ready` before it writes, and after its copies completed (event
//! polled by the host) bumps `done[sender][receiver]`; the receiver releases
//! its stream once every sender's `done` arrived. Waits spin briefly, then
//! yield, and check peers' liveness (pid, closed and abort flags) every few
//! milliseconds, so a vanished peer gives [`GpuCollError::PeerGone`], not a
//! hang. See [`board`].
//!
//! # Stream order on the caller's stream ([`StreamOrder`])
//!
//! - `HostFn` (default): `cuLaunchHostFunc` on the user's stream; the
//!   function tells the progress thread that prior work completed and
//!   blocks the stream until the collective is done. Zero SMs.
//! - `Stall`: an event recorded on the user's stream (polled by the progress
//!   thread), then the one-thread stall kernel of [`accord_cuda::StallGate`],
//!   released when the collective is done. One SM slot while it waits.
//! - `WaitValue`: the stream writes the call's number into a pinned word and
//!   waits (a stream memory operation) until the progress thread writes it
//!   into a second one ([`worker::MemoryGate`]). Zero SMs, and no driver
//!   callback thread held.
//!
//! In every mode the progress thread moves the bytes through the driver while
//! the stream waits, so a thread blocked in a synchronous CUDA call on that
//! stream stalls the collective until its deadline
//! (`docs/results/2026-11-26-torch-gpu-path.md`). The bench
//! (`accord-gpu-bench --order`) measures each mode; see `docs/results`.
//!
//! # Registration and the mapping cache
//!
//! Receive buffers must be registered ([`GpuCommunicator::register`] for a
//! buffer the caller owns, [`GpuCommunicator::register_allocation_of`] for a
//! framework's tensor): the IPC handle goes into the rank's table on the flag
//! board once; peers map it on first use and keep it in a bounded LRU cache
//! keyed by (peer, registration id), so repeated calls exchange nothing but
//! flag words. See [`registry`] for invalidation.
//!
//! # Peer access
//!
//! Peer access is enabled by `cuIpcOpenMemHandle`'s lazy peer-access flag for
//! exactly the peers whose buffers are mapped, which avoids creating a
//! context on every other GPU in every process.

pub mod board;
pub mod caller_reduce;
pub mod check;
pub mod config;
pub mod direct;
pub mod error;
pub mod marks;
pub mod pipeline;
pub mod pipeline_streams;
pub mod plan;
pub mod poll;
pub mod registry;
mod setup;
pub mod words;
pub mod worker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use accord_cuda::reduce::source::reduce_grid_blocks;
use accord_cuda::{allocation_of, launch_host_fn, DeviceBuffer, DevicePtr, Event, EventKind, Gpu, StallGate, Stream};

pub use board::{GPU_WORLD_SIZE_MAX, REGISTRATIONS_MAX_LIMIT};
pub use config::{GpuConfig, StreamOrder};
pub use error::{GpuCollError, GpuResult};

use crate::algo::Collective;
use crate::store::Bootstrap;
use crate::{DType, ReduceOp};
use caller_reduce::CallerReduce;
use plan::{Plan, ReduceShape};
use registry::Registrations;
use setup::{check_order, publish, VmmExports};
use worker::{HostGate, MemoryGate, Msg, Op, Shared, Start};

/// A collective's send and receive buffers (named, so they cannot be swapped).
#[derive(Clone, Copy, Debug)]
pub struct GpuBufs<'a> {
    /// What this rank contributes.
    pub send: &'a DeviceBuffer,
    /// Where this rank's result lands (registered).
    pub recv: &'a DeviceBuffer,
}

/// GPU collectives over the ranks of one host. See the module docs.
pub struct GpuCommunicator {
    rank: usize,
    world_size: usize,
    gpu: Gpu,
    config: GpuConfig,
    order: StreamOrder,
    /// The torchrun-way bootstrap ([`GpuCommunicator::new`]); None when joined through a
    /// framework's store.
    bootstrap: Option<Bootstrap>,
    shared: Arc<Shared>,
    registrations: Mutex<Registrations>,
    /// The file descriptors of this rank's VMM registrations (see [`VmmExports`]).
    vmm_exports: VmmExports,
    /// The primary context of the GPU, where callers' streams live (the same as `gpu` unless
    /// [`GpuConfig::private_context`]).
    callers_gpu: Gpu,
    /// Reductions on the caller's stream ([`GpuConfig::reduce_on_caller`]), where built.
    /// Declared before `scratch` and `memory_gate` so that it drops first: freeing its words
    /// waits for the caller's context, whose streams may still reduce from `scratch` and wait
    /// on the gate's words (every word is released by then).
    caller_reduce: Option<Arc<CallerReduce>>,
    /// Direct all_reduce and reduce_scatter ([`GpuConfig::direct_bytes`]), where on. Dropped first (see Drop).
    direct: Option<direct::DirectCalls>,
    /// Completion marks of a framework's own stream ([`marks`]), in the caller's context (None
    /// once dropping).
    marks: Option<marks::StreamMarks>,
    scratch: DeviceBuffer,
    stall_gate: Mutex<Option<Arc<StallGate>>>,
    /// The words streams write and wait on in [`StreamOrder::WaitValue`] mode.
    memory_gate: Arc<MemoryGate>,
    /// Held while a call is numbered and queued, so numbers follow queue order (the memory
    /// gate counts calls reached and done in queue order).
    queueing: Mutex<()>,
    tx: Option<SyncSender<Msg>>,
    worker: Option<JoinHandle<()>>,
    submitted: AtomicU64,
}

impl std::fmt::Debug for GpuCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCommunicator")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("gpu", &self.gpu.ordinal())
            .field("order", &self.order)
            .finish()
    }
}

fn to_cuda_dtype(dtype: DType) -> GpuResult<accord_cuda::DType> {
    Ok(match dtype {
        DType::F32 => accord_cuda::DType::F32,
        DType::F16 => accord_cuda::DType::F16,
        DType::BF16 => accord_cuda::DType::BF16,
        DType::I32 => accord_cuda::DType::I32,
        DType::I64 => accord_cuda::DType::I64,
        other => {
            return Err(GpuCollError::InvalidArgument {
                what: format!("GPU reductions support float, half, bfloat16, int32 and int64, not {}", other.name()),
            })
        }
    })
}

fn to_cuda_op(op: ReduceOp, world_size: usize) -> accord_cuda::ReduceOp {
    match op {
        ReduceOp::Sum => accord_cuda::ReduceOp::Sum,
        ReduceOp::Prod => accord_cuda::ReduceOp::Prod,
        ReduceOp::Min => accord_cuda::ReduceOp::Min,
        ReduceOp::Max => accord_cuda::ReduceOp::Max,
        ReduceOp::Avg => accord_cuda::ReduceOp::Avg { divisor: world_size as u32 },
    }
}

fn need(what: &str, buf: &DeviceBuffer, len: usize) -> GpuResult<()> {
    if buf.len_bytes() < len {
        return Err(GpuCollError::InvalidArgument {
            what: format!("the {what} buffer has {} bytes but the call needs {len}", buf.len_bytes()),
        });
    }
    Ok(())
}

fn mul(a: usize, b: usize) -> GpuResult<usize> {
    a.checked_mul(b).ok_or_else(|| GpuCollError::InvalidArgument { what: format!("{a} x {b} bytes overflows") })
}

impl GpuCommunicator {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// This rank's GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The GPU as callers' streams see it: its primary context. Borrow a framework's stream
    /// with this one ([`accord_cuda::Stream::borrow_raw`]); it differs from [`Self::gpu`] only
    /// under [`GpuConfig::private_context`].
    pub fn callers_gpu(&self) -> &Gpu {
        &self.callers_gpu
    }

    /// Whether all_reduce and reduce_scatter reductions run on callers' streams (of the primary
    /// context): [`GpuConfig::reduce_on_caller`] asked for and its kernels built there.
    pub fn reduces_on_caller(&self) -> bool {
        self.caller_reduce.is_some()
    }

    /// The configuration.
    pub fn config(&self) -> &GpuConfig {
        &self.config
    }

    /// The stream-order mechanism of new calls.
    pub fn stream_order(&self) -> StreamOrder {
        self.order
    }

    /// Whether `order` can run on this communicator ([`Self::set_stream_order`] refuses the
    /// others): `stall` cannot in a private context.
    pub fn order_available(&self, order: StreamOrder) -> bool {
        check_order(&self.config, order).is_ok()
    }

    /// Switches the stream-order mechanism for later calls (every rank may
    /// choose independently).
    /// A communicator in a private context ([`GpuConfig::private_context`]) refuses `stall`.
    pub fn set_stream_order(&mut self, order: StreamOrder) -> GpuResult<()> {
        check_order(&self.config, order)?;
        self.order = order;
        Ok(())
    }

    /// Peer buffer mappings opened so far (a cache-miss counter).
    pub fn mappings_opened(&self) -> u64 {
        self.shared.mappings_opened.load(Ordering::Relaxed)
    }

    /// Registered buffers (the scratch buffer included).
    pub fn registration_count(&self) -> usize {
        self.registrations().len()
    }

    fn registrations(&self) -> std::sync::MutexGuard<'_, Registrations> {
        self.registrations.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `buf` as a receive buffer: exports its IPC handle into this
    /// rank's table on the board (once; registering the same buffer again
    /// returns the same id). Keep it alive until [`GpuCommunicator::deregister`].
    pub fn register(&mut self, buf: &DeviceBuffer) -> GpuResult<u64> {
        self.check_gpu("registered", buf)?;
        let mut regs = self.registrations();
        if let Some(id) = regs.find_exact(buf.ptr().0, buf.len_bytes()) {
            return Ok(id);
        }
        let id = regs.insert(buf.ptr().0, buf.len_bytes())?;
        if let Err(e) =
            publish(&self.shared.board, self.rank, id, &self.gpu, (buf.ptr(), buf.len_bytes()), &self.vmm_exports)
        {
            regs.remove(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Makes `ptr..ptr + len_bytes`, memory a framework allocated (a tensor of PyTorch's caching
    /// allocator), usable as a receive buffer: registers the whole `cuMemAlloc` allocation that
    /// holds it, once per allocation. A registration whose allocation was freed and replaced
    /// at the same address is dropped first; when the table is full, the least recently used
    /// allocation with no collective in flight makes room. The memory must stay allocated
    /// while a collective receives into it.
    pub fn register_allocation_of(&self, ptr: DevicePtr, len_bytes: usize) -> GpuResult<()> {
        let alloc = allocation_of(ptr, len_bytes)?;
        let mut regs = self.registrations();
        if let Some((id, reg)) = regs.find_allocation(alloc.base.0) {
            if reg.buffer_id == Some(alloc.buffer_id) && reg.len == alloc.len_bytes {
                return Ok(());
            }
            self.drop_registration(&mut regs, id);
        }
        if regs.is_full() {
            let completed = self.shared.completed.load(Ordering::Acquire);
            match regs.evictable(completed) {
                Some(id) => self.drop_registration(&mut regs, id),
                None => {
                    return Err(GpuCollError::TableFull {
                        what: "the registration table (every entry is in use by a queued collective)",
                        max: self.config.registrations_max,
                        env: "ACCORD_GPU_REGISTRATIONS_MAX",
                    })
                }
            }
        }
        let id = regs.insert_allocation(alloc.base.0, alloc.len_bytes, alloc.buffer_id)?;
        if let Err(e) =
            publish(&self.shared.board, self.rank, id, &self.gpu, (alloc.base, alloc.len_bytes), &self.vmm_exports)
        {
            regs.remove(id);
            return Err(e);
        }
        tracing::debug!(
            rank = self.rank,
            id,
            base = alloc.base.0,
            len = alloc.len_bytes,
            buffer_id = alloc.buffer_id,
            "registered an allocation by address"
        );
        Ok(())
    }

    /// Forgets registration `id` here and on the board; peers retire their mappings of this
    /// rank's buffers before their next push into it.
    fn drop_registration(&self, regs: &mut Registrations, id: u64) {
        regs.remove(id);
        self.shared.board.clear_registration(self.rank, id);
        self.shared.board.bump_dereg_epoch(self.rank);
        self.vmm_exports.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// Forgets `buf`'s registration; peers retire their mappings of this
    /// rank's buffers before their next push into it. Call it with no
    /// collective on `buf` in flight.
    pub fn deregister(&mut self, buf: &DeviceBuffer) -> GpuResult<()> {
        let mut regs = self.registrations();
        let id = regs
            .find_exact(buf.ptr().0, buf.len_bytes())
            .ok_or(GpuCollError::NotRegistered { ptr: buf.ptr().0, len_bytes: buf.len_bytes() })?;
        self.drop_registration(&mut regs, id);
        Ok(())
    }

    /// Asks the progress thread to close retired peer mappings once the
    /// collectives queued so far are done (closing synchronises the GPU).
    pub fn release_mappings(&self) -> GpuResult<()> {
        self.send(Msg::ReleaseMappings)
    }

    /// Waits until every submitted collective finished on the host side
    /// (the user's stream is released) and returns the first error, if any.
    pub fn wait_idle(&self, timeout: Duration) -> GpuResult<()> {
        let deadline = Instant::now() + timeout;
        let target = self.submitted.load(Ordering::Relaxed);
        while self.shared.completed.load(Ordering::Acquire) < target {
            if Instant::now() >= deadline {
                return Err(GpuCollError::Timeout { what: "queued collectives to finish".into(), waited: timeout });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        if let Some(direct) = &self.direct {
            if !direct.wait_finished(deadline.saturating_duration_since(Instant::now())) {
                let (queued, done) = direct.progress();
                return Err(GpuCollError::Timeout {
                    what: format!("direct collectives to finish ({done} of {queued})"),
                    waited: timeout,
                });
            }
        }
        self.check_failed()
    }

    /// All-gather of small host blobs through the bootstrap store (for
    /// benchmarks and tests; every rank must call it).
    pub fn host_all_gather(&mut self, blob: &[u8]) -> GpuResult<Vec<Vec<u8>>> {
        match self.bootstrap.as_mut() {
            Some(bootstrap) => Ok(bootstrap.all_gather(blob)?),
            None => Err(GpuCollError::InvalidArgument {
                what: "this communicator joined through an outside store: exchange host data through it".into(),
            }),
        }
    }

    /// The first error a collective hit, if any (later calls fail with it too).
    pub fn check(&self) -> GpuResult<()> {
        self.check_failed()
    }

    /// Collectives submitted so far, and how many of them finished (on the host side for the
    /// progress thread's, on the stream for direct calls).
    pub fn progress(&self) -> (u64, u64) {
        let (direct_queued, direct_done) = self.direct.as_ref().map_or((0, 0), |d| d.progress());
        (
            self.submitted.load(Ordering::Relaxed) + direct_queued,
            self.shared.completed.load(Ordering::Acquire) + direct_done.min(direct_queued),
        )
    }

    /// SMs a collective of `bytes` (nccl-tests meaning) occupies: 0 for
    /// copies, the reduction grid (capped at the SM count, and at
    /// [`GpuConfig::reduce_blocks_max`]) for all_reduce and
    /// reduce_scatter, plus 1 in [`StreamOrder::Stall`] mode (the stall kernel).
    pub fn sms_used(&self, collective: Collective, bytes: usize, dtype: DType) -> u32 {
        let stall = u32::from(self.order == StreamOrder::Stall);
        let multiprocessors = self.gpu.multiprocessor_count();
        let sms = self.config.reduce_blocks(multiprocessors).min(multiprocessors);
        let e = dtype.size_bytes();
        let block_elements = match collective {
            Collective::AllReduce => bytes / e / self.world_size,
            Collective::ReduceScatter => bytes / e / self.world_size,
            _ => return stall,
        };
        if self.world_size == 1 {
            return stall;
        }
        // A direct call (what it pushes to each peer fits a slot): one grid over what it reduces,
        // and no stall kernel (its order is stream waits).
        let pushed = if collective == Collective::AllReduce { bytes } else { bytes / self.world_size };
        if pushed > 0 && pushed <= self.direct_bytes_max() {
            return reduce_grid_blocks((pushed / e) as u64, e, sms).min(sms);
        }
        let cap = plan::round_elements_max(self.world_size, self.config.scratch_bytes, e);
        stall + reduce_grid_blocks(block_elements.min(cap) as u64, e, sms).min(sms)
    }

    /// all_gather: `bytes_per_rank` of `send` into everyone's `recv` at `rank * bytes_per_rank`.
    pub fn all_gather(&self, bufs: GpuBufs<'_>, bytes_per_rank: usize, stream: &Stream) -> GpuResult<()> {
        need("send", bufs.send, bytes_per_rank)?;
        need("receive", bufs.recv, mul(bytes_per_rank, self.world_size)?)?;
        let plan = plan::all_gather(self.world_size, self.rank, bytes_per_rank);
        self.submit(plan, bufs, mul(bytes_per_rank, self.world_size)?, None, stream)
    }

    /// all_to_all: block `j` (of `bytes_per_rank`) of `send` into rank `j`'s `recv` at block `rank`.
    pub fn all_to_all(&self, bufs: GpuBufs<'_>, bytes_per_rank: usize, stream: &Stream) -> GpuResult<()> {
        let total = mul(bytes_per_rank, self.world_size)?;
        need("send", bufs.send, total)?;
        need("receive", bufs.recv, total)?;
        self.submit(plan::all_to_all(self.world_size, self.rank, bytes_per_rank), bufs, total, None, stream)
    }

    /// sendrecv on the ring: `bytes` of `send` to rank `rank + 1`, into `recv` from rank `rank - 1`.
    pub fn sendrecv(&self, bufs: GpuBufs<'_>, bytes: usize, stream: &Stream) -> GpuResult<()> {
        need("send", bufs.send, bytes)?;
        need("receive", bufs.recv, bytes)?;
        self.submit(plan::sendrecv(self.world_size, self.rank, bytes), bufs, bytes, None, stream)
    }

    /// broadcast: `bytes` of `root`'s `send` into everyone's `recv`.
    pub fn broadcast(&self, bufs: GpuBufs<'_>, bytes: usize, root: usize, stream: &Stream) -> GpuResult<()> {
        if root >= self.world_size {
            return Err(GpuCollError::InvalidArgument {
                what: format!("root {root} is not a rank; use 0..{}", self.world_size),
            });
        }
        if self.rank == root {
            need("send", bufs.send, bytes)?;
        }
        need("receive", bufs.recv, bytes)?;
        self.submit(plan::broadcast(self.world_size, self.rank, root, bytes), bufs, bytes, None, stream)
    }

    /// all_reduce of `count` elements of `send` into `recv` (in place if they are the same buffer).
    pub fn all_reduce(
        &self,
        bufs: GpuBufs<'_>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> GpuResult<()> {
        let bytes = mul(count, dtype.size_bytes())?;
        need("send", bufs.send, bytes)?;
        need("receive", bufs.recv, bytes)?;
        let reduce = (to_cuda_dtype(dtype)?, to_cuda_op(op, self.world_size));
        let call = direct::DirectCall::AllReduce { count, dtype: reduce.0, op: reduce.1 };
        if let Some(done) = self.try_direct(call, &bufs, stream) {
            return done;
        }
        let plan = plan::all_reduce(self.reduce_shape(dtype), count);
        self.submit(plan, bufs, bytes, Some(reduce), stream)
    }

    /// The completion marks of a stream of the caller's own (see [`marks`]).
    pub fn marks(&self) -> GpuResult<&marks::StreamMarks> {
        self.marks.as_ref().ok_or_else(|| GpuCollError::Failed { first: "the communicator is closing".into() })
    }

    /// Whether a call of `collective` pushing `pushed` bytes to each peer (an all_reduce's
    /// buffer, a reduce_scatter's block) on `stream` goes direct: then its receive buffer needs
    /// no registration. The size decides, the same on every rank; and a stream of the private
    /// context ([`GpuConfig::private_context`]) keeps the progress thread's path, whose kernels
    /// live there (every rank must use streams of the same context for one call).
    pub fn goes_direct(&self, collective: Collective, pushed: usize, stream: &Stream) -> bool {
        matches!(collective, Collective::AllReduce | Collective::ReduceScatter)
            && pushed > 0
            && pushed <= self.direct_bytes_max()
            && !stream.gpu().is_private()
    }

    /// Queues `call` direct ([`direct`]) where it goes so ([`GpuCommunicator::goes_direct`]); a
    /// call whose buffers overlap other than exactly (in place) is refused, as every rank would.
    /// None sends it through the progress thread.
    fn try_direct(&self, call: direct::DirectCall, bufs: &GpuBufs<'_>, stream: &Stream) -> Option<GpuResult<()>> {
        let (collective, send_len, recv_len, in_place_allowed) = match call {
            direct::DirectCall::AllReduce { .. } => (Collective::AllReduce, 1, 1, true),
            direct::DirectCall::ReduceScatter { .. } => (Collective::ReduceScatter, self.world_size, 1, false),
        };
        let pushed = call.slot_bytes_used();
        if !self.goes_direct(collective, pushed, stream) {
            return None;
        }
        let direct = self.direct.as_ref()?;
        let (send, recv) = (bufs.send.ptr(), bufs.recv.ptr());
        let apart = send.0.saturating_add((pushed * send_len) as u64) <= recv.0
            || recv.0.saturating_add((pushed * recv_len) as u64) <= send.0;
        let checked = self
            .check_failed()
            .and_then(|()| self.check_gpu("send", bufs.send))
            .and_then(|()| self.check_gpu("receive", bufs.recv))
            .and_then(|()| match stream.gpu().same_device(&self.gpu) {
                true => Ok(()),
                false => Err(GpuCollError::InvalidArgument {
                    what: "the stream is on another GPU; pass a stream of the communicator's GPU".into(),
                }),
            })
            .and_then(|()| match apart || (in_place_allowed && send == recv) {
                true => Ok(()),
                false => Err(GpuCollError::InvalidArgument {
                    what: "the send and receive buffers overlap; pass the same buffer (all_reduce in place) or \
                           disjoint ones"
                        .into(),
                }),
            });
        Some(checked.and_then(|()| direct.run(call, send, recv, stream)))
    }

    /// The most bytes a direct call ([`GpuConfig::direct_bytes`]) pushes to each peer: an
    /// all_reduce's buffer, a reduce_scatter's block; 0 where direct calls are off.
    pub fn direct_bytes_max(&self) -> usize {
        self.direct.as_ref().map_or(0, |d| d.slot_bytes())
    }

    /// reduce_scatter: block `j` (of `count_per_rank` elements) of every
    /// rank's `send`, reduced into rank `j`'s `recv`.
    pub fn reduce_scatter(
        &self,
        bufs: GpuBufs<'_>,
        count_per_rank: usize,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> GpuResult<()> {
        let block = mul(count_per_rank, dtype.size_bytes())?;
        need("send", bufs.send, mul(block, self.world_size)?)?;
        need("receive", bufs.recv, block)?;
        if bufs.send.ptr() == bufs.recv.ptr() && self.world_size > 1 {
            return Err(GpuCollError::InvalidArgument {
                what: "reduce_scatter cannot run in place; pass distinct send and receive buffers".into(),
            });
        }
        let reduce = (to_cuda_dtype(dtype)?, to_cuda_op(op, self.world_size));
        let call = direct::DirectCall::ReduceScatter { count: count_per_rank, dtype: reduce.0, op: reduce.1 };
        if let Some(done) = self.try_direct(call, &bufs, stream) {
            return done;
        }
        let plan = plan::reduce_scatter(self.reduce_shape(dtype), count_per_rank);
        self.submit(plan, bufs, block, Some(reduce), stream)
    }

    fn reduce_shape(&self, dtype: DType) -> ReduceShape {
        ReduceShape {
            n: self.world_size,
            me: self.rank,
            element_bytes: dtype.size_bytes(),
            scratch_bytes: self.config.scratch_bytes,
            chunk_bytes: self.config.pipeline_chunk_bytes,
            chunks_max: self.config.pipeline_chunks_max,
        }
    }

    fn check_gpu(&self, what: &str, buf: &DeviceBuffer) -> GpuResult<()> {
        if !buf.gpu().same_device(&self.gpu) {
            return Err(GpuCollError::InvalidArgument {
                what: format!(
                    "the {what} buffer is on GPU {} but this rank uses GPU {}; allocate it on the communicator's GPU",
                    buf.gpu().ordinal(),
                    self.gpu.ordinal()
                ),
            });
        }
        Ok(())
    }

    fn check_failed(&self) -> GpuResult<()> {
        match self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(first) => Err(GpuCollError::Failed { first: first.clone() }),
            None => Ok(()),
        }
    }

    fn send(&self, msg: Msg) -> GpuResult<()> {
        let tx =
            self.tx.as_ref().ok_or_else(|| GpuCollError::Failed { first: "the communicator is closing".into() })?;
        tx.send(msg).map_err(|_| GpuCollError::Failed { first: "the progress thread has exited".into() })
    }

    fn stall_gate(&self) -> GpuResult<Arc<StallGate>> {
        let mut slot = self.stall_gate.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gate) = slot.as_ref() {
            return Ok(Arc::clone(gate));
        }
        let gate = Arc::new(StallGate::new(&self.gpu)?);
        *slot = Some(Arc::clone(&gate));
        Ok(gate)
    }

    fn submit(
        &self,
        plan: Plan,
        bufs: GpuBufs<'_>,
        recv_len: usize,
        reduce: Option<(accord_cuda::DType, accord_cuda::ReduceOp)>,
        stream: &Stream,
    ) -> GpuResult<()> {
        self.check_failed()?;
        self.check_gpu("send", bufs.send)?;
        self.check_gpu("receive", bufs.recv)?;
        if !stream.gpu().same_device(&self.gpu) {
            return Err(GpuCollError::InvalidArgument {
                what: "the stream is on another GPU; pass a stream of the communicator's GPU".into(),
            });
        }
        let recv: DevicePtr = bufs.recv.ptr();
        let recv_reg = {
            let mut regs = self.registrations();
            let found = regs
                .lookup(recv.0, recv_len)
                .ok_or(GpuCollError::NotRegistered { ptr: recv.0, len_bytes: recv_len })?;
            regs.touch(found.0, self.submitted.load(Ordering::Relaxed) + 1);
            found
        };
        // The host function / stall may wait several op timeouts when calls queue up behind each other.
        let hold_max = self.config.op_timeout.saturating_mul(4);
        let _queueing = self.queueing.lock().unwrap_or_else(|p| p.into_inner());
        let mut caller_chunks = None;
        let mut doomed: Option<GpuCollError> = None;
        let start = match self.order {
            StreamOrder::HostFn => {
                let gate = HostGate::new();
                let in_callback = Arc::clone(&gate);
                launch_host_fn(stream, move || in_callback.reach_and_wait(hold_max))?;
                Start::HostFn(gate)
            }
            StreamOrder::Stall => {
                let gate = self.stall_gate()?;
                let event = Event::new(&self.gpu, EventKind::SyncOnly)?;
                event.record(stream)?;
                let ticket = gate.stall(stream, hold_max)?;
                Start::Stall { event, ticket, gate }
            }
            StreamOrder::WaitValue => {
                let ticket = self.submitted.load(Ordering::Relaxed) + 1;
                let gate = &self.memory_gate;
                stream.write_value_u64(gate.reached_ptr(), ticket)?;
                // The caller's reductions (if any) sit between the reached store and the wait for
                // the release, which needs them done. A failure from here on is not undone on
                // this thread (releasing the ticket here would also release calls queued before
                // it): the call goes to the progress thread doomed, which fails it in queue order.
                caller_chunks = self.number_caller_chunks(&plan, reduce, stream);
                if let Some(numbers) = caller_chunks {
                    doomed = self.queue_caller_reductions(&plan, numbers, &bufs, reduce, stream).err();
                }
                if doomed.is_none() {
                    doomed = stream.wait_value_u64_geq(gate.released_ptr(), ticket).map_err(GpuCollError::from).err();
                }
                Start::WaitValue { ticket, gate: Arc::clone(gate) }
            }
        };
        let why = doomed.as_ref().map(|e| e.to_string());
        let op =
            Box::new(Op { plan, send: bufs.send.ptr(), recv, recv_reg, reduce, start, caller_chunks, doomed: why });
        self.submitted.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.tx.as_ref().map_or(Err(None), |tx| tx.send(Msg::Op(op)).map_err(Some)) {
            if let Some(std::sync::mpsc::SendError(Msg::Op(op))) = e {
                if let (Some(caller), Some(numbers)) = (&self.caller_reduce, op.caller_chunks) {
                    caller.set_all_arrived(numbers);
                    caller.finish(numbers);
                }
                match op.start {
                    Start::HostFn(gate) => gate.finish(),
                    Start::Stall { ticket, gate, .. } => gate.release(ticket),
                    Start::WaitValue { ticket, gate } => gate.release(ticket),
                }
            }
            self.shared.completed.fetch_add(1, Ordering::Release);
            return Err(GpuCollError::Failed { first: "the progress thread has exited".into() });
        }
        match doomed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl GpuCommunicator {
    /// Where the caller's stream reduces this call ([`GpuConfig::reduce_on_caller`]): its chunks'
    /// numbers; None where the progress thread reduces it (the option off, not the `waitvalue`
    /// order, a copy plan, a stream of the private context, whose context lacks these kernels,
    /// or too many chunks in flight).
    fn number_caller_chunks(
        &self,
        plan: &Plan,
        reduce: Option<(accord_cuda::DType, accord_cuda::ReduceOp)>,
        stream: &Stream,
    ) -> Option<caller_reduce::ChunkNumbers> {
        let (Some(caller), Some(_), StreamOrder::WaitValue) = (&self.caller_reduce, reduce, self.order) else {
            return None;
        };
        if stream.gpu().is_private() {
            return None;
        }
        caller.number(caller_reduce::chunk_count(plan))
    }

    /// Queues the chunks `numbers` of `plan` on the caller's stream (between its "reached" store
    /// and its wait for the release). On an error part of them may be queued: the call must
    /// then go to the progress thread doomed, which lets the stream past them.
    fn queue_caller_reductions(
        &self,
        plan: &Plan,
        numbers: caller_reduce::ChunkNumbers,
        bufs: &GpuBufs<'_>,
        reduce: Option<(accord_cuda::DType, accord_cuda::ReduceOp)>,
        stream: &Stream,
    ) -> GpuResult<()> {
        let (Some(caller), Some(reduce)) = (&self.caller_reduce, reduce) else {
            return Ok(());
        };
        let at = caller_reduce::Buffers {
            send: bufs.send.ptr(),
            recv: bufs.recv.ptr(),
            scratch: self.scratch.ptr(),
            gpu: &self.callers_gpu,
        };
        self.callers_gpu.bind()?;
        caller.queue(plan, numbers, &at, reduce, stream)
    }
}

impl Drop for GpuCommunicator {
    fn drop(&mut self) {
        // Direct calls first: closing waits for the calls this rank queued, whose peers are
        // still open (this rank has not closed on the board yet). Where they never finished, a
        // stream may still wait on words of this communicator: what a context synchronisation
        // (a pinned buffer's drop) would wait for is leaked with them, not freed.
        let finished = self.direct.as_mut().is_none_or(|d| d.close());
        if !finished {
            std::mem::forget(self.marks.take());
            std::mem::forget(Arc::clone(&self.memory_gate));
            std::mem::forget(self.caller_reduce.clone());
        }
        drop(self.direct.take());
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Msg::Stop);
        }
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
        self.shared.board.close_rank(self.rank);
        // Every queued call ran (the worker drained the queue); no stream may wait on the word
        // once its memory goes.
        self.memory_gate.release(u64::MAX);
        if let Some(caller) = &self.caller_reduce {
            caller.release_all();
        }
        let _ = &self.scratch;
    }
}

#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
mod tests;
