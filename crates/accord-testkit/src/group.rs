//! The parent's side: a group of children running one test of this binary, their marked
//! lines, and waits that end by the group's bound and name the child they waited for.

use crate::context::{Context, CHILD_ENV, MARK};
use crate::tail::Tail;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The bound of a group that names none: far above what any multi-process test here needs,
/// so only a hang reaches it.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(180);
/// Bytes of each child's stderr kept for [`Group::stderr`] and failure reports.
const STDERR_KEPT_BYTES: usize = 1 << 20;
/// Lines of a child's stderr a [`Failure`] shows.
const STDERR_SHOWN_LINES: usize = 40;
/// How often a bounded wait looks again at a child that has not exited.
const EXIT_POLL: Duration = Duration::from_millis(5);
/// How long a kill waits for the child to be reaped: a process stuck in the kernel (an
/// uninterruptible driver call) cannot be; it is then reported as killed and left to init.
const REAP_AFTER_KILL_MAX: Duration = Duration::from_secs(10);
/// How long a report waits, after a child was reaped, for the last of its stderr to be read
/// (a grandchild may hold the pipe open for ever; the report then shows what it has).
const STDERR_DRAIN_MAX: Duration = Duration::from_secs(1);

/// What a group's children send the parent, in the order they arrive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A child said a line ([`crate::say`]); `text` is what follows the mark.
    Said { rank: usize, text: String },
    /// A child's stdout ended: it exited (or closed its stdout); it says nothing more.
    Ended { rank: usize },
}

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

/// How to start a [`Group`]: which test of this binary (or which other program) its
/// children run, how many, and what each is told.
#[derive(Clone, Debug)]
pub struct Spawn {
    test: String,
    /// Set: the children run this program with these arguments instead of a test.
    program: Option<(PathBuf, Vec<OsString>)>,
    ranks: usize,
    role: String,
    values: BTreeMap<String, String>,
    env: Vec<(OsString, OsString)>,
    env_dir: Vec<OsString>,
    env_rank: Vec<OsString>,
    bound: Duration,
}

impl Spawn {
    /// `ranks` children, each running only the test named `test` (its full path in the
    /// binary, as `cargo test -- --exact` wants it).
    pub fn new(test: &str, ranks: usize) -> Spawn {
        Spawn {
            test: test.to_string(),
            program: None,
            ranks,
            role: String::new(),
            values: BTreeMap::new(),
            env: Vec::new(),
            env_dir: Vec::new(),
            env_rank: Vec::new(),
            bound: DEFAULT_BOUND,
        }
    }

    /// `ranks` children running another program (the `accord` binary, say) with `args`, for
    /// tests whose processes are not this test binary. They get no [`Context`] (what they
    /// need goes through [`Spawn::env`] and [`Spawn::env_rank`]); the bound, the naming of a
    /// child that failed and the kill on drop are the same.
    pub fn program(path: impl Into<PathBuf>, args: &[&str], ranks: usize) -> Spawn {
        let path = path.into();
        let mut spawn = Spawn::new(&format!("{} {}", path.display(), args.join(" ")), ranks);
        spawn.program = Some((path, args.iter().map(OsString::from).collect()));
        spawn
    }

    /// What the children are to do ([`Context::role`]).
    pub fn role(mut self, role: &str) -> Spawn {
        self.role = role.to_string();
        self
    }

    /// A value every child finds under `key` ([`Context::value`]).
    pub fn value(mut self, key: &str, value: impl ToString) -> Spawn {
        self.values.insert(key.to_string(), value.to_string());
        self
    }

