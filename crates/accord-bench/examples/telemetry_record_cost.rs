//! What telemetry adds to one finished transfer, the old way against the new, in one run:
//! `record` with a formatted args string (how every transfer was recorded before) against
//! `record_transfer` (numbers kept, formatted when the trace is written). Metrics and trace on.
//!
//! `cargo run --release -p accord-bench --example telemetry_record_cost [calls]`
//! Prints ns per call, median of 5 rounds each, interleaved; and under
//! `valgrind --tool=callgrind` the instruction counts of the two functions are exact.

use accord_engine::{telemetry, Engine, EngineConfig};
use std::time::Instant;

fn main() {
    let calls: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let trace = std::env::temp_dir().join(format!("accord-record-cost-{}.json", std::process::id()));
    let config = EngineConfig {
        metrics_addr: Some("127.0.0.1:0".into()),
        trace_file: Some(trace.clone()),
        ..EngineConfig::default()
    };
    let engine = Engine::builder().ignore_env().config(config).build().expect("engine");
    assert!(telemetry::on() && telemetry::trace_on());
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t0 = Instant::now();
        for i in 0..calls {
            let ok = if i % 97 != 0 { "true" } else { "false" };
            telemetry::record("transfer", "transfer", t0, Instant::now(), &format!("\"ok\":{ok}"));
        }
        old.push(t0.elapsed().as_nanos() as f64 / calls as f64);
        let t1 = Instant::now();
        for i in 0..calls {
            telemetry::record_transfer(t1, Instant::now(), i % 97 != 0);
        }
        new.push(t1.elapsed().as_nanos() as f64 / calls as f64);
    }
    old.sort_by(f64::total_cmp);
    new.sort_by(f64::total_cmp);
    println!("calls per round: {calls}, 5 rounds interleaved, median ns per call");
    println!("{:<40} {:>8.1}", "record(name, cat, .., format!(args))", old[2]);
    println!("{:<40} {:>8.1}", "record_transfer(start, end, ok)", new[2]);
    println!("{:<40} {:>8.2}x", "new / old", new[2] / old[2]);
    drop(engine);
    let _ = std::fs::remove_file(&trace);
}
