//! The outsider of the spray tests (issue 25): a process holding no job secret that sprays
//! every port of a job for as long as the job runs, with every kind of datagram it could
//! forge, and the job the engine's spray tests run under it ([`job_under_spray`]). Shared by the
//! engine's two-engine tests (`tests/spray.rs`, `tests/spray_mac.rs`) and the collectives'
//! four-rank test (`accord-coll/tests/spray.rs`, which includes this file by path: the test
//! needs nothing but the wire format, and one sprayer keeps the two tests alike).
//!
//! Forged datagrams are sealed with the right end-to-end check (CRC32C) so they reach the
//! parser; the header-flipped ones are flipped after sealing, for the check to catch.

#![allow(dead_code)] // each including test uses part of it

use accord_proto::wire::{self, AckRepr, DataKind, DataRepr, Header, HelloRepr, Integrity, Repr};
use accord_proto::{ConnectionId, OpId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bound on the sprayer's loop, whatever happens to the stop flag.
pub const SPRAY_DATAGRAMS_MAX: usize = 2_000_000;

/// The kind byte and layout of the collectives' "stuck" notice (`accord-coll`'s
/// `engine/frame.rs`): kind, sender rank, rank waited on; 9 bytes, little-endian.
pub fn stuck_frame(sender: u32, waiting_on: u32) -> Vec<u8> {
    let mut f = vec![2u8];
    f.extend_from_slice(&sender.to_le_bytes());
    f.extend_from_slice(&waiting_on.to_le_bytes());
    f
}

/// What one sprayer sent, by kind (each datagram counted once per target).
#[derive(Clone, Copy, Debug, Default)]
pub struct Sprayed {
    /// Random bytes of random length.
    pub random: usize,
    /// Forged datagrams cut short.
    pub truncated: usize,
    /// Forged data packets with one header bit flipped after sealing.
    pub header_flipped: usize,
    /// Forged Hellos (no proof of the secret).
    pub hellos: usize,
    /// Forged HelloAcks, ACKs and data packets carrying a "stuck" frame, to guessed
    /// connections.
    pub control: usize,
    /// Earlier datagrams of this sprayer sent again verbatim.
    pub replayed: usize,
}

impl Sprayed {
    pub fn total(&self) -> usize {
        self.random + self.truncated + self.header_flipped + self.hellos + self.control + self.replayed
    }
}

/// Forged datagram kinds: a Hello, a HelloAck, an ACK, or a data packet (a two-sided send
/// whose payload is a collectives "stuck" frame), each aimed at a guessed connection.
pub const FORGED_KINDS: u32 = 4;

/// One forged datagram of the kind `kind` (see [`FORGED_KINDS`]), sealed with the right
/// end-to-end check.
pub fn forged(rng: &mut ChaCha8Rng, kind: u32) -> Vec<u8> {
    let mut buf = forged_unsealed(rng, kind);
    wire::seal(&mut buf, Integrity::Full);
    buf
}

/// One forged datagram of the kind `kind`, not sealed: header, body and a data packet's
/// payload, for a caller that seals it its own way (the MAC spray appends a guessed tag).
pub fn forged_unsealed(rng: &mut ChaCha8Rng, kind: u32) -> Vec<u8> {
    let header = Header { dst_conn: ConnectionId(rng.gen()), token: rng.gen() };
    let hello = HelloRepr {
        src_conn: ConnectionId(rng.gen()),
        src_token: rng.gen(),
        max_payload_bytes: 9000,
        path_count: 4,
        recv_window_packets: 256,
        proof: rng.gen(),
    };
    let frame = stuck_frame(rng.gen_range(0..4), rng.gen_range(0..4));
    let payload_len = frame.len() as u16;
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
    let ack = AckRepr {
        cum_ack: rng.gen_range(0..1 << 20),
        echo_psn: rng.gen_range(0..1 << 20),
        echo_tx_time_ns: rng.gen(),
        ack_delay_ns: 0,
        ecn_ce_count: rng.gen(),
        credit_bytes: rng.gen(),
        sack: Default::default(),
        rejections: Default::default(),
    };
    let mut buf = vec![0u8; 2048];
    let (header, repr) = match kind % FORGED_KINDS {
        0 => (Header { dst_conn: ConnectionId(0), token: 0 }, Repr::Hello(hello)),
        1 => (header, Repr::HelloAck(hello)),
        2 => (header, Repr::Ack(ack)),
        _ => (header, Repr::Data(data)),
    };
    let mut len = wire::emit(&header, &repr, &mut buf).unwrap();
    if let Repr::Data(_) = repr {
        buf[len..len + frame.len()].copy_from_slice(&frame);
        len += frame.len();
    }
    buf.truncate(len);
    buf
}

/// Sprays `targets` until `stop`, bounded by [`SPRAY_DATAGRAMS_MAX`], pausing `pause` every
/// 64 datagrams. Returns what it sent, by kind.
pub fn spray(targets: Vec<SocketAddr>, stop: &AtomicBool, seed: u64, pause: Duration) -> Sprayed {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut sprayed = Sprayed::default();
    let (mut sent, mut since_pause) = (0, 0);
    let mut kept: Vec<Vec<u8>> = Vec::new();
    while !stop.load(Ordering::Relaxed) && sent < SPRAY_DATAGRAMS_MAX {
        let (mut d, count): (Vec<u8>, &mut usize) = match rng.gen_range(0..8) {
            0 => ((0..rng.gen_range(0..1500)).map(|_| rng.gen()).collect(), &mut sprayed.random),
            1 => {
                let kind = rng.gen_range(0..FORGED_KINDS);
                let mut d = forged(&mut rng, kind);
                d.truncate(rng.gen_range(0..d.len()));
                (d, &mut sprayed.truncated)
            }
            2 => {
                // A header bit flipped after sealing: the end-to-end check's to catch.
                let mut d = forged(&mut rng, 3);
                let bit = rng.gen_range(0..wire::DATA_HEADER_LEN * 8);
                d[bit / 8] ^= 1 << (bit % 8);
                (d, &mut sprayed.header_flipped)
            }
            3 => (forged(&mut rng, 0), &mut sprayed.hellos),
            4 | 5 => {
                let kind = rng.gen_range(1..FORGED_KINDS);
                (forged(&mut rng, kind), &mut sprayed.control)
            }
            _ if !kept.is_empty() => (kept[rng.gen_range(0..kept.len())].clone(), &mut sprayed.replayed),
            _ => (forged(&mut rng, 0), &mut sprayed.hellos),
        };
        if kept.len() < 256 && rng.gen_bool(0.1) {
            kept.push(d.clone());
        }
        d.truncate(65_000);
        for target in &targets {
            let _ = socket.send_to(&d, target);
            *count += 1;
            sent += 1;
            since_pause += 1;
        }
        if since_pause >= 64 {
            since_pause = 0;
            std::thread::sleep(pause);
        }
    }
    sprayed
}

/// What [`job_under_spray`] moves each round, and how long each wait may take.
pub struct JobPlan {
    /// Bytes of each round's write.
    pub len: usize,
    /// Rounds (each: one write with an immediate, checked; one two-sided message).
    pub rounds: u8,
    /// The writes' immediate.
    pub imm: u32,
    /// Multiplier of the rounds' byte pattern (tests pick different ones).
    pub pattern: u8,
    /// Bytes of round 0's message (round r's has r more).
    pub message_base: usize,
    /// Bound of every wait.
    pub wait: std::time::Duration,
}

/// The job both spray tests run while `spray` sprays: engine `a` writes and sends to `b`,
/// round by round, every byte and immediate checked as it lands. Returns the sprayer's result
/// and the messages sent next to what `b` received (the callers check none was forged).
#[allow(clippy::type_complexity)]
pub fn job_under_spray<S: Send + 'static>(
    a: &accord_engine::Engine,
    b: &accord_engine::Engine,
    plan: &JobPlan,
    spray: impl FnOnce(Arc<AtomicBool>) -> S + Send + 'static,
) -> (S, Vec<(Vec<u8>, Option<u32>)>, Vec<(Vec<u8>, Option<u32>)>) {
    let stop = Arc::new(AtomicBool::new(false));
    let sprayer = {
        let stop = stop.clone();
        std::thread::spawn(move || spray(stop))
    };
    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = received.clone();
    b.post_recvs(4096, 64, move |m| sink.lock().unwrap().push((m.data.to_vec(), m.imm)));
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let dst = b.alloc(plan.len).unwrap();
    let d = dst.descriptor();
    let mut sends = Vec::new();
    for round in 0..plan.rounds {
        let bytes: Vec<u8> = (0..plan.len).map(|i| (i as u8).wrapping_mul(plan.pattern).wrapping_add(round)).collect();
        let src = a.alloc(plan.len).unwrap();
        src.write_at(0, &bytes).unwrap();
        let h = src.handle();
        let op = accord_engine::WriteOp {
            src: &h,
            src_offset: 0,
            dst: &d,
            dst_offset: 0,
            len: plan.len as u64,
            imm: Some(plan.imm),
        };
        a.write(&op).unwrap().wait_timeout(plan.wait).unwrap();
        assert_eq!(b.imm_counter(plan.imm).wait(u64::from(round) + 1, plan.wait), u64::from(round) + 1);
        assert_eq!(dst.to_vec(), bytes, "round {round}: every byte as written");
        let message = vec![round; plan.message_base + usize::from(round)];
        a.send(b.id(), &message, Some(u32::from(round))).unwrap().wait_timeout(plan.wait).unwrap();
        sends.push((message, Some(u32::from(round))));
        std::thread::sleep(std::time::Duration::from_millis(30)); // let replays of earlier rounds land
    }
    stop.store(true, Ordering::Relaxed);
    let sprayed = sprayer.join().unwrap();
    let got = received.lock().unwrap().clone();
    (sprayed, sends, got)
}
