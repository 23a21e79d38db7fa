//! The progress thread: takes queued collectives in call order, waits for
//! the user's stream to reach each one, runs its plan (copy-engine pushes
//! into peers' buffers, flag-board signalling, reductions) and releases the
//! user's stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use accord_cuda::{
    copy_peer_async, DevicePtr, Event, EventKind, Gpu, Reducer, StallGate, StallOutcome, StallTicket, Stream,
};

use super::board::{Board, Deadline, Slot};
use super::caller_reduce::{queue_reduction, Buffers, CallerReduce, ChunkNumbers};
use super::error::{GpuCollError, GpuResult};
use super::plan::{Buf, Phase, Plan, ReduceWork};
use super::poll::poll_until;

use super::registry::PeerMappings;

/// Pushes at least this long are split across a peer's streams.
pub const SPLIT_BYTES_MIN: usize = 4 << 20;

/// Where a host-function gate stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GateState {
    Waiting,
    Reached,
    Done,
    Abandoned,
}

/// The handshake between a host function on the user's stream and the
/// progress thread.
#[derive(Debug)]
pub struct HostGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl HostGate {
    /// A gate the stream has not reached.
    pub fn new() -> Arc<HostGate> {
        Arc::new(HostGate { state: Mutex::new(GateState::Waiting), changed: Condvar::new() })
    }

    fn set(&self, state: GateState) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
        self.changed.notify_all();
    }

    /// Runs in the host function: announces the stream reached the
    /// collective and blocks the stream until it is done (or `timeout`).
    pub fn reach_and_wait(&self, timeout: Duration) {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *guard == GateState::Waiting {
            *guard = GateState::Reached;
        }
        self.changed.notify_all();
        let (mut guard, _) = self
            .changed
            .wait_timeout_while(guard, timeout, |s| *s == GateState::Reached)
            .unwrap_or_else(|p| p.into_inner());
        if *guard == GateState::Reached {
            *guard = GateState::Abandoned;
        }
    }

    /// Lets the host function return.
    pub fn finish(&self) {
        self.set(GateState::Done);
    }

    fn wait_reached(&self, deadline: Deadline) -> GpuResult<()> {
        let guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let left = deadline.at.saturating_duration_since(Instant::now());
        let (guard, _) = self
            .changed
            .wait_timeout_while(guard, left, |s| *s == GateState::Waiting)
            .unwrap_or_else(|p| p.into_inner());
        match *guard {
            GateState::Waiting => Err(GpuCollError::Timeout {
                what: "the user's stream to reach the collective (host function)".into(),
                waited: deadline.budget,
            }),
            _ => Ok(()),
        }
    }
}

/// How the user's stream hands over and gets released.
#[derive(Debug)]
pub enum Start {
    /// A host function blocks the stream ([`super::StreamOrder::HostFn`]).
    HostFn(Arc<HostGate>),
    /// An event marks the call; a stall kernel holds later work ([`super::StreamOrder::Stall`]).
    Stall {
        /// Recorded on the user's stream at the call.
        event: Event,
        /// The stall kernel queued right after it.
        ticket: StallTicket,
        /// The gate that releases it.
        gate: Arc<StallGate>,
    },
    /// The user's stream writes `ticket` into the gate's `reached` word and then waits until its
    /// `released` word is at least `ticket` ([`super::StreamOrder::WaitValue`]).
    WaitValue {
        /// This call's number, in queue order.
        ticket: u64,
        /// The two words.
        gate: Arc<MemoryGate>,
    },
}

/// Two 64-bit words in pinned host memory, mapped for the GPU: the user's stream writes a
/// call's number into `reached` once the work before the call is done (`cuStreamWriteValue64`,
/// ordered after that work), and waits (`cuStreamWaitValue64`) until the progress thread wrote
/// at least that number into `released`. Both are stream memory operations: no kernel, no SM,
/// no driver callback thread, and the progress thread reads and writes plain memory, never
/// calling the driver for them, so nothing it waits on can wait on a driver lock that a
/// thread blocked on the held stream holds. Calls are numbered in queue order and run in that
/// order, so one counter each way suffices.
pub struct MemoryGate {
    words: super::words::PinnedWords,
}

impl std::fmt::Debug for MemoryGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryGate").field("reached", &self.reached()).field("released", &self.released()).finish()
    }
}

