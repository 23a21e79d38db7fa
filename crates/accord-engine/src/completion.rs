//! Completions: the [`Transfer`] handle, its optional callback and counter, and the completion
//! thread that runs callbacks so workers never run user code.

use crate::error::TransferError;
use crate::wait_spin::SleeperCondvar;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most jobs queued for the completion thread; a worker that finds it full waits.
pub const COMPLETION_JOBS_MAX: usize = 65_536;

/// A job for the completion thread.
pub(crate) enum Job {
    /// Run this.
    Run(Box<dyn FnOnce() + Send>),
    /// Exit the thread.
    Stop,
}

/// Sender side of the completion queue.
pub(crate) type JobSender = SyncSender<Job>;

/// The completion thread's loop: it keeps looking for jobs for `poll` after the last one before
/// it blocks ([`crate::backoff::recv_hot`] says why).
pub(crate) fn run_completion_thread(jobs: Receiver<Job>, poll: Duration) {
    let mut last_job = std::time::Instant::now();
    loop {
        match crate::backoff::recv_hot(&jobs, last_job, poll, Duration::from_secs(1)) {
            Ok(Job::Run(job)) => {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                    tracing::error!("a completion callback panicked; the engine goes on");
                }
                last_job = std::time::Instant::now();
            }
            Ok(Job::Stop) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// Runs `f` on the completion thread (or drops it when the engine is gone).
pub(crate) fn dispatch(jobs: &JobSender, f: impl FnOnce() + Send + 'static) {
    let _ = jobs.send(Job::Run(Box::new(f)));
}

type Callback = Box<dyn FnOnce(Result<(), TransferError>) + Send>;
/// Submits the last part of a transfer once the others succeeded.
pub(crate) type Trailer = Box<dyn FnOnce(Arc<TransferState>) + Send>;

struct Outcome {
    result: Option<Result<(), TransferError>>,
    callbacks: Vec<Callback>,
    counters: Vec<Arc<AtomicU64>>,
}

/// Shared state of one user-visible transfer, completed by its parts.
pub(crate) struct TransferState {
    outcome: Mutex<Outcome>,
    done: SleeperCondvar,
    /// Set (after `outcome.result`) when the transfer completed: what a spinning waiter polls.
    finished: AtomicBool,
    /// How long `wait` polls before it blocks ([`crate::EngineConfig::wait_spin`]).
    wait_spin: Duration,
    parts_left: AtomicUsize,
    first_error: Mutex<Option<TransferError>>,
    /// Submitted once every part succeeded (the immediate of a multi-part transfer).
    pub(crate) trailer: Mutex<Option<Trailer>>,
    jobs: JobSender,
    /// When it was submitted ([`crate::telemetry::clock::now_ns`]), for a recorded transfer while
    /// telemetry is on (its latency is recorded at the end).
    started: Option<u64>,
}

impl TransferState {
    /// `recorded`: telemetry records it (a user's transfer, not one of the engine's own pieces).
    pub(crate) fn new(parts: usize, jobs: JobSender, wait_spin: Duration, recorded: bool) -> Arc<Self> {
        Arc::new(TransferState {
            outcome: Mutex::new(Outcome { result: None, callbacks: vec![], counters: vec![] }),
            done: SleeperCondvar::default(),
            finished: AtomicBool::new(false),
            wait_spin,
            parts_left: AtomicUsize::new(parts),
            first_error: Mutex::new(None),
            trailer: Mutex::new(None),
            jobs,
            started: (recorded && crate::telemetry::recorder::on()).then(crate::telemetry::clock::now_ns),
        })
    }

    /// One part finished.
    pub(crate) fn part_done(self: &Arc<Self>, result: Result<(), TransferError>) {
        if let Err(e) = result {
            self.first_error.lock().unwrap().get_or_insert(e);
        }
        if self.parts_left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let error = *self.first_error.lock().unwrap();
        if error.is_none() {
            if let Some(trailer) = self.trailer.lock().unwrap().take() {
                self.parts_left.store(1, Ordering::Release);
                let me = self.clone();
                dispatch(&self.jobs, move || trailer(me));
                return;
            }
        }
        self.finish(error.map_or(Ok(()), Err));
    }

    fn finish(&self, result: Result<(), TransferError>) {
        let callbacks = {
            let mut o = self.outcome.lock().unwrap();
            if o.result.is_some() {
                return;
            }
            // Counters move under the lock, before waiters wake: whoever returns from `wait`
            // (or sees `is_done`) also sees the counters it attached already bumped.
            for c in std::mem::take(&mut o.counters) {
                c.fetch_add(1, Ordering::AcqRel);
            }
            o.result = Some(result);
            self.finished.store(true, Ordering::Release);
            std::mem::take(&mut o.callbacks)
        };
        self.done.notify_all();
        if let Some(start) = self.started {
            crate::telemetry::recorder::record_transfer(start, crate::telemetry::clock::end_ns(), result.is_ok());
        }
        for cb in callbacks {
            dispatch(&self.jobs, move || cb(result));
        }
    }
}

/// A submitted transfer. Complete it by waiting or polling, or attach a callback (run on the
/// engine's completion thread) or a counter (bumped when it completes). Dropping the handle
/// does not cancel the transfer.
#[derive(Clone)]
pub struct Transfer {
    pub(crate) state: Arc<TransferState>,
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer").field("result", &self.poll()).finish()
    }
}

impl Transfer {
    /// Polls the completion for up to `budget` (see [`crate::wait_spin`]); whether it finished.
    fn spin(&self, budget: Duration) -> bool {
        crate::wait_spin::spin_until(budget, || self.state.finished.load(Ordering::Acquire))
    }

    /// Blocks until the transfer completed; its result. Polls for the engine's
    /// [`crate::EngineConfig::wait_spin`] first, then sleeps.
    pub fn wait(&self) -> Result<(), TransferError> {
        self.spin(self.state.wait_spin);
        let mut o = self.state.outcome.lock().unwrap();
        loop {
            if let Some(r) = o.result {
                return r;
            }
            o = self.state.done.wait(o);
        }
    }

    /// Blocks at most `timeout`; [`TransferError::Timeout`] if still running. Polls first, as
    /// [`Transfer::wait`] does (never longer than `timeout`).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<(), TransferError> {
        let deadline = std::time::Instant::now() + timeout;
        self.spin(self.state.wait_spin.min(timeout));
        let mut o = self.state.outcome.lock().unwrap();
        loop {
            if let Some(r) = o.result {
                return r;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(TransferError::Timeout);
            }
            o = self.state.done.wait_timeout(o, left);
        }
    }

    /// The result if complete, without blocking.
    pub fn poll(&self) -> Option<Result<(), TransferError>> {
        self.state.outcome.lock().unwrap().result
    }

    /// Whether the transfer completed (either way).
    pub fn is_done(&self) -> bool {
        self.poll().is_some()
    }

    /// Runs `callback` with the result on the completion thread once complete (at once, on
    /// that thread, if already complete).
    pub fn on_complete(&self, callback: impl FnOnce(Result<(), TransferError>) + Send + 'static) {
        let mut o = self.state.outcome.lock().unwrap();
        match o.result {
            Some(r) => dispatch(&self.state.jobs, move || callback(r)),
            None => o.callbacks.push(Box::new(callback)),
        }
    }

    /// Adds one to `counter` once complete (at once if already complete), success or not.
    pub fn count_into(&self, counter: Arc<AtomicU64>) {
        let mut o = self.state.outcome.lock().unwrap();
        match o.result {
            Some(_) => {
                counter.fetch_add(1, Ordering::AcqRel);
            }
            None => o.counters.push(counter),
        }
    }
}
