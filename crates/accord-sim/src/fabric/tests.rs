use super::memory::CountingMemory;
use super::packet::{PacketPool, RxBuffer};
use super::port::{Admission, Port, QueueConfig};
use super::topology::{ecmp_hash, LinkSpec, Topology, TopologyKind};
use super::workload;
use accord_proto::{Placement, PlacementTarget, RegionId, RegionKey};
use core::time::Duration;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;

const LINK: LinkSpec = LinkSpec { rate_bps: 400_000_000_000, latency: Duration::from_micros(1) };

#[test]
fn fat_tree_3_shape_and_hops() {
    let t = Topology::build(TopologyKind::FatTree3, 16, LINK).unwrap();
    assert_eq!((t.radix, t.hosts(), t.switches()), (4, 16, 20));
    assert_eq!(t.ports().len(), 2 * (16 + 16 + 16));
    assert_eq!(t.hop_count(0, 1), 2, "same edge");
    assert_eq!(t.hop_count(0, 2), 4, "same pod");
    assert_eq!(t.hop_count(0, 15), 6, "other pod");
    assert_eq!(t.diameter_hops(), 6);
    // An edge switch reaches a remote host over both aggregation switches.
    let edge = t.ports()[t.host_port(0) as usize].to;
    assert_eq!(t.next_hops(edge, 15).len(), 2);
    assert_eq!(t.next_hops(edge, 1).len(), 1);
}

#[test]
fn fat_tree_sizes() {
    assert_eq!(TopologyKind::FatTree3.radix_for(1024), 16);
    assert_eq!(TopologyKind::FatTree3.radix_for(128), 8);
    assert_eq!(TopologyKind::FatTree2.radix_for(128), 16);
    let t = Topology::build(TopologyKind::FatTree2, 128, LINK).unwrap();
    assert_eq!((t.hosts(), t.switches()), (128, 8 + 16));
    assert_eq!(t.diameter_hops(), 4);
    // A partial fat-tree (fewer hosts than the radix holds) still routes everywhere.
    let t = Topology::build(TopologyKind::FatTree3, 20, LINK).unwrap();
    assert_eq!(t.radix, 6);
    assert_eq!(t.hop_count(0, 19), 6);
}

#[test]
fn small_topologies_route() {
    for (kind, hosts, diameter) in
        [(TopologyKind::Pair, 2, 1), (TopologyKind::Star, 9, 2), (TopologyKind::Dumbbell, 8, 3)]
    {
        let t = Topology::build(kind, hosts, LINK).unwrap();
        assert_eq!(t.diameter_hops(), diameter, "{kind:?}");
        for a in 0..hosts {
            for b in (0..hosts).filter(|&b| b != a) {
                assert!(t.hop_count(a, b) <= diameter);
            }
        }
    }
    assert!(Topology::build(TopologyKind::Pair, 3, LINK).is_err());
    assert_eq!(TopologyKind::from_name("fat-tree-3"), Ok(TopologyKind::FatTree3));
    assert!(TopologyKind::from_name("torus").is_err());
}

#[test]
fn ecmp_spreads_paths_over_uplinks() {
    let mut used = BTreeSet::new();
    for path in 0..256u16 {
        used.insert(ecmp_hash(3, 77, path, 0x1234) % 8);
    }
    assert_eq!(used.len(), 8, "256 entropy values cover 8 uplinks");
    assert_eq!(ecmp_hash(3, 77, 5, 1), ecmp_hash(3, 77, 5, 1));
    assert_ne!(ecmp_hash(3, 77, 5, 1), ecmp_hash(3, 77, 5, 2), "salt changes the hash");
}

#[test]
fn port_serialises_fifo_and_schedules_only_the_head() {
    let mut pool = PacketPool::default();
    let ids: Vec<u32> = (0..3).map(|i| pool.alloc(i, 9, 0, &[0; 8], 0, false)).collect();
    let mut p = Port::new(9, 400_000_000_000, Duration::from_nanos(500), QueueConfig::drop_tail(1 << 20));
    assert_eq!(p.picos_per_byte(), 20);
    // 1000 bytes = 20 ns; arrival = 20 + 500.
    assert_eq!(p.transmit(0, ids[0], 1000, false, &mut pool), Some(520));
    assert_eq!(p.transmit(0, ids[1], 1000, false, &mut pool), None, "second packet waits behind the head");
    assert_eq!(p.wire.tail, ids[1]);
    assert_eq!(p.backlog_bytes(0), 2000);
    assert_eq!(p.backlog_bytes(30_000), 500);
    // The priority lane is a separate FIFO.
    assert_eq!(p.transmit(0, ids[2], 100, true, &mut pool), Some(502));
    assert_eq!(p.arrive(ids[2], true, &mut pool), None);
    // Arrivals pop in order and name the next head with its time; an emptied wire takes a new head.
    assert_eq!(p.arrive(ids[0], false, &mut pool), Some((ids[1], 540)));
    assert_eq!(p.arrive(ids[1], false, &mut pool), None);
    assert!(p.wire.is_empty() && p.priority_wire.is_empty());
    assert_eq!(p.transmit(40_000, ids[0], 1000, false, &mut pool), Some(560));
    assert_eq!((p.wire.head, p.wire.tail), (ids[0], ids[0]));
}

