//! The copy-engine routes ([`super::Route::CopyEngine`], [`super::Route::CopyEngineIpc`],
//! [`super::Route::CopyIntoSharedHost`]): one asynchronous copy on an engine-owned stream, no
//! kernel and no SM, then the immediate.
//!
//! - In this process: device to device (peer access enabled once per GPU pair), host to
//!   device, device to host, between the two regions' addresses.
//! - Into a device region of another process of this host: the copy targets this process's
//!   mapping of the region, opened from its descriptor's CUDA IPC handle and cached per peer
//!   region.
//! - Device bytes into a region another process of this host made with
//!   `Engine::alloc_shared`: one device-to-host copy into this process's mapping of the
//!   region's shared-memory file (see [`crate::engine::route::shared_host`]).
//!
//! The immediate is counted at the receiver only after the copy completed: the device poller
//! sends it as a zero-byte write over the host routes once the copy's event fired.

use std::sync::Arc;

use accord_proto::{RegionId, RegionKey};

use super::dispatch::dispatch_part;
use crate::completion::Transfer;
use crate::device::{AfterCopy, CopyEnds, DeviceCopy, DeviceTarget};
use crate::engine::device::DeviceWriter;
use crate::engine::device::{imm_part, LocalSource};
use crate::engine::shared::Shared;
use crate::engine::WriteOp;
use crate::error::SubmitError;
use crate::memory::shared_file::SharedFile;
use crate::memory::MemoryOwner;

impl DeviceWriter<'_> {
    /// [`super::Route::CopyEngine`]: `peer` is the destination's engine, in this process.
    pub(crate) fn copy_in_process(
        &self,
        op: &WriteOp<'_>,
        src: LocalSource,
        mut keep: Vec<MemoryOwner>,
        peer: &Shared,
    ) -> Result<Transfer, SubmitError> {
        let ends = {
            let regions = peer.regions.read().unwrap();
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
                let LocalSource::Device { ptr, ordinal } = src else {
                    return Err(SubmitError::Invalid("host to host writes do not take the device route".into()));
                };
                let (dst_addr, dst_keep) = regions.check_host_write(id, key, op.dst_offset, op.len).map_err(refused)?;
                keep.extend(dst_keep);
                CopyEnds::DeviceToHost { src_ptr: ptr, src_ordinal: ordinal, dst_addr }
            }
        };
        self.submit_copy(op, ends, keep, false)
    }

    /// [`super::Route::CopyEngineIpc`]: into a device region of another process of this host.
    pub(crate) fn copy_through_ipc(
        &self,
        op: &WriteOp<'_>,
        src: LocalSource,
        keep: Vec<MemoryOwner>,
    ) -> Result<Transfer, SubmitError> {
        let target = DeviceTarget::SameHost { dst: *op.dst, offset: op.dst_offset };
        let ends = match src {
            LocalSource::Device { ptr, ordinal } => {
                CopyEnds::DeviceToDevice { src_ptr: ptr, src_ordinal: ordinal, target }
            }
            LocalSource::Host { addr } => CopyEnds::HostToDevice { src_addr: addr, target },
        };
        self.submit_copy(op, ends, keep, true)
    }

    /// [`super::Route::CopyIntoSharedHost`]: device bytes into `file`, this process's mapping of
    /// the destination's shared-memory file.
    pub(crate) fn copy_into_shared_host(
        &self,
        op: &WriteOp<'_>,
        src_ptr: u64,
        src_ordinal: u32,
        file: Arc<SharedFile>,
        mut keep: Vec<MemoryOwner>,
    ) -> Result<Transfer, SubmitError> {
        let dst_addr = file.base() + op.dst_offset as usize;
        keep.push(file);
        self.submit_copy(op, CopyEnds::DeviceToHost { src_ptr, src_ordinal, dst_addr }, keep, true)
    }

    /// This process's mapping of the destination's shared-memory file, if it can be mapped and
    /// holds the write's range (the route's one check that can only be made when it runs).
    pub(crate) fn shared_host_mapping(&self, op: &WriteOp<'_>) -> Option<Arc<SharedFile>> {
        let info = op.dst.shared?;
        let file = self.shared.devices.peer_files.mapping_or_warn(&self.shared.config.shm.dir, op.dst, info)?;
        // The descriptor's bounds were checked against its length, which the file matched.
        (op.dst_offset.checked_add(op.len)? <= file.mapped_bytes() as u64).then_some(file)
    }

    /// Queues the copy on the copy-engine route; its immediate follows once it completed.
    fn submit_copy(
        &self,
        op: &WriteOp<'_>,
        ends: CopyEnds,
        keep: Vec<MemoryOwner>,
        remote_peer: bool,
    ) -> Result<Transfer, SubmitError> {
        let route = self.device_route().map_err(SubmitError::Invalid)?;
        let state = self.shared.new_transfer(1);
        // The immediate is counted at the receiver only after the copy completed: the poller
        // sends it as a zero-byte write over the ordinary route (memcpy route in this process,
        // the transport across processes), and that write is the transfer's one part.
        // Across processes the immediate goes through a lane, promised now so that its worker
        // polls while the copy runs (see `LaneExpectation`).
        let peer = op.dst.engine;
        let after: Option<AfterCopy> = op.imm.map(|imm| {
            let mut spec = imm_part(op, imm);
            let shared = self.shared.clone();
            let promise =
                if remote_peer { shared.pick_lane(peer).map(|lane| shared.expect_on_lane(lane)) } else { None };
            spec.lane = promise.as_ref().map(|p| p.lane());
            Box::new(move |st: Arc<crate::completion::TransferState>| {
                dispatch_part(&shared, spec, st);
                drop(promise); // after the part is queued: the worker polls until it sees it
            }) as AfterCopy
        });
        let copy = DeviceCopy { ends, len: op.len, keep };
        route.copy(copy, state.clone(), after).map_err(SubmitError::Invalid)?;
        Ok(Transfer { state })
    }
}

