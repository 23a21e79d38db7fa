use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::clock::ManualClock;
use crate::mem::{MemDatapath, MemNetwork};

const QUEUE_PACKETS: usize = 1 << 18;

fn pair(paths: u16) -> (MemNetwork, MemDatapath, MemDatapath) {
    let net = MemNetwork::new();
    let a = net.endpoint(paths, QUEUE_PACKETS).unwrap();
    let b = net.endpoint(paths, QUEUE_PACKETS).unwrap();
    (net, a, b)
}

fn injector(a: MemDatapath, config: FaultConfig, seed: u64) -> (FaultInjector<MemDatapath>, ManualClock) {
    let clock = ManualClock::new();
    let f = FaultInjector::with_clock(a, config, seed, Arc::new(clock.clone())).unwrap();
    (f, clock)
}

/// Sends `count` numbered packets on `path`, in batches of 64.
fn send_numbered(f: &mut impl Datapath, dst: std::net::SocketAddr, path: u16, range: std::ops::Range<u32>) {
    let payloads: Vec<[u8; 12]> = range
        .map(|i| {
            let mut p = [0u8; 12];
            p[..4].copy_from_slice(&i.to_le_bytes());
            p[4..].copy_from_slice(&u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
            p
        })
        .collect();
    for chunk in payloads.chunks(64) {
        let batch: Vec<TxDatagram<'_>> = chunk.iter().map(|p| TxDatagram::new(path, dst, p)).collect();
        assert_eq!(f.send_batch(&batch).unwrap(), batch.len());
    }
}

/// Everything queued at `b`, as (path, bytes).
fn drain(b: &mut MemDatapath) -> Vec<(u16, Vec<u8>)> {
    let mut bufs = b.alloc_rx_buffers(1024).unwrap();
    let mut out = Vec::new();
    // Bounded: the queue holds at most QUEUE_PACKETS.
    for _ in 0..=QUEUE_PACKETS / 1024 {
        if b.recv_batch(&mut bufs, 1024).unwrap() == 0 {
            break;
        }
        out.extend(bufs.iter().map(|(bytes, meta)| (meta.path, bytes.to_vec())));
    }
    out
}

fn seq(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().unwrap())
}

#[test]
fn drop_rate_is_close_to_configured() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let (mut f, _) = injector(a, FaultConfig { drop: 0.1, ..FaultConfig::default() }, 42);
    let mut received = 0;
    for start in (0..100_000u32).step_by(10_000) {
        send_numbered(&mut f, dst, 0, start..start + 10_000);
        received += drain(&mut b).len() as u64;
    }
    let dropped = f.stats().dropped;
    assert!((9_000..=11_000).contains(&dropped), "dropped {dropped} of 100000 at p=0.1");
    assert_eq!(received + dropped, 100_000);
}

fn run_mixed(seed: u64) -> (Vec<(u16, Vec<u8>)>, FaultStats) {
    let (_net, a, mut b) = pair(2);
    let config = FaultConfig { drop: 0.2, duplicate: 0.1, reorder: 0.1, corrupt: 0.1, ..FaultConfig::default() };
    let (mut f, _) = injector(a, config, seed);
    for path in 0..2 {
        send_numbered(&mut f, b.local_addr(path).unwrap(), path, 0..2_000);
    }
    assert_eq!(f.flush().unwrap(), 0);
    (drain(&mut b), f.stats())
}

#[test]
fn same_seed_same_faults() {
    let (first, first_stats) = run_mixed(7);
    let (second, second_stats) = run_mixed(7);
    assert_eq!(first_stats, second_stats);
    assert_eq!(first, second);
    let (other, other_stats) = run_mixed(8);
    assert!(other != first && other_stats != first_stats, "another seed, other faults");
    let s = first_stats;
    assert!(s.dropped > 0 && s.duplicated > 0 && s.reordered > 0 && s.corrupted > 0, "{s:?}");
}

