//! The spray test (issue 25): two engines of one job (a shared secret) move writes with
//! immediates and two-sided messages over UDP while an outsider, holding no secret, sprays
//! every one of their ports for the whole run with random bytes, truncated and bit-flipped
//! packets, forged Hellos, forged data and forged control messages (correctly checksummed, so
//! they reach the parser), and the engines themselves replay a share of their own packets
//! (data and ACKs) 150 ms late. Every value must arrive exactly as sent, nothing forged may
//! land, and the receiver's counters must show what it refused.

mod sprayer;

use accord_engine::{Engine, EngineConfig, FaultConfig};
use accord_proto::JobSecret;
use std::net::SocketAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const LEN: usize = 256 * 1024;
const ROUNDS: u8 = 8;

fn engine(secret: JobSecret, seed: u64) -> Engine {
    let mut config = EngineConfig { job_secret: Some(secret), ..EngineConfig::default() };
    config.shm.enabled = false;
    let replays = FaultConfig { replay: 0.05, replay_delay: Duration::from_millis(150), ..FaultConfig::default() };
    Engine::builder().ignore_env().config(config).force_network(true).fault_injection(replays, seed).build().unwrap()
}

#[test]
fn a_job_under_spray_completes_with_every_value_right() {
    let secret = JobSecret([0x25; 32]);
    let (a, b) = (engine(secret, 1), engine(secret, 2));
    let targets: Vec<SocketAddr> =
        [&a, &b].iter().flat_map(|e| e.address().nics.into_iter().flatten().flatten()).collect();
    assert!(!targets.is_empty());
    let plan = sprayer::JobPlan { len: LEN, rounds: ROUNDS, imm: 3, pattern: 31, message_base: 1000, wait: WAIT };
    let (sprayed, sends, got) = sprayer::job_under_spray(&a, &b, &plan, move |stop| {
        sprayer::spray(targets, &stop, 25, Duration::from_micros(200)).total()
    });
    assert_eq!(got.len(), sends.len(), "exactly the job's messages were received, nothing forged");
    for sent in &sends {
        assert!(got.contains(sent), "message {:?} arrived intact", sent.1);
    }
    let stats = b.stats();
    let refused: u64 = stats.lanes.iter().map(|l| l.endpoint.unadmitted).sum();
    assert!(sprayed > 0 && stats.datagrams_dropped() > 0 && refused > 0, "rejects counted: {stats:?}");
    let bad_crc = stats.bad_checksums();
    eprintln!(
        "sprayed {sprayed}; B dropped {}, {refused} unadmitted, {bad_crc} bad checksums",
        stats.datagrams_dropped()
    );
}
