//! Direct collectives: all_reduce and reduce_scatter queued whole on the caller's stream at call
//! time, with no host thread in their path (`ACCORD_GPU_DIRECT_BYTES`, for calls whose push to
//! each peer fits a slot of the inbox).
//!
//! all_gather is not among them: it needs no reduction, so the progress thread's path already
//! copies each block once, straight into the peer's receive buffer, while a direct all_gather
//! would copy twice (into the inbox, then into place). Built and measured that way on 2xH200,
//! it was no faster at any size and 15-16% slower from 4 MiB (GPU 29-151 µs against 26-131 µs
//! a call from 4 KiB to 64 MiB, `accord-gpu-bench --order waitvalue`,
//! docs/results/2026-11-27-direct-gpu-calls.md).
//!
//! Why: on the progress-thread path ([`super::worker`]) a host thread takes part in every step
//! (it sees the stream reach the call, moves the bytes, tells the peers, releases the stream),
//! so an all_reduce of 4 KiB to 1 MiB took 41-45 µs of GPU time on 2xH200, and 80-84 µs at
//! 4 MiB. Direct, the same calls took 25-31 µs and 43 µs
//! (docs/results/2026-11-27-direct-gpu-calls.md). Here every step is stream work that the GPUs
//! order among themselves through words in pinned host memory:
//!
//! 1. store `c` (the call's number) into this rank's `reached` word (for the watchdog), and
//!    wait until its `done` word says call `c - 1` finished (a no-op on one stream; a caller
//!    that alternates streams gets the calls' order back, which the words below need);
//! 2. from call 3 on, wait until every peer `p` stored `freed[p][me] >= c - 2`: it finished
//!    reading what this rank pushed into the same slot two calls before (slots alternate);
//! 3. push into slot `(c % 2, me)` of every peer's inbox with the copy engine (a VMM allocation
//!    each rank exports once, mapped by its peers at start): the send buffer (all_reduce), or
//!    the peer's block of it (reduce_scatter);
//! 4. store `posted[me][p] = c` for every peer;
//! 5. wait until every peer stored `posted[p][me] >= c`;
//! 6. reduce in rank order into the receive buffer ([`steps`]): every rank computes the same
//!    bits;
//! 7. store `freed[me][p] = c` for every peer, then `c` into this rank's `done` word.
//!
//! `reached` and `done` are in pinned memory of this rank alone: the watchdog counts finished
//! calls from them, never from the board, whose words a failing peer's watchdog overwrites.
//!
//! Stores carry the driver's memory barrier, so a peer that sees `posted` sees the bytes. The
//! caller's thread issues all of it into the caller's own context: nothing here waits behind
//! another thread's synchronous CUDA call, and the stream needs no callback thread.
//!
//! No host thread takes part, so a peer that dies, or calls something else, would hold the
//! stream for ever: [`watch`]'s thread turns that into an error naming the peer and lets the
//! stream past (see there).
//!
//! One-shot: each rank sends its whole buffer to every peer, `(n - 1) x` the bytes, which on two
//! ranks is what a ring sends (reduce_scatter sends what a ring does at any size);
//! the inbox holds `2 n` slots, so the most a direct call pushes to a peer is
//! `ACCORD_GPU_DIRECT_BYTES / (2 n)`, and larger calls take the pipelined path.

pub mod setup;
pub mod steps;
pub mod watch;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use accord_cuda::{copy_peer_async, DeviceBuffer, DevicePtr, Gpu, HostRangePin, ReduceOp, Reducer, Stream};

use super::board::{direct_word_offset, DirectWord};
use super::error::{GpuCollError, GpuResult};
use super::registry::PeerMapping;
use super::words::PinnedWords;
use super::worker::Shared;
use steps::{Input, Step};
use watch::Watch;

