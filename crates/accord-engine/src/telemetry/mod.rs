//! Telemetry, off by default: Prometheus text over HTTP (`ACCORD_METRICS_ADDR`) and a
//! Chrome/Perfetto trace file (`ACCORD_TRACE_FILE`).
//!
//! Cheap when off: one relaxed atomic load per transfer and per collective step. Recorded
//! when on: each transfer a user submitted (not the chunks, control frames and probes the
//! engine makes for itself, `Shared::new_internal_transfer`), with one clock reading at
//! submission, an end time shared by the transfers one drain of a worker's events finishes
//! (`clock.rs`), and no lock or shared cache line per transfer (`recorder.rs`). When on:
//! - **metrics**: per connection (peer, lane) and per path, the protocol's own counters and
//!   gauges (bytes, packets, retransmits, losses, RTT, window, bytes in flight, outstanding
//!   operations, quarantines), peers declared dead, and latency histograms per operation
//!   (`transfer`, and each collective by name), read at scrape time, encoded by `prometheus-client` and
//!   served on one thread of the engine (`http`: bounded request size and time per
//!   connection, one connection at a time, at most one fresh reading per
//!   [`SCRAPE_INTERVAL_MIN`]);
//! - **trace**: one complete event (`"ph": "X"`, microsecond timestamps) per transfer and per
//!   collective and collective wait, buffered in memory (at most [`TRACE_EVENTS_MAX`]) and
//!   written as `{"traceEvents": [...]}` when an engine is dropped (or on [`flush_trace`]);
//!   chrome://tracing and ui.perfetto.dev open it.
//!
//! Recording can be paused and resumed at run time ([`set_recording`]) without tearing
//! anything down, so its cost can be measured in one process.

use crate::engine::shared::Shared;
use std::net::SocketAddr;
use std::sync::Weak;
use std::time::{Duration, Instant};

pub(crate) mod clock;
mod exposition;
mod http;
pub(crate) mod recorder;

pub use clock::now_ns;
pub(crate) use clock::SharedReading;
pub(crate) use exposition::render;
pub(crate) use recorder::{enable_metrics, enable_trace};
pub use recorder::{
    enabled, flush_trace, on, record, record_transfer, set_recording, trace_on, LATENCY_BUCKETS_S, TELEMETRY_SLOTS_MAX,
    TRACE_CHUNK_EVENTS, TRACE_EVENTS_MAX,
};

/// Scrapes closer together than this get the previous answer again: each fresh one asks
/// every worker for its counters, and a client scraping in a loop must not slow the job.
pub const SCRAPE_INTERVAL_MIN: Duration = Duration::from_millis(250);

/// Starts the metrics endpoint on `addr` (`host:port`; port 0 picks one); returns the bound
/// address. Serves `GET /metrics` (and `/`) until the engine is gone, on one thread, one
/// connection at a time, each within [`http::Limits::DEFAULT`].
pub(crate) fn start_metrics_server(
    addr: &str,
    shared: Weak<Shared>,
) -> Result<(SocketAddr, std::thread::JoinHandle<()>), String> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| format!("ACCORD_METRICS_ADDR={addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| format!("ACCORD_METRICS_ADDR={addr}: {e}"))?;
    enable_metrics();
    let stopped = shared.clone();
    let mut last: Option<(Instant, String)> = None;
    let body = move || {
        let s = shared.upgrade()?;
        match &last {
            Some((at, text)) if at.elapsed() < SCRAPE_INTERVAL_MIN => {}
            _ => last = Some((Instant::now(), render(&s))),
        }
        last.as_ref().map(|(_, text)| (text.clone(), exposition::CONTENT_TYPE))
    };
    let stop = move || stopped.upgrade().is_none_or(|s| s.liveness.stopped());
    let thread = std::thread::Builder::new()
        .name("accord-metrics".into())
        .spawn(move || http::serve(listener, http::Limits::DEFAULT, body, stop))
        .map_err(|e| e.to_string())?;
    Ok((bound, thread))
}
