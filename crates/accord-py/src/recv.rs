//! Messages from peers' sends: either handed to a Python handler on the engine's completion
//! thread, or queued here for `Engine.recv`.

use accord_engine::RecvMessage;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Most messages queued for `Engine.recv`; further messages are dropped and counted, and the
/// next `recv` raises to say so (the engine re-posts a buffer as soon as its message was
/// queued, so the queue, not the posted buffers, is what bounds memory).
pub const RECV_QUEUED_MAX: usize = 65_536;

/// A received message: its bytes and the immediate the sender attached.
pub(crate) type Message = (Vec<u8>, Option<u32>);

#[derive(Default)]
struct State {
    messages: VecDeque<Message>,
    dropped: u64,
    /// The engine was closed: `recv` raises at once instead of waiting.
    closed: bool,
}

/// Why [`RecvQueue::pop`] returned no message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PopError {
    /// This many messages were dropped since the last call (reported once).
    Dropped(u64),
    /// The engine was closed.
    Closed,
}

/// The queue of received messages.
#[derive(Default)]
pub(crate) struct RecvQueue {
    state: Mutex<State>,
    arrived: Condvar,
}

impl RecvQueue {
    /// Queues a copy of `message` (on the completion thread).
    pub(crate) fn push(&self, message: RecvMessage<'_>) {
        let mut state = self.state.lock().unwrap();
        if state.messages.len() >= RECV_QUEUED_MAX {
            state.dropped += 1;
            return;
        }
        state.messages.push_back((message.data.to_vec(), message.imm));
        drop(state);
        self.arrived.notify_one();
    }

    /// Waits at most `slice` for a message; ends at once when the engine is closed.
    pub(crate) fn pop(&self, slice: Duration) -> Result<Option<Message>, PopError> {
        let mut state = self.state.lock().unwrap();
        if state.dropped > 0 {
            return Err(PopError::Dropped(std::mem::take(&mut state.dropped)));
        }
        if state.messages.is_empty() && !slice.is_zero() && !state.closed {
            state = self.arrived.wait_timeout(state, slice).unwrap().0;
        }
        if state.closed {
            return Err(PopError::Closed);
        }
        Ok(state.messages.pop_front())
    }

    /// The engine was closed: wakes every `recv` waiting, which then raises `ShutdownError`.
    pub(crate) fn close(&self) {
        self.state.lock().unwrap().closed = true;
        self.arrived.notify_all();
    }
}

/// Calls a Python callable from the engine's completion thread; an exception it raises is
/// reported through `sys.unraisablehook` (there is no caller to raise it to). Skipped when
/// the interpreter is shutting down.
pub(crate) fn call_py(
    callback: &Py<PyAny>,
    args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>>,
) {
    let _ = Python::try_attach(|py| {
        let result = args(py).and_then(|a| callback.call1(py, pyo3::types::PyTuple::new(py, a)?));
        if let Err(e) = result {
            e.write_unraisable(py, Some(callback.bind(py)));
        }
    });
}

/// A handler for `Engine.post_recvs` that calls `handler(data: bytes, imm: int | None)`.
pub(crate) fn python_handler(handler: Py<PyAny>) -> impl Fn(RecvMessage<'_>) + Send + Sync + 'static {
    move |message: RecvMessage<'_>| {
        call_py(&handler, |py| {
            Ok(vec![PyBytes::new(py, message.data).into_any(), message.imm.into_pyobject(py)?.into_any()])
        })
    }
}
