//! Telemetry end to end: two engines talk over the network path; the metrics endpoint is
//! scraped over HTTP and its Prometheus text parsed, and the trace file written at drop is
//! loaded as JSON with one complete event per transfer.

use accord_engine::{Engine, EngineConfig, WriteOp};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const WRITES: usize = 20;

/// `GET /metrics` over a plain socket; the body.
fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the response");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// Parses the text exposition: every sample line is `name{labels} value`; `# TYPE` precedes
/// each family. Returns samples by `name{labels}`.
fn parse(body: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let mut typed = std::collections::HashSet::new();
    for line in body.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            typed.insert(it.next().unwrap().to_string());
            assert!(matches!(it.next(), Some("counter" | "gauge" | "histogram")), "{line}");
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("sample without value: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line}"));
        let family = series.split('{').next().unwrap();
        let base = family.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
        assert!(typed.contains(family) || typed.contains(base), "{family} has no # TYPE line");
        samples.insert(series.to_string(), value);
    }
    samples
}

#[test]
fn metrics_are_scraped_and_the_trace_loads_as_json() {
    let trace = std::env::temp_dir().join(format!("accord-trace-test-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let config = EngineConfig {
        force_network: true,
        metrics_addr: Some("127.0.0.1:0".into()),
        trace_file: Some(trace.clone()),
        ..EngineConfig::default()
    };
    let a = Engine::builder().ignore_env().config(config).build().expect("engine a");
    let b = Engine::builder()
        .ignore_env()
        .config(EngineConfig { force_network: true, ..Default::default() })
        .build()
        .unwrap();
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let src = a.alloc(1 << 20).unwrap();
    let dst = b.alloc(1 << 20).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    for _ in 0..WRITES {
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: None };
        a.write(&op).unwrap().wait().unwrap();
    }
    let addr = a.metrics_addr().expect("the endpoint is up");
    let samples = parse(&scrape(addr));
    let peer = format!("{:016x}", b.id().0);
    let sent: f64 = samples
        .iter()
        .filter(|(k, _)| k.starts_with("accord_peer_bytes_sent_total{") && k.contains(&peer))
        .map(|(_, v)| v)
        .sum();
    assert!(sent >= (WRITES << 20) as f64, "bytes sent to b: {sent}");
    assert!(samples.keys().any(|k| k.starts_with("accord_path_rtt_seconds{")), "per-path gauges present");
    assert_eq!(samples.get("accord_op_latency_seconds_count{op=\"transfer\"}").copied(), Some(WRITES as f64));
    drop(a);
    let text = std::fs::read_to_string(&trace).expect("the trace file was written at drop");
    let _ = std::fs::remove_file(&trace);
    let json: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let transfers = events.iter().filter(|e| e["name"] == "transfer" && e["ph"] == "X").count();
    assert_eq!(transfers, WRITES, "one complete event per transfer");
    assert!(events.iter().all(|e| e["ts"].is_u64() && e["dur"].is_u64()));
}
