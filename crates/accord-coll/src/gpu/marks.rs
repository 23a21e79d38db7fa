//! Stream marks: cheap completion tickets for work a framework queues on a stream of its own.
//!
//! Why: `accord.torch` queues every GPU op on a stream of the group's own behind the caller's
//! current stream, and hands back a work object the caller may wait on. Done with PyTorch's
//! stream and event objects, the joining, the stream switch and a fresh event for each op cost
//! about 30 µs of the calling thread per op on 2xH200 (`scripts/device/torch_op_cost_probe.py`),
//! and DDP's step is bound by that thread (its autograd hooks run there). Here the join reuses
//! one event, and completion is a counter: after op `k` the stream stores `k` into a pinned word
//! (a stream memory operation), so "op `k` is done" is "the word is at least `k`", which the
//! host reads and another stream waits for (`cuStreamWaitValue64`), with nothing allocated.
//!
//! Valid only while every marked op goes to one stream, in order (the word holds the last
//! stored value, not a maximum): the caller keeps one stream per marks.

use std::sync::Mutex;

use accord_cuda::{Event, EventKind, Gpu, Stream};

use super::error::GpuResult;
use super::words::PinnedWords;

/// One stream's marks: the event that joins it behind another stream, and the mark word.
#[derive(Debug)]
pub struct StreamMarks {
    /// Recorded on the stream to join behind, waited for by the marked stream; reused (a wait
    /// takes the event's state when it is queued). Its lock also orders numbering with queuing.
    join: Mutex<(Event, u64)>,
    word: PinnedWords,
}

impl StreamMarks {
    /// Marks in `gpu`'s context (the caller's), word 0.
    pub fn new(gpu: &Gpu) -> GpuResult<StreamMarks> {
        let word = PinnedWords::new(gpu, 1)?;
        Ok(StreamMarks { join: Mutex::new((Event::new(gpu, EventKind::SyncOnly)?, 0)), word })
    }

    /// Makes `stream` wait for the work queued on `after` so far.
    pub fn join(&self, stream: &Stream, after: &Stream) -> GpuResult<()> {
        let guard = self.join.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.record(after)?;
        stream.wait_event(&guard.0)?;
        Ok(())
    }

    /// Queues the next mark on `stream` (after the work queued there so far) and returns it.
    pub fn mark(&self, stream: &Stream) -> GpuResult<u64> {
        let mut guard = self.join.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = guard.1 + 1;
        stream.write_value_u64(self.word.ptr(0), ticket)?;
        guard.1 = ticket;
        Ok(ticket)
    }

    /// Whether the marked stream passed mark `ticket`.
    pub fn reached(&self, ticket: u64) -> bool {
        self.word.load(0) >= ticket
    }

    /// Makes `stream` wait until the marked stream passed mark `ticket`.
    pub fn wait(&self, stream: &Stream, ticket: u64) -> GpuResult<()> {
        Ok(stream.wait_value_u64_geq(self.word.ptr(0), ticket)?)
    }
}
