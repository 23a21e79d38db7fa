//! Telemetry records what users submitted, once each: a remote read moves as a control frame
//! to the owner and the owner's answering write, both transfers the engines make for
//! themselves, and neither may show in the `transfer` histogram or the trace (each used to,
//! costing a clock read and an event per piece). A test binary of its own: it counts every
//! transfer the process records.

mod telemetry_pair;

use accord_engine::{ReadOp, WriteOp};
use std::time::Duration;

const READS: usize = 6;
const WRITES: usize = 4;
const BYTES: usize = 64 << 10;

#[test]
fn a_remote_read_is_one_recorded_transfer_not_its_frames_and_answer() {
    let began = std::time::Instant::now();
    let (a, b, trace) = telemetry_pair::recording_pair("user");
    let local = a.alloc(BYTES).unwrap();
    let remote = b.alloc(BYTES).unwrap();
    remote.fill(7);
    let (h, d) = (local.handle(), remote.descriptor());
    for _ in 0..READS {
        let op = ReadOp { dst: &h, dst_offset: 0, src: &d, src_offset: 0, len: BYTES as u64, imm: None };
        a.read(&op).unwrap().wait_timeout(Duration::from_secs(30)).expect("read");
    }
    for _ in 0..WRITES {
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: BYTES as u64, imm: None };
        a.write(&op).unwrap().wait_timeout(Duration::from_secs(30)).expect("write");
    }
    let mut back = vec![0u8; BYTES];
    local.read_at(0, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 7), "the reads landed");
    let expected = READS + WRITES;
    assert_eq!(telemetry_pair::transfer_count(&a.metrics_text()), expected as f64, "one per read and per write");
    drop(a);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace written")).unwrap();
    let _ = std::fs::remove_file(&trace);
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let transfers = events.iter().filter(|e| e["name"] == "transfer").count();
    assert_eq!(transfers, expected, "one event per read and per write");
    // Timestamps count from when telemetry was turned on, after `began`: every transfer lies
    // within this test's own lifetime.
    let lifetime_us = began.elapsed().as_micros() as u64;
    for e in events.iter().filter(|e| e["name"] == "transfer") {
        let (ts, dur) = (e["ts"].as_u64().unwrap(), e["dur"].as_u64().unwrap());
        assert!(ts + dur <= lifetime_us, "{e} ends after {lifetime_us} us");
    }
}
