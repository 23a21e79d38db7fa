//! Readings shared inside a span, fresh outside.

use super::*;
use std::time::Duration;

/// A reading taken after this is later than any taken before it.
fn tick() {
    std::thread::sleep(Duration::from_millis(1));
}

#[test]
fn now_ns_is_the_monotonic_clock_in_nanoseconds() {
    let outer = std::time::Instant::now();
    let a = now_ns();
    tick();
    let b = now_ns();
    let outer = outer.elapsed().as_nanos() as u64;
    // The same clock as `Instant`: the inner interval lies within the outer one, and holds the
    // millisecond slept (in nanoseconds, not microseconds or ticks).
    assert!(b - a >= 1_000_000, "{a} then {b}");
    assert!(b - a <= outer, "{} ns inside {outer} ns", b - a);
}

#[test]
fn outside_a_span_every_end_time_is_read_fresh() {
    let a = end_ns();
    tick();
    assert!(end_ns() > a);
}

#[test]
fn inside_a_span_completions_share_a_reading_until_its_uses_run_out() {
    let span = SharedReading::begin_if(true).expect("enabled");
    let first = end_ns();
    for _ in 1..USES_PER_READING {
        tick();
        assert_eq!(end_ns(), first, "shared");
    }
    tick();
    let second = end_ns();
    assert!(second > first, "read again after {USES_PER_READING} uses");
    tick();
    assert_eq!(end_ns(), second);
    drop(span);
    tick();
    assert!(end_ns() > second, "fresh once the span ended");
}

#[test]
fn a_span_when_telemetry_is_off_is_nothing() {
    assert!(SharedReading::begin_if(false).is_none());
    let a = end_ns();
    tick();
    assert!(end_ns() > a);
}
