//! Readings shared inside a span, fresh outside.

use super::*;
use std::time::Duration;

/// A reading taken after this is later than any taken before it.
fn tick() {
    std::thread::sleep(Duration::from_millis(1));
}

#[test]
fn outside_a_span_every_end_time_is_read_fresh() {
    let a = end_time();
    tick();
    assert!(end_time() > a);
}

#[test]
fn inside_a_span_completions_share_a_reading_until_its_uses_run_out() {
    let span = SharedReading::begin_if(true).expect("enabled");
    let first = end_time();
    for _ in 1..USES_PER_READING {
        tick();
        assert_eq!(end_time(), first, "shared");
    }
    tick();
    let second = end_time();
    assert!(second > first, "read again after {USES_PER_READING} uses");
    tick();
    assert_eq!(end_time(), second);
    drop(span);
    tick();
    assert!(end_time() > second, "fresh once the span ended");
}

#[test]
fn a_span_when_telemetry_is_off_is_nothing() {
    assert!(SharedReading::begin_if(false).is_none());
    let a = end_time();
    tick();
    assert!(end_time() > a);
}
