//! Micro benchmark of the end-to-end check: seal (sender) plus verify (receiver) of one Data
//! datagram, per integrity mode and datagram size, with two same-run baselines: `off` (no
//! check, the ratio column's 1.00) and one `memcpy` of the datagram (the least a datapath does
//! with it). Prints a table; asserts nothing about time.
//!
//! Run: `cargo run --release -p accord-proto --example integrity_bench`

use accord_proto::wire::{self, ConnKeys, ConnSide, DataKind, DataRepr, Header, Integrity, Repr, DATA_HEADER_LEN};
use accord_proto::{ConnectionId, JobSecret, OpId};
use std::time::Instant;

/// Bytes sealed and verified per cell (bounds the run to about a second per cell).
const BYTES_PER_CELL: usize = 1 << 30;

/// A Data datagram of `payload_len` bytes with `trailer` spare bytes at its end.
fn datagram(payload_len: usize, trailer: usize) -> Vec<u8> {
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
    let mut buf = vec![0x5a; DATA_HEADER_LEN + payload_len + trailer];
    wire::emit(&Header { dst_conn: ConnectionId(1), token: 1 }, &Repr::Data(repr), &mut buf).expect("emit");
    buf
}

/// Runs `one` over `len`-byte datagrams for [`BYTES_PER_CELL`] bytes: nanoseconds per datagram.
fn time_per_datagram(len: usize, mut one: impl FnMut()) -> f64 {
    let iterations = (BYTES_PER_CELL / len).max(1);
    let start = Instant::now();
    for _ in 0..iterations {
        one();
    }
    start.elapsed().as_nanos() as f64 / iterations as f64
}

/// HMAC-SHA256 of `bytes` under `key`, truncated to the MAC mode's tag length.
fn hmac_tag(key: &[u8], bytes: &[u8]) -> [u8; wire::MAC_TAG_LEN] {
    use hmac::Mac;
    let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(bytes);
    let mut tag = [0u8; wire::MAC_TAG_LEN];
    tag.copy_from_slice(&mac.finalize().into_bytes()[..wire::MAC_TAG_LEN]);
    tag
}

fn main() {
    let keys = ConnKeys::derive(
        &JobSecret([0x25; 32]),
        ConnSide { conn: ConnectionId(1), token: 11 },
        ConnSide { conn: ConnectionId(2), token: 22 },
        true,
    );
    println!("| payload bytes | mode | datagram bytes | ns per datagram (seal + verify) | GB/s of datagram | x off | x memcpy |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for payload in [64usize, 1024, 4096, 8192, 60 * 1024] {
        let plain_len = DATA_HEADER_LEN + payload;
        let src = datagram(payload, 0);
        let mut copy = vec![0u8; plain_len];
        let memcpy = time_per_datagram(plain_len, || {
            copy.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut copy);
        });
        let mut rows = vec![];
        for mode in [Integrity::Off, Integrity::Header, Integrity::Full, Integrity::Mac] {
            let mut d = datagram(payload, mode.trailer_len());
            let per = match mode {
                Integrity::Mac => time_per_datagram(d.len(), || {
                    wire::seal_mac(std::hint::black_box(&mut d), &keys.tx);
                    wire::verify_mac(std::hint::black_box(&d), &keys.tx).expect("a sealed datagram verifies");
                }),
                _ => time_per_datagram(d.len(), || {
                    wire::seal(std::hint::black_box(&mut d), mode);
                    wire::verify(std::hint::black_box(&d), mode).expect("a sealed datagram verifies");
                }),
            };
            rows.push((mode.name(), d.len(), per));
        }
        // The primitive not chosen, for comparison: HMAC-SHA256 (SHA-NI where the CPU has it)
        // truncated to the same 16 bytes, over the same bytes.
        let mut d = datagram(payload, wire::MAC_TAG_LEN);
        let hmac = time_per_datagram(d.len(), || {
            let n = d.len() - wire::MAC_TAG_LEN;
            let tag = hmac_tag(&[0x25; 32], std::hint::black_box(&d[..n]));
            d[n..].copy_from_slice(&tag);
            let again = hmac_tag(&[0x25; 32], std::hint::black_box(&d[..n]));
            assert_eq!(again, d[n..], "a sealed datagram verifies");
        });
        rows.push(("hmac-sha256 (not used)", d.len(), hmac));
        rows.push(("memcpy (baseline)", plain_len, memcpy));
        let off = rows[0].2;
        for (name, len, ns) in rows {
            let gbps = len as f64 / ns.max(1e-3);
            let vs_off = ns / off.max(1e-3);
            let vs_copy = ns / memcpy.max(1e-3);
            println!("| {payload} | {name} | {len} | {ns:.1} | {gbps:.2} | {vs_off:.1} | {vs_copy:.2} |");
        }
    }
}
