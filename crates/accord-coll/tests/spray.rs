//! The four-rank spray test (issue 25's acceptance): four ranks of one job (a shared secret),
//! each its own engine forced onto UDP loopback, run all-reduces (every algorithm) and
//! all-gathers while, for the whole run:
//!
//! - an outsider holding no secret sprays every port of every rank with random bytes,
//!   truncated and header-flipped datagrams, forged Hellos, forged HelloAcks, ACKs and data
//!   packets carrying the collectives' "stuck" frame, and replays of its own datagrams
//!   (`accord-engine/tests/sprayer`);
//! - an outsider *engine* (a full stack, with no secret) sends every rank a real "stuck"
//!   frame, as a hostile process that read the ranks' ports from `ss` would;
//! - the ranks' own fault injectors replay a share of their real data and ACK packets 150 ms
//!   late and flip a header bit of a few (which the kernel's UDP checksum then covers).
//!
//! Every value must come out exactly right, no collective may fail or be aborted, and each
//! kind of attack must show in the ranks' drop counters.

#[path = "../../accord-engine/tests/sprayer/mod.rs"]
mod sprayer;

use accord_coll::engine::{connect_in_process, EngineTransport};
use accord_coll::{Algo, Bufs, CollConfig, Communicator, DType, ReduceOp};
use accord_engine::{Engine, EngineAddress, EngineConfig, FaultConfig, TransferError};
use accord_proto::JobSecret;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const RANKS: usize = 4;
/// Rounds of collectives each rank runs while the spray goes on.
const ROUNDS: usize = 2;
/// Elements per all-reduce: several packets, not a multiple of the rank count.
const COUNT: usize = 10_001;
/// Elements per rank in an all-gather.
const GATHER: usize = 2_000;
/// The hang guard of every wait (the collectives' own deadline too).
const WAIT: Duration = Duration::from_secs(30);

fn rank_engine(secret: JobSecret, seed: u64) -> Arc<Engine> {
    let mut config = EngineConfig { job_secret: Some(secret), ..EngineConfig::default() };
    config.shm.enabled = false;
    let faults = FaultConfig {
        replay: 0.05,
        replay_delay: Duration::from_millis(150),
        corrupt_header: 0.03,
        ..FaultConfig::default()
    };
    let engine =
        Engine::builder().ignore_env().config(config).force_network(true).fault_injection(faults, seed).build();
    Arc::new(engine.expect("a rank's engine on loopback"))
}

/// Rank `rank`'s all-reduce input: small integers, so float sums are exact in any order.
fn values(rank: usize, round: usize) -> Vec<f32> {
    (0..COUNT).map(|i| ((rank * 31 + i * 7 + round * 13) % 1000) as f32).collect()
}

/// Runs the collectives on one rank; returns how many values it checked.
fn run_rank(rank: usize, mut c: Communicator<EngineTransport>) -> usize {
    let mut checked = 0;
    for round in 0..ROUNDS {
        for algo in [Algo::Ring, Algo::RecursiveDoubling, Algo::Rabenseifner] {
            let inputs: Vec<Vec<f32>> = (0..RANKS).map(|r| values(r, round)).collect();
            let want: Vec<f32> = (0..COUNT).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
            let buf = c.register_typed(&values(rank, round)).unwrap();
            c.all_reduce(Bufs::in_place(buf.all()), COUNT, DType::F32, ReduceOp::Sum, Some(algo))
                .unwrap_or_else(|e| panic!("rank {rank} round {round} {algo}: {e}"));
            let got = c.read_typed::<f32>(buf.all()).unwrap();
            let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert_eq!(wrong, 0, "rank {rank} round {round} {algo}: {wrong} wrong values");
            checked += got.len();
            c.deregister(buf).unwrap();
        }
        let mine: Vec<i32> = (0..GATHER as i32).map(|i| i * 10 + rank as i32 + round as i32 * 100_000).collect();
        let send = c.register_typed(&mine).unwrap();
        let recv = c.register_typed(&vec![0i32; GATHER * RANKS]).unwrap();
        c.all_gather(Bufs { send: send.all(), recv: recv.all() }, GATHER, DType::I32, None)
            .unwrap_or_else(|e| panic!("rank {rank} round {round} all_gather: {e}"));
        let got = c.read_typed::<i32>(recv.all()).unwrap();
        for r in 0..RANKS {
            for i in 0..GATHER {
                let want = i as i32 * 10 + r as i32 + round as i32 * 100_000;
                assert_eq!(got[r * GATHER + i], want, "rank {rank} round {round}: all_gather element {i} of {r}");
            }
        }
        checked += got.len();
        c.deregister(send).unwrap();
        c.deregister(recv).unwrap();
    }
    c.barrier().unwrap();
    checked
}

