//! Keeping CUDA stream order around host-driven collectives (DESIGN §5).
//!
//! A collective runs on a CPU thread but must behave as if it ran on the
//! user's stream: it may start only after the kernels that produced its input,
//! and the kernels after it may start only once it wrote its output.
//!
//! **GPU → host** ("the input is ready"):
//! - [`launch_host_fn`] / [`signal_when_done`]: the driver runs a callback
//!   once prior work on the stream completed; the collective thread sleeps
//!   on it. Use when a thread should be woken. The callback blocks the stream
//!   while it runs, so it only signals; it must never call CUDA.
//! - [`crate::Event`] recorded on the stream, then [`crate::Event::wait_timeout`]
//!   or polled with [`crate::Event::is_complete`]: use from a progress loop
//!   that polls many things anyway.
//!
//! **Host → GPU** ("the output is written"):
//! - [`StallGate::stall`]: a one-thread kernel on the user's stream spins on a
//!   host-mapped word until the host calls [`StallGate::release`]. Launch it
//!   where the collective sits in the stream, before the collective starts;
//!   everything queued after it waits. It escapes after a timeout (measured
//!   with `%globaltimer`) and records that it did, so a lost host thread can
//!   never hang the GPU. It holds one SM slot while it waits. (Stream memory
//!   operations, `cuStreamWaitValue64`, do the same without an SM where the
//!   platform supports them; a possible later alternative.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::context::Gpu;
use crate::error::{CudaError, Result};
use crate::ffi::driver;
use crate::ffi::host_memory::PinnedHostBuffer;
use crate::ffi::launch::{self, StallLaunch};
use crate::kernels::{Kernel, Module};
use crate::stream::Stream;

/// Enqueues `callback` on `stream`: the driver calls it (on its own thread)
/// once all work queued before it completed. It must not call CUDA and
/// should return quickly; a panic inside it is caught and dropped.
pub fn launch_host_fn(stream: &Stream, callback: impl FnOnce() + Send + 'static) -> Result<()> {
    stream.gpu().bind()?;
    driver::launch_host_func(stream.raw(), Box::new(callback))
}

/// A host-side waiter that [`signal_when_done`] wakes.
#[derive(Debug, Clone)]
pub struct HostWaiter {
    state: Arc<(Mutex<bool>, Condvar)>,
}

impl HostWaiter {
    /// Whether the stream reached the signal.
    pub fn is_signalled(&self) -> bool {
        *self.state.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks until signalled or `timeout` passed.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let (lock, condvar) = &*self.state;
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = condvar.wait_timeout_while(guard, timeout, |done| !*done).unwrap_or_else(|p| p.into_inner());
        if *guard {
            Ok(())
        } else {
            Err(CudaError::Timeout { what: "host function signal", timeout_ms: timeout.as_millis() as u64 })
        }
    }
}

/// Enqueues a host function that wakes the returned waiter once all work
/// queued on `stream` before it completed.
pub fn signal_when_done(stream: &Stream) -> Result<HostWaiter> {
    let waiter = HostWaiter { state: Arc::new((Mutex::new(false), Condvar::new())) };
    let state = Arc::clone(&waiter.state);
    launch_host_fn(stream, move || {
        let (lock, condvar) = &*state;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        condvar.notify_all();
    })?;
    Ok(waiter)
}

/// Source of the stall kernel.
pub const STALL_KERNEL_SOURCE: &str = r#"
// accord-cuda stall kernel (generated; do not edit).
static __device__ __forceinline__ unsigned long long accord_globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Waits until *release_word >= target or timeout_ns passed; then writes
// 1 (released) or 2 (timed out) to *status_word.
extern "C" __global__ void accord_stall(const volatile unsigned long long* release_word,
                                        unsigned long long target, unsigned long long timeout_ns,
                                        volatile unsigned long long* status_word) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const unsigned long long start = accord_globaltimer_ns();
  unsigned long long status = 1ull;
  while (*release_word < target) {
    if (accord_globaltimer_ns() - start > timeout_ns) { status = 2ull; break; }
    __nanosleep(256);
  }
  __threadfence_system();
  *status_word = status;
  __threadfence_system();
}
"#;

