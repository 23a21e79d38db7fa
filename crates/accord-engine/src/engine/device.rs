//! Device writes: what every route of device memory shares. A write whose source or destination
//! is device memory is validated here, described by the route layer's inputs (where the source
//! lives, what the destination is, where the peer lives) and run by the route
//! [`super::route::choose`] picks, each in its own file under `route/` (see the table there).
//! This file keeps the pieces those routes share: the copy-engine handle (opened on first use),
//! the staging thread, page-locking of shared regions, and the immediate that follows a copy.
//!
//! Every route sends the immediate as a zero-byte write once every byte landed (for the landing
//! route: once every chunk's host-to-device copy completed), so the receiver counts it exactly
//! once, as on the host path.
//!
//! Known limits of the landing route: a duplicated `Ask` that arrives after its chunk was done
//! is granted again and reclaimed after the timeout; a peer is noticed gone only by the
//! transport failing or the timeout (`ACCORD_DEVICE_LANDING_TIMEOUT_MS`); one rendezvous round
//! trip per chunk (asks of later chunks overlap earlier chunks' writes and copies).
//!
//! An engine with `force_network` treats same-process peers as other processes, so with
//! `device_ipc` off one process exercises the staged route (tests do).

use std::sync::Arc;

use super::part::write_kind;
use super::route::dispatch::{dispatch_part, PartSpec};
use super::route::{self, Destination, Locality, Operation, Route, RouteInputs, RouteSwitches, SourceMemory};
use super::shared::Shared;
use super::{Engine, WriteOp};
use crate::address::{DeviceIpcBytes, DeviceRegionInfo, EngineId, MrDescriptor};
use crate::completion::{Transfer, TransferState};
use crate::device::staging::driver::{StagedSource, Stager};
use crate::device::{CopyShape, DeviceRoute};
use crate::error::{RegisterError, SubmitError};
use crate::memory::{MemoryOwner, Source};

/// The local source of a device write.
#[derive(Clone, Copy)]
pub(crate) enum LocalSource {
    Host { addr: usize },
    Device { ptr: u64, ordinal: u32 },
}

impl LocalSource {
    /// Which memory the route layer sees.
    pub(crate) fn memory(&self) -> SourceMemory {
        match self {
            LocalSource::Host { .. } => SourceMemory::Host,
            LocalSource::Device { .. } => SourceMemory::Device,
        }
    }
}

/// The device routes of the engine whose state is `shared`. Why not methods of [`Engine`]: a
/// READ's owner serves the request on a worker, which holds the engine's shared state but no
/// `Engine`, and its write back into the reader must take the same routes as any write.
#[derive(Clone, Copy)]
pub(crate) struct DeviceWriter<'a> {
    pub(crate) shared: &'a Arc<Shared>,
}

impl Engine {
    /// The device routes of this engine.
    pub(crate) fn device_writer(&self) -> DeviceWriter<'_> {
        DeviceWriter { shared: &self.shared }
    }

    /// The copy-engine route, opened on first use.
    pub(crate) fn device_route(&self) -> Result<Arc<DeviceRoute>, String> {
        self.device_writer().device_route()
    }

    /// Peer regions mapped through CUDA IPC so far (a cache-miss counter; 0 without a route).
    pub fn device_mappings_opened(&self) -> u64 {
        match self.shared.devices.route.get() {
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

    /// Page-locks a region made with [`Engine::alloc_shared`] for the copy engines of GPU
    /// `ordinal` (once; later calls return the first outcome). Call it where the GPU may wait:
    /// page-locking synchronises with work queued on the device, so the data path never does it
    /// (see [`super::route::shared_host`]). Unpinned, copies still work, through the driver's staging.
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
        let file = self
            .shared
            .devices
            .peer_files
            .mapping(&self.shared.config.shm.dir, dst, info)
            .map_err(RegisterError::Shared)?;
        let _restore = accord_cuda::CurrentContextGuard::save();
        let gpu = self.device_route().and_then(|route| route.gpu(ordinal)).map_err(RegisterError::Device)?;
        file.pin_with(&gpu).map_err(RegisterError::Shared)
    }

    /// Peers' shared region files this engine keeps mapped (the shared-host route's cache).
    pub fn shared_mappings_held(&self) -> usize {
        self.shared.devices.peer_files.len()
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
        let key = accord_proto::RegionKey(0x5eed);
        let region = crate::memory::Region { base, len, key, keep: Some(keep), device: Some(ordinal), streamed: false };
        let id = self.shared.regions.write().unwrap().insert(region).expect("room for a region");
        crate::MrHandle { engine: self.id(), region: id, len }
    }

    /// Installs a staging thread before first use (tests: a fake copier over host memory).
    /// False if one was already started.
    #[cfg(test)]
    pub(crate) fn install_stager(&self, stager: Stager) -> bool {
        self.shared.devices.staging.set(Ok(stager)).is_ok()
    }
}