    /// An environment variable of the children, for code under test that reads one (a knob,
    /// say); the harness's own values go through [`Spawn::value`].
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Spawn {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the children's variable `key` to the group's directory (a report directory, say).
    pub fn env_dir(mut self, key: impl Into<OsString>) -> Spawn {
        self.env_dir.push(key.into());
        self
    }

    /// Sets the children's variable `key` to each one's rank (`RANK`, `LOCAL_RANK`).
    pub fn env_rank(mut self, key: impl Into<OsString>) -> Spawn {
        self.env_rank.push(key.into());
        self
    }

    /// The longest the group may take, from its start: every wait ends by then, and a child
    /// still running at that time is killed and named.
    pub fn bound(mut self, bound: Duration) -> Spawn {
        self.bound = bound;
        self
    }

    /// Makes the group's directory and starts the children. A child that cannot be started
    /// is an error; those already started are killed (the partial group is dropped).
    pub fn start(self) -> Result<Group, Failure> {
        let own = |message: String| Failure { ranks: Vec::new(), message };
        static GROUPS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "accord-testkit-{}-{}",
            std::process::id(),
            GROUPS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| own(format!("cannot make {}: {e}", dir.display())))?;
        let exe = std::env::current_exe().map_err(|e| own(format!("cannot find this test binary: {e}")))?;
        let (tx, events) = mpsc::channel();
        let mut group = Group {
            test: self.test.clone(),
            members: Vec::new(),
            events,
            deadline: Instant::now() + self.bound,
            bound: self.bound,
            dir,
        };
        for rank in 0..self.ranks {
            let context = Context {
                rank,
                ranks: self.ranks,
                role: self.role.clone(),
                dir: group.dir.clone(),
                values: self.values.clone(),
            };
            let mut command = match &self.program {
                Some((path, args)) => {
                    let mut command = Command::new(path);
                    command.args(args);
                    command
                }
                None => {
                    let mut command = Command::new(&exe);
                    command
                        .args([self.test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
                        .env(CHILD_ENV, context.encode());
                    command
                }
            };
            command
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .envs(self.env_rank.iter().map(|k| (k, rank.to_string())))
                .envs(self.env_dir.iter().map(|k| (k, group.dir.as_os_str())))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            die_with_this_thread(&mut command);
            let child = command.spawn().map_err(|e| own(format!("cannot start rank {rank} of {}: {e}", self.test)))?;
            group.members.push(Member::watch(rank, child, &tx));
        }
        Ok(group)
    }
}

/// Asks the kernel to kill the child when the thread that spawns it ends, so a parent killed
/// outright (a CI timeout's SIGKILL, where no destructor runs) leaves no child behind. The
/// spawning thread is the test's own, which outlives its [`Group`].
fn die_with_this_thread(command: &mut Command) {
    // Safety: getpid is async-signal-safe and has no preconditions.
    let parent = unsafe { libc::getpid() };
    // Safety: the closure runs in the forked child before exec and calls only prctl and
    // getppid, both async-signal-safe; it allocates nothing (the error is a raw OS code).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the request was in place.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// A child's stderr as read so far, and whether it has ended.
type Stderr = Arc<(Mutex<(Tail, bool)>, Condvar)>;

struct Member {
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: Stderr,
    /// Its exit status, once reaped.
    exit: Option<ExitStatus>,
    /// Killed by [`Group::kill`]: its end is the test's doing, no failure.
    killed_by_test: bool,
    /// Still running at the bound, so killed by the group.
    overran: bool,
    stdout_ended: bool,
}

impl Member {
    /// Takes the child's pipes: a thread relays its stdout as events (echoing unmarked lines
    /// to this test's output), another keeps its stderr (and echoes it).
    fn watch(rank: usize, mut child: Child, tx: &Sender<Event>) -> Member {
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
    fn kill_and_reap(&mut self) {
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
    fn failed(&self) -> bool {
        self.overran || self.exit.is_some_and(|s| !s.success() && !self.killed_by_test)
    }

    fn state(&self, bound: Duration) -> String {
        match self.exit {
            _ if self.overran => format!("was still running at the group's bound of {bound:?} and was killed"),
            _ if self.killed_by_test => "was killed by the test".to_string(),
            Some(status) => format!("ended with {status}"),
            None => "is running".to_string(),
        }
    }

    /// The stderr read so far; once the child is reaped, waits (a little) for its end.
    fn stderr_tail(&self, lines: Option<usize>) -> String {
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

/// Children running one test of this binary (see [`Spawn`]). Dropping the group kills and
/// reaps every child still running and removes its directory.
pub struct Group {
    test: String,
    members: Vec<Member>,
    events: Receiver<Event>,
    deadline: Instant,
    bound: Duration,
    dir: PathBuf,
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

    /// The group's directory (every child's [`Context::dir`]).
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