/// The caller-side machinery of direct calls on one rank.
pub struct DirectCalls {
    rank: usize,
    world_size: usize,
    /// The caller's (primary) context.
    gpu: Gpu,
    reducer: Arc<Reducer>,
    slot_bytes: usize,
    /// This rank's inbox: `2 x world_size` slots of `slot_bytes`, slot `(parity, src)` at
    /// `(parity * world_size + src) * slot_bytes`.
    inbox: Option<DeviceBuffer>,
    inbox_ptr: DevicePtr,
    /// Every peer's inbox, mapped here (None at this rank's own index).
    peer_inboxes: Vec<Option<Arc<PeerMapping>>>,
    /// Device address of the board's direct region.
    flags: DevicePtr,
    /// This rank's `reached` and `done` words (see [`OwnStreamWords`]).
    own: Arc<OwnStreamWords>,
    watch: Arc<Watch>,
    watchdog: Mutex<Option<JoinHandle<()>>>,
    /// The last call number queued; held while a call is queued, so numbers follow queue order.
    calls: Mutex<u64>,
    /// Keeps the board's direct region page-locked.
    pin: Option<HostRangePin>,
}

impl std::fmt::Debug for DirectCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectCalls").field("rank", &self.rank).field("slot_bytes", &self.slot_bytes).finish()
    }
}

/// What [`DirectCalls::open`] needs from the communicator being built.
pub struct Parts<'a> {
    /// This rank and the world.
    pub rank: usize,
    /// Ranks.
    pub world_size: usize,
    /// The caller's (primary) context.
    pub gpu: &'a Gpu,
    /// Reduction kernels of that context.
    pub reducer: Arc<Reducer>,
    /// The board and the sticky error.
    pub shared: Arc<Shared>,
    /// The inbox this rank allocated and published.
    pub inbox: DeviceBuffer,
    /// Every peer's inbox, mapped here (None at this rank's index).
    pub peer_inboxes: Vec<Option<Arc<PeerMapping>>>,
    /// Bytes of one slot.
    pub slot_bytes: usize,
    /// How long a call may wait for a peer once the stream reached it.
    pub op_timeout: Duration,
}

/// Bytes of one inbox slot for `total` inbox bytes on `world_size` ranks (0: no direct calls).
pub fn slot_bytes(total: usize, world_size: usize) -> usize {
    if world_size < 2 {
        return 0;
    }
    // Slots start on 256-byte boundaries, as the reduction kernels' vector loads want.
    (total / (2 * world_size)) & !255
}

impl DirectCalls {
    /// Page-locks the board's direct region, starts the watchdog.
    pub fn open(parts: Parts<'_>) -> GpuResult<DirectCalls> {
        let Parts { rank, world_size, gpu, reducer, shared, inbox, peer_inboxes, slot_bytes, op_timeout } = parts;
        let (region, region_len) = shared.board.direct_region();
        // Safety: the region is whole pages of the board's mapping, which `shared` keeps alive
        // for longer than this pin (the pin is a field of the value that holds `shared` through
        // its watch); streams stop using it before the pin drops, or it is leaked (see `close`).
        #[allow(unsafe_code)]
        let pin = unsafe { HostRangePin::new(gpu, region, region_len)? };
        let flags = pin.device_ptr()?;
        let own = Arc::new(OwnStreamWords::new(gpu)?);
        let watch = Arc::new(Watch::new(Arc::clone(&shared), rank, world_size, op_timeout, own.clone()));
        let runner = Arc::clone(&watch);
        let watchdog = std::thread::Builder::new()
            .name(format!("accord-gpu-watch-{rank}"))
            .spawn(move || runner.run())
            .map_err(|e| GpuCollError::InvalidArgument { what: format!("could not start the direct watchdog: {e}") })?;
        Ok(DirectCalls {
            rank,
            world_size,
            gpu: gpu.clone(),
            reducer,
            slot_bytes,
            inbox_ptr: inbox.ptr(),
            inbox: Some(inbox),
            peer_inboxes,
            flags,
            own,
            watch,
            watchdog: Mutex::new(Some(watchdog)),
            calls: Mutex::new(0),
            pin: Some(pin),
        })
    }

    /// The most a direct call pushes to each peer.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Calls queued and calls the stream finished.
    pub fn progress(&self) -> (u64, u64) {
        self.watch.progress()
    }

