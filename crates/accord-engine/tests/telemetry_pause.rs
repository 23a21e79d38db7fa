//! Pausing recording at run time (`telemetry::set_recording`): transfers made while paused
//! reach neither the `transfer` histogram nor the trace, those made after resuming reach both,
//! and the metrics endpoint answers throughout. A test binary of its own: the switch is the
//! whole process's.

mod telemetry_pair;

use accord_engine::{telemetry, WriteOp};
use std::time::Duration;

const BYTES: usize = 64 << 10;
const BEFORE: usize = 3;
const PAUSED: usize = 5;
const AFTER: usize = 4;

#[test]
fn transfers_made_while_paused_are_not_recorded_and_those_after_resuming_are() {
    assert!(!telemetry::enabled() && !telemetry::on(), "nothing turned telemetry on yet");
    let (a, b, trace) = telemetry_pair::recording_pair("pause");
    assert!(telemetry::enabled() && telemetry::on() && telemetry::trace_on());
    let src = a.alloc(BYTES).unwrap();
    let dst = b.alloc(BYTES).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let writes = |n: usize| {
        for _ in 0..n {
            let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: BYTES as u64, imm: None };
            a.write(&op).unwrap().wait_timeout(Duration::from_secs(30)).expect("write");
        }
    };
    // Scrapes closer together than the endpoint's interval get its last answer again.
    let scrape = || {
        std::thread::sleep(telemetry::SCRAPE_INTERVAL_MIN + Duration::from_millis(50));
        telemetry_pair::transfer_count(&telemetry_pair::scrape(a.metrics_addr().expect("the endpoint is up")))
    };
    writes(BEFORE);
    assert_eq!(scrape(), BEFORE as f64);

    assert!(telemetry::set_recording(false), "it was recording");
    assert!(!telemetry::on() && !telemetry::trace_on() && telemetry::enabled(), "paused, still enabled");
    writes(PAUSED);
    assert_eq!(scrape(), BEFORE as f64, "the endpoint answers while paused, with no paused transfer in it");
    assert!(!telemetry::set_recording(false), "a second pause: it was not recording");

    assert!(!telemetry::set_recording(true), "resumed from a pause");
    assert!(telemetry::on() && telemetry::trace_on());
    writes(AFTER);
    assert_eq!(scrape(), (BEFORE + AFTER) as f64, "transfers after resuming are recorded");

    drop(a);
    let text = std::fs::read_to_string(&trace).expect("the trace file was written at drop");
    let _ = std::fs::remove_file(&trace);
    let json: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let transfers = events.iter().filter(|e| e["name"] == "transfer").count();
    assert_eq!(transfers, BEFORE + AFTER, "the trace has no event of a paused transfer");
}
