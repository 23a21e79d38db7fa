//! READ, a one-sided pull: a reader names a range of a peer's registered region (by its
//! descriptor: region, key, bounds) and a range of its own, and the bytes come to it.
//!
//! Why a request and a write, not a new way to move bytes: the owner of the source checks the
//! request exactly as it checks a write into that region (region, key, bounds, under the region
//! table's lock: the key of a descriptor authorises reads as it authorises writes), then writes
//! the range into the reader's destination as an ordinary host write. So every host route
//! carries READ's bytes (the pull route, shared-memory rings, UDP), with their checks at the
//! reader, their failover and their fault injection; nothing new reaches the wire but two
//! control frames.
//!
//! How, for a peer in another process: the reader sends a `Request` frame (the codec of
//! [`crate::engine::control`], tag `ACRD`) into the owner's control region naming the source
//! range and the reader's destination (region, key, offset). The owner's worker hands it to
//! [`serve`], which checks the source, writes the range into the destination (split over lanes
//! as a large write is), and answers `Reply` once that write completed, or at once with the
//! refusal. The reader's [`crate::Transfer`] completes on the reply; its immediate, if any, is
//! counted at the reader then, after every byte landed. A peer in this process: one memcpy
//! with the same checks, on the calling thread.
//!
//! Exactly once: a request frame resent after a connection failed reaches the owner twice. The
//! owner remembers the request ids it took per reader (the most recent
//! [`READ_SERVED_REMEMBERED`]): a duplicate of a read in progress is ignored (the first one's
//! reply will come), a duplicate of a finished one is answered again with the same outcome,
//! and nothing is written twice. A reply for a read no longer pending is counted and ignored.
//!
//! Bounds: the owner must know the reader (`add_peer`), or it cannot answer and ignores the
//! request. A reader waits at most twice the engine's idle timeout plus the time the bytes
//! take at [`READ_FLOOR_BYTES_PER_SEC`]; past that the read fails with
//! [`TransferError::NoReply`] naming the owner. A request frame that could not be delivered
//! fails the read at once.
//!
//! Device memory on either side: the owner's write back is a device write
//! ([`crate::engine::device::DeviceWriter::write_device`]), so [`choose`] picks its route from
//! the table's device rows, after the same key and bounds check of the source. In this process:
//! one copy-engine copy ([`Route::CopyEngine`]), its immediate counted at the reader after the
//! copy completed. Across processes: a device source bound for host memory is staged
//! ([`Route::Staged`]); a device destination on this host is written through CUDA IPC
//! ([`Route::CopyEngineIpc`]) once the reader announced its IPC handle to the owner
//! ([`dst_info`]: a request frame has no room for it), and lands through the reader's pinned
//! slots ([`Route::Landing`]) until then, or from another host. The request says that its
//! destination is device memory in its flags ([`DST_DEVICE`]). The reader counts its
//! immediate on the reply, which the owner sends once its write completed, as on the host path.
//!
//! Frame layout (words and halves of the control codec):
//!
//! | kind | words | halves |
//! |---|---|---|
//! | `Request` (1), flags [`DST_DEVICE`] | src key, dst key, src offset + len bits 0..24 << 40, dst offset + len bits 24..48 << 40 | src region, dst region |
//! | `Reply` (2) | zero | outcome code, zero |
//! | `DstInfo` (3), one of [`dst_info::DST_INFO_FRAMES`] | a quarter of the announcement | dst region, frame index |
//! | `Paged` (4), flags [`DST_DEVICE`] | see [`paged`] | per frame, frame index |
//!
//! Offsets are below 2^40 ([`crate::REGION_BYTES_MAX`]), so the length shares their words.
//!
//! A batched READ ([`paged`], [`Engine::read_paged`]) names many pieces in one request (a page
//! map with strides, repeated over planes), sent as several `Paged` frames; the owner checks
//! every piece, writes them back as one paged write and answers once with `Reply`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use accord_proto::wire::RejectReason;
use accord_proto::{RegionId, RegionKey};

pub(crate) mod dst_info;
mod limits;
pub(crate) mod paged;
pub(crate) mod state;

pub use dst_info::READ_DST_INFOS_KEPT;
pub use limits::{READ_PIECES_PER_REQUEST_MAX, READ_REQUESTS_IN_FLIGHT_MAX};
pub use paged::{
    PagedReadOp, READ_ASSEMBLIES_MAX, READ_ASSEMBLY_FRAMES_MAX, READ_WRITE_BACKS_QUEUED_MAX,
    READ_WRITE_BACK_RUNS_QUEUED_MAX,
};
use state::Pending;
#[cfg(test)]
use state::ServedReads;
pub(crate) use state::{Admission, Outcome, ReadState};
pub use state::{ReadStats, READ_SERVED_REMEMBERED};

