//! Transfers: validation at submission, splitting into parts (shards, page runs), routing each
//! part to memcpy (same-process peer) or a lane (network), and barriers.

use super::part::{write_kind, PartKind};
use super::route::dispatch::{dispatch_part, PartSpec};
use super::shared::local_engine;
use super::Engine;
use crate::address::{EngineId, MrDescriptor};
use crate::completion::Transfer;
use crate::error::{BarrierError, SubmitError};
use crate::memory::{check_range, MrHandle, Source};
use std::sync::Arc;
use std::time::Duration;

/// Most pages one paged write may name.
pub const PAGES_PER_WRITE_MAX: usize = 1 << 20;
/// Most destinations of one scatter.
pub const SCATTER_DESTINATIONS_MAX: usize = 4096;
/// Shards of a large write are aligned to this many bytes.
pub const SHARD_ALIGN_BYTES: u64 = 64 * 1024;

/// A one-sided write: `len` bytes of the local region `src` at `src_offset` go to the remote
/// region `dst` at `dst_offset`; when `imm` is set the peer's counter for it moves once every
/// byte landed.
#[derive(Copy, Clone, Debug)]
pub struct WriteOp<'a> {
    /// Local source region.
    pub src: &'a MrHandle,
    /// Byte offset in the source.
    pub src_offset: u64,
    /// Remote destination region.
    pub dst: &'a MrDescriptor,
    /// Byte offset in the destination.
    pub dst_offset: u64,
    /// Bytes to move.
    pub len: u64,
    /// Immediate counted at the peer once all bytes landed.
    pub imm: Option<u32>,
}

/// A paged write: page `src_pages[i]` of `src` goes to page `dst_pages[i]` of `dst`, pages of
/// `page_bytes` each (a KV-cache move). Contiguous runs go as one operation each.
#[derive(Copy, Clone, Debug)]
pub struct PagedWriteOp<'a> {
    /// Local source region.
    pub src: &'a MrHandle,
    /// Remote destination region.
    pub dst: &'a MrDescriptor,
    /// Bytes per page.
    pub page_bytes: u64,
    /// Source page indices.
    pub src_pages: &'a [u64],
    /// Destination page indices, one per source page.
    pub dst_pages: &'a [u64],
    /// Immediate counted once at the peer when every page landed.
    pub imm: Option<u32>,
}

/// A paged write with strides (as in fabric-lib's paged writes): page `i` is read at
/// `src_offset + src_pages[i] * src_stride` of `src` and lands at
/// `dst_offset + dst_pages[i] * dst_stride` of `dst`, `page_bytes` each. The strides let pages
/// be slices of larger blocks (one layer's K of a block that holds every layer, say). The
/// destination stride must be at least the page (pages must not overlap where they land); the
/// source stride may be anything, zero included. [`PagedWriteOp`] is this with both offsets
/// zero and both strides `page_bytes` (see `From`).
#[derive(Copy, Clone, Debug)]
pub struct StridedPagedWriteOp<'a> {
    /// Local source region.
    pub src: &'a MrHandle,
    /// Byte offset of source page 0.
    pub src_offset: u64,
    /// Bytes from one source page index to the next.
    pub src_stride: u64,
    /// Remote destination region.
    pub dst: &'a MrDescriptor,
    /// Byte offset of destination page 0.
    pub dst_offset: u64,
    /// Bytes from one destination page index to the next (at least `page_bytes`).
    pub dst_stride: u64,
    /// Bytes per page.
    pub page_bytes: u64,
    /// Source page indices.
    pub src_pages: &'a [u64],
    /// Destination page indices, one per source page.
    pub dst_pages: &'a [u64],
    /// Immediate counted once at the peer when every page landed.
    pub imm: Option<u32>,
}

impl<'a> From<&PagedWriteOp<'a>> for StridedPagedWriteOp<'a> {
    fn from(op: &PagedWriteOp<'a>) -> Self {
        StridedPagedWriteOp {
            src: op.src,
            src_offset: 0,
            src_stride: op.page_bytes,
            dst: op.dst,
            dst_offset: 0,
            dst_stride: op.page_bytes,
            page_bytes: op.page_bytes,
            src_pages: op.src_pages,
            dst_pages: op.dst_pages,
            imm: op.imm,
        }
    }
}

/// One destination of a scatter.
#[derive(Copy, Clone, Debug)]
pub struct ScatterDst {
    /// Remote destination region.
    pub dst: MrDescriptor,
    /// Byte offset in the destination.
    pub dst_offset: u64,
    /// Byte offset in the local source.
    pub src_offset: u64,
    /// Bytes to move.
    pub len: u64,
}

