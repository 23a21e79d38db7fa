//! The collectives over real engines: each rank a thread with its own engine, forced onto the
//! network so every byte crosses UDP loopback through the transport.

use super::*;
use crate::transport::RemoteSlice;
use crate::{Algo, Bufs, DType, ReduceOp};

fn engines(n: usize) -> Vec<Arc<Engine>> {
    (0..n)
        .map(|_| {
            let e = Engine::builder()
                .ignore_env()
                .force_network(true)
                .idle_timeout(Duration::from_secs(2))
                .build()
                .expect("engine on loopback");
            Arc::new(e)
        })
        .collect()
}

fn config() -> CollConfig {
    CollConfig { timeout: Duration::from_secs(3), abort_grace: Duration::from_millis(300), ..CollConfig::default() }
}

/// Runs `f(rank, communicator)` on every rank in its own thread.
fn on_ranks<R: Send>(n: usize, f: impl Fn(usize, Communicator<EngineTransport>) -> R + Sync) -> Vec<R> {
    on_ranks_with(n, config(), f)
}

fn on_ranks_with<R: Send>(
    n: usize,
    cfg: CollConfig,
    f: impl Fn(usize, Communicator<EngineTransport>) -> R + Sync,
) -> Vec<R> {
    let transports = connect_in_process(engines(n)).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let (f, cfg) = (&f, cfg.clone());
                s.spawn(move || f(rank, Communicator::new(t, cfg).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn values(rank: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| ((rank * 31 + i * 7) % 1000) as f32).collect()
}

#[test]
fn all_reduce_over_the_network_matches_the_reference_for_every_algorithm() {
    let n = 3;
    let count = 70_001; // not a multiple of n, several packets
    let expected: Vec<f32> = (0..count).map(|i| (0..n).map(|r| values(r, count)[i]).sum()).collect();
    let results = on_ranks(n, |rank, mut c| {
        let mut out = vec![];
        for algo in [Algo::Ring, Algo::RecursiveDoubling, Algo::Rabenseifner, Algo::Direct] {
            let buf = c.register_typed(&values(rank, count)).unwrap();
            c.all_reduce(Bufs::in_place(buf.all()), count, DType::F32, ReduceOp::Sum, Some(algo)).unwrap();
            out.push((algo, c.read_typed::<f32>(buf.all()).unwrap()));
            c.deregister(buf).unwrap();
        }
        out
    });
    for per_rank in results {
        for (algo, got) in per_rank {
            assert!(got == expected, "{algo}: wrong sum");
        }
    }
}

#[test]
fn gather_scatter_broadcast_and_all_to_all_over_the_network() {
    let n = 4;
    let count = 5000;
    let results = on_ranks(n, |rank, mut c| {
        let mine: Vec<i32> = (0..count as i32).map(|i| i * 10 + rank as i32).collect();
        // all_gather
        let send = c.register_typed(&mine).unwrap();
        let recv = c.register_typed(&vec![0i32; count * n]).unwrap();
        c.all_gather(Bufs { send: send.all(), recv: recv.all() }, count, DType::I32, None).unwrap();
        let gathered = c.read_typed::<i32>(recv.all()).unwrap();
        // broadcast from rank 2
        let b = c.register_typed(&if rank == 2 { mine.clone() } else { vec![0; count] }).unwrap();
        c.broadcast(Bufs::in_place(b.all()), count, DType::I32, 2, None).unwrap();
        let broadcast = c.read_typed::<i32>(b.all()).unwrap();
        // all_to_all: block j of rank r is (r, j)
        let blocks: Vec<i32> = (0..n).flat_map(|j| std::iter::repeat_n((rank * 100 + j) as i32, count)).collect();
        let a_send = c.register_typed(&blocks).unwrap();
        let a_recv = c.register_typed(&vec![0i32; count * n]).unwrap();
        c.all_to_all(Bufs { send: a_send.all(), recv: a_recv.all() }, count, DType::I32, None).unwrap();
        let exchanged = c.read_typed::<i32>(a_recv.all()).unwrap();
        c.barrier().unwrap();
        (gathered, broadcast, exchanged)
    });
    for (rank, (gathered, broadcast, exchanged)) in results.into_iter().enumerate() {
        for r in 0..n {
            for i in [0, count / 2, count - 1] {
                assert_eq!(gathered[r * count + i], i as i32 * 10 + r as i32, "all_gather at rank {rank}");
                assert_eq!(exchanged[r * count + i], (r * 100 + rank) as i32, "all_to_all at rank {rank}");
            }
        }
        assert_eq!(broadcast[count - 1], (count as i32 - 1) * 10 + 2, "broadcast at rank {rank}");
    }
}

/// Direct reduce_scatter and all_gather over the network, 3 ranks, blocks of several packets
/// and segments, out of place (reduce_scatter: block `j` of rank `r` is `values(r)` shifted by
/// `j`).
#[test]
fn direct_reduce_scatter_and_all_gather_over_the_network() {
    let (n, count) = (3, 70_001);
    let block = |r: usize, j: usize| values(r + j, count);
    let results = on_ranks(n, |rank, mut c| {
        let input: Vec<f32> = (0..n).flat_map(|j| block(rank, j)).collect();
        let send = c.register_typed(&input).unwrap();
        let recv = c.register_typed(&vec![0f32; count]).unwrap();
        let bufs = Bufs { send: send.all(), recv: recv.all() };
        c.reduce_scatter(bufs, count, DType::F32, ReduceOp::Sum, Some(Algo::Direct)).unwrap();
        let scattered = c.read_typed::<f32>(recv.all()).unwrap();
        let mine = c.register_typed(&values(rank, count)).unwrap();
        let all = c.register_typed(&vec![0f32; n * count]).unwrap();
        c.all_gather(Bufs { send: mine.all(), recv: all.all() }, count, DType::F32, Some(Algo::Direct)).unwrap();
        (scattered, c.read_typed::<f32>(all.all()).unwrap())
    });
    for (rank, (scattered, gathered)) in results.into_iter().enumerate() {
        let want: Vec<f32> = (0..count).map(|i| (0..n).map(|r| block(r, rank)[i]).sum()).collect();
        assert!(scattered == want, "reduce_scatter at rank {rank}");
        let want: Vec<f32> = (0..n).flat_map(|r| values(r, count)).collect();
        assert!(gathered == want, "all_gather at rank {rank}");
    }
}

#[test]
fn a_rank_that_never_joins_is_named_within_the_timeout() {
    let start = Instant::now();
    let results = on_ranks(3, |rank, mut c| {
        if rank == 1 {
            return None;
        }
        let buf = c.register_typed(&[1.0f32; 1000]).unwrap();
        Some(c.all_reduce(Bufs::in_place(buf.all()), 1000, DType::F32, ReduceOp::Sum, None).unwrap_err())
    });
    for e in results.into_iter().flatten() {
        let named = match &e {
            CollError::Timeout { missing, .. } => missing.contains(&1),
            CollError::PeerFailed { failed_rank, .. } => *failed_rank == 1,
            // The keepalive probe to rank 1's dropped engine failed first (idle timeout 2 s).
            CollError::PeerDied { rank, .. } => *rank == 1,
            _ => false,
        };
        assert!(named, "error does not name rank 1: {e}");
    }
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
}

#[test]
fn long_runs_do_not_accumulate_immediate_counters() {
    let held = on_ranks(2, |_, mut c| {
        let buf = c.register_typed(&[1u8; 256]).unwrap();
        for _ in 0..300 {
            c.all_reduce(Bufs::in_place(buf.all()), 256, DType::U8, ReduceOp::Max, None).unwrap();
        }
        let e = c.transport().engine();
        let held = e.imm_counters();
        if held.len() >= 64 {
            let decoded: Vec<_> =
                held.iter().take(12).map(|(imm, v)| (crate::transport::Imm::decode(*imm), *v)).collect();
            eprintln!("held: {decoded:?}");
        }
        e.imm_counters_held()
    });
    for h in held {
        assert!(h < 64, "{h} immediate counters held after 300 collectives");
    }
}

#[test]
fn barrier_alone_over_the_network() {
    let results = on_ranks(4, |_, mut c| (0..3).map(|_| c.barrier().map_err(|e| e.to_string())).collect::<Vec<_>>());
    for (rank, r) in results.iter().enumerate() {
        for (i, x) in r.iter().enumerate() {
            assert!(x.is_ok(), "rank {rank} barrier {i}: {x:?}");
        }
    }
}

#[test]
fn peer_descriptors_are_parsed_once_and_bad_tokens_stay_errors() {
    let results = on_ranks(2, |rank, c| {
        let t = c.transport();
        let src = t.register(vec![7u8; 64]).unwrap();
        let peer = 1 - rank;
        // A token that is not a descriptor: an error every time, never cached.
        let bad = RemoteBufDesc { rank: peer, len: 64, token: b"not a descriptor".to_vec() };
        for _ in 0..2 {
            let e = t.write(peer, src.slice(0, 8), RemoteSlice { desc: &bad, offset: 0 }, None).unwrap_err();
            assert!(matches!(e, TransportError::Malformed { .. }), "{e}");
        }
        assert!(lock(&t.parsed_descs).is_empty());
        // A real descriptor parses to what the engine made, and is then served from the cache.
        let token = src.remote_desc().token.clone();
        let parsed = t.parse_desc(peer, &token).unwrap();
        assert_eq!(parsed.to_string_compact().into_bytes(), token);
        assert_eq!(t.parse_desc(peer, &token).unwrap(), parsed);
        assert_eq!(lock(&t.parsed_descs).len(), 1);
        t.deregister(src).unwrap();
    });
    assert_eq!(results.len(), 2);
}

/// What one call of each large-message schedule issues per rank, in segments (the default)
/// and in whole blocks (segments larger than any block): segments never leave an immediate
/// waiting for acknowledgements, whole blocks of 256 KiB and more do; the handshake is one
/// control message per peer written by, either way. Results are checked in both.
#[test]
fn segmented_writes_carry_their_immediates_with_the_data() {
    let (n, count) = (4, 1 << 20); // 4 MiB of f32
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| values(r, count)).collect();
    let expected: Vec<f32> = (0..count).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
    for (segment_bytes, whole_blocks) in [(CollConfig::default().segment_bytes, false), (64 << 20, true)] {
        let cfg = CollConfig { segment_bytes, ..config() };
        let per_call = on_ranks_with(n, cfg, |rank, mut c| {
            let mut rows = vec![];
            for algo in [Algo::Ring, Algo::Rabenseifner, Algo::Direct] {
                let send = c.register_typed(&inputs[rank]).unwrap();
                let recv = c.register(vec![0u8; count * 4]).unwrap();
                let before = c.transport().stats();
                c.all_reduce(Bufs { send: send.all(), recv: recv.all() }, count, DType::F32, ReduceOp::Sum, Some(algo))
                    .unwrap();
                let after = c.transport().stats();
                assert_eq!(c.read_typed::<f32>(recv.all()).unwrap(), expected, "{algo}");
                rows.push((
                    algo,
                    after.writes - before.writes,
                    after.writes_sharded_with_imm - before.writes_sharded_with_imm,
                    after.ctrl_messages - before.ctrl_messages,
                ));
                c.deregister(send).unwrap();
                c.deregister(recv).unwrap();
            }
            c.barrier().unwrap();
            rows
        });
        for (algo, writes, sharded_with_imm, ctrl) in &per_call[0] {
            eprintln!(
                "segment_bytes={segment_bytes} {algo}: rank 0 issued {writes} writes, {sharded_with_imm} with the immediate after the ACKs, {ctrl} control messages"
            );
            if whole_blocks {
                assert!(*sharded_with_imm > 0, "{algo}: whole blocks of 1 MiB and more are sharded");
            } else {
                assert_eq!(*sharded_with_imm, 0, "{algo}");
            }
        }
    }
}

/// `join_through`: engines meet through a key-value store the test runs (as a framework's
/// store would be), then all-reduce; a rank that never publishes is named.
#[test]
fn join_through_an_external_store() {
    use crate::store::{StoreClient, StoreServer};
    let server = StoreServer::start("127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    let n = 3;
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = engines(n)
            .into_iter()
            .enumerate()
            .map(|(rank, engine)| {
                s.spawn(move || {
                    let mut store = StoreClient::connect(addr, Duration::from_secs(5)).unwrap();
                    let t = EngineTransport::join_through(&mut store, "job/", rank, n, engine, Duration::from_secs(5))
                        .unwrap();
                    let mut comm = Communicator::new(t, config()).unwrap();
                    let buf = comm.register(values(rank, 64).iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap();
                    comm.all_reduce(Bufs::in_place(buf.all()), 64, DType::F32, ReduceOp::Sum, None).unwrap();
                    let out = comm.deregister(buf).unwrap();
                    comm.barrier().unwrap();
                    out.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want: Vec<f32> = (0..64).map(|i| (0..n).map(|r| values(r, 64)[i]).sum()).collect();
    assert!(sums.iter().all(|s| s == &want));

    let mut store = StoreClient::connect(addr, Duration::from_secs(5)).unwrap();
    let lonely = engines(1).pop().unwrap();
    let e = EngineTransport::join_through(&mut store, "lonely/", 0, 2, lonely, Duration::from_millis(100)).err();
    let message = e.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("[1]"), "{message}");
}

/// Memory registered by address (a tensor's, in the bindings) is reduced where it is, and its
/// owner lives exactly until deregistration.
#[test]
#[allow(unsafe_code)]
fn external_memory_is_reduced_in_place_and_its_owner_released_on_deregister() {
    use std::sync::atomic::AtomicBool;
    struct Owner {
        _memory: Vec<f32>,
        dropped: Arc<AtomicBool>,
    }
    impl Drop for Owner {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }
    let (n, count) = (2, 10_000);
    let expected: Vec<f32> = (0..count).map(|i| (0..n).map(|r| values(r, count)[i]).sum()).collect();
    let results = on_ranks(n, |rank, mut c| {
        let mut memory = values(rank, count);
        let ptr = memory.as_mut_ptr().cast::<u8>();
        let dropped = Arc::new(AtomicBool::new(false));
        let owner = Box::new(Owner { _memory: memory, dropped: dropped.clone() });
        // Safety: the Vec's heap allocation moved into `owner` unchanged and lives as long as it.
        let buf = unsafe { c.transport().register_external(ptr, count * 4, owner) }.unwrap();
        c.all_reduce(Bufs::in_place(buf.all()), count, DType::F32, ReduceOp::Sum, None).unwrap();
        let got = c.read_typed::<f32>(buf.all()).unwrap();
        assert!(!dropped.load(Ordering::SeqCst), "the owner lives while registered");
        c.barrier().unwrap();
        assert!(c.deregister(buf).unwrap().is_empty(), "external memory gives back no Vec");
        (got, dropped.load(Ordering::SeqCst))
    });
    for (got, dropped) in results {
        assert!(got == expected, "wrong sum");
        assert!(dropped, "deregistering releases the owner");
    }
}

#[test]
fn a_null_external_pointer_is_refused() {
    on_ranks(1, |_, c| {
        #[allow(unsafe_code)]
        // Safety: refused before the pointer is used.
        let refused = unsafe { c.transport().register_external(std::ptr::null_mut(), 8, Box::new(())) };
        assert!(matches!(refused, Err(TransportError::NotRegistered { .. })), "{refused:?}");
    });
}