use crate::address::{DeviceRegionInfo, EngineId, MrDescriptor};
use crate::completion::{Transfer, TransferState};
use crate::engine::control::{ControlFrame, FrameError, RouteTag, CONTROL_MESSAGE_BYTES};
use crate::engine::device::DeviceWriter;
use crate::engine::ops::SHARD_ALIGN_BYTES;
use crate::engine::part::{write_kind, Part, PartKind};
use crate::engine::route::dispatch::{dispatch_part, PartSpec};
use crate::engine::route::{choose, Destination, Locality, Operation, Route, RouteInputs, RouteSwitches, SourceMemory};
use crate::engine::shared::{local_engine, Shared};
use crate::engine::{Engine, WriteOp};
use crate::error::{SubmitError, TransferError};
use crate::memory::{check_range, MrHandle, Region, RegionTable, Source};

/// The slowest rate a reader allows the owner's write when it bounds its wait (on top of twice
/// the idle timeout): a read of `len` bytes waits at most `len / READ_FLOOR_BYTES_PER_SEC` more.
pub const READ_FLOOR_BYTES_PER_SEC: u64 = 64 << 20;

const REQUEST: u8 = 1;
const REPLY: u8 = 2;
/// A request's flag: the reader's destination is device memory (the owner's write back then
/// takes a device route).
pub(crate) const DST_DEVICE: u8 = 1;
const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
const LEN_HALF_BITS: u32 = 24;
const LEN_HALF_MASK: u64 = (1 << LEN_HALF_BITS) - 1;

/// A one-sided read: `len` bytes of the peer's region `src` at `src_offset` land in the local
/// region `dst` at `dst_offset`; when `imm` is set, this engine's counter for it moves once every
/// byte landed (at the reader: the owner counts nothing).
#[derive(Copy, Clone, Debug)]
pub struct ReadOp<'a> {
    /// Local destination region (host or device memory).
    pub dst: &'a MrHandle,
    /// Byte offset in the destination.
    pub dst_offset: u64,
    /// Remote source region, as its owner described it (host or device memory).
    pub src: &'a MrDescriptor,
    /// Byte offset in the source.
    pub src_offset: u64,
    /// Bytes to read (at least one).
    pub len: u64,
    /// Immediate counted here once the bytes landed.
    pub imm: Option<u32>,
}

/// A request's fields.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) src_region: u32,
    pub(crate) src_key: u64,
    pub(crate) src_offset: u64,
    pub(crate) dst_region: u32,
    pub(crate) dst_key: u64,
    pub(crate) dst_offset: u64,
    pub(crate) len: u64,
    /// The destination is device memory ([`DST_DEVICE`]).
    pub(crate) dst_device: bool,
}

/// One frame of this route.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    Request(Request),
    Reply(Outcome),
    /// Frame `index` of an announcement of the device region `region` ([`dst_info`]).
    DstInfo {
        region: u32,
        index: u32,
        words: [u64; 4],
    },
    /// Frame `index` of a batched request ([`paged`]): its first half-word and words, and
    /// whether the destination is device memory.
    Paged {
        index: u32,
        half: u32,
        words: [u64; 4],
        dst_device: bool,
    },
}

/// One message: the sender's claim `from`, the reader's request id `req`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadMessage {
    pub(crate) from: EngineId,
    pub(crate) req: u64,
    pub(crate) body: Body,
}

impl ReadMessage {
    /// The frame's bytes; `None` when an offset or the length does not fit the layout.
    pub(crate) fn encode(&self) -> Option<[u8; CONTROL_MESSAGE_BYTES]> {
        let frame = match self.body {
            Body::Request(r) => {
                if r.src_offset > OFFSET_MASK || r.dst_offset > OFFSET_MASK || r.len >> (2 * LEN_HALF_BITS) != 0 {
                    return None;
                }
                let words = [
                    r.src_key,
                    r.dst_key,
                    r.src_offset | (r.len & LEN_HALF_MASK) << OFFSET_BITS,
                    r.dst_offset | (r.len >> LEN_HALF_BITS) << OFFSET_BITS,
                ];
                let frame = ControlFrame::new(RouteTag::Read, REQUEST, self.from, self.req);
                let flags = if r.dst_device { DST_DEVICE } else { 0 };
                ControlFrame { words, halves: [r.src_region, r.dst_region], flags, ..frame }
            }
            Body::Reply(outcome) => {
                let frame = ControlFrame::new(RouteTag::Read, REPLY, self.from, self.req);
                ControlFrame { halves: [outcome.code(), 0], ..frame }
            }
            Body::DstInfo { region, index, words } => {
                let frame = ControlFrame::new(RouteTag::Read, dst_info::DST_INFO, self.from, self.req);
                ControlFrame { words, halves: [region, index], ..frame }
            }
            Body::Paged { index, half, words, dst_device } => {
                let frame = ControlFrame::new(RouteTag::Read, paged::PAGED, self.from, self.req);
                let flags = if dst_device { DST_DEVICE } else { 0 };
                ControlFrame { words, halves: [half, index], flags, ..frame }
            }
        };
        Some(frame.encode())
    }

