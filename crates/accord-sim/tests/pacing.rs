//! Pacing follows the policy's current rate: a deadline computed while the window was a
//! fraction of a packet must not hold the connection back once the window has grown.

use accord_proto::cc::{CcKind, SwiftConfig};
use accord_proto::{RegionId, RegionKey, WriteRequest};
use accord_sim::{PairConfig, PairSim, Side};
use std::rc::Rc;
use std::time::Duration;

#[test]
fn a_window_that_grows_past_one_packet_stops_pacing_at_once() {
    let mut cfg = PairConfig::datacenter(5);
    // 1% of a packet per RTT: the first chunk alone earns a deadline of about 100 RTTs.
    let swift = SwiftConfig { initial_window_packets: 0.01, ..Default::default() };
    cfg.endpoint.connection.cc = CcKind::Swift(swift);
    let mut sim = PairSim::new(cfg).unwrap();
    sim.connect().unwrap();
    let len = 256 * 1024;
    sim.register(Side::B, RegionId(1), RegionKey(3), len);
    let start = sim.now();
    let req = WriteRequest { region: RegionId(1), key: RegionKey(3), offset: 0, len: len as u64, imm: None, tag: 0 };
    sim.write(Side::A, Rc::new(vec![7u8; len]), 0, req).unwrap();
    sim.run_until_complete().unwrap();
    let took = sim.completions(Side::A)[0].at - start;
    // Additive increase lifts the window above one packet after the first ACKs; from then on
    // only the window limits. The stale deadline alone would have been about 1 ms per chunk.
    assert!(took < Duration::from_millis(1), "write took {took:?}");
    assert!(sim.memory(Side::B).region(RegionId(1)).unwrap().bytes.iter().all(|&b| b == 7));
}

#[test]
fn pacing_that_starts_after_a_timeout_does_not_charge_the_unpaced_chunk_before_it() {
    let mut cfg = PairConfig::datacenter(7);
    cfg.endpoint.connection.cc = CcKind::Swift(SwiftConfig::default());
    cfg.endpoint.connection.path_count = 1;
    let mut sim = PairSim::new(cfg).unwrap();
    sim.connect().unwrap();
    let len = 10_000;
    sim.register(Side::B, RegionId(1), RegionKey(3), len);
    // The only path drops the first flight: a timeout takes Swift below one packet, where it
    // paces, before it has any RTT sample.
    let start = sim.now();
    sim.schedule_cut(start, accord_proto::PathId(0), true);
    sim.schedule_cut(start + Duration::from_micros(20), accord_proto::PathId(0), false);
    let req = WriteRequest { region: RegionId(1), key: RegionKey(3), offset: 0, len: len as u64, imm: None, tag: 0 };
    sim.write(Side::A, Rc::new(vec![9u8; len]), 0, req).unwrap();
    sim.run_until_complete().unwrap();
    let took = sim.completions(Side::A)[0].at - start;
    assert_eq!(sim.completions(Side::A)[0].result, Ok(()));
    // The first flight was sent unpaced: it leaves no pacing gap, so the retransmission goes
    // at the timeout (about 1 ms) instead of after its bytes at the crawl rate (tens of ms).
    assert!(took < Duration::from_millis(5), "write took {took:?}");
}
