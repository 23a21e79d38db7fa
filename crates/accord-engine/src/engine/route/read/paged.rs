//! Batched READ: one request names many pieces of the owner's region (a page map with offsets
//! and strides, as a paged write has, repeated over planes), and the owner writes them all back
//! as ONE paged write, answering once after every byte landed.
//!
//! Why: a READ per piece is a round trip through the owner's worker each (12-17 µs a piece on
//! the device host, `docs/results/2026-11-26-kv-gpu.md`), while the owner's paged write of the
//! same pieces is one batch of copies (`paged_through_copy_engine` where both sides are device
//! memory on one host) or one part per run over the transport. A KV pull of N blocks is
//! `layers x 2` planes of the same N block ids, so the request carries the ids once and the
//! planes as a stride: 2,048 blocks of an 80-layer cache are 2,048 id pairs, not 327,680
//! pieces.
//!
//! Wire: a request does not fit one 64-byte control frame, so it goes as [`HEADER_FRAMES`]
//! header frames and one frame per [`PAGES_PER_FRAME`] page pairs, all of kind [`PAGED`] with
//! the request's id and their index (the second half-word). The owner assembles them in any
//! order ([`Assemblies`], at most [`READ_ASSEMBLIES_MAX`] requests and
//! [`READ_ASSEMBLY_FRAMES_MAX`] frames being assembled; past that the oldest is refused), checks every piece against its region (key, bounds) before anything
//! moves, and answers once with the usual `Reply` frame.
//!
//! | frame | words | first half-word |
//! |---|---|---|
//! | 0 | src key, dst key, src offset, dst offset | src region |
//! | 1 | src stride, dst stride, page bytes, pages | dst region |
//! | 2 | planes, src plane stride, dst plane stride, zero | zero |
//! | 3.. | up to 4 pairs: src page (bits 0..32), dst page (bits 32..64) | pairs in this frame |
//!
//! Bounds: at most [`READ_PIECES_PER_REQUEST_MAX`] pieces (pages x planes) per request; a larger
//! read is split by the reader into several requests, and completes (counting its immediate
//! once, here) when all of them did.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use accord_proto::wire::RejectReason;
use accord_proto::{RegionId, RegionKey};

use super::{
    answer_now, answer_when_written, control_part_with, destination_for, fail_unanswered, finish_pending, refuse, Body,
    Outcome, Pending, ReadMessage, READ_FLOOR_BYTES_PER_SEC, READ_PIECES_PER_REQUEST_MAX, READ_REQUESTS_IN_FLIGHT_MAX,
};
use crate::address::{EngineId, MrDescriptor};
use crate::completion::Transfer;
use crate::engine::device::DeviceWriter;
use crate::engine::part::write_kind;
use crate::engine::route::dispatch::{dispatch_part, PartSpec};
use crate::engine::shared::Shared;
use crate::engine::{Engine, PagedWriteOp};
use crate::error::{SubmitError, TransferError};
use crate::memory::{check_range, MrHandle, Source};

/// The kind of a batched request's frames.
pub(crate) const PAGED: u8 = 4;

/// A batched, one-sided read: for every plane `p` in `0..planes` and every `i`, the
/// `page_bytes` of the peer's region `src` at
/// `src_offset + p * src_plane_stride + src_pages[i] * src_stride` land in the local region
/// `dst` at `dst_offset + p * dst_plane_stride + dst_pages[i] * dst_stride`. With `planes` 1
/// it is a paged read with strides, the mirror of [`crate::StridedPagedWriteOp`]; a KV cache
/// of `(layers, 2, blocks, ...)` reads every layer's K and V of some blocks as
/// `planes = layers * 2` with plane strides of a whole plane of blocks. Destination pieces must
/// not overlap (the destination stride must be at least the page); `imm` is counted once, here,
/// after every piece landed.
#[derive(Copy, Clone, Debug)]
pub struct PagedReadOp<'a> {
    /// Local destination region (host or device memory).
    pub dst: &'a MrHandle,
    /// Byte offset of destination page 0 of plane 0.
    pub dst_offset: u64,
    /// Bytes from one destination page index to the next (at least `page_bytes`).
    pub dst_stride: u64,
    /// Remote source region, as its owner described it.
    pub src: &'a MrDescriptor,
    /// Byte offset of source page 0 of plane 0.
    pub src_offset: u64,
    /// Bytes from one source page index to the next.
    pub src_stride: u64,
    /// Bytes per page (at least one).
    pub page_bytes: u64,
    /// Source page indices (each below 2^32).
    pub src_pages: &'a [u64],
    /// Destination page indices, one per source page (each below 2^32).
    pub dst_pages: &'a [u64],
    /// How many times the page map repeats (at least one).
    pub planes: u64,
    /// Bytes from one source plane to the next.
    pub src_plane_stride: u64,
    /// Bytes from one destination plane to the next.
    pub dst_plane_stride: u64,
    /// Immediate counted here once every piece landed.
    pub imm: Option<u32>,
}

