//! The plugin's record of its in-flight requests, and the dump NCCL's abort or a signal leaves.
//!
//! Why: when a job hangs or NCCL aborts, the question is which peer this process was waiting
//! for. Collectives answer it with their stuck reports (`accord_coll::report`); inside NCCL the
//! plugin sees only requests, so it keeps one small record per request (direction, comm, peer,
//! bytes, tag, since when, what it waits for) and writes them out:
//! - when NCCL closes a comm that still has requests in flight (what an abort does);
//! - when a `test` or `isend` fails (a peer died);
//! - on `SIGUSR1`, when `ACCORD_REPORT_DIR` is set (the handler is installed only then, so an
//!   NCCL job without it keeps the signal's default action).
//!
//! A dump is one log line through NCCL's logger (count, oldest request, its peer) and, where
//! `ACCORD_REPORT_DIR` is set, a JSON file `plugin-inflight-<pid>-<unix ms>.json` that
//! `accord doctor` reads beside the collectives' reports. The table is bounded
//! ([`INFLIGHT_RECORDS_MAX`]); requests beyond it are counted, not recorded.

use accord_engine::EngineId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Most requests recorded at once; more are counted in [`InflightDump::untracked`].
pub const INFLIGHT_RECORDS_MAX: usize = 65_536;
/// Shortest time between two dumps of the same reason's kind (a failing `test` is polled in a
/// loop; one dump per failure burst is enough).
pub const DUMP_INTERVAL_MIN: Duration = Duration::from_secs(1);
/// The `kind` field of a dump, which `accord doctor` recognises.
pub const DUMP_KIND: &str = "accord-plugin-inflight";
/// How often the signal watcher looks for a new `SIGUSR1`.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Which way a request moves bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// An `isend`.
    Send,
    /// An `irecv`.
    Recv,
}

/// What a request is waiting for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Waiting {
    /// A send whose receiver has posted no matching receive yet (no clear-to-send).
    ClearToSend,
    /// A send whose writes are under way.
    WritesToLand,
    /// A receive whose sender's bytes have not all landed.
    Data,
}

/// One request as the dump shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Send or receive.
    pub direction: Direction,
    /// What it waits for.
    pub waiting: Waiting,
    /// The plugin's comm index.
    pub comm: u32,
    /// The peer's engine id, 16 hex digits.
    pub peer: String,
    /// Bytes of the send, or the receive's capacity (all receives of a group).
    pub bytes: u64,
    /// NCCL's tag (the first of a grouped receive).
    pub tag: i32,
    /// Milliseconds since it was posted, when the dump was made.
    pub age_ms: u64,
}

/// A dump file's content.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InflightDump {
    /// Always [`DUMP_KIND`].
    pub kind: String,
    /// The process that wrote it.
    pub pid: u32,
    /// Its engine's id, 16 hex digits (peers name it so in their dumps).
    pub engine: String,
    /// Why the dump was made.
    pub reason: String,
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The requests in flight, oldest first.
    pub requests: Vec<RequestRecord>,
    /// Requests in flight beyond [`INFLIGHT_RECORDS_MAX`], not recorded.
    pub untracked: u64,
}

struct Entry {
    direction: Direction,
    waiting: Waiting,
    comm: u32,
    peer: EngineId,
    bytes: u64,
    tag: i32,
    since: Instant,
}

struct Table {
    next: u64,
    entries: HashMap<u64, Entry>,
    untracked: u64,
    last_dump: Option<Instant>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn with_table<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let table = guard.get_or_insert_with(|| Table { next: 0, entries: HashMap::new(), untracked: 0, last_dump: None });
    f(table)
}

/// A request's record, removed when dropped (with the request).
#[derive(Debug)]
pub struct Tracked {
    id: Option<u64>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        match self.id {
            Some(id) => with_table(|t| {
                t.entries.remove(&id);
            }),
            None => with_table(|t| t.untracked = t.untracked.saturating_sub(1)),
        }
    }
}

/// Records a request until the returned guard drops.
pub fn track(direction: Direction, waiting: Waiting, comm: u32, peer: EngineId, bytes: u64, tag: i32) -> Tracked {
    with_table(|t| {
        if t.entries.len() >= INFLIGHT_RECORDS_MAX {
            t.untracked += 1;
            return Tracked { id: None };
        }
        let id = t.next;
        t.next += 1;
        t.entries.insert(id, Entry { direction, waiting, comm, peer, bytes, tag, since: Instant::now() });
        Tracked { id: Some(id) }
    })
}