#[test]
fn cut_path_delivers_nothing_until_restored() {
    let (_net, a, b) = pair(2);
    let (mut f, _) = injector(a, FaultConfig::default(), 1);
    let (mut g, _) = injector(b, FaultConfig::default(), 2);
    let control = f.control();
    // Cut from another thread, as a test would pull a NIC mid-transfer.
    std::thread::spawn(move || assert!(control.cut_path(1))).join().unwrap();
    let (dst0, dst1) = (g.local_addr(0).unwrap(), g.local_addr(1).unwrap());
    send_numbered(&mut f, dst1, 1, 0..100);
    send_numbered(&mut f, dst0, 0, 0..100);
    let got = drain(g.inner_mut());
    assert_eq!(got.len(), 100);
    assert!(got.iter().all(|(path, _)| *path == 0));
    assert_eq!(f.stats().cut, 100);

    // Receive side: the receiver's own path 1 is cut; arrivals there vanish.
    assert!(f.restore_path(1));
    assert!(g.cut_path(1));
    send_numbered(&mut f, dst1, 1, 0..10);
    send_numbered(&mut f, dst0, 0, 0..10);
    let mut bufs = g.alloc_rx_buffers(64).unwrap();
    assert_eq!(g.recv_batch(&mut bufs, 64).unwrap(), 10);
    assert!(bufs.iter().all(|(_, meta)| meta.path == 0));
    assert_eq!(g.stats().cut, 10);

    assert!(g.restore_path(1));
    send_numbered(&mut f, dst1, 1, 0..10);
    assert_eq!(g.recv_batch(&mut bufs, 64).unwrap(), 10);
    assert!(bufs.iter().all(|(_, meta)| meta.path == 1));
    assert!(!f.cut_path(9) && !f.restore_path(9), "unknown paths are refused");
}

/// A blackhole swallows every path in both directions and ends by itself when its time is
/// up (on the injector's clock), bounded by `BLACKHOLE_MAX`.
#[test]
fn a_blackhole_swallows_everything_until_its_time_is_up() {
    let (_net, a, b) = pair(2);
    let (mut f, clock) = injector(a, FaultConfig::default(), 1);
    let (mut g, g_clock) = injector(b, FaultConfig::default(), 2);
    let (dst0, dst1) = (g.local_addr(0).unwrap(), g.local_addr(1).unwrap());
    assert_eq!(f.control().blackhole_for(Duration::from_secs(5)), Duration::from_secs(5));
    assert!(f.control().is_blackholed() && f.control().any_cut());
    send_numbered(&mut f, dst0, 0, 0..10);
    send_numbered(&mut f, dst1, 1, 0..10);
    assert!(drain(g.inner_mut()).is_empty(), "nothing leaves a blackholed sender");
    assert_eq!(f.stats().cut, 20);
    // The receive side of a blackholed engine swallows arrivals too.
    g.control().blackhole_for(Duration::from_secs(1));
    clock.advance(Duration::from_secs(5));
    assert!(!f.control().is_blackholed(), "the sender's outage healed by itself");
    send_numbered(&mut f, dst0, 0, 0..10);
    let mut bufs = g.alloc_rx_buffers(64).unwrap();
    assert_eq!(g.recv_batch(&mut bufs, 64).unwrap(), 0, "the receiver's own blackhole still holds");
    assert_eq!(g.stats().cut, 10);
    g_clock.advance(Duration::from_secs(1));
    send_numbered(&mut f, dst0, 0, 0..10);
    assert_eq!(g.recv_batch(&mut bufs, 64).unwrap(), 10, "both ends healed");
    assert_eq!(f.control().blackhole_for(Duration::from_secs(1 << 40)), BLACKHOLE_MAX, "bounded");
    assert_eq!(f.control().blackhole_for(Duration::ZERO), Duration::ZERO);
    assert!(!f.control().is_blackholed(), "a zero blackhole ends the one in force");
}

/// A deafened injector still sends but drops every arrival until its time is up.
#[test]
fn a_deafened_injector_sends_but_hears_nothing_until_its_time_is_up() {
    let (_net, a, b) = pair(1);
    let (mut f, _) = injector(a, FaultConfig::default(), 1);
    let (mut g, g_clock) = injector(b, FaultConfig::default(), 2);
    g.control().deafen_for(Duration::from_secs(2));
    let (dst_f, dst_g) = (f.local_addr(0).unwrap(), g.local_addr(0).unwrap());
    send_numbered(&mut g, dst_f, 0, 0..10);
    assert_eq!(drain(f.inner_mut()).len(), 10, "a deaf sender's packets leave");
    send_numbered(&mut f, dst_g, 0, 0..10);
    let mut bufs = g.alloc_rx_buffers(64).unwrap();
    assert_eq!(g.recv_batch(&mut bufs, 64).unwrap(), 0, "arrivals are dropped");
    g_clock.advance(Duration::from_secs(2));
    send_numbered(&mut f, dst_g, 0, 0..10);
    assert_eq!(g.recv_batch(&mut bufs, 64).unwrap(), 10, "and heard again after");
}

