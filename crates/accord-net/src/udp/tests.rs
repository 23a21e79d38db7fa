use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

const PATHS: u16 = 4;
const EXCHANGE_PACKETS: usize = 10_000;
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(20);
/// Flow control of the test itself, so loopback never overflows a socket.
const WINDOW_BYTES_MAX: usize = 512 << 10;
const WINDOW_PACKETS_MAX: usize = 256;
const HEADER_BYTES: usize = 8;

fn bind(gso: bool, gro: bool) -> UdpDatapath {
    UdpDatapath::bind(UdpConfig { path_count: PATHS, gso, gro, ..UdpConfig::default() }).expect("bind on loopback")
}

/// Payload of packet `seq`: its number, then a pattern derived from it.
fn fill(seq: u32, out: &mut [u8]) {
    out[..4].copy_from_slice(&seq.to_le_bytes());
    let len = out.len() as u32;
    out[4..8].copy_from_slice(&len.to_le_bytes());
    for (k, b) in out[HEADER_BYTES..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(k.wrapping_mul(7)) as u8;
    }
}

fn check(packet: &[u8]) -> Result<u32, String> {
    if packet.len() < HEADER_BYTES {
        return Err(format!("short packet of {} bytes", packet.len()));
    }
    let seq = u32::from_le_bytes(packet[..4].try_into().unwrap());
    let len = u32::from_le_bytes(packet[4..8].try_into().unwrap()) as usize;
    if len != packet.len() {
        return Err(format!("seq {seq}: length {} but header says {len}", packet.len()));
    }
    let mut expect = vec![0u8; len];
    fill(seq, &mut expect);
    if expect != packet {
        return Err(format!("seq {seq}: payload differs"));
    }
    Ok(seq)
}

/// One planned send: a run of packets (several = one segmented send).
struct Planned {
    path: u16,
    bytes: Vec<u8>,
    segment_bytes: Option<u16>,
    seqs: Vec<u32>,
}

fn plan(rng: &mut ChaCha8Rng, next_seq: &mut u32, segmented: bool, max_payload: usize) -> Planned {
    const SIZES: [usize; 10] = [8, 9, 64, 100, 512, 1200, 1472, 4000, 8972, 16_000];
    let path = rng.gen_range(0..PATHS);
    if !segmented {
        let len = if rng.gen_ratio(1, 200) { max_payload } else { SIZES[rng.gen_range(0..SIZES.len())] };
        let mut bytes = vec![0u8; len];
        fill(*next_seq, &mut bytes);
        *next_seq += 1;
        return Planned { path, bytes, segment_bytes: None, seqs: vec![*next_seq - 1] };
    }
    let segment = [64usize, 1200, 1472, 4000][rng.gen_range(0..4)];
    let count_max = (max_payload / segment).clamp(1, 16);
    let count = rng.gen_range(1..=count_max);
    let last = rng.gen_range(HEADER_BYTES..=segment);
    let mut bytes = Vec::with_capacity(segment * count);
    let mut seqs = Vec::with_capacity(count);
    for i in 0..count {
        let len = if i + 1 == count { last } else { segment };
        let start = bytes.len();
        bytes.resize(start + len, 0);
        fill(*next_seq, &mut bytes[start..]);
        seqs.push(*next_seq);
        *next_seq += 1;
    }
    Planned { path, bytes, segment_bytes: Some(segment as u16), seqs }
}

#[derive(Debug, Default)]
struct ExchangeReport {
    coalesced_datagrams: usize,
    rx_datagrams: usize,
}