impl DeviceWriter<'_> {
    /// A paged write of several pieces from device memory into one device region on a
    /// copy-engine route ([`super::Route::CopyEngine`] or [`super::Route::CopyEngineIpc`], as
    /// [`super::choose`] decides for its first piece): every piece in batched copy calls, spread
    /// over the route's copy streams when large ([`crate::device::DeviceRoute::copy_many`]),
    /// joined into one event, the immediate after all of them. `None` where another route
    /// applies (the caller then writes piece by piece). `runs` are (destination offset, source
    /// offset, bytes), each already checked against both regions.
    pub(crate) fn paged_through_copy_engine(
        &self,
        op: &crate::engine::PagedWriteOp<'_>,
        runs: &[(u64, u64, u64)],
    ) -> Result<Option<Transfer>, SubmitError> {
        let Some(&(dst_offset, src_offset, len)) = runs.first() else { return Ok(None) };
        if runs.len() < 2 || op.dst.device.is_none() {
            return Ok(None);
        }
        let first = WriteOp { src: op.src, src_offset, dst: op.dst, dst_offset, len, imm: None };
        let (src, src_keep) = self.device_write_source(&first)?;
        let LocalSource::Device { ptr, ordinal } = src else { return Ok(None) };
        let src_base = ptr - src_offset;
        let target = match self.route_to(op.dst, len, src.memory())? {
            (super::Route::CopyEngine, Some(owner)) => {
                let regions = owner.regions.read().unwrap();
                let (base, owner_ordinal) = regions
                    .check_device_write(RegionId(op.dst.region), RegionKey(op.dst.key), 0, op.dst.len)
                    .map_err(|reason| SubmitError::Invalid(format!("the destination refused the write: {reason:?}")))?;
                DeviceTarget::SameProcess { ptr: base, ordinal: owner_ordinal }
            }
            (super::Route::CopyEngineIpc, _) => DeviceTarget::SameHost { dst: *op.dst, offset: 0 },
            _ => return Ok(None),
        };
        let trailer = WriteOp { src: op.src, src_offset: 0, dst: op.dst, dst_offset: 0, len: 0, imm: op.imm };
        let state = self.device_transfer(&trailer, 1);
        let route = self.device_route().map_err(SubmitError::Invalid)?;
        let keep: Vec<MemoryOwner> = src_keep.into_iter().collect();
        route.copy_many(ordinal, target, src_base, runs, keep, state.clone(), None).map_err(SubmitError::Invalid)?;
        Ok(Some(Transfer { state }))
    }
}
