//! `accord sim ...`: the deterministic experiments of `accord-sim`.

use crate::size::{parse_size, parse_size_u32};
use crate::table;
use crate::validate;
use accord_proto::cc::CcKind;
use accord_sim::scenarios::{self, ScenarioConfig, LOSS_SWEEP_RATES};
use clap::{Args, Subcommand};
use serde_json::json;

/// Largest write (`--bytes`) a simulation takes: its events, and so its run time, grow with it.
pub const SIM_BYTES_MAX: u64 = 1 << 40;
/// Memory a simulated host needs besides its paths, and per path: estimates above what was
/// measured, so a refusal is never wrong by much. Measured (peak RSS, `/usr/bin/time -f %M`):
/// `accord sim permutation --nodes N --bytes 4096` at N = 4096 and 16384 (paths 256) grows
/// 174 KiB a host; `--paths 16`, N = 4096: 27 KiB a host; `--nodes 256` (64 MB writes):
/// 266 KiB a host.
const HOST_BYTES_BASE: u64 = 64 << 10;
const HOST_BYTES_PER_PATH: u64 = 1 << 10;
/// Memory per victim message of `accord sim incast`: above the 0.56 KiB measured (peak RSS of
/// `--senders 4 --victims 64 --victim-messages 10` against `... 2000`, `--victim-bytes 4096`).
const MESSAGE_BYTES: u64 = 1 << 10;

/// Refuses `hosts` hosts (and `messages` extra flows) the simulator cannot hold or this
/// machine cannot give memory for; `what` names the flags.
fn check_fabric_size(what: &str, hosts: u32, paths: u16, messages: u64) -> Result<(), String> {
    let limit = accord_sim::fabric::topology::NODES_MAX;
    let per_host = HOST_BYTES_BASE + HOST_BYTES_PER_PATH * u64::from(paths);
    let needed = u64::from(hosts).saturating_mul(per_host).saturating_add(messages.saturating_mul(MESSAGE_BYTES));
    validate::fits_in_memory(
        what,
        needed,
        &format!(
            "about {} a host with {paths} paths{}",
            validate::bytes(per_host),
            if messages > 0 { format!(", {} a victim message", validate::bytes(MESSAGE_BYTES)) } else { String::new() }
        ),
    )?;
    if hosts > limit {
        return Err(format!("{what}: the simulator holds at most {limit} nodes (hosts and switches): use fewer hosts"));
    }
    Ok(())
}

/// `--bytes` of every simulation.
fn check_bytes(flag: &str, bytes: u64) -> Result<u64, String> {
    validate::within(flag, bytes, 1, SIM_BYTES_MAX)
}

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Goodput of Accord and of go-back-N (hardware RDMA's recovery) under random loss, on a
    /// 100 Gbit/s, 10 µs RTT pair, each as percent of its own lossless run.
    LossSweep(LossSweepArgs),
    /// Cut one of several paths halfway through a large write: it completes, and goodput after
    /// the cut is compared with the surviving paths' share of the goodput before it.
    PathCut(PathCutArgs),
    /// A write while datagrams come late and nothing is lost, with the RTO floor learned from
    /// spurious losses on and off (same seed): completion, losses declared and those found wrong.
    /// Two kinds of lateness: a host that stalls before a send (everything after it waits: late
    /// acknowledgements), and single datagrams held back (reordering).
    LateAcks(LateAcksArgs),
    /// Every host writes --bytes to a distinct random host (a permutation) across a fat-tree;
    /// prints the ideal (line-rate) completion, FCT min/p50/p99/max, the largest slowdown,
    /// events and wall time. The default --nodes is 128 so it returns in seconds; the issue's
    /// acceptance run is `--nodes 1024 --bytes 64000000` (minutes).
    Permutation(PermutationArgs),
    /// An S:1 incast into host 0 alongside a permutation of message streams among hosts
    /// 0..V (the MoE serving case), on a fat-tree, once per congestion control: P50/P99/P99.9
    /// message latency of incast and victim flows, and the victims' P99 of each sender-driven
    /// policy over EQDS's.
    Incast(IncastArgs),
}

