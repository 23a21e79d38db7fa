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

pub fn run(cmd: SimCommand) -> Result<(), String> {
    match cmd {
        SimCommand::LossSweep(args) => loss_sweep(args),
        SimCommand::PathCut(args) => path_cut(args),
    }
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
