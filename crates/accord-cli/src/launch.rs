//! `accord run -n N -- CMD ...`: the local launcher. Starts N ranks of a command with the
//! torchrun variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`), streams their output with rank prefixes, and when one rank fails stops the
//! others and returns the failed rank's status, so a broken job never hangs its siblings.

use clap::Args;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Most ranks one launcher starts (each is a process on this host).
pub const RANKS_MAX: u32 = 1024;
/// How long ranks get to exit after SIGTERM before SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(3);
/// How often the launcher looks at its children.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

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
    launch(args.ranks, args.master_port, program, rest, &[], Prefix::All)
}

/// Re-runs this binary with `args` (its own command line) as `ranks` ranks, `marker` set in
/// their environment; rank 0's standard output passes through unprefixed (the table).
pub fn run_self_as_ranks(ranks: u32, args: &[String], marker: &str) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let exe = exe.to_string_lossy().to_string();
    launch(ranks, None, &exe, args, &[(marker, "1")], Prefix::AllButRankZeroStdout)
}

/// Which output lines get a `[rank]` prefix.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Prefix {
    All,
    AllButRankZeroStdout,
}

/// The job secret every rank's engine proves in its handshakes (`accord_proto::admission`).
const JOB_SECRET_ENV: &str = "ACCORD_JOB_SECRET";

/// The secret the ranks share: the caller's `ACCORD_JOB_SECRET` if set (a job spread over
/// several launchers), else 32 fresh bytes from the OS. It reaches the ranks through their
/// environment, which only processes of the same user can read.
fn job_secret() -> Result<String, String> {
    if let Ok(given) = std::env::var(JOB_SECRET_ENV) {
        return accord_proto::JobSecret::from_hex(&given)
            .map(|s| s.to_hex())
            .ok_or_else(|| format!("{JOB_SECRET_ENV} must be 64 hex digits (32 bytes)"));
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| format!("could not read a job secret from /dev/urandom: {e}"))?;
    Ok(accord_proto::JobSecret(bytes).to_hex())
}

fn launch(
    ranks: u32,
    master_port: Option<u16>,
    program: &str,
    rest: &[String],
    extra_env: &[(&str, &str)],
    prefixing: Prefix,
) -> Result<i32, String> {
    if ranks == 0 || ranks > RANKS_MAX {
        return Err(format!("-n must be in 1..={RANKS_MAX}"));
    }
    let port = match master_port {
        Some(p) => p,
        None => free_port()?,
    };
    let secret = job_secret()?;
    let mut children = Vec::new();
    let mut pumps = Vec::new();
    for rank in 0..ranks {
        let mut child = Command::new(program)
            .args(rest)
            // Each rank leads its own process group, so stopping it stops what it started.
            .process_group(0)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", ranks.to_string())
            .env("LOCAL_WORLD_SIZE", ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(JOB_SECRET_ENV, &secret)
            .envs(extra_env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                terminate_all(&mut children);
                format!("could not start {program:?} for rank {rank}: {e}")
            })?;
        let prefix = format!("[{rank}] ");
        if let Some(out) = child.stdout.take() {
            let raw = prefixing == Prefix::AllButRankZeroStdout && rank == 0;
            pumps.push(pump(out, if raw { String::new() } else { prefix.clone() }, false));
        }
        if let Some(err) = child.stderr.take() {
            pumps.push(pump(err, prefix, true));
        }
        children.push(child);
    }
    let outcome = supervise(&mut children);
    for p in pumps {
        let _ = p.join();
    }
    match outcome {
        Outcome::AllSucceeded => Ok(0),
        Outcome::Failed { rank, status } => {
            eprintln!("accord run: rank {rank} failed ({status}); stopped the other ranks");
            Ok(exit_code(status))
        }
    }
}

enum Outcome {
    AllSucceeded,
    Failed { rank: usize, status: ExitStatus },
}

fn supervise(children: &mut [Child]) -> Outcome {
    let mut done = vec![false; children.len()];
    loop {
        for (rank, child) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) if status.success() => done[rank] = true,
                Ok(Some(status)) => {
                    terminate_all(children);
                    return Outcome::Failed { rank, status };
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("accord run: cannot wait for rank {rank}: {e}");
                    done[rank] = true;
                }
            }
        }
        if done.iter().all(|&d| d) {
            return Outcome::AllSucceeded;
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// SIGTERM to every rank still running, SIGKILL to those still there after the grace period.
fn terminate_all(children: &mut [Child]) {
    for child in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            crate::signal::signal_group(child.id(), crate::signal::Signal::Terminate);
        }
    }
    let deadline = Instant::now() + TERMINATE_GRACE;
    for child in children.iter_mut() {
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(POLL_INTERVAL);
        }
        if matches!(child.try_wait(), Ok(None)) {
            crate::signal::signal_group(child.id(), crate::signal::Signal::Kill);
            let _ = child.wait();
        }
        // Whatever the rank started and left behind in its group goes too.
        crate::signal::signal_group(child.id(), crate::signal::Signal::Kill);
    }
}

/// Copies a child's stream line by line with `prefix`, so ranks' lines never interleave.
fn pump(stream: impl Read + Send + 'static, prefix: String, to_stderr: bool) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let mut text = prefix.clone().into_bytes();
                    text.extend_from_slice(&line);
                    if !text.ends_with(b"\n") {
                        text.push(b'\n');
                    }
                    let _ = if to_stderr {
                        std::io::stderr().lock().write_all(&text)
                    } else {
                        std::io::stdout().lock().write_all(&text)
                    };
                }
            }
        }
    })
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

#[cfg(test)]
mod secret_tests {
    use super::*;

    /// Each launch draws a fresh secret of 32 bytes (unless the caller gave one).
    #[test]
    fn each_job_gets_a_fresh_secret() {
        if std::env::var_os(JOB_SECRET_ENV).is_some() {
            return; // the caller chose the secret; nothing to draw
        }
        let (a, b) = (job_secret().unwrap(), job_secret().unwrap());
        assert!(accord_proto::JobSecret::from_hex(&a).is_some());
        assert_ne!(a, b);
    }
}
