//! Runs a permutation on a fat-tree and prints one table row per congestion control.
//!
//! `cargo run --release -p accord-sim --example fabric_permutation -- [nodes] [bytes] [cc,cc..] [topology] [queue] [paths] [rx_batch_ns]`
//! e.g. `... -- 1024 64000000 cubic,swift fat-tree-3 ecn 256 0`.

use accord_sim::fabric::{permutation, ExperimentOptions, TopologyKind};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let mut opts = ExperimentOptions::default();
    if let Some(n) = arg(0) {
        opts.nodes = n.parse().expect("nodes: a number");
    }
    if let Some(b) = arg(1) {
        opts.bytes = b.parse().expect("bytes: a number");
    }
    let ccs: Vec<String> = arg(2).unwrap_or("cubic,swift").split(',').map(str::to_string).collect();
    if let Some(t) = arg(3) {
        opts.topology = TopologyKind::from_name(t).expect("topology");
    }
    if let Some(q) = arg(4) {
        opts.queue = q.to_string();
    }
    if let Some(p) = arg(5) {
        opts.paths = p.parse().expect("paths: a number");
    }
    if let Some(ns) = arg(6) {
        opts.rx_batch = std::time::Duration::from_nanos(ns.parse().expect("rx_batch_ns: a number"));
    }
    println!(
        "permutation: {}, queue {}, rx_batch {:?}, seed {}",
        opts.fabric_summary(),
        opts.queue,
        opts.rx_batch,
        opts.seed
    );
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>11} {:>7} {:>10} {:>16}",
        "cc",
        "ideal_us",
        "min_us",
        "p50_us",
        "p99_us",
        "max_us",
        "slow_max",
        "drops",
        "marks",
        "events",
        "wall_s",
        "events/s",
        "hash"
    );
    for cc in ccs {
        let run = ExperimentOptions { cc: cc.clone(), ..opts.clone() };
        match permutation(&run) {
            Ok(r) => println!(
                "{:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.3} {:>8} {:>8} {:>11} {:>7.2} {:>10.0} {:>16x}",
                r.cc,
                r.ideal_us,
                r.fct_us.min,
                r.fct_us.p50,
                r.fct_us.p99,
                r.fct_us.max,
                r.slowdown_max,
                r.drops,
                r.ecn_marks,
                r.events,
                r.wall_s,
                r.events_per_s,
                r.hash
            ),
            Err(e) => println!("{cc:>6} failed: {e}"),
        }
    }
}
