//! Device writes: validation and routing of writes whose source or destination is device memory
//! (see [`crate::device`] for the copy itself).
//!
//! Routes: a destination in this process is written with a copy between the two regions'
//! device addresses (peer access enabled once per GPU pair); a destination on this host is
//! opened from its descriptor's CUDA IPC handle (mapping cached per peer region). Not done
//! yet, each refused with [`SubmitError::Invalid`] saying so: device memory to a peer on
//! another host (it needs staging through pinned host memory on the network path), and writes
//! between host and device memory.

use std::sync::Arc;

use accord_proto::{RegionId, RegionKey};

use super::ops::{dispatch_part, PartSpec};
use super::shared::local_engine;
use super::{Engine, WriteOp};
use crate::address::{DeviceIpcBytes, DeviceRegionInfo};
use crate::completion::{Transfer, TransferState};
use crate::device::{DeviceCopy, DeviceRoute, DeviceTarget};
use crate::error::{RegisterError, SubmitError};
use crate::memory::{MemoryOwner, Source};

impl Engine {
    /// The copy-engine route, opened on first use.
    pub(crate) fn device_route(&self) -> Result<Arc<DeviceRoute>, String> {
        self.device.get_or_init(DeviceRoute::open).clone()
    }

    /// Peer regions mapped through CUDA IPC so far (a cache-miss counter; 0 without a route).
    pub fn device_mappings_opened(&self) -> u64 {
        match self.device.get() {
            Some(Ok(route)) => route.mappings_opened(),
            _ => 0,
        }
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
        let exported = route.export(ptr, len, ordinal).map_err(RegisterError::Device)?;
        Ok(DeviceRegionInfo {
            ordinal,
            alloc_offset: exported.as_ref().map_or(0, |(_, offset)| *offset),
            ipc: exported.map(|(handle, _)| DeviceIpcBytes(handle.to_bytes())),
        })
    }

    /// A write from or to device memory (bounds of the destination already checked; called when
    /// the destination or the local source region is device memory).
    pub(super) fn write_device(&self, op: &WriteOp<'_>) -> Result<Transfer, SubmitError> {
        if op.src.engine != self.id() {
            return Err(SubmitError::UnknownSource);
        }
        let (src_ptr, src_ordinal, keep): (u64, u32, Option<MemoryOwner>) = {
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
            let ordinal = region.device.ok_or_else(|| {
                SubmitError::Invalid(
                    "host memory into a device region is not implemented yet: register the source as device memory"
                        .into(),
                )
            })?;
            (region.base as u64 + op.src_offset, ordinal, region.keep.clone())
        };
        if op.dst.device.is_none() {
            return Err(SubmitError::Invalid(
                "device memory into a host region is not implemented yet: write into a device region".into(),
            ));
        }
        let peer = op.dst.engine;
        let local = if peer == self.id() { Some(self.shared.clone()) } else { local_engine(peer) };
        let target = match local {
            Some(peer_shared) => {
                let regions = peer_shared.regions.read().unwrap();
                let (ptr, ordinal) = regions
                    .check_device_write(RegionId(op.dst.region), RegionKey(op.dst.key), op.dst_offset, op.len)
                    .map_err(|reason| SubmitError::Invalid(format!("the destination refused the write: {reason:?}")))?;
                DeviceTarget::SameProcess { ptr, ordinal }
            }
            None => {
                let address =
                    self.shared.peers.read().unwrap().get(&peer).cloned().ok_or(SubmitError::UnknownPeer(peer.0))?;
                if address.host != self.address.host {
                    return Err(SubmitError::Invalid(format!(
                        "device memory to a peer on another host ({}) is not implemented yet: it needs staging \
                         through pinned host memory on the network path; stage it in host memory yourself",
                        address.host
                    )));
                }
                DeviceTarget::SameHost { dst: *op.dst, offset: op.dst_offset }
            }
        };
        let route = self.device_route().map_err(SubmitError::Invalid)?;
        let state = TransferState::new(1, self.shared.jobs.clone());
        // The immediate is counted at the receiver only after the copy completed: the poller
        // sends it as a zero-byte write over the ordinary route (memcpy route in this process,
        // the transport across processes), and that write is the transfer's one part.
        let after: Option<crate::device::AfterCopy> = op.imm.map(|imm| {
            let spec = PartSpec {
                peer,
                kind: super::ops::write_kind(op.dst, op.dst_offset, Some(imm)),
                source: Source::Bytes(Arc::from(&[][..])),
                lane: None,
            };
            let shared = self.shared.clone();
            Box::new(move |st: Arc<TransferState>| dispatch_part(&shared, spec, st)) as crate::device::AfterCopy
        });
        let copy = DeviceCopy { src_ptr, src_ordinal, len: op.len, target, keep };
        route.copy(copy, state.clone(), after).map_err(SubmitError::Invalid)?;
        Ok(Transfer { state })
    }
}
