//! `accord.Engine`: construction, peers, registration, transfers, sends, immediates, close.

use crate::core::Core;
use crate::errors::{barrier_error, build_error, error, submit_error, Kind};
use crate::recv::python_handler;
use crate::region::{acquire, MemoryRegion, RegionInner};
use crate::transfer::{ImmCounter, Transfer};
use crate::values::{deadline, peer_id, wait_in_slices, Address, Descriptor, ScatterDst};
use accord_engine::{EngineAddress, PagedReadOp, ReadOp, StridedPagedWriteOp, SubmitError, WriteOp};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyTuple};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// The Accord TransferEngine: registered memory, one-sided writes with immediates, two-sided
/// sends and barriers, over worker threads that run without the GIL.
///
/// Every keyword argument overrides one engine setting (None keeps the default); `ACCORD_*`
/// environment variables override them in turn unless `ignore_env=True`. Use it as a context
/// manager or call `close()`; an engine left open is closed at interpreter exit.
#[pyclass(module = "accord", frozen)]
pub struct Engine {
    pub(crate) core: Arc<Core>,
}

fn region_closed(op: &str) -> PyErr {
    error(Kind::InvalidBuffer, format!("{op}: the source region is closed: register the buffer again"))
}

fn check_own(core: &Arc<Core>, region: &MemoryRegion, op: &str, role: &str) -> PyResult<()> {
    if region.inner.belongs_to(core) {
        Ok(())
    } else {
        Err(error(
            Kind::InvalidBuffer,
            format!("{op}: the {role} region was registered with another engine: register it with this one"),
        ))
    }
}

/// The bytes `op` moves: `nbytes` when given, else the rest of the local `role` region from
/// `offset` (its parameter `offset_name`), which must not lie past the region's end.
fn len_or_rest(
    nbytes: Option<u64>,
    region: &MemoryRegion,
    offset: u64,
    op: &str,
    offset_name: &str,
    role: &str,
) -> PyResult<u64> {
    let region_len = region.inner.handle.len();
    match nbytes {
        Some(n) => Ok(n),
        None => region_len.checked_sub(offset).ok_or_else(|| {
            error(
                Kind::InvalidBuffer,
                format!("{op}: {offset_name} {offset} is past the end of the {region_len}-byte {role}"),
            )
        }),
    }
}

/// Page indices from a sequence of ints or an integer numpy array.
fn page_indices(pages: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    if let Ok(dtype) = pages.getattr("dtype") {
        let kind: String = dtype.getattr("kind")?.extract()?;
        if kind != "i" && kind != "u" {
            return Err(error(
                Kind::InvalidRequest,
                format!("{what} must be integers, got an array of dtype {}: pass e.g. numpy.int64", dtype.str()?),
            ));
        }
        return array_page_indices(pages, kind == "u", what);
    }
    let list = if pages.hasattr("tolist")? { pages.call_method0("tolist")? } else { pages.clone() };
    let signed: Vec<i64> = list.extract().map_err(|_| {
        error(Kind::InvalidRequest, format!("{what} must be a sequence of non-negative integers (page indices)"))
    })?;
    signed.into_iter().map(|p| non_negative(p, what)).collect()
}