#[test]
fn corruption_flips_one_byte() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let (mut f, _) = injector(a, FaultConfig { corrupt: 1.0, ..FaultConfig::default() }, 3);
    let original = [0x55u8; 100];
    for _ in 0..50 {
        f.send_batch(&[TxDatagram::new(0, dst, &original)]).unwrap();
    }
    let got = drain(&mut b);
    assert_eq!(got.len(), 50);
    for (_, bytes) in got {
        assert_eq!(bytes.len(), original.len());
        assert_eq!(bytes.iter().zip(&original).filter(|(x, y)| x != y).count(), 1);
    }
    assert_eq!(f.stats().corrupted, 50);
}

#[test]
fn duplicates_appear() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let (mut f, _) = injector(a, FaultConfig { duplicate: 0.25, ..FaultConfig::default() }, 4);
    send_numbered(&mut f, dst, 0, 0..4_000);
    let got = drain(&mut b);
    let duplicated = f.stats().duplicated;
    assert!((800..=1_200).contains(&duplicated), "{duplicated}");
    assert_eq!(got.len() as u64, 4_000 + duplicated);
    let mut seqs: Vec<u32> = got.iter().map(|(_, bytes)| seq(bytes)).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), 4_000, "copies follow their original");
}

#[test]
fn reorder_loses_nothing() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let config = FaultConfig { reorder: 0.2, reorder_delay_packets: 5, ..FaultConfig::default() };
    let (mut f, _) = injector(a, config, 5);
    for start in (0..5_000).step_by(50) {
        send_numbered(&mut f, dst, 0, start..start + 50);
    }
    f.flush().unwrap();
    let got: Vec<u32> = drain(&mut b).iter().map(|(_, bytes)| seq(bytes)).collect();
    assert!(f.stats().reordered > 500, "{:?}", f.stats());
    assert!(got.windows(2).any(|w| w[0] > w[1]), "order changed");
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..5_000).collect::<Vec<u32>>());
}

#[test]
fn reordered_packet_goes_out_after_hold_max_when_idle() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let config = FaultConfig { reorder: 1.0, reorder_hold_max: Duration::from_millis(3), ..FaultConfig::default() };
    let (mut f, clock) = injector(a, config, 6);
    f.send_batch(&[TxDatagram::new(0, dst, b"late")]).unwrap();
    let mut bufs = f.alloc_rx_buffers(4).unwrap();
    f.recv_batch(&mut bufs, 4).unwrap();
    assert_eq!(b.queued_packets(), 0);
    clock.advance(Duration::from_millis(3));
    f.recv_batch(&mut bufs, 4).unwrap();
    assert_eq!(drain(&mut b).len(), 1);
}

#[test]
fn delay_follows_the_injected_clock() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let config = FaultConfig { delay: Some(Duration::from_millis(10)), ..FaultConfig::default() };
    let (mut f, clock) = injector(a, config, 7);
    send_numbered(&mut f, dst, 0, 0..3);
    assert_eq!(f.pending_packets(), 3);
    // An idle wait is cut short at the next release (here the manual clock
    // does not move, so it returns after about 10 ms of real time).
    let started = Instant::now();
    assert!(!f.wait_readable(Duration::from_secs(5)).unwrap());
    assert!(started.elapsed() < Duration::from_secs(4));
    clock.advance(Duration::from_millis(9));
    let mut bufs = f.alloc_rx_buffers(4).unwrap();
    f.recv_batch(&mut bufs, 4).unwrap();
    assert_eq!(b.queued_packets(), 0);
    clock.advance(Duration::from_millis(1));
    f.recv_batch(&mut bufs, 4).unwrap();
    let got: Vec<u32> = drain(&mut b).iter().map(|(_, bytes)| seq(bytes)).collect();
    assert_eq!(got, vec![0, 1, 2]);
    assert_eq!(f.stats().delayed, 3);
}

