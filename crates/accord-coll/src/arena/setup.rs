//! Mapping the host arena: who may share it, the file, and the messages that agree on it.
//!
//! The ranks meet through rank 0, four control messages per rank (not an exchange of everyone
//! with everyone: a job of many ranks on many hosts pays 4(n-1) messages once, and no file):
//! each rank offers its host (boot id), pid namespace and slot size; rank 0 decides for all
//! and, only if every rank shares its host, creates the file and sends its path and a random
//! token (or why not); each rank maps it and says whether it could; rank 0 sends the final
//! word and unlinks the file. A refusal takes both rounds too: a rank falls back to the size
//! rule only on the final word, so while any rank still waits for the decision none runs
//! another schedule, and a handshake seen then is a real mismatch. Every rank reaches the same
//! answer, and one that cannot map the file (another mount namespace, a full tmpfs) makes
//! every rank go without.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use accord_engine::SharedMapping;

use super::{arena_bytes, pid_word, Arena, Shape, Unavailable, DETECT_INTERVAL, HEADER_WORDS, MAGIC};
use crate::algo::{Algo, Args, Collective, Ctx, Handshake};
use crate::error::{CollError, TransportError};
use crate::transport::{CollTransport, Imm, STEP_DATA_MAX, STEP_HANDSHAKE};

/// This host's identity (the kernel's boot id): ranks that differ are on different hosts.
fn host_identity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// This process's pid namespace (its inode): the arena's liveness checks compare pids, which
/// mean the same process only within one namespace (containers sharing /dev/shm with
/// `--ipc=host` each have their own).
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map(|m| m.ino()).unwrap_or(0)
}

/// A rank's offer: where it runs and the arena's shape it asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Offer {
    pub host: String,
    pub pid_ns: u64,
    pub shape: Shape,
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
        format!("{}\n{}\n{}\n{}", self.host, self.pid_ns, self.shape.slot_bytes, self.shape.lanes).into_bytes()
    }

    pub(super) fn decode(bytes: &[u8]) -> Option<Offer> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut f = text.split('\n');
        let (host, pid_ns) = (f.next()?.to_string(), f.next()?.parse().ok()?);
        let shape = Shape { slot_bytes: f.next()?.parse().ok()?, lanes: f.next()?.parse().ok()? };
        f.next().is_none().then_some(Offer { host, pid_ns, shape })
    }
}

/// Whether every rank can share rank 0's arena, from everyone's offer (rank 0's first).
pub(super) fn verdict(offers: &[Offer]) -> Result<(), Unavailable> {
    let first = &offers[0];
    let (slot_bytes, lanes) = (first.shape.slot_bytes, first.shape.lanes);
    if let Some(r) = offers.iter().position(|o| o.host != first.host || o.host.is_empty()) {
        Err(format!("rank {r} is on another host than rank 0 (or its host is unknown)"))
    } else if let Some(r) = offers.iter().position(|o| o.pid_ns != first.pid_ns || o.pid_ns == 0) {
        Err(format!("rank {r} is in another pid namespace than rank 0"))
    } else if let Some(r) = offers.iter().position(|o| o.shape.slot_bytes != slot_bytes) {
        Err(format!("rank {r} asks for arena slots of {} bytes, rank 0 {slot_bytes}", offers[r].shape.slot_bytes))
    } else if let Some(r) = offers.iter().position(|o| o.shape.lanes != lanes) {
        Err(format!("rank {r} asks for {} arena lanes, rank 0 {lanes}", offers[r].shape.lanes))
    } else if lanes == 0 || slot_bytes == 0 || slot_bytes % 8 != 0 {
        Err(format!("rank 0 offers an arena shape no rank can use ({slot_bytes}-byte slots, {lanes} lanes)"))
    } else {
        Ok(())
    }
}

/// Rank 0's word to the others: the file to map and the lanes it holds (at most the lanes
/// offered: fewer where the directory had no room for them all), or why there is none. `Ok`
/// is the last message, once every rank mapped it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Word {
    Map { path: String, token: u128, lanes: usize },
    Without(String),
    Ok,
}

impl Word {
    fn encode(&self) -> Vec<u8> {
        match self {
            Word::Map { path, token, lanes } => format!("map\n{path}\n{token:032x}\n{lanes}"),
            Word::Without(why) => format!("without\n{why}"),
            Word::Ok => "ok".into(),
        }
        .into_bytes()
    }

