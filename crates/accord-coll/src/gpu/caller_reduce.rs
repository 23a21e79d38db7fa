//! Reductions queued on the caller's stream, in the caller's CUDA context, at call time
//! (`ACCORD_GPU_REDUCE_ON_CALLER`, with the `waitvalue` order).
//!
//! Why: with `ACCORD_GPU_PRIVATE_CONTEXT` the progress thread's work runs in a context of its
//! own, and a GPU time-slices kernels of different contexts instead of running them side by
//! side. When PyTorch's collectives were queued on a stream of their own (as DDP expects, to
//! overlap the backward pass), a DDP step on 2xH200 took 6.3-7.0 ms against 2.6-3.3 ms with the
//! collective on the compute stream (docs/results/2026-11-26-torch-gpu-path.md, stop 38); the
//! reductions and the backward pass taking turns is the suspected cause, not yet confirmed. The
//! progress thread cannot launch into the caller's context instead: there a kernel launch waits
//! for as long as another thread is blocked in a synchronous copy
//! (`scripts/device/primary_context_stall_probe.py`), which is the stall the private context
//! exists to avoid. Plain host memory never waits, and the progress thread's stream waits stay
//! in its own context.
//!
//! So the caller's thread, at call time, queues on its own stream for every chunk `j` of the
//! plan: a wait until word `arrived[j]` reaches the chunk's number, the chunk's reduction, and a
//! store of the chunk's number into word `reduced[j]`. The progress thread writes `arrived[j]`
//! (plain host memory) once every peer's slice of the chunk has landed, and its gather copies
//! wait on `reduced[j]` on the GPU (`cuStreamWaitValue64`); the end of a round waits for the
//! last chunk's `reduced` word on the host. No driver call of the progress thread touches the
//! caller's context.
//!
//! Numbers: chunks are numbered across calls in submission order (the communicator submits
//! under one lock), chunk `n` gets the value `n + 1` in word `n % WORDS`. Values only grow, waits
//! are "at least", and a call is numbered only while the chunks of unfinished calls and its own
//! fit the ring ([`CallerReduce::number`]; else the progress thread reduces it as before), so no
//! two chunks in flight share a word. A failed or skipped call sets all its `arrived` words, so
//! the caller's stream never waits past the error (it runs the reductions on whatever arrived;
//! the error is sticky and raised by the next call, as for every failed collective). A call
//! whose queuing failed part way is still handed to the progress thread, which fails it in
//! queue order ([`super::worker::Op::doomed`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use accord_cuda::{copy_peer_async, DType, DevicePtr, Gpu, PinnedHostBuffer, ReduceOp, Reducer, Stream};

use super::board::Deadline;
use super::error::{GpuCollError, GpuResult};
use super::plan::{Plan, ReduceWork};
use super::poll::poll_until;

/// Words in each ring (`arrived`, `reduced`): the most chunks one call may have.
pub const WORDS: usize = 4096;

/// The chunks one call numbered: chunk `j` of the call (counted across its rounds) is
/// [`ChunkNumbers::number`]`(j)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkNumbers {
    /// Chunks numbered before this call.
    pub base: u64,
    /// This call's chunks.
    pub count: u64,
}

impl ChunkNumbers {
    /// The value chunk `j` of the call waits for and stores (never 0, the words' start).
    pub fn number(&self, j: u64) -> u64 {
        self.base + j + 1
    }

    /// The word chunk `j` of the call uses, in either ring.
    pub fn word(&self, j: u64) -> usize {
        ((self.base + j) % WORDS as u64) as usize
    }
}

/// The two word rings and the caller-context reduction kernels of one communicator.
pub struct CallerReduce {
    /// `arrived` in words `0..WORDS`, `reduced` in `WORDS..2 * WORDS`; pinned, mapped for the
    /// device and portable to every context (`cuMemHostAlloc` with `PORTABLE | DEVICEMAP`).
    words: PinnedHostBuffer,
    /// Built in the caller's context.
    reducer: Arc<Reducer>,
    /// Which chunks are numbered and which finished.
    numbering: Numbering,
}

/// The numbering of chunks across calls, and its bound: the chunks of calls not yet finished
/// never hold more than [`WORDS`] words.
#[derive(Debug, Default)]
pub struct Numbering {
    /// Chunks numbered so far.
    numbered: AtomicU64,
    /// Chunks of calls the progress thread finished (every word of theirs set): numbers below
    /// this are no longer waited on, so their words may be reused.
    finished: AtomicU64,
}