#[derive(Args, Debug)]
pub struct IncastArgs {
    /// Incast senders into host 0.
    #[arg(long, default_value_t = 15)]
    senders: u32,
    /// Hosts of the victims' permutation (host 0 among them).
    #[arg(long, default_value_t = 16)]
    victims: u32,
    /// Congestion controls to compare, comma separated (cubic, swift, eqds, fixed).
    #[arg(long, default_value = "cubic,swift,eqds")]
    cc: String,
    /// Bytes each incast sender writes.
    #[arg(long, default_value_t = 1_000_000, value_parser = parse_size)]
    bytes: u64,
    /// Bytes per victim message.
    #[arg(long, default_value_t = 64 * 1024, value_parser = parse_size)]
    victim_bytes: u64,
    /// Messages per victim pair.
    #[arg(long, default_value_t = 20)]
    victim_messages: u32,
    /// Microseconds between a pair's messages; 0 spreads them over the incast's line-rate
    /// duration (senders x bytes at the link rate).
    #[arg(long, default_value_t = 0.0)]
    victim_interval_us: f64,
    /// Runs per congestion control (seeds seed..seed+runs); percentiles pool their messages.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Topology: fat-tree-3, fat-tree-2, star, dumbbell.
    #[arg(long, default_value = "fat-tree-3")]
    topology: String,
    /// Link rate in Gbit/s.
    #[arg(long, default_value_t = 400.0)]
    gbps: f64,
    /// Switch queue: auto (trimming for eqds, ECN marking for the others), ecn, trim, droptail.
    #[arg(long, default_value = "auto")]
    queue: String,
    #[command(flatten)]
    eqds: EqdsArgs,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Receiver-driven (EQDS) and path-selection choices of the fabric experiments.
#[derive(Args, Debug)]
pub struct EqdsArgs {
    /// EQDS credit pacer order: srpt (shortest remaining message first, a round-robin grant
    /// every 8th) or rr (round robin, max-min fair).
    #[arg(long, default_value = "srpt")]
    pacer_order: String,
    /// Path selector: p2c (power-of-two choices), rr (round robin) or recycle (entropy
    /// recycling: reuse paths acknowledged without trim, loss or mark).
    #[arg(long, default_value = "p2c")]
    selector: String,
}

/// The flags are read as text and parsed here, in the command, so a bad name is refused with
/// the command's exit code (1) and one line, like every other bad value of `accord sim`.
impl EqdsArgs {
    fn pacer_order(&self) -> Result<accord_proto::PacerOrder, String> {
        self.pacer_order.parse().map_err(|e| format!("--pacer-order: {e}"))
    }

