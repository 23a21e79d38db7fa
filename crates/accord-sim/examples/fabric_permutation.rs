//! Runs a permutation on a fat-tree and prints one table row per congestion control (the
//! columns `accord sim permutation` prints, [`PermutationResult::row`]).
//!
//! `cargo run --release -p accord-sim --example fabric_permutation -- [nodes] [bytes] [cc,cc..] [topology] [queue] [paths] [rx_batch_ns]`
//! e.g. `... -- 1024 64000000 cubic,swift fat-tree-3 ecn 256 0`.

use accord_sim::fabric::{permutation, ExperimentOptions, PermutationResult, TopologyKind};

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
    // Each column at least as wide as its name and 9 characters (the hash: its 16 hex digits).
    let widths = PermutationResult::COLUMNS.map(|c| c.len().max(if c == "hash" { 16 } else { 9 }));
    let line = |cc: &str, cells: &[String]| {
        let cells: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:>w$}")).collect();
        println!("{cc:>6} {}", cells.join(" "));
    };
    line("cc", &PermutationResult::COLUMNS.map(String::from));
    for cc in ccs {
        let run = ExperimentOptions { cc: cc.clone(), ..opts.clone() };
        match permutation(&run) {
            Ok(r) => line(&r.cc, &r.row()),
            Err(e) => println!("{cc:>6} failed: {e}"),
        }
    }
}