    /// Parses one frame placed at `offset` of the control region.
    pub(crate) fn decode(offset: u64, bytes: &[u8]) -> Result<ReadMessage, FrameError> {
        let frame = ControlFrame::decode(offset, bytes)?;
        if frame.route != RouteTag::Read {
            return Err(FrameError::UnknownRoute);
        }
        let flags_known = match frame.kind {
            REQUEST | paged::PAGED => DST_DEVICE,
            _ => 0,
        };
        if frame.flags & !flags_known != 0 {
            return Err(FrameError::Reserved);
        }
        let body = match frame.kind {
            REQUEST => {
                let [src_key, dst_key, src_word, dst_word] = frame.words;
                let len = (src_word >> OFFSET_BITS) | (dst_word >> OFFSET_BITS) << LEN_HALF_BITS;
                Body::Request(Request {
                    src_region: frame.halves[0],
                    src_key,
                    src_offset: src_word & OFFSET_MASK,
                    dst_region: frame.halves[1],
                    dst_key,
                    dst_offset: dst_word & OFFSET_MASK,
                    len,
                    dst_device: frame.flags & DST_DEVICE != 0,
                })
            }
            REPLY if frame.words == [0; 4] && frame.halves[1] == 0 => Body::Reply(Outcome::from_code(frame.halves[0])),
            REPLY => return Err(FrameError::Field("a read reply carries only its outcome")),
            dst_info::DST_INFO if frame.halves[1] < dst_info::DST_INFO_FRAMES => {
                Body::DstInfo { region: frame.halves[0], index: frame.halves[1], words: frame.words }
            }
            dst_info::DST_INFO => return Err(FrameError::Field("a destination announcement has 4 frames")),
            paged::PAGED => Body::Paged {
                index: frame.halves[1],
                half: frame.halves[0],
                words: frame.words,
                dst_device: frame.flags & DST_DEVICE != 0,
            },
            other => return Err(FrameError::Kind(other)),
        };
        Ok(ReadMessage { from: frame.from, req: frame.req, body })
    }
}

/// The owner's check of a read's source: region, key and bounds, exactly as a write into the
/// region is checked ([`RegionTable::check_write`]), but device memory is allowed (a write into
/// device memory is checked by the copy routes; a read from it is copied by them).
fn check_source(
    regions: &RegionTable,
    id: RegionId,
    key: RegionKey,
    offset: u64,
    len: u64,
) -> Result<&Region, RejectReason> {
    let region = regions.get(id).ok_or(RejectReason::UnknownRegion)?;
    if region.key != key {
        return Err(RejectReason::BadKey);
    }
    if !check_range(offset, len, region.len) {
        return Err(RejectReason::OutOfBounds);
    }
    Ok(region)
}

/// The source of an owner's write back when either side is device memory.
struct DeviceSource {
    region: RegionId,
    region_len: u64,
    offset: u64,
}

/// Owner side: writes `len` bytes of `src` into the reader's `destination` at `dst_offset` as
/// a device write, by the route [`choose`] picks (see the module's documentation).
fn write_device_to_reader(
    owner: &Arc<Shared>,
    src: &DeviceSource,
    destination: &MrDescriptor,
    dst_offset: u64,
    len: u64,
    imm: Option<u32>,
) -> Result<Transfer, SubmitError> {
    let handle = MrHandle { engine: owner.id, region: src.region, len: src.region_len };
    let op = WriteOp { src: &handle, src_offset: src.offset, dst: destination, dst_offset, len, imm };
    DeviceWriter { shared: owner }.write_device(&op)
}

