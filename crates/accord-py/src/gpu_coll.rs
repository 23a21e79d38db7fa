//! `accord.GpuCommunicator`: the copy-engine GPU collectives of `accord_coll::gpu` for tensors
//! a framework allocated, ordered on the framework's stream. `accord.torch` runs CUDA tensors
//! through it when every rank of a group is on one host.
//!
//! Why raw addresses: the caller (PyTorch) owns the memory and the stream. A call passes
//! `tensor.data_ptr()` and `torch.cuda.current_stream().cuda_stream`; the receive buffer's whole
//! allocation is registered on first use (cached by the driver's allocation id, so a segment
//! the caching allocator frees and gets back is registered anew), and the collective is queued
//! behind the work already on that stream, which it holds until the bytes arrived. Nothing
//! here dereferences an address: each is checked against the driver's allocation first, so a
//! wrong one is an exception, never a stray write on the host.
//!
//! Calls return once the collective is queued (with the GIL released while a full queue
//! drains); a later failure (a peer died) is raised by the next call or by `check`.

use crate::coll_store::PyStore;
use crate::errors::{error, Kind};
use accord_coll::gpu::{GpuBufs, GpuCollError, GpuCommunicator as Inner, GpuConfig, StreamOrder};
use accord_coll::{Collective, DType, ReduceOp};
use accord_cuda::{CurrentContextGuard, DeviceBuffer, DevicePtr, Stream};
use pyo3::prelude::*;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

/// A GPU collective failure as the exception of `accord.errors` it belongs to.
fn gpu_error(op: &str, e: GpuCollError) -> PyErr {
    error(gpu_error_kind(&e), format!("{op}: {e}"))
}

/// Which exception of `accord.errors` a GPU collective failure belongs to.
pub(crate) fn gpu_error_kind(e: &GpuCollError) -> Kind {
    match e {
        GpuCollError::Timeout { .. } => Kind::Timeout,
        GpuCollError::PeerGone { .. } | GpuCollError::PeerAborted { .. } | GpuCollError::Protocol { .. } => Kind::Peer,
        GpuCollError::Failed { .. } => Kind::Peer,
        GpuCollError::InvalidArgument { .. } => Kind::InvalidRequest,
        GpuCollError::NotRegistered { .. } | GpuCollError::TableFull { .. } => Kind::InvalidBuffer,
        GpuCollError::Store(_) => Kind::Peer,
        _ => Kind::Accord,
    }
}

fn parse_dtype(op: &str, dtype: &str) -> PyResult<DType> {
    DType::from_str(dtype).map_err(|e| error(Kind::InvalidRequest, format!("{op}: {e}")))
}

fn parse_op(op: &str, reduce: &str) -> PyResult<ReduceOp> {
    ReduceOp::from_str(reduce).map_err(|e| error(Kind::InvalidRequest, format!("{op}: {e}")))
}

fn seconds(op: &str, s: f64) -> PyResult<Duration> {
    crate::values::seconds(op, "timeout", s, true)
}

/// The GPU collectives of the ranks of one host, on memory and streams the caller owns.
#[pyclass(module = "accord", name = "GpuCommunicator")]
pub struct GpuCommunicator {
    inner: Mutex<Option<Inner>>,
    /// This rank.
    #[pyo3(get)]
    rank: usize,
    /// Number of ranks.
    #[pyo3(get)]
    world_size: usize,
    /// The GPU ordinal this rank uses.
    #[pyo3(get)]
    gpu: usize,
}

/// One call's buffers and stream, as views of the caller's.
struct Call {
    send: DeviceBuffer,
    recv: DeviceBuffer,
    stream: Stream,
}

