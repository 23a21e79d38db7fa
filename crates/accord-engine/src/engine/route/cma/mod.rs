//! The pull route: large writes between processes of one host move with one copy, the
//! receiver reading the writer's memory through cross-memory attach (`process_vm_readv`),
//! instead of two (writer into a shared-memory ring, receiver out of it).
//!
//! Why: on the 2xH200 host the NCCL plugin's bandwidth at 256 MiB was bound by its workers'
//! copies (each byte copied twice, every worker near a full core; one core copies about 5.7
//! GB/s there, CMA about 4.3; docs/results/2026-11-22-nccl-plugin.md). A pull halves the
//! bytes the CPU moves and the memory traffic behind them.
//!
//! How, per part (a shard of a write, or a whole one): the writer sends a 64-byte `Pull` into
//! the receiver's control region over the transport (reliable, exactly once); the receiving
//! worker checks region, key and bounds under the region table's lock (as it does before
//! placing a datagram), reads the bytes straight from the writer's process into the region,
//! counts the immediate and answers `Reply`. The writer's part completes on the reply. The
//! receiver decides what is written where: a stale or forged pull is refused like a
//! transport write, and the writer's memory is only ever read.
//!
//! Safety of the identity: the receiver reads from the pid the writer's address names. Before
//! any pull, the writer says `Hello` with the address of its engine id; the receiver reads
//! those 8 bytes from that pid and serves pulls only if they match (a pid of another pid
//! namespace, a recycled pid, a kernel that forbids CMA all fail here, and the pair stays on
//! the transport). Until the writer has seen the hello answered, and for small writes
//! (below `ACCORD_CMA_MIN_BYTES`), parts go over the transport as before.
//!
//! Failure: an `Unavailable` answer (nothing counted) sends the part over the transport and
//! stops pulls to that peer; a refusal fails the part as the transport would; a peer that
//! stops answering fails the part after the engine's idle timeout.
//!
//! Off by default (`ACCORD_CMA=1`): measured on the 2xH200 host it lowers the latency of one
//! 64 KiB-1 MiB write, but NCCL through the plugin ran slower with it (see the config field).

pub(crate) mod state;
mod sys;
pub(crate) mod wire;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use accord_proto::{RegionId, RegionKey};

use crate::address::EngineId;
use crate::engine::part::{write_kind, Part, PartKind};
use crate::engine::shared::Shared;
use crate::error::TransferError;
use crate::memory::Source;
use wire::{Body, Outcome, PullMessage};

pub use state::{CmaStats, CMA_MIN_BYTES_DEFAULT, CMA_PULLS_IN_FLIGHT_MAX, CMA_VERIFIED_PEERS_MAX};
use state::{PeerRoute, Pending};
#[cfg(test)]
use state::{ServedPulls, CMA_SERVED_REMEMBERED};

/// A control message (64 bytes into `peer`'s control region) on `lane` (or the next one).
fn control_part(shared: &Arc<Shared>, peer: EngineId, message: PullMessage) -> Option<Part> {
    let control = shared.peers.read().unwrap().get(&peer)?.control;
    Some(Part {
        peer,
        kind: write_kind(&control, 0, None),
        source: Source::Bytes(Arc::from(&message.encode()[..])),
        transfer: shared.new_internal_transfer(1),
        tag: shared.tags.next(),
        attempts: 0,
        stranded_since: None,
    })
}

/// Writer side: sends `part` as a pull when it qualifies, returning it otherwise (to go over
/// the transport). Qualifies: the route is on, the peer is another process of this host that
/// verified us, the part is a write from registered memory of at least the minimum length.
pub(crate) fn try_pull(shared: &Arc<Shared>, part: Part, lane: Option<usize>) -> Option<Part> {
    let config = &shared.config;
    let PartKind::Write { region, key, offset, imm } = part.kind else { return Some(part) };
    let Source::Region { base, len, .. } = part.source else { return Some(part) };
    if !config.cma || len < config.cma_min_bytes || !shared.peer_on_this_host(part.peer) {
        return Some(part);
    }
    let state = &shared.cma;
    let known = state.peers.lock().unwrap().get(&part.peer).copied();
    let route = match known {
        Some(route) => route,
        None => {
            // Not introduced yet (added before the route was on?): ask now; this part goes the
            // old way.
            introduce(shared, part.peer);
            PeerRoute::Asked
        }
    };
    if route != PeerRoute::Verified || state.pending_count.load(Ordering::Acquire) >= CMA_PULLS_IN_FLIGHT_MAX {
        return Some(part);
    }
    sweep(shared);
    let req = state.next_req.fetch_add(1, Ordering::Relaxed);
    let body = Body::Pull { src_addr: base as u64, len, region: region.0, key: key.0, offset, imm };
    let Some(message) = control_part(shared, part.peer, PullMessage { from: shared.id, req, body }) else {
        return Some(part);
    };
    // The pull message's own delivery failing means the receiver never saw it: fail the part
    // (a lost acknowledgement could hide a pull that ran, so no transport retry).
    {
        let shared = Arc::downgrade(shared);
        crate::Transfer { state: message.transfer.clone() }.on_complete(move |result| {
            if let (Err(e), Some(shared)) = (result, shared.upgrade()) {
                finish_pending(&shared, req, Err(e));
            }
        });
    }
    let deadline = Instant::now() + shared.config.idle_timeout * 2;
    state.pending.lock().unwrap().insert(req, Pending { part, deadline });
    state.pending_count.fetch_add(1, Ordering::AcqRel);
    state.pulls_sent.fetch_add(1, Ordering::Relaxed);
    shared.route(message, lane);
    None
}