impl Engine {
    /// A one-sided read (see [`ReadOp`]): the owner of `op.src` checks region, key and bounds
    /// as it checks a write into that region, then its bytes land in `op.dst`. Host or device
    /// memory on either side (a device side makes the owner's write a device write: see the
    /// module's documentation). A peer in another process must have
    /// added this engine as a peer (it answers over the transport); the read fails with
    /// [`TransferError::NoReply`] if it does not answer in time.
    pub fn read(&self, op: &ReadOp<'_>) -> Result<Transfer, SubmitError> {
        if op.len == 0 {
            return Err(SubmitError::Invalid("a read of zero bytes: give len of at least 1".into()));
        }
        if !check_range(op.src_offset, op.len, op.src.len) {
            return Err(SubmitError::Invalid(format!(
                "remote source bytes {}..{}+{} fall outside the remote region of {} bytes: fix the offset or length",
                op.src_offset, op.src_offset, op.len, op.src.len
            )));
        }
        let dst_device = self.check_read_destination(op)?;
        let peer = op.src.engine;
        self.check_peer(peer)?;
        let local = self.shared.same_process_engine(peer, self.shared.config.force_network);
        match local {
            Some(owner) => self.read_local(&owner, op, dst_device),
            None => self.read_remote(peer, op, dst_device),
        }
    }

    /// Counters of READ, both sides.
    pub fn read_stats(&self) -> ReadStats {
        self.shared.read.stats()
    }

    /// The local destination: this engine's, in bounds. Whether it is device memory.
    fn check_read_destination(&self, op: &ReadOp<'_>) -> Result<bool, SubmitError> {
        if op.dst.engine != self.id() {
            return Err(SubmitError::UnknownSource);
        }
        let regions = self.shared.regions.read().unwrap();
        let region = regions.get(op.dst.region).ok_or(SubmitError::UnknownSource)?;
        if !check_range(op.dst_offset, op.len, region.len) {
            return Err(SubmitError::Invalid(format!(
                "local destination bytes {}..{}+{} fall outside the local region of {} bytes: fix the offset or length",
                op.dst_offset, op.dst_offset, op.len, region.len
            )));
        }
        Ok(region.device.is_some())
    }

    /// A peer in this process: check the source as a write into it is checked, copy, count.
    /// Device memory on either side: the owner's device write into the reader's region (one
    /// copy-engine copy; its immediate counted here after the copy completed).
    fn read_local(&self, owner: &Arc<Shared>, op: &ReadOp<'_>, dst_device: bool) -> Result<Transfer, SubmitError> {
        let (src_region, src_key) = (RegionId(op.src.region), RegionKey(op.src.key));
        let device_source = {
            let regions = owner.regions.read().unwrap();
            check_source(&regions, src_region, src_key, op.src_offset, op.len).map(|region| {
                (region.device.is_some() || dst_device).then_some(DeviceSource {
                    region: src_region,
                    region_len: region.len,
                    offset: op.src_offset,
                })
            })
        };
        let result = match device_source {
            Ok(Some(src)) => {
                let destination = self.read_destination(op, dst_device)?;
                return write_device_to_reader(owner, &src, &destination, op.dst_offset, op.len, op.imm);
            }
            // Refused as the transfer's outcome, as a write into the region would be.
            Err(reason) => Err(TransferError::Rejected(reason)),
            Ok(None) => copy_local(owner, &self.shared, op),
        };
        if let (Ok(()), Some(imm)) = (result, op.imm) {
            self.shared.imms.bump(imm, &self.shared.jobs);
        }
        let state = self.shared.new_transfer(1);
        state.part_done(result);
        Ok(Transfer { state })
    }

    /// The descriptor of the read's destination as the owner's write presents it: key and
    /// bounds of the local region, and whether it is device memory (its GPU and mapping are
    /// looked up where the copy runs: this process's region table, or the landing slots).
    fn read_destination(&self, op: &ReadOp<'_>, dst_device: bool) -> Result<MrDescriptor, SubmitError> {
        Ok(MrDescriptor {
            engine: self.id(),
            region: op.dst.region.0,
            key: self.region_key(op.dst)?,
            len: op.dst.len,
            device: dst_device.then_some(DeviceRegionInfo { ordinal: 0, alloc_offset: 0, ipc: None }),
            shared: None,
        })
    }