#[test]
fn segmented_sends_lose_single_packets() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let (mut f, _) = injector(a, FaultConfig { drop: 0.5, ..FaultConfig::default() }, 8);
    let bytes: Vec<u8> = (0..40u8).collect();
    let d = TxDatagram { segment_bytes: Some(4), ..TxDatagram::new(0, dst, &bytes) };
    let mut total = 0;
    for _ in 0..20 {
        f.send_batch(&[d]).unwrap();
        for (_, packet) in drain(&mut b) {
            assert!(packet.len() == 4 || packet.len() == 40, "whole segments only");
            assert_eq!(packet.len() % 4, 0);
            total += packet.len() / 4;
        }
    }
    assert_eq!(total as u64 + f.stats().dropped, 200);
    assert!(f.stats().dropped > 0);
}

#[test]
fn transparent_by_default_and_keeps_segmentation() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let (mut f, _) = injector(a, FaultConfig::default(), 9);
    let bytes = [1u8; 10];
    let d = TxDatagram { segment_bytes: Some(5), ..TxDatagram::new(0, dst, &bytes) };
    assert_eq!(f.send_batch(&[d]).unwrap(), 1);
    assert_eq!(drain(&mut b).len(), 2);
    assert_eq!(f.stats(), FaultStats::default());
}

#[test]
fn bad_config_and_input_are_errors() {
    let (_net, a, b) = pair(1);
    for config in [
        FaultConfig { drop: 1.5, ..FaultConfig::default() },
        FaultConfig { corrupt: f64::NAN, ..FaultConfig::default() },
        FaultConfig { held_packets_max: 0, ..FaultConfig::default() },
        FaultConfig { cut_paths: [3].into(), ..FaultConfig::default() },
    ] {
        let net = MemNetwork::new();
        let inner = net.endpoint(1, 1).unwrap();
        assert!(FaultInjector::new(inner, config, 0).is_err());
    }
    let (mut f, _) = injector(a, FaultConfig { drop: 0.5, ..FaultConfig::default() }, 0);
    let huge = vec![0u8; 70_000];
    let dst = b.local_addr(0).unwrap();
    assert!(f.send_batch(&[TxDatagram::new(0, dst, &huge)]).is_err());
    assert!(f.send_batch(&[TxDatagram::new(5, dst, b"x")]).is_err());
    assert_eq!(f.stats(), FaultStats::default(), "rejected before any draw");
}

#[test]
fn replays_go_out_again_verbatim_after_the_replay_delay() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let config = FaultConfig { replay: 1.0, replay_delay: Duration::from_secs(3), ..FaultConfig::default() };
    let (mut f, clock) = injector(a, config, 11);
    send_numbered(&mut f, dst, 0, 0..5);
    let first = drain(&mut b);
    assert_eq!(first.iter().map(|(_, p)| seq(p)).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    clock.advance(Duration::from_millis(2999));
    let mut bufs = f.alloc_rx_buffers(4).unwrap();
    f.recv_batch(&mut bufs, 4).unwrap();
    assert!(drain(&mut b).is_empty(), "nothing replayed before the delay");
    clock.advance(Duration::from_millis(1));
    f.recv_batch(&mut bufs, 4).unwrap();
    let replayed = drain(&mut b);
    assert_eq!(replayed, first, "the same bytes on the same path, in order");
    assert_eq!(f.stats().replayed, 5);
}

#[test]
fn header_corruption_flips_one_bit_inside_the_header() {
    let (_net, a, mut b) = pair(1);
    let dst = b.local_addr(0).unwrap();
    let config = FaultConfig { corrupt_header: 1.0, header_bytes: 8, ..FaultConfig::default() };
    let (mut f, _) = injector(a, config, 12);
    send_numbered(&mut f, dst, 0, 0..200);
    let got = drain(&mut b);
    assert_eq!(got.len(), 200);
    for (i, (_, bytes)) in got.iter().enumerate() {
        let mut clean = [0u8; 12];
        clean[..4].copy_from_slice(&(i as u32).to_le_bytes());
        clean[4..].copy_from_slice(&(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
        let flipped: Vec<usize> = (0..12).filter(|&k| bytes[k] != clean[k]).collect();
        assert_eq!(flipped.len(), 1, "packet {i}: one byte differs");
        assert!(flipped[0] < 8, "packet {i}: the flip is inside the first 8 bytes");
        assert_eq!((bytes[flipped[0]] ^ clean[flipped[0]]).count_ones(), 1, "one bit");
    }
    assert_eq!(f.stats().header_corrupted, 200);
}