/// Asks `peer` (another process of this host, just added or re-added) to verify us: until it
/// answers, parts to it go over the transport.
pub(crate) fn introduce(shared: &Arc<Shared>, peer: EngineId) {
    if !shared.peer_on_this_host(peer) {
        return;
    }
    shared.cma.peers.lock().unwrap().insert(peer, PeerRoute::Asked);
    let hello = PullMessage { from: shared.id, req: 0, body: Body::Hello { id_addr: id_address(&shared.cma) } };
    if let Some(p) = control_part(shared, peer, hello) {
        shared.route(p, None);
    }
}

fn id_address(state: &state::Cma) -> u64 {
    &*state.id_cell as *const u64 as u64
}

/// Completes the pending pull `req` (if still pending).
fn finish_pending(shared: &Arc<Shared>, req: u64, result: Result<(), TransferError>) {
    let Some(pending) = shared.cma.pending.lock().unwrap().remove(&req) else { return };
    shared.cma.pending_count.fetch_sub(1, Ordering::AcqRel);
    if result.is_ok() {
        shared.cma.bytes_pulled.fetch_add(pending.part.source.len(), Ordering::Relaxed);
    }
    pending.part.finish(result);
}

/// Fails pulls whose receiver stopped answering (at most once a millisecond, cheap when none).
pub(crate) fn sweep(shared: &Arc<Shared>) {
    let state = &shared.cma;
    let now_ns = shared.epoch.elapsed().as_nanos() as u64;
    let expired =
        super::sweep::expired_if_due(&state.pending_count, &state.last_sweep_ns, now_ns, &state.pending, |p| {
            p.deadline
        });
    for req in expired {
        finish_pending(shared, req, Err(TransferError::PeerUnreachable));
    }
}