    /// The selector's canonical name, which the simulator takes.
    fn selector(&self) -> Result<String, String> {
        let kind: accord_proto::path::SelectorKind = self.selector.parse().map_err(|e| format!("--selector: {e}"))?;
        Ok(kind.to_string())
    }
}

impl Common {
    fn cc(&self) -> Result<CcKind, String> {
        self.cc.parse().map_err(|e| format!("--cc: {e}"))
    }
}

#[derive(Args, Debug)]
pub struct Common {
    /// Seed of every random choice in the run (same seed, same numbers).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Congestion control: cubic, swift, eqds or fixed.
    #[arg(long, default_value = "cubic")]
    cc: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct LossSweepArgs {
    /// Bytes per write.
    #[arg(long, default_value_t = 64 << 20, value_parser = parse_size)]
    bytes: u64,
    /// Paths (entropy values) the connection sprays over.
    #[arg(long, default_value_t = 16)]
    paths: u16,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
pub struct LateAcksArgs {
    /// Bytes per write.
    #[arg(long, default_value_t = 16 << 20, value_parser = parse_size)]
    bytes: u64,
    /// Paths (entropy values) the connection sprays over.
    #[arg(long, default_value_t = 16)]
    paths: u16,
    /// A stall, or a held-back datagram, lasts up to this many microseconds (uniformly).
    #[arg(long, default_value_t = 1000)]
    late_us: u64,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
pub struct PathCutArgs {
    #[arg(long, default_value_t = 256 << 20, value_parser = parse_size)]
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
    #[arg(long, default_value_t = 64_000_000, value_parser = parse_size)]
    bytes: u64,
    /// Payload bytes per packet.
    #[arg(long, default_value_t = 4096, value_parser = parse_size_u32)]
    mtu: u32,
    /// Paths (entropy values) each connection sprays over.
    #[arg(long, default_value_t = 256)]
    paths: u16,
    /// Bytes per chunk (one path decision); 0 keeps the simulator's default.
    #[arg(long, default_value_t = 0, value_parser = parse_size_u32)]
    chunk: u32,
    /// Topology: fat-tree-3 or fat-tree-2.
    #[arg(long, default_value = "fat-tree-3")]
    topology: String,
    /// Switch queue policy: auto (trimming for eqds, ECN marking for the others), ecn, droptail or trim.
    #[arg(long, default_value = "auto")]
    queue: String,
    /// Check conservation and window invariants on every event and track every placement
    /// (slow; for tests).
    #[arg(long)]
    checked: bool,
    /// Write an SVG chart of the flow-completion-time CDF (with the line-rate ideal).
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
    #[command(flatten)]
    eqds: EqdsArgs,
    #[command(flatten)]
    common: Common,
}

pub fn run(cmd: SimCommand) -> Result<(), String> {
    match cmd {
        SimCommand::LossSweep(args) => loss_sweep(args),
        SimCommand::PathCut(args) => path_cut(args),
        SimCommand::LateAcks(args) => late_acks(args),
        SimCommand::Permutation(args) => permutation(args),
        SimCommand::Incast(args) => incast(args),
    }
}

fn permutation(args: PermutationArgs) -> Result<(), String> {
    use accord_sim::fabric::{self, ExperimentOptions, PermutationResult, TopologyKind};
    if args.nodes < 2 {
        return Err("--nodes must be at least 2".into());
    }
    check_bytes("--bytes", args.bytes)?;
    if args.mtu == 0 {
        return Err("--mtu must be at least 1".into());
    }
    if args.paths == 0 || args.paths > accord_proto::config::PATH_COUNT_MAX {
        return Err(format!("--paths must be in 1..={}", accord_proto::config::PATH_COUNT_MAX));
    }
    validate::positive("--link-gbps", args.link_gbps)?;
    check_fabric_size(&format!("--nodes {}", args.nodes), args.nodes, args.paths, 0)?;
    let cc = args.common.cc()?;
    let topology = TopologyKind::from_name(&args.topology).map_err(|e| e.to_string())?;
    let defaults = ExperimentOptions::default();
    let opts = ExperimentOptions {
        nodes: args.nodes,
        link_gbps: args.link_gbps,
        bytes: args.bytes,
        mtu: args.mtu,
        paths: args.paths,
        cc: cc.to_string(),
        chunk: if args.chunk == 0 { defaults.chunk } else { args.chunk },
        topology,
        seed: args.common.seed,
        queue: args.queue.clone(),
        checked: args.checked,
        selector: args.eqds.selector()?,
        pacer_order: args.eqds.pacer_order()?,
        ..defaults
    };
    let mut progress = crate::progress::Progress::new("accord sim permutation");
    let r = fabric::permutation_reporting(&opts, |done, all| progress.update(done, all, "flows done"))
        .map_err(|e| e.to_string())?;
    progress.finish();
    if let Some(path) = &args.plot {
        let title = format!(
            "accord sim permutation: {} hosts, {} bytes each, {}, seed {}",
            opts.nodes, opts.bytes, opts.cc, opts.seed
        );
        crate::plot::fct_cdf_chart(path, &title, &r.fcts_us, r.ideal_us)?;
    }
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
        "# permutation: {}, chunk {}, queue {}, cc {}, selector {}, pacer {:?}, seed {}",
        opts.fabric_summary(),
        // The chunk in force: EQDS caps it at its own largest chunk.
        match CcKind::from_name(&opts.cc) {
            Ok(CcKind::Eqds(eqds)) => opts.chunk.min(eqds.chunk_bytes_max),
            _ => opts.chunk,
        },
        opts.queue_name(),
        opts.cc,
        opts.selector,
        opts.pacer_order,
        opts.seed
    );
    print!("{}", table::render(&PermutationResult::COLUMNS, &[r.row().to_vec()]));
    Ok(())
}

fn scenario(common: &Common, bytes: u64, paths: u16) -> Result<ScenarioConfig, String> {
    check_bytes("--bytes", bytes)?;
    if paths == 0 || paths > accord_proto::config::PATH_COUNT_MAX {
        return Err(format!("--paths must be in 1..={}", accord_proto::config::PATH_COUNT_MAX));
    }
    let cc = common.cc()?;
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

fn late_acks(args: LateAcksArgs) -> Result<(), String> {
    let cfg = scenario(&args.common, args.bytes, args.paths)?;
    let late_us = validate::within("--late-us", args.late_us, 1, 10_000_000)?;
    let late_by = std::time::Duration::from_micros(late_us);
    let rows = scenarios::late_ack_sweep(&cfg, &scenarios::LATE_ACK_FRACTIONS, late_by).map_err(|e| e.to_string())?;
    let us = |r: &scenarios::WriteRun| r.completion.as_secs_f64() * 1e6;
    if args.common.json {
        let run = |r: &scenarios::WriteRun| json!({ "completion_us": us(r), "retransmits": r.retransmits, "lost": r.lost, "lost_spurious": r.lost_spurious });
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "lateness": r.lateness.name(),
                    "late_fraction": r.late_fraction,
                    "learned": run(&r.learned),
                    "unlearned": run(&r.unlearned),
                })
            })
            .collect();
        println!(
            "{}",
            json!({ "bytes": args.bytes, "paths": args.paths, "late_us": late_us, "cc": args.common.cc, "seed": args.common.seed, "rows": rows })
        );
        return Ok(());
    }
    println!(
        "# late datagrams, nothing lost: {} MiB write, 100 Gbit/s, 10 us RTT, {} paths, late by up to {} us, cc {}, seed {}",
        args.bytes >> 20,
        args.paths,
        late_us,
        args.common.cc,
        args.common.seed
    );
    println!("# late: the fraction of the datagrams each host sends that first stall their host (stall) or are held back (reorder)");
    println!("# learned: the RTO floor learned from spurious losses (default); unlearned: off; ratio = unlearned us / learned us");
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.lateness.name().to_string(),
                loss_label(r.late_fraction),
                format!("{:.1}", us(&r.learned)),
                format!("{:.1}", us(&r.unlearned)),
                format!("{:.3}", us(&r.unlearned) / us(&r.learned)),
                format!("{}/{}/{}", r.learned.lost, r.learned.lost_spurious, r.learned.retransmits),
                format!("{}/{}/{}", r.unlearned.lost, r.unlearned.lost_spurious, r.unlearned.retransmits),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "lateness",
                "late",
                "learned_us",
                "unlearned_us",
                "ratio",
                "learned_lost/spurious/retx",
                "unlearned_lost/spurious/retx"
            ],
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

