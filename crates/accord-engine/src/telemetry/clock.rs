//! The clock of recorded transfers ([`now_ns`]), and their end times read once for several.
//!
//! A worker finishes transfers in batches: every acknowledgement one receive brought in
//! completes its operations in one drain of the endpoint's events. Reading the clock for each
//! (about 25 ns on the development machine, `cargo run --release -p accord-bench --example
//! telemetry_record_cost`) was the largest part of what telemetry added to a finished
//! transfer. Inside a [`SharedReading`] the completions share one reading, taken at the first
//! of them and read again after [`USES_PER_READING`] completions, so an end time is early by
//! at most the work of that many completions (well under the trace's microsecond and the
//! histogram's 10 µs first bucket). Outside one, each end time is read when asked.

use std::cell::Cell;

/// Now, in nanoseconds of `CLOCK_MONOTONIC` (the clock `std::time::Instant` reads on Linux),
/// as one integer: a transfer's start and end are kept and subtracted as such, with none of
/// the `Instant` arithmetic (a call into std per subtraction) on the path of every transfer.
#[allow(unsafe_code)]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_MONOTONIC exists on every system the engine builds for.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// Completions that share one clock reading at most.
pub const USES_PER_READING: u32 = 16;

/// The calling thread's span: `None` outside one; inside, the reading and the completions
/// that used it (a reading is taken when the count is 0).
#[derive(Clone, Copy)]
struct Span {
    at: u64,
    uses: u32,
}

thread_local! {
    static SPAN: Cell<Option<Option<Span>>> = const { Cell::new(None) };
}

/// While alive, [`end_ns`] on this thread shares readings. Nothing when telemetry is off.
pub(crate) struct SharedReading(());

impl SharedReading {
    /// Opens a span on this thread when `enabled` (telemetry is on: the caller passes
    /// `telemetry::on()`, so this clock depends on no switch of the recorder's); `None`
    /// otherwise.
    pub(crate) fn begin_if(enabled: bool) -> Option<SharedReading> {
        if !enabled {
            return None;
        }
        let _ = SPAN.try_with(|s| s.set(Some(None)));
        Some(SharedReading(()))
    }
}

impl Drop for SharedReading {
    fn drop(&mut self) {
        let _ = SPAN.try_with(|s| s.set(None));
    }
}

/// Now ([`now_ns`]), for a transfer that just finished: this span's shared reading, or a
/// fresh one.
pub(crate) fn end_ns() -> u64 {
    SPAN.try_with(|s| match s.get() {
        None => now_ns(),
        Some(Some(Span { at, uses })) if uses < USES_PER_READING => {
            s.set(Some(Some(Span { at, uses: uses + 1 })));
            at
        }
        Some(_) => {
            let at = now_ns();
            s.set(Some(Some(Span { at, uses: 1 })));
            at
        }
    })
    .unwrap_or_else(|_| now_ns())
}

#[cfg(test)]
mod tests;
