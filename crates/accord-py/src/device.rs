//! `accord.device`: the device communicator of `accord-device` for Python. A kernel puts,
//! signals and waits through the table whose address `DeviceComm.table_ptr` gives; Python
//! registers the windows (torch CUDA tensors on a GPU placement, numpy arrays and CPU tensors
//! on the host placement), reads and waits on signals, and (host placement) writes descriptors
//! in the GPU's layout with a `HostProducer`, which is how the CPU tests drive the proxies.
//!
//! The `accord.Communicator` passed in is handed over (`coll::Communicator::hand_over`): the
//! device communicator owns it until it closes, because the two would otherwise interleave
//! their collective exchanges. Host barriers go through `DeviceComm.barrier`.
//!
//! Registered objects are referenced until the device communicator closed (its proxies
//! stopped and every window deregistered): peers' proxies write into them at any time before.
//! Every call that can block (the collective setup and registrations, signal waits, pushes into
//! a full ring, close) runs with the GIL released; signal waits run in slices of `WAIT_SLICE`
//! with a Ctrl-C check between them.

use crate::coll::Communicator;
use crate::errors::coll_error;
use crate::errors::{error, Kind};
use crate::region::{acquire, Acquired};
use crate::values::WAIT_SLICE;
use accord_device::layout::Descriptor;
use accord_device::{DeviceCommConfig, DeviceError, Placement, ProducerError, WaitError};
use accord_engine::MemoryKind;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A device communicator error as the exception of `accord.errors` it belongs to.
fn device_error(op: &str, e: DeviceError) -> PyErr {
    let kind = match &e {
        DeviceError::Config { .. }
        | DeviceError::NoSuch { .. }
        | DeviceError::NotHostPlacement { .. }
        | DeviceError::WindowLengthMismatch { .. } => Kind::InvalidRequest,
        DeviceError::Register { .. } => Kind::InvalidBuffer,
        DeviceError::Exchange { .. } => Kind::Peer,
        DeviceError::Closed => Kind::Shutdown,
        DeviceError::Memory { .. } => Kind::Accord,
    };
    error(kind, format!("{op}: {e}"))
}

/// Seconds given by the caller (0 allowed: a wait that only looks).
fn seconds(op: &str, what: &str, s: f64) -> PyResult<Duration> {
    crate::values::seconds(op, what, s, false)
}

fn closed(op: &str) -> PyErr {
    error(Kind::Shutdown, format!("{op}: the device communicator is closed: create a new accord.device.DeviceComm"))
}

type Inner = accord_device::DeviceComm;

/// Refuses a DLPack CUDA object of another GPU than `gpu` (or any, on the host placement)
/// before its memory is exported: from `__dlpack_device__` alone.
fn check_window_device(op: &str, obj: &Bound<'_, PyAny>, gpu: Option<usize>) -> PyResult<()> {
    if !obj.hasattr("__dlpack_device__")? {
        return Ok(());
    }
    let Ok((device_type, device_id)) = obj.call_method0("__dlpack_device__")?.extract::<(i32, i32)>() else {
        return Ok(()); // `acquire` reports a malformed answer
    };
    if device_type != crate::dlpack::DEVICE_CUDA {
        return Ok(());
    }
    match gpu {
        Some(gpu) if usize::try_from(device_id) == Ok(gpu) => Ok(()),
        Some(gpu) => Err(error(
            Kind::InvalidBuffer,
            format!("{op}: the tensor is on GPU {device_id} but this DeviceComm is on GPU {gpu}: register a tensor of cuda:{gpu}"),
        )),
        None => Err(error(
            Kind::InvalidBuffer,
            format!("{op}: a CUDA tensor (GPU {device_id}) needs a DeviceComm built with gpu={device_id}; this one has host placement"),
        )),
    }
}

/// A device communicator: windows every rank registered, rings kernels write descriptors
/// into, CPU proxy threads that run them through the engine's routes, signals and counters.
#[pyclass(module = "accord.device", name = "DeviceComm")]
pub struct DeviceComm {
    /// Declared before `keep` so that dropping the object stops the proxies and deregisters
    /// the windows before the registered objects are released.
    inner: Mutex<Option<Inner>>,
    /// What holds each registered object's memory alive, until the communicator closed.
    keep: Mutex<Vec<Acquired>>,
    gpu: Option<usize>,
    rank: usize,
    world_size: usize,
}

