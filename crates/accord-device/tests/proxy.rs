//! The proxy over 2-4 ranks in one process: puts land byte for byte at the right peers and
//! offsets, signals sum exactly, counters count once, a signal is seen only after its put's
//! bytes, on every route a CPU test reaches (memcpy, shared memory, UDP, UDP under the fault
//! injector).

mod common;

use accord_device::layout::{Descriptor, Op, SignalOp};
use accord_device::{DeviceCommConfig, HostProducer};
use common::*;

const SRC_BYTES: usize = 8192;
const DST_SLOT: u64 = 4096;
const CHUNKS: u64 = 7;
const CHUNK: u64 = 512;
const VALUE_AT: u64 = 4000;

/// Turns of 3 descriptors in rings of 8 slots: a turn ends with descriptors still waiting, so
/// the proxy's next turns must pick them up (the other tests take whole rings a turn).
fn config() -> DeviceCommConfig {
    DeviceCommConfig {
        rings: 2,
        slot_count: 8,
        descriptors_per_turn: 3,
        user_signals: 4,
        counters: 4,
        ..DeviceCommConfig::default()
    }
}

fn src_offset(peer: usize, k: u64) -> u64 {
    (k * CHUNK + peer as u64 * 13) % (SRC_BYTES as u64 - CHUNK)
}

fn value_of(rank: usize) -> u64 {
    0x0000_a1b2_c3d4_e5f6 + rank as u64
}