impl PagedReadOp<'_> {
    /// Where the pieces are, apart from the page ids: what the request's header frames carry.
    fn geometry(&self) -> Geometry {
        Geometry {
            src_offset: self.src_offset,
            src_stride: self.src_stride,
            dst_offset: self.dst_offset,
            dst_stride: self.dst_stride,
            page_bytes: self.page_bytes,
            planes: self.planes,
            src_plane_stride: self.src_plane_stride,
            dst_plane_stride: self.dst_plane_stride,
        }
    }
}

// The assemblies and the write-back queue are READ state ([`super::state::ReadState`] holds
// them); they and the geometry they check import nothing of the route's logic.
pub(super) mod assembly;
mod geometry;
pub(super) mod write_back;

pub(crate) use assembly::{PagedRequest, Taken};
#[cfg(test)]
use assembly::{FRAMES_MAX, HEADER_FRAMES};
pub use assembly::{READ_ASSEMBLIES_MAX, READ_ASSEMBLY_FRAMES_MAX};
pub(crate) use geometry::Geometry;
#[cfg(test)]
use geometry::PieceError;
use write_back::WriteBack;
pub use write_back::{READ_WRITE_BACKS_QUEUED_MAX, READ_WRITE_BACK_RUNS_QUEUED_MAX};

impl Engine {
    /// A batched one-sided read (see [`PagedReadOp`]): one request per
    /// [`READ_PIECES_PER_REQUEST_MAX`] pieces, each executed by the owner as one paged write.
    /// Every piece is checked here (arithmetic, both regions' bounds, the destination stride)
    /// before anything is sent, and again by the owner against its region (key, bounds), so a
    /// refused read moves nothing.
    pub fn read_paged(&self, op: &PagedReadOp<'_>) -> Result<Transfer, SubmitError> {
        if op.src_pages.len() != op.dst_pages.len() {
            return Err(SubmitError::Invalid(format!(
                "{} source pages but {} destination pages: give one destination per source page",
                op.src_pages.len(),
                op.dst_pages.len()
            )));
        }
        if let Some((i, page)) =
            op.src_pages.iter().chain(op.dst_pages).enumerate().find(|(_, &p)| p > u64::from(u32::MAX))
        {
            return Err(SubmitError::Invalid(format!(
                "page id {page} (entry {i} of source then destination pages) is above 2^32-1: use a larger page and stride"
            )));
        }
        let geometry = op.geometry();
        let pages: Vec<(u64, u64)> = op.src_pages.iter().copied().zip(op.dst_pages.iter().copied()).collect();
        let dst_len = self.read_destination_len(op.dst)?;
        let runs = geometry.runs(&pages, op.src.len, dst_len).map_err(|e| SubmitError::Invalid(e.message()))?;
        let dst_device = self.is_device_region(op.dst)?;
        let peer = op.src.engine;
        self.check_peer(peer)?;
        let local = self.shared.same_process_engine(peer, self.shared.config.force_network);
        match local {
            Some(owner) => self.read_paged_local(&owner, op, &runs, dst_device),
            None => self.read_paged_remote(peer, op, geometry, &pages, &runs, dst_device),
        }
    }

    fn read_destination_len(&self, dst: &MrHandle) -> Result<u64, SubmitError> {
        if dst.engine != self.id() {
            return Err(SubmitError::UnknownSource);
        }
        let regions = self.shared.regions.read().unwrap();
        Ok(regions.get(dst.region).ok_or(SubmitError::UnknownSource)?.len)
    }