    /// A peer in another process: send the request, complete on its reply.
    fn read_remote(&self, peer: EngineId, op: &ReadOp<'_>, dst_device: bool) -> Result<Transfer, SubmitError> {
        let shared = &self.shared;
        let state = &shared.read;
        if state.pending_count.load(Ordering::Acquire) >= READ_REQUESTS_IN_FLIGHT_MAX {
            return Err(SubmitError::Invalid(format!(
                "{READ_REQUESTS_IN_FLIGHT_MAX} reads outstanding already: wait for some to complete"
            )));
        }
        let request = Request {
            src_region: op.src.region,
            src_key: op.src.key,
            src_offset: op.src_offset,
            dst_region: op.dst.region.0,
            dst_key: self.region_key(op.dst)?,
            dst_offset: op.dst_offset,
            len: op.len,
            dst_device,
        };
        if dst_device {
            self.announce_destination(peer, op.dst, request.dst_key);
        }
        let req = state.next_req.fetch_add(1, Ordering::Relaxed);
        let message = ReadMessage { from: shared.id, req, body: Body::Request(request) };
        let Some(frame) = control_part(shared, peer, message) else {
            return Err(SubmitError::UnknownPeer(peer.0));
        };
        // The request's own delivery failing means the owner never saw it: fail the read now.
        {
            let weak = Arc::downgrade(shared);
            Transfer { state: frame.transfer.clone() }.on_complete(move |result| match (result, weak.upgrade()) {
                (Err(TransferError::PeerUnreachable), Some(shared)) => fail_unanswered(&shared, req),
                (Err(e), Some(shared)) => finish_pending(&shared, req, Err(e)),
                _ => {}
            });
        }
        let transfer = shared.new_transfer(1);
        let started = Instant::now();
        let allowance =
            shared.config.idle_timeout * 2 + Duration::from_secs_f64(op.len as f64 / READ_FLOOR_BYTES_PER_SEC as f64);
        let pending = Pending { peer, transfer: transfer.clone(), imm: op.imm, started, deadline: started + allowance };
        state.pending.lock().unwrap().insert(req, pending);
        state.pending_count.fetch_add(1, Ordering::AcqRel);
        state.requests_sent.fetch_add(1, Ordering::Relaxed);
        shared.route(frame, None);
        Ok(Transfer { state: transfer })
    }

    /// Announces the device region `dst` (with `key`) to `owner` once, so that its writes for
    /// our reads can map it through CUDA IPC ([`dst_info`]). Best effort: a region the driver
    /// does not export, or an announcement lost, leaves those writes on the landing route.
    fn announce_destination(&self, owner: EngineId, dst: &MrHandle, key: u64) {
        let shared = &self.shared;
        // An owner in this process (the network forced) could not open our handle: CUDA
        // refuses to map an IPC handle in the process that exported it; one on another host
        // cannot either. Their writes land.
        if local_engine(owner).is_some() || !shared.peer_on_this_host(owner) {
            return;
        }
        if !shared.read.dst_infos.should_announce(owner, dst.region.0, key) {
            return;
        }
        let found = {
            let regions = shared.regions.read().unwrap();
            regions.get(dst.region).and_then(|r| r.device.map(|ordinal| (r.base as u64, r.len as usize, ordinal)))
        };
        let Some((base, len, ordinal)) = found else { return };
        let info = self.device_region_info(base, len, ordinal).ok();
        let Some(frames) = info.and_then(|i| dst_info::encode(key, len as u64, &i)) else { return };
        let id = shared.read.next_req.fetch_add(1, Ordering::Relaxed);
        for (index, words) in frames.into_iter().enumerate() {
            let body = Body::DstInfo { region: dst.region.0, index: index as u32, words };
            if let Some(part) = control_part(shared, owner, ReadMessage { from: shared.id, req: id, body }) {
                shared.route(part, None);
            }
        }
    }

    /// The key of a local region (what the owner's write into it must present).
    fn region_key(&self, handle: &MrHandle) -> Result<u64, SubmitError> {
        let regions = self.shared.regions.read().unwrap();
        Ok(regions.get(handle.region).ok_or(SubmitError::UnknownSource)?.key.0)
    }
}

/// Copies a same-process owner's source range into the reader's destination, the source checked
/// as a write into it is (region, key, bounds, host memory).
fn copy_local(owner: &Arc<Shared>, reader: &Arc<Shared>, op: &ReadOp<'_>) -> Result<(), TransferError> {
    let (src_region, src_key) = (RegionId(op.src.region), RegionKey(op.src.key));
    let source = {
        let regions = owner.regions.read().unwrap();
        regions.check_write(src_region, src_key, op.src_offset, op.len).map_err(TransferError::Rejected)?;
        let region = regions.get(src_region).ok_or(TransferError::Rejected(RejectReason::UnknownRegion))?;
        // Holds the owner's memory alive (its `keep`) while we copy, outside the owner's lock.
        Source::from_region(region, op.src_offset, op.len)
    };
    let placed = reader.regions.read().unwrap().place_from(op.dst.region, op.dst_offset, &source);
    if placed {
        Ok(())
    } else {
        // Deregistered since the submission's check.
        Err(TransferError::Rejected(RejectReason::UnknownRegion))
    }
}

