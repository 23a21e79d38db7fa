//! The proxy: one thread per ring (`accord-proxy-<ring>`) that takes descriptors in ticket
//! order, checks them, and runs each one of two ways: on the peer's stream lane (`lane/`)
//! when this rank's GPU reaches the peer's window by address, else as an ordinary engine write
//! (the engine's route layer picks memcpy, shared memory, the copy engine or the network). It
//! applies signal and counter actions once the bytes landed, and frees slots as tickets
//! complete.
//!
//! Engine completions come back from the engine's completion thread as events on a channel;
//! lane completions from the done words the lanes' streams write. Every state change (ring
//! watermarks, the in-flight tables) happens on the proxy thread, so `control.*` has exactly
//! one writer.
//!
//! Idling: the thread spins [`IDLE_POLLS_BEFORE_YIELD`] polls, then yields between polls until
//! [`ProxyTiming::idle_spin`] after its last progress (the engine's `wait_spin` idea: a
//! descriptor or completion racing in is seen without a wake-up), then sleeps in
//! `park_timeout(`[`ProxyTiming::idle_park`]`)`. A GPU producer cannot wake a host thread, so
//! the sleep is bounded; engine completions unpark it at once.
//!
//! # Why a signal written after its put completed here is seen after the put's bytes
//!
//! On a lane, stream order does it: the signal's store follows the put's copy on the same
//! stream, with a memory barrier before it. Through the engine, the signal write is issued
//! only once the put's `Transfer` completed at this end, which
//! on the routes checked means its bytes are placed at the receiver:
//! - `Memcpy` (peer in this process): the submitting thread copies before completing;
//! - `SharedMemory` and `Udp` (the transport): the receiver's worker places each datagram in
//!   the receive turn that handled it, before the acknowledgement it produced is transmitted,
//!   and the sender completes only when every byte is acknowledged.
//!
//! `tests/placement.rs` checks all three (and UDP under loss, reordering and duplication) by
//! reading the receiver's memory as soon as the sender's wait returns. Not checked here (they
//! need a GPU or a second process): `Pull` (CMA), `CopyEngine*`, `Staged` and `Landing`; the
//! engine documents that each counts its immediate only after every byte landed, and the
//! device tests must confirm that sender completion implies placement for them too.

mod batches;