/// The outsider engine: a real stack without the secret, sending each rank a "stuck" frame
/// naming an innocent rank. Returns how many of its sends completed (none may).
fn outsider_sends(addresses: &[EngineAddress]) -> usize {
    let config = EngineConfig {
        idle_timeout: Duration::from_millis(300),
        peer_dead_after: Duration::from_millis(1000),
        ..EngineConfig::default()
    };
    let outsider = Engine::builder().ignore_env().config(config).force_network(true).build().unwrap();
    let mut delivered = 0;
    for (rank, address) in addresses.iter().enumerate() {
        outsider.add_peer(address).unwrap();
        let frame = sprayer::stuck_frame(rank as u32, ((rank + 1) % RANKS) as u32);
        match outsider.send(address.id, &frame, None).unwrap().wait_timeout(WAIT) {
            Ok(()) => delivered += 1,
            Err(TransferError::PeerUnresponsive { .. } | TransferError::PeerUnreachable) => {}
            Err(other) => panic!("the outsider's send to rank {rank} failed unexpectedly: {other}"),
        }
    }
    delivered
}

#[test]
fn four_ranks_under_spray_compute_every_value_right() {
    let secret = JobSecret([0x44; 32]);
    let engines: Vec<Arc<Engine>> = (0..RANKS).map(|r| rank_engine(secret, 100 + r as u64)).collect();
    let targets: Vec<SocketAddr> =
        engines.iter().flat_map(|e| e.address().nics.into_iter().flatten().flatten()).collect();
    let addresses: Vec<EngineAddress> = engines.iter().map(|e| e.address()).collect();
    let transports = connect_in_process(engines.clone()).unwrap();
    let config = CollConfig { timeout: WAIT, ..CollConfig::default() };
    let stop = AtomicBool::new(false);
    let (checked, sprayed, delivered) = std::thread::scope(|s| {
        let sprayer = s.spawn(|| sprayer::spray(targets, &stop, 44, Duration::from_millis(1)));
        let outsider = s.spawn(|| outsider_sends(&addresses));
        let ranks: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let config = config.clone();
                s.spawn(move || run_rank(rank, Communicator::new(t, config).unwrap()))
            })
            .collect();
        let checked: usize = ranks.into_iter().map(|h| h.join().unwrap()).sum();
        let delivered = outsider.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        (checked, sprayer.join().unwrap(), delivered)
    });
    assert_eq!(delivered, 0, "the outsider engine delivered nothing");

    // What the ranks refused, summed over ranks and lanes.
    let stats: Vec<_> = engines.iter().map(|e| e.stats()).collect();
    let endpoint = |f: fn(&accord_proto::EndpointStats) -> u64| {
        stats.iter().flat_map(|s| &s.lanes).map(|l| f(&l.endpoint)).sum::<u64>()
    };
    let malformed = endpoint(|e| e.malformed);
    let bad_checksum = endpoint(|e| e.bad_checksum + e.integrity_mismatch);
    let unadmitted = endpoint(|e| e.unadmitted);
    let misaddressed = endpoint(|e| e.unknown_connection + e.bad_token);
    let conns: Vec<_> = engines.iter().flat_map(|e| e.connection_stats(None)).map(|(_, _, c)| c).collect();
    let stale: u64 = conns.iter().map(|c| c.stale_frames).sum();
    let duplicates: u64 = conns.iter().map(|c| c.duplicates_received).sum();
    let faults = stats.iter().flat_map(|s| &s.faults);
    let (replayed, flipped) = faults.fold((0, 0), |(r, h), f| (r + f.replayed, h + f.header_corrupted));
    eprintln!(
        "{checked} values right on {RANKS} ranks. Sprayed {sprayed:?} ({} in all); the ranks replayed {replayed} and \
         header-flipped {flipped} of their own packets. Dropped: {malformed} malformed, {bad_checksum} bad checksums, \
         {unadmitted} unadmitted handshakes, {misaddressed} to unknown connections or with bad tokens; \
         {stale} stale frames and {duplicates} duplicate data packets changed nothing",
        sprayed.total()
    );
    assert!(sprayed.random > 0 && sprayed.truncated > 0 && malformed + bad_checksum > 0, "random and truncated");
    assert!(sprayed.header_flipped > 0 && flipped > 0 && bad_checksum > 0, "header flips");
    assert!(sprayed.hellos > 0 && unadmitted > 0, "forged Hellos");
    assert!(sprayed.control > 0 && misaddressed > 0, "forged control frames");
    assert!(sprayed.replayed > 0 && replayed > 0 && stale + duplicates > 0, "replayed data and ACKs");
}
