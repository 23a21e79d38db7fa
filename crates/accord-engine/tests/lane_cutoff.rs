//! A NIC that goes dead under a stream of writes: its lane is cut off once every path of its
//! connection has been quarantined for `LANE_CUT_OFF_AFTER`, and its writes move to the other
//! NIC then, not at the idle timeout. Two engines of one process over UDP, two NICs each
//! (127.0.0.1 and 127.0.0.2); the writer's NIC 1 is cut by the fault injector mid-stream.
//!
//! The idle timeout is set far above the test's wait bound, so the writes stranded on the dead
//! NIC can only complete through the cut-off: without it this test fails at its bound.

use accord_engine::{Engine, EngineConfig, FaultConfig, Transfer, WriteOp, LANE_CUT_OFF_AFTER};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Far above the wait bound below: the idle timeout must play no part.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Hang guard of every wait (much longer than `LANE_CUT_OFF_AFTER`, much shorter than the
/// idle timeout).
const WAIT: Duration = Duration::from_secs(60);
const LEN: usize = 1 << 20;
const SLOTS: usize = 16;
const WRITES: usize = 96;
const IN_FLIGHT: usize = 8;
const IMM: u32 = 7;

fn engine(fault: bool) -> Engine {
    let mut config = EngineConfig {
        nics: vec![IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))],
        idle_timeout: IDLE_TIMEOUT,
        peer_dead_after: IDLE_TIMEOUT,
        // Writes of 1 MiB split into one shard per NIC: every write needs both lanes.
        shard_bytes_min: 64 << 10,
        ..EngineConfig::default()
    };
    config.shm.enabled = false;
    let builder = Engine::builder().ignore_env().config(config).force_network(true);
    let builder = if fault { builder.fault_injection(FaultConfig::default(), 3) } else { builder };
    builder.build().unwrap()
}

fn pattern(slot: usize) -> Vec<u8> {
    (0..LEN).map(|i| (i.wrapping_mul(31) ^ slot.wrapping_mul(0x9e37)) as u8).collect()
}

#[test]
fn writes_stranded_on_a_dead_nic_move_to_the_other_before_the_idle_timeout() {
    assert!(LANE_CUT_OFF_AFTER * 10 < WAIT && WAIT < IDLE_TIMEOUT);
    let a = engine(true);
    let b = engine(false);
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let src = a.alloc(LEN * SLOTS).unwrap();
    let dst = b.alloc(LEN * SLOTS).unwrap();
    for slot in 0..SLOTS {
        src.write_at(slot * LEN, &pattern(slot)).unwrap();
    }
    let (h, d) = (src.handle(), dst.descriptor());
    let mut in_flight: std::collections::VecDeque<Transfer> = Default::default();
    for i in 0..WRITES {
        if in_flight.len() == IN_FLIGHT {
            in_flight.pop_front().unwrap().wait_timeout(WAIT).unwrap_or_else(|e| panic!("a write before {i}: {e}"));
        }
        if i == WRITES / 4 {
            assert!(a.cut_nic(1), "NIC 1 has a fault injector");
        }
        let at = ((i % SLOTS) * LEN) as u64;
        let op = WriteOp { src: &h, src_offset: at, dst: &d, dst_offset: at, len: LEN as u64, imm: Some(IMM) };
        in_flight.push_back(a.write(&op).unwrap());
    }
    for t in in_flight {
        t.wait_timeout(WAIT).expect("the last writes complete through NIC 0");
    }
    assert_eq!(b.imm_counter(IMM).wait(WRITES as u64, WAIT), WRITES as u64, "every immediate");
    let stats = a.stats();
    let cut_offs: u64 = stats.lanes.iter().map(|l| l.lane_cut_offs).sum();
    let failovers: u64 = stats.lanes.iter().map(|l| l.failovers).sum();
    eprintln!("writer: lane cut-offs {cut_offs}, parts failed over {failovers}");
    assert_eq!(cut_offs, 1, "the dead NIC's lane was cut off once (then avoided)");
    assert!(failovers > 0, "its parts moved to the other lane");
    let landed = dst.to_vec();
    for slot in 0..SLOTS {
        assert!(landed[slot * LEN..(slot + 1) * LEN] == pattern(slot)[..], "slot {slot} differs");
    }
    // Checked last, when a duplicate would have landed: each write counted exactly once.
    assert_eq!(b.imm_counter(IMM).value(), WRITES as u64, "counted exactly once");
}
