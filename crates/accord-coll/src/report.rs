//! Stuck-collective reports: what each rank was doing when a collective went wrong, written
//! as one small JSON file per rank, so `accord doctor` can merge them and name the cause.
//!
//! Every communicator keeps a [`Progress`] board: the collective in progress (name, sequence
//! number, algorithm, the latest step waited on) and which ranks it waits for right now. A
//! report ([`StuckReport`]) is that board plus, for each awaited rank, whether the engine
//! declared it dead and its per-path statistics. Reports are written to
//! [`REPORT_DIR_ENV`] (when set):
//! - when a collective passes its deadline or a peer is declared dead (automatically);
//! - on `SIGUSR1`, for every communicator of the process (the handler only counts; a reporter
//!   thread writes);
//! - on demand ([`crate::Communicator::stuck_report`], [`write_report`]).
//!
//! A rank that is stopped or dead writes nothing: its absence is itself the finding.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Directory that reports go to; unset: no automatic reports and no `SIGUSR1` handler.
pub const REPORT_DIR_ENV: &str = "ACCORD_REPORT_DIR";
/// Format version of [`StuckReport`].
pub const REPORT_VERSION: u32 = 1;
/// How often the reporter thread looks for a `SIGUSR1`.
const SIGNAL_POLL: Duration = Duration::from_millis(100);
/// Most ranks a report lists as awaited (a rank waits for at most its schedule's peers).
pub const WAITING_MAX: usize = 64;

/// One rank's report (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StuckReport {
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// The communicator (equal on every rank of it; empty when the transport cannot say).
    pub comm: String,
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub world_size: usize,
    /// Host name and process id of this rank.
    pub host: String,
    /// Process id of this rank.
    pub pid: u32,
    /// Wall-clock time of the report, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// What made the rank write it: `deadline`, `peer_died`, `signal` or `api`.
    pub trigger: String,
    /// The collective in progress, if any.
    pub op: Option<OpReport>,
    /// The last collective this rank completed.
    pub last_completed: Option<OpRef>,
    /// The ranks awaited now, with their engine's view of them.
    pub peers: Vec<PeerReport>,
}

/// A collective and its sequence number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpRef {
    /// Its name (`all_reduce`, ...).
    pub collective: String,
    /// Its sequence number on this communicator (equal on every rank for the same call).
    pub seq: u64,
}

/// The collective in progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpReport {
    /// Its name.
    pub collective: String,
    /// Its sequence number.
    pub seq: u64,
    /// The algorithm.
    pub algo: String,
    /// How long it has run, in milliseconds.
    pub elapsed_ms: u64,
    /// The latest schedule step this rank waited on (`None`: still in the handshake).
    pub step: Option<u32>,
    /// What it waits for now.
    pub waiting_for: Vec<Waiting>,
}

/// One thing a rank waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// The rank it comes from.
    pub rank: usize,
    /// `handshake` (the peer has not entered the call) or `data` (its write's immediates).
    pub what: String,
    /// The step (for `data`).
    pub step: Option<u32>,
    /// Immediates awaited (segments of the step).
    pub count: u32,
}

/// The engine's view of one awaited rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    /// The rank.
    pub rank: usize,
    /// Set when the engine declared it dead, with why.
    pub dead: Option<String>,
    /// Per path of every connection to it.
    pub paths: Vec<PathReport>,
}

/// Statistics of one path to a peer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PathReport {
    /// Lane (NIC x worker) of the connection.
    pub lane: usize,
    /// Path index.
    pub path: u16,
    /// Packets sent on it.
    pub packets_sent: u64,
    /// Packets acknowledged.
    pub packets_acked: u64,
    /// Packets declared lost.
    pub packets_lost: u64,
    /// Recent loss, percent (EWMA).
    pub loss_pct: f64,
    /// Smoothed RTT, microseconds.
    pub rtt_us: u64,
    /// Whether the path is quarantined now.
    pub quarantined: bool,
    /// Times it was quarantined.
    pub quarantines: u64,
}

/// Gives the engine's view of a rank for a report.
pub type PeerReporter = Arc<dyn Fn(usize) -> PeerReport + Send + Sync>;

struct OpState {
    collective: &'static str,
    algo: &'static str,
    seq: u64,
    started: Instant,
    step: Option<u32>,
    waiting: Vec<(u64, Waiting)>,
}

