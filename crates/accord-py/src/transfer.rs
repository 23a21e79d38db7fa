//! Completion handles: [`Transfer`] (wait with a timeout, `done`, callbacks, `await`) and
//! [`ImmCounter`] (value, wait, callbacks, `await`). Waits release the GIL and look for
//! Ctrl-C between slices; `await` goes through `accord._aio`, which resolves an asyncio future
//! from the engine's completion thread with `loop.call_soon_threadsafe`.

use crate::core::Core;
use crate::errors::{error, transfer_error, Kind};
use crate::recv::call_py;
use crate::values::{deadline, wait_in_slices};
use accord_engine::TransferError;
use pyo3::prelude::*;
use std::sync::Arc;

/// A submitted transfer (`Engine.write`, `write_paged`, `scatter`, `send`). Dropping it does
/// not cancel the transfer. `await transfer` works inside asyncio without blocking the loop.
#[pyclass(module = "accord", frozen)]
pub struct Transfer {
    pub(crate) inner: accord_engine::Transfer,
}

fn outcome(result: Result<(), TransferError>) -> PyResult<()> {
    result.map_err(transfer_error)
}

#[pymethods]
impl Transfer {
    /// Blocks until the transfer completed (GIL released), at most `timeout` seconds (None:
    /// no limit). Raises the transfer's error, or `accord.TimeoutError` if still running.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        if let Some(result) = self.inner.poll() {
            return outcome(result);
        }
        let waited = wait_in_slices(py, deadline(timeout)?, |slice| match self.inner.wait_timeout(slice) {
            Err(TransferError::Timeout) => None,
            result => Some(result),
        })?;
        match waited {
            Some(result) => outcome(result),
            None => Err(error(
                Kind::Timeout,
                format!(
                    "transfer not complete within {:.3} s: wait longer, or check the peer is alive",
                    timeout.unwrap_or(0.0)
                ),
            )),
        }
    }

    /// Whether the transfer completed, successfully or not.
    fn done(&self) -> bool {
        self.inner.is_done()
    }

    /// The transfer's error (an `accord.AccordError`) if it failed, None if it succeeded;
    /// raises `accord.InvalidRequestError` while it is still running.
    fn exception(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self.inner.poll() {
            None => Err(error(Kind::InvalidRequest, "the transfer is still running: wait() or await it first")),
            Some(Ok(())) => Ok(None),
            Some(Err(e)) => Ok(Some(transfer_error(e).into_value(py).into_any())),
        }
    }

    /// Calls `callback(transfer)` once complete, on the engine's completion thread (at once,
    /// there, if already complete). Keep callbacks short; exceptions go to
    /// `sys.unraisablehook`.
    fn add_done_callback(slf: &Bound<'_, Self>, callback: Py<PyAny>) {
        let me = slf.clone().unbind();
        slf.get().inner.on_complete(move |_| call_py(&callback, |py| Ok(vec![me.bind(py).clone().into_any()])));
    }

    fn __await__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let coroutine = slf.py().import("accord._aio")?.getattr("wait_transfer")?.call1((slf,))?;
        coroutine.call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        match self.inner.poll() {
            None => "Transfer(running)".into(),
            Some(Ok(())) => "Transfer(done)".into(),
            Some(Err(e)) => format!("Transfer(failed: {e})"),
        }
    }
}

/// The counter of writes carrying one immediate that have fully landed at this engine
/// (`Engine.imm_counter`). Values only grow.
#[pyclass(module = "accord", frozen)]
pub struct ImmCounter {
    pub(crate) inner: accord_engine::ImmCounter,
    pub(crate) imm: u32,
    pub(crate) core: Arc<Core>,
}

#[pymethods]
impl ImmCounter {
    /// The immediate this counter counts.
    #[getter]
    fn imm(&self) -> u32 {
        self.imm
    }

    /// Writes with this immediate that have fully landed so far.
    #[getter]
    fn value(&self) -> u64 {
        self.inner.value()
    }

    /// Writes with this immediate that landed but were never counted because the engine's
    /// table of counters was full (see `Engine.release_imm`).
    #[getter]
    fn lost(&self) -> u64 {
        self.inner.lost()
    }

    /// Blocks (GIL released) until the value reaches `target`, at most `timeout` seconds
    /// (None: no limit); returns the value. Raises `accord.TimeoutError` if it did not, and
    /// `accord.ShutdownError` once the engine is closed (at once if it was), and
    /// `accord.AccordError` at once when writes with this immediate were lost to a full table
    /// of counters (the target may then never be reached).
    #[pyo3(signature = (target, timeout = None))]
    fn wait(&self, py: Python<'_>, target: u64, timeout: Option<f64>) -> PyResult<u64> {
        let value = self.inner.value();
        if value >= target {
            return Ok(value);
        }
        let closed = || self.core.is_closed() || self.inner.engine_closed();
        if closed() {
            return Err(crate::errors::closed("ImmCounter.wait"));
        }
        let reached = wait_in_slices(py, deadline(timeout)?, |slice| match self.inner.wait_checked(target, slice) {
            Ok(value) => Some(Ok(value)),
            Err(accord_engine::ImmError::ShutDown { .. }) => Some(Err(None)),
            Err(e @ accord_engine::ImmError::Overflow { .. }) => Some(Err(Some(e))),
            Err(accord_engine::ImmError::Timeout { .. }) if closed() => Some(Err(None)),
            Err(accord_engine::ImmError::Timeout { .. }) => None,
        })?;
        match reached {
            Some(Ok(value)) => Ok(value),
            Some(Err(None)) => Err(crate::errors::closed("ImmCounter.wait")),
            Some(Err(Some(lost))) => Err(error(Kind::Accord, lost.to_string())),
            None => Err(error(
                Kind::Timeout,
                format!(
                    "immediate {} counted {} of {target} within {:.3} s: wait longer, or check the writers",
                    self.imm,
                    self.inner.value(),
                    timeout.unwrap_or(0.0)
                ),
            )),
        }
    }

    /// Calls `callback(value)` on the engine's completion thread once the value reaches
    /// `target` (at once if it has). Raises `accord.AccordError` when too many callbacks wait on
    /// this counter already.
    pub(crate) fn add_callback(&self, target: u64, callback: Py<PyAny>) -> PyResult<()> {
        let engine = self.core.engine("ImmCounter.add_callback")?;
        let added = engine.expect_imm(self.imm, target, move |value| {
            call_py(&callback, |py| Ok(vec![value.into_pyobject(py)?.into_any()]))
        });
        if added {
            Ok(())
        } else {
            Err(error(
                Kind::Accord,
                format!(
                    "{} callbacks already wait on immediate {}: wait for some to run first",
                    accord_engine::IMM_EXPECTATIONS_MAX,
                    self.imm
                ),
            ))
        }
    }

    /// An awaitable that resolves to the value once it reaches `target` (asyncio; the loop is
    /// not blocked). Wrap it in `asyncio.wait_for` for a timeout.
    fn wait_async<'py>(slf: &Bound<'py, Self>, target: u64) -> PyResult<Bound<'py, PyAny>> {
        slf.py().import("accord._aio")?.getattr("wait_counter")?.call1((slf, target))
    }

    fn __repr__(&self) -> String {
        format!("ImmCounter(imm={}, value={})", self.imm, self.inner.value())
    }
}