/// The page indices of a one-dimensional integer array, read as one copy of its bytes in
/// little-endian 64-bit form. Why: through a Python int per page (`tolist`), reading and
/// checking two arrays of 327,680 pages (a 2,048-block KV push) took 45 ms on the 2-core machine,
/// 13-17 ms this way; on 2xH200 the push went from 51-52 to 47.7-47.9 ms
/// (docs/results/2026-11-26-kv-gpu.md).
fn array_page_indices(pages: &Bound<'_, PyAny>, unsigned: bool, what: &str) -> PyResult<Vec<u64>> {
    let ndim: usize = pages.getattr("ndim")?.extract()?;
    if ndim != 1 {
        return Err(error(
            Kind::InvalidRequest,
            format!("{what} must be one-dimensional (one page index each), got an array of {ndim} dimensions"),
        ));
    }
    let py = pages.py();
    let wide = py.import("numpy")?.call_method1("ascontiguousarray", (pages, if unsigned { "<u8" } else { "<i8" }))?;
    let bytes = wide.call_method0("tobytes")?;
    let words = bytes.cast::<PyBytes>()?.as_bytes().chunks_exact(8).map(|w| <[u8; 8]>::try_from(w).expect("8 bytes"));
    let pages: Vec<u64> = words.map(u64::from_le_bytes).collect();
    // Signed arrays: the words read as u64 (an exact-size collect), then one pass for a negative
    // index (above i64::MAX as u64). Why not a checked collect into `PyResult<Vec<u64>>`: that
    // one grows its vector as it goes; reading the page arrays of a 2,048-block push's 41 writes
    // (int64) took 2.5-2.8 ms that way, 0.76-0.92 this way, on the 2-core machine
    // (`python3 scripts/kv_push_host_cost.py`, row "binding (41 writes)").
    if !unsigned {
        if let Some(&negative) = pages.iter().find(|&&p| p > i64::MAX as u64) {
            non_negative(negative as i64, what)?;
        }
    }
    Ok(pages)
}

fn non_negative(page: i64, what: &str) -> PyResult<u64> {
    u64::try_from(page).map_err(|_| error(Kind::InvalidRequest, format!("{what} holds the negative page index {page}")))
}

