//! What telemetry adds to one finished transfer, the old way against the new, in one run:
//! `record` with a formatted args string (how every transfer was recorded before) against
//! `record_transfer` (numbers kept, formatted when the trace is written), each with the clock
//! reading it needs (`Instant::now`, `telemetry::now_ns`). Metrics and trace on.
//! Then `record_transfer` from several threads at once, as an engine's workers finish
//! transfers: ns per call as each thread sees it, so shared locks or counters that bounce
//! between cores show as a cost that grows with the threads.
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
        let t1_ns = telemetry::now_ns();
        for i in 0..calls {
            telemetry::record_transfer(t1_ns, telemetry::now_ns(), i % 97 != 0);
        }
        new.push(t1.elapsed().as_nanos() as f64 / calls as f64);
    }
    old.sort_by(f64::total_cmp);
    new.sort_by(f64::total_cmp);
    println!("calls per round: {calls}, 5 rounds interleaved, median ns per call");
    println!("{:<40} {:>8.1}", "record(name, cat, .., format!(args))", old[2]);
    println!("{:<40} {:>8.1}", "record_transfer(start, end, ok)", new[2]);
    println!("{:<40} {:>8.2}x", "new / old", new[2] / old[2]);
    let mut clock: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let mut last = t;
            for _ in 0..calls {
                last = std::hint::black_box(Instant::now());
            }
            last.duration_since(t).as_nanos() as f64 / calls as f64
        })
        .collect();
    clock.sort_by(f64::total_cmp);
    println!("{:<40} {:>8.1}   (in the first row above)", "Instant::now() alone", clock[2]);
    let mut raw: Vec<f64> = (0..5)
        .map(|_| {
            let t = telemetry::now_ns();
            let mut last = t;
            for _ in 0..calls {
                last = std::hint::black_box(telemetry::now_ns());
            }
            (last - t) as f64 / calls as f64
        })
        .collect();
    raw.sort_by(f64::total_cmp);
    println!("{:<40} {:>8.1}   (in the second row and below)", "telemetry::now_ns() alone", raw[2]);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    println!(
        "record_transfer from T threads at once ({cores} cores), median of 5 rounds, \
         CPU ns per call of the slowest thread (its own CPU time, so time-slicing on a busy host does not count)"
    );
    for threads in [1, 2, 4, 8].into_iter().filter(|&t| t <= cores.max(2)) {
        let mut rounds: Vec<(f64, f64)> = (0..5).map(|_| concurrent_ns_per_call(threads, calls)).collect();
        rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut worst: Vec<f64> = rounds.iter().map(|r| r.1).collect();
        worst.sort_by(f64::total_cmp);
        println!(
            "{:<40} {:>8.1}   longest single call {:>9.1} us (median of the rounds' longest)",
            format!("T = {threads}"),
            rounds[2].0,
            worst[2] / 1000.0
        );
    }
    drop(engine);
    let _ = std::fs::remove_file(&trace);
}

/// `threads` threads each record `calls` transfers, started together; the slowest thread's
/// CPU ns per call, and the longest wall time one call took in any thread (a buffer that
/// grows by reallocating, or a lock held meanwhile, shows there).
fn concurrent_ns_per_call(threads: usize, calls: usize) -> (f64, f64) {
    let start = std::sync::Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    let t0 = telemetry::now_ns();
                    let cpu0 = thread_cpu_ns();
                    let (mut last, mut longest) = (t0, 0u64);
                    for i in 0..calls {
                        let now = telemetry::now_ns();
                        longest = longest.max(now - last);
                        last = now;
                        telemetry::record_transfer(t0, now, i % 97 != 0);
                    }
                    ((thread_cpu_ns() - cpu0) as f64 / calls as f64, longest as f64)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).fold((0.0f64, 0.0f64), |a, b| (a.0.max(b.0), a.1.max(b.1)))
    })
}

/// CPU time of the calling thread, in ns.
#[allow(unsafe_code)]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: one valid timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