impl GpuCommunicator {
    /// Runs `f` on the open communicator with the GIL released.
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        op: &str,
        f: impl FnOnce(&Inner) -> Result<R, GpuCollError> + Send,
    ) -> PyResult<R> {
        py.detach(|| self.with_open(op, f)).map_err(|(kind, message)| error(kind, message))
    }

    /// Runs `f` on the open communicator on this thread, which needs no GIL (the torch
    /// backend's compiled part calls from threads that hold none); a failure comes back as
    /// the exception kind it belongs to and its message.
    pub(crate) fn with_open<R>(
        &self,
        op: &str,
        f: impl FnOnce(&Inner) -> Result<R, GpuCollError>,
    ) -> Result<R, (Kind, String)> {
        // The calls bind the communicator's contexts (a private one with
        // ACCORD_GPU_PRIVATE_CONTEXT); the caller's framework finds its own current again.
        let _restore = CurrentContextGuard::save();
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(inner) = guard.as_ref() else {
            return Err((Kind::Shutdown, format!("{op}: the GPU communicator is closed: create a new one")));
        };
        f(inner).map_err(|e| (gpu_error_kind(&e), format!("{op}: {e}")))
    }

    /// all_reduce of `count` elements at `send` into `recv` (the same address: in place), queued
    /// on `stream` behind the work queued on `after` (see [`marked`]); returns its mark (0
    /// without `after`).
    pub(crate) fn all_reduce_marked(
        &self,
        (send, recv): (u64, u64),
        count: usize,
        dtype: DType,
        reduce: ReduceOp,
        stream: u64,
        after: Option<u64>,
    ) -> Result<u64, (Kind, String)> {
        let bytes = count.saturating_mul(dtype.size_bytes());
        self.with_open("all_reduce", |inner| {
            let c = Self::views(inner, (send, bytes), (recv, bytes), stream, (Collective::AllReduce, bytes))?;
            marked(inner, &c.stream, after, || {
                inner.all_reduce(GpuBufs { send: &c.send, recv: &c.recv }, count, dtype, reduce, &c.stream)
            })
        })
    }

    /// reduce_scatter of `count_per_rank` elements a rank from `send` into `recv`, queued on
    /// `stream` behind `after` (see [`marked`]); returns its mark (0 without `after`).
    pub(crate) fn reduce_scatter_marked(
        &self,
        (send, recv): (u64, u64),
        count_per_rank: usize,
        dtype: DType,
        reduce: ReduceOp,
        stream: u64,
        after: Option<u64>,
    ) -> Result<u64, (Kind, String)> {
        let block = count_per_rank.saturating_mul(dtype.size_bytes());
        let n = self.world_size;
        self.with_open("reduce_scatter", |inner| {
            let c = Self::views(
                inner,
                (send, block.saturating_mul(n)),
                (recv, block),
                stream,
                (Collective::ReduceScatter, block),
            )?;
            marked(inner, &c.stream, after, || {
                inner.reduce_scatter(GpuBufs { send: &c.send, recv: &c.recv }, count_per_rank, dtype, reduce, &c.stream)
            })
        })
    }

    /// all_gather of `bytes_per_rank` from `send` into every rank's `recv` at `rank *
    /// bytes_per_rank`, queued on `stream` behind `after` (see [`marked`]); returns its mark.
    pub(crate) fn all_gather_marked(
        &self,
        (send, recv): (u64, u64),
        bytes_per_rank: usize,
        stream: u64,
        after: Option<u64>,
    ) -> Result<u64, (Kind, String)> {
        let n = self.world_size;
        self.with_open("all_gather", |inner| {
            let recv_len = bytes_per_rank.saturating_mul(n);
            let c = Self::views(inner, (send, bytes_per_rank), (recv, recv_len), stream, (Collective::AllGather, 0))?;
            marked(inner, &c.stream, after, || {
                inner.all_gather(GpuBufs { send: &c.send, recv: &c.recv }, bytes_per_rank, &c.stream)
            })
        })
    }

    /// Makes `stream` wait until the op of mark `ticket` is done (see `wait_mark`).
    pub(crate) fn wait_mark_on(&self, stream: u64, ticket: u64) -> Result<(), (Kind, String)> {
        self.with_open("wait_mark", |inner| {
            let stream = Stream::borrow_raw(inner.callers_gpu(), stream)?;
            inner.marks()?.wait(&stream, ticket)
        })
    }

    /// Whether the op of mark `ticket` is done on the GPU.
    pub(crate) fn reached(&self, ticket: u64) -> Result<bool, (Kind, String)> {
        self.with_open("mark_reached", |inner| Ok(inner.marks()?.reached(ticket)))
    }

    /// The first error a collective hit, if any.
    pub(crate) fn first_error(&self) -> Result<(), (Kind, String)> {
        self.with_open("check", |inner| inner.check())
    }

    /// Views of `send` and `recv` (address, bytes) and of `stream`, checked against the driver;
    /// `recv` is registered by address unless the call (`collective`, pushing `pushed` bytes to
    /// each peer) goes direct, which needs no registration.
    fn views(
        inner: &Inner,
        (send, send_len): (u64, usize),
        (recv, recv_len): (u64, usize),
        stream: u64,
        (collective, pushed): (Collective, usize),
    ) -> Result<Call, GpuCollError> {
        let gpu = inner.gpu();
        // A view has at least one byte; the callers never pass an empty call.
        let send = DeviceBuffer::borrow_raw(gpu, DevicePtr(send), send_len.max(1))?;
        // The caller's stream lives in the primary context, also when the collectives copy from
        // a private one (ACCORD_GPU_PRIVATE_CONTEXT).
        let stream = Stream::borrow_raw(inner.callers_gpu(), stream)?;
        if !inner.goes_direct(collective, pushed, &stream) {
            inner.register_allocation_of(DevicePtr(recv), recv_len.max(1))?;
        }
        let recv = DeviceBuffer::borrow_raw(gpu, DevicePtr(recv), recv_len.max(1))?;
        Ok(Call { send, recv, stream })
    }
}

