//! `accord bench ...`: nccl-tests-style benchmarks. `accord bench` alone runs the main suite
//! (p2p, all_reduce, all_to_all on 4 local ranks over UDP loopback).
//!
//! A collective benchmark starts its ranks itself: the parent re-runs this binary once per
//! rank with the torchrun variables (and [`RANK_ENV_MARKER`]), and prints rank 0's table.

mod coll;
mod values;

use crate::launch;
use accord_coll::{Algo, Collective, DType, ReduceOp};
use clap::{Args, Subcommand};
use coll::CollBenchSpec;

/// Set in the environment of the ranks a benchmark starts.
pub const RANK_ENV_MARKER: &str = "ACCORD_BENCH_RANK";
/// Largest size a benchmark row may have.
pub const BENCH_BYTES_MAX: u64 = 4 << 30;

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
}

/// nccl-tests' options.
#[derive(Args, Debug, Clone)]
pub struct CollArgs {
    /// Ranks (local processes).
    #[arg(short = 'n', long = "nranks", default_value_t = 4)]
    ranks: u32,
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "1K")]
    min: String,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M")]
    max: String,
    /// Multiply the size by this between rows.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    factor: u64,
    #[arg(long, default_value = "float")]
    dtype: String,
    #[arg(long, default_value = "sum")]
    op: String,
    /// Force an algorithm (ring, recursive_doubling, rabenseifner, binomial_tree, bruck,
    /// recursive_halving, pairwise, direct); default: chosen by size.
    #[arg(long)]
    algo: Option<String>,
    #[arg(long, default_value_t = 0)]
    root: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 3)]
    warmup: usize,
    /// Timed iterations per size.
    #[arg(short = 'i', long = "iters", default_value_t = 10)]
    iters: usize,
    /// Check every output element (the `#wrong` column).
    #[arg(short = 'c', long)]
    check: bool,
    #[arg(long)]
    json: bool,
}

/// Parses `1K`, `64M`, `2G` or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: u64 = digits.parse().map_err(|_| format!("size {s:?} is not a number with an optional K/M/G"))?;
    v.checked_mul(mult)
        .filter(|&b| b > 0 && b <= BENCH_BYTES_MAX)
        .ok_or_else(|| format!("size {s:?} must be in 1..={BENCH_BYTES_MAX}"))
}

fn sizes(min: u64, max: u64, factor: u64) -> Result<Vec<u64>, String> {
    if min > max {
        return Err("-b must not exceed -e".into());
    }
    if factor < 2 {
        return Err("-f must be at least 2".into());
    }
    let mut v = vec![];
    let mut s = min;
    while s <= max {
        v.push(s);
        s = s.saturating_mul(factor);
    }
    Ok(v)
}

fn spec(collective: Collective, a: &CollArgs) -> Result<CollBenchSpec, String> {
    let dtype: DType = a.dtype.parse().map_err(|e| format!("{e}"))?;
    let op: ReduceOp = a.op.parse().map_err(|e| format!("{e}"))?;
    let algo =
        a.algo.as_deref().map(|name| Algo::parse_for(collective, name)).transpose().map_err(|e| e.to_string())?;
    Ok(CollBenchSpec {
        collective,
        sizes: sizes(parse_size(&a.min)?, parse_size(&a.max)?, a.factor)?,
        dtype,
        op,
        algo,
        root: a.root,
        warmup: a.warmup,
        iters: a.iters.max(1),
        check: a.check,
    })
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
                BenchKind::Sendrecv(a) => (Collective::SendRecv, a),
                BenchKind::P2p(_) => unreachable!("handled above"),
            };
            let s = spec(collective, &a)?;
            if std::env::var_os(RANK_ENV_MARKER).is_some() {
                if let Some(table) = coll::run_rank(&s)? {
                    println!("{}", if a.json { table.to_json() } else { table.to_text() });
                }
                return Ok(0);
            }
            launch::run_self_as_ranks(a.ranks, &raw_args, RANK_ENV_MARKER)
        }
    }
}

fn p2p(a: &P2pArgs) -> Result<(), String> {
    let loss = a.loss.map(|p| crate::validate::loss_rate("--loss", p)).transpose()?;
    let opts = accord_engine::bench::P2pOptions { loss, ..Default::default() };
    let rows = accord_engine::bench::p2p(&opts).map_err(|e| e.to_string())?;
    if a.json {
        println!("{}", accord_engine::bench::format_json(&rows));
    } else {
        println!("# p2p: one-sided writes between two processes on loopback; TCP stream in the same run");
        print!("{}", accord_engine::bench::format_table(&rows));
    }
    Ok(())
}

/// The main job: a short p2p sweep and two collectives on 4 local ranks.
fn suite() -> Result<i32, String> {
    println!("# accord bench: p2p, all_reduce and all_to_all on 4 local ranks over UDP loopback");
    let steps: [&[&str]; 3] = [
        &["bench", "p2p"],
        &["bench", "all-reduce", "-n", "4", "-b", "1K", "-e", "16M", "-f", "16", "--check"],
        &["bench", "all-to-all", "-n", "4", "-b", "1K", "-e", "16M", "-f", "16", "--check"],
    ];
    for step in steps {
        // Each step is owned as a rank is: signals passed on, killed with this process.
        let code = launch::run_self_once(step)?;
        if code != 0 {
            return Ok(code);
        }
    }
    Ok(0)
}
