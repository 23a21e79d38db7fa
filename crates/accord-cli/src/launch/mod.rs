//! `accord run -n N -- CMD ...`: the local launcher. Starts N ranks of a command with the
//! torchrun variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`), streams their output with rank prefixes, and owns them until they are gone:
//!
//! - one rank failing stops the others (SIGTERM, then SIGKILL after [`TERMINATE_GRACE`]) and
//!   sets the launcher's status, so a broken job never hangs its siblings;
//! - SIGINT, SIGTERM or SIGHUP to the launcher is passed on to every rank's process group,
//!   which gets [`TERMINATE_GRACE`] to exit before SIGKILL (a second signal kills at once);
//!   the launcher then exits 128 + the signal's number;
//! - when a rank exits, whatever it left running in its process group is killed;
//! - a launcher that is itself killed takes its ranks with it: each rank asks the kernel for
//!   SIGKILL when its parent dies (PR_SET_PDEATHSIG), and a watchdog process
//!   ([`watchdog`]) then kills the ranks' process groups, with whatever the ranks started;
//! - a rank that cannot be started stops those already running and ends the launch with one
//!   line, never a panic.
//!
//! The launcher never exits while a rank still runs. It uses one thread whatever the number
//! of ranks: signals arrive on a signalfd and every output pipe is polled from that thread.

mod output;
mod secret;
mod supervisor;
mod watchdog;

pub use watchdog::run_if_requested as run_watchdog_if_requested;

use crate::signal::{self, SignalEvents};
use clap::Args;
use output::{Sink, Stream};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;
use supervisor::{Rank, Stopped, Supervisor};

/// Most ranks one launcher starts (each is a process on this host).
pub const RANKS_MAX: u32 = 1024;
/// How long ranks get to exit after the launcher passed them a signal (or after SIGTERM when
/// a sibling failed), before SIGKILL. Documented in README.md ("Stopping a job").
pub const TERMINATE_GRACE: Duration = Duration::from_secs(3);
/// Descriptors the launcher needs besides the two output pipes of each rank.
const FDS_SPARE: u64 = 64;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "nproc", default_value_t = 1)]
    ranks: u32,
    /// Rendezvous port for rank 0's store (default: a free port).
    #[arg(long)]
    master_port: Option<u16>,
    /// The command and its arguments (after `--`).
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Runs the job; returns the exit code the launcher itself should exit with.
pub fn run(args: RunArgs) -> Result<i32, String> {
    let (program, rest) = args.command.split_first().ok_or("no command given: accord run -n N -- CMD ...")?;
    launch(&Job {
        program,
        args: rest,
        ranks: args.ranks,
        master_port: args.master_port,
        extra_env: &[],
        output: Output::PrefixAll,
        torchrun: true,
    })
}

/// Re-runs this binary with `args` (its own command line) as `ranks` ranks, `marker` set in
/// their environment; rank 0's standard output passes through unprefixed (the table).
pub fn run_self_as_ranks(ranks: u32, args: &[String], marker: &str) -> Result<i32, String> {
    let exe = this_program()?;
    launch(&Job {
        program: &exe,
        args,
        ranks,
        master_port: None,
        extra_env: &[(marker, "1")],
        output: Output::PrefixAllButRankZeroStdout,
        torchrun: true,
    })
}

/// Runs this binary once with `args`, its output passed through as it is, owned as a rank is
/// (signals passed on, killed with the launcher); returns its exit code.
pub fn run_self_once(args: &[&str]) -> Result<i32, String> {
    let exe = this_program()?;
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    launch(&Job {
        program: &exe,
        args: &args,
        ranks: 1,
        master_port: None,
        extra_env: &[],
        output: Output::Inherit,
        torchrun: false,
    })
}

fn this_program() -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    Ok(exe.to_string_lossy().to_string())
}

/// What happens to the ranks' output.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Output {
    /// Every line gets a `[rank] ` prefix.
    PrefixAll,
    /// As `PrefixAll`, but rank 0's standard output passes through unprefixed.
    PrefixAllButRankZeroStdout,
    /// The launcher's own stdout and stderr, unchanged.
    Inherit,
}

/// One launch.
struct Job<'a> {
    program: &'a str,
    args: &'a [String],
    ranks: u32,
    master_port: Option<u16>,
    extra_env: &'a [(&'a str, &'a str)],
    output: Output,
    /// Whether to set the torchrun variables.
    torchrun: bool,
}

