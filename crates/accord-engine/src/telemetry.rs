//! Telemetry, off by default: Prometheus text over HTTP (`ACCORD_METRICS_ADDR`) and a
//! Chrome/Perfetto trace file (`ACCORD_TRACE_FILE`).
//!
//! Cheap when off: one relaxed atomic load per transfer and per collective step. When on:
//! - **metrics**: per connection (peer, lane) and per path, the protocol's own counters and
//!   gauges (bytes, packets, retransmits, losses, RTT, window, bytes in flight, outstanding
//!   operations, quarantines), peers declared dead, and latency histograms per operation
//!   (`transfer`, and each collective by name), read at scrape time; served by `tiny_http` on
//!   a thread of the engine;
//! - **trace**: one complete event (`"ph": "X"`, microsecond timestamps) per transfer and per
//!   collective and collective wait, buffered in memory (at most [`TRACE_EVENTS_MAX`]) and
//!   written as `{"traceEvents": [...]}` when an engine is dropped (or on [`flush_trace`]);
//!   chrome://tracing and ui.perfetto.dev open it.

use crate::engine::shared::Shared;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Most trace events buffered; later ones are counted as dropped.
pub const TRACE_EVENTS_MAX: usize = 1 << 20;
/// Upper bounds of the latency histograms' buckets, in seconds.
pub const LATENCY_BUCKETS_S: [f64; 12] = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0];

static ON: AtomicBool = AtomicBool::new(false);
static TRACE_ON: AtomicBool = AtomicBool::new(false);
static EPOCH: OnceLock<Instant> = OnceLock::new();

struct Trace {
    path: Option<PathBuf>,
    events: Vec<String>,
    dropped: u64,
}

static TRACE: Mutex<Trace> = Mutex::new(Trace { path: None, events: Vec::new(), dropped: 0 });

#[derive(Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

static LATENCIES: Mutex<BTreeMap<String, Histogram>> = Mutex::new(BTreeMap::new());
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
        let h = l.entry(name.to_string()).or_default();
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
        let mut t = TRACE.lock().unwrap_or_else(|e| e.into_inner());
        if t.events.len() < TRACE_EVENTS_MAX {
            t.events.push(event);
        } else {
            t.dropped += 1;
        }
    }
}

/// Writes the trace buffered so far to its file (the whole file, every call). Nothing to do
/// when the trace is off.
pub fn flush_trace() -> std::io::Result<()> {
    let t = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(path) = &t.path else { return Ok(()) };
    let mut text = String::with_capacity(t.events.len() * 160 + 64);
    text.push_str("{\"traceEvents\":[\n");
    text.push_str(&t.events.join(",\n"));
    let _ = write!(text, "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"dropped_events\":{}}}}}\n", t.dropped);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Starts the metrics endpoint on `addr` (`host:port`; port 0 picks one); returns the bound
/// address. Serves `GET /metrics` (any path, in fact) until the engine is gone.
pub(crate) fn start_metrics_server(
    addr: &str,
    shared: Weak<Shared>,
) -> Result<(SocketAddr, std::thread::JoinHandle<()>), String> {
    let server = tiny_http::Server::http(addr).map_err(|e| format!("ACCORD_METRICS_ADDR={addr}: {e}"))?;
    let bound = server.server_addr().to_ip().ok_or_else(|| format!("ACCORD_METRICS_ADDR={addr}: not an IP socket"))?;
    enable_metrics();
    let thread = std::thread::Builder::new()
        .name("accord-metrics".into())
        .spawn(move || loop {
            let request = match server.recv_timeout(Duration::from_millis(200)) {
                Ok(Some(r)) => r,
                Ok(None) => match shared.upgrade() {
                    Some(s) if !s.liveness.stopped() => continue,
                    _ => return,
                },
                Err(_) => return,
            };
            let Some(s) = shared.upgrade() else { return };
            let body = render(&s);
            drop(s);
            let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"text/plain; version=0.0.4"[..])
                .expect("static header");
            let _ = request.respond(tiny_http::Response::from_string(body).with_header(header));
        })
        .map_err(|e| e.to_string())?;
    Ok((bound, thread))
}

