//! Peer liveness: how a wait on a peer that died ends in an error naming it instead of a hang.
//!
//! The protocol's idle timeout fails a connection only while it has data outstanding; a
//! receive posted for a peer, an immediate expected from it, or a send waiting for its
//! clear-to-send have nothing outstanding, so on their own they would wait for ever. Two
//! detectors close that gap, both run by one `accord-liveness` thread per engine:
//!
//! - **Same host**: every peer whose address names this host (and whose advertised process
//!   start time matches the process at its pid, so a recycled pid or another pid namespace is
//!   never watched) gets a pidfd. Its exit wakes the thread's `poll` at once: the peer is
//!   declared [`PeerDeath::Exited`] within one poll (microseconds), whatever route its bytes
//!   take (shared-memory rings, UDP, the pull route).
//! - **Any host**: while some wait names a peer ([`crate::Engine::watch_peer`],
//!   [`crate::Engine::take_imm_from`]), the thread sends it a zero-byte write to its control
//!   region every [`crate::EngineConfig::keepalive`]. A probe unanswered for
//!   [`crate::EngineConfig::peer_dead_after`] (or failed as unresponsive) declares the peer
//!   [`PeerDeath::Silent`]. No protocol change: a probe is an ordinary write the peer's
//!   protocol acknowledges. A peer a pidfd watches is never probed: on one host a silence
//!   (a network outage, a stopped process) is not a death, and the pidfd reports the real one.
//!
//! A connection's idle timeout is no death verdict either: its parts are resent on a fresh
//! connection until the peer was silent for `peer_dead_after` (`Worker::connection_lost`), so
//! an outage shorter than that heals, and one longer fails with
//! [`crate::TransferError::PeerUnresponsive`], which names the peer without calling it dead.
//!
//! A death is sticky (an engine identity is one process; a restarted peer has a new one). On a
//! death every lane fails the peer's operations in flight and queued with
//! [`crate::TransferError::PeerDied`], later submissions to it fail the same way, and waits
//! that name it return within [`WAIT_SLICE`].

use crate::address::EngineId;
use crate::completion::Transfer;
pub use crate::config::{KEEPALIVE_DEFAULT, PEER_DEAD_DEFAULT};
use crate::engine::part::{Command, Part};
use crate::engine::shared::Shared;
use crate::error::TransferError;
use crate::memory::Source;
pub use crate::peer_death::PeerDeath;
use state::ProcessWatch;

pub(crate) mod state;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Most same-host peers watched through pidfds (one descriptor each); further peers rely on
/// keepalive probes alone.
pub const PIDFD_WATCHES_MAX: usize = 1024;
/// How often a wait that names a peer looks at its liveness (it wakes at once for the data
/// itself): the bound on how late such a wait returns after a death is declared.
pub const WAIT_SLICE: Duration = Duration::from_millis(20);
/// The watcher's poll timeout: how often it looks at probes and newly added peers.
const TICK: Duration = Duration::from_millis(20);

/// Why a wait that names a peer ended without what it waited for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerWaitError {
    /// The timeout passed first; `value` is what the counter held then.
    #[error("not complete within the timeout (counter at {value}): wait longer, or check the peer")]
    Timeout {
        /// The counter's value at the deadline.
        value: u64,
    },
    /// The peer waited for was declared dead.
    #[error("peer {:x} is dead: {cause}", peer.0)]
    PeerDied {
        /// The peer.
        peer: EngineId,
        /// Why it was declared dead.
        cause: PeerDeath,
    },
}

/// Declares `peer` dead (once) and has every lane fail its work.
pub(crate) fn declare_dead(shared: &Shared, peer: EngineId, cause: PeerDeath) {
    {
        let mut dead = shared.liveness.dead.write().unwrap();
        if dead.contains_key(&peer) {
            return;
        }
        dead.insert(peer, cause);
        shared.liveness.any_dead.store(true, Ordering::Release);
    }
    tracing::warn!(peer = format_args!("{:x}", peer.0), %cause, "peer declared dead: failing its transfers");
    for lane in 0..shared.lanes.len() {
        let _ = shared.send_command(lane, Command::PeerDead(peer, cause));
    }
}

/// While alive, keepalive probes go to its peer (see the module docs). Returned by
/// [`crate::Engine::watch_peer`]; a wait holds one for as long as it waits.
pub struct PeerWatch {
    shared: Weak<Shared>,
    peer: EngineId,
}

impl PeerWatch {
    pub(crate) fn new(shared: &Arc<Shared>, peer: EngineId) -> PeerWatch {
        shared.liveness.add_interest(peer);
        PeerWatch { shared: Arc::downgrade(shared), peer }
    }

    /// The peer watched.
    pub fn peer(&self) -> EngineId {
        self.peer
    }

    /// Why the peer was declared dead, if it was.
    pub fn death(&self) -> Option<PeerDeath> {
        self.shared.upgrade().and_then(|s| s.liveness.death(self.peer))
    }
}

impl std::fmt::Debug for PeerWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerWatch").field("peer", &self.peer).finish()
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        if let Some(s) = self.shared.upgrade() {
            s.liveness.drop_interest(self.peer);
        }
    }
}

/// Waits until `count` writes with `imm` landed (and takes them, as `take_imm`), in slices of
/// [`WAIT_SLICE`], failing as soon as `peer` is declared dead.
pub(crate) fn take_imm_from(
    shared: &Arc<Shared>,
    imm: u32,
    count: u64,
    timeout: Duration,
    peer: EngineId,
) -> Result<(), PeerWaitError> {
    let _watch = PeerWatch::new(shared, peer);
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match shared.imms.take(imm, count, left.min(WAIT_SLICE)) {
            Ok(()) => return Ok(()),
            Err(value) => {
                if let Some(cause) = shared.liveness.death(peer) {
                    return Err(PeerWaitError::PeerDied { peer, cause });
                }
                if left <= WAIT_SLICE {
                    return Err(PeerWaitError::Timeout { value });
                }
            }
        }
    }
}

