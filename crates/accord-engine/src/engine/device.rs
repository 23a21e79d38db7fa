//! Device writes: validation and routing of writes whose source or destination is device memory
//! (the copies live in [`crate::device`], staging in [`crate::device::staging`]).
//!
//! Routes done (source -> destination, by where the destination region lives):
//! - device -> device, this process: one copy-engine copy between the two device addresses
//!   (peer access enabled once per GPU pair).
//! - device -> device, this host: a copy into the peer's region opened from its descriptor's
//!   CUDA IPC handle (mapping cached per peer region).
//! - host -> device, this process: `cuMemcpyHtoDAsync` from the registered host region.
//! - host -> device, this host: the same into the peer region's cached IPC mapping.
//! - device -> host, this process: `cuMemcpyDtoHAsync` into the peer's host region.
//! - device -> host, another process on this host, into a region made with
//!   [`Engine::alloc_shared`]: one `cuMemcpyDtoHAsync` into this process's mapping of the
//!   region's shared-memory file ([`super::shared_host`]; `ACCORD_DEVICE_SHARED_HOST`).
//! - device -> host, another process (this host or another one), otherwise: staged; chunks are copied
//!   into pinned slots of a bounded pool and each sent as an ordinary host write, copies
//!   overlapping sends (`ACCORD_DEVICE_STAGING_*`).
//! - host or device -> device, another process the copy engine cannot reach (another host, or
//!   this host with `ACCORD_DEVICE_IPC=0`): the landing rendezvous ([`super::landing`]). Per
//!   chunk the writer asks over control messages (64-byte writes into the peer's control
//!   region, handed by the receiving worker to the landing thread instead of being placed, so
//!   they never meet user sends or immediates); the receiver checks region, key and bounds (a
//!   refusal is `TransferError::Rejected` at the writer), grants a slot of its bounded pinned
//!   landing pool, the writer writes the chunk there (a device source is first staged through
//!   its own pool as above), the receiver copies it host-to-device, frees the slot and says
//!   done. Both engines must know each other (`add_peer`): replies go to known peers only.
//!   Chunks are the writer's `ACCORD_DEVICE_STAGING_CHUNK_BYTES`; a receiver with smaller slots
//!   refuses them (`Rejected(MessageTooLarge)`), so give both sides the same value.
//!
//! Every route sends the immediate as a zero-byte write once every byte landed (for the landing
//! route: once every chunk's host-to-device copy completed), so the receiver counts it exactly
//! once, as on the host path.
//!
//! Refused with [`SubmitError::Invalid`] (not built yet): paged writes, scatters and sends from
//! device memory.
//!
//! Known limits of the landing route: a duplicated `Ask` that arrives after its chunk was done
//! is granted again and reclaimed after the timeout; a peer is noticed gone only by the
//! transport failing or the timeout (`ACCORD_DEVICE_LANDING_TIMEOUT_MS`); one rendezvous round
//! trip per chunk (asks of later chunks overlap earlier chunks' writes and copies).
//!
//! An engine with `force_network` treats same-process peers as other processes, so with
//! `device_ipc` off one process exercises the staged route (tests do).

use std::sync::Arc;

use accord_proto::{RegionId, RegionKey};

use super::landing;
use super::ops::{dispatch_part, PartSpec};
use super::part::write_kind;
use super::shared::local_engine;
use super::{Engine, WriteOp};
use crate::address::{DeviceIpcBytes, DeviceRegionInfo, MrDescriptor};
use crate::completion::{Transfer, TransferState};
use crate::device::staging::driver::{FinishWrite, SendChunk, StagedJob, StagedSource, Stager};
use crate::device::{AfterCopy, CopyEnds, DeviceCopy, DeviceRoute, DeviceTarget};
use crate::error::{RegisterError, SubmitError};
use crate::memory::shared_file::SharedFile;
use crate::memory::{MemoryOwner, Source};

/// The local source of a device write.
#[derive(Clone, Copy)]
enum LocalSource {
    Host { addr: usize },
    Device { ptr: u64, ordinal: u32 },
}