impl Numbering {
    /// Numbers the next `count` chunks (call under the communicator's submission lock), or None
    /// for no chunks, or while the calls not yet finished hold too many words: no two chunks in
    /// flight share a word, so letting one call's chunks past (a failure) never lets another's.
    pub fn number(&self, count: u64) -> Option<ChunkNumbers> {
        let base = self.numbered.load(Ordering::Relaxed);
        let in_flight = base - self.finished.load(Ordering::Acquire).min(base);
        if !CallerReduce::fits(count) || in_flight + count > WORDS as u64 {
            return None;
        }
        self.numbered.store(base + count, Ordering::Relaxed);
        Some(ChunkNumbers { base, count })
    }

    /// Records that the progress thread is done with the call `numbers` (calls finish in
    /// number order).
    pub fn finish(&self, numbers: ChunkNumbers) {
        self.finished.fetch_max(numbers.base + numbers.count, Ordering::Release);
    }
}

impl std::fmt::Debug for CallerReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerReduce").field("numbering", &self.numbering).finish()
    }
}

/// Chunks of a reducing plan, across its rounds (0 for a copy plan).
pub fn chunk_count(plan: &Plan) -> u64 {
    match plan {
        Plan::Copy(_) => 0,
        Plan::Reduce(rounds) => rounds.iter().map(|r| r.chunks.len() as u64).sum(),
    }
}

impl CallerReduce {
    /// Words zeroed, `reducer` built in the caller's context (`callers_gpu`).
    pub fn new(callers_gpu: &Gpu, reducer: Arc<Reducer>) -> GpuResult<CallerReduce> {
        let words = PinnedHostBuffer::alloc(callers_gpu, 2 * WORDS * 8)?;
        for index in 0..2 * WORDS {
            words.atomic_u64(index)?.store(0, Ordering::Release);
        }
        Ok(CallerReduce { words, reducer, numbering: Numbering::default() })
    }

    /// Whether a call of `chunks` chunks can reduce on the caller's stream.
    pub fn fits(chunks: u64) -> bool {
        chunks > 0 && chunks <= WORDS as u64
    }

    /// See [`Numbering::number`].
    pub fn number(&self, count: u64) -> Option<ChunkNumbers> {
        self.numbering.number(count)
    }

    /// See [`Numbering::finish`].
    pub fn finish(&self, numbers: ChunkNumbers) {
        self.numbering.finish(numbers);
    }

    fn atomic(&self, index: usize) -> Option<&AtomicU64> {
        self.words.atomic_u64(index).ok()
    }

    fn arrived_ptr(&self, word: usize) -> DevicePtr {
        self.words.device_ptr().offset(8 * word)
    }

    /// Where chunk `word`'s reduction stores its number (device address of the pinned word).
    pub fn reduced_ptr(&self, word: usize) -> DevicePtr {
        self.words.device_ptr().offset(8 * (WORDS + word))
    }

    /// Lets the caller's stream reduce chunk `j` of the call `numbers`.
    pub fn set_arrived(&self, numbers: ChunkNumbers, j: u64) {
        if let Some(w) = self.atomic(numbers.word(j)) {
            w.fetch_max(numbers.number(j), Ordering::Release);
        }
    }

    /// Lets the caller's stream run past every chunk of the call (after a failure or a skip).
    pub fn set_all_arrived(&self, numbers: ChunkNumbers) {
        for j in 0..numbers.count {
            self.set_arrived(numbers, j);
        }
    }

    /// Lets every stream run past every chunk, numbered or not: the caller's streams waiting
    /// on `arrived` and the progress thread's gather streams waiting on `reduced` (a chunk
    /// whose reduction never ran, say because the caller's stream was stuck, would otherwise
    /// hold them with no bound). For the communicator's drop, before the words' memory goes
    /// (its release waits for the GPU, which must not wait on them).
    pub fn release_all(&self) {
        for index in 0..2 * WORDS {
            if let Some(w) = self.atomic(index) {
                w.store(u64::MAX, Ordering::Release);
            }
        }
    }

    /// Whether chunk `j`'s reduction is done.
    pub fn is_reduced(&self, numbers: ChunkNumbers, j: u64) -> bool {
        self.atomic(WORDS + numbers.word(j)).is_some_and(|w| w.load(Ordering::Acquire) >= numbers.number(j))
    }

    /// Polls (spin, then yield, then short sleeps) until chunk `j` is reduced, or the deadline.
    pub fn wait_reduced(&self, numbers: ChunkNumbers, j: u64, deadline: Deadline) -> GpuResult<()> {
        poll_until(
            deadline,
            || format!("the caller's stream to reduce chunk {j} of {}", numbers.count),
            || Ok(self.is_reduced(numbers, j)),
        )
    }