impl DeviceComm {
    /// Runs `f` on the open communicator with the GIL released (the lock is taken there, so a
    /// thread waiting for it never holds the GIL).
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        op: &str,
        f: impl FnOnce(&mut Inner) -> Result<R, DeviceError> + Send,
    ) -> PyResult<R> {
        let outcome = py.detach(|| {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.as_mut().map(f)
        });
        match outcome {
            None => Err(closed(op)),
            Some(r) => r.map_err(|e| device_error(op, e)),
        }
    }

    /// Stops the proxies, deregisters the windows, then releases the registered objects; with
    /// `barrier`, after a host barrier (whose error is returned). Idempotent.
    fn shut(&self, py: Python<'_>, barrier: bool) -> PyResult<()> {
        let taken = py.detach(|| self.inner.lock().unwrap_or_else(|e| e.into_inner()).take());
        let Some(mut inner) = taken else { return Ok(()) };
        let outcome = py.detach(move || {
            let outcome = if barrier { inner.communicator().barrier() } else { Ok(()) };
            // Always close, even when the barrier failed: the proxies must stop before the
            // windows' memory is released below.
            let _ = inner.close();
            outcome
        });
        self.keep.lock().unwrap_or_else(|e| e.into_inner()).clear();
        outcome.map_err(coll_error)
    }
}

