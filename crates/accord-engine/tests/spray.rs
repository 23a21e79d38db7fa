//! The spray test (issue 25): two engines of one job (a shared secret) move writes with
//! immediates and two-sided messages over UDP while an outsider, holding no secret, sprays
//! every one of their ports for the whole run with random bytes, truncated and bit-flipped
//! packets, forged Hellos, forged data and forged control messages (correctly checksummed, so
//! they reach the parser), and the engines themselves replay a share of their own packets
//! (data and ACKs) 150 ms late. Every value must arrive exactly as sent, nothing forged may
//! land, and the receiver's counters must show what it refused.

use accord_engine::{Engine, EngineConfig, FaultConfig, WriteOp};
use accord_proto::wire::{self, DataKind, DataRepr, Header, HelloRepr, Integrity, Repr};
use accord_proto::{ConnectionId, JobSecret, OpId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const LEN: usize = 256 * 1024;
const ROUNDS: u8 = 8;
/// Bound on the sprayer's loop, whatever happens to the stop flag.
const SPRAY_DATAGRAMS_MAX: usize = 2_000_000;

fn engine(secret: JobSecret, seed: u64) -> Engine {
    let mut config = EngineConfig { job_secret: Some(secret), ..EngineConfig::default() };
    config.shm.enabled = false;
    let replays = FaultConfig { replay: 0.05, replay_delay: Duration::from_millis(150), ..FaultConfig::default() };
    Engine::builder().ignore_env().config(config).force_network(true).fault_injection(replays, seed).build().unwrap()
}

/// One forged datagram of the kind `kind`, aimed at a guessed connection.
fn forged(rng: &mut ChaCha8Rng, kind: u32) -> Vec<u8> {
    let header = Header { dst_conn: ConnectionId(rng.gen()), token: rng.gen() };
    let hello = HelloRepr {
        src_conn: ConnectionId(rng.gen()),
        src_token: rng.gen(),
        max_payload_bytes: 9000,
        path_count: 4,
        recv_window_packets: 256,
        proof: rng.gen(),
    };
    let payload_len = 64u16;
    // A two-sided send whose payload looks like the collectives' "stuck" control frame.
    let data = DataRepr {
        psn: rng.gen_range(0..64),
        ack_floor: 0,
        tx_time_ns: 1,
        op: OpId(rng.gen()),
        kind: DataKind::Send,
        imm: None,
        tag: 0,
        msg_len: u64::from(payload_len),
        msg_offset: 0,
        payload_len,
        ack_now: true,
        retransmission: false,
        receiver_driven: false,
        wants_more: false,
    };
    let mut buf = vec![0u8; 2048];
    let (header, repr) = match kind {
        0 => (Header { dst_conn: ConnectionId(0), token: 0 }, Repr::Hello(hello)),
        1 => (header, Repr::HelloAck(hello)),
        _ => (header, Repr::Data(data)),
    };
    let mut len = wire::emit(&header, &repr, &mut buf).unwrap();
    if let Repr::Data(_) = repr {
        buf[len] = 2; // FRAME_STUCK's kind byte, then "rank 0 is stuck on rank 1"
        len += usize::from(payload_len);
    }
    buf.truncate(len);
    wire::seal(&mut buf, Integrity::Full);
    buf
}

/// Sprays `targets` until `stop`, bounded by [`SPRAY_DATAGRAMS_MAX`]. Returns datagrams sent.
fn spray(targets: Vec<SocketAddr>, stop: Arc<AtomicBool>) -> usize {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(25);
    let mut sent = 0;
    let mut kept: Vec<Vec<u8>> = Vec::new();
    while !stop.load(Ordering::Relaxed) && sent < SPRAY_DATAGRAMS_MAX {
        let mut d = match rng.gen_range(0..7) {
            0 => (0..rng.gen_range(0..1500)).map(|_| rng.gen()).collect(),
            1 => {
                let kind = rng.gen_range(0..3);
                let mut d = forged(&mut rng, kind);
                d.truncate(rng.gen_range(0..d.len()));
                d
            }
            2 => {
                // A header bit flipped after sealing: the end-to-end check's to catch.
                let mut d = forged(&mut rng, 2);
                let bit = rng.gen_range(0..wire::DATA_HEADER_LEN * 8);
                d[bit / 8] ^= 1 << (bit % 8);
                d
            }
            3 | 4 => {
                let kind = rng.gen_range(0..3);
                forged(&mut rng, kind)
            }
            _ if !kept.is_empty() => kept[rng.gen_range(0..kept.len())].clone(), // a replay
            _ => forged(&mut rng, 0),
        };
        if kept.len() < 256 && rng.gen_bool(0.1) {
            kept.push(d.clone());
        }
        d.truncate(65_000);
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
fn a_job_under_spray_completes_with_every_value_right() {
    let secret = JobSecret([0x25; 32]);
    let (a, b) = (engine(secret, 1), engine(secret, 2));
    let targets: Vec<SocketAddr> =
        [&a, &b].iter().flat_map(|e| e.address().nics.into_iter().flatten().flatten()).collect();
    assert!(!targets.is_empty());
    let stop = Arc::new(AtomicBool::new(false));
    let sprayer = {
        let stop = stop.clone();
        std::thread::spawn(move || spray(targets, stop))
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
