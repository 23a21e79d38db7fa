//! A NIC that goes dead under a stream of writes: its lane is cut off once every path of its
//! connection has been quarantined for `LANE_CUT_OFF_AFTER`, and its writes move to the other
//! NIC then, not at the idle timeout. Two engines of one process over UDP, two NICs each
//! (127.0.0.1 and 127.0.0.2); the writer's NIC 1 is cut by the fault injector mid-stream.
//!
//! The idle timeout is set far above the test's wait bound, so the writes stranded on the dead
//! NIC can only complete through the cut-off: without it this test fails at its bound.
//!
//! Once the lane's avoid period ends it is probed, not used: parts go back to it only after a
//! handshake over it succeeded. The second test keeps the NIC down over many short avoid
//! periods (writes sent to the dead lane would wait out the idle timeout, past the bound),
//! then restores it and sees the lane carry writes again.

use accord_engine::{Engine, EngineConfig, FaultConfig, Transfer, WriteOp, LANE_CUT_OFF_AFTER};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;
use std::time::Instant;

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
    engine_with(fault, accord_engine::LANE_AVOID_AFTER_FAILURE)
}

fn engine_with(fault: bool, lane_avoid: Duration) -> Engine {
    let mut config = EngineConfig {
        lane_avoid,
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

/// Bytes `a` sent to `b` over each of its two lanes so far.
fn bytes_per_lane(a: &Engine, b: &Engine) -> [u64; 2] {
    let mut per = [0u64; 2];
    for (lane, _, c) in a.connection_stats(Some(b.id())) {
        per[lane] += c.bytes_sent;
    }
    per
}

/// Writes one slot after another, `IN_FLIGHT` at a time, until `until` says stop; returns how
/// many. Every write must complete within the bound.
fn stream(a: &Engine, b: &Engine, until: impl Fn(usize) -> bool) -> usize {
    let src = a.alloc(LEN * SLOTS).unwrap();
    let dst = b.alloc(LEN * SLOTS).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let mut in_flight: std::collections::VecDeque<Transfer> = Default::default();
    let mut n = 0;
    while !until(n) {
        assert!(n < 100_000, "bounded");
        if in_flight.len() == IN_FLIGHT {
            in_flight.pop_front().unwrap().wait_timeout(WAIT).unwrap_or_else(|e| panic!("write before {n}: {e}"));
        }
        let at = ((n % SLOTS) * LEN) as u64;
        let op = WriteOp { src: &h, src_offset: at, dst: &d, dst_offset: at, len: LEN as u64, imm: None };
        in_flight.push_back(a.write(&op).unwrap());
        n += 1;
    }
    for t in in_flight {
        t.wait_timeout(WAIT).expect("the last writes complete");
    }
    n
}

#[test]
fn a_lane_whose_nic_stays_down_is_probed_not_used_and_comes_back_once_restored() {
    let avoid = Duration::from_millis(200);
    let a = engine_with(true, avoid);
    let b = engine(false);
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    stream(&a, &b, |n| n >= 16);
    assert!(a.cut_nic(1), "NIC 1 has a fault injector");
    // Many avoid periods with the NIC down: each ends in a probe whose handshake never
    // finishes, so no write is sent into the dead lane.
    let down_until = Instant::now() + avoid * 8;
    let written = stream(&a, &b, |_| Instant::now() >= down_until);
    let at_restore = bytes_per_lane(&a, &b);
    eprintln!("{written} writes with NIC 1 down; bytes per lane at the restore {at_restore:?}");
    for (nic, control) in a.fault_controls() {
        if *nic == 1 {
            for path in 0..EngineConfig::default().paths_per_worker {
                control.restore_path(path);
            }
        }
    }
    // The pending probe's handshake gets through now; then lane 1 carries writes again.
    let back = stream(&a, &b, |n| n > 0 && (bytes_per_lane(&a, &b)[1] > at_restore[1] + LEN as u64 || n >= 20_000));
    let after = bytes_per_lane(&a, &b);
    eprintln!("{back} writes after the restore; bytes per lane {after:?}");
    assert!(after[1] > at_restore[1] + LEN as u64, "lane 1 carries writes again after its NIC came back");
    let cut_offs: u64 = a.stats().lanes.iter().map(|l| l.lane_cut_offs).sum();
    assert_eq!(cut_offs, 1, "cut off once; the probes that followed never put writes on the dead lane");
}
