//! Timing across the processes of one host, for the latency benches: CLOCK_MONOTONIC (one clock
//! for every process of the host, so one process's submit times and another's arrival times
//! subtract) and a thread that stamps each new value of an immediate counter as it appears.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use accord_engine::ImmCounter;

/// Most counter values one watcher records.
pub const ARRIVALS_MAX: usize = 1 << 20;

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // Safety: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Starts a thread that polls `counter` (so a time is the arrival's, not a wake-up's) and
/// records `(value, monotonic_ns)` for each new value until `stop` is set, at most
/// [`ARRIVALS_MAX`]; joining it gives the list. It spins a core while it runs: a bench tool.
pub fn watch_arrivals(counter: ImmCounter, stop: Arc<AtomicBool>) -> JoinHandle<Vec<(u64, u64)>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut last = counter.value();
        while !stop.load(Ordering::Acquire) && seen.len() < ARRIVALS_MAX {
            let value = counter.value();
            if value != last {
                seen.push((value, monotonic_ns()));
                last = value;
            }
            std::hint::spin_loop();
        }
        seen
    })
}

/// `value:ns` pairs joined by commas (what a child process prints for its parent).
pub fn format_arrivals(arrivals: &[(u64, u64)]) -> String {
    arrivals.iter().map(|(v, ns)| format!("{v}:{ns}")).collect::<Vec<_>>().join(",")
}

/// Parses [`format_arrivals`]' output into value -> ns (malformed pairs are skipped).
pub fn parse_arrivals(line: &str) -> std::collections::HashMap<u64, u64> {
    line.trim()
        .split(',')
        .filter_map(|pair| pair.split_once(':'))
        .filter_map(|(v, ns)| Some((v.parse().ok()?, ns.parse().ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_round_trip_and_garbage_is_skipped() {
        let list = [(1, 100), (2, 250)];
        let parsed = parse_arrivals(&format_arrivals(&list));
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[&2], 250);
        assert_eq!(parse_arrivals("x:1,3:,4:40").len(), 1);
        assert!(monotonic_ns() > 0);
    }
}
