//! `accord-device-bench`: the device API (`accord/device.cuh`) end to end, two processes, one
//! GPU each. Each rank builds a device communicator (a CPU proxy thread per ring) over its
//! communicator, registers two device windows (0 receives, 1 is the source), compiles the
//! kernels of `crates/accord-device/kernels/` with NVRTC, and runs, in this order:
//!
//! 1. refusals: the API's argument checks return BAD_ARGUMENT before a ticket is taken;
//! 2. ping-pong between kernels (put + signal, wait, reply) through the proxy, with put_value,
//!    and with direct stores where the proxy mapped the peer: median and p99 round trip;
//! 3. many-peer puts with signals, every rank to every rank, checked byte for byte, with a
//!    device barrier between rounds;
//! 4. a ping-pong kernel captured in a CUDA graph and replayed `--replays` times, checked;
//! 5. the descriptor rate of small puts through one proxy thread (puts/s), none lost;
//! 6. bandwidth of large puts (1 MiB..256 MiB) against the IPC copy ceiling (a raw
//!    cuMemcpyPeerAsync into the peer's window mapped through CUDA IPC) and the engine's own
//!    host-initiated writes of the same size, with the SMs spent copying.
//!
//! Every check failure or proxy error makes the exit status non-zero. Output: nccl-tests-style
//! tables on stdout (lines starting with `#`) and one JSON object per row (lines starting with
//! `{`).
//!
//! Usage: accord-device-bench [--route ipc|network] [--iters 1000] [--sizes-mib 1,4,16,64,256]
//!        [--bw-iters 10] [--replays 100] [--rounds 4] [--rate-grid 8x128] [--rate-puts 64]
//!        [--timeout-s 300] [--lane on|off] [--define NAME[=VALUE]]... [--only PHASE,...]
//!        [--ceiling-streams 1] [--host-batch ITEMS[,ITEMS...]]
//!
//! `--host-batch` needs no GPU: it times the proxy's host steps for one stream-lane batch of
//! that many 8-byte inline puts (`accord_device::lane_cost`), prints a table and exits.
//!
//! Started plainly, it is the launcher: it checks for two GPUs (and refuses with a message and
//! exit status 2 without them), then runs itself twice as ranks 0 and 1 with the torchrun
//! variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT).
//! `--route network` sets `ACCORD_DEVICE_IPC=0` and `ACCORD_SHM=0` for the ranks, so every put
//! takes the cross-host routes (UDP over loopback) although both GPUs are in one host. Started
//! with RANK set (under torchrun or `accord run`), it is a rank.

#[path = "device_bench/kernels.rs"]
mod kernels;
#[path = "device_bench/proxy.rs"]
mod proxy;
#[path = "device_bench/report.rs"]
mod report;
#[path = "device_bench/runs.rs"]
mod runs;

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

/// What to run, from the command line (the same for the launcher and the ranks).
#[derive(Clone, Debug)]
pub struct Args {
    /// `ipc` (the engine's default routes) or `network` (cross-host routes forced).
    pub route: String,
    /// Ping-pong round trips timed.
    pub iters: u64,
    /// Sizes of the bandwidth table.
    pub sizes: Vec<u64>,
    /// Puts per size in the bandwidth table.
    pub bw_iters: u64,
    /// Replays of the captured graph.
    pub replays: u64,
    /// Rounds of the many-peer exchange.
    pub rounds: u64,
    /// Blocks and threads of the descriptor-rate kernel.
    pub rate_grid: (u32, u32),
    /// Puts per thread of the descriptor-rate kernel.
    pub rate_puts: u64,
    /// Bound of the whole run; each device wait gets a share of it.
    pub timeout: Duration,
    /// Stream lanes on (`--lane on`, the default) or off (every descriptor an engine write).
    pub lane: bool,
    /// `#define`s the kernels are compiled with (`--define NAME[=VALUE]`, repeatable): the
    /// header's switches, for a before/after in one device call.
    pub defines: Vec<String>,
    /// The phases to run (`--only pingpong,rate,...`; all when empty). Refusals and the
    /// warm-up always run.
    pub only: Vec<String>,
    /// Streams the IPC copy ceiling is also measured over, copies dealt round robin (1: only
    /// the one-stream ceiling).
    pub ceiling_streams: u32,
    /// Slots of the proxy's ring (`DeviceCommConfig::slot_count`, a power of two).
    pub slots: u32,
    /// Descriptors the proxy takes per turn (`DeviceCommConfig::descriptors_per_turn`).
    pub turn: usize,
    /// Batch sizes whose host cost to time instead of running on GPUs (`--host-batch`).
    pub host_batch: Vec<usize>,
}

/// The phases `--only` names.
pub const PHASES: [&str; 5] = ["pingpong", "many_peer", "graph", "rate", "bandwidth"];

impl Args {
    /// Whether phase `name` runs.
    pub fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == name)
    }
}

