//! The metrics as Prometheus text (format 0.0.4), encoded by `prometheus-client`, the
//! Prometheus project's own Rust client, rather than by hand: escaping, float formatting,
//! the `_total` suffix of counters and the cumulative `le` buckets are its business.
//!
//! Nothing is registered ahead of time: every value is read at scrape time (the workers'
//! protocol counters, the liveness table, the latency histograms), so the scrape takes one
//! [`Snapshot`] and a [`prometheus_client::collector::Collector`] encodes it.

use super::recorder::{self, Histogram, LATENCY_BUCKETS_S};
use crate::engine::shared::Shared;
use crate::EngineId;
use accord_proto::path::PathStats;
use accord_proto::ConnectionStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;

/// The `Content-Type` of what [`render`] returns.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Everything one scrape reports, read once.
#[derive(Debug)]
struct Snapshot {
    connections: Vec<(usize, Option<EngineId>, ConnectionStats)>,
    dead_peers: Vec<EngineId>,
    latencies: BTreeMap<String, Histogram>,
}

type Counter<S> = (&'static str, &'static str, fn(&S) -> u64);
type Gauge<S> = (&'static str, &'static str, fn(&S) -> f64);

/// Per (peer, lane). Counters are named without `_total`: the encoder appends it.
const CONNECTION_COUNTERS: [Counter<ConnectionStats>; 7] = [
    ("accord_peer_bytes_sent", "bytes sent to the peer", |c| c.bytes_sent),
    ("accord_peer_bytes_acked", "bytes the peer acknowledged", |c| c.bytes_acked),
    ("accord_peer_packets_sent", "packets sent", |c| c.packets_sent),
    ("accord_peer_packets_received", "packets received", |c| c.packets_received),
    ("accord_peer_retransmits", "packets retransmitted", |c| c.packets_retransmitted),
    ("accord_peer_packets_lost", "packets declared lost", |c| c.packets_lost),
    ("accord_peer_packets_lost_spurious", "packets declared lost, then acknowledged", |c| c.packets_lost_spurious),
];
const CONNECTION_GAUGES: [Gauge<ConnectionStats>; 4] = [
    ("accord_peer_rtt_seconds", "smoothed round-trip time", |c| c.rtt_smoothed.as_secs_f64()),
    ("accord_peer_window_bytes", "congestion window", |c| c.window_bytes as f64),
    ("accord_peer_bytes_in_flight", "bytes sent, not yet acknowledged", |c| c.bytes_in_flight as f64),
    ("accord_peer_ops_outstanding", "operations queued or in flight (queue depth)", |c| c.ops_outstanding as f64),
];

/// Per (peer, lane, path).
const PATH_COUNTERS: [Counter<PathStats>; 4] = [
    ("accord_path_packets_sent", "packets sent", |p| p.packets_sent),
    ("accord_path_packets_lost", "packets declared lost", |p| p.packets_lost),
    ("accord_path_retransmits", "retransmissions sent", |p| p.retransmits_sent),
    ("accord_path_quarantines", "times quarantined", |p| p.quarantines),
];
const PATH_GAUGES: [Gauge<PathStats>; 2] = [
    ("accord_path_rtt_seconds", "smoothed round-trip time", |p| p.rtt_smoothed.as_secs_f64()),
    ("accord_path_quarantined", "1 while quarantined", |p| f64::from(u8::from(p.quarantined))),
];

/// A number of one series.
enum Reading {
    Counter(u64),
    Gauge(f64),
}

fn peer_label(peer: &Option<EngineId>) -> String {
    peer.map_or_else(|| "unknown".to_string(), |id| format!("{:016x}", id.0))
}

/// Encodes one family of per-connection or per-path readings; `rows` yields each series'
/// labels and reading.
fn encode_family<L: prometheus_client::encoding::EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    counter: bool,
    rows: impl Iterator<Item = (L, Reading)>,
) -> std::fmt::Result {
    let kind = if counter { MetricType::Counter } else { MetricType::Gauge };
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, reading) in rows {
        let series = family.encode_family(&labels)?;
        match reading {
            Reading::Counter(v) => ConstCounter::new(v).encode(series)?,
            Reading::Gauge(v) => ConstGauge::new(v).encode(series)?,
        }
    }
    Ok(())
}

impl Snapshot {
    /// Each connection's labels and stats.
    fn connections(&self) -> impl Iterator<Item = ([(&'static str, String); 2], &ConnectionStats)> + '_ {
        self.connections.iter().map(|(lane, peer, c)| ([("peer", peer_label(peer)), ("lane", lane.to_string())], c))
    }

    /// Each path's labels and stats.
    fn paths(&self) -> impl Iterator<Item = ([(&'static str, String); 3], &PathStats)> + '_ {
        self.connections.iter().flat_map(|(lane, peer, c)| {
            c.paths.iter().map(move |p| {
                ([("peer", peer_label(peer)), ("lane", lane.to_string()), ("path", p.path.0.to_string())], p)
            })
        })
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut encoder;
        for (name, help, get) in CONNECTION_COUNTERS {
            let rows = self.connections().map(|(l, c)| (l, Reading::Counter(get(c))));
            encode_family(e, name, &format!("Per connection: {help}."), true, rows)?;
        }
        for (name, help, get) in CONNECTION_GAUGES {
            let rows = self.connections().map(|(l, c)| (l, Reading::Gauge(get(c))));
            encode_family(e, name, &format!("Per connection: {help}."), false, rows)?;
        }
        for (name, help, get) in PATH_COUNTERS {
            let rows = self.paths().map(|(l, p)| (l, Reading::Counter(get(p))));
            encode_family(e, name, &format!("Per path: {help}."), true, rows)?;
        }
        for (name, help, get) in PATH_GAUGES {
            let rows = self.paths().map(|(l, p)| (l, Reading::Gauge(get(p))));
            encode_family(e, name, &format!("Per path: {help}."), false, rows)?;
        }
        let dead = self.dead_peers.iter().map(|p| ([("peer", format!("{:016x}", p.0))], Reading::Gauge(1.0)));
        encode_family(e, "accord_peer_dead", "1 for a peer declared dead.", false, dead)?;
        let mut family = encoder.encode_descriptor(
            "accord_op_latency_seconds",
            "Latency of finished operations (transfers, collectives).",
            None,
            MetricType::Histogram,
        )?;
        for (op, h) in &self.latencies {
            let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_S.iter().copied().zip(h.buckets.iter().copied()).collect();
            let labels = [("op", op.as_str())];
            family.encode_family(&labels)?.encode_histogram::<NoLabelSet>(h.sum_s, h.count, &buckets, None)?;
        }
        Ok(())
    }
}

/// The Prometheus text exposition of `shared` now.
pub(crate) fn render(s: &Shared) -> String {
    let snapshot = Snapshot {
        connections: s.connection_stats(None),
        dead_peers: s.liveness.deaths().into_iter().map(|(peer, _)| peer).collect(),
        latencies: recorder::latencies(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug in a name or label.
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry) {
        tracing::warn!(error = %e, "could not encode the metrics");
    }
    text
}
