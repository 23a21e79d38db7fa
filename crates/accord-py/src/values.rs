//! The values engines exchange out of band — [`Address`] and [`Descriptor`], both picklable and
//! printable as compact JSON — and the small argument types of the API ([`ScatterDst`], peers,
//! timeouts).

use crate::errors::{error, parse_error, Kind};
use accord_engine::{EngineAddress, EngineId, MrDescriptor};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};
use std::time::{Duration, Instant};

/// What a peer needs to reach an engine: `str(address)` is compact JSON, `Address.parse`
/// reads it back, and addresses pickle. Hand it to the peer's `Engine.add_peer`.
#[pyclass(module = "accord", frozen)]
#[derive(Clone)]
pub struct Address {
    pub(crate) inner: EngineAddress,
}

#[pymethods]
impl Address {
    /// Parses what `str(address)` produced.
    #[classmethod]
    fn parse(_cls: &Bound<'_, PyType>, text: &str) -> PyResult<Address> {
        EngineAddress::parse(text).map(|inner| Address { inner }).map_err(parse_error)
    }

    /// The engine's identity (a random 64-bit integer, new for every engine).
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id.0
    }

    /// Host name of the engine's machine.
    #[getter]
    fn host(&self) -> &str {
        &self.inner.host
    }

    /// Process id of the engine's process.
    #[getter]
    fn pid(&self) -> u32 {
        self.inner.pid
    }

    fn __str__(&self) -> String {
        self.inner.to_string_compact()
    }

    fn __repr__(&self) -> String {
        format!("Address(id=0x{:016x}, host={:?}, pid={})", self.inner.id.0, self.inner.host, self.inner.pid)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Address>().is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        self.inner.id.0 >> 1
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let parse = slf.get_type().getattr("parse")?;
        let args = PyTuple::new(slf.py(), [slf.str()?])?;
        PyTuple::new(slf.py(), [parse.into_any(), args.into_any()])
    }
}

/// What a peer needs to write into a registered region: its engine, region id, key and
/// length. Holding it is the permission to write, so share it only with trusted peers.
/// `str(descriptor)` is compact JSON, `Descriptor.parse` reads it back, and descriptors pickle.
#[pyclass(module = "accord", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Descriptor {
    pub(crate) inner: MrDescriptor,
}

#[pymethods]
impl Descriptor {
    /// Parses what `str(descriptor)` produced.
    #[classmethod]
    fn parse(_cls: &Bound<'_, PyType>, text: &str) -> PyResult<Descriptor> {
        MrDescriptor::parse(text).map(|inner| Descriptor { inner }).map_err(parse_error)
    }

    /// Identity of the engine that owns the region.
    #[getter]
    fn engine_id(&self) -> u64 {
        self.inner.engine.0
    }

    /// Length of the region in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.len
    }

    fn __str__(&self) -> String {
        self.inner.to_string_compact()
    }

    fn __repr__(&self) -> String {
        format!(
            "Descriptor(engine_id=0x{:016x}, region={}, nbytes={})",
            self.inner.engine.0, self.inner.region, self.inner.len
        )
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let parse = slf.get_type().getattr("parse")?;
        let args = PyTuple::new(slf.py(), [slf.str()?])?;
        PyTuple::new(slf.py(), [parse.into_any(), args.into_any()])
    }
}

/// One destination of `Engine.scatter`: `nbytes` bytes from `src_offset` of the local source
/// go to `dst` at `dst_offset`. Keyword-only so the offsets cannot be swapped by accident.
#[pyclass(module = "accord", frozen)]
#[derive(Clone)]
pub struct ScatterDst {
    pub(crate) dst: MrDescriptor,
    pub(crate) nbytes: u64,
    pub(crate) dst_offset: u64,
    pub(crate) src_offset: u64,
}

#[pymethods]
impl ScatterDst {
    #[new]
    #[pyo3(signature = (dst, *, nbytes, dst_offset = 0, src_offset = 0))]
    fn new(dst: &Descriptor, nbytes: u64, dst_offset: u64, src_offset: u64) -> Self {
        ScatterDst { dst: dst.inner, nbytes, dst_offset, src_offset }
    }

    /// The destination region.
    #[getter]
    fn dst(&self) -> Descriptor {
        Descriptor { inner: self.dst }
    }

    /// Bytes to move.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Offset in the destination.
    #[getter]
    fn dst_offset(&self) -> u64 {
        self.dst_offset
    }

    /// Offset in the local source.
    #[getter]
    fn src_offset(&self) -> u64 {
        self.src_offset
    }

    fn __repr__(&self) -> String {
        format!(
            "ScatterDst(dst=<region {} of 0x{:016x}>, nbytes={}, dst_offset={}, src_offset={})",
            self.dst.region, self.dst.engine.0, self.nbytes, self.dst_offset, self.src_offset
        )
    }
}

/// A peer named by its `Address` or by its engine id (`Address.id`).
pub(crate) fn peer_id(peer: &Bound<'_, PyAny>) -> PyResult<EngineId> {
    if let Ok(address) = peer.cast::<Address>() {
        return Ok(address.get().inner.id);
    }
    peer.extract::<u64>().map(EngineId).map_err(|_| {
        error(Kind::InvalidRequest, "a peer is an accord.Address or its integer id (Address.id)".to_string())
    })
}

/// Longest a blocking call waits with the GIL released before it looks for signals (Ctrl-C).
pub(crate) const WAIT_SLICE: Duration = Duration::from_millis(50);

/// Seconds given by the caller (`what` of `op`) as a bounded duration; `positive` refuses 0.
pub(crate) fn seconds(op: &str, what: &str, s: f64, positive: bool) -> PyResult<Duration> {
    if s.is_finite() && (s > 0.0 || (s == 0.0 && !positive)) {
        Ok(Duration::from_secs_f64(s.min(1e9)))
    } else {
        let valid = if positive { "> 0" } else { ">= 0" };
        Err(error(Kind::InvalidRequest, format!("{op}: {what} {s} is not valid: give seconds {valid}")))
    }
}

/// The deadline of a `timeout` in seconds (`None`: wait for ever).
pub(crate) fn deadline(timeout_s: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout_s {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Instant::now() + Duration::from_secs_f64(t.min(1e9)))),
        Some(t) => Err(error(Kind::InvalidRequest, format!("timeout {t} is not valid: give seconds >= 0, or None"))),
    }
}

/// Runs `step(slice)` with the GIL released, in slices of at most [`WAIT_SLICE`], until it
/// returns `Some` or the deadline passes (then `None`); between slices it runs Python's signal
/// handlers, so Ctrl-C raises `KeyboardInterrupt` out of the wait.
pub(crate) fn wait_in_slices<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    mut step: impl FnMut(Duration) -> Option<T> + Send,
) -> PyResult<Option<T>> {
    loop {
        let slice = match deadline {
            None => WAIT_SLICE,
            Some(d) => d.saturating_duration_since(Instant::now()).min(WAIT_SLICE),
        };
        if let Some(done) = py.detach(|| step(slice)) {
            return Ok(Some(done));
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
}
