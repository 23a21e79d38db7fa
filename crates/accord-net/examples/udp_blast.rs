//! Loopback UDP throughput: one sender thread, one receiver thread, for
//! three ways of sending 1200-byte packets:
//!   plain      one `send_to` system call per packet (std::net::UdpSocket)
//!   batch      `sendmmsg` of 32 packets per call (UdpDatapath, GSO off)
//!   batch+gso  `sendmmsg` of 8 GSO sends of 32 segments each (UdpDatapath)
//! The receiver is always a UdpDatapath (recvmmsg, GRO on when available).
//! Prints a table with rates relative to `plain`, measured in the same run.
//!
//! Usage: cargo run --release -p accord-net --example udp_blast -- [seconds per mode, default 1]

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use accord_net::udp::{UdpConfig, UdpDatapath};
use accord_net::{Datapath, TxDatagram};

const PACKET_BYTES: usize = 1200;
const BATCH: usize = 32;
const GSO_SENDS_PER_BATCH: usize = 8;
/// Receiver stops after this long without data once the sender is done.
const DRAIN_IDLE: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Batch,
    BatchGso,
}

struct Outcome {
    sent_packets: u64,
    received_packets: u64,
    received_bytes: u64,
    receive_seconds: f64,
    send_seconds: f64,
}

fn receiver(mut rx: UdpDatapath, done: Arc<AtomicBool>) -> (u64, u64, f64) {
    let mut bufs = rx.alloc_rx_buffers(256).expect("rx buffers");
    let (mut packets, mut bytes) = (0u64, 0u64);
    let (mut first, mut last) = (None, Instant::now());
    loop {
        let n = rx.recv_batch(&mut bufs, 256).expect("recv");
        if n > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            for (data, meta) in bufs.iter() {
                packets += meta.segment_count() as u64;
                bytes += data.len() as u64;
            }
            continue;
        }
        if done.load(Ordering::Acquire) && last.elapsed() > DRAIN_IDLE {
            break;
        }
        rx.wait_readable(Duration::from_millis(10)).expect("poll");
    }
    let seconds = first.map_or(0.0, |f| (last - f).as_secs_f64());
    (packets, bytes, seconds)
}

fn run(mode: Mode, seconds: f64) -> Outcome {
    let gso = mode == Mode::BatchGso;
    let rx = UdpDatapath::bind(UdpConfig { path_count: 1, gso: false, gro: true, ..UdpConfig::default() })
        .expect("bind receiver");
    let dst: SocketAddr = rx.local_addr(0).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let receiver_done = done.clone();
    let receiver = std::thread::spawn(move || receiver(rx, receiver_done));

    let payload = vec![0x5Au8; PACKET_BYTES * BATCH];
    let duration = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut sent_packets = 0u64;
    match mode {
        Mode::Plain => {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("bind plain sender");
            while started.elapsed() < duration {
                for _ in 0..BATCH {
                    if socket.send_to(&payload[..PACKET_BYTES], dst).is_ok() {
                        sent_packets += 1;
                    }
                }
            }
        }
        Mode::Batch | Mode::BatchGso => {
            let mut tx = UdpDatapath::bind(UdpConfig { path_count: 1, gso, gro: false, ..UdpConfig::default() })
                .expect("bind sender");
            let gso_on = tx.caps().gso_max_segments >= BATCH as u16;
            let batch: Vec<TxDatagram<'_>> = if gso && gso_on {
                (0..GSO_SENDS_PER_BATCH)
                    .map(|_| TxDatagram {
                        segment_bytes: Some(PACKET_BYTES as u16),
                        ..TxDatagram::new(0, dst, &payload)
                    })
                    .collect()
            } else {
                payload.chunks(PACKET_BYTES).map(|p| TxDatagram::new(0, dst, p)).collect()
            };
            let packets_per_entry = batch[0].segment_count() as u64;
            while started.elapsed() < duration {
                let sent = tx.send_batch(&batch).expect("send");
                sent_packets += sent as u64 * packets_per_entry;
                if sent < batch.len() {
                    std::thread::yield_now();
                }
            }
        }
    }
    let send_seconds = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Release);
    let (received_packets, received_bytes, receive_seconds) = receiver.join().expect("receiver thread");
    Outcome { sent_packets, received_packets, received_bytes, receive_seconds, send_seconds }
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let probe = UdpDatapath::bind(UdpConfig { path_count: 1, ..UdpConfig::default() }).expect("bind");
    println!("caps: {:?}, socket buffers: {:?}", probe.caps(), probe.socket_buffer_bytes());
    drop(probe);
    println!("{PACKET_BYTES}-byte packets, {seconds} s per mode, loopback, 1 sender + 1 receiver thread\n");
    println!(
        "{:<10} {:>14} {:>14} {:>9} {:>8} {:>10}",
        "mode", "sent pkt/s", "recv pkt/s", "recv GB/s", "loss %", "vs plain"
    );
    let mut plain_rate = None;
    for (name, mode) in [("plain", Mode::Plain), ("batch", Mode::Batch), ("batch+gso", Mode::BatchGso)] {
        let o = run(mode, seconds);
        let recv_rate = o.received_packets as f64 / o.receive_seconds.max(1e-9);
        let base = *plain_rate.get_or_insert(recv_rate);
        let loss = 100.0 * (1.0 - o.received_packets as f64 / (o.sent_packets.max(1)) as f64);
        println!(
            "{:<10} {:>14.0} {:>14.0} {:>9.3} {:>8.2} {:>9.2}x",
            name,
            o.sent_packets as f64 / o.send_seconds,
            recv_rate,
            o.received_bytes as f64 / o.receive_seconds.max(1e-9) / 1e9,
            loss.max(0.0),
            recv_rate / base
        );
    }
}
