//! Wire-format tests: round trips, every truncation, semantic checks, a seeded in-process
//! fuzz, and replay of the cargo-fuzz seed corpus.

use super::*;
use crate::ids::{OpId, RegionId, RegionKey};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const HEADER: Header = Header { dst_conn: ConnectionId(0x0102_0304), token: 0x1122_3344_5566_7788 };

fn hello() -> HelloRepr {
    HelloRepr {
        src_conn: ConnectionId(7),
        src_token: 0xdead_beef_cafe_f00d,
        max_payload_bytes: 8192,
        path_count: 64,
        recv_window_packets: 4096,
        proof: *b"0123456789abcdef",
    }
}

fn write_data(imm: Option<u32>) -> DataRepr {
    DataRepr {
        psn: 1000,
        ack_floor: 990,
        tx_time_ns: 123_456_789,
        op: OpId(42),
        kind: DataKind::Write { region: RegionId(3), key: RegionKey(0x0bad_c0de_1234_5678), region_offset: 1 << 20 },
        imm,
        tag: 0x7a67_0000_0000_0001,
        msg_len: 65536,
        msg_offset: 8192,
        payload_len: 32,
        ack_now: false,
        retransmission: false,
        receiver_driven: false,
        wants_more: false,
    }
}

fn send_data() -> DataRepr {
    DataRepr {
        kind: DataKind::Send,
        imm: Some(5),
        msg_len: 20,
        msg_offset: 0,
        payload_len: 20,
        ack_now: true,
        retransmission: true,
        receiver_driven: true,
        wants_more: true,
        ..write_data(None)
    }
}

fn ack_full() -> AckRepr {
    let mut sack = SackBitmap::new();
    for i in 0..SACK_BITMAP_BITS {
        assert!(sack.set(i));
    }
    let mut rejections = Rejections::new();
    for i in 0..MAX_REJECTIONS_PER_ACK {
        let reason = match i % 8 {
            0 => RejectReason::UnknownRegion,
            1 => RejectReason::BadKey,
            2 => RejectReason::OutOfBounds,
            3 => RejectReason::NoRecvBuffer,
            4 => RejectReason::MessageTooLarge,
            5 => RejectReason::TooManyMessages,
            6 => RejectReason::Other(99),
            _ => RejectReason::Other(u32::MAX),
        };
        assert!(rejections.push(Rejection { psn: 500 + i as u64, op: OpId(i as u64), reason }));
    }
    AckRepr {
        cum_ack: 100,
        echo_psn: 1200,
        echo_tx_time_ns: 77,
        ack_delay_ns: 1500,
        ecn_ce_count: u32::MAX,
        credit_bytes: 1 << 20,
        sack,
        rejections,
    }
}

fn ack_sparse() -> AckRepr {
    let mut ack = ack_full();
    ack.sack.clear();
    ack.sack.set(0);
    ack.sack.set(9);
    ack.sack.set(200);
    ack.rejections.clear();
    ack.rejections.push(Rejection { psn: 101, op: OpId(9), reason: RejectReason::Other(1234) });
    ack
}

fn ack_empty() -> AckRepr {
    let mut ack = ack_full();
    ack.sack.clear();
    ack.rejections.clear();
    ack
}

/// One representative of every variant (and the interesting Data / Ack shapes).
fn samples() -> Vec<(&'static str, Repr)> {
    vec![
        ("hello", Repr::Hello(hello())),
        ("hello_ack", Repr::HelloAck(hello())),
        ("data_write", Repr::Data(write_data(None))),
        ("data_write_imm", Repr::Data(write_data(Some(0xffff_ffff)))),
        ("data_send_flags", Repr::Data(send_data())),
        ("ack_empty", Repr::Ack(ack_empty())),
        ("ack_sparse", Repr::Ack(ack_sparse())),
        ("ack_full", Repr::Ack(ack_full())),
        ("probe", Repr::Probe(ProbeRepr { probe_id: 17, tx_time_ns: 99 })),
        ("probe_ack", Repr::ProbeAck(ProbeRepr { probe_id: u64::MAX, tx_time_ns: 0 })),
        ("close", Repr::Close(CloseRepr { reason: 3 })),
        ("credit", Repr::Credit(CreditRepr { credit_bytes: 16384, nack: None, seq: 1 })),
        ("credit_nack", Repr::Credit(CreditRepr { credit_bytes: 4096, nack: Some(77), seq: 2 })),
        ("rts", Repr::Rts(RtsRepr { backlog_bytes: 1 << 40 })),
    ]
}