    /// An owner in this process: every run checked against its region (key, bounds), then one
    /// memcpy per run (host memory), or the owner's paged device write into our region.
    fn read_paged_local(
        &self,
        owner: &Arc<Shared>,
        op: &PagedReadOp<'_>,
        runs: &[(u64, u64, u64)],
        dst_device: bool,
    ) -> Result<Transfer, SubmitError> {
        let checked = source_runs(owner, op.src.region, op.src.key, runs, dst_device);
        let result = match checked {
            Err(reason) => Err(TransferError::Rejected(reason)),
            Ok(SourceRuns::Device { region_len }) => {
                let handle = MrHandle { engine: owner.id, region: RegionId(op.src.region), len: region_len };
                let destination = self.read_destination(
                    &super::ReadOp { dst: op.dst, dst_offset: 0, src: op.src, src_offset: 0, len: 1, imm: None },
                    dst_device,
                )?;
                let paged = PagedWriteOp {
                    src: &handle,
                    dst: &destination,
                    page_bytes: op.page_bytes,
                    src_pages: &[],
                    dst_pages: &[],
                    imm: op.imm,
                };
                return DeviceWriter { shared: owner }.write_runs(&paged, runs);
            }
            Ok(SourceRuns::Host(sources)) => {
                let regions = self.shared.regions.read().unwrap();
                let placed =
                    sources.iter().all(|(dst_offset, source)| regions.place_from(op.dst.region, *dst_offset, source));
                // Deregistered since the submission's check.
                if placed {
                    Ok(())
                } else {
                    Err(TransferError::Rejected(RejectReason::UnknownRegion))
                }
            }
        };
        if let (Ok(()), Some(imm)) = (result, op.imm) {
            self.shared.imms.bump(imm, &self.shared.jobs);
        }
        let state = self.shared.new_transfer(1);
        state.part_done(result);
        Ok(Transfer { state })
    }

    /// An owner in another process: one request per [`READ_PIECES_PER_REQUEST_MAX`] pieces, each
    /// as its frames; completes once every request was answered, counting `imm` then.
    fn read_paged_remote(
        &self,
        peer: EngineId,
        op: &PagedReadOp<'_>,
        geometry: Geometry,
        pages: &[(u64, u64)],
        runs: &[(u64, u64, u64)],
        dst_device: bool,
    ) -> Result<Transfer, SubmitError> {
        let shared = &self.shared;
        let state = &shared.read;
        let per_request = (READ_PIECES_PER_REQUEST_MAX as u64 / geometry.planes).max(1) as usize;
        let chunks: Vec<&[(u64, u64)]> = pages.chunks(per_request).collect();
        if state.pending_count.load(Ordering::Acquire) + chunks.len() > READ_REQUESTS_IN_FLIGHT_MAX {
            return Err(SubmitError::Invalid(format!(
                "{READ_REQUESTS_IN_FLIGHT_MAX} reads outstanding at most, and this one needs {} more: wait for some to complete",
                chunks.len()
            )));
        }
        if !shared.peers.read().unwrap().contains_key(&peer) {
            return Err(SubmitError::UnknownPeer(peer.0));
        }
        let (src_region, src_key) = (op.src.region, op.src.key);
        let dst_key = self.region_key(op.dst)?;
        if dst_device {
            self.announce_destination(peer, op.dst, dst_key);
        }
        let total_bytes: u64 = runs.iter().map(|r| r.2).sum();
        // Every request's answer completes one part of `inner`; the caller's transfer (and the
        // immediate) follow once all did.
        let inner = shared.new_internal_transfer(chunks.len().max(1));
        if chunks.is_empty() {
            inner.part_done(Ok(()));
        }
        let transfer = match op.imm {
            None => inner.clone(),
            Some(imm) => {
                let outer = shared.new_transfer(1);
                let (weak, done) = (Arc::downgrade(shared), outer.clone());
                Transfer { state: inner.clone() }.on_complete(move |result| {
                    if let (Ok(()), Some(shared)) = (result, weak.upgrade()) {
                        shared.imms.bump(imm, &shared.jobs);
                    }
                    done.part_done(result);
                });
                outer
            }
        };
        for chunk in chunks {
            let request = PagedRequest {
                src_region,
                src_key,
                dst_region: op.dst.region.0,
                dst_key,
                dst_device,
                geometry,
                pages: chunk.to_vec(),
            };
            let req = state.next_req.fetch_add(1, Ordering::Relaxed);
            let frames = request.frames();
            let delivered = shared.new_transfer(frames.len());
            // A frame that could not be delivered means the owner never assembles the request:
            // fail it now.
            {
                let weak = Arc::downgrade(shared);
                Transfer { state: delivered.clone() }.on_complete(move |result| match (result, weak.upgrade()) {
                    (Err(TransferError::PeerUnreachable), Some(shared)) => fail_unanswered(&shared, req),
                    (Err(e), Some(shared)) => finish_pending(&shared, req, Err(e)),
                    _ => {}
                });
            }
            let bytes = geometry.page_bytes * geometry.planes * chunk.len() as u64;
            let started = Instant::now();
            let allowance = shared.config.idle_timeout * 2
                + Duration::from_secs_f64(bytes.min(total_bytes) as f64 / READ_FLOOR_BYTES_PER_SEC as f64);
            let pending = Pending { peer, transfer: inner.clone(), imm: None, started, deadline: started + allowance };
            state.pending.lock().unwrap().insert(req, pending);
            state.pending_count.fetch_add(1, Ordering::AcqRel);
            state.requests_sent.fetch_add(1, Ordering::Relaxed);
            for (index, half, words) in frames {
                let message =
                    ReadMessage { from: shared.id, req, body: Body::Paged { index, half, words, dst_device } };
                match control_part_with(shared, peer, message, delivered.clone()) {
                    Some(part) => shared.route(part, None),
                    None => delivered.part_done(Err(TransferError::PeerUnreachable)),
                }
            }
        }
        Ok(Transfer { state: transfer })
    }
}