fn transfer_of(op: &str, submitted: Option<Result<accord_engine::Transfer, SubmitError>>) -> PyResult<Transfer> {
    match submitted {
        None => Err(region_closed(op)),
        Some(Err(e)) => Err(submit_error(op, e)),
        Some(Ok(inner)) => Ok(Transfer { inner }),
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (
        *, nics = None, workers_per_nic = None, paths = None, congestion_control = None,
        force_network = None, idle_timeout = None, shard_bytes_min = None, ignore_env = false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        nics: Option<Vec<String>>,
        workers_per_nic: Option<usize>,
        paths: Option<u16>,
        congestion_control: Option<String>,
        force_network: Option<bool>,
        idle_timeout: Option<f64>,
        shard_bytes_min: Option<u64>,
        ignore_env: bool,
    ) -> PyResult<Self> {
        let mut builder = accord_engine::Engine::builder();
        if let Some(nics) = nics {
            let ips = nics
                .iter()
                .map(|n| {
                    n.parse::<IpAddr>().map_err(|_| {
                        error(Kind::Config, format!("NIC address {n:?} is not an IP address: give e.g. \"127.0.0.1\""))
                    })
                })
                .collect::<PyResult<Vec<_>>>()?;
            builder = builder.nics(ips);
        }
        if let Some(count) = workers_per_nic {
            builder = builder.workers_per_nic(count);
        }
        if let Some(count) = paths {
            builder = builder.paths(count);
        }
        if let Some(name) = congestion_control {
            let cc = name.parse().map_err(|e: accord_engine::UnknownCcError| error(Kind::Config, e.to_string()))?;
            builder = builder.congestion_control(cc);
        }
        if let Some(force) = force_network {
            builder = builder.force_network(force);
        }
        if let Some(seconds) = idle_timeout {
            if !(seconds.is_finite() && seconds > 0.0) {
                return Err(error(Kind::Config, format!("idle_timeout {seconds} is not valid: give seconds > 0")));
            }
            builder = builder.idle_timeout(Duration::from_secs_f64(seconds));
        }
        if let Some(bytes) = shard_bytes_min {
            builder = builder.shard_bytes_min(bytes);
        }
        if ignore_env {
            builder = builder.ignore_env();
        }
        let engine = py.detach(|| builder.build()).map_err(build_error)?;
        Ok(Engine { core: Core::new(engine) })
    }

    /// What peers need to reach this engine (picklable; `str()` gives JSON).
    #[getter]
    fn address(&self) -> Address {
        Address { inner: self.core.address.clone() }
    }

    /// This engine's identity (`address.id`).
    #[getter]
    fn id(&self) -> u64 {
        self.core.address.id.0
    }

    /// Whether `close()` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.core.is_closed()
    }

    /// Introduces a peer (its `Address`, or the string `str(address)` gave) so transfers to it
    /// can start; connections open lazily on first use.
    fn add_peer(&self, address: &Bound<'_, PyAny>) -> PyResult<()> {
        let parsed: EngineAddress = match address.cast::<Address>() {
            Ok(a) => a.get().inner.clone(),
            Err(_) => {
                let text: String = address.extract().map_err(|_| {
                    error(Kind::InvalidRequest, "add_peer takes an accord.Address or the string str(address) gave")
                })?;
                EngineAddress::parse(&text).map_err(crate::errors::parse_error)?
            }
        };
        self.core.engine("add_peer")?.add_peer(&parsed).map_err(|e| submit_error("add_peer", e))
    }

    /// Registers `obj`'s memory for transfers: a writable, C-contiguous buffer (numpy array,
    /// bytearray, memoryview, ...) or a DLPack host tensor (e.g. a torch CPU tensor). The region
    /// keeps `obj` alive until closed. A DLPack CUDA tensor (a torch CUDA tensor) registers as
    /// device memory. Raises `accord.InvalidBufferError` for read-only, non-contiguous, empty,
    /// object-dtype, CUDA managed or ROCm memory.
    fn register(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<MemoryRegion> {
        let engine = self.core.engine("register")?;
        let acquired = acquire(obj)?;
        let core = &self.core;
        let inner = py.detach(|| RegionInner::register(core, &engine, acquired))?;
        Ok(MemoryRegion { inner })
    }

    /// Registers every object of `objs` (as `register` does each), or none: all are checked
    /// before any is registered, in one step of the engine. Returns the regions in order.
    fn register_many(&self, py: Python<'_>, objs: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<MemoryRegion>> {
        let engine = self.core.engine("register_many")?;
        let acquired = objs.iter().map(acquire).collect::<PyResult<Vec<_>>>()?;
        let core = &self.core;
        let inners = py.detach(|| RegionInner::register_many(core, &engine, acquired))?;
        Ok(inners.into_iter().map(|inner| MemoryRegion { inner }).collect())
    }

    /// Allocates a zeroed `bytearray` of `nbytes` and registers it (`region.obj` is the array).
    fn alloc(&self, py: Python<'_>, nbytes: usize) -> PyResult<MemoryRegion> {
        if nbytes == 0 || nbytes as u64 > accord_engine::REGION_BYTES_MAX {
            return Err(error(
                Kind::InvalidBuffer,
                format!("alloc({nbytes}): a region holds 1..={} bytes", accord_engine::REGION_BYTES_MAX),
            ));
        }
        let array = match py.import("builtins")?.getattr("bytearray")?.call1((nbytes,)) {
            Ok(array) => array,
            // Python's own MemoryError says nothing: say what could not be had.
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) => {
                return Err(pyo3::exceptions::PyMemoryError::new_err(format!(
                    "alloc({nbytes}): could not allocate {nbytes} bytes: free memory or ask for less"
                )))
            }
            Err(e) => return Err(e),
        };
        self.register(py, &array)
    }

    /// A one-sided write of `nbytes` (default: the rest of `src` from `src_offset`) from local
    /// region `src` at `src_offset` into the peer region `dst` at `dst_offset`. With `imm`, the
    /// peer's counter for it moves once every byte landed. Bounds are checked before anything
    /// is sent.
    #[pyo3(signature = (src, dst, nbytes = None, *, src_offset = 0, dst_offset = 0, imm = None))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        src: PyRef<'_, MemoryRegion>,
        dst: PyRef<'_, Descriptor>,
        nbytes: Option<u64>,
        src_offset: u64,
        dst_offset: u64,
        imm: Option<u32>,
    ) -> PyResult<Transfer> {
        check_own(&self.core, &src, "write", "source")?;
        let len = len_or_rest(nbytes, &src, src_offset, "write", "src_offset", "source")?;
        let engine = self.core.engine("write")?;
        let (region, dst) = (&*src.inner, dst.inner);
        let submitted = py.detach(|| {
            region.submit(|handle| engine.write(&WriteOp { src: handle, src_offset, dst: &dst, dst_offset, len, imm }))
        });
        transfer_of("write", submitted)
    }

    /// A paged write (a KV-cache move): page `src_pages[i]` of `src` goes to page
    /// `dst_pages[i]` of `dst`, pages of `page_nbytes` bytes. Pages are sequences of ints or
    /// integer arrays; runs of consecutive pages go as one operation; `imm` is counted once,
    /// after every page landed. With offsets and strides (fabric-lib style), page `i` is read at
    /// `src_offset + src_pages[i] * src_stride` and lands at `dst_offset + dst_pages[i] *
    /// dst_stride`; strides default to `page_nbytes`, and the destination stride may not be
    /// smaller than the page. Every page is checked before anything is sent.
    #[pyo3(signature = (
        src, dst, *, page_nbytes, src_pages, dst_pages, imm = None,
        src_offset = 0, src_stride = None, dst_offset = 0, dst_stride = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn write_paged(
        &self,
        py: Python<'_>,
        src: PyRef<'_, MemoryRegion>,
        dst: PyRef<'_, Descriptor>,
        page_nbytes: u64,
        src_pages: &Bound<'_, PyAny>,
        dst_pages: &Bound<'_, PyAny>,
        imm: Option<u32>,
        src_offset: u64,
        src_stride: Option<u64>,
        dst_offset: u64,
        dst_stride: Option<u64>,
    ) -> PyResult<Transfer> {
        check_own(&self.core, &src, "write_paged", "source")?;
        let src_pages = page_indices(src_pages, "src_pages")?;
        let dst_pages = page_indices(dst_pages, "dst_pages")?;
        let engine = self.core.engine("write_paged")?;
        let (region, dst) = (&*src.inner, dst.inner);
        let submitted = py.detach(|| {
            region.submit(|handle| {
                engine.write_paged_strided(&StridedPagedWriteOp {
                    src: handle,
                    src_offset,
                    src_stride: src_stride.unwrap_or(page_nbytes),
                    dst: &dst,
                    dst_offset,
                    dst_stride: dst_stride.unwrap_or(page_nbytes),
                    page_bytes: page_nbytes,
                    src_pages: &src_pages,
                    dst_pages: &dst_pages,
                    imm,
                })
            })
        });
        transfer_of("write_paged", submitted)
    }

    /// A one-sided read (a pull): `nbytes` (default: the rest of `dst` from `dst_offset`) of
    /// the peer region `src` at `src_offset` land in the local region `dst` at `dst_offset`.
    /// The owner checks the region's key and bounds as for a write; with `imm`, this engine's
    /// counter for it moves once every byte landed. Host or CUDA device memory on either side
    /// (the owner's write back takes a device route: a copy-engine copy in this process, staged
    /// or landed through pinned slots across processes). The
    /// owner must have added this engine as a peer; a read it does not answer in time fails
    /// with `accord.PeerError` naming it.
    #[pyo3(signature = (dst, src, nbytes = None, *, dst_offset = 0, src_offset = 0, imm = None))]
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        py: Python<'_>,
        dst: PyRef<'_, MemoryRegion>,
        src: PyRef<'_, Descriptor>,
        nbytes: Option<u64>,
        dst_offset: u64,
        src_offset: u64,
        imm: Option<u32>,
    ) -> PyResult<Transfer> {
        check_own(&self.core, &dst, "read", "destination")?;
        let len = len_or_rest(nbytes, &dst, dst_offset, "read", "dst_offset", "destination")?;
        let engine = self.core.engine("read")?;
        let (region, src) = (&*dst.inner, src.inner);
        let submitted = py.detach(|| {
            region.submit(|handle| engine.read(&ReadOp { dst: handle, dst_offset, src: &src, src_offset, len, imm }))
        });
        transfer_of("read", submitted)
    }

    /// A batched one-sided read: many pages of the peer region `src` in ONE request, which the
    /// owner checks (key, bounds: every page before anything moves) and writes back as one
    /// paged write. For every plane `p` in `0..planes` and every `i`, `page_nbytes` at
    /// `src_offset + p * src_plane_stride + src_pages[i] * src_stride` of `src` land at
    /// `dst_offset + p * dst_plane_stride + dst_pages[i] * dst_stride` of `dst`; strides default
    /// to `page_nbytes` (the destination stride may not be smaller). A KV cache of shape
    /// `(layers, 2, blocks, ...)` reads some blocks of every layer's K and V with
    /// `planes=layers * 2` and plane strides of a whole plane of blocks. Page ids are below
    /// 2^32; more than `READ_PIECES_PER_REQUEST_MAX` (65,536) pages x planes go as several
    /// requests. With `imm`, this engine's counter for it moves once, after every page landed.
    /// Host or CUDA device memory on either side, as `read`.
    #[pyo3(signature = (
        dst, src, *, page_nbytes, src_pages, dst_pages, imm = None, src_offset = 0, src_stride = None,
        dst_offset = 0, dst_stride = None, planes = 1, src_plane_stride = 0, dst_plane_stride = 0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn read_paged(
        &self,
        py: Python<'_>,
        dst: PyRef<'_, MemoryRegion>,
        src: PyRef<'_, Descriptor>,
        page_nbytes: u64,
        src_pages: &Bound<'_, PyAny>,
        dst_pages: &Bound<'_, PyAny>,
        imm: Option<u32>,
        src_offset: u64,
        src_stride: Option<u64>,
        dst_offset: u64,
        dst_stride: Option<u64>,
        planes: u64,
        src_plane_stride: u64,
        dst_plane_stride: u64,
    ) -> PyResult<Transfer> {
        check_own(&self.core, &dst, "read_paged", "destination")?;
        let src_pages = page_indices(src_pages, "src_pages")?;
        let dst_pages = page_indices(dst_pages, "dst_pages")?;
        let engine = self.core.engine("read_paged")?;
        let (region, src) = (&*dst.inner, src.inner);
        let submitted = py.detach(|| {
            region.submit(|handle| {
                engine.read_paged(&PagedReadOp {
                    dst: handle,
                    dst_offset,
                    dst_stride: dst_stride.unwrap_or(page_nbytes),
                    src: &src,
                    src_offset,
                    src_stride: src_stride.unwrap_or(page_nbytes),
                    page_bytes: page_nbytes,
                    src_pages: &src_pages,
                    dst_pages: &dst_pages,
                    planes,
                    src_plane_stride,
                    dst_plane_stride,
                    imm,
                })
            })
        });
        transfer_of("read_paged", submitted)
    }

    /// Writes ranges of `src` to several peer regions (`accord.ScatterDst` each), every write
    /// carrying `imm`; completes when all did.
    #[pyo3(signature = (src, dsts, *, imm = None))]
    fn scatter(
        &self,
        py: Python<'_>,
        src: PyRef<'_, MemoryRegion>,
        dsts: Vec<ScatterDst>,
        imm: Option<u32>,
    ) -> PyResult<Transfer> {
        check_own(&self.core, &src, "scatter", "source")?;
        let dsts: Vec<accord_engine::ScatterDst> = dsts
            .into_iter()
            .map(|d| accord_engine::ScatterDst {
                dst: d.dst,
                dst_offset: d.dst_offset,
                src_offset: d.src_offset,
                len: d.nbytes,
            })
            .collect();
        let engine = self.core.engine("scatter")?;
        let region = &*src.inner;
        let submitted = py.detach(|| region.submit(|handle| engine.scatter(handle, &dsts, imm)));
        transfer_of("scatter", submitted)
    }

    /// A two-sided send of `data` (bytes-like, copied at once) into one of the peer's posted
    /// receive buffers (`post_recvs`); the transfer fails with `accord.RemoteAccessError` when
    /// the peer has none free or the message is larger than its buffers.
    #[pyo3(signature = (peer, data, *, imm = None))]
    fn send(
        &self,
        py: Python<'_>,
        peer: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        imm: Option<u32>,
    ) -> PyResult<Transfer> {
        let peer = peer_id(peer)?;
        if data.is_instance_of::<PyInt>() {
            return Err(error(Kind::InvalidRequest, "send: data must be bytes-like, not an int"));
        }
        let bytes = match data.cast::<PyBytes>() {
            Ok(b) => b.clone(),
            Err(_) => py.get_type::<PyBytes>().call1((data,))?.cast_into::<PyBytes>()?,
        };
        let payload = bytes.as_bytes();
        let engine = self.core.engine("send")?;
        let submitted = py.detach(|| engine.send(peer, payload, imm));
        submitted.map(|inner| Transfer { inner }).map_err(|e| submit_error("send", e))
    }

    /// Posts `count` receive buffers of `nbytes` each for peers' sends; returns how many were
    /// posted. With `handler`, each message calls `handler(data: bytes, imm: int | None)` on
    /// the engine's completion thread; without, messages queue for `recv()`. Each call sets
    /// the handler for all buffers.
    #[pyo3(signature = (nbytes, count, handler = None))]
    fn post_recvs(&self, nbytes: usize, count: usize, handler: Option<Py<PyAny>>) -> PyResult<usize> {
        if nbytes == 0 || count == 0 {
            return Err(error(Kind::InvalidRequest, "post_recvs: nbytes and count must be at least 1"));
        }
        let engine = self.core.engine("post_recvs")?;
        Ok(match handler {
            Some(h) => engine.post_recvs(nbytes, count, python_handler(h)),
            None => {
                let queue = self.core.recv.clone();
                engine.post_recvs(nbytes, count, move |m| queue.push(m))
            }
        })
    }

    /// The next message of a peer's send as `(data, imm)` (needs `post_recvs` without a
    /// handler); blocks with the GIL released at most `timeout` seconds (None: no limit).
    /// Raises `accord.ShutdownError` once the engine is closed (at once if it was).
    #[pyo3(signature = (timeout = None))]
    fn recv<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyTuple>> {
        drop(self.core.engine("recv")?); // ShutdownError at once on a closed engine
        let queue = self.core.recv.clone();
        let got = wait_in_slices(py, deadline(timeout)?, |slice| match queue.pop(slice) {
            Ok(None) => None,
            other => Some(other),
        })?;
        match got {
            Some(Ok(Some((data, imm)))) => {
                PyTuple::new(py, [PyBytes::new(py, &data).into_any(), imm.into_pyobject(py)?.into_any()])
            }
            Some(Err(crate::recv::PopError::Closed)) => Err(crate::errors::closed("recv")),
            Some(Err(crate::recv::PopError::Dropped(dropped))) => Err(error(
                Kind::Accord,
                format!(
                    "{dropped} messages were dropped because {} were queued: call recv() more often or pass a \
                     handler to post_recvs",
                    crate::recv::RECV_QUEUED_MAX
                ),
            )),
            _ => Err(error(
                Kind::Timeout,
                format!(
                    "no message within {:.3} s: check that peers send, and that post_recvs ran",
                    timeout.unwrap_or(0.0)
                ),
            )),
        }
    }

    /// Blocks (GIL released, Ctrl-C interrupts) until every engine of `peers` (Addresses or
    /// ids; this engine may be listed) called `barrier` with the same `imm` as often as this
    /// one. `imm` must be used for nothing else; every peer must have been added.
    #[pyo3(signature = (peers, *, imm, timeout = 30.0))]
    fn barrier(&self, py: Python<'_>, peers: &Bound<'_, PyAny>, imm: u32, timeout: f64) -> PyResult<()> {
        let ids = peers.try_iter()?.map(|p| peer_id(&p?)).collect::<PyResult<Vec<_>>>()?;
        deadline(Some(timeout))?; // validates the number
        let engine = self.core.engine("barrier")?;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // The barrier runs on a helper thread so this thread can wait in slices and notice
        // Ctrl-C; an interrupted barrier's thread ends at its timeout.
        std::thread::Builder::new()
            .name("accord-barrier".into())
            .spawn(move || {
                let result = engine.barrier(&ids, imm, Duration::from_secs_f64(timeout));
                drop(engine); // before answering: the caller may close the engine at once
                let _ = done_tx.send(result);
            })
            .map_err(|e| {
                error(Kind::Accord, format!("barrier: starting its thread: {e}: the process may be out of resources"))
            })?;
        let result = wait_in_slices(py, None, move |slice| match done_rx.recv_timeout(slice) {
            Ok(result) => Some(result),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Some(Err(accord_engine::BarrierError::Transfer(accord_engine::TransferError::ShutDown)))
            }
        })?;
        result.expect("waited without a deadline").map_err(barrier_error)
    }

    /// The counter of writes carrying immediate `imm` that fully landed here.
    fn imm_counter(&self, imm: u32) -> PyResult<ImmCounter> {
        let engine = self.core.engine("imm_counter")?;
        Ok(ImmCounter { inner: engine.imm_counter(imm), imm, core: self.core.clone() })
    }

    /// Forgets the counter of `imm` whatever its value, so the engine's table of counters
    /// (65536 at most) has room for new immediates; returns the value it had, or None when
    /// there was none. Counters already obtained keep showing the final value.
    fn release_imm(&self, imm: u32) -> PyResult<Option<u64>> {
        Ok(self.core.engine("release_imm")?.release_imm(imm))
    }

    /// Writes that landed here but were never counted because the table of counters was full,
    /// as `[(imm, writes lost), ...]` since the last call (their senders saw them complete).
    /// `ImmCounter.wait` raises `accord.AccordError` for the same loss on its immediate.
    fn imm_overflows(&self) -> PyResult<Vec<(u32, u64)>> {
        Ok(self.core.engine("imm_overflows")?.imm_overflows())
    }

    /// Calls `callback(value)` on the completion thread once the counter of `imm` reaches
    /// `count` (absolute; at once if reached). Same as `imm_counter(imm).add_callback`.
    fn expect_imm(&self, imm: u32, count: u64, callback: Py<PyAny>) -> PyResult<()> {
        let counter = self.imm_counter(imm)?;
        counter.add_callback(count, callback)
    }

    /// Run-time counters: retransmits, failovers, datagrams_dropped, imm_overflow, lanes.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let engine = self.core.engine("stats")?;
        let stats = py.detach(|| engine.stats());
        let dict = PyDict::new(py);
        dict.set_item("retransmits", stats.retransmits())?;
        dict.set_item("failovers", stats.failovers())?;
        dict.set_item("datagrams_dropped", stats.datagrams_dropped())?;
        dict.set_item("imm_overflow", stats.imm_overflow)?;
        dict.set_item("lanes", stats.lanes.len())?;
        // READ, both sides: requests sent (reader), served and refused (owner), unanswered
        // (reader), and reads into device memory written through the reader's IPC handle (owner).
        let reads = engine.read_stats();
        dict.set_item("reads_sent", reads.requests_sent)?;
        dict.set_item("reads_served", reads.requests_served)?;
        dict.set_item("reads_refused", reads.refused)?;
        dict.set_item("reads_unanswered", reads.unanswered)?;
        dict.set_item("reads_into_device_mapped", reads.device_destinations_mapped)?;
        // The landing rendezvous (device writes and READs into device memory of another process
        // with IPC off, or of another host): chunks copied into device memory here, asks refused
        // here, and control messages refused or dropped. A KV transfer on that route that makes
        // no progress shows as `landing_chunks_landed` standing still at the receiver.
        let landing = engine.landing_stats();
        dict.set_item("landing_chunks_landed", landing.chunks_landed)?;
        dict.set_item("landing_asks_refused", landing.asks_refused)?;
        dict.set_item("landing_control_refused", landing.control_refused)?;
        dict.set_item("landing_control_dropped", landing.control_dropped)?;
        dict.set_item("landing_slots_reclaimed", landing.slots_reclaimed)?;
        dict.set_item("landing_chunks_inline", landing.chunks_inline)?;
        dict.set_item("landing_inline_duplicates", landing.inline_duplicates)?;
        Ok(dict)
    }

    /// Deregisters every region (no peer write lands afterwards) and stops the engine; pending
    /// transfers fail with `accord.ShutdownError`. Idempotent.
    fn close(&self, py: Python<'_>) {
        let core = &self.core;
        py.detach(|| core.close());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.core.is_closed() { ", closed" } else { "" };
        format!("Engine(id=0x{:016x}{state})", self.core.address.id.0)
    }
}