/// Emits `repr` followed by a recognisable payload (for Data).
fn to_bytes(header: &Header, repr: &Repr) -> Vec<u8> {
    let payload_len = match repr {
        Repr::Data(data) => usize::from(data.payload_len),
        _ => 0,
    };
    let mut buf = vec![0xAA; repr.buffer_len() + payload_len];
    let written = emit(header, repr, &mut buf).expect("emit of a valid repr");
    assert_eq!(written, repr.buffer_len());
    for (i, byte) in buf[written..].iter_mut().enumerate() {
        *byte = i as u8;
    }
    buf
}

/// The fuzz property: if `datagram` parses, its canonical re-emission parses to the same
/// thing, is no longer than the input, and is a fixed point. Returns whether it parsed.
fn check_reemit(datagram: &[u8]) -> bool {
    let Ok(parsed) = parse(datagram) else {
        return false;
    };
    let mut buf = vec![0; parsed.repr.buffer_len() + parsed.payload.len()];
    let written = emit(&parsed.header, &parsed.repr, &mut buf).expect("re-emit");
    buf[written..].copy_from_slice(&datagram[parsed.payload.clone()]);
    assert!(buf.len() <= datagram.len(), "canonical form is never longer");
    let again = parse(&buf).expect("re-emitted packet parses");
    assert_eq!(again, parsed);
    let mut buf2 = vec![0; buf.len()];
    emit(&again.header, &again.repr, &mut buf2).expect("re-emit");
    buf2[written..].copy_from_slice(&buf[written..]);
    assert_eq!(buf2, buf, "emission is canonical");
    true
}

/// Calls every accessor; used to show none of them panics on any buffer.
fn touch_all_accessors(p: &Packet<&[u8]>) -> u64 {
    let mut acc = u64::from(p.version()) + u64::from(p.packet_type_raw()) + u64::from(p.flags());
    acc ^= u64::from(p.packet_type().is_some());
    acc ^= u64::from(p.dst_conn().0) ^ p.token();
    acc ^= u64::from(p.hello_src_conn().0) ^ p.hello_src_token();
    acc ^= u64::from(p.hello_max_payload_bytes()) ^ u64::from(p.hello_path_count());
    acc ^= u64::from(p.hello_recv_window_packets());
    acc ^= p.data_psn() ^ p.data_ack_floor() ^ p.data_tx_time_ns() ^ p.data_op().0;
    acc ^= u64::from(p.data_kind_raw()) ^ u64::from(p.data_payload_len());
    acc ^= u64::from(p.data_imm()) ^ p.data_msg_len() ^ p.data_msg_offset();
    acc ^= u64::from(p.data_region_id().0) ^ p.data_region_key().0 ^ p.data_region_offset();
    acc ^= p.data_payload().len() as u64;
    acc ^= p.ack_cum_ack() ^ p.ack_echo_psn() ^ p.ack_echo_tx_time_ns();
    acc ^= u64::from(p.ack_delay_ns()) ^ u64::from(p.ack_ecn_ce_count());
    acc ^= u64::from(p.ack_credit_bytes()) ^ u64::from(p.ack_sack_len_bytes());
    acc ^= u64::from(p.ack_rejection_count()) ^ p.ack_sack_bytes().len() as u64;
    for i in 0..=256 {
        acc ^= p.ack_rejection(i).map_or(0, |r| r.psn);
    }
    acc ^= p.probe_id() ^ p.probe_tx_time_ns() ^ u64::from(p.close_reason());
    acc ^= u64::from(p.credit_bytes()) ^ p.credit_nack_psn() ^ p.rts_backlog_bytes();
    acc
}