/// Every rank sends, from two rings at once, chunks to every rank (itself included), each
/// with a signal add and a counter bump, one put_value, and two signal sets; then checks
/// what landed at it.
fn exchange(route: Route, n: usize) {
    let results = on_ranks(n, route, config(), |rank, dc| {
        let src = dc.alloc_window(SRC_BYTES).unwrap();
        let dst = dc.alloc_window(n * DST_SLOT as usize).unwrap();
        assert_eq!((src, dst), (0, 1), "ids in registration order");
        let data: Vec<u8> = (0..SRC_BYTES).map(|i| pattern(rank, i)).collect();
        dc.write_window(src, 0, &data).unwrap();
        dc.communicator().barrier().unwrap();

        let producers: Vec<HostProducer> = (0..2).map(|r| dc.host_producer(r).unwrap()).collect();
        let pushed = std::thread::scope(|s| {
            let handles: Vec<_> = producers
                .iter()
                .enumerate()
                .map(|(ring, p)| {
                    s.spawn(move || {
                        let mut count = 0u64;
                        for peer in 0..n {
                            for k in (ring as u64..CHUNKS).step_by(2) {
                                let d =
                                    put(peer, dst, rank as u64 * DST_SLOT + k * CHUNK, src, src_offset(peer, k), CHUNK);
                                p.push(&with_counter(with_signal(d, SignalOp::Add, 0, 1), 0)).unwrap();
                                count += 1;
                            }
                            if ring == 1 {
                                let v = Descriptor {
                                    op: Op::PutValue as u8,
                                    peer: peer as u32,
                                    window: dst,
                                    dst_offset: rank as u64 * DST_SLOT + VALUE_AT,
                                    src_offset: value_of(rank),
                                    bytes: 6,
                                    ..Descriptor::default()
                                };
                                p.push(&with_signal(v, SignalOp::Add, 1, 10)).unwrap();
                                p.push(&signal(peer, SignalOp::Set, 2, (rank as u64 + 1) * 100)).unwrap();
                                p.push(&signal(peer, SignalOp::Set, 2, (rank as u64 + 1) * 1000)).unwrap();
                                count += 3;
                            }
                        }
                        count
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<u64>>()
        });

        let n64 = n as u64;
        assert_eq!(dc.wait_signal(0, n64 * CHUNKS, WAIT).unwrap(), n64 * CHUNKS, "chunks from every rank, once");
        assert_eq!(dc.wait_signal(1, n64 * 10, WAIT).unwrap(), n64 * 10);
        let sets: u64 = (1..=n64).map(|r| r * 1000).sum();
        dc.wait_signal(2, sets, WAIT).unwrap();
        // Each rank's slot holds exactly its own contribution: the writes reached the right peers.
        assert_eq!(dc.signal_slots(0).unwrap(), vec![CHUNKS; n]);
        assert_eq!(dc.signal_slots(1).unwrap(), vec![10; n]);
        assert_eq!(dc.signal_slots(2).unwrap(), (1..=n64).map(|r| r * 1000).collect::<Vec<_>>());
        assert_eq!(dc.signal_slots(3).unwrap(), vec![0; n], "an unused signal stays 0");
        // Bytes: every sender's chunks and value, at its slot of this rank's window.
        for from in 0..n {
            for k in 0..CHUNKS {
                let got = read(dc, dst, (from as u64 * DST_SLOT + k * CHUNK) as usize, CHUNK as usize);
                let start = src_offset(rank, k) as usize;
                let want: Vec<u8> = (start..start + CHUNK as usize).map(|i| pattern(from, i)).collect();
                assert!(got == want, "rank {rank}: chunk {k} from rank {from} differs");
            }
            let got = read(dc, dst, (from as u64 * DST_SLOT + VALUE_AT) as usize, 8);
            assert_eq!(&got[..6], &value_of(from).to_le_bytes()[..6], "put_value from rank {from}");
            assert_eq!(&got[6..], &[0, 0], "put_value wrote more than its 6 bytes");
        }
        for (ring, &count) in pushed.iter().enumerate() {
            dc.wait_completed(ring, count, WAIT).unwrap();
        }
        assert_eq!(dc.counter(0).unwrap(), n64 * CHUNKS, "one bump per put with the flag");
        assert_eq!(dc.counter(1).unwrap(), 0);
        assert!(dc.errors().is_empty(), "{:?}", dc.errors());
        let stats = dc.stats();
        assert_eq!(stats.descriptors_executed, pushed.iter().sum::<u64>());
        assert_eq!(stats.bytes_put, n64 * (CHUNKS * CHUNK + 6));
        (dc.read_signal(0).unwrap(), dc.read_signal(2).unwrap())
    });
    let sets: u64 = (1..=n as u64).map(|r| r * 1000).sum();
    for (rank, (chunks, set)) in results.into_iter().enumerate() {
        assert_eq!(chunks, n as u64 * CHUNKS, "rank {rank}");
        assert_eq!(set, sets, "rank {rank}: the last Set of every rank, nothing more");
    }
}

#[test]
fn puts_signals_and_counters_over_memcpy_in_one_process() {
    exchange(Route::Memcpy, 3);
}

#[test]
fn puts_signals_and_counters_over_shared_memory() {
    exchange(Route::Shm, 2);
}

#[test]
fn puts_signals_and_counters_over_udp() {
    exchange(Route::Udp, 3);
}

#[test]
fn puts_signals_and_counters_over_udp_under_loss_reordering_and_duplication() {
    exchange(Route::UdpFaulty, 4);
}

/// Each sender puts `ROUNDS` chunks to every peer in order, each with `Add 1` on the signal
/// named after the sender. A receiver that reads signal `s` = v must find at least v of
/// sender `s`'s chunks complete: a signal is never visible before its put's bytes.
fn signal_after_put(route: Route, n: usize) {
    const ROUNDS: u64 = 48;
    const BYTES: u64 = 1024;
    let cfg =
        DeviceCommConfig { rings: 1, slot_count: 16, user_signals: 4, counters: 1, ..DeviceCommConfig::default() };
    on_ranks(n, route, cfg, |rank, dc| {
        let src = dc.alloc_window((ROUNDS * BYTES) as usize).unwrap();
        let dst = dc.alloc_window(n * (ROUNDS * BYTES) as usize).unwrap();
        let data: Vec<u8> = (0..(ROUNDS * BYTES) as usize).map(|i| pattern(rank, i)).collect();
        dc.write_window(src, 0, &data).unwrap();
        dc.communicator().barrier().unwrap();
        let producer = dc.host_producer(0).unwrap();
        let reader = &*dc;
        std::thread::scope(|s| {
            s.spawn(move || {
                for k in 0..ROUNDS {
                    for peer in 0..n {
                        let d = put(peer, dst, (rank as u64 * ROUNDS + k) * BYTES, src, k * BYTES, BYTES);
                        producer.push(&with_signal(d, SignalOp::Add, rank as u32, 1)).unwrap();
                    }
                }
            });
            let deadline = std::time::Instant::now() + WAIT;
            let mut checks = 0u64;
            loop {
                let mut all_done = true;
                for from in 0..n {
                    let seen = reader.read_signal(from as u32).unwrap();
                    let complete = (0..ROUNDS)
                        .filter(|&k| {
                            let got = read(reader, dst, ((from as u64 * ROUNDS + k) * BYTES) as usize, BYTES as usize);
                            got.iter().enumerate().all(|(i, &b)| b == pattern(from, (k * BYTES) as usize + i))
                        })
                        .count() as u64;
                    assert!(
                        complete >= seen,
                        "rank {rank}: signal from {from} says {seen}, only {complete} chunks landed"
                    );
                    all_done &= seen == ROUNDS;
                    checks += 1;
                }
                if all_done {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "rank {rank}: signals stuck after {checks} checks");
            }
        });
        assert!(dc.errors().is_empty(), "{:?}", dc.errors());
    });
}

#[test]
fn a_signal_is_seen_only_after_its_bytes_over_memcpy() {
    signal_after_put(Route::Memcpy, 3);
}

#[test]
fn a_signal_is_seen_only_after_its_bytes_over_udp_under_faults() {
    signal_after_put(Route::UdpFaulty, 2);
}

#[test]
fn many_adds_from_four_producers_sum_exactly_and_coalesce() {
    const PER_PRODUCER: u64 = 2000;
    let cfg = DeviceCommConfig { rings: 2, slot_count: 8, user_signals: 2, counters: 2, ..DeviceCommConfig::default() };
    let totals = on_ranks(2, Route::Udp, cfg, |rank, dc| {
        let producers: Vec<HostProducer> = (0..4).map(|i| dc.host_producer(i % 2).unwrap()).collect();
        std::thread::scope(|s| {
            for (i, p) in producers.iter().enumerate() {
                s.spawn(move || {
                    for k in 0..PER_PRODUCER {
                        let peer = (rank + 1 + k as usize) % 2;
                        p.push(&signal(peer, SignalOp::Add, 1, i as u64 + 1)).unwrap();
                    }
                });
            }
        });
        // Each rank sends half of every producer's adds to each rank: (1+2+3+4) * 1000 from
        // each of the two ranks.
        let want = 2 * 10 * PER_PRODUCER / 2;
        assert_eq!(dc.wait_signal(1, want, WAIT).unwrap(), want);
        let stats = dc.stats();
        assert_eq!(stats.descriptors_executed, 4 * PER_PRODUCER);
        // Each add either started a write or was folded into the write that followed the one
        // in flight; a follow-up write carries at least one folded add.
        assert!(stats.signal_writes_issued <= 4 * PER_PRODUCER, "{stats:?}");
        assert!(stats.signal_writes_issued + stats.signal_writes_coalesced >= 4 * PER_PRODUCER, "{stats:?}");
        dc.read_signal(1).unwrap()
    });
    assert_eq!(totals, vec![20 * PER_PRODUCER / 2; 2]);
}