impl Engine {
    /// The copy-engine route, opened on first use.
    pub(crate) fn device_route(&self) -> Result<Arc<DeviceRoute>, String> {
        let private = self.shared.config.private_device_contexts();
        self.device.get_or_init(|| DeviceRoute::open(private)).clone()
    }

    /// Peer regions mapped through CUDA IPC so far (a cache-miss counter; 0 without a route).
    pub fn device_mappings_opened(&self) -> u64 {
        match self.device.get() {
            Some(Ok(route)) => route.mappings_opened(),
            _ => 0,
        }
    }

    /// Counters of the pull route between processes of this host (`ACCORD_CMA`).
    pub fn cma_stats(&self) -> crate::CmaStats {
        self.shared.cma.stats()
    }

    /// Counters of the device-landing rendezvous (refused control messages, reclaimed slots).
    pub fn landing_stats(&self) -> crate::LandingStats {
        self.shared.landing.stats()
    }

    /// What a descriptor of a device region carries (registration of
    /// [`crate::MemoryKind::CudaDevice`]).
    pub(super) fn device_region_info(
        &self,
        ptr: u64,
        len: usize,
        ordinal: u32,
    ) -> Result<DeviceRegionInfo, RegisterError> {
        let route = self.device_route().map_err(RegisterError::Device)?;
        let _restore = accord_cuda::CurrentContextGuard::save();
        let exported = route.export(ptr, len, ordinal).map_err(RegisterError::Device)?;
        Ok(DeviceRegionInfo {
            ordinal,
            alloc_offset: exported.as_ref().map_or(0, |(_, offset)| *offset),
            ipc: exported.map(|(handle, _)| DeviceIpcBytes(handle.to_bytes())),
        })
    }

    /// The source range of a write from (or, for a device destination, possibly to) device
    /// memory, checked, with what keeps it alive.
    fn device_write_source(&self, op: &WriteOp<'_>) -> Result<(LocalSource, Option<MemoryOwner>), SubmitError> {
        if op.src.engine != self.id() {
            return Err(SubmitError::UnknownSource);
        }
        let regions = self.shared.regions.read().unwrap();
        let region = regions.get(op.src.region).ok_or(SubmitError::UnknownSource)?;
        match op.src_offset.checked_add(op.len) {
            Some(end) if end <= region.len => {}
            _ => {
                return Err(SubmitError::SourceOutOfBounds {
                    offset: op.src_offset,
                    len: op.len,
                    region_len: region.len,
                })
            }
        }
        let source = match region.device {
            Some(ordinal) => LocalSource::Device { ptr: region.base as u64 + op.src_offset, ordinal },
            None => LocalSource::Host { addr: region.base + op.src_offset as usize },
        };
        Ok((source, region.keep.clone()))
    }