#[test]
fn round_trip_every_variant() {
    for (name, repr) in samples() {
        let bytes = to_bytes(&HEADER, &repr);
        let parsed = parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(parsed.header, HEADER, "{name}");
        assert_eq!(parsed.repr, repr, "{name}");
        assert_eq!(parsed.repr.packet_type(), repr.packet_type());
        match repr {
            Repr::Data(data) => {
                assert_eq!(parsed.payload, DATA_HEADER_LEN..bytes.len(), "{name}");
                assert_eq!(parsed.payload.len(), usize::from(data.payload_len));
            }
            _ => assert!(parsed.payload.is_empty(), "{name}"),
        }
        assert_eq!(peek(&bytes), Ok((repr.packet_type(), HEADER)), "{name}");
        assert!(check_reemit(&bytes), "{name}");
    }
}

#[test]
fn layout_matches_the_design_table() {
    // Spot checks against DESIGN.md / the wire table, byte by byte.
    let bytes = to_bytes(&HEADER, &Repr::Data(send_data()));
    assert_eq!(bytes[0], VERSION);
    assert_eq!(bytes[1], PacketType::Data as u8);
    assert_eq!(bytes[2], 0b1_1111, "HAS_IMM | ACK_NOW | RETRANSMISSION | RECEIVER_DRIVEN | WANTS_MORE");
    assert_eq!(bytes[3], 0);
    assert_eq!(&bytes[4..8], &[1, 2, 3, 4]);
    assert_eq!(&bytes[8..16], &HEADER.token.to_be_bytes());
    assert_eq!(&bytes[20..28], &1000u64.to_be_bytes());
    assert_eq!(bytes[20 + 32], 2, "kind Send");
    assert_eq!(&bytes[20 + 34..20 + 36], &20u16.to_be_bytes());
    assert_eq!(&bytes[20 + 36..20 + 40], &5u32.to_be_bytes());
    assert_eq!(&bytes[20 + 56..20 + 80], &[0; 24], "Send has no region fields");
    assert_eq!(&bytes[20 + 80..20 + 88], &0x7a67_0000_0000_0001u64.to_be_bytes(), "tag");
    assert_eq!(&bytes[16..20], &[0; 4], "CRC field: zero until sealed");
    assert_eq!(DATA_HEADER_LEN, 108);
    assert_eq!(MAX_ACK_LEN, field::ACK_SACK + 128 + field::rejection::LEN * 16);
    assert_eq!(to_bytes(&HEADER, &Repr::Ack(ack_full())).len(), MAX_ACK_LEN);
    assert_eq!(Repr::Hello(hello()).buffer_len(), 56);
    assert_eq!(Repr::Close(CloseRepr { reason: 0 }).buffer_len(), 24);

    let bytes = to_bytes(&HEADER, &Repr::Ack(ack_sparse()));
    // Bits 0, 9 and 200: 26 bytes of bitmap, LSB-first.
    assert_eq!(&bytes[20 + 36..20 + 38], &26u16.to_be_bytes());
    assert_eq!(bytes[20 + 38], 1);
    assert_eq!(bytes[60], 0b0000_0001);
    assert_eq!(bytes[61], 0b0000_0010);
    assert_eq!(bytes[60 + 25], 0b0000_0001);
    assert_eq!(bytes.len(), 60 + 26 + 24);
    assert_eq!(&bytes[60 + 26 + 16..60 + 26 + 20], &1234u32.to_be_bytes());
}

#[test]
fn sack_is_trimmed_and_empty_sack_costs_nothing() {
    let bytes = to_bytes(&HEADER, &Repr::Ack(ack_empty()));
    assert_eq!(bytes.len(), HEADER_LEN + 40);
    let mut ack = ack_empty();
    ack.sack.set(7);
    assert_eq!(Repr::Ack(ack).buffer_len(), HEADER_LEN + 41);
    ack.sack.set(8);
    assert_eq!(Repr::Ack(ack).buffer_len(), HEADER_LEN + 42);
}

