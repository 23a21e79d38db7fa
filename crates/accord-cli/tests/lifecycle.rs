//! The launchers own their ranks: `accord run` and the collective benchmark, interrupted with
//! SIGINT, SIGTERM or SIGHUP, or killed outright, leave no rank behind; a launch that fails
//! half way (a process limit) stops the ranks it started and ends with one line.
//!
//! Ranks are found by a marker variable in their environment (`/proc/PID/environ`), unique per
//! test, which the launcher passes on to everything it starts.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The launcher's grace period (`TERMINATE_GRACE` in src/launch/mod.rs, README "Stopping a job").
const GRACE: Duration = Duration::from_secs(3);
/// Upper bound on every wait of these tests: far above anything a healthy run needs.
const PATIENCE: Duration = Duration::from_secs(60);
const MARKER_VAR: &str = "ACCORD_LIFECYCLE_TEST";

/// A unique marker and, on drop, SIGKILL to every process still carrying it: a failing test
/// leaves nothing behind either.
struct Marker(String);

impl Marker {
    fn new(name: &str) -> Marker {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        Marker(format!("{name}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)))
    }

    /// Processes carrying the marker, except `launcher` and the launcher's watchdog: the
    /// ranks and what they started.
    fn ranks(&self, launcher: u32) -> Vec<u32> {
        self.processes(Some(launcher)).into_iter().filter(|&pid| !is_watchdog(pid)).collect()
    }

    /// Processes carrying the marker, except `launcher`.
    fn processes(&self, launcher: Option<u32>) -> Vec<u32> {
        let needle = format!("{MARKER_VAR}={}", self.0);
        let mut found = vec![];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if Some(pid) == launcher {
                continue;
            }
            // A zombie's environment reads empty: only live processes count.
            let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
            if env.split(|&b| b == 0).any(|var| var == needle.as_bytes()) {
                found.push(pid);
            }
        }
        found
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_accord"));
        c.args(args).env(MARKER_VAR, &self.0).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        c
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        for pid in self.processes(None) {
            unsafe_kill(pid, libc::SIGKILL);
        }
    }
}

fn is_watchdog(pid: u32) -> bool {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    env.split(|&b| b == 0).any(|var| var.starts_with(b"ACCORD_LAUNCH_WATCHDOG="))
}

#[allow(unsafe_code)]
fn unsafe_kill(pid: u32, signal: i32) {
    // Safety: kill(2) with integers only.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// Polls `done` until it holds or `limit` passes; whether it held.
fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit (at most [`PATIENCE`]).
fn wait_exit(child: &mut Child) -> ExitStatus {
    let mut status = None;
    let exited = eventually(PATIENCE, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the launcher did not exit within {PATIENCE:?}");
    }
    status.unwrap()
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut text).unwrap();
    }
    text
}