/// One probe in flight.
struct Probe {
    transfer: Transfer,
    sent: Instant,
}

/// The watcher thread's body (see the module docs); returns when the engine stops or is gone.
pub(crate) fn run(shared: Weak<Shared>) {
    let mut pidfds: Vec<(EngineId, accord_net::pidfd::PidFd)> = Vec::new();
    let mut probes: HashMap<EngineId, Probe> = HashMap::new();
    let mut last_probe: HashMap<EngineId, Instant> = HashMap::new();
    loop {
        let Some(s) = shared.upgrade() else { return };
        if s.liveness.stop.load(Ordering::Acquire) {
            return;
        }
        let fresh: Vec<ProcessWatch> = std::mem::take(&mut *s.liveness.new_processes.lock().unwrap());
        for w in fresh {
            if pidfds.len() >= PIDFD_WATCHES_MAX || pidfds.iter().any(|(p, _)| *p == w.peer) {
                continue;
            }
            match accord_net::pidfd::PidFd::open_verified(w.pid, w.start_ticks) {
                Some(fd) => pidfds.push((w.peer, fd)),
                // Gone already (or not the process it advertised): if it is not running, it
                // exited; otherwise keepalives are left to judge.
                None if accord_net::pidfd::process_start_ticks(w.pid).is_none() => {
                    declare_dead(&s, w.peer, PeerDeath::Exited { pid: w.pid })
                }
                None => {}
            }
        }
        keepalive(&s, &mut probes, &mut last_probe, |peer| pidfds.iter().any(|(p, _)| *p == peer));
        drop(s); // not held across the poll: the engine may be dropped meanwhile
        let fds: Vec<&accord_net::pidfd::PidFd> = pidfds.iter().map(|(_, fd)| fd).collect();
        let exited = accord_net::pidfd::poll_exited(&fds, TICK).unwrap_or_default();
        if exited.is_empty() {
            continue;
        }
        let Some(s) = shared.upgrade() else { return };
        for &i in exited.iter().rev() {
            let (peer, fd) = pidfds.swap_remove(i);
            declare_dead(&s, peer, PeerDeath::Exited { pid: fd.pid() });
        }
    }
}

/// Sends due probes to watched peers and judges those in flight. A peer whose process a pidfd
/// watches (`has_pidfd`) is not probed: its pidfd says at once whether it exited, and a
/// silence (a network outage, a stopped process) is not a death. Its transfers are bounded
/// on their own (`TransferError::PeerUnresponsive`, the waits' deadlines).
fn keepalive(
    s: &Arc<Shared>,
    probes: &mut HashMap<EngineId, Probe>,
    last_probe: &mut HashMap<EngineId, Instant>,
    has_pidfd: impl Fn(EngineId) -> bool,
) {
    let watched: Vec<EngineId> = s.liveness.watched.lock().unwrap().keys().copied().collect();
    // A peer unwatched for a moment (between two slices of one wait) keeps its probe and its
    // probing rhythm; one unwatched for longer is forgotten.
    let (dead_after, keepalive) = (s.config.peer_dead_after, s.config.keepalive);
    probes.retain(|peer, p| watched.contains(peer) || p.sent.elapsed() < dead_after);
    last_probe.retain(|peer, t| watched.contains(peer) || t.elapsed() < keepalive);
    if s.config.keepalive.is_zero() {
        return;
    }
    let now = Instant::now();
    for peer in watched {
        if s.liveness.death(peer).is_some() || is_same_process(s, peer) || has_pidfd(peer) {
            probes.remove(&peer);
            continue;
        }
        if let Some(p) = probes.get(&peer) {
            let silent = now.duration_since(p.sent);
            match p.transfer.poll() {
                // Answered, or refused by a live peer: alive either way.
                Some(Ok(())) | Some(Err(TransferError::Rejected(_))) => {
                    probes.remove(&peer);
                }
                Some(Err(TransferError::PeerDied { .. })) | Some(Err(TransferError::ShutDown)) => {
                    probes.remove(&peer);
                }
                Some(Err(_)) => {
                    declare_dead(s, peer, PeerDeath::Silent { ms: silent.as_millis() as u64 });
                    probes.remove(&peer);
                }
                None if silent >= s.config.peer_dead_after => {
                    declare_dead(s, peer, PeerDeath::Silent { ms: silent.as_millis() as u64 });
                    probes.remove(&peer);
                }
                None => {}
            }
            continue;
        }
        if last_probe.get(&peer).is_some_and(|t| now.duration_since(*t) < s.config.keepalive) {
            continue;
        }
        let Some(control) = s.peers.read().unwrap().get(&peer).map(|a| a.control) else { continue };
        let state = s.new_internal_transfer(1);
        let part = Part {
            peer,
            kind: crate::engine::part::PartKind::Write {
                region: accord_proto::RegionId(control.region),
                key: accord_proto::RegionKey(control.key),
                offset: 0,
                imm: None,
            },
            source: Source::Bytes(Arc::from(&[][..])),
            transfer: state.clone(),
            tag: s.tags.next(),
            attempts: 0,
            stranded_since: None,
        };
        s.route(part, None);
        probes.insert(peer, Probe { transfer: Transfer { state }, sent: now });
        last_probe.insert(peer, now);
    }
}

fn is_same_process(s: &Shared, peer: EngineId) -> bool {
    !s.config.force_network && crate::engine::shared::local_engine(peer).is_some()
}
