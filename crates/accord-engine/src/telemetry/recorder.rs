//! What telemetry records as the engine runs (the switch, the trace buffer, the latency
//! histograms): a leaf that transfers and collectives call into without importing the engine.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Most trace events buffered; later ones are counted as dropped.
pub const TRACE_EVENTS_MAX: usize = 1 << 20;
/// Upper bounds of the latency histograms' buckets, in seconds.
pub const LATENCY_BUCKETS_S: [f64; 12] = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0];

static ON: AtomicBool = AtomicBool::new(false);
static TRACE_ON: AtomicBool = AtomicBool::new(false);
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// One finished transfer, as the trace keeps it until the file is written: four numbers,
/// formatted as JSON only then (formatting each one as it finished cost small writes a fifth
/// of their rate, docs/results/2026-11-26-never-hang.md).
#[derive(Clone, Copy, Debug)]
struct TransferEvent {
    ts: u64,
    dur: u64,
    tid: u64,
    ok: bool,
}

/// The trace as it will be written: the formatted events of collectives and their waits, and
/// the chunks of transfer events the threads handed over.
struct Trace {
    path: Option<PathBuf>,
    formatted: Vec<String>,
    transfers: Vec<Vec<TransferEvent>>,
    /// Events in `formatted` and `transfers` together (at most [`TRACE_EVENTS_MAX`]).
    kept: usize,
    dropped: u64,
}

static TRACE: Mutex<Trace> =
    Mutex::new(Trace { path: None, formatted: Vec::new(), transfers: Vec::new(), kept: 0, dropped: 0 });
/// Set once the trace holds [`TRACE_EVENTS_MAX`] events: threads then count instead of buffering.
static TRACE_FULL: AtomicBool = AtomicBool::new(false);

impl Trace {
    /// Room for `n` more events; what does not fit is counted as dropped.
    fn admit(&mut self, n: usize) -> usize {
        let room = (TRACE_EVENTS_MAX - self.kept).min(n);
        self.kept += room;
        self.dropped += (n - room) as u64;
        room
    }

    fn take_transfers(&mut self, mut chunk: Vec<TransferEvent>) {
        let room = self.admit(chunk.len());
        if room > 0 {
            chunk.truncate(room);
            self.transfers.push(chunk);
        }
    }
}

/// The process's trace, locked; tells the threads to stop buffering once it is full.
struct TraceGuard(std::sync::MutexGuard<'static, Trace>);

impl TraceGuard {
    fn lock() -> TraceGuard {
        TraceGuard(TRACE.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        if self.0.kept == TRACE_EVENTS_MAX {
            TRACE_FULL.store(true, Ordering::Relaxed);
        }
    }
}

#[derive(Clone, Debug, Default)]
pub(super) struct Histogram {
    pub(super) buckets: [u64; LATENCY_BUCKETS_S.len()],
    pub(super) count: u64,
    pub(super) sum_s: f64,
}

static LATENCIES: Mutex<BTreeMap<String, Histogram>> = Mutex::new(BTreeMap::new());

/// A transfers' histogram in atomics.
struct AtomicHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_S.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl AtomicHistogram {
    const fn zero() -> AtomicHistogram {
        AtomicHistogram {
            buckets: [const { AtomicU64::new(0) }; LATENCY_BUCKETS_S.len()],
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Counts one latency. `sole_writer`: only the calling thread writes this histogram, so
    /// a load and a store do (readers see each value whole, maybe one count late), cheaper
    /// than the locked read-modify-write that writers sharing it need.
    fn add(&self, nanos: u64, sole_writer: bool) {
        let bump = |a: &AtomicU64, by: u64| {
            if sole_writer {
                a.store(a.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
            } else {
                a.fetch_add(by, Ordering::Relaxed);
            }
        };
        bump(&self.count, 1);
        bump(&self.sum_ns, nanos);
        let seconds = nanos as f64 * 1e-9;
        if let Some(i) = LATENCY_BUCKETS_S.iter().position(|&b| seconds <= b) {
            bump(&self.buckets[i], 1);
        }
    }

    fn add_into(&self, h: &mut Histogram) {
        h.count += self.count.load(Ordering::Relaxed);
        h.sum_s += self.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        for (into, from) in h.buckets.iter_mut().zip(&self.buckets) {
            *into += from.load(Ordering::Relaxed);
        }
    }
}

/// Transfer events a thread buffers before it hands them to the trace in one move (one lock
/// of the trace per this many transfers).
pub const TRACE_CHUNK_EVENTS: usize = 4096;
/// Threads that get a slot of their own; later ones, while every slot is taken, share one.
pub const TELEMETRY_SLOTS_MAX: usize = 256;

/// One thread's share of the transfers' telemetry: its histogram and its chunk of trace
/// events. Every worker finishes transfers; with one histogram and one trace buffer for the
/// process, each transfer's counters and lock moved between cores (on the 2-core machine two
/// threads recording at once paid about twice what one did,
/// `cargo run --release -p accord-bench --example telemetry_record_cost 20000`). A slot is
/// written by its thread only (or, past [`TELEMETRY_SLOTS_MAX`], by the threads sharing
/// [`SHARED_SLOT`]), and read at a scrape or when the trace is written.
#[repr(align(128))]
struct Slot {
    histogram: AtomicHistogram,
    events: Mutex<Vec<TransferEvent>>,
    /// Transfer events not kept because the trace was full.
    dropped: AtomicU64,
    /// Whether a live thread owns it (a slot outlives its thread, for its numbers, and goes
    /// to the next thread that needs one).
    owned: AtomicBool,
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            histogram: AtomicHistogram::zero(),
            events: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
            owned: AtomicBool::new(false),
        }
    }

    /// Moves this slot's buffered events into `trace`.
    fn hand_over(&self, trace: &mut Trace) {
        let chunk = std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()));
        trace.dropped += self.dropped.swap(0, Ordering::Relaxed);
        if !chunk.is_empty() {
            trace.take_transfers(chunk);
        }
    }
}

/// Every slot handed out so far (leaked: at most [`TELEMETRY_SLOTS_MAX`], reused across threads).
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());
/// The slot of threads that found none free, and of a thread whose own is already gone (a
/// transfer finished inside a thread-local destructor).
static SHARED_SLOT: Slot = Slot::empty();