impl MemoryGate {
    const REACHED: usize = 0;
    const RELEASED: usize = 1;

    /// Both words 0, on `gpu` (a stale `released` word would let streams run ahead of their
    /// collectives).
    pub fn new(gpu: &Gpu) -> GpuResult<MemoryGate> {
        Ok(MemoryGate { words: super::words::PinnedWords::new(gpu, 2)? })
    }

    /// Where the stream writes the number of the call it reached.
    pub fn reached_ptr(&self) -> DevicePtr {
        self.words.ptr(Self::REACHED)
    }

    /// Where the stream waits for its call's release.
    pub fn released_ptr(&self) -> DevicePtr {
        self.words.ptr(Self::RELEASED)
    }

    /// The last call number the stream reached.
    pub fn reached(&self) -> u64 {
        self.words.load(Self::REACHED)
    }

    /// The last call number released.
    pub fn released(&self) -> u64 {
        self.words.load(Self::RELEASED)
    }

    /// Releases every stream waiting for a number up to `ticket` (never lowers the word).
    pub fn release(&self, ticket: u64) {
        if let Some(w) = self.words.word(Self::RELEASED) {
            w.fetch_max(ticket, Ordering::Release);
        }
    }

    /// Waits until the stream reached call `ticket`, or the deadline.
    pub fn wait_reached(&self, ticket: u64, deadline: Deadline) -> GpuResult<()> {
        super::poll::poll_until_spinning(
            256,
            deadline,
            || "the user's stream to reach the collective".into(),
            || Ok(self.reached() >= ticket),
        )
    }
}

/// One queued collective.
#[derive(Debug)]
pub struct Op {
    /// The schedule.
    pub plan: Plan,
    /// Send buffer start.
    pub send: DevicePtr,
    /// Receive buffer start.
    pub recv: DevicePtr,
    /// Registration of the receive buffer, and the offset inside it.
    pub recv_reg: (u64, u64),
    /// Element type and operation of reducing collectives.
    pub reduce: Option<(accord_cuda::DType, accord_cuda::ReduceOp)>,
    /// Stream-order handshake.
    pub start: Start,
    /// The chunks whose reductions the caller's stream runs ([`super::caller_reduce`]), or None
    /// where this thread reduces.
    pub caller_chunks: Option<ChunkNumbers>,
    /// Why queuing the call on the caller's stream failed part way, if it did: the call then
    /// only fails here, in queue order, so its words and its release never run ahead of the
    /// calls queued before it.
    pub doomed: Option<String>,
}

/// Messages to the progress thread.
#[derive(Debug)]
pub enum Msg {
    /// Run a collective.
    Op(Box<Op>),
    /// Close retired mappings (queued, so it runs between collectives).
    ReleaseMappings,
    /// Exit.
    Stop,
}

/// State shared between the communicator and its progress thread.
#[derive(Debug)]
pub struct Shared {
    /// The flag board.
    pub board: Board,
    /// The first error, sticky.
    pub error: Mutex<Option<String>>,
    /// Collectives finished (successfully or not).
    pub completed: AtomicU64,
    /// Peer mappings opened (cache misses).
    pub mappings_opened: AtomicU64,
}

/// The progress thread's own state.
pub struct Worker {
    /// This rank.
    pub rank: usize,
    /// Ranks.
    pub world_size: usize,
    /// This rank's GPU.
    pub gpu: Gpu,
    /// Shared state.
    pub shared: Arc<Shared>,
    /// Engine streams per peer (empty for this rank).
    pub peer_streams: Vec<Vec<Stream>>,
    /// Events, one per peer stream.
    pub peer_events: Vec<Vec<Event>>,
    /// Local copies and reductions.
    pub local_stream: Stream,
    /// Completion of the local stream.
    pub local_event: Event,
    /// This rank's scratch buffer and its registration id.
    pub scratch: (DevicePtr, u64),
    /// Reduction kernels, compiled and warmed at start-up.
    pub reducer: Option<Arc<Reducer>>,
    /// Peers' buffers.
    pub mappings: PeerMappings,
    /// Next flag-board round.
    pub seq: u64,
    /// Push phases expected from each peer so far.
    pub expected: Vec<u64>,
    /// Longest wait.
    pub op_timeout: Duration,
    /// Gather streams and per-chunk events of pipelined reductions.
    pub pipeline: super::pipeline_streams::PipelineStreams,
    /// The words through which the caller's stream reduces, where it does.
    pub caller: Option<Arc<CallerReduce>>,
}

