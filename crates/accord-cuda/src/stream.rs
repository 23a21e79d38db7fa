//! Engine-owned streams and events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::context::Gpu;
use crate::device_ptr::DevicePtr;
use crate::error::{CudaError, Result};
use crate::ffi::batch_copy;
use crate::ffi::driver::{self, RawEvent, RawStream};

/// Copies per `cuMemcpyBatchAsync` call of [`Stream::copy_many_unchecked`].
pub const COPIES_PER_BATCH_CALL: usize = 4096;
/// Set once the driver refused `cuMemcpyBatchAsync`: batches go one copy a call from then on.
static BATCH_COPY_REFUSED: AtomicBool = AtomicBool::new(false);
/// Set once the driver refused `cuMemcpy3DBatchAsync` for 2D copies: they go one
/// `cuMemcpy2DAsync` each from then on.
static BATCH_2D_REFUSED: AtomicBool = AtomicBool::new(false);
/// Set once the driver refused `cuStreamBatchMemOp`: stores go one a call from then on.
static BATCH_STORES_REFUSED: AtomicBool = AtomicBool::new(false);

/// Longest sleep between two polls in [`Event::wait_timeout`].
pub const EVENT_POLL_SLEEP_MAX: Duration = Duration::from_micros(200);

/// A non-blocking stream owned by this crate (it does not synchronise with the
/// legacy default stream). Destroyed on drop; work already queued completes.
#[derive(Debug)]
pub struct Stream {
    gpu: Gpu,
    raw: RawStream,
    /// A framework's stream ([`Stream::borrow_raw`]): never destroyed here.
    borrowed: bool,
}

impl Stream {
    /// Creates a stream on `gpu`.
    pub fn new(gpu: &Gpu) -> Result<Stream> {
        gpu.bind()?;
        let raw = driver::stream_create_non_blocking()?;
        Ok(Stream { gpu: gpu.clone(), raw, borrowed: false })
    }

    /// A handle on a stream someone else created (PyTorch's current stream, say), so work can be
    /// ordered on it; dropping the handle leaves the stream to its owner.
    ///
    /// # Contract
    /// `raw` must be a live `CUstream` (or 0, the legacy default stream) of `gpu`'s context, and
    /// stay alive as long as the handle does.
    pub fn borrow_raw(gpu: &Gpu, raw: u64) -> Result<Stream> {
        gpu.bind()?;
        Ok(Stream { gpu: gpu.clone(), raw: driver::raw_stream_from_address(raw), borrowed: true })
    }

