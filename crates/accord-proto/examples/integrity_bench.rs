//! Micro benchmark of the end-to-end check: seal (sender) plus verify (receiver) of one Data
//! datagram, per integrity mode and datagram size. Prints a table; asserts nothing about time.
//!
//! Run: `cargo run --release -p accord-proto --example integrity_bench`

use accord_proto::wire::{self, DataKind, DataRepr, Header, Integrity, Repr, DATA_HEADER_LEN};
use accord_proto::{ConnectionId, OpId};
use std::time::Instant;

/// Bytes sealed and verified per cell (bounds the run to well under a second per cell).
const BYTES_PER_CELL: usize = 1 << 30;

fn datagram(payload_len: usize) -> Vec<u8> {
    let repr = DataRepr {
        psn: 1,
        ack_floor: 0,
        tx_time_ns: 1,
        op: OpId(1),
        kind: DataKind::Send,
        imm: None,
        tag: 0,
        msg_len: payload_len as u64,
        msg_offset: 0,
        payload_len: payload_len as u16,
        ack_now: false,
        retransmission: false,
        receiver_driven: false,
        wants_more: false,
    };
    let mut buf = vec![0x5a; DATA_HEADER_LEN + payload_len];
    wire::emit(&Header { dst_conn: ConnectionId(1), token: 1 }, &Repr::Data(repr), &mut buf).expect("emit");
    buf
}

fn main() {
    println!("| datagram bytes | mode | ns per datagram (seal + verify) | GB/s of datagram |");
    println!("|---:|---|---:|---:|");
    for payload in [1024usize, 4096, 8192, 60 * 1024] {
        let mut d = datagram(payload);
        let len = d.len();
        for mode in [Integrity::Off, Integrity::Header, Integrity::Full] {
            let iterations = (BYTES_PER_CELL / len).max(1);
            let start = Instant::now();
            for _ in 0..iterations {
                wire::seal(std::hint::black_box(&mut d), mode);
                wire::verify(std::hint::black_box(&d), mode).expect("a sealed datagram verifies");
            }
            let elapsed = start.elapsed();
            let ns = elapsed.as_nanos() as f64 / iterations as f64;
            let gbps = (iterations * len) as f64 / elapsed.as_secs_f64() / 1e9;
            println!("| {len} | {} | {ns:.1} | {gbps:.1} |", mode.name());
        }
    }
}