/// The Prometheus text exposition of `shared` now.
pub(crate) fn render(s: &Shared) -> String {
    let mut out = String::new();
    let conns = s.connection_stats(None);
    type Get = fn(&accord_proto::ConnectionStats) -> f64;
    let conn_metrics: [(&str, &str, &str, Get); 10] = [
        ("accord_peer_bytes_sent_total", "counter", "bytes sent to the peer", |c| c.bytes_sent as f64),
        ("accord_peer_bytes_acked_total", "counter", "bytes the peer acknowledged", |c| c.bytes_acked as f64),
        ("accord_peer_packets_sent_total", "counter", "packets sent", |c| c.packets_sent as f64),
        ("accord_peer_packets_received_total", "counter", "packets received", |c| c.packets_received as f64),
        ("accord_peer_retransmits_total", "counter", "packets retransmitted", |c| c.packets_retransmitted as f64),
        ("accord_peer_packets_lost_total", "counter", "packets declared lost", |c| c.packets_lost as f64),
        ("accord_peer_rtt_seconds", "gauge", "smoothed round-trip time", |c| c.rtt_smoothed.as_secs_f64()),
        ("accord_peer_window_bytes", "gauge", "congestion window", |c| c.window_bytes as f64),
        ("accord_peer_bytes_in_flight", "gauge", "bytes sent, not yet acknowledged", |c| c.bytes_in_flight as f64),
        ("accord_peer_ops_outstanding", "gauge", "operations queued or in flight (queue depth)", |c| {
            c.ops_outstanding as f64
        }),
    ];
    let peer_label = |p: &Option<crate::EngineId>| p.map_or("unknown".to_string(), |id| format!("{:016x}", id.0));
    for (name, kind, help, get) in conn_metrics {
        let _ = writeln!(out, "# HELP {name} Per connection: {help}.\n# TYPE {name} {kind}");
        for (lane, peer, c) in &conns {
            let _ = writeln!(out, "{name}{{peer=\"{}\",lane=\"{lane}\"}} {}", peer_label(peer), get(c));
        }
    }
    type PathGet = fn(&accord_proto::path::PathStats) -> f64;
    let path_metrics: [(&str, &str, &str, PathGet); 6] = [
        ("accord_path_packets_sent_total", "counter", "packets sent", |p| p.packets_sent as f64),
        ("accord_path_packets_lost_total", "counter", "packets declared lost", |p| p.packets_lost as f64),
        ("accord_path_retransmits_total", "counter", "retransmissions sent", |p| p.retransmits_sent as f64),
        ("accord_path_rtt_seconds", "gauge", "smoothed round-trip time", |p| p.rtt_smoothed.as_secs_f64()),
        ("accord_path_quarantined", "gauge", "1 while quarantined", |p| f64::from(u8::from(p.quarantined))),
        ("accord_path_quarantines_total", "counter", "times quarantined", |p| p.quarantines as f64),
    ];
    for (name, kind, help, get) in path_metrics {
        let _ = writeln!(out, "# HELP {name} Per path: {help}.\n# TYPE {name} {kind}");
        for (lane, peer, c) in &conns {
            for p in &c.paths {
                let _ = writeln!(
                    out,
                    "{name}{{peer=\"{}\",lane=\"{lane}\",path=\"{}\"}} {}",
                    peer_label(peer),
                    p.path.0,
                    get(p)
                );
            }
        }
    }
    let _ = writeln!(out, "# HELP accord_peer_dead 1 for a peer declared dead.\n# TYPE accord_peer_dead gauge");
    for (peer, _) in s.liveness.deaths() {
        let _ = writeln!(out, "accord_peer_dead{{peer=\"{:016x}\"}} 1", peer.0);
    }
    let _ = writeln!(
        out,
        "# HELP accord_op_latency_seconds Latency of finished operations (transfers, collectives).\n\
         # TYPE accord_op_latency_seconds histogram"
    );
    for (op, h) in LATENCIES.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS_S.iter().enumerate() {
            cumulative += h.buckets[i];
            let _ = writeln!(out, "accord_op_latency_seconds_bucket{{op=\"{op}\",le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "accord_op_latency_seconds_bucket{{op=\"{op}\",le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "accord_op_latency_seconds_sum{{op=\"{op}\"}} {}", h.sum_s);
        let _ = writeln!(out, "accord_op_latency_seconds_count{{op=\"{op}\"}} {}", h.count);
    }
    out
}
