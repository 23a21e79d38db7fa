//! `accord sim ...`: the deterministic experiments of `accord-sim`.

use crate::table;
use accord_proto::cc::CcKind;
use accord_sim::scenarios::{self, ScenarioConfig, LOSS_SWEEP_RATES};
use clap::{Args, Subcommand};
use serde_json::json;

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Goodput of Accord and of go-back-N (hardware RDMA's recovery) under random loss, on a
    /// 100 Gbit/s, 10 µs RTT pair, each as percent of its own lossless run.
    LossSweep(LossSweepArgs),
    /// Cut one of several paths halfway through a large write: it completes, and goodput after
    /// the cut is compared with the surviving paths' share of the goodput before it.
    PathCut(PathCutArgs),
    /// Every host writes --bytes to a distinct random host (a permutation) across a fat-tree;
    /// prints the ideal (line-rate) completion, FCT min/p50/p99/max, the largest slowdown,
    /// events and wall time. The default --nodes is 128 so it returns in seconds; the issue's
    /// acceptance run is `--nodes 1024 --bytes 64000000` (minutes).
    Permutation(PermutationArgs),
}

#[derive(Args, Debug)]
pub struct Common {
    /// Seed of every random choice in the run (same seed, same numbers).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Congestion control: cubic, swift or fixed.
    #[arg(long, default_value = "cubic")]
    cc: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct LossSweepArgs {
    /// Bytes per write.
    #[arg(long, default_value_t = 64 << 20)]
    bytes: u64,
    /// Paths (entropy values) the connection sprays over.
    #[arg(long, default_value_t = 16)]
    paths: u16,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
pub struct PathCutArgs {
    #[arg(long, default_value_t = 256 << 20)]
    bytes: u64,
    #[arg(long, default_value_t = 8)]
    paths: u16,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
pub struct PermutationArgs {
    /// Hosts (a 3-tier fat-tree of the smallest radix that holds them).
    #[arg(long, default_value_t = 128)]
    nodes: u32,
    /// Line rate of every link, Gbit/s.
    #[arg(long, default_value_t = 400.0)]
    link_gbps: f64,
    /// Bytes each host writes.
    #[arg(long, default_value_t = 64_000_000)]
    bytes: u64,
    /// Payload bytes per packet.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Paths (entropy values) each connection sprays over.
    #[arg(long, default_value_t = 256)]
    paths: u16,
    /// Bytes per chunk (one path decision); 0 keeps the simulator's default.
    #[arg(long, default_value_t = 0)]
    chunk: u32,
    /// Topology: fat-tree-3 or fat-tree-2.
    #[arg(long, default_value = "fat-tree-3")]
    topology: String,
    /// Switch queue policy: ecn, droptail or trim.
    #[arg(long, default_value = "ecn")]
    queue: String,
    /// Check conservation and window invariants on every event and track every placement
    /// (slow; for tests).
    #[arg(long)]
    checked: bool,
    #[command(flatten)]
    common: Common,
}

pub fn run(cmd: SimCommand) -> Result<(), String> {
    match cmd {
        SimCommand::LossSweep(args) => loss_sweep(args),
        SimCommand::PathCut(args) => path_cut(args),
        SimCommand::Permutation(args) => permutation(args),
    }
}

fn permutation(args: PermutationArgs) -> Result<(), String> {
    use accord_sim::fabric::{self, ExperimentOptions, TopologyKind};
    if args.nodes < 2 {
        return Err("--nodes must be at least 2".into());
    }
    if args.bytes == 0 {
        return Err("--bytes must be at least 1".into());
    }
    if args.mtu == 0 {
        return Err("--mtu must be at least 1".into());
    }
    if args.paths == 0 || args.paths > accord_proto::config::PATH_COUNT_MAX {
        return Err(format!("--paths must be in 1..={}", accord_proto::config::PATH_COUNT_MAX));
    }
    CcKind::from_name(&args.common.cc).map_err(|e| e.to_string())?;
    let topology = TopologyKind::from_name(&args.topology).map_err(|e| e.to_string())?;
    let defaults = ExperimentOptions::default();
    let opts = ExperimentOptions {
        nodes: args.nodes,
        link_gbps: args.link_gbps,
        bytes: args.bytes,
        mtu: args.mtu,
        paths: args.paths,
        cc: args.common.cc.clone(),
        chunk: if args.chunk == 0 { defaults.chunk } else { args.chunk },
        topology,
        seed: args.common.seed,
        queue: args.queue.clone(),
        checked: args.checked,
        ..defaults
    };
    let r = fabric::permutation(&opts).map_err(|e| e.to_string())?;
    if args.common.json {
        println!(
            "{}",
            json!({
                "ideal_us": r.ideal_us,
                "fct_us": { "min": r.fct_us.min, "p50": r.fct_us.p50, "p99": r.fct_us.p99, "max": r.fct_us.max },
                "slowdown_max": r.slowdown_max,
                "events": r.events,
                "wall_s": r.wall_s,
                "nodes": opts.nodes,
                "cc": opts.cc,
                "seed": opts.seed,
                "drops": r.drops,
                "ecn_marks": r.ecn_marks,
                "trims": r.trims,
                "events_per_s": r.events_per_s,
                "hash": format!("{:016x}", r.hash),
            })
        );
        return Ok(());
    }
    println!(
        "# permutation: {} hosts, {:?}, {} Gbit/s, {} bytes/host, mtu {}, {} paths, chunk {}, queue {}, cc {}, seed {}",
        opts.nodes,
        opts.topology,
        opts.link_gbps,
        opts.bytes,
        opts.mtu,
        opts.paths,
        opts.chunk,
        opts.queue,
        opts.cc,
        opts.seed
    );
    let row = vec![
        format!("{:.1}", r.ideal_us),
        format!("{:.1}", r.fct_us.min),
        format!("{:.1}", r.fct_us.p50),
        format!("{:.1}", r.fct_us.p99),
        format!("{:.1}", r.fct_us.max),
        format!("{:.3}", r.slowdown_max),
        r.drops.to_string(),
        r.ecn_marks.to_string(),
        r.events.to_string(),
        format!("{:.2}", r.wall_s),
        format!("{:.0}", r.events_per_s),
        format!("{:016x}", r.hash),
    ];
    print!(
        "{}",
        table::render(
            &[
                "ideal_us",
                "fct_min_us",
                "fct_p50_us",
                "fct_p99_us",
                "fct_max_us",
                "slowdown_max",
                "drops",
                "marks",
                "events",
                "wall_s",
                "events/s",
                "hash"
            ],
            &[row]
        )
    );
    Ok(())
}

fn scenario(common: &Common, bytes: u64, paths: u16) -> Result<ScenarioConfig, String> {
    if bytes == 0 {
        return Err("--bytes must be at least 1".into());
    }
    if paths == 0 || paths > accord_proto::config::PATH_COUNT_MAX {
        return Err(format!("--paths must be in 1..={}", accord_proto::config::PATH_COUNT_MAX));
    }
    let cc = CcKind::from_name(&common.cc).map_err(|e| e.to_string())?;
    Ok(ScenarioConfig { seed: common.seed, bytes, paths, cc })
}

fn loss_sweep(args: LossSweepArgs) -> Result<(), String> {
    let cfg = scenario(&args.common, args.bytes, args.paths)?;
    let rows = scenarios::loss_sweep(&cfg, &LOSS_SWEEP_RATES).map_err(|e| e.to_string())?;
    if args.common.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "loss": r.loss,
                    "accord_goodput_pct": r.accord_goodput_pct,
                    "gbn_goodput_pct": r.gbn_goodput_pct,
                    "accord_completion_us": r.accord_completion_us,
                    "gbn_completion_us": r.gbn_completion_us,
                    "accord_retransmits": r.accord_retransmits,
                    "gbn_rewinds": r.gbn_rewinds,
                })
            })
            .collect();
        println!(
            "{}",
            json!({ "bytes": args.bytes, "paths": args.paths, "cc": args.common.cc, "seed": args.common.seed, "rows": rows })
        );
        return Ok(());
    }
    println!(
        "# loss sweep: {} MiB write, 100 Gbit/s, 10 us RTT, {} paths, cc {}, seed {}",
        args.bytes >> 20,
        args.paths,
        args.common.cc,
        args.common.seed
    );
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                loss_label(r.loss),
                format!("{:.2}", r.accord_goodput_pct),
                format!("{:.2}", r.gbn_goodput_pct),
                format!("{:.1}", r.accord_completion_us),
                format!("{:.1}", r.gbn_completion_us),
                r.accord_retransmits.to_string(),
                r.gbn_rewinds.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &["loss", "accord_goodput_%", "gbn_goodput_%", "accord_us", "gbn_us", "accord_retx", "gbn_rewinds"],
            &body
        )
    );
    Ok(())
}