    /// Waits until every queued call finished, at most `timeout`.
    pub fn wait_finished(&self, timeout: Duration) -> bool {
        self.watch.wait_finished(timeout)
    }

    fn word(&self, which: DirectWord, src: usize, dst: usize) -> DevicePtr {
        self.flags.offset(direct_word_offset(self.world_size, which, src, dst))
    }

    fn slot(&self, base: DevicePtr, parity: usize, src: usize) -> DevicePtr {
        base.offset((parity * self.world_size + src) * self.slot_bytes)
    }

    fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.world_size).filter(move |&p| p != self.rank)
    }

    /// Queues `call` from `send` into `recv` on `stream` (what it pushes to each peer at most a
    /// slot: see `GpuCommunicator::goes_direct`).
    pub fn run(&self, call: DirectCall, send: DevicePtr, recv: DevicePtr, stream: &Stream) -> GpuResult<()> {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let number = *calls + 1;
        self.gpu.bind()?;
        let queued = self.queue(number, call, send, recv, stream);
        if let Err(e) = &queued {
            // Part of the call may be queued: the peers may wait for words this rank will not
            // store, and this stream for theirs. Fail the communicator (the watchdog lets this
            // stream past), and end the call so that its number counts as finished.
            let _ = stream.write_values_u64(&self.last_stores(number));
            self.watch.fail(&GpuCollError::QueueFailed { why: e.to_string() });
        }
        *calls = number;
        self.watch.queued(number);
        tracing::trace!(rank = self.rank, number, ?call, "direct call queued");
        queued.map_err(|e| GpuCollError::QueueFailed { why: e.to_string() })
    }

    fn queue(&self, number: u64, call: DirectCall, send: DevicePtr, recv: DevicePtr, stream: &Stream) -> GpuResult<()> {
        let me = self.rank;
        let parity = (number % 2) as usize;
        let pushed = call.slot_bytes_used();
        stream.write_value_u64(self.own.reached_ptr(), number)?;
        if number > 1 {
            stream.wait_value_u64_geq(self.own.done_ptr(), number - 1)?;
        }
        if number > 2 {
            for p in self.peers() {
                stream.wait_value_u64_geq(self.word(DirectWord::Freed, p, me), number - 2)?;
            }
        }
        for p in self.peers() {
            let Some(peer) = &self.peer_inboxes[p] else {
                return Err(GpuCollError::InvalidArgument { what: format!("rank {p}'s inbox is not mapped") });
            };
            let from = match call {
                // Rank p reduces block p of every rank's send.
                DirectCall::ReduceScatter { .. } => send.offset(p * pushed),
                DirectCall::AllReduce { .. } => send,
            };
            copy_peer_async(self.slot(peer.ptr(), parity, me), &self.gpu, from, &self.gpu, pushed, stream)?;
        }
        let in_place = send == recv;
        let own_slot = self.slot(self.inbox_ptr, parity, me);
        let stages = matches!(call, DirectCall::AllReduce { .. }) && steps::stages_own(self.world_size, me, in_place);
        if stages {
            copy_peer_async(own_slot, &self.gpu, send, &self.gpu, pushed, stream)?;
        }
        let posted: Vec<(DevicePtr, u64)> =
            self.peers().map(|p| (self.word(DirectWord::Posted, me, p), number)).collect();
        stream.write_values_u64(&posted)?;
        for p in self.peers() {
            stream.wait_value_u64_geq(self.word(DirectWord::Posted, p, me), number)?;
        }
        match call {
            DirectCall::AllReduce { count, dtype, op } => {
                self.reduce(send, own_slot, recv, count, dtype, op, in_place, parity, stream)?
            }
            DirectCall::ReduceScatter { count, dtype, op } => {
                let own = send.offset(me * pushed);
                self.reduce(own, own_slot, recv, count, dtype, op, false, parity, stream)?
            }
        }
        stream.write_values_u64(&self.last_stores(number))?;
        Ok(())
    }

    /// A call's last stores: `freed` for every peer, then this rank's `done`.
    fn last_stores(&self, number: u64) -> Vec<(DevicePtr, u64)> {
        let freed = self.peers().map(|p| (self.word(DirectWord::Freed, self.rank, p), number));
        freed.chain(std::iter::once((self.own.done_ptr(), number))).collect()
    }

    /// The reductions, in rank order ([`steps`]), of this rank's contribution `own` (or its
    /// staged copy `staged`) and the peers' pushes in slot `parity` into `recv`.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        own: DevicePtr,
        staged: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: accord_cuda::DType,
        op: ReduceOp,
        in_place: bool,
        parity: usize,
        stream: &Stream,
    ) -> GpuResult<()> {
        let input = |i: Input| match i {
            Input::Own => own,
            Input::Inbox(r) => self.slot(self.inbox_ptr, parity, r),
            Input::Staged => staged,
            Input::Result => recv,
        };
        for Step { a, b, op } in steps::steps(self.world_size, self.rank, op, in_place) {
            self.reducer.reduce(recv, input(a), input(b), count, dtype, op, stream)?;
        }
        Ok(())
    }
}

