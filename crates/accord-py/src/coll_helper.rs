//! The helper threads `accord.Communicator` runs a call from Python's main thread on, so that
//! the caller waits with the GIL released and still sees signals (Ctrl-C): a pool of parked
//! threads, one per call running at once, dropped unused after a fork.

use crate::errors::{error, Kind};
use crate::values::WAIT_SLICE;
use pyo3::prelude::*;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;

/// What a helper thread runs: the job, given the function that puts the helper back in the
/// idle pool (called before the job's result is handed over, so the caller's next call finds
/// the helper idle instead of starting another).
type HelperJob = Box<dyn FnOnce(&dyn Fn()) + Send>;

/// Idle helper threads, by the process that started them. Why a pool: a collective called from
/// Python's main thread runs on a helper so that the caller can look for signals (Ctrl-C) while
/// it waits; starting a thread per call cost tens of microseconds, the fixed cost of every small
/// call (`scripts/device/torch_overhead_probe.py`). A helper stays parked after its job; there
/// are as many as calls ever ran at once (one, unless a call was interrupted while its helper
/// still ran). After a fork the parent's helpers do not exist: the pool is dropped unused.
static HELPERS: Mutex<(u32, Vec<mpsc::Sender<HelperJob>>)> = Mutex::new((0, Vec::new()));

/// An idle helper of this process, else a new one.
fn helper() -> std::io::Result<mpsc::Sender<HelperJob>> {
    let pid = std::process::id();
    {
        let mut pool = HELPERS.lock().unwrap_or_else(|e| e.into_inner());
        if pool.0 != pid {
            *pool = (pid, Vec::new());
        }
        if let Some(idle) = pool.1.pop() {
            return Ok(idle);
        }
    }
    let (tx, rx) = mpsc::channel::<HelperJob>();
    let mine = tx.clone();
    std::thread::Builder::new().name("accord-coll".into()).spawn(move || {
        let release = || {
            let mut pool = HELPERS.lock().unwrap_or_else(|e| e.into_inner());
            if pool.0 == pid {
                pool.1.push(mine.clone());
            }
        };
        while let Ok(job) = rx.recv() {
            job(&release);
        }
    })?;
    Ok(tx)
}

/// Runs `job` on a helper thread (see [`HELPERS`]); waits for it with the GIL released, in
/// slices of [`WAIT_SLICE`] with a signal check between them. If a signal handler raises
/// (Ctrl-C), the helper is left to finish on its own and the handler's exception is returned.
pub(crate) fn background<R: Send + 'static>(py: Python<'_>, job: impl FnOnce() -> R + Send + 'static) -> PyResult<R> {
    let (tx, rx) = mpsc::channel();
    // A `Receiver` is not `Sync`; the mutex lets the wait borrow it with the GIL released.
    let rx = Mutex::new(rx);
    let start =
        |e: &dyn std::fmt::Display| error(Kind::Accord, format!("could not start a thread for the collective: {e}"));
    let run: HelperJob = Box::new(move |release: &dyn Fn()| {
        let done = job();
        release();
        let _ = tx.send(done);
    });
    if let Err(mpsc::SendError(run)) = helper().map_err(|e| start(&e))?.send(run) {
        // Not expected: a helper returns to the pool only after its job returned, so a pooled
        // helper is alive. A guard, not a path: should its thread be gone, a fresh one runs the job.
        std::thread::Builder::new().name("accord-coll".into()).spawn(move || run(&|| ())).map_err(|e| start(&e))?;
    }
    loop {
        match py.detach(|| rx.lock().unwrap().recv_timeout(WAIT_SLICE)) {
            Ok(done) => return Ok(done),
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(error(Kind::Accord, "the collective's thread panicked: create a new accord.Communicator"))
            }
        }
    }
}

/// Whether this is Python's main thread (the only one that runs signal handlers); `true` when
/// it cannot be told, which keeps the interruptible wait.
pub(crate) fn on_main_thread(py: Python<'_>) -> bool {
    let Ok(threading) = py.import("threading") else { return true };
    match (threading.call_method0("current_thread"), threading.call_method0("main_thread")) {
        (Ok(current), Ok(main)) => current.is(&main),
        _ => true,
    }
}
