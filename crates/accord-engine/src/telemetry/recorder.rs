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

/// One buffered trace event. Transfers, the frequent kind, are kept as numbers and turned into
/// JSON only when the trace is written: formatting each one as it finished cost small writes a
/// fifth of their rate (4-16 KiB writes, docs/results/2026-11-26-never-hang.md).
enum TraceEvent {
    Transfer { ts: u64, dur: u64, tid: u64, ok: bool },
    Formatted(String),
}

struct Trace {
    path: Option<PathBuf>,
    events: Vec<TraceEvent>,
    dropped: u64,
}

static TRACE: Mutex<Trace> = Mutex::new(Trace { path: None, events: Vec::new(), dropped: 0 });

#[derive(Clone, Debug, Default)]
pub(super) struct Histogram {
    pub(super) buckets: [u64; LATENCY_BUCKETS_S.len()],
    pub(super) count: u64,
    pub(super) sum_s: f64,
}

static LATENCIES: Mutex<BTreeMap<String, Histogram>> = Mutex::new(BTreeMap::new());

/// The transfers' histogram, kept in atomics: every worker finishes transfers, and a shared
/// lock on each was the other half of telemetry's cost on small writes.
struct AtomicHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_S.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

static TRANSFERS: AtomicHistogram = AtomicHistogram {
    buckets: [const { AtomicU64::new(0) }; LATENCY_BUCKETS_S.len()],
    count: AtomicU64::new(0),
    sum_ns: AtomicU64::new(0),
};

/// Name of the transfers' histogram and trace events.
const TRANSFER: &str = "transfer";

/// Every latency histogram by operation name, the transfers' included.
pub(super) fn latencies() -> BTreeMap<String, Histogram> {
    let mut all = LATENCIES.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let count = TRANSFERS.count.load(Ordering::Relaxed);
    if count > 0 {
        let h = all.entry(TRANSFER.to_string()).or_default();
        h.count += count;
        h.sum_s += TRANSFERS.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        for (into, from) in h.buckets.iter_mut().zip(&TRANSFERS.buckets) {
            *into += from.load(Ordering::Relaxed);
        }
    }
    all
}
static TRACE_TID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TID: u64 = TRACE_TID.fetch_add(1, Ordering::Relaxed);
}

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
    let mut t = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    t.path.get_or_insert(path);
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
        let tid = TID.with(|t| *t);
        let name = name.replace('"', "'");
        let event = format!(
            "{{\"name\":\"{name}\",\"cat\":\"{cat}\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{dur},\"pid\":{},\"tid\":{tid},\"args\":{{{args}}}}}",
            std::process::id()
        );
        push_trace(TraceEvent::Formatted(event));
    }
}

/// Records one finished transfer: the cheap path of [`record`] (no lock for the histogram, no
/// formatting until the trace is written).
pub fn record_transfer(start: Instant, end: Instant, ok: bool) {
    if !on() {
        return;
    }
    let nanos = end.saturating_duration_since(start).as_nanos().min(u128::from(u64::MAX)) as u64;
    TRANSFERS.count.fetch_add(1, Ordering::Relaxed);
    TRANSFERS.sum_ns.fetch_add(nanos, Ordering::Relaxed);
    let seconds = nanos as f64 * 1e-9;
    if let Some(i) = LATENCY_BUCKETS_S.iter().position(|&b| seconds <= b) {
        TRANSFERS.buckets[i].fetch_add(1, Ordering::Relaxed);
    }
    if trace_on() {
        let tid = TID.with(|t| *t);
        push_trace(TraceEvent::Transfer { ts: micros(start), dur: nanos / 1000, tid, ok });
    }
}

fn push_trace(event: TraceEvent) {
    let mut t = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    if t.events.len() < TRACE_EVENTS_MAX {
        t.events.push(event);
    } else {
        t.dropped += 1;
    }
}

/// Writes the trace buffered so far to its file (the whole file, every call). Nothing to do
/// when the trace is off.
pub fn flush_trace() -> std::io::Result<()> {
    let t = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(path) = &t.path else { return Ok(()) };
    let mut text = String::with_capacity(t.events.len() * 160 + 64);
    text.push_str("{\"traceEvents\":[\n");
    let pid = std::process::id();
    for (i, event) in t.events.iter().enumerate() {
        if i > 0 {
            text.push_str(",\n");
        }
        match event {
            TraceEvent::Formatted(json) => text.push_str(json),
            TraceEvent::Transfer { ts, dur, tid, ok } => {
                let _ = write!(
                    text,
                    "{{\"name\":\"{TRANSFER}\",\"cat\":\"{TRANSFER}\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{dur},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"ok\":{ok}}}}}"
                );
            }
        }
    }
    let _ = write!(text, "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"dropped_events\":{}}}}}\n", t.dropped);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