/// Runs `queue` (which queues a collective on `stream`); with `after` (a raw stream of the
/// caller's context; 0 is the legacy default stream, PyTorch's default) `stream` first waits for
/// the work queued on `after`, and the collective's mark (at least 1) is returned (see
/// `accord_coll::gpu::marks`); without it, 0.
fn marked(
    inner: &Inner,
    stream: &Stream,
    after: Option<u64>,
    queue: impl FnOnce() -> Result<(), GpuCollError>,
) -> Result<u64, GpuCollError> {
    let Some(after) = after else {
        queue()?;
        return Ok(0);
    };
    let after = Stream::borrow_raw(inner.callers_gpu(), after)?;
    inner.marks()?.join(stream, &after)?;
    queue()?;
    inner.marks()?.mark(stream)
}

/// Whether the Python communicator queues reductions on the caller's stream when
/// `ACCORD_GPU_REDUCE_ON_CALLER` is unset: with the `waitvalue` order (the only one it works
/// with). A 2-GPU DDP step (`scripts/device/ddp_gpu_variants.sh`, 2xH200, two rounds in one
/// call) took 2.73 and 2.58 ms with it against 3.13 and 3.06 ms without (NCCL 2.05 and
/// 2.10 ms): the backward pass's kernels no longer wait behind reductions launched from the
/// progress thread's context. An all_reduce of 1 MiB alone is slower with it (98-175 us
/// against 69-70 us), 64 MiB level (docs/results/2026-11-26-torch-gpu-path.md, stop 40).
fn reduce_on_caller_by_default(order: StreamOrder) -> bool {
    order == StreamOrder::WaitValue
}

