use super::*;

// The table is process-wide: each test uses its own comm numbers and looks only at them.

fn mine(comm: u32) -> Vec<RequestRecord> {
    snapshot().0.into_iter().filter(|r| r.comm == comm).collect()
}

#[test]
fn a_record_lives_as_long_as_its_guard() {
    let peer = EngineId(0xabcd);
    let send = track(Direction::Send, Waiting::ClearToSend, 9001, peer, 4096, 7);
    std::thread::sleep(Duration::from_millis(5));
    let recv = track(Direction::Recv, Waiting::Data, 9001, peer, 1 << 20, 8);
    let records = mine(9001);
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].direction, Direction::Send, "oldest first");
    assert_eq!(records[0].peer, "000000000000abcd");
    assert!(records[0].age_ms >= records[1].age_ms);
    assert_eq!(count_for(9001, Direction::Recv), 1);
    drop(send);
    assert_eq!(mine(9001).len(), 1);
    drop(recv);
    assert!(mine(9001).is_empty());
}

#[test]
fn a_dump_is_json_that_names_the_peer_and_reads_back() {
    let _r = track(Direction::Recv, Waiting::Data, 9002, EngineId(0x1234), 8192, 3);
    let dump = build_dump(EngineId(0xfeed), "test");
    assert_eq!(dump.kind, DUMP_KIND);
    assert_eq!(dump.engine, "000000000000feed");
    let line = summary_line(&dump);
    assert!(line.contains("request(s) in flight (test)"), "{line}");
    let dir = std::env::temp_dir().join(format!("accord-inflight-test-{}", std::process::id()));
    let path = write_dump(&dir, &dump).expect("written");
    let back: InflightDump = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let ours: Vec<_> = back.requests.iter().filter(|r| r.comm == 9002).collect();
    assert_eq!(ours.len(), 1);
    assert_eq!((ours[0].peer.as_str(), ours[0].bytes, ours[0].waiting), ("0000000000001234", 8192, Waiting::Data));
}

#[test]
fn dumps_are_rate_limited_unless_forced() {
    let engine = EngineId(1);
    dump(engine, "first", true);
    assert!(
        with_table(|t| t.last_dump.is_some_and(|at| at.elapsed() < DUMP_INTERVAL_MIN)),
        "a forced dump sets the clock"
    );
    let before = with_table(|t| t.last_dump);
    dump(engine, "too soon", false);
    assert_eq!(with_table(|t| t.last_dump), before, "a dump within the interval is skipped");
}
