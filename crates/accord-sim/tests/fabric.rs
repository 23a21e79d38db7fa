//! Fabric runs with every check on: invariants and conservation on every event, every byte
//! placed exactly once, no FCT below ideal (the checks live in `FabricSim::run`).

use accord_sim::fabric::experiments::{all_to_all, run_flows};
use accord_sim::fabric::workload;
use accord_sim::fabric::{incast, permutation, ExperimentOptions, IncastOptions, TopologyKind};
use core::time::Duration;
use rand::SeedableRng;

fn checked(nodes: u32, bytes: u64, topology: TopologyKind) -> ExperimentOptions {
    ExperimentOptions { nodes, bytes, topology, checked: true, ..Default::default() }
}

#[test]
fn permutation_every_topology_and_cc() {
    for (topology, nodes) in [
        (TopologyKind::Pair, 2),
        (TopologyKind::Star, 8),
        (TopologyKind::Dumbbell, 8),
        (TopologyKind::FatTree2, 16),
        (TopologyKind::FatTree3, 16),
    ] {
        for cc in ["cubic", "swift", "eqds"] {
            let opts = ExperimentOptions { cc: cc.into(), ..checked(nodes, 300_000, topology) };
            let r = permutation(&opts).unwrap_or_else(|e| panic!("{topology:?} {cc}: {e}"));
            assert!(r.fct_us.min >= r.ideal_us, "{r:?}");
            assert!(r.slowdown_max >= 1.0);
        }
    }
}

#[test]
fn same_seed_same_hash() {
    let opts = ExperimentOptions { paths: 64, ..checked(16, 200_000, TopologyKind::FatTree3) };
    let a = permutation(&opts).unwrap();
    let b = permutation(&opts).unwrap();
    assert_eq!(a.hash, b.hash);
    assert_eq!(a.fct_us, b.fct_us);
    let c = permutation(&ExperimentOptions { seed: 2, ..opts }).unwrap();
    assert_ne!(a.hash, c.hash);
}

#[test]
fn queue_policies_under_incast() {
    for queue in ["droptail", "ecn", "trim"] {
        let base = ExperimentOptions {
            queue: queue.into(),
            queue_packets: 32,
            ..checked(32, 200_000, TopologyKind::FatTree3)
        };
        let opts = IncastOptions {
            base,
            fan_in: 16,
            ccs: vec!["cubic".into(), "swift".into()],
            victim_bytes: 400_000,
            victim_lead: Duration::from_micros(5),
            victim_hosts: 0,
            victim_messages: 1,
            victim_interval: Duration::ZERO,
            runs: 1,
        };
        for r in incast(&opts).unwrap_or_else(|e| panic!("{queue}: {e}")) {
            // 16 senders share one 400G link: the last cannot finish before 16 x ideal.
            assert!(r.incast_p999_us >= 16.0 * r.ideal_us * 0.99, "{queue}: {r:?}");
            assert!(r.victim_p50_us > 0.0);
            match queue {
                "trim" => assert!(r.trims > 0 || r.drops == 0, "{r:?}"),
                "droptail" => assert_eq!(r.ecn_marks + r.trims, 0),
                _ => assert_eq!(r.trims, 0),
            }
        }
    }
}

#[test]
fn all_to_all_small() {
    let r = all_to_all(&ExperimentOptions { paths: 32, ..checked(8, 64_000, TopologyKind::FatTree2) }).unwrap();
    assert!(r.fct_us.min >= r.ideal_us);
}

/// The CI-speed pair the issue asks for: a 128-host fat-tree permutation and a 64:1 incast,
/// both fully checked, in seconds.
#[test]
fn ci_fat_tree_128_permutation_and_incast() {
    let t = std::time::Instant::now();
    let r = permutation(&checked(128, 512_000, TopologyKind::FatTree3)).unwrap();
    assert_eq!(r.nodes, 128);
    assert!(r.fct_us.min >= r.ideal_us);
    let opts = IncastOptions {
        base: checked(128, 256_000, TopologyKind::FatTree3),
        fan_in: 64,
        ccs: vec!["cubic".into()],
        victim_bytes: 0,
        victim_lead: Duration::ZERO,
        victim_hosts: 0,
        victim_messages: 1,
        victim_interval: Duration::ZERO,
        runs: 1,
    };
    let rows = incast(&opts).unwrap();
    assert!(rows[0].incast_p999_us >= 64.0 * rows[0].ideal_us * 0.99);
    eprintln!("128-host permutation + 64:1 incast: {:?}", t.elapsed());
}