    /// A write from or to device memory (bounds of the destination already checked; called when
    /// the destination or the local source region is device memory).
    pub(super) fn write_device(&self, op: &WriteOp<'_>) -> Result<Transfer, SubmitError> {
        let (src, src_keep) = self.device_write_source(op)?;
        let mut keep: Vec<MemoryOwner> = src_keep.into_iter().collect();
        let peer = op.dst.engine;
        let local = match () {
            _ if self.shared.config.force_network => None,
            _ if peer == self.id() => Some(self.shared.clone()),
            _ => local_engine(peer),
        };
        let remote_peer = local.is_none();
        let not_host_to_host = || SubmitError::Invalid("host to host writes do not take the device route".into());
        let ends = match local {
            Some(peer_shared) => {
                let regions = peer_shared.regions.read().unwrap();
                let refused = |reason| SubmitError::Invalid(format!("the destination refused the write: {reason:?}"));
                let (id, key) = (RegionId(op.dst.region), RegionKey(op.dst.key));
                if op.dst.device.is_some() {
                    let (ptr, ordinal) = regions.check_device_write(id, key, op.dst_offset, op.len).map_err(refused)?;
                    let target = DeviceTarget::SameProcess { ptr, ordinal };
                    match src {
                        LocalSource::Device { ptr, ordinal } => {
                            CopyEnds::DeviceToDevice { src_ptr: ptr, src_ordinal: ordinal, target }
                        }
                        LocalSource::Host { addr } => CopyEnds::HostToDevice { src_addr: addr, target },
                    }
                } else {
                    let LocalSource::Device { ptr, ordinal } = src else { return Err(not_host_to_host()) };
                    let (dst_addr, dst_keep) =
                        regions.check_host_write(id, key, op.dst_offset, op.len).map_err(refused)?;
                    keep.extend(dst_keep);
                    CopyEnds::DeviceToHost { src_ptr: ptr, src_ordinal: ordinal, dst_addr }
                }
            }
            None => {
                let address =
                    self.shared.peers.read().unwrap().get(&peer).cloned().ok_or(SubmitError::UnknownPeer(peer.0))?;
                let same_host = address.host == self.address.host;
                let through_ipc = same_host && self.shared.config.device_ipc;
                match (src, op.dst.device.is_some()) {
                    (LocalSource::Device { ptr, ordinal }, false) => match self.shared_host_mapping(op, same_host) {
                        Some(file) => {
                            let dst_addr = file.base() + op.dst_offset as usize;
                            keep.push(file);
                            CopyEnds::DeviceToHost { src_ptr: ptr, src_ordinal: ordinal, dst_addr }
                        }
                        None => return self.write_staged(op, StagedSource { ptr, ordinal, _keep: keep }),
                    },
                    (LocalSource::Host { .. }, false) => return Err(not_host_to_host()),
                    (_, true) if !through_ipc => return self.write_landed(op, src, keep),
                    (LocalSource::Device { ptr, ordinal }, true) => CopyEnds::DeviceToDevice {
                        src_ptr: ptr,
                        src_ordinal: ordinal,
                        target: DeviceTarget::SameHost { dst: *op.dst, offset: op.dst_offset },
                    },
                    (LocalSource::Host { addr }, true) => CopyEnds::HostToDevice {
                        src_addr: addr,
                        target: DeviceTarget::SameHost { dst: *op.dst, offset: op.dst_offset },
                    },
                }
            }
        };
        let route = self.device_route().map_err(SubmitError::Invalid)?;
        let state = self.shared.new_transfer(1);
        // The immediate is counted at the receiver only after the copy completed: the poller
        // sends it as a zero-byte write over the ordinary route (memcpy route in this process,
        // the transport across processes), and that write is the transfer's one part.
        // Across processes the immediate goes through a lane, promised now so that its worker
        // polls while the copy runs (see `LaneExpectation`).
        let after: Option<AfterCopy> = op.imm.map(|imm| {
            let mut spec = imm_part(op, imm);
            let shared = self.shared.clone();
            let promise =
                if remote_peer { shared.pick_lane(peer).map(|lane| shared.expect_on_lane(lane)) } else { None };
            spec.lane = promise.as_ref().map(|p| p.lane());
            Box::new(move |st: Arc<TransferState>| {
                dispatch_part(&shared, spec, st);
                drop(promise); // after the part is queued: the worker polls until it sees it
            }) as AfterCopy
        });
        let copy = DeviceCopy { ends, len: op.len, keep };
        route.copy(copy, state.clone(), after).map_err(SubmitError::Invalid)?;
        Ok(Transfer { state })
    }

    /// This process's mapping of the destination's shared-memory file, when the shared-host
    /// route applies: a peer on this host, a destination made with `alloc_shared`, the route on
    /// (`ACCORD_DEVICE_SHARED_HOST`), and the file mappable (see [`super::shared_host`]).
    fn shared_host_mapping(&self, op: &WriteOp<'_>, same_host: bool) -> Option<Arc<SharedFile>> {
        let info = op.dst.shared?;
        if !same_host || !self.shared.config.device_shared_host {
            return None;
        }
        let file = self.peer_files.mapping_or_warn(&self.shared.config.shm.dir, op.dst, info)?;
        // The descriptor's bounds were checked against its length, which the file matched.
        (op.dst_offset.checked_add(op.len)? <= file.mapped_bytes() as u64).then_some(file)
    }