use crate::error::{DescriptorError, DescriptorErrorKind};
use crate::lane::{queue_batch, values_as_copies, BatchScratch, BatchStores, LaneItem, LaneWork, StreamSink};
use crate::layout::{Descriptor, Op, SignalOp, FLAG_COUNTER};
use crate::memory::Block;
use crate::ring::{Ring, RingConsumer};
use crate::shared::Shared;
use crate::signals::Next;
use accord_engine::{MemoryKind, MrBuffer, MrDescriptor, MrHandle, TransferError, WriteOp};
use batches::{Gathered, LanePending, LaneTicket, SPARE_TICKET_LISTS_MAX};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Descriptors one proxy takes per turn by default before it looks at completions again (one
/// turn's lane items go to a peer's stream as one batch; `DeviceCommConfig::descriptors_per_turn`).
/// A batch's driver calls cost tens of microseconds whatever its size, so larger turns carry
/// small puts faster (see `RING_SLOTS_DEFAULT` for the measurement); a turn ends early when the
/// ring is empty, so a lone put does not wait for others.
pub const DESCRIPTORS_PER_TURN_DEFAULT: usize = 1024;

/// Idle polls that only spin before the proxy starts yielding its core between polls: a yield is
/// a system call (about a microsecond), and the next descriptor of a kernel-to-kernel exchange
/// comes some 10 us after the last, so yielding from the 64th poll on added to every one-way
/// latency. About 100-300 us of spinning, then yields, then (after `idle_spin`) sleeps.
const IDLE_POLLS_BEFORE_YIELD: u32 = 1024;

/// Slots after the one being taken whose lines the proxy asks the CPU to load meanwhile.
const SLOTS_PREFETCHED: u64 = 8;

/// How long a stream-lane batch may go without completing before the proxy asks its stream
/// whether it failed (a faulted context never writes the done word).
const LANE_STALL_CHECK: Duration = Duration::from_millis(500);

/// How long a lane whose batch failed to queue may take to finish what was queued before its
/// tickets (and with them their ring cells and put sources) are released. Long queues of large
/// puts legitimately run past [`LANE_STALL_CHECK`] (a second at the copy ceiling is ~390 GB);
/// releasing a cell a queued copy still reads would let the next descriptor's bytes land under
/// the failed one's signal. Past this, the GPU is taken as hung and the proxy moves on, saying so.
const LANE_DRAIN_MAX: Duration = Duration::from_secs(10);

/// How a proxy thread idles and how long it drains at close.
#[derive(Copy, Clone, Debug)]
pub struct ProxyTiming {
    /// Polling after the last progress before sleeping.
    pub idle_spin: Duration,
    /// Longest sleep while idle (a GPU producer cannot wake the thread).
    pub idle_park: Duration,
    /// At close, how long to wait for descriptors and transfers still in flight.
    pub close_drain: Duration,
}

/// Why these defaults: a proxy stands in for a NIC's doorbell, and a GPU cannot wake a host
/// thread, so every sleep is latency added to the next put. With 200 us of polling and 500 us
/// sleeps, the 2xH200 host ran small puts from a kernel at 0.005 M/s and 16 MiB puts at 0.55 of
/// the copy ceiling; polling 20 ms after the last progress and sleeping 100 us at a time gave
/// 0.096 M/s and 0.94 in the same bench (docs/results/2026-11-26-device-api.md). The cost: one
/// core per ring while the GPU is busy, as CPU-proxy designs spend, and 10,000 wake-ups a second
/// per idle proxy.
impl Default for ProxyTiming {
    fn default() -> Self {
        ProxyTiming {
            idle_spin: Duration::from_millis(20),
            idle_park: Duration::from_micros(100),
            close_drain: Duration::from_secs(5),
        }
    }
}

/// What the engine's completion thread tells a proxy.
enum Event {
    /// The put of `ticket` completed at this end.
    PutDone { ticket: u64, result: Result<(), TransferError> },
    /// The signal write for (`peer`, `signal`) triggered by `ticket` completed.
    SignalDone { peer: u32, signal: u32, ticket: u64, result: Result<(), TransferError> },
}

/// The mapped host memory of one proxy's stream lanes.
pub(crate) struct LaneMemory {
    /// One word per peer: the done value of the last batch the lane's stream finished.
    pub(crate) done: Block,
    /// One cell per ring slot (8 bytes): values copied by the lanes.
    pub(crate) values: Block,
}

/// A running proxy thread; stopping it (drop or [`ProxyHandle::stop`]) joins it.
pub(crate) struct ProxyHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProxyHandle {
    /// Starts the proxy of `ring`, staging `PutValue` values in `staging` (8 bytes a slot);
    /// `lane` holds, when the communicator has stream lanes, one mapped word per peer (done
    /// words) and one mapped cell per ring slot (the values a lane copies).
    pub(crate) fn spawn(
        ring: Arc<Ring>,
        shared: Arc<Shared>,
        staging: MrBuffer,
        lane: Option<LaneMemory>,
        timing: ProxyTiming,
        turn_max: usize,
    ) -> std::io::Result<ProxyHandle> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new().name(format!("accord-proxy-{}", ring.index())).spawn(move || {
            let (events, inbox) = channel();
            let world = shared.world as usize;
            if let Some(gpu) = &shared.lane_gpu {
                // The lane's driver calls need this GPU's context on this thread.
                let _ = gpu.bind();
            }
            let mut proxy = Proxy {
                views: Vec::new(),
                lane_windows: (0..world).map(|_| None).collect(),
                lane,
                lane_pending: (0..world).map(|_| LanePending::default()).collect(),
                lane_batches: (0..world).map(|_| Gathered::default()).collect(),
                spare_tickets: Vec::new(),
                retired: Vec::new(),
                scratch: BatchScratch::default(),
                consumer: RingConsumer::new(ring),
                shared,
                staging,
                events,
                inbox,
                pending: HashMap::new(),
                signal_writes_in_flight: 0,
                me: std::thread::current(),
            };
            proxy.run(&stop_flag, timing, turn_max.max(1));
        })?;
        Ok(ProxyHandle { stop, thread: Some(thread) })
    }

    /// Asks the thread to finish (after draining, bounded) and joins it.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where a checked write's bytes come from.
#[derive(Copy, Clone, Debug)]
enum WriteSource {
    /// This rank's window `window` at `offset`; `device` is that byte's device address when the
    /// window is device memory of the stream lanes' GPU (a lane can copy from it).
    Window { window: u32, offset: u64, device: Option<u64> },
    /// A `put_value`'s inline value (its low `len` bytes).
    Value(u64),
}

/// What a checked descriptor asks for (ids and offsets only: the engine's handles and
/// descriptors are looked up only for descriptors that go through the engine).
#[derive(Copy, Clone, Debug)]
enum Action {
    /// Bytes into `peer`'s window `dst_window` at `dst_offset`.
    Write { src: WriteSource, dst_window: u32, dst_offset: u64, len: u64 },
    /// Only the signal action.
    SignalOnly,
}

/// What a proxy keeps of a window to check descriptors without taking the windows' lock.
#[derive(Copy, Clone, Debug)]
struct WindowView {
    len: u64,
    /// The window's device address on the stream lanes' GPU, if it is device memory there.
    device_base: Option<u64>,
}

struct Proxy {
    /// The windows as registered so far (refreshed when more were registered).
    views: Vec<WindowView>,
    /// Per peer with a lane: the device address (here) of each of its windows, 0 where none.
    lane_windows: Vec<Option<Vec<u64>>>,
    /// The lanes' mapped host memory (done words, value cells); none without stream lanes.
    lane: Option<LaneMemory>,
    lane_pending: Vec<LanePending>,
    /// The batch being gathered, per peer.
    lane_batches: Vec<Gathered>,
    /// Emptied ticket lists of retired batches, kept with their capacity for the next ones:
    /// fresh lists of a thousand tickets every turn cost the proxy page faults (a large
    /// allocation is mapped anew each time), a measurable share of a turn at millions of puts
    /// a second.
    spare_tickets: Vec<Vec<LaneTicket>>,
    /// Tickets of the batches one look at the lanes retires (kept for its capacity).
    retired: Vec<LaneTicket>,
    /// The buffers a lane batch is sorted and merged in, kept from turn to turn.
    scratch: BatchScratch,
    consumer: RingConsumer,
    shared: Arc<Shared>,
    staging: MrBuffer,
    events: Sender<Event>,
    inbox: Receiver<Event>,
    /// Tickets whose write is in flight, with their descriptor.
    pending: HashMap<u64, Descriptor>,
    /// Signal writes this proxy issued that have not completed.
    signal_writes_in_flight: usize,
    me: std::thread::Thread,
}

impl Proxy {
    /// Takes at most `turn_max` descriptors a turn.
    fn run(&mut self, stop: &AtomicBool, timing: ProxyTiming, turn_max: usize) {
        let mut last_progress = Instant::now();
        let mut drain_deadline = None;
        let mut polls = 0u32;
        loop {
            let mut progressed = false;
            while let Ok(event) = self.inbox.try_recv() {
                self.on_event(event);
                progressed = true;
            }
            let turn_start = Instant::now();
            self.refresh_views();
            let mut taken = 0;
            while taken < turn_max {
                let Some((ticket, desc)) = self.consumer.poll() else { break };
                // Prefetching only once a turn has work keeps the idle spin to one load a poll:
                // the window of slots ahead at the first descriptor, one slot more each after.
                if taken == 0 {
                    self.consumer.prefetch(SLOTS_PREFETCHED);
                } else {
                    self.consumer.prefetch_one(SLOTS_PREFETCHED);
                }
                self.execute(ticket, desc);
                taken += 1;
            }
            if taken > 0 {
                progressed = true;
                self.shared.stats.take_ns.fetch_add(nanos(turn_start.elapsed()), Ordering::Relaxed);
            }
            self.queue_lane_batches(turn_start);
            let retire_start = Instant::now();
            if self.poll_lanes() {
                progressed = true;
                self.shared.stats.lane_retire_ns.fetch_add(nanos(retire_start.elapsed()), Ordering::Relaxed);
            }
            if stop.load(Ordering::Acquire) {
                let deadline = *drain_deadline.get_or_insert_with(|| Instant::now() + timing.close_drain);
                let idle = self.consumer.in_flight() == 0 && self.signal_writes_in_flight == 0;
                if (idle && !progressed) || Instant::now() >= deadline {
                    return;
                }
            }
            if progressed {
                last_progress = Instant::now();
                polls = 0;
            } else if last_progress.elapsed() < timing.idle_spin {
                polls += 1;
                if polls < IDLE_POLLS_BEFORE_YIELD {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            } else {
                std::thread::park_timeout(timing.idle_park);
            }
        }
    }

    fn record(&mut self, ticket: u64, kind: DescriptorErrorKind) {
        self.consumer.record_error(ticket);
        self.shared.record_error(DescriptorError { ring: self.consumer.ring().index(), ticket, kind });
    }

    fn execute(&mut self, ticket: u64, desc: Descriptor) {
        let action = match self.check(&desc) {
            Ok(a) => a,
            Err(kind) => {
                self.record(ticket, kind);
                self.consumer.complete(ticket);
                return;
            }
        };
        if let Some(work) = self.lane_work(&desc, &action) {
            let item = LaneItem {
                ticket,
                work,
                signal_op: signal_op_of(desc.signal_op).unwrap_or(SignalOp::None),
                signal_id: desc.signal_id,
                signal_value: desc.signal_value,
            };
            self.lane_batches[desc.peer as usize].push(item, &desc);
            return;
        }
        match action {
            Action::SignalOnly => self.finish(ticket, &desc),
            Action::Write { src, dst_window, dst_offset, len } => {
                let (src, src_offset, dst) = match self.engine_ends(ticket, &desc, src, dst_window) {
                    Ok(ends) => ends,
                    Err(reason) => {
                        self.record(ticket, DescriptorErrorKind::Submit { peer: desc.peer, reason });
                        self.consumer.complete(ticket);
                        return;
                    }
                };
                let op = WriteOp { src: &src, src_offset, dst: &dst, dst_offset, len, imm: None };
                match self.shared.engine.write(&op) {
                    Ok(transfer) => {
                        self.pending.insert(ticket, desc);
                        // A same-process peer's write is copied on this thread and is already
                        // complete: finish it here, without the completion thread's hop.
                        if let Some(result) = transfer.poll() {
                            self.on_event(Event::PutDone { ticket, result });
                            return;
                        }
                        let (events, me) = (self.events.clone(), self.me.clone());
                        transfer.on_complete(move |result| {
                            let _ = events.send(Event::PutDone { ticket, result });
                            me.unpark();
                        });
                    }
                    Err(e) => {
                        self.record(ticket, DescriptorErrorKind::Submit { peer: desc.peer, reason: e.to_string() });
                        self.consumer.complete(ticket);
                    }
                }
            }
        }
    }

    /// Re-reads the windows when more were registered since the last look (registration
    /// happens between kernels, so a turn sees a stable set).
    fn refresh_views(&mut self) {
        let registered = self.shared.window_count.load(Ordering::Acquire);
        if registered == self.views.len() {
            return;
        }
        let lane_ordinal = self.shared.lane_gpu.as_ref().map(|g| g.ordinal() as u32);
        let windows = self.shared.windows.read().unwrap_or_else(|e| e.into_inner());
        self.views = windows
            .iter()
            .map(|w| WindowView {
                len: w.len,
                device_base: match w.kind {
                    MemoryKind::CudaDevice { ordinal } if Some(ordinal) == lane_ordinal => Some(w.base),
                    _ => None,
                },
            })
            .collect();
        drop(windows);
        self.lane_windows = self
            .shared
            .lanes
            .iter()
            .map(|l| l.as_ref().map(|l| l.windows.read().unwrap_or_else(|e| e.into_inner()).clone()))
            .collect();
    }

    /// The engine's source handle and offset and the destination descriptor of a write that
    /// goes through the engine (a `put_value` is staged in this ring's cell for its slot).
    fn engine_ends(
        &self,
        ticket: u64,
        d: &Descriptor,
        src: WriteSource,
        dst_window: u32,
    ) -> Result<(MrHandle, u64, MrDescriptor), String> {
        let windows = self.shared.windows.read().unwrap_or_else(|e| e.into_inner());
        let dst = windows.get(dst_window as usize).map(|w| w.peers[d.peer as usize]).ok_or("window gone")?;
        match src {
            WriteSource::Window { window, offset, .. } => {
                let local = windows.get(window as usize).map(|w| w.local).ok_or("source window gone")?;
                Ok((local, offset, dst))
            }
            WriteSource::Value(value) => {
                let cell = self.consumer.ring().slot_of(ticket) as u64 * 8;
                let bytes = value.to_le_bytes();
                self.staging.write_at(cell as usize, &bytes[..d.bytes as usize]).map_err(|e| e.to_string())?;
                Ok((self.staging.handle(), cell, dst))
            }
        }
    }

    /// What the stream lane does for a checked descriptor, or `None` when it must go through
    /// the engine (no lane to the peer, a window the lane cannot reach, a `put_value` of fewer
    /// than 8 bytes).
    fn lane_work(&self, d: &Descriptor, action: &Action) -> Option<LaneWork> {
        self.lane.as_ref()?;
        let windows = self.lane_windows.get(d.peer as usize)?.as_ref()?;
        let Action::Write { src, dst_window, dst_offset, len } = *action else {
            return Some(LaneWork::SignalOnly);
        };
        let dst = match windows.get(dst_window as usize) {
            Some(&base) if base != 0 => base + dst_offset,
            _ => return None,
        };
        match src {
            // Any alignment: an unaligned value is copied from its cell (`values_as_copies`).
            WriteSource::Value(value) => (len == 8).then_some(LaneWork::Value { dst, value }),
            WriteSource::Window { device, .. } => device.map(|src| LaneWork::Copy { dst, src, len }),
        }
    }

    /// Queues each peer's gathered lane items as one batch on its lane; `turn_start` is when
    /// the proxy began taking this turn's descriptors (for the lane's timing statistics).
    fn queue_lane_batches(&mut self, turn_start: Instant) {
        for peer in 0..self.lane_batches.len() {
            if self.lane_batches[peer].items.is_empty() {
                continue;
            }
            let mut items = std::mem::take(&mut self.lane_batches[peer].items);
            let spare = self.spare_tickets.pop().unwrap_or_default();
            let tickets = std::mem::replace(&mut self.lane_batches[peer].tickets, spare);
            if let Some(cells) = self.lane.as_ref().map(|l| &l.values) {
                let ring = self.consumer.ring();
                let base = cells.device_addr();
                let cell = |ticket: u64| ring.slot_of(ticket);
                values_as_copies(&mut items, &mut self.scratch, &|t| base + cell(t) as u64 * 8, &mut |t, v| {
                    // Visible to the copy: the driver call that queues it comes after.
                    if let Some(word) = cells.word(cell(t)) {
                        word.store(v, Ordering::Release);
                    }
                });
            }
            let done = self.lane_pending[peer].next_done();
            let mut scratch = std::mem::take(&mut self.scratch);
            let result = self.queue_on_lane(peer as u32, &items, done, &mut scratch);
            self.scratch = scratch;
            items.clear();
            self.lane_batches[peer].items = items;
            match result {
                Ok(()) => {
                    let now = Instant::now();
                    self.shared.stats.lane_submit_ns.fetch_add(nanos(now - turn_start), Ordering::Relaxed);
                    self.lane_pending[peer].queued(done, now, tickets);
                }
                Err(reason) => {
                    // Part of the batch may be queued already (copies from its cells or
                    // windows): let the streams finish it before the tickets, and with them
                    // their cells and sources, are released.
                    self.drain_lane(peer);
                    for t in tickets {
                        self.record(t.ticket, DescriptorErrorKind::Submit { peer: t.peer, reason: reason.clone() });
                        self.consumer.complete(t.ticket);
                    }
                }
            }
        }
    }

    /// Queues `items` for `peer` under its lane's lock, computing signal values there.
    fn queue_on_lane(
        &self,
        peer: u32,
        items: &[LaneItem],
        done_value: u64,
        scratch: &mut BatchScratch,
    ) -> Result<(), String> {
        let s = &self.shared;
        let lane = s.lanes[peer as usize].as_ref().ok_or("no lane to this peer")?;
        let done = self.lane.as_ref().map(|l| &l.done).ok_or("no lane done words")?;
        let done_word = done.device_addr() + u64::from(peer) * 8;
        let mut streams = lane.streams.lock().unwrap_or_else(|e| e.into_inner());
        let mut advance = |signal, op, operand| s.signal_board.advance(peer, signal, op, operand);
        let how = BatchStores {
            advance: &mut advance,
            signal_slot: &|signal| lane.signal_slots + s.signal_slot_offset(signal),
            done_word,
            done_value,
            aside_from_bytes: s.lane_stores_aside_bytes,
        };
        let calls_start = Instant::now();
        let queued = queue_batch(&mut StreamSink(&mut streams), scratch, items, how)?;
        s.stats.lane_queue_ns.fetch_add(nanos(calls_start.elapsed()), Ordering::Relaxed);
        drop(streams);
        s.stats.signal_writes_issued.fetch_add(queued.signal_stores as u64, Ordering::Relaxed);
        s.stats.lane_batches.fetch_add(1, Ordering::Relaxed);
        s.stats.lane_driver_ops.fetch_add(queued.calls as u64, Ordering::Relaxed);
        s.stats.lane_items.fetch_add(items.len() as u64, Ordering::Relaxed);
        s.stats.lane_copies.fetch_add(queued.copies as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Completes lane tickets whose batch's done value the stream wrote; fails a peer's pending
    /// tickets when its stream reports a fault. Whether anything moved.
    fn poll_lanes(&mut self) -> bool {
        let Some(done) = self.lane.as_ref().map(|l| &l.done) else { return false };
        let mut progressed = false;
        let mut finished = std::mem::take(&mut self.retired);
        let mut failed: Vec<(LaneTicket, String)> = Vec::new();
        for (peer, pending) in self.lane_pending.iter_mut().enumerate() {
            if pending.batches.is_empty() {
                continue;
            }
            let seen = done.word(peer).map_or(0, |w| w.load(Ordering::Acquire));
            let completed = pending.take_done(seen);
            for b in &completed {
                self.shared.stats.lane_complete_ns.fetch_add(nanos(b.queued.elapsed()), Ordering::Relaxed);
            }
            if !completed.is_empty() {
                for mut b in completed {
                    finished.append(&mut b.tickets);
                    if self.spare_tickets.len() < SPARE_TICKET_LISTS_MAX {
                        self.spare_tickets.push(b.tickets);
                    }
                }
                progressed = true;
                pending.since = Some(Instant::now());
                continue;
            }
            if pending.since.is_some_and(|t| t.elapsed() >= LANE_STALL_CHECK) {
                pending.since = Some(Instant::now());
                let lane = self.shared.lanes[peer].as_ref();
                let state = lane.map(|l| l.streams.lock().unwrap_or_else(|e| e.into_inner()).query());
                let reason = match state {
                    Some(Ok(false)) => None, // still copying (a long queue): look again later
                    Some(Ok(true)) => {
                        // Idle, yet the done word is short: read it once more (it may have
                        // landed since), else the lane lost it.
                        let now = done.word(peer).map_or(0, |w| w.load(Ordering::Acquire));
                        (now < pending.queued_done).then(|| {
                            format!(
                                "the lane's streams went idle with its done word at {now}, not {}",
                                pending.queued_done
                            )
                        })
                    }
                    Some(Err(e)) => Some(format!("the lane's stream failed: {e}")),
                    None => Some("no lane to this peer".to_string()),
                };
                if let Some(reason) = reason {
                    for b in pending.batches.drain(..) {
                        failed.extend(b.tickets.into_iter().map(|t| (t, reason.clone())));
                    }
                    progressed = true;
                }
            }
        }
        self.count_lane_done(&finished);
        self.consumer.complete_many(finished.iter().map(|t| t.ticket));
        finished.clear();
        self.retired = finished;
        for (t, reason) in failed {
            self.record(t.ticket, DescriptorErrorKind::Submit { peer: t.peer, reason });
            self.consumer.complete(t.ticket);
        }
        progressed
    }

    /// Waits, at most [`LANE_DRAIN_MAX`], for `peer`'s lane streams to go idle (or fail).
    fn drain_lane(&self, peer: usize) {
        let Some(lane) = self.shared.lanes.get(peer).and_then(|l| l.as_ref()) else { return };
        let start = Instant::now();
        while lane.streams.lock().unwrap_or_else(|e| e.into_inner()).query() == Ok(false) {
            if start.elapsed() >= LANE_DRAIN_MAX {
                tracing::warn!(
                    peer,
                    waited_ms = start.elapsed().as_millis() as u64,
                    "the copy streams to this peer are still busy after a failed batch: releasing its ring cells anyway"
                );
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Lane tickets completed (their bytes and signals landed at the peer): statistics (one
    /// atomic add each for the lot) and counters; the caller completes the tickets together.
    fn count_lane_done(&self, done: &[LaneTicket]) {
        if done.is_empty() {
            return;
        }
        let s = &self.shared;
        let mut bytes = 0;
        for t in done {
            bytes += t.bytes;
            if let Some(counter) = t.counter {
                s.bump_counter(counter);
            }
        }
        s.stats.descriptors_executed.fetch_add(done.len() as u64, Ordering::Relaxed);
        s.stats.bytes_put.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Checks every field against this proxy's view of the windows; nothing is written for a
    /// descriptor that fails.
    fn check(&self, d: &Descriptor) -> Result<Action, DescriptorErrorKind> {
        use DescriptorErrorKind as K;
        let s = &self.shared;
        let op = match d.op {
            1 => Op::Put,
            2 => Op::PutValue,
            3 => Op::Signal,
            op => return Err(K::BadOp { op }),
        };
        if d.peer >= s.world {
            return Err(K::BadPeer { peer: d.peer, world: s.world });
        }
        let signal_op = signal_op_of(d.signal_op).ok_or(K::BadSignalOp { signal_op: d.signal_op })?;
        if d.flags & !FLAG_COUNTER != 0 {
            return Err(K::ReservedFlags { flags: d.flags });
        }
        if signal_op != SignalOp::None && d.signal_id >= s.signal_count {
            return Err(K::BadSignal { signal_id: d.signal_id, count: s.signal_count });
        }
        if d.flags & FLAG_COUNTER != 0 && d.counter_id >= s.counter_count {
            return Err(K::BadCounter { counter_id: d.counter_id, count: s.counter_count });
        }
        if op == Op::Signal {
            if signal_op == SignalOp::None {
                return Err(K::SignalWithoutAction);
            }
            return Ok(Action::SignalOnly);
        }
        match op {
            Op::Put if d.bytes == 0 => return Err(K::ZeroBytes),
            Op::PutValue if !(1..=8).contains(&d.bytes) => return Err(K::BadValueBytes { bytes: d.bytes }),
            _ => {}
        }
        let count = self.views.len() as u32;
        let dst_window = self.views.get(d.window as usize).ok_or(K::BadWindow { window: d.window, count })?;
        let in_range = |offset: u64, len: u64| offset.checked_add(d.bytes).is_some_and(|end| end <= len);
        if !in_range(d.dst_offset, dst_window.len) {
            return Err(K::DstOutOfRange {
                window: d.window,
                dst_offset: d.dst_offset,
                bytes: d.bytes,
                window_bytes: dst_window.len,
            });
        }
        let src = if op == Op::PutValue {
            WriteSource::Value(d.src_offset)
        } else {
            let src_window =
                self.views.get(d.src_window as usize).ok_or(K::BadSrcWindow { src_window: d.src_window, count })?;
            if !in_range(d.src_offset, src_window.len) {
                return Err(K::SrcOutOfRange {
                    src_window: d.src_window,
                    src_offset: d.src_offset,
                    bytes: d.bytes,
                    window_bytes: src_window.len,
                });
            }
            WriteSource::Window {
                window: d.src_window,
                offset: d.src_offset,
                device: src_window.device_base.map(|b| b + d.src_offset),
            }
        };
        Ok(Action::Write { src, dst_window: d.window, dst_offset: d.dst_offset, len: d.bytes })
    }

    /// The ticket's write (if any) completed here: counter, signal, watermark.
    fn finish(&mut self, ticket: u64, d: &Descriptor) {
        let s = self.shared.clone();
        let signal_op = signal_op_of(d.signal_op).unwrap_or(SignalOp::None);
        if signal_op != SignalOp::None
            && self.lane.is_some()
            && s.lanes.get(d.peer as usize).is_some_and(|l| l.is_some())
        {
            // The peer's signals all go through its lane, so their order is the stream's. The
            // bytes landed already (the engine completed the put), so the signal may follow;
            // the ticket completes (counted, counter bumped) when the lane wrote it.
            let item = LaneItem {
                ticket,
                work: LaneWork::SignalOnly,
                signal_op,
                signal_id: d.signal_id,
                signal_value: d.signal_value,
            };
            self.lane_batches[d.peer as usize].push(item, d);
            return;
        }
        s.stats.descriptors_executed.fetch_add(1, Ordering::Relaxed);
        if d.op != Op::Signal as u8 {
            s.stats.bytes_put.fetch_add(d.bytes, Ordering::Relaxed);
        }
        if d.flags & FLAG_COUNTER != 0 {
            s.bump_counter(d.counter_id);
        }
        if signal_op == SignalOp::None {
            self.consumer.complete(ticket);
            return;
        }
        match s.signal_board.apply(d.peer, d.signal_id, signal_op, d.signal_value) {
            Next::Write(value) => self.write_signal(d.peer, d.signal_id, value, ticket),
            Next::Coalesced => {
                s.stats.signal_writes_coalesced.fetch_add(1, Ordering::Relaxed);
            }
            Next::Idle => {}
        }
        self.consumer.complete(ticket);
    }

    /// Writes this rank's running `value` of `signal` into its slot at `peer`.
    fn write_signal(&mut self, peer: u32, signal: u32, mut value: u64, ticket: u64) {
        let s = self.shared.clone();
        loop {
            let cell = s.signal_cell_offset(peer, signal);
            s.signal_cells.write_at(cell as usize, &value.to_le_bytes()).expect("one cell per (peer, signal)");
            let src = s.signal_cells.handle();
            let dst = s.peer_signals[peer as usize];
            let op = WriteOp {
                src: &src,
                src_offset: cell,
                dst: &dst,
                dst_offset: s.signal_slot_offset(signal),
                len: 8,
                imm: None,
            };
            match s.engine.write(&op) {
                Ok(transfer) => {
                    s.stats.signal_writes_issued.fetch_add(1, Ordering::Relaxed);
                    if let Some(result) = transfer.poll() {
                        // Complete already (a same-process peer): settle it at once.
                        if let Err(error) = result {
                            self.record(ticket, DescriptorErrorKind::Transfer { what: "signal write", peer, error });
                        }
                        match s.signal_board.written(peer, signal, result.is_ok()) {
                            Next::Write(v) => {
                                value = v;
                                continue;
                            }
                            _ => return,
                        }
                    }
                    self.signal_writes_in_flight += 1;
                    let (events, me) = (self.events.clone(), self.me.clone());
                    transfer.on_complete(move |result| {
                        let _ = events.send(Event::SignalDone { peer, signal, ticket, result });
                        me.unpark();
                    });
                    return;
                }
                Err(e) => {
                    self.record(ticket, DescriptorErrorKind::Submit { peer, reason: e.to_string() });
                    match s.signal_board.written(peer, signal, false) {
                        Next::Write(v) => value = v,
                        _ => return,
                    }
                }
            }
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::PutDone { ticket, result } => {
                let Some(desc) = self.pending.remove(&ticket) else { return };
                match result {
                    Ok(()) => self.finish(ticket, &desc),
                    Err(error) => {
                        self.record(ticket, DescriptorErrorKind::Transfer { what: "put", peer: desc.peer, error });
                        self.consumer.complete(ticket);
                    }
                }
            }
            Event::SignalDone { peer, signal, ticket, result } => {
                self.signal_writes_in_flight -= 1;
                if let Err(error) = result {
                    self.record(ticket, DescriptorErrorKind::Transfer { what: "signal write", peer, error });
                }
                if let Next::Write(value) = self.shared.signal_board.written(peer, signal, result.is_ok()) {
                    self.write_signal(peer, signal, value, ticket);
                }
            }
        }
    }
}

/// Nanoseconds of `d`, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn signal_op_of(v: u8) -> Option<SignalOp> {
    match v {
        0 => Some(SignalOp::None),
        1 => Some(SignalOp::Add),
        2 => Some(SignalOp::Set),
        _ => None,
    }
}