#[test]
fn trailing_zero_sack_bytes_parse_to_the_trimmed_bitmap() {
    let mut bytes = to_bytes(&HEADER, &Repr::Ack(ack_empty()));
    bytes.extend_from_slice(&[0b100, 0, 0, 0]);
    bytes[20 + 36..20 + 38].copy_from_slice(&4u16.to_be_bytes());
    let parsed = parse(&bytes).unwrap();
    let Repr::Ack(ack) = parsed.repr else { panic!("not an ack") };
    assert_eq!(ack.sack.len_bits(), 3);
    assert_eq!(ack.sack.iter_set().collect::<Vec<_>>(), vec![2]);
    assert!(check_reemit(&bytes));
}

#[test]
fn sack_bitmap_api() {
    let mut sack = SackBitmap::new();
    assert!(sack.is_empty());
    assert_eq!(sack.len_bits(), 0);
    assert!(sack.set(1023));
    assert!(!sack.set(1024));
    assert!(!sack.set(usize::MAX));
    assert!(!sack.get(1024));
    assert!(!sack.get(usize::MAX));
    assert!(sack.set(0) && sack.set(64) && sack.set(65));
    assert_eq!(sack.iter_set().collect::<Vec<_>>(), vec![0, 64, 65, 1023]);
    assert_eq!(sack.len_bits(), 1024);
    assert_eq!(sack.count_set(), 4);
    assert_eq!(format!("{sack:?}"), "SackBitmap { set: 4, len_bits: 1024 }");
    sack.clear();
    assert_eq!(sack, SackBitmap::default());
}

#[test]
fn rejections_api() {
    let mut rejections = Rejections::default();
    assert!(rejections.is_empty());
    let r = Rejection { psn: 1, op: OpId(2), reason: RejectReason::BadKey };
    for _ in 0..MAX_REJECTIONS_PER_ACK {
        assert!(rejections.push(r));
    }
    assert!(rejections.is_full());
    assert!(!rejections.push(r));
    assert_eq!(rejections.len(), MAX_REJECTIONS_PER_ACK);
    assert_eq!(rejections.iter().count(), MAX_REJECTIONS_PER_ACK);
    rejections.clear();
    assert_eq!(rejections, Rejections::new());
    for code in 0..=10 {
        assert_eq!(RejectReason::from_u32(code).to_u32(), code);
    }
    assert_eq!(RejectReason::from_u32(77), RejectReason::Other(77));
}