#[pymethods]
impl DeviceComm {
    /// Builds the device communicator on every rank (collective: each rank calls it with the
    /// same arguments). `gpu=None` places everything in host memory (CPU tests, host producers);
    /// an ordinal places it for that GPU (torch CUDA tensors of that GPU as windows).
    /// `lane_stores_aside_bytes`: a stream-lane batch copying at least this much queues its
    /// signal stores on a second stream, so the next copy does not wait for them (0, the
    /// default: never). `descriptors_per_turn`: descriptors a proxy takes before it queues
    /// them (one stream-lane batch per peer a turn; larger turns carry small puts faster).
    #[new]
    #[pyo3(signature = (comm, gpu = None, *, rings = 1, slot_count = accord_device::RING_SLOTS_DEFAULT, user_signals = 64, counters = 64, stream_lane = true, producer_timeout = 30.0, lane_stores_aside_bytes = 0, descriptors_per_turn = accord_device::DESCRIPTORS_PER_TURN_DEFAULT))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        comm: &Bound<'_, Communicator>,
        gpu: Option<usize>,
        rings: usize,
        slot_count: u32,
        user_signals: u32,
        counters: u32,
        stream_lane: bool,
        producer_timeout: f64,
        lane_stores_aside_bytes: u64,
        descriptors_per_turn: usize,
    ) -> PyResult<Self> {
        let op = "DeviceComm";
        let producer_timeout = seconds(op, "producer_timeout", producer_timeout)?;
        let mut config = DeviceCommConfig {
            rings,
            slot_count,
            user_signals,
            counters,
            stream_lane,
            producer_timeout,
            lane_stores_aside_bytes,
            descriptors_per_turn,
            ..DeviceCommConfig::default()
        };
        // Checked before the GPU opens and the communicator is handed over, so that a typo
        // leaves it usable (`DeviceComm::new` checks again).
        config.validate().map_err(|e| device_error(op, e))?;
        config.placement = match gpu {
            None => Placement::Host,
            Some(ordinal) => Placement::Gpu(accord_cuda::Gpu::open(ordinal).map_err(|e| {
                error(Kind::Config, format!("{op}: cannot open GPU {ordinal}: {e} (pass gpu=None for host placement)"))
            })?),
        };
        let rust_comm = comm.borrow().hand_over(py)?;
        let (rank, world_size) = (rust_comm.rank(), rust_comm.world_size());
        let inner = py.detach(move || Inner::new(rust_comm, config)).map_err(|e| device_error(op, e))?;
        Ok(DeviceComm { inner: Mutex::new(Some(inner)), keep: Mutex::default(), gpu, rank, world_size })
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.world_size
    }

    /// The GPU ordinal of the placement, or None (host placement).
    #[getter]
    fn gpu(&self) -> Option<usize> {
        self.gpu
    }

    /// Whether `close` ran.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.inner.lock().unwrap_or_else(|e| e.into_inner()).is_none())
    }

    /// Signals kernels may use: ids `0 .. user_signals - 1` (the last signal is the barrier's).
    #[getter]
    fn user_signals(&self, py: Python<'_>) -> PyResult<u32> {
        self.with(py, "user_signals", |dc| Ok(dc.barrier_signal()))
    }

    /// Windows registered so far.
    #[getter]
    fn window_count(&self, py: Python<'_>) -> PyResult<u32> {
        self.with(py, "window_count", |dc| Ok(dc.window_count()))
    }

    /// Registers `obj`'s memory as the next window (collective: every rank, same order, same
    /// byte length); returns its id. A torch CUDA tensor (DLPack) must be on this
    /// communicator's GPU; host memory (numpy, bytearray, torch CPU tensor) is accepted on
    /// either placement (a kernel cannot dereference it, but puts from and into it work). The
    /// object is referenced until `close`.
    fn register_window(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<u32> {
        let op = "register_window";
        check_window_device(op, obj, self.gpu)?;
        let acquired = acquire(obj)?;
        match (acquired.kind, self.gpu) {
            (MemoryKind::CudaDevice { ordinal }, Some(gpu)) if ordinal as usize != gpu => {
                return Err(error(
                    Kind::InvalidBuffer,
                    format!("{op}: the tensor is on GPU {ordinal} but this DeviceComm is on GPU {gpu}: register a tensor of cuda:{gpu}"),
                ));
            }
            (MemoryKind::CudaDevice { ordinal }, None) => {
                return Err(error(
                    Kind::InvalidBuffer,
                    format!("{op}: a CUDA tensor (GPU {ordinal}) needs a DeviceComm built with gpu={ordinal}; this one has host placement"),
                ));
            }
            _ => {}
        }
        let (ptr, nbytes, kind) = (acquired.ptr, acquired.nbytes, acquired.kind);
        let id = self.with(py, op, move |dc| {
            // Safety: `acquired` (pushed into `self.keep` below, released only after the
            // communicator closed) keeps `ptr..ptr + nbytes` alive; `acquire` checked it
            // writable and contiguous, and no Rust reference to it exists.
            #[allow(unsafe_code)]
            unsafe {
                dc.register_window(ptr as *mut u8, nbytes, kind)
            }
        })?;
        self.keep.lock().unwrap_or_else(|e| e.into_inner()).push(acquired);
        Ok(id)
    }

    /// Allocates a zeroed window of `nbytes` in host memory the communicator owns (collective);
    /// returns its id. Read and write it with `read_window` and `write_window`.
    fn alloc_window(&self, py: Python<'_>, nbytes: usize) -> PyResult<u32> {
        self.with(py, "alloc_window", move |dc| dc.alloc_window(nbytes))
    }

    /// `nbytes` bytes of window `id` (one `alloc_window` made) from `offset`.
    fn read_window<'py>(
        &self,
        py: Python<'py>,
        id: u32,
        offset: usize,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let op = "read_window";
        // Checked before allocating, so a huge `nbytes` is an error, not an abort.
        let (_, len, _) = self.with(py, op, move |dc| dc.window_info(id))?;
        if offset.checked_add(nbytes).is_none_or(|end| end as u64 > len) {
            return Err(error(
                Kind::InvalidRequest,
                format!("{op}: {nbytes} bytes at offset {offset} run past window {id} of {len} bytes"),
            ));
        }
        let mut out = vec![0u8; nbytes];
        self.with(py, op, |dc| dc.read_window(id, offset, &mut out))?;
        Ok(PyBytes::new(py, &out))
    }

    /// Copies `data` into window `id` (one `alloc_window` made) at `offset`.
    fn write_window(&self, py: Python<'_>, id: u32, offset: usize, data: Vec<u8>) -> PyResult<()> {
        self.with(py, "write_window", move |dc| dc.write_window(id, offset, &data))
    }

    /// Window `id` on this rank: (address, bytes, "host" or "cuda:<ordinal>").
    fn window_info(&self, py: Python<'_>, id: u32) -> PyResult<(u64, u64, String)> {
        let (addr, len, kind) = self.with(py, "window_info", move |dc| dc.window_info(id))?;
        let kind = match kind {
            MemoryKind::CudaDevice { ordinal } => format!("cuda:{ordinal}"),
            _ => "host".to_string(),
        };
        Ok((addr, len, kind))
    }

    /// The address of the device table to pass a kernel as its `const DeviceTable*` (device
    /// memory on a GPU placement, host memory on the host placement). Register every window
    /// before reading it: a table is rebuilt when windows were added, and older ones stay valid
    /// until `close`.
    #[getter]
    fn table_ptr(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, "table_ptr", |dc| dc.device_table_ptr())
    }

    /// Signal `id` at this rank: what every rank added since its last reset here.
    fn read_signal(&self, py: Python<'_>, id: u32) -> PyResult<u64> {
        self.with(py, "read_signal", move |dc| dc.read_signal(id))
    }

    /// Resets signal `id` to zero here.
    fn reset_signal(&self, py: Python<'_>, id: u32) -> PyResult<()> {
        self.with(py, "reset_signal", move |dc| dc.reset_signal(id))
    }

    /// Waits until signal `id` is at least `at_least`; returns its value. Raises
    /// `accord.TimeoutError` after `timeout` seconds, naming the signal, the value reached and
    /// the ranks whose contribution did not move during the wait.
    #[pyo3(signature = (id, at_least, timeout = 30.0))]
    fn wait_signal(&self, py: Python<'_>, id: u32, at_least: u64, timeout: f64) -> PyResult<u64> {
        let op = "wait_signal";
        let timeout = seconds(op, "timeout", timeout)?;
        let start = Instant::now();
        let first = self.with(py, op, move |dc| dc.signal_slots(id))?;
        loop {
            let slice = timeout.saturating_sub(start.elapsed()).min(WAIT_SLICE);
            let outcome = py.detach(|| {
                let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                inner.as_ref().map(|dc| dc.wait_signal(id, at_least, slice))
            });
            match outcome {
                None => return Err(closed(op)),
                Some(Ok(value)) => return Ok(value),
                Some(Err(WaitError::Device(e))) => return Err(device_error(op, e)),
                Some(Err(WaitError::SignalTimeout { reached, slots, .. })) => {
                    if start.elapsed() >= timeout {
                        let silent: Vec<usize> = (0..slots.len()).filter(|&r| slots[r] == first[r]).collect();
                        return Err(error(
                            Kind::Timeout,
                            format!(
                                "{op}: signal {id} reached {reached}, not {at_least}, within {:.3} s; ranks whose \
                                 contribution did not move during the wait: {silent:?} (contributions by rank: \
                                 {slots:?})",
                                timeout.as_secs_f64()
                            ),
                        ));
                    }
                    py.check_signals()?;
                }
            }
        }
    }

    /// Counter `id` of this rank (bumped once per put that asked for it, when its source is
    /// reusable).
    fn counter(&self, py: Python<'_>, id: u32) -> PyResult<u64> {
        self.with(py, "counter", move |dc| dc.counter(id))
    }

    /// What the proxies did so far, by name.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(py, "stats", |dc| Ok(dc.stats()))?;
        let d = PyDict::new(py);
        for (k, v) in [
            ("descriptors_executed", s.descriptors_executed),
            ("bytes_put", s.bytes_put),
            ("signal_writes_issued", s.signal_writes_issued),
            ("signal_writes_coalesced", s.signal_writes_coalesced),
            ("descriptor_errors", s.descriptor_errors),
            ("ring_full_events", s.ring_full_events),
            ("lane_batches", s.lane_batches),
            ("lane_driver_ops", s.lane_driver_ops),
            ("lane_items", s.lane_items),
            ("lane_copies", s.lane_copies),
            ("lane_queue_ns", s.lane_queue_ns),
            ("take_ns", s.take_ns),
            ("lane_retire_ns", s.lane_retire_ns),
            ("lane_submit_ns", s.lane_submit_ns),
            ("lane_complete_ns", s.lane_complete_ns),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Every descriptor the proxies refused or that failed so far, one message each naming
    /// the ring, the ticket and the bad field (at most `accord_device::ERRORS_KEPT_MAX`).
    fn errors(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.with(py, "errors", |dc| Ok(dc.errors().iter().map(|e| e.to_string()).collect()))
    }

    /// Ring `ring`'s control words: (consumed, completed, error).
    fn ring_control(&self, py: Python<'_>, ring: usize) -> PyResult<(u64, u64, u64)> {
        self.with(py, "ring_control", move |dc| dc.ring_control(ring))
    }

    /// Waits until ring `ring` completed `tickets` descriptors (refused ones count); returns
    /// the completed count. Raises `accord.TimeoutError` naming the ring after `timeout` s.
    #[pyo3(signature = (ring, tickets, timeout = 30.0))]
    fn wait_completed(&self, py: Python<'_>, ring: usize, tickets: u64, timeout: f64) -> PyResult<u64> {
        let op = "wait_completed";
        let timeout = seconds(op, "timeout", timeout)?;
        // A bad ring id fails here, at once.
        self.with(py, op, move |dc| dc.ring_control(ring))?;
        let start = Instant::now();
        loop {
            let slice = timeout.saturating_sub(start.elapsed()).min(WAIT_SLICE);
            if let Ok(done) = self.with(py, op, move |dc| dc.wait_completed(ring, tickets, slice)) {
                return Ok(done);
            }
            if start.elapsed() >= timeout {
                let (_, done, _) = self.with(py, op, move |dc| dc.ring_control(ring))?;
                return Err(error(
                    Kind::Timeout,
                    format!(
                        "{op}: ring {ring} completed {done} of {tickets} descriptors within {:.3} s",
                        timeout.as_secs_f64()
                    ),
                ));
            }
            py.check_signals()?;
        }
    }

    /// A producer that writes descriptors into ring `ring` exactly as a GPU thread does (host
    /// placement only): what the CPU tests drive the proxies with.
    fn host_producer(slf: &Bound<'_, Self>, ring: usize) -> PyResult<HostProducer> {
        let producer = slf.borrow().with(slf.py(), "host_producer", move |dc| dc.host_producer(ring))?;
        Ok(HostProducer { producer, ring, comm: slf.clone().unbind() })
    }

    /// A host barrier over the communicator this one took over (collective).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let outcome = py.detach(|| {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.as_mut().map(|dc| dc.communicator().barrier())
        });
        match outcome {
            None => Err(closed("barrier")),
            Some(r) => r.map_err(coll_error),
        }
    }

    /// A host barrier, then stops the proxies and deregisters the windows, then releases the
    /// registered objects (collective; idempotent). Call it after every rank's last device
    /// work, and free a window's tensor only after it: a peer's engine write into a closed rank
    /// fails, but a peer on this host copies into the window by address.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.shut(py, true)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving normally closes (with its barrier); leaving on an exception closes without one.
    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let failed = exc.get_item(0).is_ok_and(|t| !t.is_none());
        self.shut(py, !failed).map(|()| false)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let place = self.gpu.map_or("host".to_string(), |g| format!("gpu={g}"));
        let state = if self.closed(py) { "closed" } else { "open" };
        format!("DeviceComm(rank={}, world_size={}, {place}, {state})", self.rank, self.world_size)
    }
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        // Stopping the proxies waits for their drain: without the GIL where there is one.
        let mut inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        let _ = Python::try_attach(|py| py.detach(|| drop(inner.take())));
        drop(inner);
    }
}

