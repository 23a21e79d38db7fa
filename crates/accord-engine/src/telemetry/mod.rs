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
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Weak;
use std::time::Duration;

pub(crate) mod recorder;

pub(crate) use recorder::{enable_metrics, enable_trace};
pub use recorder::{flush_trace, on, record, record_transfer, trace_on, LATENCY_BUCKETS_S, TRACE_EVENTS_MAX};

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
    for (op, h) in recorder::latencies().iter() {
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
