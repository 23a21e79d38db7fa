//! The authenticated mode under attack (issue 25): two engines of one job in
//! `ACCORD_INTEGRITY=mac` move writes and two-sided messages over UDP while
//! - an outsider, holding no secret, sprays their ports with random bytes, forged Hellos,
//!   ACKs and data and control frames (the sprayer's, `tests/sprayer`) carrying the MAC mode
//!   byte and a guessed tag, the same sealed with a correct CRC instead (a downgrade attempt),
//!   truncations, and replays of what it sent;
//! - the fault injector replays a share of the engines' own authentic packets (data and ACKs)
//!   150 ms late, and flips header bits after the UDP checksum.
//!
//! Every value must arrive exactly as sent, nothing forged may land, and the receiver's counters
//! must show what it refused (tags that failed, modes that did not match).

mod sprayer;

use accord_engine::{Engine, EngineConfig, FaultConfig};
use accord_proto::wire::{self, Integrity};
use accord_proto::JobSecret;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const LEN: usize = 256 * 1024;
const ROUNDS: u8 = 6;
/// Bound on the sprayer's loop, whatever happens to the stop flag.
const SPRAY_DATAGRAMS_MAX: usize = 2_000_000;

fn engine(secret: JobSecret, seed: u64) -> Engine {
    let mut config = EngineConfig { job_secret: Some(secret), integrity: Integrity::Mac, ..EngineConfig::default() };
    config.shm.enabled = false;
    config.datagram_bytes = 4096 + wire::DATA_HEADER_LEN as u16; // many packets, many to replay
    let faults = FaultConfig {
        replay: 0.05,
        replay_delay: Duration::from_millis(150),
        corrupt_header: 0.02,
        ..FaultConfig::default()
    };
    Engine::builder().ignore_env().config(config).force_network(true).fault_injection(faults, seed).build().unwrap()
}

/// A forged packet of any kind the sprayer forges (a Hello, a HelloAck, an ACK or a two-sided
/// send carrying a control frame) to a guessed connection, with a random tag appended in the
/// MAC layout, or sealed with a correct CRC instead.
fn forged(rng: &mut ChaCha8Rng, with_crc: bool) -> Vec<u8> {
    let kind = rng.gen_range(0..sprayer::FORGED_KINDS);
    let mut buf = sprayer::forged_unsealed(rng, kind);
    if with_crc {
        wire::seal(&mut buf, Integrity::Full);
    } else {
        let tag: [u8; wire::MAC_TAG_LEN] = rng.gen();
        buf.extend_from_slice(&tag);
        buf[wire::field::INTEGRITY] = Integrity::Mac.to_u8();
    }
    buf
}

/// Sprays `targets` until `stop`, bounded by [`SPRAY_DATAGRAMS_MAX`]. Returns datagrams sent.
fn spray(targets: Vec<SocketAddr>, stop: Arc<AtomicBool>) -> usize {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2525);
    let mut sent = 0;
    let mut kept: Vec<Vec<u8>> = Vec::new();
    while !stop.load(Ordering::Relaxed) && sent < SPRAY_DATAGRAMS_MAX {
        let d = match rng.gen_range(0..6) {
            0 => (0..rng.gen_range(0..1500)).map(|_| rng.gen()).collect(),
            1 => {
                let mut d = forged(&mut rng, false);
                d.truncate(rng.gen_range(0..d.len()));
                d
            }
            2 => forged(&mut rng, true),
            3 if !kept.is_empty() => kept[rng.gen_range(0..kept.len())].clone(),
            _ => forged(&mut rng, false),
        };
        if kept.len() < 256 && rng.gen_bool(0.1) {
            kept.push(d.clone());
        }
        for target in &targets {
            let _ = socket.send_to(&d, target);
            sent += 1;
        }
        if sent % 64 == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    sent
}

#[test]
fn a_mac_job_under_spray_and_replays_completes_with_every_value_right() {
    let secret = JobSecret([0x52; 32]);
    let (a, b) = (engine(secret, 11), engine(secret, 12));
    let targets: Vec<SocketAddr> =
        [&a, &b].iter().flat_map(|e| e.address().nics.into_iter().flatten().flatten()).collect();
    assert!(!targets.is_empty());
    let plan = sprayer::JobPlan { len: LEN, rounds: ROUNDS, imm: 5, pattern: 37, message_base: 900, wait: WAIT };
    let (sprayed, sends, got) = sprayer::job_under_spray(&a, &b, &plan, move |stop| spray(targets, stop));
    assert_eq!(got.len(), sends.len(), "exactly the job's messages were received, nothing forged");
    for sent in &sends {
        assert!(got.contains(sent), "message {:?} arrived intact", sent.1);
    }
    let (sa, sb) = (a.stats(), b.stats());
    let mismatched: u64 = sb.lanes.iter().map(|l| l.endpoint.integrity_mismatch).sum();
    assert!(sprayed > 0 && sb.bad_tags() > 0, "forged tags refused and counted: {sb:?}");
    assert!(mismatched > 0, "CRC-sealed packets refused in a mac job (no downgrade): {sb:?}");
    let replayed: u64 = sa.faults.iter().chain(&sb.faults).map(|f| f.replayed).sum();
    let flipped: u64 = sa.faults.iter().chain(&sb.faults).map(|f| f.header_corrupted).sum();
    assert!(replayed > 0 && flipped > 0, "authentic replays ({replayed}) and header flips ({flipped}) were injected");
    eprintln!(
        "sprayed {sprayed}; B dropped {}: {} bad tags, {mismatched} other modes; {replayed} replays, {flipped} flips injected",
        sb.datagrams_dropped(),
        sb.bad_tags()
    );
}