/// The pages of a strided paged write as runs `(destination offset, source offset, bytes)` (the
/// device routes' [`super::device_pieces::Piece`]), in the page map's order, consecutive pages
/// merged where they continue the previous run on both sides; every page checked (arithmetic,
/// both regions' bounds) before the caller moves anything. Pages listed block by block (every
/// plane of a block, as `accord.kv` lists them) give a run per plane of a block, equal pieces at
/// the plane strides: the copy-engine route's 2D copies (`device::copy_plan`).
pub(super) fn page_runs(op: &StridedPagedWriteOp<'_>, src_len: u64) -> Result<Vec<(u64, u64, u64)>, SubmitError> {
    let at = |side: &str, base: u64, page: u64, stride: u64, i: usize| {
        page.checked_mul(stride).and_then(|o| o.checked_add(base)).ok_or_else(|| {
            SubmitError::Invalid(format!(
                "page {i}: {side} offset {base} + page {page} x stride {stride} overflows 64 bits"
            ))
        })
    };
    let mut runs: Vec<(u64, u64, u64)> = vec![];
    for (i, (&s, &d)) in op.src_pages.iter().zip(op.dst_pages).enumerate() {
        let so = at("source", op.src_offset, s, op.src_stride, i)?;
        let doff = at("destination", op.dst_offset, d, op.dst_stride, i)?;
        if !check_range(doff, op.page_bytes, op.dst.len) {
            return Err(SubmitError::DestinationOutOfBounds {
                offset: doff,
                len: op.page_bytes,
                region_len: op.dst.len,
            });
        }
        if !check_range(so, op.page_bytes, src_len) {
            return Err(SubmitError::SourceOutOfBounds { offset: so, len: op.page_bytes, region_len: src_len });
        }
        match runs.last_mut() {
            Some((rd, rs, len)) if *rs + *len == so && *rd + *len == doff => *len += op.page_bytes,
            _ => runs.push((doff, so, op.page_bytes)),
        }
    }
    Ok(runs)
}

impl Engine {
    fn source(&self, src: &MrHandle, offset: u64, len: u64) -> Result<Source, SubmitError> {
        self.host_source(src, offset, len)?.ok_or_else(|| {
            SubmitError::Invalid("the source region is device memory where this operation needs host memory".into())
        })
    }

    /// The source range of a host region, checked; `None` when the region is device memory
    /// (one region lookup either way: writes call this on every submission).
    fn host_source(&self, src: &MrHandle, offset: u64, len: u64) -> Result<Option<Source>, SubmitError> {
        if src.engine != self.id() {
            return Err(SubmitError::UnknownSource);
        }
        let regions = self.shared.regions.read().unwrap();
        let region = regions.get(src.region).ok_or(SubmitError::UnknownSource)?;
        if region.device.is_some() {
            return Ok(None);
        }
        if !check_range(offset, len, region.len) {
            return Err(SubmitError::SourceOutOfBounds { offset, len, region_len: region.len });
        }
        Ok(Some(Source::from_region(region, offset, len)))
    }

    pub(super) fn check_peer(&self, peer: EngineId) -> Result<(), SubmitError> {
        self.shared.check_peer(peer)
    }

    /// Submits parts as one transfer; `trailer` (the immediate of a multi-part transfer) goes
    /// once every part succeeded.
    fn submit(&self, mut parts: Vec<PartSpec>, trailer: Option<PartSpec>) -> Transfer {
        if parts.is_empty() {
            parts.extend(trailer.map(|t| PartSpec { lane: None, ..t }));
            return self.submit(parts, None);
        }
        let state = self.shared.new_transfer(parts.len());
        if let Some(t) = trailer {
            let shared = self.shared.clone();
            *state.trailer.lock().unwrap() = Some(Box::new(move |st| dispatch_part(&shared, t, st)));
        }
        for p in parts {
            dispatch_part(&self.shared, p, state.clone());
        }
        Transfer { state }
    }

    /// A one-sided write. Bounds are checked here (against the local region and the remote
    /// descriptor); the peer checks region, key and bounds again before placing anything.
    /// Writes of at least `shard_bytes_min` are split across lanes (NICs and workers).
    pub fn write(&self, op: &WriteOp<'_>) -> Result<Transfer, SubmitError> {
        self.write_split(op, true)
    }

