//! What telemetry records as the engine runs (the switch, the trace buffer, the latency
//! histograms): a leaf that transfers and collectives call into without importing the engine.

use super::clock::now_ns;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Most trace events buffered; later ones are counted as dropped.
pub const TRACE_EVENTS_MAX: usize = 1 << 20;
/// Upper bounds of the latency histograms' buckets, in seconds.
pub const LATENCY_BUCKETS_S: [f64; 12] = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0];
/// The same bounds in nanoseconds: a transfer's bucket is found by comparing integers, with no
/// conversion to seconds on each one.
const LATENCY_BUCKETS_NS: [u64; LATENCY_BUCKETS_S.len()] = {
    let mut ns = [0; LATENCY_BUCKETS_S.len()];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = (LATENCY_BUCKETS_S[i] * 1e9 + 0.5) as u64;
        i += 1;
    }
    ns
};

/// The switches every transfer reads, alone on their cache line (two, for the adjacent-line
/// prefetcher): a lock or counter written often (the trace's, the collectives' histograms)
/// placed beside them by the linker would make each of those reads a miss on every core.
#[repr(align(128))]
struct Switches {
    /// Any telemetry is on (metrics or trace).
    on: AtomicBool,
    /// The trace is on.
    trace_on: AtomicBool,
    /// The trace holds [`TRACE_EVENTS_MAX`] events: threads count instead of buffering.
    trace_full: AtomicBool,
    /// What the trace's timestamps count from, as an `Instant` (collectives) and in
    /// [`super::clock::now_ns`]'s nanoseconds (transfers), read together.
    epoch: OnceLock<Instant>,
    epoch_ns: AtomicU64,
}

static SWITCHES: Switches = Switches {
    on: AtomicBool::new(false),
    trace_on: AtomicBool::new(false),
    trace_full: AtomicBool::new(false),
    epoch: OnceLock::new(),
    epoch_ns: AtomicU64::new(0),
};
static ON: &AtomicBool = &SWITCHES.on;
static TRACE_ON: &AtomicBool = &SWITCHES.trace_on;
static EPOCH: &OnceLock<Instant> = &SWITCHES.epoch;

/// The trace's epoch (set the first time telemetry is turned on).
fn epoch() -> Instant {
    *EPOCH.get_or_init(|| {
        SWITCHES.epoch_ns.store(now_ns(), Ordering::Relaxed);
        Instant::now()
    })
}

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

/// Words one transfer event takes in a [`Chunk`]: its start (µs since the epoch), its
/// duration (µs, the outcome in the top bit) and its trace thread id.
const EVENT_WORDS: usize = 3;
/// Set in an event's duration word when the transfer succeeded.
const OK_BIT: u64 = 1 << 63;

/// One thread's trace events, [`TRACE_CHUNK_EVENTS`] at most. Written by that thread alone,
/// without a lock: an event's words with plain (relaxed) stores, then `len` with release.
/// Read by whoever hands events to the trace: `len` with acquire, then only the events below
/// it, which are never written again. A lock per event (the previous buffer) cost two
/// atomic read-modify-writes on every transfer; this costs none.
struct Chunk {
    words: Box<[AtomicU64]>,
    len: AtomicUsize,
}

impl Chunk {
    fn new() -> Arc<Chunk> {
        let words = std::iter::repeat_with(|| AtomicU64::new(0)).take(TRACE_CHUNK_EVENTS * EVENT_WORDS).collect();
        Arc::new(Chunk { words, len: AtomicUsize::new(0) })
    }

    /// Appends `e`; false when the chunk is full. Only the chunk's one writer calls this.
    fn push(&self, e: TransferEvent) -> bool {
        let i = self.len.load(Ordering::Relaxed);
        let Some(w) = self.words.get(i * EVENT_WORDS..(i + 1) * EVENT_WORDS) else { return false };
        w[0].store(e.ts, Ordering::Relaxed);
        w[1].store(e.dur | if e.ok { OK_BIT } else { 0 }, Ordering::Relaxed);
        w[2].store(e.tid, Ordering::Relaxed);
        self.len.store(i + 1, Ordering::Release);
        true
    }

