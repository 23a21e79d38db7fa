//! The launcher's watchdog: a small process (this binary again) that outlives a launcher
//! killed outright and then kills every rank's process group. PR_SET_PDEATHSIG already kills
//! each rank then, but not what a rank started itself (`sh -c 'python train.py'` runs python
//! as the shell's child); the watchdog takes the whole group.
//!
//! Protocol, one line each on the watchdog's stdin: `+PID` a rank started (it leads group PID),
//! `-PID` the launcher reaped it, `end` the launcher finished cleanly. End of file without
//! `end` means the launcher died: the watchdog sends SIGKILL to every group still listed.

use crate::signal::{self, Signal, SignalEvents};
use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};

/// Set in the watchdog's environment: `main` hands over to [`run_if_requested`].
const WATCHDOG_ENV: &str = "ACCORD_LAUNCH_WATCHDOG";

/// Runs the watchdog and exits when this process is one; returns at once otherwise.
pub fn run_if_requested() {
    if std::env::var_os(WATCHDOG_ENV).is_none() {
        return;
    }
    // Keep SIGINT, SIGTERM and SIGHUP from ending the watchdog before the launcher (they stay
    // blocked and unread): it must see the launcher's end to act on it.
    let _blocked = SignalEvents::open();
    let mut groups = BTreeSet::new();
    let mut clean = false;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "end" => clean = true,
            l => {
                if let Some(pid) = l.strip_prefix('+').and_then(|p| p.parse::<u32>().ok()) {
                    groups.insert(pid);
                } else if let Some(pid) = l.strip_prefix('-').and_then(|p| p.parse::<u32>().ok()) {
                    groups.remove(&pid);
                }
            }
        }
    }
    if !clean {
        for pid in groups {
            signal::signal_group(pid, Signal::Kill);
        }
    }
    std::process::exit(0);
}

/// The launcher's end of the watchdog.
pub struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts the watchdog in a process group of its own (a Ctrl-C for the launcher's group
    /// does not reach it). None when it cannot be started: the ranks' PR_SET_PDEATHSIG still
    /// covers them, so the launch goes on.
    pub fn start() -> Option<Watchdog> {
        let exe = std::env::current_exe().ok()?;
        let mut child = Command::new(exe)
            .env(WATCHDOG_ENV, "1")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let stdin = child.stdin.take();
        Some(Watchdog { child, stdin })
    }

    fn say(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            if stdin.write_all(line.as_bytes()).is_err() {
                self.stdin = None;
            }
        }
    }

    /// Rank `pid` started.
    pub fn started(&mut self, pid: u32) {
        self.say(&format!("+{pid}\n"));
    }

    /// Rank `pid` is about to be reaped: its group id may be reused afterwards.
    pub fn reaping(&mut self, pid: u32) {
        self.say(&format!("-{pid}\n"));
    }

    /// The launch ended cleanly: the watchdog exits without killing anything.
    pub fn finish(mut self) {
        self.say("end\n");
        self.stdin = None;
        let _ = self.child.wait();
    }
}