#[test]
fn every_truncation_and_extension_is_an_error() {
    for (name, repr) in samples() {
        let bytes = to_bytes(&HEADER, &repr);
        for len in 0..bytes.len() {
            let prefix = &bytes[..len];
            assert!(parse(prefix).is_err(), "{name} truncated to {len}");
            touch_all_accessors(&Packet::new_unchecked(prefix));
            if len < HEADER_LEN {
                assert!(peek(prefix).is_err());
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(parse(&longer).is_err(), "{name} extended");
    }
}

#[test]
fn truncation_errors_name_the_length() {
    assert_eq!(parse(&[1, 3]), Err(WireError::Truncated { needed: 20, got: 2 }));
    let bytes = to_bytes(&HEADER, &Repr::Data(write_data(None)));
    assert_eq!(parse(&bytes[..50]), Err(WireError::Truncated { needed: 108, got: 50 }));
    let bytes = to_bytes(&HEADER, &Repr::Ack(ack_sparse()));
    let cut = bytes.len() - 1;
    assert_eq!(parse(&bytes[..cut]), Err(WireError::Truncated { needed: bytes.len(), got: cut }));
    let bytes = to_bytes(&HEADER, &Repr::Close(CloseRepr { reason: 1 }));
    assert_eq!(parse(&bytes[..23]), Err(WireError::Truncated { needed: 24, got: 23 }));
}

#[test]
fn wrong_version_and_type() {
    let mut bytes = to_bytes(&HEADER, &Repr::Hello(hello()));
    bytes[0] = 1; // the 16-byte header without a CRC
    assert_eq!(parse(&bytes), Err(WireError::BadVersion(1)));
    assert_eq!(peek(&bytes), Err(WireError::BadVersion(1)));
    bytes[0] = VERSION;
    for bad in [0u8, 10, 255] {
        bytes[1] = bad;
        assert_eq!(parse(&bytes), Err(WireError::UnknownType(bad)));
        assert_eq!(peek(&bytes), Err(WireError::UnknownType(bad)));
    }
}

#[test]
fn reserved_and_unknown_flag_bits_are_ignored() {
    let mut bytes = to_bytes(&HEADER, &Repr::Data(write_data(None)));
    bytes[2] |= 0xE0;
    bytes[3] = 0xFF;
    bytes[20 + 33] = 0xFF;
    bytes[20 + 60] = 0xFF;
    assert_eq!(parse(&bytes).unwrap().repr, Repr::Data(write_data(None)));
    assert!(check_reemit(&bytes));
}

#[test]
fn data_semantic_checks() {
    let malformed = |data: DataRepr, patch: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = to_bytes(&HEADER, &Repr::Data(data));
        patch(&mut bytes);
        match parse(&bytes) {
            Err(WireError::Malformed(_)) => {}
            other => panic!("expected Malformed, got {other:?}"),
        }
    };
    // payload_len does not match the datagram.
    malformed(write_data(None), &|b| b[20 + 35] += 1);
    malformed(write_data(None), &|b| b.truncate(b.len() - 1));
    // msg_offset + payload_len > msg_len.
    malformed(write_data(None), &|b| b[20 + 48..20 + 56].copy_from_slice(&(65536u64 - 31).to_be_bytes()));
    // msg_offset + payload_len overflows.
    malformed(write_data(None), &|b| b[20 + 48..20 + 56].copy_from_slice(&u64::MAX.to_be_bytes()));
    // region_offset + msg_len overflows.
    malformed(write_data(None), &|b| b[20 + 72..20 + 80].copy_from_slice(&(u64::MAX - 100).to_be_bytes()));
    // unknown kind.
    malformed(write_data(None), &|b| b[20 + 32] = 3);
    malformed(write_data(None), &|b| b[20 + 32] = 0);

    // The exact limit is fine: payload ends at msg_len.
    let mut edge = write_data(None);
    edge.msg_offset = edge.msg_len - u64::from(edge.payload_len);
    let bytes = to_bytes(&HEADER, &Repr::Data(edge));
    assert!(check_reemit(&bytes));
    // A send ignores region fields on the wire, even garbage ones.
    let mut bytes = to_bytes(&HEADER, &Repr::Data(send_data()));
    bytes[20 + 72..20 + 80].copy_from_slice(&u64::MAX.to_be_bytes());
    assert_eq!(parse(&bytes).unwrap().repr, Repr::Data(send_data()));
}

#[test]
fn ack_length_checks() {
    let base = to_bytes(&HEADER, &Repr::Ack(ack_sparse()));
    let patched = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = base.clone();
        f(&mut b);
        parse(&b)
    };
    assert!(matches!(
        patched(&|b| b[20 + 36..20 + 38].copy_from_slice(&129u16.to_be_bytes())),
        Err(WireError::Malformed(_))
    ));
    assert!(matches!(patched(&|b| b[20 + 38] = 17), Err(WireError::Malformed(_))));
    assert!(matches!(patched(&|b| b[20 + 38] = 2), Err(WireError::Truncated { .. })));
    assert!(matches!(patched(&|b| b[20 + 38] = 0), Err(WireError::Malformed(_))));
}

#[test]
fn fixed_bodies_reject_trailing_bytes() {
    for repr in [
        Repr::Hello(hello()),
        Repr::Probe(ProbeRepr { probe_id: 1, tx_time_ns: 2 }),
        Repr::Close(CloseRepr { reason: 0 }),
        Repr::Credit(CreditRepr { credit_bytes: 1, nack: Some(2), seq: 3 }),
        Repr::Rts(RtsRepr { backlog_bytes: 3 }),
    ] {
        let mut bytes = to_bytes(&HEADER, &repr);
        bytes.extend_from_slice(&[0; 5]);
        assert!(matches!(parse(&bytes), Err(WireError::Malformed(_))));
    }
}

