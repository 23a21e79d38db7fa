//! Two engines over the network route, the first with its metrics endpoint on an ephemeral
//! port and its trace written to a fresh file: the pair the telemetry tests record with.

use accord_engine::{Engine, EngineConfig};
use std::path::PathBuf;

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