/// The requests in flight now, oldest first, and how many went unrecorded.
pub fn snapshot() -> (Vec<RequestRecord>, u64) {
    let now = Instant::now();
    with_table(|t| {
        let mut entries: Vec<&Entry> = t.entries.values().collect();
        entries.sort_by_key(|e| e.since);
        let records = entries
            .into_iter()
            .map(|e| RequestRecord {
                direction: e.direction,
                waiting: e.waiting,
                comm: e.comm,
                peer: format!("{:016x}", e.peer.0),
                bytes: e.bytes,
                tag: e.tag,
                age_ms: now.saturating_duration_since(e.since).as_millis() as u64,
            })
            .collect();
        (records, t.untracked)
    })
}

/// Requests of `comm` in `direction` in flight now.
pub fn count_for(comm: u32, direction: Direction) -> usize {
    with_table(|t| t.entries.values().filter(|e| e.comm == comm && e.direction == direction).count())
}

/// The dump of this moment, for `engine`, made for `reason`.
pub fn build_dump(engine: EngineId, reason: &str) -> InflightDump {
    let (requests, untracked) = snapshot();
    let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    InflightDump {
        kind: DUMP_KIND.to_string(),
        pid: std::process::id(),
        engine: format!("{:016x}", engine.0),
        reason: reason.to_string(),
        unix_ms,
        requests,
        untracked,
    }
}

/// One line for NCCL's log: how many, and the oldest with its peer.
pub fn summary_line(dump: &InflightDump) -> String {
    let head = format!("{} request(s) in flight ({})", dump.requests.len() as u64 + dump.untracked, dump.reason);
    match dump.requests.first() {
        None => head,
        Some(r) => format!(
            "{head}; oldest: {:?} of {} B on comm {} tag {} to peer {}, waiting for {:?} for {} ms",
            r.direction, r.bytes, r.comm, r.tag, r.peer, r.waiting, r.age_ms
        ),
    }
}

/// Writes `dump` as `plugin-inflight-<pid>-<unix ms>.json` into `dir` (through a temporary
/// file, so a reader never sees half of it).
pub fn write_dump(dir: &Path, dump: &InflightDump) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("plugin-inflight-{}-{}.json", dump.pid, dump.unix_ms));
    let text = serde_json::to_string_pretty(dump).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The folder dumps go to: `ACCORD_REPORT_DIR`, when set and not empty.
pub fn report_dir() -> Option<PathBuf> {
    // `env_path` fails only for a name or kind the table lacks (accord-knobs' tests).
    accord_knobs::env_path("ACCORD_REPORT_DIR").ok().flatten().filter(|p| !p.as_os_str().is_empty())
}

/// Dumps the requests in flight (log line, and a file where `ACCORD_REPORT_DIR` is set), at
/// most once per [`DUMP_INTERVAL_MIN`] unless `force`. Returns the file written, if any.
pub fn dump(engine: EngineId, reason: &str, force: bool) -> Option<PathBuf> {
    let due = with_table(|t| {
        let now = Instant::now();
        let due = force || t.last_dump.is_none_or(|at| now.saturating_duration_since(at) >= DUMP_INTERVAL_MIN);
        if due {
            t.last_dump = Some(now);
        }
        due
    });
    if !due {
        return None;
    }
    let dump = build_dump(engine, reason);
    crate::log::warn(line!(), &summary_line(&dump));
    let dir = report_dir()?;
    match write_dump(&dir, &dump) {
        Ok(path) => Some(path),
        Err(e) => {
            crate::log::warn(line!(), &format!("could not write the in-flight dump into {}: {e}", dir.display()));
            None
        }
    }
}

/// Dumps on `SIGUSR1` from now on, when `ACCORD_REPORT_DIR` is set (else nothing is installed).
/// Idempotent; the watcher thread lives as long as the process, as the runtime does.
pub fn watch_signal(engine: EngineId) {
    static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if report_dir().is_none() || STARTED.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    if let Err(e) = accord_engine::signal::install() {
        crate::log::warn(line!(), &format!("no SIGUSR1 dump of in-flight requests: {e}"));
        return;
    }
    let spawned = std::thread::Builder::new().name("accord-plugin-dump".into()).spawn(move || {
        let mut seen = accord_engine::signal::count();
        loop {
            std::thread::sleep(SIGNAL_POLL);
            let now = accord_engine::signal::count();
            if now != seen {
                seen = now;
                dump(engine, "SIGUSR1", true);
            }
        }
    });
    if let Err(e) = spawned {
        crate::log::warn(line!(), &format!("no SIGUSR1 dump of in-flight requests: {e}"));
    }
}

#[cfg(test)]
mod tests;