const USAGE: &str = "usage: accord-device-bench [--route ipc|network] [--iters N] [--sizes-mib 1,4,...] \
                     [--bw-iters N] [--replays N] [--rounds N] [--rate-grid BLOCKSxTHREADS] [--rate-puts N] \
                     [--timeout-s S] [--lane on|off] [--define NAME[=VALUE]]... \
                     [--only pingpong,many_peer,graph,rate,bandwidth] [--ceiling-streams N] [--slots N] [--turn N] [--host-batch N,...]";

fn parse_args(argv: &[String]) -> Result<Args, String> {
    let mut args = Args {
        route: "ipc".into(),
        iters: 1000,
        sizes: [1u64, 4, 16, 64, 256].iter().map(|m| m << 20).collect(),
        bw_iters: 10,
        replays: 100,
        rounds: 4,
        rate_grid: (8, 128),
        rate_puts: 64,
        timeout: Duration::from_secs(300),
        lane: true,
        defines: Vec::new(),
        only: Vec::new(),
        ceiling_streams: 1,
        slots: proxy::RING_SLOTS_DEFAULT,
        turn: proxy::DESCRIPTORS_PER_TURN_DEFAULT,
        host_batch: Vec::new(),
    };
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value; {USAGE}"));
        let number = |text: String, name: &str, max: u64| -> Result<u64, String> {
            match text.parse::<u64>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(format!("{name} {text:?}: expected a whole number in 1..={max}")),
            }
        };
        match flag.as_str() {
            "--route" => {
                args.route = value()?;
                if args.route != "ipc" && args.route != "network" {
                    return Err(format!("--route {}: use ipc or network", args.route));
                }
            }
            "--lane" => {
                args.lane = match value()?.as_str() {
                    "on" => true,
                    "off" => false,
                    other => return Err(format!("--lane {other}: use on or off")),
                }
            }
            "--iters" => args.iters = number(value()?, "--iters", 1_000_000)?,
            "--bw-iters" => args.bw_iters = number(value()?, "--bw-iters", 10_000)?,
            "--replays" => args.replays = number(value()?, "--replays", 100_000)?,
            "--rounds" => args.rounds = number(value()?, "--rounds", 10_000)?,
            "--rate-puts" => args.rate_puts = number(value()?, "--rate-puts", 1_000_000)?,
            "--define" => {
                let d = value()?;
                if !kernels::valid_define(&d) {
                    return Err(format!("--define {d:?}: expected NAME or NAME=VALUE on one line"));
                }
                args.defines.push(d);
            }
            "--only" => {
                for phase in value()?.split(',').map(str::trim) {
                    if !PHASES.contains(&phase) {
                        return Err(format!("--only {phase:?}: phases are {}", PHASES.join(", ")));
                    }
                    args.only.push(phase.to_string());
                }
            }
            "--ceiling-streams" => args.ceiling_streams = number(value()?, "--ceiling-streams", 16)? as u32,
            "--slots" => {
                let n = number(value()?, "--slots", u64::from(proxy::RING_SLOTS_MAX))?;
                if !n.is_power_of_two() {
                    return Err(format!("--slots {n}: a power of two"));
                }
                args.slots = n as u32;
            }
            "--turn" => args.turn = number(value()?, "--turn", u64::from(proxy::RING_SLOTS_MAX))? as usize,
            "--host-batch" => {
                args.host_batch = value()?
                    .split(',')
                    .map(|s| {
                        number(s.trim().to_string(), "--host-batch", u64::from(proxy::RING_SLOTS_MAX))
                            .map(|n| n as usize)
                    })
                    .collect::<Result<_, _>>()?
            }
            "--timeout-s" => args.timeout = Duration::from_secs(number(value()?, "--timeout-s", 3600)?),
            "--sizes-mib" => {
                args.sizes = value()?
                    .split(',')
                    .map(|s| number(s.trim().to_string(), "--sizes-mib", 4096).map(|m| m << 20))
                    .collect::<Result<_, _>>()?
            }
            "--rate-grid" => {
                let v = value()?;
                let (b, t) = v.split_once('x').ok_or(format!("--rate-grid {v:?}: expected BLOCKSxTHREADS"))?;
                args.rate_grid = (
                    number(b.into(), "--rate-grid blocks", 65_535)? as u32,
                    number(t.into(), "--rate-grid threads", 1024)? as u32,
                );
            }
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    Ok(args)
}

