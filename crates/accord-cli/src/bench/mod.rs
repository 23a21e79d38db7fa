//! `accord bench ...`: nccl-tests-compatible benchmarks. `accord bench` alone runs the main
//! suite (p2p between two processes, all_reduce and all_to_all on 4 local ranks).
//!
//! A collective benchmark starts its ranks itself: the parent re-runs this binary once per
//! rank with the torchrun variables (and [`RANK_ENV_MARKER`]), and rank 0 prints the table.
//! Flags follow nccl-tests wherever the two overlap (letters, meanings, defaults); the rank
//! count, which nccl-tests takes from MPI, is `--ranks`/`-P`.

mod coll;
pub(crate) mod datapath;
pub(crate) mod report;
mod values;

use crate::launch;
use crate::size::{parse_nonzero_size, parse_size};
use accord_coll::{Algo, Collective, DType, ReduceOp};
use clap::{Args, Subcommand};
use coll::{Average, CollBenchSpec, Roots};
use report::RunInfo;
use std::io::IsTerminal;

/// Set in the environment of the ranks a benchmark starts.
pub const RANK_ENV_MARKER: &str = "ACCORD_BENCH_RANK";
/// Largest size a benchmark row may have.
pub const BENCH_BYTES_MAX: u64 = 4 << 30;
/// Set by the parent for its ranks when its standard error is a terminal: rank 0 then writes
/// a progress line per row there.
const PROGRESS_ENV: &str = "ACCORD_BENCH_PROGRESS";

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Option<BenchKind>,
}

#[derive(Subcommand, Debug, Clone)]
enum BenchKind {
    /// Point-to-point writes between two processes, against a TCP stream in the same run.
    P2p(P2pArgs),
    AllReduce(CollArgs),
    Reduce(CollArgs),
    Broadcast(CollArgs),
    AllGather(CollArgs),
    ReduceScatter(CollArgs),
    AllToAll(CollArgs),
    /// all-to-all's rows through all_to_allv with even blocks: the collective torch's
    /// all_to_all_single runs in the "accord" backend, whose split sizes are per rank.
    AllToAllv(CollArgs),
    Sendrecv(CollArgs),
}

#[derive(Args, Debug, Clone)]
struct P2pArgs {
    /// Inject this packet loss probability into Accord's path.
    #[arg(long)]
    loss: Option<f64>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Write an SVG chart of throughput against write size (Accord, TCP, Accord over UDP).
    #[arg(long, value_name = "FILE", conflicts_with = "telemetry_ab")]
    plot: Option<std::path::PathBuf>,
    /// Measure what telemetry (turned on by ACCORD_METRICS_ADDR / ACCORD_TRACE_FILE) costs a
    /// write: per size, pairs of short blocks with recording paused and on, in this one run.
    #[arg(long)]
    telemetry_ab: bool,
    /// Pairs of blocks per size with --telemetry-ab.
    #[arg(long, requires = "telemetry_ab", default_value_t = accord_bench::p2p::telemetry_ab::PAIRS_DEFAULT)]
    pairs: usize,
}

/// nccl-tests' options, with nccl-tests' letters, meanings and defaults, plus `--ranks`. As
/// with nccl-tests' getopt, a flag given twice takes its last value.
#[derive(Args, Debug, Clone)]
#[command(args_override_self = true)]
pub struct CollArgs {
    /// Ranks: local processes to start (nccl-tests takes them from MPI; `-P` is a letter it
    /// does not use).
    #[arg(short = 'P', long = "ranks", default_value_t = 4)]
    ranks: u32,
    /// Threads per process (accepted for nccl-tests command lines; only 1).
    #[arg(short = 't', long = "nthreads", default_value_t = 1)]
    nthreads: u32,
    /// GPUs per thread (accepted for nccl-tests command lines; only 1: one rank per process).
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    ngpus: u32,
    /// Smallest size (bytes; 1K, 1M, 1G, 64MB, 1GiB).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_nonzero_size)]
    min: u64,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_nonzero_size)]
    max: u64,
    /// Add this to the size between rows (used when -f is 1).
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = parse_size)]
    step_bytes: u64,
    /// Multiply the size by this between rows (1: add -i instead).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Checked calls per size and placement (0: no check; the `#wrong` columns).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: usize,
    /// Data type (float, double, half, bfloat16, int8, uint8, int32, int64) or `all`.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Reduction (sum, prod, min, max, avg) or `all`.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// Root rank or `all`.
    #[arg(short = 'r', long = "root", default_value = "0")]
    root: String,
    /// Time reported: 0 rank 0's, 1 mean over ranks, 2 fastest rank, 3 slowest rank.
    #[arg(short = 'a', long = "average", default_value_t = 1)]
    average: u32,
    /// Force an algorithm (ring, recursive_doubling, rabenseifner, binomial_tree, bruck,
    /// recursive_halving, pairwise, direct); default: `ACCORD_ALGO_<COLLECTIVE>` if set, else
    /// chosen by size.
    #[arg(long)]
    algo: Option<String>,
    /// Print one JSON object (rows carry the run's metadata).
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV: a header line, then one line per row with the run's metadata.
    #[arg(long)]
    csv: bool,
    /// Write an SVG chart of bus bandwidth against size, with the same-run memcpy baseline.
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
}