    /// Events written so far (each one whole).
    fn written(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Event `i`, below [`Chunk::written`].
    fn event(&self, i: usize) -> TransferEvent {
        let w = &self.words[i * EVENT_WORDS..(i + 1) * EVENT_WORDS];
        let dur = w[1].load(Ordering::Relaxed);
        TransferEvent {
            ts: w[0].load(Ordering::Relaxed),
            dur: dur & !OK_BIT,
            tid: w[2].load(Ordering::Relaxed),
            ok: dur & OK_BIT != 0,
        }
    }
}

/// Events `from..to` of a chunk, handed to the trace.
struct Handed {
    chunk: Arc<Chunk>,
    from: usize,
    to: usize,
}

/// The trace as it will be written: the formatted events of collectives and their waits, the
/// ranges of transfer events the threads' chunks handed over, and the transfer events of
/// threads without a slot of their own.
struct Trace {
    path: Option<PathBuf>,
    formatted: Vec<String>,
    transfers: Vec<Handed>,
    loose: Vec<TransferEvent>,
    /// Events in `formatted`, `transfers` and `loose` together (at most [`TRACE_EVENTS_MAX`]).
    kept: usize,
    dropped: u64,
}

static TRACE: Mutex<Trace> = Mutex::new(Trace {
    path: None,
    formatted: Vec::new(),
    transfers: Vec::new(),
    loose: Vec::new(),
    kept: 0,
    dropped: 0,
});
/// Set once the trace holds [`TRACE_EVENTS_MAX`] events: threads then count instead of buffering.
static TRACE_FULL: &AtomicBool = &SWITCHES.trace_full;

impl Trace {
    /// Room for `n` more events; what does not fit is counted as dropped.
    fn admit(&mut self, n: usize) -> usize {
        let room = (TRACE_EVENTS_MAX - self.kept).min(n);
        self.kept += room;
        self.dropped += (n - room) as u64;
        room
    }

    /// Keeps events `from..to` of `chunk` (as many as fit).
    fn take(&mut self, chunk: &Arc<Chunk>, from: usize, to: usize) {
        let room = self.admit(to.saturating_sub(from));
        if room > 0 {
            self.transfers.push(Handed { chunk: chunk.clone(), from, to: from + room });
        }
    }

    /// Every transfer event kept, handed-over ranges first.
    fn transfer_events(&self) -> impl Iterator<Item = TransferEvent> + '_ {
        let handed = self.transfers.iter().flat_map(|h| (h.from..h.to).map(|i| h.chunk.event(i)));
        handed.chain(self.loose.iter().copied())
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
        if let Some(i) = LATENCY_BUCKETS_NS.iter().position(|&b| nanos <= b) {
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

/// Transfer events a thread's chunk holds; the trace's lock is taken once per this many
/// transfers, when the thread starts a fresh chunk.
pub const TRACE_CHUNK_EVENTS: usize = 4096;
/// Threads that get a slot of their own; later ones, while every slot is taken, share one.
pub const TELEMETRY_SLOTS_MAX: usize = 256;

/// One thread's share of the transfers' telemetry: its histogram and its chunk of trace
/// events. Every worker finishes transfers; with one histogram and one trace buffer for the
/// process, each transfer's counters and lock moved between cores (on the 2-core machine two
/// threads recording at once paid about twice what one did,
/// `cargo run --release -p accord-bench --example telemetry_record_cost 20000`). A slot is
/// written by its thread only, without a lock, and read at a scrape or when the trace is
/// written. Threads past [`TELEMETRY_SLOTS_MAX`] share [`SHARED_SLOT`]'s histogram (with
/// locked adds) and put their events straight into the trace under its lock.
#[repr(align(128))]
struct Slot {
    histogram: AtomicHistogram,
    /// The chunk the owning thread writes, and how many of its events the trace already has.
    chunk: Mutex<SlotChunk>,
    /// Transfer events not kept because the trace was full.
    dropped: AtomicU64,
    /// Whether a live thread owns it (a slot outlives its thread, for its numbers, and goes
    /// to the next thread that needs one, which goes on writing its chunk).
    owned: AtomicBool,
}

#[derive(Default)]
struct SlotChunk {
    current: Option<Arc<Chunk>>,
    handed: usize,
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            histogram: AtomicHistogram::zero(),
            chunk: Mutex::new(SlotChunk { current: None, handed: 0 }),
            dropped: AtomicU64::new(0),
            owned: AtomicBool::new(false),
        }
    }