    /// A one-sided write that is never split across lanes: one part on the next lane (round
    /// robin), its immediate counted as soon as its bytes landed. A sharded write with an
    /// immediate sends the immediate as a trailer only after every shard was acknowledged (a
    /// completion-thread hop and a round trip more); callers that split a message themselves
    /// (one immediate per piece, as the NCCL plugin does) spread pieces over lanes without it.
    pub fn write_unsharded(&self, op: &WriteOp<'_>) -> Result<Transfer, SubmitError> {
        self.write_split(op, false)
    }

    fn write_split(&self, op: &WriteOp<'_>, shard: bool) -> Result<Transfer, SubmitError> {
        if !check_range(op.dst_offset, op.len, op.dst.len) {
            return Err(SubmitError::DestinationOutOfBounds {
                offset: op.dst_offset,
                len: op.len,
                region_len: op.dst.len,
            });
        }
        if op.dst.device.is_some() {
            return self.device_writer().write_device(op);
        }
        let Some(source) = self.host_source(op.src, op.src_offset, op.len)? else {
            return self.device_writer().write_device(op);
        };
        let peer = op.dst.engine;
        self.check_peer(peer)?;
        // Small writes (most of them) go whole, without listing the live lanes.
        let lanes = if !shard || op.len < self.shared.config.shard_bytes_min {
            Vec::new()
        } else {
            self.shared.live_lanes(peer)
        };
        if lanes.len() < 2 {
            let kind = write_kind(op.dst, op.dst_offset, op.imm);
            return Ok(self.submit(vec![PartSpec { peer, kind, source, lane: None }], None));
        }
        let shard = op.len.div_ceil(lanes.len() as u64).next_multiple_of(SHARD_ALIGN_BYTES);
        let mut parts = vec![];
        let mut at = 0;
        for lane in lanes {
            if at >= op.len {
                break;
            }
            let len = shard.min(op.len - at);
            let source = self.source(op.src, op.src_offset + at, len)?;
            let kind = write_kind(op.dst, op.dst_offset + at, None);
            parts.push(PartSpec { peer, kind, source, lane: Some(lane) });
            at += len;
        }
        let trailer = op.imm.map(|imm| PartSpec {
            peer,
            kind: write_kind(op.dst, op.dst_offset, Some(imm)),
            source: Source::Bytes(Arc::from(&[][..])),
            lane: None,
        });
        Ok(self.submit(parts, trailer))
    }

    /// A paged write (see [`PagedWriteOp`]); runs of consecutive pages on both sides go as one
    /// operation; the immediate is counted once, after every page landed.
    pub fn write_paged(&self, op: &PagedWriteOp<'_>) -> Result<Transfer, SubmitError> {
        self.write_paged_strided(&StridedPagedWriteOp::from(op))
    }

    /// A paged write with a base offset and a stride on each side (see
    /// [`StridedPagedWriteOp`]). Every page is checked (arithmetic, both regions' bounds, the
    /// destination stride) before anything is submitted, so a refused write places nothing.
    pub fn write_paged_strided(&self, op: &StridedPagedWriteOp<'_>) -> Result<Transfer, SubmitError> {
        if op.src_pages.len() != op.dst_pages.len() {
            return Err(SubmitError::Invalid(format!(
                "{} source pages but {} destination pages: give one destination per source page",
                op.src_pages.len(),
                op.dst_pages.len()
            )));
        }
        if op.page_bytes == 0 || op.src_pages.len() > PAGES_PER_WRITE_MAX {
            return Err(SubmitError::Invalid(format!(
                "page_bytes must be non-zero and at most {PAGES_PER_WRITE_MAX} pages named"
            )));
        }
        if op.dst_stride < op.page_bytes {
            return Err(SubmitError::Invalid(format!(
                "destination stride {} is smaller than the page ({} bytes): destination pages would overlap",
                op.dst_stride, op.page_bytes
            )));
        }
        let peer = op.dst.engine;
        self.check_peer(peer)?;
        let src_len = self.region_len(op.src)?;
        let runs = page_runs(op, src_len)?;
        if op.dst.device.is_some() || self.is_device_region(op.src)? {
            let plain = PagedWriteOp {
                src: op.src,
                dst: op.dst,
                page_bytes: op.page_bytes,
                src_pages: &[],
                dst_pages: &[],
                imm: op.imm,
            };
            return self.write_paged_device(&plain, &runs);
        }
        let mut parts = vec![];
        let single = runs.len() == 1;
        for (doff, so, len) in runs {
            let source = self.source(op.src, so, len)?;
            let kind = write_kind(op.dst, doff, if single { op.imm } else { None });
            parts.push(PartSpec { peer, kind, source, lane: None });
        }
        let trailer = op.imm.filter(|_| !single).map(|imm| PartSpec {
            peer,
            kind: write_kind(op.dst, 0, Some(imm)),
            source: Source::Bytes(Arc::from(&[][..])),
            lane: None,
        });
        Ok(self.submit(parts, trailer))
    }

