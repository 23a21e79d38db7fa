//! Transfers recorded from many threads at once (as an engine's workers finish them) are
//! all counted, in the metrics and in the trace, including those still in a thread's
//! partial chunk and those of threads that ended and whose slots went to later threads.
//! A test binary of its own: it counts every transfer the process records.

use accord_engine::{telemetry, Engine, EngineConfig};

const THREADS: usize = 6;
/// Not a multiple of the chunk, so each thread leaves a partial chunk behind.
const PER_THREAD: usize = telemetry::TRACE_CHUNK_EVENTS * 2 + 123;

#[test]
fn every_transfer_of_every_thread_is_in_the_histogram_and_the_trace() {
    let trace = std::env::temp_dir().join(format!("accord-trace-threads-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let config = EngineConfig {
        metrics_addr: Some("127.0.0.1:0".into()),
        trace_file: Some(trace.clone()),
        ..Default::default()
    };
    let engine = Engine::builder().ignore_env().config(config).build().expect("engine");
    // Two waves: the second wave's threads take the slots the first left.
    for _wave in 0..2 {
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                std::thread::spawn(|| {
                    let t0 = telemetry::now_ns();
                    for i in 0..PER_THREAD {
                        telemetry::record_transfer(t0, telemetry::now_ns(), i % 10 != 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    let expected = 2 * THREADS * PER_THREAD;
    let text = engine.metrics_text();
    let count_line = text
        .lines()
        .find(|l| l.starts_with("accord_op_latency_seconds_count{op=\"transfer\"}"))
        .unwrap_or_else(|| panic!("no transfer count in\n{text}"));
    let count: f64 = count_line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(count, expected as f64, "{count_line}");
    drop(engine);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace written")).unwrap();
    let _ = std::fs::remove_file(&trace);
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let transfers: Vec<_> = events.iter().filter(|e| e["name"] == "transfer").collect();
    assert_eq!(transfers.len(), expected, "one event per recorded transfer");
    let failed = transfers.iter().filter(|e| e["args"]["ok"] == false).count();
    assert_eq!(failed, 2 * THREADS * PER_THREAD.div_ceil(10));
    let tids: std::collections::BTreeSet<u64> = transfers.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
    assert_eq!(tids.len(), 2 * THREADS, "each thread has its own trace id");
    assert_eq!(json["otherData"]["dropped_events"], 0);
}
