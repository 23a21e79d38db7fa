//! One child of a group: its process, its stdin, the threads that read its stdout (as
//! events) and its stderr (kept), and how it ended.

use crate::context::MARK;
use crate::tail::Tail;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, ExitStatus};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a group's children send the parent, in the order they arrive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A child said a line ([`crate::say`]); `text` is what follows the mark.
    Said { rank: usize, text: String },
    /// A child's stdout ended: it exited (or closed its stdout); it says nothing more.
    Ended { rank: usize },
}

/// Bytes of each child's stderr kept for [`Group::stderr`] and failure reports.
pub(crate) const STDERR_KEPT_BYTES: usize = 1 << 20;
/// Lines of a child's stderr a [`Failure`] shows.
pub(crate) const STDERR_SHOWN_LINES: usize = 40;
/// How often a bounded wait looks again at a child that has not exited.
pub(crate) const EXIT_POLL: Duration = Duration::from_millis(5);
/// How long a kill waits for the child to be reaped: a process stuck in the kernel (an
/// uninterruptible driver call) cannot be; it is then reported as killed and left to init.
pub(crate) const REAP_AFTER_KILL_MAX: Duration = Duration::from_secs(10);
/// How long a report waits, after a child was reaped, for the last of its stderr to be read
/// (a grandchild may hold the pipe open for ever; the report then shows what it has).
pub(crate) const STDERR_DRAIN_MAX: Duration = Duration::from_secs(1);

/// A child's stderr as read so far, and whether it has ended.
type Stderr = Arc<(Mutex<(Tail, bool)>, Condvar)>;

pub(crate) struct Member {
    pub(crate) child: Child,
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) stderr: Stderr,
    /// Its exit status, once reaped.
    pub(crate) exit: Option<ExitStatus>,
    /// Killed by [`Group::kill`]: its end is the test's doing, no failure.
    pub(crate) killed_by_test: bool,
    /// Still running at the bound, so killed by the group.
    pub(crate) overran: bool,
    pub(crate) stdout_ended: bool,
}

impl Member {
    /// Takes the child's pipes: a thread relays its stdout as events (echoing unmarked lines
    /// to this test's output), another keeps its stderr (and echoes it).
    pub(crate) fn watch(rank: usize, mut child: Child, tx: &Sender<Event>) -> Member {
        let stdout = child.stdout.take().expect("stdout is piped");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in lines(stdout) {
                match line.find(MARK) {
                    Some(at) => {
                        let _ = tx.send(Event::Said { rank, text: line[at + MARK.len()..].to_string() });
                    }
                    None if is_libtest_framing(&line) => {}
                    None => println!("[rank {rank}] {line}"),
                }
            }
            let _ = tx.send(Event::Ended { rank });
        });
        let stderr: Stderr = Arc::new((Mutex::new((Tail::new(STDERR_KEPT_BYTES), false)), Condvar::new()));
        let pipe = child.stderr.take().expect("stderr is piped");
        let kept = stderr.clone();
        std::thread::spawn(move || {
            for line in lines(pipe) {
                eprintln!("[rank {rank}] {line}");
                kept.0.lock().unwrap().0.push(format!("{line}\n").as_bytes());
            }
            kept.0.lock().unwrap().1 = true;
            kept.1.notify_all();
        });
        let stdin = child.stdin.take();
        Member { child, stdin, stderr, exit: None, killed_by_test: false, overran: false, stdout_ended: false }
    }

    /// Kills the child (SIGKILL) and reaps it, waiting at most [`REAP_AFTER_KILL_MAX`].
    pub(crate) fn kill_and_reap(&mut self) {
        let _ = self.child.kill();
        let until = Instant::now() + REAP_AFTER_KILL_MAX;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.exit = Some(status);
                    return;
                }
                Ok(None) if Instant::now() < until => std::thread::sleep(EXIT_POLL),
                Ok(None) | Err(_) => {
                    self.exit = Some(std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL));
                    return;
                }
            }
        }
    }

    /// Whether its end is a failure of the test.
    pub(crate) fn failed(&self) -> bool {
        self.overran || self.exit.is_some_and(|s| !s.success() && !self.killed_by_test)
    }

    pub(crate) fn state(&self, bound: Duration) -> String {
        match self.exit {
            _ if self.overran => format!("was still running at the group's bound of {bound:?} and was killed"),
            _ if self.killed_by_test => "was killed by the test".to_string(),
            Some(status) => format!("ended with {status}"),
            None => "is running".to_string(),
        }
    }

    /// The stderr read so far; once the child is reaped, waits (a little) for its end.
    pub(crate) fn stderr_tail(&self, lines: Option<usize>) -> String {
        let (lock, ended) = &*self.stderr;
        let mut kept = lock.lock().unwrap();
        if self.exit.is_some() {
            let until = Instant::now() + STDERR_DRAIN_MAX;
            while !kept.1 && Instant::now() < until {
                kept = ended.wait_timeout(kept, until.saturating_duration_since(Instant::now())).unwrap().0;
            }
        }
        match lines {
            Some(n) => kept.0.last_lines(n),
            None => kept.0.text(),
        }
    }
}

/// What libtest prints around the child's one test ("running 1 test", "test name ... ok",
/// "test result: ..."): not worth echoing into the parent's output.
fn is_libtest_framing(line: &str) -> bool {
    let line = line.trim();
    line.is_empty()
        || line == "ok"
        || line.starts_with("test result: ")
        || (line.starts_with("running ") && (line.ends_with(" test") || line.ends_with(" tests")))
        || (line.starts_with("test ") && (line.ends_with(" ...") || line.ends_with(" ... ok")))
}

/// The lines of a pipe, lossily decoded (one bad byte must not stop the reading, or the child
/// would block on a full pipe), until it ends or fails.
fn lines(pipe: impl Read) -> impl Iterator<Item = String> {
    let mut reader = BufReader::new(pipe);
    std::iter::from_fn(move || {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(String::from_utf8_lossy(&line).trim_end_matches(['\n', '\r']).to_string()),
        }
    })
}