/// A thread's claim on its slot, given back when the thread ends.
struct Claim {
    slot: &'static Slot,
    tid: u64,
}

impl Claim {
    fn new() -> Claim {
        let tid = TRACE_TID.fetch_add(1, Ordering::Relaxed);
        let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        let free =
            slots.iter().find(|s| s.owned.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        let slot = match free {
            Some(s) => *s,
            None if slots.len() < TELEMETRY_SLOTS_MAX => {
                let s: &'static Slot = Box::leak(Box::new(Slot::empty()));
                s.owned.store(true, Ordering::Relaxed);
                slots.push(s);
                s
            }
            None => &SHARED_SLOT,
        };
        Claim { slot, tid }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !std::ptr::eq(self.slot, &SHARED_SLOT) {
            self.slot.owned.store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static CLAIM: Claim = Claim::new();
}

/// Runs `f` with this thread's slot and trace thread id.
fn with_slot<R>(f: impl FnOnce(&'static Slot, u64) -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    let _ = CLAIM.try_with(|c| out = f.take().map(|f| f(c.slot, c.tid)));
    match (out, f) {
        (Some(r), _) => r,
        (None, Some(f)) => f(&SHARED_SLOT, 0),
        (None, None) => unreachable!("f runs exactly once"),
    }
}

/// Name of the transfers' histogram and trace events.
const TRANSFER: &str = "transfer";

/// Every latency histogram by operation name, the transfers' (summed over the slots) included.
pub(super) fn latencies() -> BTreeMap<String, Histogram> {
    let mut all = LATENCIES.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut transfers = Histogram::default();
    SHARED_SLOT.histogram.add_into(&mut transfers);
    for slot in SLOTS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        slot.histogram.add_into(&mut transfers);
    }
    if transfers.count > 0 {
        let h = all.entry(TRANSFER.to_string()).or_default();
        h.count += transfers.count;
        h.sum_s += transfers.sum_s;
        for (into, from) in h.buckets.iter_mut().zip(transfers.buckets) {
            *into += from;
        }
    }
    all
}
static TRACE_TID: AtomicU64 = AtomicU64::new(1);

/// Whether any telemetry is on (metrics or trace).
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether the trace is on.
#[inline]
pub fn trace_on() -> bool {
    TRACE_ON.load(Ordering::Relaxed)
}

/// Turns latency recording on (a metrics endpoint is up).
pub(crate) fn enable_metrics() {
    EPOCH.get_or_init(Instant::now);
    ON.store(true, Ordering::Relaxed);
}

/// Turns the trace on, written to `path` (the first engine's path wins); `%p` in it becomes
/// the process id, so the processes of one job write one file each.
pub(crate) fn enable_trace(path: PathBuf) {
    let path = PathBuf::from(path.to_string_lossy().replace("%p", &std::process::id().to_string()));
    EPOCH.get_or_init(Instant::now);
    TraceGuard::lock().0.path.get_or_insert(path);
    TRACE_ON.store(true, Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
}

fn micros(at: Instant) -> u64 {
    at.saturating_duration_since(*EPOCH.get_or_init(Instant::now)).as_micros() as u64
}

/// Records one finished operation named `name` (`transfer`, `all_reduce`, ...): its latency
/// into the histogram of that name and, when the trace is on, a complete event of category
/// `cat` with `args` (a JSON object's body, e.g. `"seq": 3`; may be empty).
pub fn record(name: &str, cat: &str, start: Instant, end: Instant, args: &str) {
    if !on() {
        return;
    }
    let seconds = end.saturating_duration_since(start).as_secs_f64();
    if cat != "wait" {
        let mut l = LATENCIES.lock().unwrap_or_else(|e| e.into_inner());
        if !l.contains_key(name) {
            l.insert(name.to_string(), Histogram::default());
        }
        let Some(h) = l.get_mut(name) else { return };
        h.count += 1;
        h.sum_s += seconds;
        if let Some(i) = LATENCY_BUCKETS_S.iter().position(|&b| seconds <= b) {
            h.buckets[i] += 1;
        }
    }
    if trace_on() {
        let ts = micros(start);
        let dur = end.saturating_duration_since(start).as_micros() as u64;
        let tid = with_slot(|_, tid| tid);
        let name = name.replace('"', "'");
        let event = format!(
            "{{\"name\":\"{name}\",\"cat\":\"{cat}\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{dur},\"pid\":{},\"tid\":{tid},\"args\":{{{args}}}}}",
            std::process::id()
        );
        let mut t = TraceGuard::lock();
        if t.0.admit(1) == 1 {
            t.0.formatted.push(event);
        }
    }
}

/// Records one finished transfer: the cheap path of [`record`]. No formatting, and nothing
/// another thread writes: the calling thread's own histogram and chunk of trace events (its
/// [`Slot`]); the trace's lock is taken once per [`TRACE_CHUNK_EVENTS`] transfers.
pub fn record_transfer(start: Instant, end: Instant, ok: bool) {
    if !on() {
        return;
    }
    let nanos = end.saturating_duration_since(start).as_nanos().min(u128::from(u64::MAX)) as u64;
    let trace = trace_on();
    with_slot(|slot, tid| {
        slot.histogram.add(nanos, !std::ptr::eq(slot, &SHARED_SLOT));
        if !trace {
            return;
        }
        if TRACE_FULL.load(Ordering::Relaxed) {
            slot.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let event = TransferEvent { ts: micros(start), dur: nanos / 1000, tid, ok };
        let mut events = slot.events.lock().unwrap_or_else(|e| e.into_inner());
        if events.capacity() == 0 {
            events.reserve_exact(TRACE_CHUNK_EVENTS);
        }
        events.push(event);
        if events.len() >= TRACE_CHUNK_EVENTS {
            let full = std::mem::take(&mut *events);
            drop(events);
            TraceGuard::lock().0.take_transfers(full);
        }
    });
}

/// Writes the trace buffered so far to its file (the whole file, every call). Nothing to do
/// when the trace is off.
pub fn flush_trace() -> std::io::Result<()> {
    let mut guard = TraceGuard::lock();
    let t = &mut guard.0;
    if t.path.is_none() {
        return Ok(());
    }
    SHARED_SLOT.hand_over(t);
    for slot in SLOTS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        slot.hand_over(t);
    }
    let Some(path) = &t.path else { return Ok(()) };
    let mut text = String::with_capacity(t.kept * 120 + 64);
    text.push_str("{\"traceEvents\":[\n");
    let pid = std::process::id();
    let mut first = true;
    let mut separate = |text: &mut String| {
        if !std::mem::take(&mut first) {
            text.push_str(",\n");
        }
    };
    for json in &t.formatted {
        separate(&mut text);
        text.push_str(json);
    }
    for TransferEvent { ts, dur, tid, ok } in t.transfers.iter().flatten() {
        separate(&mut text);
        let _ = write!(
            text,
            "{{\"name\":\"{TRANSFER}\",\"cat\":\"{TRANSFER}\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{dur},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"ok\":{ok}}}}}"
        );
    }
    let _ = write!(text, "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"dropped_events\":{}}}}}\n", t.dropped);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests;