/// Sends `EXCHANGE_PACKETS` packets from `a` to `b` over all paths and
/// checks each arrives once, intact, on the path it was sent to.
fn exchange(a: &mut UdpDatapath, b: &mut UdpDatapath, segmented: bool, seed: u64) -> ExchangeReport {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let max_payload = a.caps().max_payload_bytes;
    let mut bufs = b.alloc_rx_buffers(64).unwrap();
    let mut sent_path: HashMap<u32, u16> = HashMap::new();
    let mut received = vec![false; EXCHANGE_PACKETS + 64];
    let (mut received_count, mut next_seq) = (0usize, 0u32);
    let (mut in_flight_bytes, mut in_flight_packets) = (0usize, 0usize);
    let mut pending: Vec<Planned> = Vec::new();
    let mut report = ExchangeReport::default();
    let deadline = Instant::now() + EXCHANGE_DEADLINE;
    let mut planned_packets = 0;
    while received_count < planned_packets.max(1) || planned_packets < EXCHANGE_PACKETS {
        assert!(Instant::now() < deadline, "exchange stalled: {received_count}/{EXCHANGE_PACKETS} received");
        // Plan and send while the window has room.
        while pending.len() < 32 && planned_packets < EXCHANGE_PACKETS {
            let p = plan(&mut rng, &mut next_seq, segmented, max_payload);
            planned_packets += p.seqs.len();
            pending.push(p);
        }
        let mut batch = Vec::new();
        let (mut bytes, mut packets) = (in_flight_bytes, in_flight_packets);
        for p in &pending {
            if bytes + p.bytes.len() > WINDOW_BYTES_MAX || packets + p.seqs.len() > WINDOW_PACKETS_MAX {
                break;
            }
            bytes += p.bytes.len();
            packets += p.seqs.len();
            batch.push(TxDatagram {
                path: p.path,
                dst: b.local_addr(p.path).unwrap(),
                bytes: &p.bytes,
                segment_bytes: p.segment_bytes,
                ecn_capable: p.seqs[0] % 2 == 0,
            });
        }
        let sent = if batch.is_empty() { 0 } else { a.send_batch(&batch).expect("send_batch") };
        for p in pending.drain(..sent) {
            in_flight_bytes += p.bytes.len();
            in_flight_packets += p.seqs.len();
            for seq in p.seqs {
                sent_path.insert(seq, p.path);
            }
        }
        // Receive what arrived.
        let n = b.recv_batch(&mut bufs, 64).expect("recv_batch");
        for i in 0..n {
            let (bytes, meta) = bufs.get(i).unwrap();
            report.rx_datagrams += 1;
            if meta.segment_bytes < meta.len {
                report.coalesced_datagrams += 1;
            }
            assert_eq!(meta.src, a.local_addr(meta.path).unwrap(), "source is the sender's same path");
            for packet in bufs.segments(i) {
                let seq = check(packet)
                    .unwrap_or_else(|e| panic!("corrupt packet ({} of {}): {e}", packet.len(), bytes.len()));
                assert_eq!(sent_path.get(&seq), Some(&meta.path), "seq {seq} arrived on the wrong path");
                assert!(!received[seq as usize], "seq {seq} arrived twice");
                received[seq as usize] = true;
                received_count += 1;
                in_flight_bytes -= packet.len();
                in_flight_packets -= 1;
            }
        }
        if n == 0 && sent == 0 {
            b.wait_readable(Duration::from_millis(5)).unwrap();
        }
    }
    assert_eq!(received_count, planned_packets);
    report
}

#[test]
fn exchange_plain_on_all_paths() {
    let mut a = bind(false, false);
    let mut b = bind(false, false);
    assert_eq!(a.caps().gso_max_segments, 1);
    let report = exchange(&mut a, &mut b, false, 1);
    assert_eq!(report.coalesced_datagrams, 0);
    println!("plain: {report:?}, sender {:?}, receiver {:?}", a.stats(), b.stats());
}

#[test]
fn exchange_segmented_software_split() {
    // Segmented sends on a datapath without GSO are split by the driver.
    let mut a = bind(false, false);
    let mut b = bind(false, false);
    exchange(&mut a, &mut b, true, 2);
}

#[test]
fn exchange_gso_gro() {
    let mut a = bind(true, true);
    let mut b = bind(true, true);
    if a.caps().gso_max_segments == 1 {
        println!("NOTE: kernel refused UDP GSO; skipping the GSO exchange");
        return;
    }
    let report = exchange(&mut a, &mut b, true, 3);
    println!("gso+gro: caps {:?}, {report:?}, sender {:?}, receiver {:?}", b.caps(), a.stats(), b.stats());
}

#[test]
fn exchange_gso_without_gro() {
    let mut a = bind(true, false);
    let mut b = bind(false, false);
    if a.caps().gso_max_segments == 1 {
        println!("NOTE: kernel refused UDP GSO; skipping the GSO exchange");
        return;
    }
    let report = exchange(&mut a, &mut b, true, 4);
    assert_eq!(report.coalesced_datagrams, 0, "no GRO asked for, none delivered");
}

#[test]
fn socket_buffers_are_reported() {
    let a = bind(false, false);
    let sizes = a.socket_buffer_bytes();
    println!("socket buffers {sizes:?}");
    assert!(sizes.recv > 0 && sizes.send > 0);
}

fn expect_nothing_arrives(b: &mut UdpDatapath) {
    let mut bufs = b.alloc_rx_buffers(8).unwrap();
    b.wait_readable(Duration::from_millis(20)).unwrap();
    assert_eq!(b.recv_batch(&mut bufs, 8).unwrap(), 0);
}