/// Starts the launcher with `args`, waits until at least `ranks` processes carry the marker,
/// sends the launcher `signal`, and checks that it exits with `expected` and that no rank is
/// left once it has.
fn interrupt(name: &str, args: &[&str], ranks: usize, signal: i32, expected: i32) {
    let marker = Marker::new(name);
    let mut launcher = marker.command(args).spawn().unwrap();
    let pid = launcher.id();
    assert!(eventually(PATIENCE, || marker.ranks(pid).len() >= ranks), "{name}: {ranks} ranks never appeared");
    unsafe_kill(pid, signal);
    let status = wait_exit(&mut launcher);
    let stderr = stderr_of(&mut launcher);
    assert_eq!(status.code(), Some(expected), "{name}: {status:?}; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    // The launcher returns only after reaping every rank and killing their groups.
    assert_eq!(marker.processes(None), Vec::<u32>::new(), "{name}: ranks outlived the launcher");
}

/// SIGKILL to the launcher: the kernel kills each rank (PR_SET_PDEATHSIG); none is left once
/// the grace period has passed.
fn kill_launcher(name: &str, args: &[&str], ranks: usize) {
    let marker = Marker::new(name);
    let mut launcher = marker.command(args).spawn().unwrap();
    let pid = launcher.id();
    assert!(eventually(PATIENCE, || marker.ranks(pid).len() >= ranks), "{name}: {ranks} ranks never appeared");
    unsafe_kill(pid, libc::SIGKILL);
    // (The launcher's watchdog carries the marker too, and exits once it has acted.)
    assert_eq!(wait_exit(&mut launcher).signal(), Some(libc::SIGKILL));
    let gone = eventually(GRACE + Duration::from_secs(10), || marker.processes(None).is_empty());
    assert!(gone, "{name}: ranks {:?} outlived a killed launcher", marker.processes(None));
}

const SLEEPERS: &[&str] = &["run", "-n", "3", "--", "sleep", "60"];

#[test]
fn run_passes_sigint_on_and_leaves_no_rank() {
    interrupt("run-int", SLEEPERS, 3, libc::SIGINT, 128 + libc::SIGINT);
}

#[test]
fn run_passes_sigterm_on_and_leaves_no_rank() {
    interrupt("run-term", SLEEPERS, 3, libc::SIGTERM, 128 + libc::SIGTERM);
}

#[test]
fn run_passes_sighup_on_and_leaves_no_rank() {
    interrupt("run-hup", SLEEPERS, 3, libc::SIGHUP, 128 + libc::SIGHUP);
}

#[test]
fn run_kills_ranks_that_ignore_the_signal_after_the_grace_period() {
    // The ranks ignore SIGTERM (and `sleep`, started by the shell, inherits that): only the
    // SIGKILL after the grace period ends them.
    let args = ["run", "-n", "2", "--", "sh", "-c", "trap '' TERM INT HUP; sleep 60; echo done"];
    interrupt("run-stubborn", &args, 2, libc::SIGTERM, 128 + libc::SIGTERM);
}

#[test]
fn the_launcher_reads_every_rank_from_one_thread() {
    // Two reader threads per rank ran a launcher of many ranks out of threads; now there are
    // none: signals and all output pipes are polled from the main thread.
    let marker = Marker::new("one-thread");
    let mut launcher = marker.command(&["run", "-n", "64", "--", "sleep", "60"]).spawn().unwrap();
    let pid = launcher.id();
    assert!(eventually(PATIENCE, || marker.ranks(pid).len() >= 64), "64 ranks never appeared");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let threads = status.lines().find_map(|l| l.strip_prefix("Threads:")).map(|t| t.trim().to_string());
    unsafe_kill(pid, libc::SIGTERM);
    assert_eq!(wait_exit(&mut launcher).code(), Some(128 + libc::SIGTERM));
    assert_eq!(threads.as_deref(), Some("1"), "threads of a launcher of 64 ranks");
    assert_eq!(marker.processes(None), Vec::<u32>::new());
}

#[test]
fn a_killed_run_launcher_takes_its_ranks_with_it() {
    kill_launcher("run-kill", SLEEPERS, 3);
}

#[test]
fn a_killed_run_launcher_takes_what_the_ranks_started_too() {
    // `sleep` is the shell's child here (the `echo` after it keeps the shell from exec'ing
    // it): PR_SET_PDEATHSIG ends only the shell; the launcher's watchdog kills the group.
    kill_launcher("run-kill-tree", &["run", "-n", "2", "--", "sh", "-c", "sleep 60; echo done"], 4);
}

/// The benchmark with its default settings runs long enough to be interrupted once its
/// ranks are up (re-executions of `accord` carrying the marker). Only the defaults are used,
/// and one rank is enough to go on: the flags' meanings follow nccl-tests'.
const BENCH: &[&str] = &["bench", "all-reduce"];

#[test]
fn bench_passes_sigint_on_and_leaves_no_rank() {
    interrupt("bench-int", BENCH, 1, libc::SIGINT, 128 + libc::SIGINT);
}

#[test]
fn bench_passes_sigterm_on_and_leaves_no_rank() {
    interrupt("bench-term", BENCH, 1, libc::SIGTERM, 128 + libc::SIGTERM);
}

#[test]
fn a_killed_bench_launcher_takes_its_ranks_with_it() {
    kill_launcher("bench-kill", BENCH, 1);
}

#[test]
fn the_bench_suite_passes_sigterm_down_to_the_ranks_of_its_step() {
    // `accord bench` runs each step as a child launcher: the signal goes down two levels.
    interrupt("suite-term", &["bench"], 1, libc::SIGTERM, 128 + libc::SIGTERM);
}

#[test]
fn an_interrupted_p2p_bench_leaves_no_second_process() {
    // `accord bench p2p` runs its second process itself (not through the launcher): that
    // process dies with the first (PR_SET_PDEATHSIG), within the grace period at most.
    let marker = Marker::new("p2p-term");
    let mut bench = marker.command(&["bench", "p2p"]).spawn().unwrap();
    let pid = bench.id();
    assert!(eventually(PATIENCE, || !marker.processes(Some(pid)).is_empty()), "the second process never appeared");
    unsafe_kill(pid, libc::SIGTERM);
    assert_eq!(wait_exit(&mut bench).signal(), Some(libc::SIGTERM));
    let gone = eventually(GRACE + Duration::from_secs(10), || marker.processes(None).is_empty());
    assert!(gone, "the second process {:?} outlived the first", marker.processes(None));
}

/// Threads of the real user id `uid`, all processes (what RLIMIT_NPROC counts on Linux).
fn threads_of(uid: u32) -> u64 {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if entry.file_name().to_str().is_some_and(|s| s.parse::<u32>().is_ok()) {
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            let real = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().next());
            if real == Some(&uid.to_string()) {
                n += status
                    .lines()
                    .find_map(|l| l.strip_prefix("Threads:"))
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(1);
            }
        }
    }
    n
}

#[test]
#[allow(unsafe_code)]
fn a_launch_cut_short_by_the_process_limit_stops_its_ranks_and_says_so() {
    let marker = Marker::new("nproc");
    let mut command = marker.command(&["run", "-n", "64", "--", "sleep", "60"]);
    // Root is exempt from RLIMIT_NPROC: as root, the launcher runs as `nobody` (which owns
    // no other process), allowed itself and three ranks; otherwise the limit leaves room for
    // three more processes of this user than run now (other tests may start or end some,
    // so which rank fails varies, but one does).
    // Safety: getuid is a plain system call.
    let root = unsafe { libc::getuid() } == 0;
    let (uid, limit) = if root { (65534, 4) } else { (unsafe { libc::getuid() }, 0) };
    let limit = if root { limit } else { threads_of(uid) + 4 };
    // Safety: the hook makes async-signal-safe system calls only.
    unsafe {
        command.pre_exec(move || {
            if root && (libc::setgid(uid) != 0 || libc::setuid(uid) != 0) {
                return Err(std::io::Error::last_os_error());
            }
            let r = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if libc::setrlimit(libc::RLIMIT_NPROC, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut launcher = command.spawn().unwrap();
    let status = wait_exit(&mut launcher);
    let stderr = stderr_of(&mut launcher);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("accord: could not start \"sleep\" for rank "), "{stderr}");
    assert!(lines[0].contains("ulimit -u") && lines[0].contains("were stopped"), "{stderr}");
    assert_eq!(marker.processes(None), Vec::<u32>::new(), "ranks outlived a failed launch");
}
