//! The spray test (issue 25): two engines of one job (a shared secret) move writes with
//! immediates and two-sided messages over UDP while an outsider, holding no secret, sprays
//! every one of their ports for the whole run with random bytes, truncated and bit-flipped
//! packets, forged Hellos, forged data and forged control messages (correctly checksummed, so
//! they reach the parser), and the engines themselves replay a share of their own packets
//! (data and ACKs) 150 ms late. Every value must arrive exactly as sent, nothing forged may
//! land, and the receiver's counters must show what it refused.

mod sprayer;

use accord_engine::{Engine, EngineConfig, FaultConfig, WriteOp};
use accord_proto::JobSecret;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
    let stop = Arc::new(AtomicBool::new(false));
    let sprayer = {
        let stop = stop.clone();
        std::thread::spawn(move || sprayer::spray(targets, &stop, 25, Duration::from_micros(200)).total())
    };
    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = received.clone();
    b.post_recvs(4096, 64, move |m| sink.lock().unwrap().push((m.data.to_vec(), m.imm)));
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let dst = b.alloc(LEN).unwrap();
    let d = dst.descriptor();
    let mut sends = Vec::new();
    for round in 0..ROUNDS {
        let bytes: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(31).wrapping_add(round)).collect();
        let src = a.alloc(LEN).unwrap();
        src.write_at(0, &bytes).unwrap();
        let h = src.handle();
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: LEN as u64, imm: Some(3) };
        a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
        assert_eq!(b.imm_counter(3).wait(u64::from(round) + 1, WAIT), u64::from(round) + 1);
        assert_eq!(dst.to_vec(), bytes, "round {round}: every byte as written");
        let message = vec![round; 1000 + usize::from(round)];
        a.send(b.id(), &message, Some(u32::from(round))).unwrap().wait_timeout(WAIT).unwrap();
        sends.push((message, Some(u32::from(round))));
        std::thread::sleep(Duration::from_millis(30)); // let replays of earlier rounds land
    }
    stop.store(true, Ordering::Relaxed);
    let sprayed = sprayer.join().unwrap();
    let got = received.lock().unwrap().clone();
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
