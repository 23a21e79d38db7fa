//! How a group starts: which test of this binary (or which other program), how many
//! children, what each is told, and the kernel's promise to kill them with their parent.

use crate::context::{Context, CHILD_ENV};
use crate::group::{Failure, Group};
use crate::member::Member;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The bound of a group that names none: far above what any multi-process test here needs,
/// so only a hang reaches it.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(180);

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