    pub(super) fn decode(bytes: &[u8]) -> Option<Word> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (kind, rest) = text.split_once('\n').unwrap_or((text, ""));
        match kind {
            "map" => {
                let (path, rest) = rest.split_once('\n')?;
                let (token, lanes) = rest.split_once('\n')?;
                let (token, lanes) = (u128::from_str_radix(token, 16).ok()?, lanes.parse().ok()?);
                Some(Word::Map { path: path.to_string(), token, lanes })
            }
            "without" => Some(Word::Without(rest.to_string())),
            "ok" if rest.is_empty() => Some(Word::Ok),
            _ => None,
        }
    }
}

/// The setup's steps, each its own control-message tag in this call.
#[derive(Copy, Clone)]
enum Step {
    Offer = 0,
    Decision = 1,
    Mapped = 2,
    Final = 3,
}

fn tag<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, step: Step) -> u32 {
    Imm::new(cx.seq, STEP_DATA_MAX - step as u32, 0).encode()
}

/// Maps an arena shared by every rank in the directory `dir`, or says why there is none.
/// Collective: every rank calls it in the same call and reaches the same answer. A peer that
/// does not answer fails the call naming it; one that runs another algorithm is a mismatch.
pub(super) fn setup<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    dir: &Path,
    shape: Shape,
) -> Result<Result<Arena, Unavailable>, CollError> {
    let mine = Offer { host: host_identity(), pid_ns: pid_namespace(), shape };
    if cx.rank == 0 {
        return lead(cx, a, dir, mine);
    }
    send(cx, 0, Step::Offer, &mine.encode())?;
    // Safe to look for another algorithm here: no rank falls back before the final word,
    // which rank 0 sends only after this rank's answer below.
    let mut shape = shape;
    let mapped = match word(cx, receive(cx, a, 0, Step::Decision, true)?)? {
        // Not what this rank offered: it maps nothing, so every rank goes without.
        Word::Map { lanes, .. } if lanes == 0 || lanes > shape.lanes => {
            Err(format!("rank 0 sent an arena of {lanes} lanes where {} were offered", shape.lanes))
        }
        Word::Map { path, token, lanes } => {
            shape.lanes = lanes;
            open(cx.n, cx.rank, shape, Path::new(&path), token)
        }
        Word::Without(why) => Err(why),
        Word::Ok => return Err(malformed(cx, "an arena decision that is neither a file nor a reason")),
    };
    send(cx, 0, Step::Mapped, &[u8::from(mapped.is_ok())])?;
    // No looking from here: a peer that got the final word may already run the size rule's
    // schedule and send its handshake before this rank has the word.
    match (word(cx, receive(cx, a, 0, Step::Final, false)?)?, mapped) {
        (Word::Ok, Ok(map)) => Ok(Ok(Arena::new(map, cx.n, cx.rank, shape))),
        (Word::Without(why), _) => Ok(Err(why)),
        _ => Err(malformed(cx, "an arena final word that does not match what this rank mapped")),
    }
}

/// Rank 0's side: gathers the offers, decides, creates the file, gathers who mapped it.
fn lead<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    dir: &Path,
    mine: Offer,
) -> Result<Result<Arena, Unavailable>, CollError> {
    let (n, shape) = (cx.n, mine.shape);
    let mut offers = vec![mine];
    for peer in 1..n {
        let bytes = receive(cx, a, peer, Step::Offer, true)?;
        offers.push(Offer::decode(&bytes).ok_or_else(|| {
            cx.transport(TransportError::Malformed { peer, reason: "an arena offer that does not parse".into() })
        })?);
    }
    let made = verdict(&offers).and_then(|()| create_fitting(shape, |s| create(dir, n, s)));
    let decision = match &made {
        Ok(((map, token), shape)) => {
            Word::Map { path: map.path().display().to_string(), token: *token, lanes: shape.lanes }
        }
        Err(why) => Word::Without(why.clone()),
    };
    broadcast(cx, Step::Decision, &decision.encode())?;
    // Even a refusal takes both rounds: a rank falls back only on the final word, so no rank
    // runs the size rule's schedule while another still looks for one (a false mismatch).
    let mut unmapped = None;
    for peer in 1..n {
        if receive(cx, a, peer, Step::Mapped, true)? != [1] {
            unmapped.get_or_insert(peer);
        }
    }
    let map = match (made, unmapped) {
        (Err(why), _) => Err(why),
        (Ok(_), Some(r)) => Err(format!("rank {r} could not map the arena file")), // the drop unlinks it
        (Ok(((map, _), shape)), None) => Ok((map, shape)),
    };
    let (map, shape) = match map {
        Ok(map) => map,
        Err(why) => {
            broadcast(cx, Step::Final, &Word::Without(why.clone()).encode())?;
            return Ok(Err(why));
        }
    };
    broadcast(cx, Step::Final, &Word::Ok.encode())?;
    // Every rank has it mapped: the name can go, so nothing is left behind.
    if let Err(e) = map.unlink() {
        tracing::warn!(error = %e, "could not unlink the arena file");
    }
    Ok(Ok(Arena::new(map, n, 0, shape)))
}

