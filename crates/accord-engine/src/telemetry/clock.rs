//! The end time of a recorded transfer, read once for several.
//!
//! A worker finishes transfers in batches: every acknowledgement one receive brought in
//! completes its operations in one drain of the endpoint's events. Reading the clock for each
//! (about 25 ns on the development machine, `cargo run --release -p accord-bench --example
//! telemetry_record_cost`) was the largest part of what telemetry added to a finished
//! transfer. Inside a [`SharedReading`] the completions share one reading, taken at the first
//! of them and read again after [`USES_PER_READING`] completions, so an end time is early by
//! at most the work of that many completions (well under the trace's microsecond and the
//! histogram's 10 µs first bucket). Outside one, each end time is read when asked.

use super::recorder::on;
use std::cell::Cell;
use std::time::Instant;

/// Completions that share one clock reading at most.
pub const USES_PER_READING: u32 = 16;

/// The calling thread's span: `None` outside one; inside, the reading and the completions
/// that used it (a reading is taken when the count is 0).
#[derive(Clone, Copy)]
struct Span {
    at: Instant,
    uses: u32,
}

thread_local! {
    static SPAN: Cell<Option<Option<Span>>> = const { Cell::new(None) };
}

/// While alive, [`end_time`] on this thread shares readings. Nothing when telemetry is off.
pub(crate) struct SharedReading(());

impl SharedReading {
    /// Opens a span on this thread (`None`, costing one atomic load, when telemetry is off).
    pub(crate) fn begin() -> Option<SharedReading> {
        Self::begin_if(on())
    }

    fn begin_if(enabled: bool) -> Option<SharedReading> {
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

/// Now, for a transfer that just finished: this span's shared reading, or a fresh one.
pub(crate) fn end_time() -> Instant {
    SPAN.try_with(|s| match s.get() {
        None => Instant::now(),
        Some(Some(Span { at, uses })) if uses < USES_PER_READING => {
            s.set(Some(Some(Span { at, uses: uses + 1 })));
            at
        }
        Some(_) => {
            let at = Instant::now();
            s.set(Some(Some(Span { at, uses: 1 })));
            at
        }
    })
    .unwrap_or_else(|_| Instant::now())
}

#[cfg(test)]
mod tests;