    /// Queues on the caller's `stream` every chunk of `plan`: wait for `arrived`, reduce (into
    /// `recv` from `send` and `scratch`), store into `reduced`. The caller's context must be
    /// current. On an error the stream may hold part of it; the caller then sets every
    /// `arrived` word of the call ([`CallerReduce::set_all_arrived`]).
    pub fn queue(
        &self,
        plan: &Plan,
        numbers: ChunkNumbers,
        at: &Buffers<'_>,
        reduce: (DType, ReduceOp),
        stream: &Stream,
    ) -> GpuResult<()> {
        let Plan::Reduce(rounds) = plan else {
            return Ok(());
        };
        let mut j = 0u64;
        for round in rounds {
            for chunk in &round.chunks {
                stream.wait_value_u64_geq(self.arrived_ptr(numbers.word(j)), numbers.number(j))?;
                if let Some(work) = &chunk.reduce {
                    queue_reduction(Some(&self.reducer), at, work, reduce, stream)?;
                }
                stream.write_value_u64(self.reduced_ptr(numbers.word(j)), numbers.number(j))?;
                j += 1;
            }
        }
        Ok(())
    }
}

/// The buffers a reduction reads and writes: the call's send and receive buffers and the
/// scratch the peers pushed into.
#[derive(Clone, Copy, Debug)]
pub struct Buffers<'a> {
    /// Send buffer start.
    pub send: DevicePtr,
    /// Receive buffer start.
    pub recv: DevicePtr,
    /// Scratch buffer start.
    pub scratch: DevicePtr,
    /// The GPU (context) the copies of a one-rank reduction are issued in.
    pub gpu: &'a Gpu,
}

/// Queues `work` on `stream`: `recv[dst] = send[own] op scratch[0] op scratch[1] ...` (an average
/// sums all but the last step), or a copy where there is nothing to combine (which needs no
/// kernels: `reducer` may be None there).
pub fn queue_reduction(
    reducer: Option<&Reducer>,
    at: &Buffers<'_>,
    work: &ReduceWork,
    (dtype, reduce_op): (DType, ReduceOp),
    stream: &Stream,
) -> GpuResult<()> {
    let dst = at.recv.offset(work.dst_offset);
    let own = at.send.offset(work.own_offset);
    if work.scratch_offsets.is_empty() {
        if dst != own {
            copy_peer_async(dst, at.gpu, own, at.gpu, work.count * dtype.size_bytes(), stream)?;
        }
        return Ok(());
    }
    let reducer = reducer.ok_or_else(|| GpuCollError::InvalidArgument {
        what: "the reduction kernels could not be built at start-up (NVRTC); check ACCORD_CUDA_LIB_DIRS".into(),
    })?;
    let last = work.scratch_offsets.len() - 1;
    let mut a = own;
    for (i, offset) in work.scratch_offsets.iter().enumerate() {
        let step_op = match reduce_op {
            ReduceOp::Avg { .. } if i < last => ReduceOp::Sum,
            other => other,
        };
        reducer.reduce(dst, a, at.scratch.offset(*offset), work.count, dtype, step_op, stream)?;
        a = dst;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_numbers_start_at_one_and_wrap_the_ring() {
        let first = ChunkNumbers { base: 0, count: 3 };
        assert_eq!((first.number(0), first.word(0)), (1, 0));
        assert_eq!((first.number(2), first.word(2)), (3, 2));
        let later = ChunkNumbers { base: WORDS as u64 - 1, count: 2 };
        assert_eq!(later.word(0), WORDS - 1);
        assert_eq!(later.word(1), 0, "the next chunk reuses word 0");
        assert!(later.number(1) > first.number(0), "with a larger number than the word held before");
    }

    #[test]
    fn chunks_in_flight_never_share_a_word() {
        // The numbering and its bound alone, on a ring of words no GPU needs to see.
        let ring = Numbering::default();
        let first = ring.number(WORDS as u64 - 10).expect("fits an empty ring");
        assert_eq!(ring.number(11), None, "11 more would reuse a word the first call still waits on");
        let second = ring.number(10).expect("10 more fill the ring exactly");
        assert_eq!(second.base, first.count);
        ring.finish(first);
        let third = ring.number(WORDS as u64 - 10).expect("the first call's words are free again");
        assert_eq!(third.word(0), 0, "the ring wraps to the first call's words");
        assert_eq!(ring.number(0), None, "a call with no chunks is not numbered");
    }

    #[test]
    fn only_calls_that_fit_the_ring_reduce_on_the_caller() {
        assert!(!CallerReduce::fits(0));
        assert!(CallerReduce::fits(1));
        assert!(CallerReduce::fits(WORDS as u64));
        assert!(!CallerReduce::fits(WORDS as u64 + 1));
    }
}