/// A port nobody listens on now (the store of rank 0 binds it a moment later).
fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Starts ranks 0 and 1 and waits for both, bounded by the run's timeout plus a minute; a rank
/// still running then is killed and named.
fn launch(args: &Args, argv: &[String]) -> Result<(), String> {
    if let Some(reason) = accord_cuda::probe().skip_reason(2, true) {
        return Err(format!("needs 2 GPUs and NVRTC on this host: {reason}"));
    }
    let port = free_port()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..2usize {
        let mut cmd = Command::new(&exe);
        cmd.args(argv)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", "2")
            .env("LOCAL_WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        if args.route == "network" {
            cmd.env("ACCORD_DEVICE_IPC", "0").env("ACCORD_SHM", "0");
        }
        match cmd.spawn() {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                for (_, mut c) in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!("starting rank {rank}: {e}"));
            }
        }
    }
    let deadline = Instant::now() + args.timeout + Duration::from_secs(60);
    let mut failures = Vec::new();
    let mut running = children;
    while !running.is_empty() {
        let mut still = Vec::new();
        for (rank, mut child) in running {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => {}
                Ok(Some(status)) => failures.push(format!("rank {rank} exited with {status}")),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    failures.push(format!("rank {rank} was still running after {:?} and was killed", args.timeout));
                }
                Ok(None) => still.push((rank, child)),
                Err(e) => failures.push(format!("waiting for rank {rank}: {e}")),
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(50));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Ends this rank's process if the run outlives its bound, naming the rank: a wait that
/// should have been bounded and was not must not leave a process behind.
fn start_watchdog(rank: String, bound: Duration) {
    std::thread::Builder::new()
        .name("accord-device-bench-watchdog".into())
        .spawn(move || {
            std::thread::sleep(bound + Duration::from_secs(30));
            eprintln!("accord-device-bench: rank {rank} ran past its {bound:?} bound; exiting");
            std::process::exit(124);
        })
        .map(|_| ())
        .unwrap_or_else(|e| eprintln!("accord-device-bench: no watchdog thread: {e}"));
}

/// The proxy's host cost per stream-lane batch of 8-byte inline puts, five rounds a size (the
/// spread says how quiet the core was).
fn print_host_batch_costs(sizes: &[usize]) {
    println!("# proxy host steps per 8-byte inline put, one lane batch (no GPU; accord_device::lane_cost)");
    println!(
        "# {:>6} {:>6} {:>9} {:>10} {:>10} {:>10}",
        "items", "round", "copies/b", "values_ns", "queue_ns", "sum_ns"
    );
    for &items in sizes {
        let batches = (2_000_000 / items).clamp(20, 20_000);
        for round in 1..=5 {
            let c = accord_device::lane_cost::lane_batch_host_cost(items, batches);
            println!(
                "  {:>6} {:>6} {:>9.1} {:>10.1} {:>10.1} {:>10.1}",
                items,
                round,
                c.copies_per_batch,
                c.values_ns,
                c.queue_ns,
                c.values_ns + c.queue_ns
            );
            println!(
                "{{\"bench\":\"device_lane_host_cost\",\"items\":{items},\"round\":{round},\"batches\":{},\"copies_per_batch\":{:.1},\"values_ns\":{:.2},\"queue_ns\":{:.2}}}",
                c.batches, c.copies_per_batch, c.values_ns, c.queue_ns
            );
        }
    }
}

fn main() -> ExitCode {
    // Warnings of the libraries (a driver refusing a batched call, say) go to stderr, which the
    // device scripts keep beside the tables; RUST_LOG overrides the level.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("accord-device-bench: {e}");
            return ExitCode::from(2);
        }
    };
    if !args.host_batch.is_empty() {
        print_host_batch_costs(&args.host_batch);
        return ExitCode::SUCCESS;
    }
    match std::env::var("RANK") {
        Err(_) => match launch(&args, &argv) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("accord-device-bench: {e}");
                ExitCode::from(2)
            }
        },
        Ok(rank) => {
            start_watchdog(rank.clone(), args.timeout);
            match runs::rank_main(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("accord-device-bench: rank {rank}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_parse_and_bad_ones_are_refused() {
        let a = parse_args(&strings(&["--route", "network", "--sizes-mib", "1,2", "--rate-grid", "4x64"])).unwrap();
        assert_eq!(a.route, "network");
        assert_eq!(a.sizes, vec![1 << 20, 2 << 20]);
        assert_eq!(a.rate_grid, (4, 64));
        let a = parse_args(&strings(&["--define", "ACCORD_DEVICE_PUT_INLINE=0", "--only", "pingpong,rate"])).unwrap();
        assert_eq!(a.defines, vec!["ACCORD_DEVICE_PUT_INLINE=0".to_string()]);
        assert!(a.runs("rate") && !a.runs("bandwidth"));
        assert!(parse_args(&[]).unwrap().runs("bandwidth"), "no --only: every phase");
        let a = parse_args(&strings(&["--slots", "4096", "--turn", "100"])).unwrap();
        assert_eq!((a.slots, a.turn), (4096, 100));
        let a = parse_args(&strings(&["--host-batch", "256,1024"])).unwrap();
        assert_eq!(a.host_batch, vec![256, 1024]);
        assert!(parse_args(&strings(&["--host-batch", "0"])).is_err(), "an empty batch is refused");
        for bad in [
            &["--route", "rdma"][..],
            &["--iters", "0"],
            &["--rate-grid", "8"],
            &["--bogus"],
            &["--iters"],
            &["--only", "pingpong,nope"],
            &["--define", "1X"],
            &["--ceiling-streams", "0"],
            &["--slots", "12"],
            &["--slots", "131072"],
            &["--turn", "0"],
        ] {
            assert!(parse_args(&strings(bad)).is_err(), "{bad:?} must be refused");
        }
    }
}