#[derive(Default)]
struct Board {
    op: Option<OpState>,
    last: Option<OpRef>,
    next_wait_id: u64,
}

/// A communicator's progress board (see the module docs). Updating it costs a mutex per
/// wait, next to waits of microseconds at least.
pub struct Progress {
    rank: usize,
    world_size: usize,
    comm: String,
    reporter: Option<PeerReporter>,
    board: Mutex<Board>,
}

impl Progress {
    /// A board for `rank` of `world_size` on communicator `comm`.
    pub fn new(rank: usize, world_size: usize, comm: String, reporter: Option<PeerReporter>) -> Arc<Progress> {
        let p = Arc::new(Progress { rank, world_size, comm, reporter, board: Mutex::new(Board::default()) });
        if report_dir().is_some() {
            register_for_signal(&p);
        }
        p
    }

    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A collective starts.
    pub fn begin(&self, collective: &'static str, algo: &'static str, seq: u64) {
        self.board().op =
            Some(OpState { collective, algo, seq, started: Instant::now(), step: None, waiting: Vec::new() });
    }

    /// The collective in progress ended (either way).
    pub fn end(&self, completed: bool) {
        let mut b = self.board();
        if let Some(op) = b.op.take() {
            if accord_engine::telemetry::on() {
                let args = format!("\"seq\":{},\"algo\":\"{}\",\"ok\":{completed}", op.seq, op.algo);
                accord_engine::telemetry::record(op.collective, "collective", op.started, Instant::now(), &args);
            }
            if completed {
                b.last = Some(OpRef { collective: op.collective.to_string(), seq: op.seq });
            }
        }
    }

    /// This rank waits for `rank` (until the guard drops).
    pub fn waiting(&self, rank: usize, what: &'static str, step: Option<u32>, count: u32) -> WaitGuard<'_> {
        let mut b = self.board();
        let id = b.next_wait_id;
        b.next_wait_id += 1;
        if let Some(op) = b.op.as_mut() {
            if step.is_some() {
                op.step = step;
            }
            if op.waiting.len() < WAITING_MAX {
                op.waiting.push((id, Waiting { rank, what: what.to_string(), step, count }));
            }
        }
        let traced = accord_engine::telemetry::trace_on().then(|| (Instant::now(), rank, step));
        WaitGuard { progress: self, id, traced }
    }

    /// Whether a wait on `rank` is on the board now.
    pub fn waits_on(&self, rank: usize) -> bool {
        self.board().op.as_ref().is_some_and(|o| o.waiting.iter().any(|(_, w)| w.rank == rank))
    }

    /// The report of this rank now.
    pub fn report(&self, trigger: &str) -> StuckReport {
        let (op, last) = {
            let b = self.board();
            let op = b.op.as_ref().map(|o| OpReport {
                collective: o.collective.to_string(),
                seq: o.seq,
                algo: o.algo.to_string(),
                elapsed_ms: o.started.elapsed().as_millis() as u64,
                step: o.step,
                waiting_for: o.waiting.iter().map(|(_, w)| w.clone()).collect(),
            });
            (op, b.last.clone())
        };
        let mut awaited: Vec<usize> =
            op.as_ref().map(|o| o.waiting_for.iter().map(|w| w.rank).collect()).unwrap_or_default();
        awaited.sort_unstable();
        awaited.dedup();
        let peers = match &self.reporter {
            Some(r) => awaited.into_iter().map(|rank| r(rank)).collect(),
            None => awaited.into_iter().map(|rank| PeerReport { rank, ..Default::default() }).collect(),
        };
        StuckReport {
            version: REPORT_VERSION,
            comm: self.comm.clone(),
            rank: self.rank,
            world_size: self.world_size,
            host: std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string(),
            pid: std::process::id(),
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            trigger: trigger.to_string(),
            op,
            last_completed: last,
            peers,
        }
    }

    /// Writes this rank's report to [`REPORT_DIR_ENV`] when it is set (failures are logged:
    /// a report never turns into a second error).
    pub fn write_if_configured(&self, trigger: &str) {
        if let Some(dir) = report_dir() {
            match write_report(&dir, &self.report(trigger)) {
                Ok(path) => tracing::warn!(path = %path.display(), "stuck report written"),
                Err(e) => tracing::warn!(error = %e, dir = %dir.display(), "could not write the stuck report"),
            }
        }
    }
}

/// Removes its wait from the board when dropped.
pub struct WaitGuard<'a> {
    progress: &'a Progress,
    id: u64,
    /// When the wait began, whom for and which step, while the trace is on.
    traced: Option<(Instant, usize, Option<u32>)>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if let Some((start, rank, step)) = self.traced {
            let name = match step {
                Some(s) => format!("wait r{rank} step {s}"),
                None => format!("wait r{rank}"),
            };
            accord_engine::telemetry::record(&name, "wait", start, Instant::now(), &format!("\"rank\":{rank}"));
        }
        if let Some(op) = self.progress.board().op.as_mut() {
            op.waiting.retain(|(id, _)| *id != self.id);
        }
    }
}