#[pymethods]
impl GpuCommunicator {
    /// Joins the communicator of `world_size` ranks on this host through `store` (an object
    /// with `set(key, bytes)` and `get(key, timeout) -> bytes`, as `accord.Communicator`'s
    /// `store=`), under keys starting with `prefix`, on GPU `gpu` (the process's ordinal, as
    /// `torch.device("cuda", gpu)`). Every rank calls it; waits up to `timeout` seconds for the
    /// others. The `ACCORD_GPU_*` knobs configure it.
    ///
    /// `stream_order` (`waitvalue`, `hostfn` or `stall`; default `ACCORD_GPU_STREAM_ORDER`, else
    /// `waitvalue`) is how a call holds the caller's stream: `waitvalue` uses a stream memory
    /// wait, which holds neither an SM nor the driver's callback thread, so collectives on
    /// several streams and the framework's own host functions never wait behind one another.
    ///
    /// With `waitvalue` and `ACCORD_GPU_REDUCE_ON_CALLER` unset, all_reduce and reduce_scatter
    /// queue their reductions on the caller's stream (see [`reduce_on_caller_by_default`]).
    #[new]
    #[pyo3(signature = (rank, world_size, gpu, store, prefix, timeout = 300.0, stream_order = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        rank: usize,
        world_size: usize,
        gpu: usize,
        store: Py<PyAny>,
        prefix: String,
        timeout: f64,
        stream_order: Option<&str>,
    ) -> PyResult<GpuCommunicator> {
        let op = "GpuCommunicator";
        let timeout = seconds(op, timeout)?;
        let from_env = std::env::var("ACCORD_GPU_STREAM_ORDER").ok();
        let order_text = stream_order.map(str::to_string).or(from_env).unwrap_or_else(|| "waitvalue".into());
        let order: StreamOrder =
            order_text.parse().map_err(|e: String| error(Kind::InvalidRequest, format!("{op}: {e}")))?;
        if world_size == 0 || rank >= world_size {
            return Err(error(
                Kind::InvalidRequest,
                format!("{op}: rank {rank} of world size {world_size}: give 0 <= rank < world_size"),
            ));
        }
        let mut config = GpuConfig { stream_order: order, ..GpuConfig::from_env().map_err(|e| gpu_error(op, e))? };
        if std::env::var_os("ACCORD_GPU_REDUCE_ON_CALLER").is_none() {
            config.reduce_on_caller = reduce_on_caller_by_default(order);
        }
        let mut store = PyStore(store);
        let inner = py
            .detach(|| {
                // Joining makes the communicator's context current (a private one with
                // ACCORD_GPU_PRIVATE_CONTEXT): a stream the caller creates next must still land in
                // its own context.
                let _restore = CurrentContextGuard::save();
                Inner::join(&mut store, &prefix, rank, world_size, gpu, timeout, config)
            })
            .map_err(|e| gpu_error(op, e))?;
        Ok(GpuCommunicator { inner: Mutex::new(Some(inner)), rank, world_size, gpu })
    }

    /// all_reduce of `count` elements at `send` into `recv` (the same address: in place),
    /// queued on `stream`. With `after` (a stream of the caller's context), `stream` first waits
    /// for the work queued on `after`, and the call returns its mark (see `wait_mark`); else 0.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (send, recv, count, dtype, op, stream, after = None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: &str,
        op: &str,
        stream: u64,
        after: Option<u64>,
    ) -> PyResult<u64> {
        let name = "all_reduce";
        let (dtype, reduce) = (parse_dtype(name, dtype)?, parse_op(name, op)?);
        py.detach(|| self.all_reduce_marked((send, recv), count, dtype, reduce, stream, after))
            .map_err(|(kind, message)| error(kind, message))
    }

    /// reduce_scatter: block `j` (of `count_per_rank` elements) of every rank's `send`, reduced
    /// into rank `j`'s `recv`, queued on `stream` (`after`: as `all_reduce`).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (send, recv, count_per_rank, dtype, op, stream, after = None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count_per_rank: usize,
        dtype: &str,
        op: &str,
        stream: u64,
        after: Option<u64>,
    ) -> PyResult<u64> {
        let name = "reduce_scatter";
        let (dtype, reduce) = (parse_dtype(name, dtype)?, parse_op(name, op)?);
        py.detach(|| self.reduce_scatter_marked((send, recv), count_per_rank, dtype, reduce, stream, after))
            .map_err(|(kind, message)| error(kind, message))
    }

    /// all_gather: `bytes_per_rank` at `send` into every rank's `recv` at `rank * bytes_per_rank`
    /// (`after`: as `all_reduce`).
    #[pyo3(signature = (send, recv, bytes_per_rank, stream, after = None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        bytes_per_rank: usize,
        stream: u64,
        after: Option<u64>,
    ) -> PyResult<u64> {
        py.detach(|| self.all_gather_marked((send, recv), bytes_per_rank, stream, after))
            .map_err(|(kind, message)| error(kind, message))
    }

    /// all_to_all: block `j` (of `bytes_per_rank`) of `send` into rank `j`'s `recv` at block
    /// `rank` (`after`: as `all_reduce`).
    #[pyo3(signature = (send, recv, bytes_per_rank, stream, after = None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        bytes_per_rank: usize,
        stream: u64,
        after: Option<u64>,
    ) -> PyResult<u64> {
        let total = bytes_per_rank.saturating_mul(self.world_size);
        self.with(py, "all_to_all", |inner| {
            let c = Self::views(inner, (send, total), (recv, total), stream, (Collective::AllToAll, 0))?;
            marked(inner, &c.stream, after, || {
                inner.all_to_all(GpuBufs { send: &c.send, recv: &c.recv }, bytes_per_rank, &c.stream)
            })
        })
    }

    /// broadcast: `bytes` of `root`'s `send` into every rank's `recv` (pass the same address
    /// twice for torch's in-place broadcast; `after`: as `all_reduce`).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (send, recv, bytes, root, stream, after = None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        bytes: usize,
        root: usize,
        stream: u64,
        after: Option<u64>,
    ) -> PyResult<u64> {
        self.with(py, "broadcast", |inner| {
            let c = Self::views(inner, (send, bytes), (recv, bytes), stream, (Collective::Broadcast, 0))?;
            marked(inner, &c.stream, after, || {
                inner.broadcast(GpuBufs { send: &c.send, recv: &c.recv }, bytes, root, &c.stream)
            })
        })
    }

    /// Queues a mark on `stream` after the work queued there so far and returns it (for work
    /// queued on that stream without one).
    fn mark(&self, py: Python<'_>, stream: u64) -> PyResult<u64> {
        self.with(py, "mark", |inner| {
            let stream = Stream::borrow_raw(inner.callers_gpu(), stream)?;
            inner.marks()?.mark(&stream)
        })
    }

    /// Makes `stream` (of the caller's context) wait until the op that returned mark `ticket`
    /// is done: a stream memory wait, no event.
    fn wait_mark(&self, py: Python<'_>, stream: u64, ticket: u64) -> PyResult<()> {
        py.detach(|| self.wait_mark_on(stream, ticket)).map_err(|(kind, message)| error(kind, message))
    }

    /// Whether the op that returned mark `ticket` is done on the GPU.
    fn mark_reached(&self, py: Python<'_>, ticket: u64) -> PyResult<bool> {
        py.detach(|| self.reached(ticket)).map_err(|(kind, message)| error(kind, message))
    }

    /// Raises the first error a collective hit, if any.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.first_error()).map_err(|(kind, message)| error(kind, message))
    }

    /// The address of this object's Rust state, for `accord.torch`'s compiled backend, which
    /// calls the functions of `accord._accord._torch_native_api()` on it without the GIL. The
    /// caller keeps this object alive for as long as it uses the address.
    fn _native_handle(&self) -> usize {
        self as *const Self as usize
    }

    /// Waits until every queued collective released its stream, then raises the first error.
    fn wait_idle(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = seconds("wait_idle", timeout)?;
        self.with(py, "wait_idle", |inner| inner.wait_idle(timeout))
    }

    /// `(submitted, completed)`: collectives queued so far, and how many released their stream.
    fn progress(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        self.with(py, "progress", |inner| Ok(inner.progress()))
    }

    /// Whether all_reduce and reduce_scatter reductions run on the caller's stream
    /// (`ACCORD_GPU_REDUCE_ON_CALLER=1` and its kernels built in the caller's context).
    fn reduces_on_caller(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, "reduces_on_caller", |inner| Ok(inner.reduces_on_caller()))
    }

    /// The largest all_reduce, in bytes, queued whole on the caller's stream with no host thread
    /// in its path (`ACCORD_GPU_DIRECT_BYTES`); 0 where direct calls are off.
    fn direct_bytes_max(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, "direct_bytes_max", |inner| Ok(inner.direct_bytes_max()))
    }

    /// Registered allocations (the scratch buffer included).
    fn registration_count(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, "registration_count", |inner| Ok(inner.registration_count()))
    }

    /// SMs a collective occupies (`collective`: `all_reduce`, `all_gather`, ...; `bytes` in
    /// nccl-tests' meaning): 0 for pure copies, the reduction grid for reductions.
    fn sms_used(&self, py: Python<'_>, collective: &str, bytes: usize, dtype: &str) -> PyResult<u32> {
        let name = "sms_used";
        let which = Collective::ALL.into_iter().find(|c| c.name() == collective).ok_or_else(|| {
            let known: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
            error(Kind::InvalidRequest, format!("{name}: unknown collective {collective:?}: use one of {known:?}"))
        })?;
        let dtype = parse_dtype(name, dtype)?;
        self.with(py, name, |inner| Ok(inner.sms_used(which, bytes, dtype)))
    }

    /// Waits (up to `timeout` seconds) for queued collectives, then stops the progress thread
    /// and leaves the board. Idempotent.
    #[pyo3(signature = (timeout = 60.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = seconds("close", timeout)?;
        let taken = py.detach(|| self.inner.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(inner) = taken {
            let _restore = CurrentContextGuard::save();
            let waited = py.detach(|| inner.wait_idle(timeout));
            py.detach(move || drop(inner));
            waited.map_err(|e| gpu_error("close", e))?;
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("GpuCommunicator(rank={}, world_size={}, gpu={})", self.rank, self.world_size, self.gpu)
    }
}

/// Takes a duplicate of process `pid`'s descriptor `fd` and closes it again: whether this
/// process may take the descriptors a peer shares its VMM memory with (`pidfd_getfd`, which
/// needs ptrace permission over the peer). `accord.torch` asks before it chooses the GPU
/// collectives, so a host that forbids it (Yama's ptrace scope 1, Ubuntu's default, between
/// sibling ranks) stages CUDA tensors instead of failing at the first op. Raises `OSError`
/// naming the peer and the likely cause.
#[pyfunction]
pub(crate) fn _take_fd_of(py: Python<'_>, pid: u32, fd: i32) -> PyResult<()> {
    py.detach(|| accord_cuda::ipc::vmm::take_fd_of(pid, fd))
        .map(drop)
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))
}
