//! The parent's side: a group of children running one test of this binary, their marked
//! lines, and waits that end by the group's bound and name the child they waited for.

use crate::member::{Event, Member, EXIT_POLL, STDERR_SHOWN_LINES};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A failed wait or step of a group: which children it names and why, with the tail of
/// each one's stderr.
#[derive(Clone, PartialEq, Eq)]
pub struct Failure {
    /// The ranks of the children that failed, overran or ended early (empty when the failure
    /// is the group's own, say a spawn that did not happen).
    pub ranks: Vec<usize>,
    /// Everything said about them, ready to print.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// As `Display`, so `unwrap` and `expect` print the report as written.
impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// Children running one test of this binary (see [`crate::Spawn`]). Dropping the group kills and
/// reaps every child still running and removes its directory.
pub struct Group {
    pub(crate) test: String,
    pub(crate) members: Vec<Member>,
    pub(crate) events: Receiver<Event>,
    pub(crate) deadline: Instant,
    pub(crate) bound: Duration,
    pub(crate) dir: PathBuf,
}

impl Group {
    /// How many children the group has.
    pub fn ranks(&self) -> usize {
        self.members.len()
    }

    /// The process id of child `rank`.
    pub fn pid(&self, rank: usize) -> u32 {
        self.members[rank].child.id()
    }

    /// The group's directory (every child's [`crate::Context::dir`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Child `rank`'s exit status once it was reaped (by [`Group::finish`], [`Group::kill`],
    /// or [`Group::said`] seeing it end). A child killed at the bound has a signal's status;
    /// one that ended by itself has a code.
    pub fn status(&self, rank: usize) -> Option<ExitStatus> {
        self.members[rank].exit
    }

    /// Child `rank`'s stderr as far as it is kept (its last MiB).
    pub fn stderr(&self, rank: usize) -> String {
        self.members[rank].stderr_tail(None)
    }

    /// The next event from any child, within the group's bound. At the bound, every child
    /// still running is killed and named.
    pub fn next_event(&mut self) -> Result<Event, Failure> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(event) => {
                if let Event::Ended { rank } = event {
                    self.members[rank].stdout_ended = true;
                }
                Ok(event)
            }
            Err(RecvTimeoutError::Timeout) => Err(self.overrun("waiting for a line")),
            Err(RecvTimeoutError::Disconnected) => {
                Err(self.report((0..self.ranks()).collect(), "every child's stdout has ended; none can say more"))
            }
        }
    }

    /// The next line any child said, within the group's bound. A child that ends on the way
    /// is reaped: one that failed is an error naming it; once every child has ended, the
    /// wait fails naming them all.
    pub fn said(&mut self) -> Result<(usize, String), Failure> {
        loop {
            match self.next_event()? {
                Event::Said { rank, text } => return Ok((rank, text)),
                Event::Ended { rank } => {
                    self.reap(rank);
                    if self.members[rank].failed() {
                        return Err(self.report(vec![rank], "a child ended while its group waited for a line"));
                    }
                    if self.members.iter().all(|m| m.stdout_ended) {
                        return Err(self.report((0..self.ranks()).collect(), "every child ended without saying more"));
                    }
                }
            }
        }
    }

    /// Sends child `rank` one line ([`crate::hear`]).
    pub fn send(&mut self, rank: usize, line: &str) -> Result<(), Failure> {
        let written = match self.members[rank].stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "{line}").and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("its stdin was closed")),
        };
        written.map_err(|e| self.report(vec![rank], &format!("could not take a line ({e})")))
    }

    /// Sends every child the same line.
    pub fn send_all(&mut self, line: &str) -> Result<(), Failure> {
        (0..self.ranks()).try_for_each(|rank| self.send(rank, line))
    }

    /// Closes child `rank`'s stdin: [`crate::hear`] returns `None` there from now on.
    pub fn close_stdin(&mut self, rank: usize) {
        self.members[rank].stdin = None;
    }

    /// Sends child `rank` a signal (`libc::SIGSTOP`, say); an error once it was reaped.
    pub fn signal(&self, rank: usize, signal: i32) -> Result<(), Failure> {
        let member = &self.members[rank];
        if member.exit.is_some() {
            return Err(self.report(vec![rank], &format!("cannot take signal {signal}: it was reaped")));
        }
        // Safety: kill(2) on our own child, which is not reaped, so its pid is still ours.
        let rc = unsafe { libc::kill(member.child.id() as libc::pid_t, signal) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(self.report(vec![rank], &format!("cannot take signal {signal}: {e}")));
        }
        Ok(())
    }

    /// Kills child `rank` (SIGKILL) and reaps it; its end is then no failure of the group.
    pub fn kill(&mut self, rank: usize) {
        let member = &mut self.members[rank];
        if member.exit.is_none() {
            member.killed_by_test = true;
            member.kill_and_reap();
        }
    }

    /// Waits for child `rank` to exit, within the group's bound: its exit status, or, at the
    /// bound, a failure naming it (it is killed there).
    pub fn wait(&mut self, rank: usize) -> Result<ExitStatus, Failure> {
        self.reap(rank);
        let member = &self.members[rank];
        match member.exit {
            Some(status) if !member.overran => Ok(status),
            _ => Err(self.report(vec![rank], "a child did not exit in time")),
        }
    }

    /// Closes every child's stdin (the parent has nothing more to say) and waits for every
    /// child to exit, within the group's bound. Children that failed or overran are named,
    /// all of them, each with its exit status and stderr tail.
    pub fn finish(&mut self) -> Result<(), Failure> {
        for member in &mut self.members {
            member.stdin = None;
        }
        for rank in 0..self.ranks() {
            self.reap(rank);
        }
        let failed: Vec<usize> = (0..self.ranks()).filter(|&r| self.members[r].failed()).collect();
        match failed.is_empty() {
            true => Ok(()),
            false => Err(self.report(failed, "not every child succeeded")),
        }
    }

    /// Waits for child `rank` to exit, until the group's bound; kills it there.
    fn reap(&mut self, rank: usize) {
        let deadline = self.deadline;
        let member = &mut self.members[rank];
        while member.exit.is_none() {
            match member.child.try_wait() {
                Ok(Some(status)) => member.exit = Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(EXIT_POLL),
                Ok(None) | Err(_) => {
                    member.overran = true;
                    member.kill_and_reap();
                }
            }
        }
    }

    /// The bound passed while waiting for `what`: kills every child still running and names
    /// each.
    fn overrun(&mut self, what: &str) -> Failure {
        let running: Vec<usize> = (0..self.ranks()).filter(|&r| self.members[r].exit.is_none()).collect();
        for &rank in &running {
            let member = &mut self.members[rank];
            if matches!(member.child.try_wait(), Ok(Some(_))) {
                continue; // it exited just now; reap below reports how
            }
            member.overran = true;
            let _ = member.child.kill();
        }
        for &rank in &running {
            self.reap(rank);
        }
        self.report(running, &format!("the group's bound of {:?} passed {what}", self.bound))
    }

    fn report(&self, ranks: Vec<usize>, headline: &str) -> Failure {
        let mut message = format!("{headline} (group of {} running {})", self.ranks(), self.test);
        for &rank in &ranks {
            let member = &self.members[rank];
            message.push_str(&format!(
                "\n--- rank {rank} (pid {}) {}; its stderr ends:\n{}",
                member.child.id(),
                member.state(self.bound),
                member.stderr_tail(Some(STDERR_SHOWN_LINES))
            ));
        }
        Failure { ranks, message }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for member in &mut self.members {
            if member.exit.is_none() {
                member.kill_and_reap();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