    /// The GPU this stream belongs to.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Blocks until all work queued on the stream completed.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        driver::stream_synchronize(self.raw)
    }

    /// Makes this stream wait, on the device, for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.gpu.bind()?;
        driver::stream_wait_event(self.raw, event.raw)
    }

    /// Whether all queued work completed; an error when the stream met a fault (its context
    /// is then unusable), so a poller can fail what it waits for instead of waiting for ever.
    pub fn query(&self) -> Result<bool> {
        self.gpu.bind()?;
        driver::stream_query(self.raw)
    }

    /// Queues a store of `value` to the 8 bytes at `dst` once the work queued before it
    /// completed, with a memory barrier first (`cuStreamWriteValue64`): the way to publish "the
    /// copies before this landed" to a GPU or host that polls `dst`, with no kernel and no host
    /// round trip. `dst` is device memory (this GPU's, a peer's mapped here) or mapped pinned
    /// host memory; a context must be current on the calling thread ([`Gpu::bind`]).
    pub fn write_value_u64(&self, dst: DevicePtr, value: u64) -> Result<()> {
        driver::stream_write_value64(self.raw, dst.0, value)
    }

    /// Holds later work on the stream until the 64-bit word at `addr` (device memory, or pinned
    /// host memory mapped for the device) is at least `value`. The GPU's front end polls the
    /// word: no kernel, no SM, no host callback. A context must be current.
    pub fn wait_value_u64_geq(&self, addr: DevicePtr, value: u64) -> Result<()> {
        driver::stream_wait_value64_geq(self.raw, addr.0, value)
    }

    /// Queues several stores as [`Stream::write_value_u64`] does, in this order, in as few driver
    /// calls as the driver allows: one `cuStreamBatchMemOp` per 255 stores, or, once a driver
    /// refused the batched call, one `cuStreamWriteValue64` each for the rest of the process.
    /// Returns the driver calls it took. A context must be current.
    pub fn write_values_u64(&self, stores: &[(DevicePtr, u64)]) -> Result<usize> {
        if stores.len() < 2 || BATCH_STORES_REFUSED.load(Ordering::Relaxed) {
            for &(dst, value) in stores {
                self.write_value_u64(dst, value)?;
            }
            return Ok(stores.len());
        }
        let mut calls = 0;
        for chunk in stores.chunks(driver::STREAM_MEM_OPS_PER_CALL_MAX) {
            let raw: Vec<(u64, u64)> = chunk.iter().map(|&(p, v)| (p.0, v)).collect();
            if driver::stream_write_values64(self.raw, &raw).is_ok() {
                calls += 1;
                continue;
            }
            BATCH_STORES_REFUSED.store(true, Ordering::Relaxed);
            for &(dst, value) in chunk {
                self.write_value_u64(dst, value)?;
            }
            calls += chunk.len();
        }
        Ok(calls)
    }

    /// Queues a copy of `len_bytes` between two device addresses usable in this stream's
    /// context, without the range checks of [`crate::copy_peer_async`] (two driver queries a
    /// copy): for hot paths whose ranges were checked once against their allocations. A context
    /// must be current on the calling thread.
    ///
    /// # Safety
    /// `src..+len_bytes` and `dst..+len_bytes` must lie in live allocations reachable from this
    /// context (device memory, or a peer's mapped here) for as long as the copy runs.
    #[allow(unsafe_code)]
    pub unsafe fn copy_unchecked(&self, dst: DevicePtr, src: DevicePtr, len_bytes: usize) -> Result<()> {
        driver::memcpy_dtod_async(dst.0, src.0, len_bytes, self.raw)
    }

    /// Queues many device-to-device copies, each `(dst, src, len)`: they start after the work
    /// queued before them and may run in any order among themselves. In as few driver calls as
    /// the driver allows: `cuMemcpyBatchAsync`, [`COPIES_PER_BATCH_CALL`] copies a call (a call
    /// costs microseconds, a small copy's bytes nanoseconds), or, once a driver refused the
    /// batched call (drivers before CUDA 12.8 lack it), one `cuMemcpyDtoDAsync` each for the
    /// rest of the process. Returns the driver calls it took. A context must be current.
    ///
    /// # Safety
    /// As [`Stream::copy_unchecked`], for every copy.
    #[allow(unsafe_code)]
    pub unsafe fn copy_many_unchecked(&self, copies: &[(DevicePtr, DevicePtr, usize)]) -> Result<usize> {
        let mut calls = 0;
        let mut queued = 0;
        if copies.len() >= 2 && !BATCH_COPY_REFUSED.load(Ordering::Relaxed) {
            for chunk in copies.chunks(COPIES_PER_BATCH_CALL) {
                let dsts = chunk.iter().map(|c| c.0 .0).collect();
                let srcs = chunk.iter().map(|c| c.1 .0).collect();
                let sizes = chunk.iter().map(|c| c.2).collect();
                if batch_copy::memcpy_batch_async(dsts, srcs, sizes, self.gpu.ordinal() as u32, self.raw).is_err() {
                    BATCH_COPY_REFUSED.store(true, Ordering::Relaxed);
                    break;
                }
                calls += 1;
                queued += chunk.len();
            }
        }
        for &(dst, src, len) in &copies[queued..] {
            // Safety: forwarded to the caller.
            unsafe { self.copy_unchecked(dst, src, len) }?;
            calls += 1;
        }
        Ok(calls)
    }

    /// Queues one 2D copy between device addresses usable in this stream's context
    /// (`cuMemcpy2DAsync`, copy engine): `height` rows of `width` bytes, row `r` read at
    /// `src + r * src_pitch` and written at `dst + r * dst_pitch`. One call and one copy-engine
    /// operation for what would be `height` copies: where a copy's fixed cost dominates its bytes
    /// (KV pieces of 32 KiB at strides of whole cache planes), this is the difference between an
    /// eighth of the copy ceiling and nearly all of it. Both pitches must be at least `width`
    /// and at most [`Gpu::max_pitch`]. A context must be current on the calling thread.
    ///
    /// # Safety
    /// Every row, on both sides, must lie in live allocations reachable from this context for as
    /// long as the copy runs.
    #[allow(unsafe_code)]
    pub unsafe fn copy_2d_unchecked(
        &self,
        dst: DevicePtr,
        dst_pitch: usize,
        src: DevicePtr,
        src_pitch: usize,
        width: usize,
        height: usize,
    ) -> Result<()> {
        if width > dst_pitch.min(src_pitch) {
            return Err(CudaError::InvalidArgument {
                what: format!("a 2D copy's rows ({width} bytes) are wider than its pitches ({dst_pitch}, {src_pitch})"),
            });
        }
        driver::memcpy_2d_dtod_async(dst.0, dst_pitch, src.0, src_pitch, width, height, self.raw)
    }

    /// Queues many 2D device-to-device copies ([`Copy2d`]) in as few driver calls as the
    /// driver allows: `cuMemcpy3DBatchAsync`, up to 1,024 copies a call (a KV request of 2,048
    /// blocks is 2,048 2D copies: two calls instead of 2,048), or, where the driver lacks it or
    /// refused a batch, one `cuMemcpy2DAsync` each (for the rest of the process once refused).
    /// They start after the work queued before them and run in any order among themselves.
    /// Returns the driver calls taken; on an error, how many copies were queued before it, so a
    /// caller can send the rest another way. A context must be current.
    ///
    /// # Safety
    /// As [`Stream::copy_2d_unchecked`], for every copy.
    #[allow(unsafe_code)]
    pub unsafe fn copy_2d_many_unchecked(&self, copies: &[Copy2d]) -> std::result::Result<usize, (usize, CudaError)> {
        let mut calls = 0;
        let mut queued = 0;
        if let Some(bad) = copies.iter().position(|c| c.width > c.dst_pitch.min(c.src_pitch)) {
            let c = copies[bad];
            let what = format!(
                "a 2D copy's rows ({} bytes) are wider than its pitches ({}, {})",
                c.width, c.dst_pitch, c.src_pitch
            );
            return Err((0, CudaError::InvalidArgument { what }));
        }
        if copies.len() >= 2 && !BATCH_2D_REFUSED.load(Ordering::Relaxed) {
            for chunk in copies.chunks(batch_copy::COPIES_2D_PER_BATCH_CALL) {
                let raw: Vec<batch_copy::RawCopy2d> = chunk
                    .iter()
                    .map(|c| batch_copy::RawCopy2d {
                        dst: c.dst.0,
                        dst_pitch: c.dst_pitch,
                        src: c.src.0,
                        src_pitch: c.src_pitch,
                        width: c.width,
                        height: c.height,
                    })
                    .collect();
                if batch_copy::memcpy_2d_batch_async(&raw, self.gpu.ordinal() as u32, self.raw).is_err() {
                    BATCH_2D_REFUSED.store(true, Ordering::Relaxed);
                    break;
                }
                calls += 1;
                queued += chunk.len();
            }
        }
        for c in &copies[queued..] {
            // Safety: forwarded to the caller.
            unsafe { self.copy_2d_unchecked(c.dst, c.dst_pitch, c.src, c.src_pitch, c.width, c.height) }
                .map_err(|e| (queued, e))?;
            calls += 1;
            queued += 1;
        }
        Ok(calls)
    }

    pub(crate) fn raw(&self) -> RawStream {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
        if let Ok(_restore) = self.gpu.bind_scoped() {
            let _ = driver::stream_destroy(self.raw);
        }
    }
}