fn incast(args: IncastArgs) -> Result<(), String> {
    use accord_sim::fabric::{ExperimentOptions, IncastOptions, TopologyKind};
    use core::time::Duration;
    if args.senders == 0 || args.victims == 1 || args.bytes == 0 || args.runs == 0 {
        return Err("--senders, --bytes and --runs must be at least 1, --victims 0 or at least 2".into());
    }
    validate::positive("--gbps", args.gbps)?;
    validate::not_negative("--victim-interval-us", args.victim_interval_us)?;
    check_bytes("--bytes", args.bytes)?;
    check_bytes("--victim-bytes", args.victim_bytes.max(1))?;
    let topology = TopologyKind::from_name(&args.topology).map_err(|e| e.to_string())?;
    // Parsed once here; the simulator takes the canonical names.
    let ccs = validate::list("--cc", &args.cc)?
        .iter()
        .map(|cc| cc.parse::<CcKind>().map(|kind| kind.to_string()).map_err(|e| format!("--cc: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let nodes = args.victims.max(args.senders.saturating_add(1));
    let messages = u64::from(args.victims) * u64::from(args.victim_messages);
    check_fabric_size(
        &format!("--senders {} --victims {} --victim-messages {}", args.senders, args.victims, args.victim_messages),
        nodes,
        accord_sim::fabric::ExperimentOptions::default().paths,
        messages,
    )?;
    let base = ExperimentOptions {
        nodes,
        link_gbps: args.gbps,
        bytes: args.bytes,
        topology,
        seed: args.seed,
        queue: args.queue.clone(),
        selector: args.eqds.selector()?,
        pacer_order: args.eqds.pacer_order()?,
        ..Default::default()
    };
    let incast_ideal = base.ideal(args.bytes) * args.senders;
    let interval = if args.victim_interval_us > 0.0 {
        Duration::from_secs_f64(args.victim_interval_us * 1e-6)
    } else {
        incast_ideal / args.victim_messages.max(1)
    };
    let opts = IncastOptions {
        base,
        fan_in: args.senders,
        ccs,
        victim_bytes: if args.victims >= 2 { args.victim_bytes } else { 0 },
        victim_lead: Duration::ZERO,
        victim_hosts: args.victims,
        victim_messages: args.victim_messages,
        victim_interval: interval,
        runs: args.runs,
    };
    let rows = accord_sim::fabric::incast(&opts).map_err(|e| e.to_string())?;
    let eqds_p99 = rows.iter().find(|r| r.cc.eq_ignore_ascii_case("eqds")).map(|r| r.victim_p99_us);
    let ratios: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| !r.cc.eq_ignore_ascii_case("eqds"))
        .filter_map(|r| eqds_p99.filter(|&e| e > 0.0).map(|e| (r.cc.clone(), r.victim_p99_us / e)))
        .collect();
    if args.json {
        let results: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "cc": r.cc, "queue": r.queue,
                    "incast_p50_us": r.incast_p50_us, "incast_p99_us": r.incast_p99_us, "incast_p999_us": r.incast_p999_us,
                    "victim_p50_us": r.victim_p50_us, "victim_p99_us": r.victim_p99_us, "victim_p999_us": r.victim_p999_us,
                    "incast_ideal_us": r.ideal_us * args.senders as f64,
                    "drops": r.drops, "ecn_marks": r.ecn_marks, "trims": r.trims, "events": r.events, "wall_s": r.wall_s,
                })
            })
            .collect();
        let ratio_map: serde_json::Map<String, serde_json::Value> =
            ratios.iter().map(|(cc, x)| (cc.clone(), json!(x))).collect();
        println!(
            "{}",
            json!({
                "senders": args.senders, "victims": args.victims, "hosts": nodes, "topology": args.topology,
                "gbps": args.gbps, "bytes": args.bytes, "victim_bytes": args.victim_bytes,
                "victim_messages": args.victim_messages, "victim_interval_us": interval.as_secs_f64() * 1e6,
                "runs": args.runs, "seed": args.seed,
                "results": results, "victim_p99_ratio_over_eqds": ratio_map,
            })
        );
        return Ok(());
    }
    println!(
        "# incast {}:1 into host 0 ({} x {} B, line-rate time {:.1} us) + {} victim hosts x {} messages of {} B every {:.1} us; {} hosts {}, {} Gbit/s, selector {}, eqds pacer {}, seeds {}..{}",
        args.senders,
        args.senders,
        args.bytes,
        incast_ideal.as_secs_f64() * 1e6,
        args.victims,
        args.victim_messages,
        args.victim_bytes,
        interval.as_secs_f64() * 1e6,
        nodes,
        args.topology,
        args.gbps,
        args.eqds.selector,
        args.eqds.pacer_order,
        args.seed,
        args.seed + args.runs as u64 - 1
    );
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.cc.clone(),
                r.queue.clone(),
                format!("{:.1}", r.incast_p50_us),
                format!("{:.1}", r.incast_p99_us),
                format!("{:.1}", r.incast_p999_us),
                format!("{:.1}", r.victim_p50_us),
                format!("{:.1}", r.victim_p99_us),
                format!("{:.1}", r.victim_p999_us),
                r.drops.to_string(),
                r.ecn_marks.to_string(),
                r.trims.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "cc",
                "queue",
                "inc_p50_us",
                "inc_p99_us",
                "inc_p999_us",
                "vic_p50_us",
                "vic_p99_us",
                "vic_p999_us",
                "drops",
                "marks",
                "trims"
            ],
            &body
        )
    );
    for (cc, ratio) in &ratios {
        println!("victim P99 {cc}/eqds: {ratio:.2}x");
    }
    Ok(())
}