/// A control frame (64 bytes into `peer`'s control region); `None` when the peer is unknown or
/// the message does not encode.
fn control_part(shared: &Arc<Shared>, peer: EngineId, message: ReadMessage) -> Option<Part> {
    control_part_with(shared, peer, message, shared.new_internal_transfer(1))
}

/// As [`control_part`], completing one part of `transfer` (a batched request's frames share
/// one).
fn control_part_with(
    shared: &Arc<Shared>,
    peer: EngineId,
    message: ReadMessage,
    transfer: Arc<TransferState>,
) -> Option<Part> {
    let control = shared.peers.read().unwrap().get(&peer)?.control;
    let bytes = message.encode()?;
    Some(Part {
        peer,
        kind: write_kind(&control, 0, None),
        source: Source::Bytes(Arc::from(&bytes[..])),
        transfer,
        tag: shared.tags.next(),
        attempts: 0,
        stranded_since: None,
    })
}

/// Completes the pending read `req` (if still pending), counting its immediate on success.
fn finish_pending(shared: &Arc<Shared>, req: u64, result: Result<(), TransferError>) {
    let Some(pending) = shared.read.pending.lock().unwrap().remove(&req) else { return };
    shared.read.pending_count.fetch_sub(1, Ordering::AcqRel);
    if let (Ok(()), Some(imm)) = (result, pending.imm) {
        shared.imms.bump(imm, &shared.jobs);
    }
    pending.transfer.part_done(result);
}

/// Fails reads whose owner stopped answering (at most once a millisecond; one atomic load when
/// none is outstanding).
pub(crate) fn sweep(shared: &Arc<Shared>) {
    let state = &shared.read;
    let now_ns = shared.epoch.elapsed().as_nanos() as u64;
    let expired =
        super::sweep::expired_if_due(&state.pending_count, &state.last_sweep_ns, now_ns, &state.pending, |p| {
            p.deadline
        });
    for req in expired {
        fail_unanswered(shared, req);
    }
}

/// Fails every read still waiting for its owner's answer with `ShutDown`: the engine is closing,
/// and with its workers gone no reply or sweep would ever end them (a waiter, such as a KV pull's
/// thread, would wait forever).
pub(crate) fn fail_all_pending(shared: &Arc<Shared>) {
    let pending: Vec<u64> = shared.read.pending.lock().unwrap().keys().copied().collect();
    for req in pending {
        finish_pending(shared, req, Err(TransferError::ShutDown));
    }
}

/// Fails the pending read `req` (if still pending) as unanswered by its owner, naming it.
fn fail_unanswered(shared: &Arc<Shared>, req: u64) {
    let Some((peer, started)) = shared.read.pending.lock().unwrap().get(&req).map(|p| (p.peer, p.started)) else {
        return;
    };
    let waited_ms = started.elapsed().as_millis() as u64;
    shared.read.unanswered.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(peer = peer.0, waited_ms, "a read got no answer from its owner");
    finish_pending(shared, req, Err(TransferError::NoReply { peer: peer.0, waited_ms }));
}