/// One 2D copy of [`Stream::copy_2d_many_unchecked`]: `height` rows of `width` bytes, row `r`
/// read at `src + r * src_pitch` and written at `dst + r * dst_pitch`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Copy2d {
    /// Row 0's destination.
    pub dst: DevicePtr,
    /// Bytes from one destination row to the next (at least `width`).
    pub dst_pitch: usize,
    /// Row 0's source.
    pub src: DevicePtr,
    /// Bytes from one source row to the next (at least `width`).
    pub src_pitch: usize,
    /// Bytes of each row.
    pub width: usize,
    /// Rows.
    pub height: usize,
}

/// Whether this process's driver batches 2D copies (`cuMemcpy3DBatchAsync`, CUDA 12.8 and later)
/// and has not refused a batch yet; the error says why not. For a caller that logs, once, which
/// way its 2D copies go.
pub fn copy_2d_batch_support() -> std::result::Result<(), String> {
    driver::ensure_driver().map_err(|e| e.to_string())?;
    if BATCH_2D_REFUSED.load(Ordering::Relaxed) {
        return Err("the driver refused a cuMemcpy3DBatchAsync batch earlier in this process".into());
    }
    batch_copy::memcpy_2d_batch_supported()
}

/// Whether an event keeps timestamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Timestamps kept: usable with [`Event::elapsed_ms_since`].
    Timing,
    /// No timestamps: cheaper, for ordering and host waits only.
    SyncOnly,
}