#[test]
fn emit_refuses_small_buffers_and_bad_data() {
    let repr = Repr::Ack(ack_full());
    let mut small = vec![0; MAX_ACK_LEN - 1];
    assert_eq!(
        emit(&HEADER, &repr, &mut small),
        Err(WireError::BufferTooSmall { needed: MAX_ACK_LEN, got: MAX_ACK_LEN - 1 })
    );
    let mut bad = write_data(None);
    bad.msg_offset = bad.msg_len;
    let mut buf = [0; DATA_HEADER_LEN];
    assert!(matches!(emit(&HEADER, &Repr::Data(bad), &mut buf), Err(WireError::Malformed(_))));
    // Emitting Data needs only the header; the payload is the caller's.
    assert_eq!(emit(&HEADER, &Repr::Data(write_data(None)), &mut buf), Ok(DATA_HEADER_LEN));
}

#[test]
fn checked_view_of_other_type_reads_zero_not_panic() {
    let bytes = to_bytes(&HEADER, &Repr::Close(CloseRepr { reason: 9 }));
    let packet = Packet::new_checked(&bytes[..]).unwrap();
    assert_eq!(packet.close_reason(), 9);
    assert_eq!(packet.data_region_offset(), 0);
    assert!(packet.ack_rejection(0).is_none());
    touch_all_accessors(&packet);
}

// ---- Randomised: valid reprs and fuzzing ----

fn random_repr(rng: &mut ChaCha8Rng) -> Repr {
    let hello = |rng: &mut ChaCha8Rng| HelloRepr {
        src_conn: ConnectionId(rng.gen()),
        src_token: rng.gen(),
        max_payload_bytes: rng.gen(),
        path_count: rng.gen(),
        recv_window_packets: rng.gen(),
        proof: rng.gen(),
    };
    let probe = |rng: &mut ChaCha8Rng| ProbeRepr { probe_id: rng.gen(), tx_time_ns: rng.gen() };
    match rng.gen_range(0..9) {
        0 => Repr::Hello(hello(rng)),
        1 => Repr::HelloAck(hello(rng)),
        2 => {
            let payload_len: u16 = rng.gen_range(0..=1500);
            let msg_len = rng.gen_range(u64::from(payload_len)..=u64::from(u32::MAX));
            let msg_offset = rng.gen_range(0..=msg_len - u64::from(payload_len));
            let kind = if rng.gen() {
                DataKind::Write {
                    region: RegionId(rng.gen()),
                    key: RegionKey(rng.gen()),
                    region_offset: rng.gen_range(0..=u64::MAX - msg_len),
                }
            } else {
                DataKind::Send
            };
            Repr::Data(DataRepr {
                psn: rng.gen(),
                ack_floor: rng.gen(),
                tx_time_ns: rng.gen(),
                op: OpId(rng.gen()),
                kind,
                imm: rng.gen::<bool>().then(|| rng.gen()),
                tag: rng.gen(),
                msg_len,
                msg_offset,
                payload_len,
                ack_now: rng.gen(),
                retransmission: rng.gen(),
                receiver_driven: rng.gen(),
                wants_more: rng.gen(),
            })
        }
        3 => {
            let mut sack = SackBitmap::new();
            let bits = rng.gen_range(0..=SACK_BITMAP_BITS);
            for _ in 0..rng.gen_range(0..64) {
                if bits > 0 {
                    sack.set(rng.gen_range(0..bits));
                }
            }
            let mut rejections = Rejections::new();
            for _ in 0..rng.gen_range(0..=MAX_REJECTIONS_PER_ACK) {
                rejections.push(Rejection {
                    psn: rng.gen(),
                    op: OpId(rng.gen()),
                    reason: RejectReason::from_u32(rng.gen_range(0..10)),
                });
            }
            Repr::Ack(AckRepr {
                cum_ack: rng.gen(),
                echo_psn: rng.gen(),
                echo_tx_time_ns: rng.gen(),
                ack_delay_ns: rng.gen(),
                ecn_ce_count: rng.gen(),
                credit_bytes: rng.gen(),
                sack,
                rejections,
            })
        }
        4 => Repr::Probe(probe(rng)),
        5 => Repr::ProbeAck(probe(rng)),
        6 => Repr::Credit(CreditRepr {
            credit_bytes: rng.gen(),
            nack: rng.gen::<bool>().then(|| rng.gen()),
            seq: rng.gen(),
        }),
        7 => Repr::Rts(RtsRepr { backlog_bytes: rng.gen() }),
        _ => Repr::Close(CloseRepr { reason: rng.gen() }),
    }
}

