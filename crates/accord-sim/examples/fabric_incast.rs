//! Runs an N:1 incast into host 0 with permutation victims and prints one row per congestion
//! control.
//!
//! `cargo run --release -p accord-sim --example fabric_incast -- [nodes] [fan_in] [bytes] [victim_bytes] [cc,cc..] [queue]`

use accord_sim::fabric::{incast, ExperimentOptions, IncastOptions};
use core::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: u64| args.get(i).map_or(default, |a| a.parse().expect("a number"));
    let base = ExperimentOptions {
        nodes: num(0, 128) as u32,
        bytes: num(2, 1_000_000),
        queue: args.get(5).cloned().unwrap_or_else(|| "auto".into()),
        ..Default::default()
    };
    let opts = IncastOptions {
        fan_in: num(1, 64) as u32,
        victim_bytes: num(3, 4_000_000),
        victim_lead: Duration::from_micros(10),
        victim_hosts: 0,
        victim_messages: 1,
        victim_interval: Duration::ZERO,
        runs: 1,
        ccs: args.get(4).map_or("cubic,swift,eqds", String::as_str).split(',').map(str::to_string).collect(),
        base,
    };
    println!(
        "incast: {} hosts, {}:1 x {} bytes, victims {} bytes, queue {}, seed {}",
        opts.base.nodes, opts.fan_in, opts.base.bytes, opts.victim_bytes, opts.base.queue, opts.base.seed
    );
    println!(
        "{:>6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7} {:>7} {:>7}",
        "cc",
        "ideal_us",
        "inc_p50",
        "inc_p99",
        "inc_p999",
        "vic_p50",
        "vic_p99",
        "vic_p999",
        "drops",
        "marks",
        "trims",
        "wall_s"
    );
    match incast(&opts) {
        Ok(rows) => {
            for r in rows {
                println!(
                    "{:>6} {:>9.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>7} {:>7} {:>7} {:>7.2}",
                    r.cc,
                    r.ideal_us,
                    r.incast_p50_us,
                    r.incast_p99_us,
                    r.incast_p999_us,
                    r.victim_p50_us,
                    r.victim_p99_us,
                    r.victim_p999_us,
                    r.drops,
                    r.ecn_marks,
                    r.trims,
                    r.wall_s
                )
            }
        }
        Err(e) => println!("failed: {e}"),
    }
}