/// Status slots of a [`StallGate`]: at most this many stalls may be
/// outstanding (launched and not yet finished) at once.
pub const STALL_STATUS_SLOTS: usize = 1024;
/// Default time after which a stall kernel gives up.
pub const STALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Outcome of one stall, as the kernel recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallOutcome {
    /// The kernel has not finished (still waiting or not started).
    Pending,
    /// The host released it.
    Released,
    /// It gave up after its timeout; the stream went on without the host.
    TimedOut,
}

/// Identifies one stall launched by [`StallGate::stall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StallTicket {
    sequence: u64,
}

impl StallTicket {
    /// The ticket's sequence number (1, 2, ... per gate).
    pub fn sequence(self) -> u64 {
        self.sequence
    }
}

/// Host-releasable stall points on streams of one GPU. Word 0 of a pinned,
/// device-mapped buffer is the release sequence; word `1 + seq % SLOTS` is
/// the status of stall `seq`. Releasing ticket `n` releases every ticket up
/// to `n`.
#[derive(Debug)]
pub struct StallGate {
    words: PinnedHostBuffer,
    kernel: Kernel,
    next_sequence: AtomicU64,
    _module: Arc<Module>,
}

impl StallGate {
    /// Compiles (cached) and loads the stall kernel on `gpu`.
    pub fn new(gpu: &Gpu) -> Result<StallGate> {
        let module = Module::compile_and_load(gpu, STALL_KERNEL_SOURCE, "accord_stall.cu")?;
        let kernel = module.kernel("accord_stall")?;
        let words = PinnedHostBuffer::alloc(gpu, (1 + STALL_STATUS_SLOTS) * 8)?;
        Ok(StallGate { words, kernel, next_sequence: AtomicU64::new(1), _module: module })
    }

    fn release_word(&self) -> &AtomicU64 {
        self.words.atomic_u64(0).expect("word 0 is inside the gate's buffer")
    }

    fn status_word(&self, ticket: StallTicket) -> &AtomicU64 {
        let slot = 1 + (ticket.sequence as usize % STALL_STATUS_SLOTS);
        self.words.atomic_u64(slot).expect("status slots are inside the gate's buffer")
    }

    /// Queues a stall on `stream`: work queued after it waits until
    /// [`StallGate::release`] of this ticket (or a later one), or `timeout`.
    pub fn stall(&self, stream: &Stream, timeout: Duration) -> Result<StallTicket> {
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        let ticket = StallTicket { sequence };
        self.status_word(ticket).store(0, Ordering::Release);
        let slot_offset = (1 + sequence as usize % STALL_STATUS_SLOTS) * 8;
        launch::stall(
            &self.kernel,
            StallLaunch {
                release_word: self.words.device_ptr(),
                target: sequence,
                timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
                status_word: self.words.device_ptr().offset(slot_offset),
            },
            stream,
        )?;
        Ok(ticket)
    }

    /// Lets the stall of `ticket`, and every earlier one, finish.
    pub fn release(&self, ticket: StallTicket) {
        self.release_word().fetch_max(ticket.sequence, Ordering::Release);
    }

    /// What the kernel recorded for `ticket` (meaningful until
    /// [`STALL_STATUS_SLOTS`] later tickets reuse its slot).
    pub fn outcome(&self, ticket: StallTicket) -> StallOutcome {
        match self.status_word(ticket).load(Ordering::Acquire) {
            1 => StallOutcome::Released,
            2 => StallOutcome::TimedOut,
            _ => StallOutcome::Pending,
        }
    }
}

impl Drop for StallGate {
    fn drop(&mut self) {
        // Release everything so no stall kernel waits for its timeout; the pinned buffer's drop
        // then synchronises the GPU before freeing the words the kernels read.
        self.release_word().store(u64::MAX, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