    /// The length of a local region of this engine (host or device).
    fn region_len(&self, handle: &MrHandle) -> Result<u64, SubmitError> {
        if handle.engine != self.id() {
            return Err(SubmitError::UnknownSource);
        }
        let regions = self.shared.regions.read().unwrap();
        Ok(regions.get(handle.region).ok_or(SubmitError::UnknownSource)?.len)
    }

    /// Writes ranges of one local region to several peers (each destination once, each
    /// carrying `imm`); completes when every write did.
    pub fn scatter(&self, src: &MrHandle, dsts: &[ScatterDst], imm: Option<u32>) -> Result<Transfer, SubmitError> {
        if dsts.is_empty() || dsts.len() > SCATTER_DESTINATIONS_MAX {
            return Err(SubmitError::Invalid(format!("scatter needs 1..={SCATTER_DESTINATIONS_MAX} destinations")));
        }
        // Every destination is checked before anything is submitted.
        for d in dsts {
            if !check_range(d.dst_offset, d.len, d.dst.len) {
                return Err(SubmitError::DestinationOutOfBounds {
                    offset: d.dst_offset,
                    len: d.len,
                    region_len: d.dst.len,
                });
            }
            self.check_peer(d.dst.engine)?;
        }
        if self.is_device_region(src)? || dsts.iter().any(|d| d.dst.device.is_some()) {
            return self.scatter_device(src, dsts, imm);
        }
        let mut parts = vec![];
        for d in dsts {
            let source = self.source(src, d.src_offset, d.len)?;
            parts.push(PartSpec {
                peer: d.dst.engine,
                kind: write_kind(&d.dst, d.dst_offset, imm),
                source,
                lane: None,
            });
        }
        Ok(self.submit(parts, None))
    }

    /// A two-sided send of `bytes` (copied at once) into one of the peer's posted receive
    /// buffers; fails with `Rejected(NoRecvBuffer)` when the peer has none free.
    pub fn send(&self, peer: EngineId, bytes: &[u8], imm: Option<u32>) -> Result<Transfer, SubmitError> {
        self.check_peer(peer)?;
        let source = Source::Bytes(Arc::from(bytes));
        Ok(self.submit(vec![PartSpec { peer, kind: PartKind::Send { imm }, source, lane: None }], None))
    }

    /// Blocks until every engine of `peers` (this one may be listed; it is skipped) called
    /// `barrier` with the same `imm` as many times as this one. `imm` must be used for nothing
    /// else. Each peer must have been introduced with [`Engine::add_peer`].
    pub fn barrier(&self, peers: &[EngineId], imm: u32, timeout: Duration) -> Result<(), BarrierError> {
        let others: Vec<EngineId> = peers.iter().copied().filter(|p| *p != self.id()).collect();
        let mut notes = vec![];
        for &peer in &others {
            let control = match local_engine(peer) {
                Some(s) if !self.shared.config.force_network => s.control,
                _ => self.shared.peers.read().unwrap().get(&peer).ok_or(SubmitError::UnknownPeer(peer.0))?.control,
            };
            let kind = write_kind(&control, 0, Some(imm));
            let source = Source::Bytes(Arc::from(&[][..]));
            notes.push(self.submit(vec![PartSpec { peer, kind, source, lane: None }], None));
        }
        let deadline = std::time::Instant::now() + timeout;
        for n in notes {
            n.wait_timeout(deadline.saturating_duration_since(std::time::Instant::now()))?;
        }
        let expected = others.len() as u64;
        let mut seen = self.barrier_seen.lock().unwrap();
        let base = *seen.get(&imm).unwrap_or(&0);
        let counter = self.imm_counter(imm);
        let value = counter.wait(base + expected, deadline.saturating_duration_since(std::time::Instant::now()));
        if value < base + expected {
            return Err(BarrierError::Timeout { arrived: value - base, expected });
        }
        seen.insert(imm, base + expected);
        Ok(())
    }
}

#[cfg(test)]
#[path = "paged_tests.rs"]
mod paged_tests;