/// A frame of this route arrived (placed at `offset` of the control region): a request (owner
/// side) or a reply (reader side). Returns the frame to send back at once, if any.
pub(crate) fn serve(shared: &Arc<Shared>, offset: u64, bytes: &[u8]) -> Option<Part> {
    let state = &shared.read;
    let Ok(message) = ReadMessage::decode(offset, bytes) else {
        state.refused.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    match message.body {
        Body::Reply(outcome) => {
            take_reply(shared, message.from, message.req, outcome);
            None
        }
        Body::Request(request) => serve_request(shared, message.from, message.req, request),
        Body::Paged { index, half, words, dst_device } => {
            if !shared.peers.read().unwrap().contains_key(&message.from) {
                // We could not answer it (and would write to an engine we never agreed to know).
                state.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            paged::take_frame(shared, message.from, message.req, (index, half, words, dst_device))
        }
        Body::DstInfo { region, index, words } => {
            // Only from engines we answer (as requests): an announcement is kept memory.
            if !shared.peers.read().unwrap().contains_key(&message.from) {
                state.refused.fetch_add(1, Ordering::Relaxed);
            } else {
                state.dst_infos.take_frame(message.from, message.req, region, index, words);
            }
            None
        }
    }
}

/// Reader side: the answer to read `req`, if `from` is the engine we asked.
fn take_reply(shared: &Arc<Shared>, from: EngineId, req: u64, outcome: Outcome) {
    let asked = shared.read.pending.lock().unwrap().get(&req).map(|p| p.peer);
    if asked != Some(from) {
        shared.read.refused.fetch_add(1, Ordering::Relaxed); // stale, duplicated, or not the owner
        return;
    }
    finish_pending(shared, req, outcome.result());
}

/// Owner side: checks and serves one request (once per request id).
fn serve_request(shared: &Arc<Shared>, from: EngineId, req: u64, request: Request) -> Option<Part> {
    let state = &shared.read;
    if !shared.peers.read().unwrap().contains_key(&from) {
        // We could not answer it (and would write to an engine we never agreed to know).
        state.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(reader = from.0, "a read request from an engine not added as a peer; ignored");
        return None;
    }
    let admission = state.served.lock().unwrap().entry(from).or_default().admit(req);
    match admission {
        Admission::New => {}
        Admission::InFlight => {
            state.duplicates.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Admission::Answered(outcome) => {
            state.duplicates.fetch_add(1, Ordering::Relaxed);
            return reply_part(shared, from, req, outcome);
        }
    }
    let Request { src_region, src_key, src_offset, dst_region, dst_key, dst_offset, len, dst_device } = request;
    let source = {
        let regions = shared.regions.read().unwrap();
        match check_source(&regions, RegionId(src_region), RegionKey(src_key), src_offset, len) {
            Ok(region) if region.device.is_some() || dst_device => {
                Err(DeviceSource { region: RegionId(src_region), region_len: region.len, offset: src_offset })
            }
            Ok(region) => Ok(Source::from_region(region, src_offset, len)),
            Err(reason) => return refuse(shared, from, req, reason),
        }
    };
    let destination =
        match destination_for(shared, from, dst_region, dst_key, dst_device, dst_offset.saturating_add(len)) {
            Ok(destination) => destination,
            Err(reason) => return refuse(shared, from, req, reason),
        };
    state.requests_served.fetch_add(1, Ordering::Relaxed);
    let source = match source {
        Ok(host) => host,
        Err(device) => {
            // A device write may wait for room in the copy or staging queues: not on a worker.
            let shared_for_job = shared.clone();
            crate::completion::dispatch(&shared.jobs, move || {
                match write_device_to_reader(&shared_for_job, &device, &destination, dst_offset, len, None) {
                    Ok(transfer) => answer_when_written(&shared_for_job, from, req, &transfer.state),
                    Err(e) => {
                        tracing::warn!(reader = from.0, error = %e, "a read from or into device memory could not be written");
                        answer_now(&shared_for_job, from, req, Outcome::WriteFailed);
                    }
                }
            });
            return None;
        }
    };
    if let Some(part) = write_on_this_lane(shared, from, req, &source, &destination, dst_offset) {
        return Some(part);
    }
    // Otherwise the write is submitted from the completion thread: a worker must not block on a
    // full command queue (possibly its own) while it serves a frame.
    let shared_for_job = shared.clone();
    crate::completion::dispatch(&shared.jobs, move || {
        write_to_reader(&shared_for_job, from, req, source, &destination, dst_offset);
    });
    None
}

/// Owner side: the reader's destination as the owner's write back presents it, for bytes up to
/// `end`. A device destination on this host goes through IPC when the reader announced the
/// region (with this key), within its announced length (counted as mapped); else it lands: the
/// landing route checks and copies into the region there. (IPC only where the copy engine can
/// reach it: IPC on, the reader on this host.)
fn destination_for(
    shared: &Arc<Shared>,
    from: EngineId,
    dst_region: u32,
    dst_key: u64,
    dst_device: bool,
    end: u64,
) -> Result<MrDescriptor, RejectReason> {
    let state = &shared.read;
    let ipc = dst_device && shared.config.device_ipc && shared.peer_on_this_host(from);
    let announced = if ipc { state.dst_infos.lookup(from, dst_region, dst_key) } else { None };
    if announced.is_some_and(|a| end > a.len) {
        return Err(RejectReason::OutOfBounds);
    }
    if announced.is_some() {
        state.device_destinations_mapped.fetch_add(1, Ordering::Relaxed);
    }
    Ok(MrDescriptor {
        engine: from,
        region: dst_region,
        key: dst_key,
        len: announced.map_or(end, |a| a.len),
        device: dst_device
            .then(|| announced.map_or(DeviceRegionInfo { ordinal: 0, alloc_offset: 0, ipc: None }, |a| a.info)),
        shared: None,
    })
}

/// Owner side: refuses request `req` of `from`, remembering the refusal for duplicates.
fn refuse(shared: &Arc<Shared>, from: EngineId, req: u64, reason: RejectReason) -> Option<Part> {
    shared.read.refused.fetch_add(1, Ordering::Relaxed);
    let outcome = Outcome::Refused(reason);
    if let Some(served) = shared.read.served.lock().unwrap().get_mut(&from) {
        served.answered(req, outcome);
    }
    reply_part(shared, from, req, outcome)
}

/// Owner side: answers request `req` of `reader` with `outcome` now (from off a worker),
/// remembering it for duplicates.
fn answer_now(shared: &Arc<Shared>, reader: EngineId, req: u64, outcome: Outcome) {
    if let Some(served) = shared.read.served.lock().unwrap().get_mut(&reader) {
        served.answered(req, outcome);
    }
    if let Some(reply) = reply_part(shared, reader, req, outcome) {
        shared.route(reply, None);
    }
}

fn reply_part(shared: &Arc<Shared>, to: EngineId, req: u64, outcome: Outcome) -> Option<Part> {
    control_part(shared, to, ReadMessage { from: shared.id, req, body: Body::Reply(outcome) })
}

/// Owner side, the short path: a write that goes as one part over the transport (not split,
/// not pulled) is handed back to the worker that took the request, to go out on its own lane
/// at once, rather than through the completion thread and another worker's wake-up (one thread
/// hop fewer per small read; the `read_vs_write` example measures reads against writes).
/// `None` when the write needs [`write_to_reader`].
fn write_on_this_lane(
    shared: &Arc<Shared>,
    reader: EngineId,
    req: u64,
    source: &Source,
    destination: &MrDescriptor,
    dst_offset: u64,
) -> Option<Part> {
    let len = source.len();
    let switches = RouteSwitches::of(&shared.config);
    let locality = match () {
        _ if !switches.force_network && local_engine(reader).is_some() => Locality::SameProcess,
        _ if shared.peer_on_this_host(reader) => Locality::SameHost,
        _ => Locality::OtherHost,
    };
    let inputs = RouteInputs {
        operation: Operation::Write,
        source: SourceMemory::Host,
        destination: Destination::Host,
        locality,
        len,
        switches,
    };
    let over_transport = matches!(choose(inputs), Route::SharedMemory | Route::Udp);
    if !over_transport || (len >= shared.config.shard_bytes_min && shared.live_lanes(reader).len() > 1) {
        return None;
    }
    let transfer = shared.new_internal_transfer(1);
    answer_when_written(shared, reader, req, &transfer);
    Some(Part {
        peer: reader,
        kind: write_kind(destination, dst_offset, None),
        source: source.clone(),
        transfer,
        tag: shared.tags.next(),
        attempts: 0,
        stranded_since: None,
    })
}

/// Sends the reply to `reader`'s request `req` once `transfer` (the owner's write) completed,
/// and remembers the outcome for duplicates.
fn answer_when_written(shared: &Arc<Shared>, reader: EngineId, req: u64, transfer: &Arc<TransferState>) {
    let weak = Arc::downgrade(shared);
    Transfer { state: transfer.clone() }.on_complete(move |result| {
        let Some(shared) = weak.upgrade() else { return };
        let outcome = match result {
            Ok(()) => Outcome::Done,
            Err(TransferError::Rejected(reason)) => Outcome::Refused(reason),
            Err(_) => Outcome::WriteFailed,
        };
        answer_now(&shared, reader, req, outcome);
    });
}

/// Owner side: writes `source` into the reader's destination over the host routes (split over
/// lanes as a large write is), then answers.
fn write_to_reader(
    shared: &Arc<Shared>,
    reader: EngineId,
    req: u64,
    source: Source,
    destination: &MrDescriptor,
    dst_offset: u64,
) {
    let len = source.len();
    let lanes = shared.live_lanes(reader);
    let shard = if len < shared.config.shard_bytes_min || lanes.len() < 2 {
        len
    } else {
        len.div_ceil(lanes.len() as u64).next_multiple_of(SHARD_ALIGN_BYTES)
    };
    let mut pieces = vec![];
    let mut at = 0;
    while at < len {
        let piece = shard.min(len - at);
        pieces.push((at, piece));
        at += piece;
    }
    let transfer = shared.new_internal_transfer(pieces.len());
    answer_when_written(shared, reader, req, &transfer);
    let sharded = pieces.len() > 1;
    for (i, (at, piece)) in pieces.into_iter().enumerate() {
        let bytes = source.slice(at, piece);
        let kind: PartKind = write_kind(destination, dst_offset + at, None);
        let lane = sharded.then(|| lanes[i % lanes.len()]);
        dispatch_part(shared, PartSpec { peer: reader, kind, source: bytes, lane }, transfer.clone());
    }
}

#[cfg(test)]
mod device_tests;
#[cfg(test)]
mod tests;