impl DeviceWriter<'_> {
    /// The engine's id.
    pub(crate) fn id(&self) -> EngineId {
        self.shared.id
    }

    /// The copy-engine route, opened on first use.
    pub(crate) fn device_route(&self) -> Result<Arc<DeviceRoute>, String> {
        let config = &self.shared.config;
        let private = config.private_device_contexts();
        let shape = CopyShape { streams: config.device_copy_streams, batch_2d: config.device_copy_batch_2d };
        self.shared.devices.route.get_or_init(|| DeviceRoute::open(private, shape)).clone()
    }

    pub(crate) fn check_peer(&self, peer: EngineId) -> Result<(), SubmitError> {
        self.shared.check_peer(peer)
    }

    /// The source range of a write from (or, for a device destination, possibly to) device
    /// memory, checked, with what keeps it alive.
    pub(crate) fn device_write_source(
        &self,
        op: &WriteOp<'_>,
    ) -> Result<(LocalSource, Option<MemoryOwner>), SubmitError> {
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

    /// The route [`route::choose`] picks for a write of `len` bytes from `source` memory into
    /// `dst`, and the destination's engine when it is in this process.
    pub(crate) fn route_to(
        &self,
        dst: &MrDescriptor,
        len: u64,
        source: SourceMemory,
    ) -> Result<(Route, Option<Arc<Shared>>), SubmitError> {
        let peer = dst.engine;
        let mut switches = RouteSwitches::of(&self.shared.config);
        // A device destination described without a CUDA IPC handle (a READ's reader, whose
        // request has no room for one; memory the driver would not export) cannot be mapped
        // here: across processes it lands through the receiver's slots instead.
        if dst.device.is_some_and(|d| d.ipc.is_none()) {
            switches.device_ipc = false;
        }
        let local = self.shared.same_process_engine(peer, switches.force_network);
        let locality = match &local {
            Some(_) => Locality::SameProcess,
            None => {
                let peers = self.shared.peers.read().unwrap();
                let address = peers.get(&peer).ok_or(SubmitError::UnknownPeer(peer.0))?;
                if address.host == crate::address::this_host() {
                    Locality::SameHost
                } else {
                    Locality::OtherHost
                }
            }
        };
        let destination = match (dst.device, dst.shared) {
            (Some(_), _) => Destination::Device,
            (None, Some(_)) => Destination::SharedHost,
            (None, None) => Destination::Host,
        };
        let inputs = RouteInputs { operation: Operation::Write, source, destination, locality, len, switches };
        Ok((route::choose(inputs), local))
    }

    /// A write from or to device memory (bounds of the destination already checked; called when
    /// the destination or the local source region is device memory): its route is chosen by
    /// [`route::choose`] and run by that route's file under `route/`.
    pub(crate) fn write_device(&self, op: &WriteOp<'_>) -> Result<Transfer, SubmitError> {
        let (src, src_keep) = self.device_write_source(op)?;
        let keep: Vec<MemoryOwner> = src_keep.into_iter().collect();
        let (route, local) = self.route_to(op.dst, op.len, src.memory())?;
        match (route, src) {
            (Route::CopyEngine, _) => match local {
                Some(peer_shared) => self.copy_in_process(op, src, keep, &peer_shared),
                None => Err(SubmitError::Invalid("the copy-engine route needs a peer in this process".into())),
            },
            (Route::CopyEngineIpc, _) => self.copy_through_ipc(op, src, keep),
            (Route::CopyIntoSharedHost, LocalSource::Device { ptr, ordinal }) => match self.shared_host_mapping(op) {
                Some(file) => self.copy_into_shared_host(op, ptr, ordinal, file, keep),
                // The peer's file cannot be mapped here: staged instead (see `route`).
                None => self.write_staged(op, StagedSource { ptr, ordinal, _keep: keep }),
            },
            (Route::Staged, LocalSource::Device { ptr, ordinal }) => {
                self.write_staged(op, StagedSource { ptr, ordinal, _keep: keep })
            }
            (Route::Landing, _) => self.write_landed(op, src, keep),
            (route, src) => {
                let source = match src {
                    LocalSource::Host { .. } => "host",
                    LocalSource::Device { .. } => "device",
                };
                let destination = if op.dst.device.is_some() { "device" } else { "host" };
                Err(SubmitError::Invalid(format!(
                    "a write from {source} memory to a {destination} region takes the {route:?} route, not a device route"
                )))
            }
        }
    }

    /// The user's transfer of a staged or landed write: `parts` parts, and the immediate (if
    /// any) as the transfer's trailer, sent once every part succeeded (as a sharded host write
    /// sends it), so the receiver counts it only after every byte landed.
    pub(crate) fn device_transfer(&self, op: &WriteOp<'_>, parts: usize) -> Arc<TransferState> {
        let state = self.shared.new_transfer(parts);
        if let Some(imm) = op.imm {
            let (shared, spec) = (self.shared.clone(), imm_part(op, imm));
            *state.trailer.lock().unwrap() = Some(Box::new(move |st| dispatch_part(&shared, spec, st)));
        }
        state
    }

    /// The staging thread, started on first use with the pool the configuration asks for.
    pub(crate) fn stager(&self, ordinal: u32) -> Result<&Stager, SubmitError> {
        let config = &self.shared.config;
        self.shared
            .devices
            .staging
            .get_or_init(|| {
                self.device_route()?;
                crate::device::cuda_staging::start_cuda_stager(
                    ordinal,
                    config.device_staging_chunk_bytes,
                    config.device_staging_chunks,
                    config.private_device_contexts(),
                    config.await_poll,
                )
            })
            .as_ref()
            .map_err(|e| SubmitError::Invalid(format!("device staging is unavailable: {e}")))
    }
}

/// The zero-byte write that carries a device write's immediate.
pub(crate) fn imm_part(op: &WriteOp<'_>, imm: u32) -> PartSpec {
    PartSpec {
        peer: op.dst.engine,
        kind: write_kind(op.dst, op.dst_offset, Some(imm)),
        source: Source::Bytes(Arc::from(&[][..])),
        lane: None,
    }
}