fn loss_label(loss: f64) -> String {
    if loss == 0.0 {
        "0".into()
    } else {
        format!("1/{:.0}", 1.0 / loss)
    }
}

fn path_cut(args: PathCutArgs) -> Result<(), String> {
    if args.paths < 2 {
        return Err("--paths must be at least 2 to cut one".into());
    }
    let cfg = scenario(&args.common, args.bytes, args.paths)?;
    let r = scenarios::path_cut(&cfg).map_err(|e| e.to_string())?;
    if args.common.json {
        println!(
            "{}",
            json!({
                "bytes": args.bytes, "paths": args.paths, "cc": args.common.cc, "seed": args.common.seed,
                "completed": true,
                "recovered_goodput_pct": r.recovered_goodput_pct,
                "goodput_before_gbps": r.goodput_before_gbps,
                "goodput_after_gbps": r.goodput_after_gbps,
                "completion_us": r.completion_us,
                "retransmits": r.retransmits,
                "quarantines": r.quarantined_paths,
            })
        );
        return Ok(());
    }
    println!(
        "# path cut: {} MiB write over {} paths, path 0 cut at half, cc {}, seed {}",
        args.bytes >> 20,
        args.paths,
        args.common.cc,
        args.common.seed
    );
    let row = vec![
        "yes".to_string(),
        format!("{:.1}", r.goodput_before_gbps),
        format!("{:.1}", r.goodput_after_gbps),
        format!("{:.1}", r.recovered_goodput_pct),
        format!("{:.1}", r.completion_us),
        r.retransmits.to_string(),
        r.quarantined_paths.to_string(),
    ];
    print!(
        "{}",
        table::render(
            &["completed", "before_Gbps", "after_Gbps", "recovered_%", "completion_us", "retransmits", "quarantines"],
            &[row]
        )
    );
    Ok(())
}