fn random_header(rng: &mut ChaCha8Rng) -> Header {
    Header { dst_conn: ConnectionId(rng.gen()), token: rng.gen() }
}

#[test]
fn random_valid_reprs_round_trip() {
    let mut rng = ChaCha8Rng::seed_from_u64(0xACC0_0001);
    for _ in 0..20_000 {
        let header = random_header(&mut rng);
        let repr = random_repr(&mut rng);
        let bytes = to_bytes(&header, &repr);
        let parsed = parse(&bytes).expect("valid repr parses");
        assert_eq!((parsed.header, parsed.repr), (header, repr));
        assert!(check_reemit(&bytes));
    }
}

fn mutate(rng: &mut ChaCha8Rng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..=4) {
        match rng.gen_range(0..6) {
            0 | 1 if !bytes.is_empty() => {
                let i = rng.gen_range(0..bytes.len());
                bytes[i] ^= 1 << rng.gen_range(0..8);
            }
            2 if !bytes.is_empty() => {
                let i = rng.gen_range(0..bytes.len());
                bytes[i] = rng.gen();
            }
            3 => {
                let len = rng.gen_range(0..=bytes.len());
                bytes.truncate(len);
            }
            4 => {
                for _ in 0..rng.gen_range(1..64) {
                    bytes.push(rng.gen());
                }
            }
            _ => {
                // Keep the length fields consistent so semantic checks get exercised.
                if bytes.len() >= DATA_HEADER_LEN && bytes[1] == PacketType::Data as u8 {
                    let payload = (bytes.len() - DATA_HEADER_LEN).min(usize::from(u16::MAX));
                    bytes.truncate(DATA_HEADER_LEN + payload);
                    bytes[20 + 34..20 + 36].copy_from_slice(&(payload as u16).to_be_bytes());
                }
            }
        }
    }
}

#[test]
fn seeded_fuzz_parse_never_panics_and_reemits() {
    let mut rng = ChaCha8Rng::seed_from_u64(0xF022_2024);
    let mut ok_random = 0;
    for _ in 0..200_000 {
        let len = rng.gen_range(0..=700);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if len >= 2 && rng.gen_bool(0.75) {
            bytes[0] = VERSION;
            bytes[1] = rng.gen_range(1..=7);
        }
        touch_all_accessors(&Packet::new_unchecked(&bytes[..]));
        let _ = peek(&bytes);
        ok_random += usize::from(check_reemit(&bytes));
    }
    let mut ok_mutated = 0;
    for _ in 0..200_000 {
        let header = random_header(&mut rng);
        let repr = random_repr(&mut rng);
        let mut bytes = to_bytes(&header, &repr);
        mutate(&mut rng, &mut bytes);
        touch_all_accessors(&Packet::new_unchecked(&bytes[..]));
        ok_mutated += usize::from(check_reemit(&bytes));
    }
    // Random bytes reach the fixed-size types; mutations reach every type's deep checks.
    assert!(ok_random > 100, "only {ok_random} random inputs parsed");
    assert!(ok_mutated > 20_000, "only {ok_mutated} mutated inputs parsed");
}