#[test]
fn bad_sends_are_errors_and_send_nothing() {
    let mut a = bind(true, false);
    let mut b = bind(false, false);
    let dst = b.local_addr(0).unwrap();
    let ok = [7u8; 16];
    let huge = vec![0u8; a.caps().max_payload_bytes + 1];
    let many = vec![0u8; 100 * 65];
    let cases: Vec<(TxDatagram<'_>, &str)> = vec![
        (TxDatagram::new(0, dst, &huge), "too large"),
        (TxDatagram::new(PATHS, dst, &ok), "unknown path"),
        (TxDatagram { segment_bytes: Some(0), ..TxDatagram::new(0, dst, &ok) }, "zero segment"),
        (TxDatagram { segment_bytes: Some(100), ..TxDatagram::new(0, dst, &many) }, "65 segments"),
        (TxDatagram { segment_bytes: Some(u16::MAX), ..TxDatagram::new(0, dst, &ok) }, "segment over max payload"),
        (TxDatagram::new(0, SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), dst.port()), &ok), "family mismatch"),
    ];
    for (bad, what) in cases {
        // A good datagram first: the bad one must fail the whole batch.
        let err = a.send_batch(&[TxDatagram::new(0, dst, &ok), bad]).unwrap_err();
        println!("{what}: {err}");
        match (what, &err) {
            ("too large", DatapathError::MessageTooLarge { .. })
            | ("segment over max payload", DatapathError::MessageTooLarge { .. })
            | ("unknown path", DatapathError::UnknownPath { .. })
            | ("zero segment", DatapathError::InvalidSegmentation { .. })
            | ("65 segments", DatapathError::InvalidSegmentation { .. })
            | ("family mismatch", DatapathError::AddressFamilyMismatch { .. }) => {}
            _ => panic!("{what}: unexpected error {err:?}"),
        }
    }
    expect_nothing_arrives(&mut b);
}

#[test]
fn empty_and_maximum_datagrams_pass() {
    let mut a = bind(false, false);
    let mut b = bind(false, true);
    let dst = b.local_addr(1).unwrap();
    let max = vec![0xA5u8; a.caps().max_payload_bytes];
    assert_eq!(a.send_batch(&[TxDatagram::new(1, dst, &[]), TxDatagram::new(1, dst, &max)]).unwrap(), 2);
    let mut bufs = b.alloc_rx_buffers(4).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 2 && Instant::now() < deadline {
        b.wait_readable(Duration::from_millis(10)).unwrap();
        b.recv_batch(&mut bufs, 4).unwrap();
        got.extend(bufs.iter().map(|(bytes, meta)| (bytes.to_vec(), *meta)));
    }
    assert_eq!(got.len(), 2);
    assert!(got[0].0.is_empty() && got[0].1.path == 1);
    assert_eq!(got[1].0, max);
}

#[test]
fn small_rx_buffers_are_refused() {
    let mut b = bind(false, true);
    let mut bufs = RxBuffers::new(4, 1500).unwrap();
    assert!(matches!(b.recv_batch(&mut bufs, 4), Err(DatapathError::RxSlotTooSmall { .. })));
}

#[test]
fn bind_conflict_names_the_address() {
    let a = bind(false, false);
    let taken = a.local_addr(0).unwrap();
    let err =
        UdpDatapath::bind(UdpConfig { base_port: taken.port(), path_count: 1, ..UdpConfig::default() }).unwrap_err();
    assert!(matches!(err, DatapathError::Bind { path: 0, addr, .. } if addr == taken), "{err:?}");
    assert!(err.to_string().contains(&taken.to_string()));
}

#[test]
fn config_is_validated_and_overridable() {
    let bad = [
        UdpConfig { path_count: 0, ..UdpConfig::default() },
        UdpConfig { path_count: UDP_PATHS_MAX + 1, ..UdpConfig::default() },
        UdpConfig { base_port: 65_535, path_count: 2, ..UdpConfig::default() },
        UdpConfig { recv_buffer_bytes: 0, ..UdpConfig::default() },
    ];
    for config in bad {
        assert!(matches!(UdpDatapath::bind(config), Err(DatapathError::InvalidConfig(_))));
    }
    let env: HashMap<&str, &str> = [("ACCORD_NET_UDP_PATHS", "7"), ("ACCORD_NET_UDP_GSO", "0")].into();
    let config = UdpConfig::default().with_overrides_from(|k| env.get(k).map(|v| v.to_string())).unwrap();
    assert_eq!((config.path_count, config.gso, config.gro), (7, false, true));
    let env: HashMap<&str, &str> = [("ACCORD_NET_UDP_GRO", "maybe")].into();
    assert!(UdpConfig::default().with_overrides_from(|k| env.get(k).map(|v| v.to_string())).is_err());
}