/// A checked source: host bytes per run (destination offset, bytes), or device memory.
enum SourceRuns {
    Host(Vec<(u64, Source)>),
    Device { region_len: u64 },
}

/// The owner's check of every run's source: region, key, bounds (as a write into the region is
/// checked). Host memory (and a host destination): the bytes of each run.
fn source_runs(
    owner: &Arc<Shared>,
    region: u32,
    key: u64,
    runs: &[(u64, u64, u64)],
    dst_device: bool,
) -> Result<SourceRuns, RejectReason> {
    let regions = owner.regions.read().unwrap();
    let found = regions.get(RegionId(region)).ok_or(RejectReason::UnknownRegion)?;
    if found.key != RegionKey(key) {
        return Err(RejectReason::BadKey);
    }
    if runs.iter().any(|&(_, so, len)| !check_range(so, len, found.len)) {
        return Err(RejectReason::OutOfBounds);
    }
    if found.device.is_some() || dst_device {
        return Ok(SourceRuns::Device { region_len: found.len });
    }
    Ok(SourceRuns::Host(runs.iter().map(|&(d, s, len)| (d, Source::from_region(found, s, len))).collect()))
}

/// Owner side: a frame of a batched request arrived from `from` (a known peer).
pub(crate) fn take_frame(
    shared: &Arc<Shared>,
    from: EngineId,
    req: u64,
    (index, half, words, dst_device): (u32, u32, [u64; 4], bool),
) -> Option<crate::engine::part::Part> {
    let state = &shared.read;
    // A frame of a request served already (resent after a connection failed): answer again once
    // (on its first frame), write nothing.
    let known = state.served.lock().unwrap().get(&from).and_then(|s| s.known(req));
    if let Some(outcome) = known {
        state.duplicates.fetch_add(1, Ordering::Relaxed);
        return match (outcome, index) {
            (Some(outcome), 0) => super::reply_part(shared, from, req, outcome),
            _ => None,
        };
    }
    let (taken, evicted) = state.assemblies.lock().unwrap().take(from, req, index, half, words, dst_device);
    for (reader, old) in evicted {
        refuse_unadmitted(shared, reader, old, RejectReason::TooManyMessages);
    }
    let request = match taken {
        Taken::Partial => return None,
        Taken::Refused(reason) => return refuse_unadmitted(shared, from, req, reason),
        Taken::Complete(Err(reason)) => return refuse_unadmitted(shared, from, req, reason),
        Taken::Complete(Ok(request)) => request,
    };
    let admission = state.served.lock().unwrap().entry(from).or_default().admit(req);
    if admission != super::Admission::New {
        state.duplicates.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    serve_paged(shared, from, req, request)
}

/// Refuses a request never admitted (remembered as refused, so a resent frame is answered so).
fn refuse_unadmitted(
    shared: &Arc<Shared>,
    from: EngineId,
    req: u64,
    reason: RejectReason,
) -> Option<crate::engine::part::Part> {
    shared.read.served.lock().unwrap().entry(from).or_default().admit(req);
    let reply = refuse(shared, from, req, reason);
    if let Some(part) = reply {
        // Not necessarily the worker's reply slot (an eviction answers another reader): route it.
        shared.route(part, None);
    }
    None
}

/// Owner side: checks every piece of a whole request, then writes them back as one paged write
/// (off the worker) and answers once it completed.
fn serve_paged(
    shared: &Arc<Shared>,
    from: EngineId,
    req: u64,
    request: PagedRequest,
) -> Option<crate::engine::part::Part> {
    let PagedRequest { src_region, src_key, dst_region, dst_key, dst_device, geometry, pages } = request;
    // The reader checked the destination against its region; the owner checks its own source
    // here (the reader's receiver checks the destination again where the bytes land).
    if (pages.len() as u64).saturating_mul(geometry.planes) > READ_PIECES_PER_REQUEST_MAX as u64 {
        return refuse(shared, from, req, RejectReason::MessageTooLarge);
    }
    let runs = match geometry.runs(&pages, u64::MAX, u64::MAX) {
        Ok(runs) => runs,
        Err(_) => return refuse(shared, from, req, RejectReason::OutOfBounds),
    };
    let sources = match source_runs(shared, src_region, src_key, &runs, dst_device) {
        Ok(sources) => sources,
        Err(reason) => return refuse(shared, from, req, reason),
    };
    let end = runs.iter().map(|&(d, _, len)| d + len).max().unwrap_or(0);
    let destination = match destination_for(shared, from, dst_region, dst_key, dst_device, end) {
        Ok(destination) => destination,
        Err(reason) => return refuse(shared, from, req, reason),
    };
    // The write may wait for room in the lanes', the copy or the staging queues: not on a
    // worker, nor on the completion thread (see `write_back`).
    let queued_runs = runs.len().max(1);
    let shared_for_job = shared.clone();
    let job: WriteBack = Box::new(move || {
        let shared = &shared_for_job;
        let submitted = match sources {
            SourceRuns::Device { region_len } => {
                let handle = MrHandle { engine: shared.id, region: RegionId(src_region), len: region_len };
                let paged = PagedWriteOp {
                    src: &handle,
                    dst: &destination,
                    page_bytes: geometry.page_bytes,
                    src_pages: &[],
                    dst_pages: &[],
                    imm: None,
                };
                DeviceWriter { shared }.write_runs(&paged, &runs).map(|t| t.state)
            }
            SourceRuns::Host(sources) => {
                let transfer = shared.new_transfer(sources.len().max(1));
                if sources.is_empty() {
                    transfer.part_done(Ok(()));
                }
                for (dst_offset, source) in sources {
                    let kind = write_kind(&destination, dst_offset, None);
                    dispatch_part(shared, PartSpec { peer: from, kind, source, lane: None }, transfer.clone());
                }
                Ok(transfer)
            }
        };
        match submitted {
            Ok(transfer) => answer_when_written(shared, from, req, &transfer),
            Err(e) => {
                tracing::warn!(reader = from.0, error = %e, "a batched read could not be written");
                answer_now(shared, from, req, Outcome::WriteFailed);
            }
        }
    });
    if !shared.read.write_backs.submit(job, queued_runs) {
        return refuse(shared, from, req, RejectReason::TooManyMessages);
    }
    shared.read.requests_served.fetch_add(1, Ordering::Relaxed);
    None
}

#[cfg(test)]
mod tests;