#[test]
fn queue_policies() {
    let mut pool = PacketPool::default();
    let ids: Vec<u32> = (0..3).map(|i| pool.alloc(i, 0, 0, &[0; 8], 0, false)).collect();
    let mut drop = Port::new(0, 100_000_000_000, Duration::ZERO, QueueConfig::drop_tail(3000));
    assert_eq!(drop.admit(0, 2000, true, true, 0.0), Admission::Queue { mark_ce: false });
    drop.transmit(0, ids[0], 2000, false, &mut pool);
    assert_eq!(drop.admit(0, 2000, true, true, 0.0), Admission::Drop);

    let mut ecn = Port::new(0, 100_000_000_000, Duration::ZERO, QueueConfig::ecn(100_000, 1000, 1000));
    assert_eq!(ecn.admit(0, 2000, true, true, 0.5), Admission::Queue { mark_ce: false });
    ecn.transmit(0, ids[1], 2000, false, &mut pool);
    assert_eq!(ecn.admit(0, 2000, true, true, 0.5), Admission::Queue { mark_ce: true });
    assert_eq!(ecn.admit(0, 2000, true, false, 0.5), Admission::Queue { mark_ce: false }, "not ECT");

    let mut trim = Port::new(0, 100_000_000_000, Duration::ZERO, QueueConfig::trim(100_000, 3000));
    trim.transmit(0, ids[2], 2000, false, &mut pool);
    assert_eq!(trim.admit(0, 2000, true, true, 0.0), Admission::Trim);
    assert_eq!(trim.admit(0, 200, false, false, 0.0), Admission::Queue { mark_ce: false }, "ACKs are not trimmed");
    assert!(trim.admit_header(0));
}

#[test]
fn pool_reuses_and_rx_buffer_rebuilds() {
    let mut pool = PacketPool::default();
    let a = pool.alloc(1, 2, 3, &[7u8; 40], 100, true);
    pool.free(a);
    let b = pool.alloc(4, 5, 6, &[9u8; 8], 16, false);
    assert_eq!(a, b, "slot reused");
    assert_eq!((pool.live(), pool.live_max()), (1, 1));
    let mut rx = RxBuffer::new(256);
    let long = pool.alloc(0, 0, 0, &[0xffu8; 64], 0, false);
    assert_eq!(pool.datagram(long, &mut rx).unwrap().len(), 64);
    let d = pool.datagram(b, &mut rx).unwrap();
    assert_eq!(d.len(), 24);
    assert_eq!(&d[..8], &[9u8; 8]);
    assert!(d[8..].iter().all(|&x| x == 0), "stale header bytes cleared from the payload");
    // A header too long for the slot's inline bytes goes to its spill buffer, intact.
    let ack: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
    let big = pool.alloc(0, 1, 0, &ack, 10, false);
    assert_eq!(pool.header(big), &ack[..]);
    assert_eq!(pool.get(big).wire_bytes(), 210 + crate::link::FRAMING_BYTES);
    assert_eq!(&pool.datagram(big, &mut rx).unwrap()[..200], &ack[..]);
    pool.free(big);
    let small = pool.alloc(0, 1, 0, &[5u8; 20], 0, false);
    assert_eq!((small, pool.header(small)), (big, &[5u8; 20][..]), "reused slot, inline again");
}

#[test]
fn memory_counts_and_detects_overlap() {
    let mut m = CountingMemory::new(true);
    m.register(RegionId(1), RegionKey(5), 300);
    let place = |m: &mut CountingMemory, offset, len: usize| {
        m.place(&Placement { target: PlacementTarget::Region { region: RegionId(1), offset }, payload: 0..len })
    };
    place(&mut m, 0, 100);
    place(&mut m, 200, 100);
    assert!(m.region(RegionId(1)).unwrap().check_exactly_once().is_err(), "hole");
    place(&mut m, 100, 100);
    m.region(RegionId(1)).unwrap().check_exactly_once().unwrap();
    place(&mut m, 100, 100);
    assert!(m.region(RegionId(1)).unwrap().check_exactly_once().is_err(), "duplicate");
}

#[test]
fn workloads() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for hosts in [2, 3, 16, 100] {
        let flows = workload::permutation(hosts, 10, &mut rng);
        let dsts: BTreeSet<u32> = flows.iter().map(|f| f.dst).collect();
        assert_eq!(dsts.len(), hosts as usize);
        assert!(flows.iter().all(|f| f.src != f.dst));
    }
    let incast = workload::incast(32, 8, 0, 10, &mut rng);
    assert_eq!(incast.len(), 8);
    assert!(incast.iter().all(|f| f.dst == 0 && f.src != 0));
    let mixed = workload::incast_with_victims(32, 8, 10, 20, Duration::from_micros(5), &mut rng);
    assert_eq!(mixed.len(), 8 + 31);
    assert!(mixed.iter().filter(|f| f.class == workload::FlowClass::Victim).all(|f| f.src != 0 && f.dst != 0));
    assert_eq!(workload::all_to_all(5, 1, Duration::ZERO, &mut rng).len(), 20);
}

/// The header both `accord sim permutation` and the `fabric_permutation` example print starts
/// with this summary, word for word as they printed it before they shared it.
#[test]
fn fabric_summary_names_hosts_topology_rate_bytes_mtu_and_paths() {
    let opts = super::ExperimentOptions {
        nodes: 16,
        topology: TopologyKind::Star,
        link_gbps: 100.0,
        bytes: 1_000_000,
        mtu: 4096,
        paths: 8,
        ..Default::default()
    };
    assert_eq!(opts.fabric_summary(), "16 hosts, Star, 100 Gbit/s, 1000000 bytes/host, mtu 4096, 8 paths");
}