    /// Page-locks a region made with [`Engine::alloc_shared`] for the copy engines of GPU
    /// `ordinal` (once; later calls return the first outcome). Call it where the GPU may wait:
    /// page-locking synchronises with work queued on the device, so the data path never does it
    /// (see [`super::shared_host`]). Unpinned, copies still work, through the driver's staging.
    pub fn pin_shared(&self, buf: &crate::MrBuffer, ordinal: u32) -> Result<(), RegisterError> {
        let file = buf.alloc.shared_file().ok_or_else(|| RegisterError::Shared("not a shared region".into()))?;
        let _restore = accord_cuda::CurrentContextGuard::save();
        let gpu = self.device_route().and_then(|route| route.gpu(ordinal)).map_err(RegisterError::Device)?;
        file.pin_with(&gpu).map_err(RegisterError::Shared)
    }

    /// Maps a same-host peer's shared region (its descriptor from [`Engine::alloc_shared`]) and
    /// page-locks the mapping for GPU `ordinal`, ahead of the first device write into it (which
    /// would otherwise map it on the fly and copy through driver staging until it is pinned).
    /// Nothing to do, and `Ok`, for a peer on another host or with `ACCORD_DEVICE_SHARED_HOST=0`.
    pub fn prepare_shared_peer(&self, dst: &MrDescriptor, ordinal: u32) -> Result<(), RegisterError> {
        let info = dst.shared.ok_or_else(|| RegisterError::Shared("the descriptor names no shared region".into()))?;
        let peer_host = self.shared.peers.read().unwrap().get(&dst.engine).map(|a| a.host.clone());
        if peer_host.as_ref() != Some(&self.address.host) || !self.shared.config.device_shared_host {
            return Ok(());
        }
        let file = self.peer_files.mapping(&self.shared.config.shm.dir, dst, info).map_err(RegisterError::Shared)?;
        let _restore = accord_cuda::CurrentContextGuard::save();
        let gpu = self.device_route().and_then(|route| route.gpu(ordinal)).map_err(RegisterError::Device)?;
        file.pin_with(&gpu).map_err(RegisterError::Shared)
    }

    /// Peers' shared region files this engine keeps mapped (the shared-host route's cache).
    pub fn shared_mappings_held(&self) -> usize {
        self.peer_files.len()
    }

    /// Device memory to a host region of another process: staged through pinned slots, each
    /// chunk an ordinary host write; the immediate once every chunk was delivered.
    fn write_staged(&self, op: &WriteOp<'_>, source: StagedSource) -> Result<Transfer, SubmitError> {
        let peer = op.dst.engine;
        self.check_peer(peer)?;
        let stager = self.stager(source.ordinal)?;
        let state = self.device_transfer(op, 1);
        let (dst, dst_offset) = (*op.dst, op.dst_offset);
        let shared = self.shared.clone();
        let send: SendChunk = Box::new(move |offset, source| {
            let chunk = shared.new_transfer(1);
            let kind = write_kind(&dst, dst_offset + offset, None);
            dispatch_part(&shared, PartSpec { peer, kind, source, lane: None }, chunk.clone());
            Transfer { state: chunk }
        });
        let user = state.clone();
        let finish: FinishWrite = Box::new(move |result| user.part_done(result));
        stager.submit(StagedJob { source, len: op.len, send, finish }).map_err(SubmitError::Invalid)?;
        Ok(Transfer { state })
    }