    fn chunk(&self) -> std::sync::MutexGuard<'_, SlotChunk> {
        self.chunk.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The chunk the owning thread writes (a fresh one the first time).
    fn current(&self) -> Arc<Chunk> {
        self.chunk().current.get_or_insert_with(Chunk::new).clone()
    }

    /// Moves this slot's events the trace does not have yet (and its count of dropped ones)
    /// into `trace`.
    fn hand_over(&self, trace: &mut Trace) {
        trace.dropped += self.dropped.swap(0, Ordering::Relaxed);
        let mut c = self.chunk();
        if let Some(chunk) = c.current.clone() {
            let written = chunk.written();
            trace.take(&chunk, c.handed, written);
            c.handed = written;
        }
    }

    /// The owning thread's chunk is full: hands the rest of it to `trace` and makes `fresh`
    /// (allocated before the trace was locked) the chunk it writes.
    fn replace_full(&self, trace: &mut Trace, fresh: Arc<Chunk>) {
        self.hand_over(trace);
        *self.chunk() = SlotChunk { current: Some(fresh), handed: 0 };
    }
}

/// Every slot handed out so far (leaked: at most [`TELEMETRY_SLOTS_MAX`], reused across threads).
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());
/// The histogram of threads that found no slot free, and of a thread whose own is already
/// gone (a transfer finished inside a thread-local destructor); its chunk is never used.
static SHARED_SLOT: Slot = Slot::empty();

