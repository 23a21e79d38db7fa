//! Readings shared inside a span, fresh outside.

use super::*;
use std::time::Duration;

/// A reading taken after this is later than any taken before it.
fn tick() {
    std::thread::sleep(Duration::from_millis(1));
}

#[test]
fn now_ns_is_the_monotonic_clock_in_nanoseconds() {
    let (a, t) = (now_ns(), std::time::Instant::now());
    tick();
    let (b, elapsed) = (now_ns(), t.elapsed());
    assert!(b > a && b - a >= 1_000_000, "{a} then {b}: a millisecond at least");
    // Both clocks saw the same sleep; what lies between the two readings of each is the
    // same few calls, far below a second whatever the machine.
    assert!((b - a).abs_diff(elapsed.as_nanos() as u64) < 1_000_000_000);
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