/// A control message of this route arrived (`bytes`, placed at `offset` of the control region).
/// Receiver side it serves a hello or a pull; writer side it takes a reply. Returns the reply
/// to send, if any (the worker queues it on its own lane).
pub(crate) fn serve(shared: &Arc<Shared>, offset: u64, bytes: &[u8]) -> Option<Part> {
    let state = &shared.cma;
    let Ok(message) = PullMessage::decode(offset, bytes) else {
        state.refused.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let from = message.from;
    let outcome = match message.body {
        Body::Reply { outcome } => {
            take_reply(shared, message.req, outcome, from);
            return None;
        }
        Body::Hello { id_addr } => verify(shared, from, id_addr),
        Body::Pull { src_addr, len, region, key, offset, imm } => {
            if state.served.lock().unwrap().get(&from).is_some_and(|s| s.ids.contains(&message.req)) {
                // Served already (this message was resent after a connection failed): answer
                // again, copy and count nothing.
                Outcome::Done
            } else {
                let outcome = pull(shared, from, src_addr, len, RegionId(region), RegionKey(key), offset);
                if outcome == Outcome::Done {
                    state.pulls_served.fetch_add(1, Ordering::Relaxed);
                    state.served.lock().unwrap().entry(from).or_default().first_time(message.req);
                    if let Some(imm) = imm {
                        shared.imms.bump(imm, &shared.jobs);
                    }
                }
                outcome
            }
        }
    };
    if outcome != Outcome::Done {
        state.refused.fetch_add(1, Ordering::Relaxed);
    }
    let reply = PullMessage { from: shared.id, req: message.req, body: Body::Reply { outcome } };
    control_part(shared, from, reply)
}

/// Writer side: the answer to our hello (`req` 0) or to pull `req`.
fn take_reply(shared: &Arc<Shared>, req: u64, outcome: Outcome, from: EngineId) {
    let state = &shared.cma;
    if req == 0 {
        let mut peers = state.peers.lock().unwrap();
        if let Some(route) = peers.get_mut(&from) {
            if *route == PeerRoute::Asked {
                *route = if outcome == Outcome::Done { PeerRoute::Verified } else { PeerRoute::Unavailable };
                tracing::info!(peer = from.0, ?outcome, "cross-memory pulls to this peer");
            }
        }
        return;
    }
    let pending = state.pending.lock().unwrap().get(&req).map(|p| p.part.peer);
    if pending != Some(from) {
        state.refused.fetch_add(1, Ordering::Relaxed); // stale, or not the peer we asked
        return;
    }
    match outcome {
        Outcome::Done => finish_pending(shared, req, Ok(())),
        Outcome::Refused(reason) => finish_pending(shared, req, Err(TransferError::Rejected(reason))),
        Outcome::Unavailable => {
            // Nothing was counted there: stop pulling from this peer and send the bytes.
            state.peers.lock().unwrap().insert(from, PeerRoute::Unavailable);
            if let Some(p) = state.pending.lock().unwrap().remove(&req) {
                state.pending_count.fetch_sub(1, Ordering::AcqRel);
                state.fallbacks.fetch_add(1, Ordering::Relaxed);
                shared.route(p.part, None);
            }
        }
    }
}

/// The pid of `from` if it is a known peer on this host.
fn same_host_pid(shared: &Shared, from: EngineId) -> Option<u32> {
    let host = crate::address::this_host();
    let peers = shared.peers.read().unwrap();
    let address = peers.get(&from)?;
    (address.host == host && !host.is_empty() && address.pid != std::process::id()).then_some(address.pid)
}

/// Receiver side: reads the writer's engine id from its process; verified on a match.
fn verify(shared: &Arc<Shared>, from: EngineId, id_addr: u64) -> Outcome {
    if !shared.config.cma {
        return Outcome::Unavailable;
    }
    let Some(pid) = same_host_pid(shared, from) else { return Outcome::Unavailable };
    let Ok(pid_i32) = i32::try_from(pid) else { return Outcome::Unavailable };
    let mut seen = [0u8; 8];
    // Safety: `seen` is a local buffer of 8 bytes, written only by this call.
    #[allow(unsafe_code)]
    let read = unsafe { sys::read_from_process(pid_i32, id_addr, seen.as_mut_ptr(), 8) };
    match read {
        Ok(()) if u64::from_le_bytes(seen) == from.0 => {
            let mut verified = shared.cma.verified.lock().unwrap();
            if verified.len() >= CMA_VERIFIED_PEERS_MAX && !verified.contains_key(&from) {
                return Outcome::Unavailable;
            }
            verified.insert(from, pid);
            Outcome::Done
        }
        Ok(()) => {
            tracing::warn!(peer = from.0, pid, "pid does not hold the peer's engine (another pid namespace?)");
            Outcome::Unavailable
        }
        Err(e) => {
            tracing::info!(peer = from.0, pid, error = %e, "cross-memory reads from this peer are not allowed here");
            Outcome::Unavailable
        }
    }
}

/// Receiver side: copies a verified writer's bytes into our region, checked as a transport
/// write is, under the region table's read lock (so the region cannot be deregistered meanwhile).
fn pull(
    shared: &Arc<Shared>,
    from: EngineId,
    src_addr: u64,
    len: u64,
    region: RegionId,
    key: RegionKey,
    offset: u64,
) -> Outcome {
    let Some(&pid) = shared.cma.verified.lock().unwrap().get(&from) else { return Outcome::Unavailable };
    if same_host_pid(shared, from) != Some(pid) {
        return Outcome::Unavailable; // the peer was replaced since it was verified
    }
    let Ok(len_usize) = usize::try_from(len) else {
        return Outcome::Refused(accord_proto::wire::RejectReason::OutOfBounds);
    };
    let regions = shared.regions.read().unwrap();
    let dst = match regions.check_host_write(region, key, offset, len) {
        Ok((addr, _keep)) => addr,
        Err(reason) => return Outcome::Refused(reason),
    };
    // Safety: `dst..dst + len` lies inside a registered host region (checked just above), which
    // cannot be deregistered while we hold the table's read lock; placement by the transport
    // writes there under the same lock, as a one-sided write's bytes may.
    #[allow(unsafe_code)]
    let read = unsafe { sys::read_from_process(pid as i32, src_addr, dst as *mut u8, len_usize) };
    match read {
        Ok(()) => Outcome::Done,
        Err(e) => {
            tracing::warn!(peer = from.0, error = %e, "cross-memory read failed; the writer falls back to the transport");
            Outcome::Unavailable
        }
    }
}

#[cfg(test)]
mod tests;
