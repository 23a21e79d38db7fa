//! The proxy: one thread per ring (`accord-proxy-<ring>`) that takes descriptors in ticket
//! order, checks them, runs each as an ordinary engine write (the engine's route layer picks
//! memcpy, shared memory, the copy engine or the network), applies signal and counter actions
//! once the write completed at this end, and frees slots as tickets complete.
//!
//! Completions come back from the engine's completion thread as events on a channel; every
//! state change (ring watermarks, the in-flight table) happens on the proxy thread, so
//! `control.*` has exactly one writer.
//!
//! Idling: the thread polls for [`ProxyTiming::idle_spin`] after its last progress (the
//! engine's `wait_spin` idea: a descriptor or completion racing in is seen without a wake-up),
//! then sleeps in `park_timeout(`[`ProxyTiming::idle_park`]`)`. A GPU producer cannot wake a
//! host thread, so the sleep is bounded; engine completions unpark it at once.
//!
//! # Why a signal written after its put completed here is seen after the put's bytes
//!
//! The signal write is issued only once the put's `Transfer` completed at this end, which
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

use crate::comm::Shared;
use crate::error::{DescriptorError, DescriptorErrorKind};
use crate::layout::{Descriptor, Op, SignalOp, FLAG_COUNTER};
use crate::ring::{Ring, RingConsumer};
use crate::signals::Next;
use accord_engine::{MrBuffer, MrDescriptor, MrHandle, TransferError, WriteOp};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Descriptors one proxy takes per turn before it looks at completions again.
pub const DESCRIPTORS_PER_TURN_MAX: usize = 256;

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

/// A running proxy thread; stopping it (drop or [`ProxyHandle::stop`]) joins it.
pub(crate) struct ProxyHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProxyHandle {
    /// Starts the proxy of `ring`, staging `PutValue` values in `staging` (8 bytes a slot).
    pub(crate) fn spawn(
        ring: Arc<Ring>,
        shared: Arc<Shared>,
        staging: MrBuffer,
        timing: ProxyTiming,
    ) -> std::io::Result<ProxyHandle> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new().name(format!("accord-proxy-{}", ring.index())).spawn(move || {
            let (events, inbox) = channel();
            let mut proxy = Proxy {
                consumer: RingConsumer::new(ring),
                shared,
                staging,
                events,
                inbox,
                pending: HashMap::new(),
                signal_writes_in_flight: 0,
                me: std::thread::current(),
            };
            proxy.run(&stop_flag, timing);
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

/// What a checked descriptor asks for.
enum Action {
    /// An engine write.
    Write { src: MrHandle, src_offset: u64, dst: MrDescriptor, dst_offset: u64, len: u64 },
    /// Only the signal action.
    SignalOnly,
}

struct Proxy {
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
    fn run(&mut self, stop: &AtomicBool, timing: ProxyTiming) {
        let mut last_progress = Instant::now();
        let mut drain_deadline = None;
        let mut polls = 0u32;
        loop {
            let mut progressed = false;
            while let Ok(event) = self.inbox.try_recv() {
                self.on_event(event);
                progressed = true;
            }
            for _ in 0..DESCRIPTORS_PER_TURN_MAX {
                let Some((ticket, desc)) = self.consumer.poll() else { break };
                self.execute(ticket, desc);
                progressed = true;
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
                if polls < 64 {
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
        let action = match self.check(ticket, &desc) {
            Ok(a) => a,
            Err(kind) => {
                self.record(ticket, kind);
                self.consumer.complete(ticket);
                return;
            }
        };
        match action {
            Action::SignalOnly => self.finish(ticket, &desc),
            Action::Write { src, src_offset, dst, dst_offset, len } => {
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

    /// Checks every field; nothing is written for a descriptor that fails.
    fn check(&self, ticket: u64, d: &Descriptor) -> Result<Action, DescriptorErrorKind> {
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
        let windows = s.windows.read().unwrap_or_else(|e| e.into_inner());
        let count = windows.len() as u32;
        let dst_window = windows.get(d.window as usize).ok_or(K::BadWindow { window: d.window, count })?;
        let in_range = |offset: u64, len: u64| offset.checked_add(d.bytes).is_some_and(|end| end <= len);
        if !in_range(d.dst_offset, dst_window.len) {
            return Err(K::DstOutOfRange {
                window: d.window,
                dst_offset: d.dst_offset,
                bytes: d.bytes,
                window_bytes: dst_window.len,
            });
        }
        let dst = dst_window.peers[d.peer as usize];
        if op == Op::PutValue {
            let cell = (ticket % u64::from(self.consumer.ring().slot_count())) * 8;
            let value = d.src_offset.to_le_bytes();
            self.staging.write_at(cell as usize, &value[..d.bytes as usize]).expect("one cell per slot");
            return Ok(Action::Write {
                src: self.staging.handle(),
                src_offset: cell,
                dst,
                dst_offset: d.dst_offset,
                len: d.bytes,
            });
        }
        let src_window =
            windows.get(d.src_window as usize).ok_or(K::BadSrcWindow { src_window: d.src_window, count })?;
        if !in_range(d.src_offset, src_window.len) {
            return Err(K::SrcOutOfRange {
                src_window: d.src_window,
                src_offset: d.src_offset,
                bytes: d.bytes,
                window_bytes: src_window.len,
            });
        }
        Ok(Action::Write {
            src: src_window.local,
            src_offset: d.src_offset,
            dst,
            dst_offset: d.dst_offset,
            len: d.bytes,
        })
    }

    /// The ticket's write (if any) completed here: counter, signal, watermark.
    fn finish(&mut self, ticket: u64, d: &Descriptor) {
        let s = self.shared.clone();
        s.stats.descriptors_executed.fetch_add(1, Ordering::Relaxed);
        if d.op != Op::Signal as u8 {
            s.stats.bytes_put.fetch_add(d.bytes, Ordering::Relaxed);
        }
        if d.flags & FLAG_COUNTER != 0 {
            s.bump_counter(d.counter_id);
        }
        let signal_op = signal_op_of(d.signal_op).unwrap_or(SignalOp::None);
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

fn signal_op_of(v: u8) -> Option<SignalOp> {
    match v {
        0 => Some(SignalOp::None),
        1 => Some(SignalOp::Add),
        2 => Some(SignalOp::Set),
        _ => None,
    }
}