/// Writes descriptors into one ring of a host-placed `DeviceComm` with the GPU producers'
/// protocol (take a ticket, fill the 64-byte slot, publish `seq` last).
#[pyclass(module = "accord.device", name = "HostProducer")]
pub struct HostProducer {
    producer: accord_device::HostProducer,
    ring: usize,
    /// Its communicator: a push after `close` raises at once instead of waiting on a ring
    /// no proxy drains any more.
    comm: Py<DeviceComm>,
}

#[pymethods]
impl HostProducer {
    /// The ring it writes into.
    #[getter]
    fn ring(&self) -> usize {
        self.ring
    }

    /// Publishes one descriptor with these raw field values (`op`: 1 put, 2 put_value, 3
    /// signal; `signal_op`: 0 none, 1 add, 2 set; `flags`: 1 bumps `counter_id`), unchecked
    /// here: the proxy checks them, as it does a GPU's. Returns its ticket. Blocks while the
    /// ring is full, at most the communicator's `producer_timeout` (then `accord.TimeoutError`;
    /// the ring is wedged from that ticket on). After the communicator closed: `ShutdownError`.
    #[pyo3(signature = (*, op, peer, window = 0, dst_offset = 0, src_window = 0, src_offset = 0, bytes = 0, signal_op = 0, signal_id = 0, signal_value = 0, flags = 0, counter_id = 0))]
    #[allow(clippy::too_many_arguments)]
    fn push(
        &self,
        py: Python<'_>,
        op: u8,
        peer: u32,
        window: u32,
        dst_offset: u64,
        src_window: u32,
        src_offset: u64,
        bytes: u64,
        signal_op: u8,
        signal_id: u32,
        signal_value: u64,
        flags: u16,
        counter_id: u32,
    ) -> PyResult<u64> {
        let desc = Descriptor {
            seq: 0,
            op,
            signal_op,
            flags,
            peer,
            window,
            src_window,
            dst_offset,
            src_offset,
            bytes,
            signal_id,
            counter_id,
            signal_value,
        };
        if self.comm.borrow(py).closed(py) {
            return Err(closed("push"));
        }
        let producer = self.producer.clone();
        py.detach(move || producer.push(&desc)).map_err(|e| match e {
            ProducerError::RingFull { .. } => error(Kind::Timeout, format!("push: {e}")),
        })
    }

    fn __repr__(&self) -> String {
        format!("HostProducer(ring={})", self.ring)
    }
}