#[test]
fn trimmed_header_parses_only_as_exactly_a_data_header() {
    let data = write_data(Some(5));
    let full = to_bytes(&HEADER, &Repr::Data(data));
    let header_only = &full[..DATA_HEADER_LEN];
    // A normal parse refuses it: payload_len names bytes the datagram lacks.
    assert!(parse(header_only).is_err());
    let (header, parsed) = parse_trimmed(header_only).expect("a trimmed header");
    assert_eq!(header, HEADER);
    assert_eq!(parsed, data);
    // The full packet, a shorter cut, and other types are refused.
    assert!(parse_trimmed(&full).is_err() || data.payload_len == 0);
    assert!(parse_trimmed(&full[..DATA_HEADER_LEN - 1]).is_err());
    let credit = to_bytes(&HEADER, &Repr::Credit(CreditRepr { credit_bytes: 1, nack: None, seq: 1 }));
    assert!(parse_trimmed(&credit).is_err());
}

// ---- cargo-fuzz seed corpus ----

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parse")
}

/// Seed files for `fuzz/corpus/parse`: one valid packet per type and shape, plus malformed
/// ones so the fuzzer starts next to every error path.
fn seed_corpus() -> Vec<(String, Vec<u8>)> {
    let mut seeds: Vec<(String, Vec<u8>)> =
        samples().into_iter().map(|(name, repr)| (format!("valid_{name}"), to_bytes(&HEADER, &repr))).collect();
    let patch = |repr: Repr, f: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = to_bytes(&HEADER, &repr);
        f(&mut bytes);
        bytes
    };
    let data = Repr::Data(write_data(Some(1)));
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("bad_empty", vec![]),
        ("bad_version", patch(Repr::Hello(hello()), &|b| b[0] = 1)),
        ("bad_type", patch(Repr::Hello(hello()), &|b| b[1] = 99)),
        (
            "bad_credit_truncated",
            patch(Repr::Credit(CreditRepr { credit_bytes: 1, nack: None, seq: 1 }), &|b| b.truncate(20)),
        ),
        ("bad_rts_trailing", patch(Repr::Rts(RtsRepr { backlog_bytes: 1 }), &|b| b.push(0))),
        ("bad_data_truncated", patch(data, &|b| b.truncate(60))),
        ("bad_data_payload_len", patch(data, &|b| b[20 + 35] ^= 1)),
        ("bad_data_past_msg_len", patch(data, &|b| b[20 + 40..20 + 48].copy_from_slice(&1u64.to_be_bytes()))),
        ("bad_data_kind", patch(data, &|b| b[20 + 32] = 0)),
        ("bad_ack_sack_len", patch(Repr::Ack(ack_sparse()), &|b| b[20 + 36] = 1)),
        ("bad_ack_trailing", patch(Repr::Ack(ack_sparse()), &|b| b.push(0))),
        ("bad_hello_trailing", patch(Repr::Hello(hello()), &|b| b.push(0))),
    ];
    seeds.extend(bad.into_iter().map(|(n, b)| (n.to_string(), b)));
    seeds
}

/// Writes the seed corpus. Run after changing the format:
/// `cargo test -p accord-proto -- --ignored regenerate_fuzz_seed_corpus`.
#[test]
#[ignore = "writes files; run by hand after a format change"]
fn regenerate_fuzz_seed_corpus() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seed_corpus() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[test]
fn seed_corpus_is_committed_and_current() {
    for (name, bytes) in seed_corpus() {
        let on_disk = std::fs::read(corpus_dir().join(&name)).unwrap_or_else(|e| {
            panic!("{name}: {e}; run `cargo test -p accord-proto -- --ignored regenerate_fuzz_seed_corpus`")
        });
        assert_eq!(on_disk, bytes, "{name} is stale; regenerate the seed corpus");
        assert_eq!(name.starts_with("valid_"), parse(&bytes).is_ok(), "{name}");
    }
}

#[test]
fn corpus_replay() {
    let mut count = 0;
    for entry in std::fs::read_dir(corpus_dir()).expect("fuzz corpus directory") {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        touch_all_accessors(&Packet::new_unchecked(&bytes[..]));
        let _ = peek(&bytes);
        check_reemit(&bytes);
        count += 1;
    }
    assert!(count >= 20, "corpus has only {count} files");
}