/// A CUDA event: records a point in a stream, which other streams or the host
/// can wait for.
#[derive(Debug)]
pub struct Event {
    gpu: Gpu,
    raw: RawEvent,
    kind: EventKind,
}

impl Event {
    /// Creates an event on `gpu`.
    pub fn new(gpu: &Gpu, kind: EventKind) -> Result<Event> {
        gpu.bind()?;
        let raw = driver::event_create(kind == EventKind::Timing, false)?;
        Ok(Event { gpu: gpu.clone(), raw, kind })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        if !stream.gpu().same_device(&self.gpu) {
            return Err(CudaError::InvalidArgument {
                what: "an event can only be recorded on a stream of its own GPU; create the event on that GPU".into(),
            });
        }
        self.gpu.bind()?;
        driver::event_record(self.raw, stream.raw())
    }

    /// Whether the recorded work completed (true for a never-recorded event).
    pub fn is_complete(&self) -> Result<bool> {
        self.gpu.bind()?;
        driver::event_query(self.raw)
    }

    /// Blocks until the recorded work completed.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        driver::event_synchronize(self.raw)
    }

    /// Polls until the recorded work completed or `timeout` passed, sleeping
    /// at most [`EVENT_POLL_SLEEP_MAX`] between polls.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut sleep = Duration::from_micros(1);
        loop {
            if self.is_complete()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(CudaError::Timeout { what: "event wait", timeout_ms: timeout.as_millis() as u64 });
            }
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(EVENT_POLL_SLEEP_MAX);
        }
    }

    /// Milliseconds from `start` to this event; both must be timing events
    /// that completed.
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        if self.kind != EventKind::Timing || start.kind != EventKind::Timing {
            return Err(CudaError::InvalidArgument {
                what: "elapsed time needs two events created with EventKind::Timing".into(),
            });
        }
        self.gpu.bind()?;
        driver::event_elapsed_ms(start.raw, self.raw)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_restore) = self.gpu.bind_scoped() {
            let _ = driver::event_destroy(self.raw);
        }
    }
}