#[test]
fn report_accounts_for_every_packet() {
    let opts =
        ExperimentOptions { queue: "trim".into(), queue_packets: 16, ..checked(16, 300_000, TopologyKind::Star) };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let flows = workload::incast(16, 12, 0, 300_000, &mut rng);
    let report = run_flows(&opts, flows).unwrap();
    let c = &report.counters;
    assert!(c.trims > 0, "a 12:1 incast into 16-packet queues trims");
    assert_eq!(c.trims, c.trimmed_delivered, "every trimmed header reaches its receiver");
    assert!(c.sent >= c.delivered + c.dropped + c.trimmed_delivered);
    assert_eq!(c.unroutable, 0);
    assert!(report.flows.iter().all(|f| f.fct >= f.ideal));
}

#[test]
fn receive_batching_keeps_every_check() {
    for cc in ["cubic", "swift", "eqds"] {
        let opts = ExperimentOptions {
            cc: cc.into(),
            rx_batch: Duration::from_nanos(500),
            ..checked(32, 300_000, TopologyKind::FatTree3)
        };
        let batched = permutation(&opts).unwrap();
        let exact = permutation(&ExperimentOptions { rx_batch: Duration::ZERO, ..opts }).unwrap();
        assert!(batched.fct_us.min >= batched.ideal_us);
        assert_ne!(batched.hash, exact.hash, "batching changes the timeline");
    }
}

/// A 128-host fat-tree permutation at the acceptance shape (256 paths, 4 KB MTU), small
/// enough for CI: conservation and window bounds on every event, every byte placed once, no
/// FCT below ideal (all inside `run`), and the same seed giving the same result twice.
#[test]
fn ci_fat_tree_128_permutation_repeatable_every_cc() {
    for cc in ["cubic", "swift", "eqds"] {
        let opts = ExperimentOptions { cc: cc.into(), ..checked(128, 256_000, TopologyKind::FatTree3) };
        let a = permutation(&opts).unwrap_or_else(|e| panic!("{cc}: {e}"));
        assert!(a.fct_us.min >= a.ideal_us && a.slowdown_max >= 1.0, "{a:?}");
        let b = permutation(&opts).unwrap();
        assert_eq!((a.hash, &a.fct_us, a.events), (b.hash, &b.fct_us, b.events), "{cc}: not repeatable");
    }
}

/// EQDS under an 8:1 incast with victims, on trimming queues: every check on every event
/// (conservation, credit and window invariants), every byte placed once, trimmed headers
/// NACKed and resent.
#[test]
fn eqds_incast_with_victims_keeps_every_check() {
    let base = ExperimentOptions { queue_packets: 16, ..checked(9, 200_000, TopologyKind::FatTree3) };
    let opts = IncastOptions {
        base,
        fan_in: 8,
        ccs: vec!["eqds".into()],
        victim_bytes: 200_000,
        victim_lead: Duration::from_micros(5),
        victim_hosts: 0,
        victim_messages: 1,
        victim_interval: Duration::ZERO,
        runs: 1,
    };
    let r = &incast(&opts).unwrap()[0];
    assert_eq!(r.queue, "trim");
    assert!(r.trims > 0, "eight speculative BDPs into 16-packet queues trim: {r:?}");
    assert!(r.incast_p999_us >= 8.0 * r.ideal_us * 0.99, "{r:?}");
    assert!(r.victim_p50_us > 0.0);
}

/// The summary row a table of permutation runs shows: one cell per column, each field in its
/// column with its precision (the CLI and the example print exactly these).
#[test]
fn a_permutation_row_formats_each_field_under_its_column() {
    use accord_sim::fabric::{FctSummary, PermutationResult};
    let r = PermutationResult {
        cc: "cubic".into(),
        nodes: 8,
        ideal_us: 10.04,
        fct_us: FctSummary { min: 11.06, p50: 12.5, p99: 20.0, max: 21.96 },
        slowdown_max: 2.1874,
        events: 12_345,
        wall_s: 0.5,
        events_per_s: 24_690.4,
        drops: 3,
        ecn_marks: 7,
        trims: 0,
        hash: 0xabc,
        fcts_us: vec![],
    };
    let cells: Vec<(&str, String)> = PermutationResult::COLUMNS.into_iter().zip(r.row()).collect();
    let want = [
        ("ideal_us", "10.0"),
        ("fct_min_us", "11.1"),
        ("fct_p50_us", "12.5"),
        ("fct_p99_us", "20.0"),
        ("fct_max_us", "22.0"),
        ("slowdown_max", "2.187"),
        ("drops", "3"),
        ("marks", "7"),
        ("events", "12345"),
        ("wall_s", "0.50"),
        ("events/s", "24690"),
        ("hash", "0000000000000abc"),
    ];
    for ((column, got), (want_column, want)) in cells.iter().zip(want) {
        assert_eq!((*column, got.as_str()), (want_column, want));
    }
}