fn malformed<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, reason: &str) -> CollError {
    cx.transport(TransportError::Malformed { peer: 0, reason: reason.into() })
}

fn word<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, bytes: Vec<u8>) -> Result<Word, CollError> {
    Word::decode(&bytes).ok_or_else(|| malformed(cx, "an arena word that does not parse"))
}

fn send<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, peer: usize, step: Step, bytes: &[u8]) -> Result<(), CollError> {
    cx.t.send_ctrl(peer, tag(cx, step), bytes).map_err(|e| cx.fail(e, &[peer]))
}

fn broadcast<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, step: Step, bytes: &[u8]) -> Result<(), CollError> {
    (1..cx.n).try_for_each(|peer| send(cx, peer, step, bytes))
}

/// `peer`'s message of `step`, waiting in slices so that, where `detect`, a peer that runs
/// another algorithm in this call is found (see [`on_another_algorithm`]).
fn receive<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    peer: usize,
    step: Step,
    detect: bool,
) -> Result<Vec<u8>, CollError> {
    let _waiting = cx.progress.waiting(peer, "the arena's setup", None, 1);
    loop {
        let slice = cx.deadline.min(Instant::now() + DETECT_INTERVAL);
        match cx.t.recv_ctrl(peer, tag(cx, step), slice) {
            Ok(bytes) => return Ok(bytes),
            Err(TransportError::Timeout { .. }) if Instant::now() < cx.deadline => {
                if let Some(e) = detect.then(|| on_another_algorithm(cx, a)).flatten() {
                    return Err(e);
                }
            }
            Err(e) => return Err(cx.fail(e, &[peer])),
        }
    }
}

/// Whether a peer sent this call's handshake, so runs one of the transport's schedules while
/// this rank runs the arena (their `ACCORD_ALGO_ALL_REDUCE`, `ACCORD_COLL_ARENA` or shared
/// memory settings differ, or they called another collective). Then this rank answers with its
/// own handshake, naming the arena, so that peer fails at once with the same mismatch, tells
/// the others (a stuck report: their waits end too), and returns the mismatch. Every peer is
/// asked: a ring schedule hands its handshake to one neighbour only.
pub(super) fn on_another_algorithm<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Option<CollError> {
    let (peer, theirs) = (0..cx.n)
        .filter(|&p| p != cx.rank)
        .find_map(|p| cx.t.recv_ctrl(p, cx.imm(STEP_HANDSHAKE, p), Instant::now()).ok().map(|b| (p, b)))?;
    let _ = cx.t.send_ctrl(peer, cx.imm(STEP_HANDSHAKE, cx.rank), &cx.handshake_of(a, false).encode());
    cx.t.report_stuck(peer);
    let theirs = Handshake::decode(&theirs).ok();
    let mismatch = |field: &'static str, theirs: String, ours: &str| CollError::Mismatch {
        collective: cx.collective.name(),
        peer,
        field,
        ours: ours.to_string(),
        theirs,
    };
    let collective = theirs.as_ref().map(|h| h.collective).unwrap_or(cx.collective.code());
    if collective != cx.collective.code() {
        let name = Collective::ALL.iter().find(|c| c.code() == collective).map_or("?", |c| c.name());
        return Some(mismatch("collective", name.to_string(), cx.collective.name()));
    }
    let algo = theirs
        .and_then(|h| cx.collective.algorithms().iter().find(|x| x.code() == h.algo).copied())
        .map_or("?", Algo::name);
    Some(mismatch(
        "algorithm (set ACCORD_ALGO_*, ACCORD_COLL_ARENA and the shared-memory settings identically everywhere)",
        algo.to_string(),
        Algo::Arena.name(),
    ))
}