/// A thread's claim on its slot, given back when the thread ends, and the chunk it writes.
struct Claim {
    slot: &'static Slot,
    tid: u64,
    chunk: RefCell<Option<Arc<Chunk>>>,
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
        Claim { slot, tid, chunk: RefCell::new(None) }
    }

    fn shared(&self) -> bool {
        std::ptr::eq(self.slot, &SHARED_SLOT)
    }

    /// Buffers one transfer event of this thread.
    fn trace(&self, e: TransferEvent) {
        if TRACE_FULL.load(Ordering::Relaxed) {
            self.slot.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.shared() {
            trace_loose(e);
            return;
        }
        let mut cached = self.chunk.borrow_mut();
        let chunk = cached.get_or_insert_with(|| self.slot.current());
        if !chunk.push(e) {
            // Allocated and zeroed before the process-wide trace is locked, not while.
            let fresh = Chunk::new();
            self.slot.replace_full(&mut TraceGuard::lock().0, fresh.clone());
            fresh.push(e);
            *chunk = fresh;
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.shared() {
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

/// One transfer event straight into the trace, under its lock (a thread without a slot).
fn trace_loose(e: TransferEvent) {
    let mut t = TraceGuard::lock();
    if t.0.admit(1) == 1 {
        t.0.loose.push(e);
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

/// Whether telemetry records now: on (metrics or trace) and not paused ([`set_recording`]).
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether the trace records now (on and not paused).
#[inline]
pub fn trace_on() -> bool {
    TRACE_ON.load(Ordering::Relaxed)
}

/// What this process asked telemetry for, and whether recording is paused: the switches
/// every transfer reads ([`ON`], [`TRACE_ON`]) are derived from it, under its lock, so a
/// pause and an engine turning telemetry on never race each other into a wrong switch.
struct Wanted {
    metrics: bool,
    trace: bool,
    paused: bool,
}

static WANTED: Mutex<Wanted> = Mutex::new(Wanted { metrics: false, trace: false, paused: false });

/// Changes what is wanted with `f`, then sets the per-transfer switches from it.
fn want(f: impl FnOnce(&mut Wanted)) -> bool {
    let mut w = WANTED.lock().unwrap_or_else(|e| e.into_inner());
    let was_recording = (w.metrics || w.trace) && !w.paused;
    f(&mut w);
    TRACE_ON.store(w.trace && !w.paused, Ordering::Relaxed);
    ON.store((w.metrics || w.trace) && !w.paused, Ordering::Relaxed);
    was_recording
}

/// Turns latency recording on (a metrics endpoint is up).
pub(crate) fn enable_metrics() {
    epoch();
    want(|w| w.metrics = true);
}

/// Turns the trace on, written to `path` (the first engine's path wins); `%p` in it becomes
/// the process id, so the processes of one job write one file each.
pub(crate) fn enable_trace(path: PathBuf) {
    let path = PathBuf::from(path.to_string_lossy().replace("%p", &std::process::id().to_string()));
    epoch();
    TraceGuard::lock().0.path.get_or_insert(path);
    want(|w| w.trace = true);
}

/// Whether an engine of this process turned telemetry on (`ACCORD_METRICS_ADDR` or
/// `ACCORD_TRACE_FILE`), recording paused or not.
pub fn enabled() -> bool {
    let w = WANTED.lock().unwrap_or_else(|e| e.into_inner());
    w.metrics || w.trace
}

/// Pauses (`false`) or resumes (`true`) recording in this whole process; returns whether it
/// was recording before. Paused, nothing is recorded: no transfer's clock reading, latency
/// or trace event, no collective's or collective wait's, exactly as with telemetry off (the
/// switches each transfer reads are the ones off clears, so the paused path costs what off
/// does and the off path gains nothing). Nothing is torn down: the metrics endpoint's thread
/// stays up and scrapes still answer with what was recorded before the pause (and the
/// protocol's counters, which run regardless), and the trace keeps its events and is still
/// written when the engine drops. A transfer submitted before a pause and finished after it
/// is not recorded; one submitted while paused is not either, wherever it finishes.
///
/// Why: telemetry's cost per transfer is small beside the spread between two runs of one
/// benchmark (placement, which core a worker lands on), so it is measured inside one process,
/// in alternating blocks paused and recording, on the same connections
/// (`accord bench p2p --telemetry-ab`, the NCCL plugin's `accord_telemetry_set_recording`).
/// With telemetry never turned on, resuming records nothing: it only lifts a pause.
pub fn set_recording(on: bool) -> bool {
    want(|w| w.paused = !on)
}

fn micros(at: Instant) -> u64 {
    at.saturating_duration_since(epoch()).as_micros() as u64
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

/// Records one finished transfer, started and ended at those [`now_ns`] readings: the cheap
/// path of [`record`]. No formatting, no lock, no atomic read-modify-write and no `Instant`
/// arithmetic (two `duration_since` calls were 40% of the instructions recording a transfer
/// took, `valgrind --tool=callgrind` on the `telemetry_record_cost` example): the calling
/// thread's own histogram and chunk of trace events (its [`Slot`]); the trace's lock is taken
/// once per [`TRACE_CHUNK_EVENTS`] transfers.
pub fn record_transfer(start_ns: u64, end_ns: u64, ok: bool) {
    if !on() {
        return;
    }
    let nanos = end_ns.saturating_sub(start_ns);
    let trace = trace_on();
    let event = |tid| {
        let ts = start_ns.saturating_sub(SWITCHES.epoch_ns.load(Ordering::Relaxed)) / 1000;
        TransferEvent { ts, dur: (nanos / 1000).min(!OK_BIT), tid, ok }
    };
    let own = CLAIM.try_with(|c| {
        c.slot.histogram.add(nanos, !c.shared());
        if trace {
            c.trace(event(c.tid));
        }
    });
    if own.is_err() {
        // This thread's slot is gone (a transfer finished inside a thread-local destructor).
        SHARED_SLOT.histogram.add(nanos, false);
        if trace && TRACE_FULL.load(Ordering::Relaxed) {
            SHARED_SLOT.dropped.fetch_add(1, Ordering::Relaxed);
        } else if trace {
            trace_loose(event(0));
        }
    }
}

/// Writes the trace buffered so far to its file (the whole file, every call). Nothing to do
/// when the trace is off.
pub fn flush_trace() -> std::io::Result<()> {
    let mut guard = TraceGuard::lock();
    let t = &mut guard.0;
    if t.path.is_none() {
        return Ok(());
    }
    t.dropped += SHARED_SLOT.dropped.swap(0, Ordering::Relaxed);
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
    for TransferEvent { ts, dur, tid, ok } in t.transfer_events() {
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