/// Most rows one sweep may have (a typo such as `-i 1` over gigabytes would run for ever).
const ROWS_MAX: usize = 4096;

fn sizes(min: u64, max: u64, factor: u64, step: u64) -> Result<Vec<u64>, String> {
    if min > max {
        return Err(format!("-b ({min}) must not exceed -e ({max})"));
    }
    if max > BENCH_BYTES_MAX {
        return Err(format!("-e {max} is above the largest size, {BENCH_BYTES_MAX} bytes"));
    }
    if factor == 0 {
        return Err("-f must be at least 1 (1: step by -i bytes)".into());
    }
    if factor == 1 && step == 0 && min != max {
        return Err("-i must be at least 1 when -f is 1".into());
    }
    let mut v = vec![];
    let mut s = min;
    while s <= max {
        if v.len() == ROWS_MAX {
            return Err(format!("-b {min} -e {max} with these steps gives more than {ROWS_MAX} sizes"));
        }
        v.push(s);
        let next = if factor > 1 { s.saturating_mul(factor) } else { s.saturating_add(step) };
        if next == s {
            break;
        }
        s = next;
    }
    Ok(v)
}

/// `all` or a list of one.
fn one_or_all<T: Copy>(name: &str, all: &[T], parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    if name.eq_ignore_ascii_case("all") {
        Ok(all.to_vec())
    } else {
        Ok(vec![parse(name)?])
    }
}

fn spec(collective: Collective, a: &CollArgs) -> Result<CollBenchSpec, String> {
    if a.nthreads != 1 || a.ngpus != 1 {
        return Err("-t and -g must be 1: Accord runs one rank per process; set the rank count with --ranks".into());
    }
    let dtypes = one_or_all(&a.dtype, &DType::ALL, |d| d.parse::<DType>().map_err(|e| e.to_string()))?;
    let ops = one_or_all(&a.op, &ReduceOp::ALL, |o| o.parse::<ReduceOp>().map_err(|e| e.to_string()))?;
    let roots = if a.root.eq_ignore_ascii_case("all") {
        Roots::All
    } else {
        Roots::One(a.root.parse().map_err(|_| format!("-r {:?}: a rank number or `all`", a.root))?)
    };
    let algo =
        a.algo.as_deref().map(|name| Algo::parse_for(collective, name)).transpose().map_err(|e| e.to_string())?;
    Ok(CollBenchSpec {
        collective,
        sizes: sizes(a.min, a.max, a.factor, a.step_bytes)?,
        dtypes,
        ops,
        roots,
        algo,
        warmup: a.warmup,
        iters: a.iters.max(1),
        check: a.check,
        average: Average::from_flag(a.average)?,
        progress: std::env::var_os(PROGRESS_ENV).is_some(),
    })
}

/// This host's name (for the header and the JSON/CSV rows).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into())
}

