//! Two engines over the network route, the first with its metrics endpoint on an ephemeral
//! port and its trace written to a fresh file: the pair the telemetry tests record with.

// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use accord_engine::{Engine, EngineConfig};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

/// `(recording engine, peer, trace file)`; the trace file is `accord-trace-<name>-<pid>.json`
/// in the temp directory, removed first.
pub fn recording_pair(name: &str) -> (Engine, Engine, PathBuf) {
    let trace = std::env::temp_dir().join(format!("accord-trace-{name}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let config = EngineConfig {
        force_network: true,
        metrics_addr: Some("127.0.0.1:0".into()),
        trace_file: Some(trace.clone()),
        ..EngineConfig::default()
    };
    let a = Engine::builder().ignore_env().config(config).build().expect("the recording engine");
    let b = Engine::builder()
        .ignore_env()
        .config(EngineConfig { force_network: true, ..Default::default() })
        .build()
        .expect("its peer");
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    (a, b, trace)
}

/// The `transfer` count of the latency histogram in Prometheus text (`metrics_text` or a scrape).
pub fn transfer_count(text: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with("accord_op_latency_seconds_count{op=\"transfer\"}"))
        .unwrap_or_else(|| panic!("no transfer count in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// `GET /metrics` over a plain socket (the endpoint's own thread answers); the body, checked to
/// be the Prometheus text format.
pub fn scrape(addr: std::net::SocketAddr) -> String {
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