fn launch(job: &Job<'_>) -> Result<i32, String> {
    if job.ranks == 0 || job.ranks > RANKS_MAX {
        return Err(format!("-n must be in 1..={RANKS_MAX}"));
    }
    let (fd_soft, fd_hard) = signal::fd_limits();
    let fds_needed = 2 * u64::from(job.ranks) + FDS_SPARE;
    if job.output != Output::Inherit && fds_needed > fd_hard {
        return Err(format!(
            "-n {} needs about {fds_needed} open files (two pipes per rank); this process may open at most \
             {fd_hard} (ulimit -n): use fewer ranks or raise the limit",
            job.ranks
        ));
    }
    signal::raise_fd_limit(fds_needed);
    let port = match (job.torchrun, job.master_port) {
        (_, Some(p)) => p,
        (true, None) => free_port()?,
        (false, None) => 0,
    };
    let secret = if job.torchrun { Some(secret::job_secret()?) } else { None };
    let events = SignalEvents::open().map_err(|e| format!("cannot take signals for the launcher: {e}"))?;
    let mut supervisor = Supervisor::new(events, watchdog::Watchdog::start());
    for rank in 0..job.ranks {
        if supervisor.stopping() {
            break;
        }
        match spawn(job, rank, port, secret.as_deref(), fd_soft) {
            Ok((rank, streams, problem)) => {
                supervisor.add(rank, streams);
                if let Some(message) = problem {
                    supervisor.stop_for_launch_failure(message);
                }
            }
            Err(message) => supervisor.stop_for_launch_failure(message),
        }
        supervisor.take_signals();
    }
    match supervisor.run() {
        Stopped::AllSucceeded => Ok(0),
        Stopped::RankFailed { rank, status } => {
            eprintln!("accord run: rank {rank} failed ({status}); stopped the other ranks");
            Ok(exit_code(status))
        }
        Stopped::Signalled(s) => Ok(128 + s.number()),
        Stopped::LaunchFailed(message) => Err(message),
    }
}

/// Starts one rank, tied to this process, in its own process group; with it, a problem that
/// must stop the job although the rank started.
fn spawn(
    job: &Job<'_>,
    rank: u32,
    port: u16,
    secret: Option<&str>,
    fd_soft: u64,
) -> Result<(Rank, Vec<Stream>, Option<String>), String> {
    let mut command = Command::new(job.program);
    command.args(job.args).process_group(0).stdin(Stdio::null());
    if job.torchrun {
        command
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", job.ranks.to_string())
            .env("LOCAL_WORLD_SIZE", job.ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
    }
    if let Some(secret) = secret {
        command.env(secret::JOB_SECRET_ENV, secret);
    }
    command.envs(job.extra_env.iter().copied());
    if job.output != Output::Inherit {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    signal::tie_command_to_this_process(&mut command, fd_soft);
    let mut child = command.spawn().map_err(|e| spawn_error(job, rank, &e))?;
    let prefix = format!("[{rank}] ");
    let mut streams = Vec::new();
    let pipes: [(Option<Box<dyn output::ReadFd>>, Sink); 2] = [
        (child.stdout.take().map(|p| Box::new(p) as Box<dyn output::ReadFd>), Sink::Stdout),
        (child.stderr.take().map(|p| Box::new(p) as Box<dyn output::ReadFd>), Sink::Stderr),
    ];
    let mut failure = None;
    for (pipe, sink) in pipes {
        let Some(pipe) = pipe else { continue };
        if let Err(e) = signal::set_nonblocking(std::os::fd::AsRawFd::as_raw_fd(&*pipe)) {
            failure.get_or_insert(format!("rank {rank}: cannot read its output: {e}"));
        }
        let raw = job.output == Output::PrefixAllButRankZeroStdout && rank == 0 && sink == Sink::Stdout;
        streams.push(Stream::new(pipe, if raw { String::new() } else { prefix.clone() }, sink));
    }
    // A rank whose output cannot be read runs already: the supervisor owns it and stops it
    // with the others.
    Ok((Rank::new(rank, child), streams, failure))
}

/// One line naming the rank, the program and, for the usual culprits, the limit to raise.
fn spawn_error(job: &Job<'_>, rank: u32, e: &std::io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::EAGAIN) => {
            ": the process limit (ulimit -u) or memory is exhausted; the ranks already started were stopped"
        }
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            ": too many open files (ulimit -n); the ranks already started were stopped"
        }
        Some(libc::ENOMEM) => ": out of memory; the ranks already started were stopped",
        _ if rank > 0 => "; the ranks already started were stopped",
        _ => "",
    };
    format!("could not start {:?} for rank {rank} of {}: {e}{hint}", job.program, job.ranks)
}

/// Ports the launcher tries for the rendezvous: below Linux's default ephemeral range
/// (32768..), so no rank's outgoing connection can be handed the same port.
const RENDEZVOUS_PORTS: std::ops::Range<u16> = 20_000..30_000;

/// A port that is free now, outside the ephemeral range, picked pseudo-randomly (per process)
/// so concurrent jobs rarely collide.
fn free_port() -> Result<u16, String> {
    let span = u32::from(RENDEZVOUS_PORTS.end - RENDEZVOUS_PORTS.start);
    let seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    for attempt in 0..span {
        let port = RENDEZVOUS_PORTS.start + ((seed.wrapping_add(attempt.wrapping_mul(7919))) % span) as u16;
        if TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            return Ok(port);
        }
    }
    Err(format!("no free rendezvous port in {RENDEZVOUS_PORTS:?}: pass --master-port"))
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(1))
}