/// [`REPORT_DIR_ENV`], when set and not empty.
pub fn report_dir() -> Option<PathBuf> {
    // `env_path` fails only for a name or kind the table lacks (accord-knobs' tests).
    accord_knobs::env_path(REPORT_DIR_ENV).ok().flatten().filter(|p| !p.as_os_str().is_empty())
}

/// Writes `report` into `dir` (created if missing) as
/// `stuck-<comm>-rank<rank>-<unix_ms>.json`; returns the path.
pub fn write_report(dir: &Path, report: &StuckReport) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let comm = if report.comm.is_empty() { "comm" } else { report.comm.as_str() };
    let path = dir.join(format!("stuck-{comm}-rank{}-{}.json", report.rank, report.unix_ms));
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Boards of this process that a `SIGUSR1` reports.
static BOARDS: Mutex<Vec<Weak<Progress>>> = Mutex::new(Vec::new());
static REPORTER_STARTED: AtomicBool = AtomicBool::new(false);

fn register_for_signal(p: &Arc<Progress>) {
    {
        let mut boards = BOARDS.lock().unwrap_or_else(|e| e.into_inner());
        boards.retain(|w| w.strong_count() > 0);
        boards.push(Arc::downgrade(p));
    }
    if REPORTER_STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(()) = accord_net_signal::install() else {
        tracing::warn!("could not install the SIGUSR1 handler: stuck reports only on deadlines and API calls");
        return;
    };
    let spawned = std::thread::Builder::new().name("accord-reporter".into()).spawn(|| {
        let mut seen = accord_net_signal::count();
        loop {
            std::thread::sleep(SIGNAL_POLL);
            let now = accord_net_signal::count();
            if now == seen {
                continue;
            }
            seen = now;
            let boards: Vec<Arc<Progress>> =
                BOARDS.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect();
            for b in boards {
                b.write_if_configured("signal");
            }
        }
    });
    if spawned.is_err() {
        tracing::warn!("could not start the stuck-report thread");
    }
}

use accord_engine::signal as accord_net_signal;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn board_tracks_the_op_and_its_waits() {
        let p = Progress::new(2, 4, "c0".into(), None);
        p.begin("all_reduce", "ring", 7);
        {
            let _g = p.waiting(3, "data", Some(5), 2);
            let r = p.report("api");
            let op = r.op.expect("in progress");
            assert_eq!((op.collective.as_str(), op.seq, op.step), ("all_reduce", 7, Some(5)));
            assert_eq!(op.waiting_for, vec![Waiting { rank: 3, what: "data".into(), step: Some(5), count: 2 }]);
            assert_eq!(r.peers.iter().map(|p| p.rank).collect::<Vec<_>>(), vec![3]);
        }
        assert!(p.report("api").op.expect("still in progress").waiting_for.is_empty());
        p.end(true);
        let r = p.report("api");
        assert_eq!(r.op, None);
        assert_eq!(r.last_completed, Some(OpRef { collective: "all_reduce".into(), seq: 7 }));
    }

    #[test]
    fn report_round_trips_through_a_file() {
        let dir = std::env::temp_dir().join(format!("accord-report-test-{}", std::process::id()));
        let p = Progress::new(0, 2, "abc".into(), None);
        p.begin("broadcast", "tree", 1);
        let report = p.report("api");
        let path = write_report(&dir, &report).expect("written");
        let back: StuckReport = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, report);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