#[test]
fn wait_readable_times_out_then_wakes() {
    let mut a = bind(false, false);
    let mut b = bind(false, false);
    assert!(!b.wait_readable(Duration::from_millis(10)).unwrap());
    let dst = b.local_addr(3).unwrap();
    assert_eq!(a.send_batch(&[TxDatagram::new(3, dst, b"wake")]).unwrap(), 1);
    assert!(b.wait_readable(Duration::from_secs(5)).unwrap());
}

#[test]
fn ecn_ce_is_reported() {
    let mut b = bind(false, false);
    if !b.caps().ecn {
        println!("NOTE: kernel does not report TOS; skipping the ECN check");
        return;
    }
    let dst = b.local_addr(2).unwrap();
    // A plain socket that marks its packets CE, as a congested switch would.
    let marker = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    marker.bind(&SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0).into()).unwrap();
    marker.set_tos(ECN_CE.into()).unwrap();
    marker.send_to(b"marked", &dst.into()).unwrap();
    // And our own ECT(0) send, which must not read as CE.
    let mut a = bind(false, false);
    let ect = TxDatagram { ecn_capable: true, ..TxDatagram::new(2, dst, b"capable") };
    assert_eq!(a.send_batch(&[ect]).unwrap(), 1);
    let mut bufs = b.alloc_rx_buffers(4).unwrap();
    let mut seen = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.len() < 2 && Instant::now() < deadline {
        b.wait_readable(Duration::from_millis(10)).unwrap();
        b.recv_batch(&mut bufs, 4).unwrap();
        for (bytes, meta) in bufs.iter() {
            seen.insert(bytes.to_vec(), meta.ecn_ce);
        }
    }
    assert_eq!(seen.get(&b"marked"[..]), Some(&true));
    assert_eq!(seen.get(&b"capable"[..]), Some(&false));
}

#[test]
fn wrappers_compose_over_udp_and_cut_from_another_thread() {
    use crate::fault::{FaultConfig, FaultInjector};
    use crate::trace::{TraceConfig, TracingDatapath};
    let injector = FaultInjector::new(bind(true, false), FaultConfig::default(), 11).unwrap();
    let control = injector.control();
    let boxed: Box<dyn Datapath> = Box::new(injector);
    let mut a = TracingDatapath::new(boxed, TraceConfig::default()).unwrap();
    let mut b = bind(false, false);
    std::thread::spawn(move || assert!(control.cut_path(2))).join().unwrap();
    let payloads: Vec<[u8; 4]> = (0..400u32).map(u32::to_le_bytes).collect();
    let dsts: Vec<SocketAddr> = (0..PATHS).map(|p| b.local_addr(p).unwrap()).collect();
    let batch: Vec<TxDatagram<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| TxDatagram::new(i as u16 % PATHS, dsts[i % PATHS as usize], p))
        .collect();
    let mut sent = 0;
    let mut bufs = b.alloc_rx_buffers(64).unwrap();
    let mut per_path = [0usize; PATHS as usize];
    let deadline = Instant::now() + Duration::from_secs(10);
    while per_path.iter().sum::<usize>() < 300 {
        assert!(Instant::now() < deadline, "stalled at {per_path:?}");
        if sent < batch.len() {
            sent += a.send_batch(&batch[sent..(sent + 32).min(batch.len())]).unwrap();
        }
        b.recv_batch(&mut bufs, 64).unwrap();
        for (_, meta) in bufs.iter() {
            per_path[usize::from(meta.path)] += 1;
        }
    }
    b.wait_readable(Duration::from_millis(20)).unwrap();
    b.recv_batch(&mut bufs, 64).unwrap();
    assert!(bufs.is_empty(), "nothing beyond the uncut paths' 300");
    assert_eq!(per_path, [100, 100, 0, 100]);
    assert_eq!(a.counters().path(2).unwrap().tx_packets, 100, "the tracer above the cut saw them");
}

#[test]
fn the_parser_reads_exactly_the_registered_knobs() {
    use accord_knobs::{check_reads, names_read_by, Component};
    let read = names_read_by(|lookup| {
        crate::udp::UdpConfig::default().with_overrides_from(|n| lookup(n)).expect("an empty environment parses");
    });
    check_reads(Component::Udp, &read).unwrap();
}