impl Worker {
    /// Runs until [`Msg::Stop`] or the channel closes.
    pub fn run(mut self, inbox: Receiver<Msg>) {
        while let Ok(msg) = inbox.recv() {
            match msg {
                Msg::Stop => break,
                Msg::ReleaseMappings => {
                    self.mappings.close_retired();
                }
                Msg::Op(op) => {
                    let failed = self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).is_some();
                    let result = if failed { Ok(()) } else { self.execute(&op) };
                    if let Err(e) = result {
                        tracing::error!(rank = self.rank, error = %e, "GPU collective failed");
                        self.shared.board.abort_rank(self.rank);
                        self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e.to_string());
                    }
                    // A call that failed or was skipped must not leave the caller's stream
                    // waiting for chunks that will never arrive (a no-op after a success).
                    if let (Some(caller), Some(numbers)) = (&self.caller, op.caller_chunks) {
                        caller.set_all_arrived(numbers);
                        caller.finish(numbers);
                    }
                    self.release(&op.start);
                    self.shared.mappings_opened.store(self.mappings.opened_total(), Ordering::Relaxed);
                    self.shared.completed.fetch_add(1, Ordering::Release);
                }
            }
        }
    }

    fn release(&self, start: &Start) {
        match start {
            Start::HostFn(gate) => gate.finish(),
            Start::Stall { ticket, gate, .. } => gate.release(*ticket),
            Start::WaitValue { ticket, gate } => gate.release(*ticket),
        }
    }

    fn execute(&mut self, op: &Op) -> GpuResult<()> {
        if let Some(why) = &op.doomed {
            return Err(GpuCollError::QueueFailed { why: why.clone() });
        }
        let deadline = Deadline::after(self.op_timeout);
        match &op.start {
            Start::HostFn(gate) => gate.wait_reached(deadline)?,
            Start::Stall { event, .. } => wait_event(event, deadline, "the user's stream to reach the collective")?,
            Start::WaitValue { ticket, gate } => gate.wait_reached(*ticket, deadline)?,
        }
        match &op.plan {
            Plan::Copy(phase) => {
                let seq = self.next_round(op);
                self.run_phase(op, seq, phase, deadline)?;
            }
            Plan::Reduce(rounds) => {
                let mut first_chunk = 0u64;
                for round in rounds {
                    let seq = self.next_round(op);
                    self.run_reduce_round(op, seq, round, first_chunk, deadline)?;
                    first_chunk += round.chunks.len() as u64;
                }
            }
        }
        if let Start::Stall { ticket, gate, .. } = &op.start {
            if gate.outcome(*ticket) == StallOutcome::TimedOut {
                return Err(GpuCollError::Timeout {
                    what: "the collective before the stall kernel gave up; later work on the stream may have run early"
                        .into(),
                    waited: deadline.budget,
                });
            }
        }
        Ok(())
    }

    fn next_round(&mut self, op: &Op) -> u64 {
        self.seq += 1;
        let slot =
            Slot { seq: self.seq, recv_reg: op.recv_reg.0, recv_offset: op.recv_reg.1, scratch_reg: self.scratch.1 };
        self.shared.board.post_ready(self.rank, slot);
        self.seq
    }

    pub(super) fn local_ptr(&self, op: &Op, buf: Buf, offset: usize) -> DevicePtr {
        match buf {
            Buf::Send => op.send.offset(offset),
            Buf::Recv => op.recv.offset(offset),
            Buf::Scratch => self.scratch.0.offset(offset),
        }
    }

    pub(super) fn remote_ptr(
        &mut self,
        dst_rank: usize,
        seq: u64,
        buf: Buf,
        offset: usize,
        deadline: Deadline,
    ) -> GpuResult<DevicePtr> {
        let board = &self.shared.board;
        board.wait_ready(dst_rank, seq, deadline)?;
        let slot = board.read_slot(dst_rank, seq)?;
        self.mappings.observe_epoch(dst_rank, board.dereg_epoch(dst_rank))?;
        let (id, base_offset) = match buf {
            Buf::Recv => (slot.recv_reg, slot.recv_offset as usize),
            Buf::Scratch => (slot.scratch_reg, 0),
            Buf::Send => {
                return Err(GpuCollError::Protocol { rank: dst_rank, what: "a plan pushed into a send buffer".into() })
            }
        };
        let base = self.mappings.resolve(&self.shared.board, dst_rank, id)?;
        Ok(base.offset(base_offset + offset))
    }

    fn run_phase(&mut self, op: &Op, seq: u64, phase: &Phase, deadline: Deadline) -> GpuResult<()> {
        let mut used = vec![0usize; self.world_size];
        let mut local_used = false;
        for push in &phase.pushes {
            let src = self.local_ptr(op, push.src, push.src_offset);
            if push.dst_rank == self.rank {
                let dst = self.local_ptr(op, push.dst, push.dst_offset);
                if dst != src {
                    copy_peer_async(dst, &self.gpu, src, &self.gpu, push.len, &self.local_stream)?;
                    local_used = true;
                }
                continue;
            }
            let dst = self.remote_ptr(push.dst_rank, seq, push.dst, push.dst_offset, deadline)?;
            let streams = &self.peer_streams[push.dst_rank];
            let pieces = if push.len >= SPLIT_BYTES_MIN { streams.len() } else { 1 };
            let piece = push.len.div_ceil(pieces).next_multiple_of(256).min(push.len);
            let mut at = 0;
            for stream in streams.iter().take(pieces) {
                if at >= push.len {
                    break;
                }
                let len = piece.min(push.len - at);
                // Same-context pointers: the IPC mapping lives in this GPU's context; the
                // copy engine writes over NVLink into the peer's memory.
                copy_peer_async(dst.offset(at), &self.gpu, src.offset(at), &self.gpu, len, stream)?;
                at += len;
            }
            used[push.dst_rank] = used[push.dst_rank].max(pieces);
        }
        for (peer, &count) in used.iter().enumerate() {
            for k in 0..count {
                self.peer_events[peer][k].record(&self.peer_streams[peer][k])?;
            }
        }
        if local_used {
            self.local_event.record(&self.local_stream)?;
        }
        for (peer, &count) in used.iter().enumerate() {
            for k in 0..count {
                wait_event(&self.peer_events[peer][k], deadline, "copy-engine pushes")?;
            }
            if count > 0 {
                self.shared.board.signal_done(self.rank, peer);
            }
        }
        if local_used {
            wait_event(&self.local_event, deadline, "local copy")?;
        }
        for &src in &phase.sources {
            self.expected[src] += 1;
            self.shared.board.wait_done(src, self.rank, self.expected[src], deadline)?;
        }
        Ok(())
    }

    pub(super) fn reduce(&mut self, op: &Op, work: &ReduceWork) -> GpuResult<()> {
        let reduce = op
            .reduce
            .ok_or_else(|| GpuCollError::InvalidArgument { what: "a reducing plan without an element type".into() })?;
        let at = Buffers { send: op.send, recv: op.recv, scratch: self.scratch.0, gpu: &self.gpu };
        queue_reduction(self.reducer.as_deref(), &at, work, reduce, &self.local_stream)
    }
}

/// Polls `event` (spin, then yield, then short sleeps) until complete or the deadline.
pub fn wait_event(event: &Event, deadline: Deadline, what: &str) -> GpuResult<()> {
    poll_until(deadline, || what.to_string(), || Ok(event.is_complete()?))
}

/// Engine streams and their events, indexed by peer rank.
pub type PeerStreams = (Vec<Vec<Stream>>, Vec<Vec<Event>>);

/// Creates `count` streams and events per peer (none for `rank`).
pub fn peer_streams(gpu: &Gpu, world_size: usize, rank: usize, count: usize) -> GpuResult<PeerStreams> {
    let mut streams = Vec::with_capacity(world_size);
    let mut events = Vec::with_capacity(world_size);
    for peer in 0..world_size {
        let n = if peer == rank { 0 } else { count };
        streams.push((0..n).map(|_| Stream::new(gpu)).collect::<Result<Vec<_>, _>>()?);
        events.push((0..n).map(|_| Event::new(gpu, EventKind::SyncOnly)).collect::<Result<Vec<_>, _>>()?);
    }
    Ok((streams, events))
}