/// A collective that runs direct, with its sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectCall {
    /// `count` elements of `send` reduced into `recv` on every rank.
    AllReduce {
        /// Elements.
        count: usize,
        /// Their type.
        dtype: accord_cuda::DType,
        /// The reduction.
        op: ReduceOp,
    },
    /// Block `r` (of `count` elements) of every rank's `send` reduced into rank `r`'s `recv`.
    ReduceScatter {
        /// Elements per block.
        count: usize,
        /// Their type.
        dtype: accord_cuda::DType,
        /// The reduction.
        op: ReduceOp,
    },
}

impl DirectCall {
    /// Bytes this rank pushes into each peer's slot.
    pub fn slot_bytes_used(self) -> usize {
        match self {
            DirectCall::AllReduce { count, dtype, .. } | DirectCall::ReduceScatter { count, dtype, .. } => {
                count * dtype.size_bytes()
            }
        }
    }
}

impl DirectCalls {
    /// Waits for the calls this rank queued (the op timeout, then the watchdog fails and
    /// releases them and they get as long again), stops the watchdog, and says whether they all
    /// finished. Where they did not, a stream may still write or read this rank's words and
    /// inbox: they are leaked, never freed, and the caller must leak what such a stream may
    /// still touch too (a context synchronisation would wait for it for ever).
    pub fn close(&mut self) -> bool {
        let timeout = self.watch.op_timeout();
        let finished = self.watch.wait_finished(timeout) || {
            self.watch
                .fail(&GpuCollError::Failed { first: "the communicator closed with direct calls unfinished".into() });
            self.watch.wait_finished(timeout)
        };
        self.watch.stop();
        if let Some(handle) = self.watchdog.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = handle.join();
        }
        if !finished {
            tracing::error!(rank = self.rank, "direct collectives did not finish; their memory is leaked, not freed");
            std::mem::forget(self.inbox.take());
            std::mem::forget(self.pin.take());
            std::mem::forget(std::mem::take(&mut self.peer_inboxes));
            std::mem::forget(Arc::clone(&self.own));
        }
        finished
    }
}

impl Drop for DirectCalls {
    fn drop(&mut self) {
        if self.watchdog.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            self.close();
        }
    }
}

/// This rank's own progress words, in pinned memory of the caller's context: `reached` (word 0,
/// the last call its stream started) and `done` (word 1, the last it finished).
#[derive(Debug)]
pub struct OwnStreamWords {
    words: PinnedWords,
}

impl OwnStreamWords {
    fn new(gpu: &Gpu) -> GpuResult<OwnStreamWords> {
        Ok(OwnStreamWords { words: PinnedWords::new(gpu, 2)? })
    }

    fn reached_ptr(&self) -> DevicePtr {
        self.words.ptr(0)
    }

    fn done_ptr(&self) -> DevicePtr {
        self.words.ptr(1)
    }
}

impl watch::OwnWords for OwnStreamWords {
    fn reached(&self) -> u64 {
        self.words.load(0)
    }

    fn done(&self) -> u64 {
        self.words.load(1)
    }
}

#[cfg(test)]
mod tests;
