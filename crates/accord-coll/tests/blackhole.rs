//! A job survives a 5 s outage (issue 25's acceptance): four ranks, each its own engine forced
//! onto UDP loopback with the default timeouts, run all-reduces back to back; every path of
//! every rank is blackholed for 5 s mid-run, which outlasts the connections' idle timeout
//! (5 s). After the heal every all-reduce completes with exact values, no rank is called
//! dead, and the collectives' waits (which name their peers, so liveness watches them) did
//! not give up.

use accord_coll::engine::{connect_in_process, EngineTransport};
use accord_coll::{Bufs, CollConfig, Communicator, DType, ReduceOp};
use accord_engine::{Engine, EngineConfig, FaultConfig};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RANKS: usize = 4;
/// 1 MiB of f32 (plus one): large enough that data is in flight most of the time, as in the
/// issue's `accord bench all-reduce -b 1M -e 64M`.
const COUNT: usize = 262_145;
/// All-reduces each rank runs; the outage starts once rank 0 finished [`BEFORE_OUTAGE`].
const ITERATIONS: usize = 12;
const BEFORE_OUTAGE: usize = 3;
const OUTAGE: Duration = Duration::from_secs(5);
/// Hang guard of the test's own waits.
const WAIT: Duration = Duration::from_secs(60);

fn rank_engine(seed: u64) -> Arc<Engine> {
    let mut config = EngineConfig::default();
    config.shm.enabled = false;
    let engine = Engine::builder()
        .ignore_env()
        .config(config)
        .force_network(true)
        .fault_injection(FaultConfig::default(), seed)
        .build();
    Arc::new(engine.expect("a rank's engine on loopback"))
}

fn values(rank: usize, iteration: usize) -> Vec<f32> {
    (0..COUNT).map(|i| ((rank * 31 + i * 7 + iteration * 13) % 1000) as f32).collect()
}

fn run_rank(rank: usize, mut c: Communicator<EngineTransport>, done: &AtomicUsize) {
    for iteration in 0..ITERATIONS {
        let inputs: Vec<Vec<f32>> = (0..RANKS).map(|r| values(r, iteration)).collect();
        let want: Vec<f32> = (0..COUNT).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
        let buf = c.register_typed(&values(rank, iteration)).unwrap();
        c.all_reduce(Bufs::in_place(buf.all()), COUNT, DType::F32, ReduceOp::Sum, None)
            .unwrap_or_else(|e| panic!("rank {rank} all_reduce {iteration}: {e}"));
        let got = c.read_typed::<f32>(buf.all()).unwrap();
        assert!(got == want, "rank {rank} all_reduce {iteration}: wrong values");
        c.deregister(buf).unwrap();
        if rank == 0 {
            done.store(iteration + 1, Ordering::Release);
        }
    }
}

#[test]
fn four_ranks_resume_after_a_5_s_blackhole_with_the_default_timeouts() {
    let engines: Vec<Arc<Engine>> = (0..RANKS).map(|r| rank_engine(200 + r as u64)).collect();
    assert_eq!(engines[0].config().idle_timeout, OUTAGE, "the outage outlasts the default idle timeout");
    let transports = connect_in_process(engines.clone()).unwrap();
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let ranks: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let done = &done;
                s.spawn(move || run_rank(rank, Communicator::new(t, CollConfig::default()).unwrap(), done))
            })
            .collect();
        let deadline = Instant::now() + WAIT;
        while done.load(Ordering::Acquire) < BEFORE_OUTAGE {
            assert!(Instant::now() < deadline, "rank 0 did not finish {BEFORE_OUTAGE} all-reduces in {WAIT:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        for e in &engines {
            assert!(e.blackhole(OUTAGE));
        }
        let cut_at = done.load(Ordering::Acquire);
        for h in ranks {
            h.join().unwrap();
        }
        eprintln!("the outage began after all-reduce {cut_at}; all {ITERATIONS} completed on every rank");
    });
    for (rank, e) in engines.iter().enumerate() {
        for (other, peer) in engines.iter().enumerate() {
            assert_eq!(e.peer_death(peer.address().id), None, "rank {rank} called live rank {other} dead");
        }
        let s = e.stats();
        let resends: u64 = s.lanes.iter().map(|l| l.reconnect_resends).sum();
        let cut: u64 = s.faults.iter().map(|f| f.cut).sum();
        eprintln!("rank {rank}: {cut} packets cut, {resends} parts resent on fresh connections");
    }
}