    /// Host or device memory into a device region the copy engine cannot reach (another host,
    /// or this host with `device_ipc` off): chunk by chunk through the receiver's landing slots
    /// ([`super::landing`]); a device source is staged through this engine's pinned slots
    /// first. The immediate goes once every chunk reached device memory.
    fn write_landed(
        &self,
        op: &WriteOp<'_>,
        src: LocalSource,
        keep: Vec<MemoryOwner>,
    ) -> Result<Transfer, SubmitError> {
        let peer = op.dst.engine;
        self.check_peer(peer)?;
        let (dst, dst_offset) = (*op.dst, op.dst_offset);
        match src {
            LocalSource::Device { ptr, ordinal } => {
                let stager = self.stager(ordinal)?;
                let state = self.device_transfer(op, 1);
                let user = state.clone();
                let finish: FinishWrite = Box::new(move |result| user.part_done(result));
                let shared = self.shared.clone();
                let send: SendChunk = Box::new(move |offset, source| {
                    landing::land_chunk(&shared, peer, dst, dst_offset + offset, source)
                });
                let source = StagedSource { ptr, ordinal, _keep: keep };
                stager.submit(StagedJob { source, len: op.len, send, finish }).map_err(SubmitError::Invalid)?;
                Ok(Transfer { state })
            }
            LocalSource::Host { addr } => {
                let chunk_bytes = self.shared.config.device_staging_chunk_bytes.max(1);
                let count = op.len.div_ceil(chunk_bytes);
                // One part per chunk (an empty write: one part, done at once).
                let state = self.device_transfer(op, count.max(1) as usize);
                if count == 0 {
                    state.part_done(Ok(()));
                }
                let owner = keep.into_iter().next();
                for index in 0..count {
                    let offset = index * chunk_bytes;
                    let len = chunk_bytes.min(op.len - offset);
                    let source = Source::Region { base: addr + offset as usize, len, _keep: owner.clone() };
                    let chunk = landing::land_chunk(&self.shared, peer, dst, dst_offset + offset, source);
                    let user = state.clone();
                    chunk.on_complete(move |result| user.part_done(result));
                }
                Ok(Transfer { state })
            }
        }
    }

    /// The user's transfer of a staged or landed write: `parts` parts, and the immediate (if
    /// any) as the transfer's trailer, sent once every part succeeded (as a sharded host write
    /// sends it), so the receiver counts it only after every byte landed.
    fn device_transfer(&self, op: &WriteOp<'_>, parts: usize) -> Arc<TransferState> {
        let state = self.shared.new_transfer(parts);
        if let Some(imm) = op.imm {
            let (shared, spec) = (self.shared.clone(), imm_part(op, imm));
            *state.trailer.lock().unwrap() = Some(Box::new(move |st| dispatch_part(&shared, spec, st)));
        }
        state
    }

    /// The staging thread, started on first use with the pool the configuration asks for.
    fn stager(&self, ordinal: u32) -> Result<&Stager, SubmitError> {
        let config = &self.shared.config;
        self.staging
            .get_or_init(|| {
                self.device_route()?;
                crate::device::cuda_staging::start_cuda_stager(
                    ordinal,
                    config.device_staging_chunk_bytes,
                    config.device_staging_chunks,
                    config.private_device_contexts(),
                )
            })
            .as_ref()
            .map_err(|e| SubmitError::Invalid(format!("device staging is unavailable: {e}")))
    }

    /// Registers host memory as if it were device memory of GPU `ordinal` (tests of the staged
    /// route with a fake copier: the "device address" is the host address).
    #[cfg(test)]
    pub(crate) fn register_fake_device(
        &self,
        base: usize,
        len: u64,
        ordinal: u32,
        keep: MemoryOwner,
    ) -> crate::MrHandle {
        let key = RegionKey(0x5eed);
        let region = crate::memory::Region { base, len, key, keep: Some(keep), device: Some(ordinal) };
        let id = self.shared.regions.write().unwrap().insert(region).expect("room for a region");
        crate::MrHandle { engine: self.id(), region: id, len }
    }

    /// Installs a staging thread before first use (tests: a fake copier over host memory).
    /// False if one was already started.
    #[cfg(test)]
    pub(crate) fn install_stager(&self, stager: Stager) -> bool {
        self.staging.set(Ok(stager)).is_ok()
    }
}

/// The zero-byte write that carries a device write's immediate.
pub(super) fn imm_part(op: &WriteOp<'_>, imm: u32) -> PartSpec {
    PartSpec {
        peer: op.dst.engine,
        kind: write_kind(op.dst, op.dst_offset, Some(imm)),
        source: Source::Bytes(Arc::from(&[][..])),
        lane: None,
    }
}