/// Names arena files so the engine's sweep of files left by crashed processes
/// (`accord-<pid>-...`) removes them too; the counter keeps two communicators of one process
/// apart.
fn file_name() -> String {
    static CREATED: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("accord-{}-arena-{}-{nanos}", std::process::id(), CREATED.fetch_add(1, Ordering::Relaxed))
}

/// Rank 0's file for `shape` (made by `create`), or for fewer lanes (halved until it fits)
/// where the directory has no room for them all: a container's small /dev/shm then keeps the
/// arena with fewer threads per call rather than none. The shape it holds comes back with it.
pub(super) fn create_fitting<M>(
    shape: Shape,
    mut create: impl FnMut(Shape) -> Result<M, String>,
) -> Result<(M, Shape), String> {
    let mut lanes = shape.lanes;
    loop {
        let tried = Shape { lanes, ..shape };
        match create(tried) {
            Ok(made) => {
                if lanes < shape.lanes {
                    tracing::warn!(lanes, asked = shape.lanes, "the host arena has room for fewer lanes than asked");
                }
                return Ok((made, tried));
            }
            Err(e) if lanes <= 1 => return Err(format!("rank 0 could not create the arena file: {e}")),
            Err(_) => lanes /= 2,
        }
    }
}

/// Rank 0's file: the header and a fresh token, in `dir`.
fn create(dir: &Path, n: usize, shape: Shape) -> Result<(SharedMapping, u128), String> {
    use std::io::Read;
    let len = arena_bytes(n, shape).ok_or("an arena of that size does not fit this machine's addresses")?;
    let mut random = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(|e| format!("no random token: {e}"))?;
    let token = u128::from_le_bytes(random);
    let path: PathBuf = dir.join(file_name());
    let map = SharedMapping::create(&path, len).map_err(|e| e.to_string())?;
    let w = map.words();
    w[1].store(n as u64, Ordering::Relaxed);
    w[2].store(shape.slot_bytes as u64, Ordering::Relaxed);
    w[3].store(token as u64, Ordering::Relaxed);
    w[4].store((token >> 64) as u64, Ordering::Relaxed);
    w[5].store(shape.lanes as u64, Ordering::Relaxed);
    w[0].store(MAGIC, Ordering::Release);
    w[pid_word(0)].store(u64::from(std::process::id()), Ordering::Release);
    const { assert!(HEADER_WORDS >= 6, "the header holds magic, n, slot, the token and lanes") };
    Ok((map, token))
}

/// Another rank's side: the file rank 0 named, checked against what it said; writes this
/// rank's pid for the others' liveness checks before it answers that it mapped the file.
fn open(n: usize, rank: usize, shape: Shape, path: &Path, token: u128) -> Result<SharedMapping, String> {
    let len = arena_bytes(n, shape).ok_or("an arena of that size does not fit this machine's addresses")?;
    let map = SharedMapping::open(path, len).map_err(|e| e.to_string())?;
    let w = map.words();
    let header = [
        w[0].load(Ordering::Acquire),
        w[1].load(Ordering::Relaxed),
        w[2].load(Ordering::Relaxed),
        w[5].load(Ordering::Relaxed),
    ];
    let theirs = u128::from(w[3].load(Ordering::Relaxed)) | (u128::from(w[4].load(Ordering::Relaxed)) << 64);
    if header != [MAGIC, n as u64, shape.slot_bytes as u64, shape.lanes as u64] || theirs != token {
        return Err(format!("{} is not the arena rank 0 created", path.display()));
    }
    w[pid_word(rank)].store(u64::from(std::process::id()), Ordering::Release);
    Ok(map)
}

/// The encodings, for the tests beside `mod.rs`.
#[cfg(test)]
pub(super) fn tests_encode_offer(o: &Offer) -> Vec<u8> {
    o.encode()
}

#[cfg(test)]
pub(super) fn tests_encode_word(w: &Word) -> Vec<u8> {
    w.encode()
}