fn run_info(
    collective: Collective,
    a: &CollArgs,
    s: &CollBenchSpec,
    ranks: usize,
    datapath: datapath::Datapath,
) -> RunInfo {
    RunInfo {
        collective: collective.name().to_string(),
        ranks,
        host: host_name(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        min_bytes: a.min,
        max_bytes: a.max,
        step: if a.factor > 1 { format!("{}(factor)", a.factor) } else { format!("{}(bytes)", a.step_bytes) },
        warmup: s.warmup,
        iters: s.iters,
        check: s.check,
        average: s.average.name().to_string(),
        algo: algo_label(collective, a.algo.as_deref(), accord_coll::CollConfig::from_env().ok().as_ref()),
        datapath,
    }
}

/// The algorithm the table's header names: `--algo`, else the `ACCORD_ALGO_<COLLECTIVE>`
/// override of the ranks' configuration (so two runs that differ only in that variable say
/// so), else for all_reduce the host arena where the ranks share one (`ACCORD_COLL_ARENA`, on
/// by default), else "chosen by size".
fn algo_label(collective: Collective, flag: Option<&str>, config: Option<&accord_coll::CollConfig>) -> String {
    if let Some(name) = flag {
        return name.to_string();
    }
    match config.and_then(|c| c.algo_overrides.get(&collective)) {
        Some(algo) => format!("{algo} (ACCORD_ALGO_{})", collective.name().to_ascii_uppercase()),
        None if collective == Collective::AllReduce && config.is_none_or(|c| c.arena) => {
            "arena where the ranks share a host, else chosen by size".into()
        }
        None => "chosen by size".into(),
    }
}

/// Rank 0's part after the sweep: print, plot, and say whether every value was right.
fn report_rank0(
    collective: Collective,
    a: &CollArgs,
    s: &CollBenchSpec,
    out: coll::RankOutcome,
) -> Result<i32, String> {
    let info = run_info(collective, a, s, out.ranks, out.datapath);
    if a.json {
        println!("{}", report::to_json(&info, &out.rows));
    } else if a.csv {
        print!("{}", report::to_csv(&info, &out.rows));
    } else {
        print!("{}", report::to_text(&info, &out.rows));
    }
    if let Some(path) = &a.plot {
        crate::plot::bench_chart(path, &info, &out.rows)?;
    }
    match report::out_of_bounds(&out.rows) {
        0 => Ok(0),
        bad => {
            eprintln!("accord bench: {bad} output values were wrong (see `# Out of bounds values`)");
            Ok(1)
        }
    }
}

/// `accord bench ...` (parent) or one rank of it (when the marker is set).
pub fn run(args: BenchArgs, raw_args: Vec<String>) -> Result<i32, String> {
    match args.which {
        None => suite(),
        Some(BenchKind::P2p(p)) => p2p(&p).map(|()| 0),
        Some(kind) => {
            let (collective, a) = match kind {
                BenchKind::AllReduce(a) => (Collective::AllReduce, a),
                BenchKind::Reduce(a) => (Collective::Reduce, a),
                BenchKind::Broadcast(a) => (Collective::Broadcast, a),
                BenchKind::AllGather(a) => (Collective::AllGather, a),
                BenchKind::ReduceScatter(a) => (Collective::ReduceScatter, a),
                BenchKind::AllToAll(a) => (Collective::AllToAll, a),
                BenchKind::AllToAllv(a) => (Collective::AllToAllV, a),
                BenchKind::Sendrecv(a) => (Collective::SendRecv, a),
                BenchKind::P2p(_) => unreachable!("handled above"),
            };
            let s = spec(collective, &a)?;
            if std::env::var_os(RANK_ENV_MARKER).is_some() {
                return match coll::run_rank(&s)? {
                    Some(outcome) => report_rank0(collective, &a, &s, outcome),
                    None => Ok(0),
                };
            }
            if std::io::stderr().is_terminal() {
                // The ranks' standard error is a pipe to this process: tell rank 0 that a
                // person is watching.
                std::env::set_var(PROGRESS_ENV, "1");
            }
            launch::run_self_as_ranks(a.ranks, &raw_args, RANK_ENV_MARKER)
        }
    }
}

fn p2p(a: &P2pArgs) -> Result<(), String> {
    let loss = a.loss.map(|p| crate::validate::loss_rate("--loss", p)).transpose()?;
    let opts = accord_bench::p2p::P2pOptions { loss, ..Default::default() };
    if a.telemetry_ab {
        let ab = accord_bench::p2p::AbOptions { p2p: opts, pairs: a.pairs };
        let report = accord_bench::p2p::run_telemetry_ab(&ab).map_err(|e| e.to_string())?;
        if a.json {
            println!("{}", accord_bench::p2p::format_ab_json(&report));
        } else {
            print!("{}", accord_bench::p2p::format_ab_table(&report));
        }
        return Ok(());
    }
    let rows = accord_bench::p2p::run(&opts).map_err(|e| e.to_string())?;
    if a.json {
        println!("{}", accord_bench::p2p::format_json(&rows));
    } else {
        print!("{}", accord_bench::p2p::format_table(&rows));
    }
    if let Some(path) = &a.plot {
        crate::plot::p2p_chart(path, &rows)?;
    }
    Ok(())
}

/// The main job: a p2p sweep and two collectives on 4 local ranks, each table with its own
/// same-run baseline and its own datapath line.
fn suite() -> Result<i32, String> {
    println!("# accord bench: p2p between two processes, then all_reduce and all_to_all on 4 local ranks.");
    println!("# Every table names the datapath that carried its bytes and a baseline measured in the same run;");
    println!("# README.md (\"Reading accord bench\") explains every column.");
    let coll = ["--ranks", "4", "-b", "1K", "-e", "16M", "-f", "16", "-w", "3", "-n", "10", "-c", "1"];
    let steps: [Vec<&str>; 3] = [
        vec!["bench", "p2p"],
        [&["bench", "all-reduce"][..], &coll].concat(),
        [&["bench", "all-to-all"][..], &coll].concat(),
    ];
    for step in steps {
        println!();
        // Each step is owned as a rank is: signals passed on, killed with this process.
        let code = launch::run_self_once(&step)?;
        if code != 0 {
            return Ok(code);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_the_flag_then_the_env_override_then_size() {
        let arena = "arena where the ranks share a host, else chosen by size";
        let mut config = accord_coll::CollConfig::default();
        assert_eq!(algo_label(Collective::AllReduce, None, Some(&config)), arena);
        assert_eq!(algo_label(Collective::AllReduce, None, None), arena);
        config.arena = false;
        assert_eq!(algo_label(Collective::AllReduce, None, Some(&config)), "chosen by size");
        config.algo_overrides.insert(Collective::AllReduce, Algo::Direct);
        assert_eq!(algo_label(Collective::AllReduce, None, Some(&config)), "direct (ACCORD_ALGO_ALL_REDUCE)");
        assert_eq!(algo_label(Collective::AllGather, None, Some(&config)), "chosen by size");
        assert_eq!(algo_label(Collective::AllReduce, Some("ring"), Some(&config)), "ring");
    }
}
