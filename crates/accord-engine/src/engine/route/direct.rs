//! Direct access to a peer's device region: the address at which GPU `on` of this process
//! reaches it, for code that moves the bytes itself rather than through a write (the device
//! proxy's stream lane in `accord-device`, and kernels that store into a peer's window).
//!
//! Why here: it is the same decision as a device-to-device write's route. [`super::choose`] is asked
//! for that write, and only its two copy-engine answers give an address: [`Route::CopyEngine`]
//! (the region is in this process: its own address, with peer access enabled from GPU `on`)
//! and [`Route::CopyEngineIpc`] (another process of this host: the cached CUDA IPC mapping the
//! copy route itself uses). Every other answer (the network is forced, the peer is on another
//! host, IPC is switched off) means no address, and the caller keeps to ordinary writes.

use std::sync::Arc;

use accord_cuda::IpcMapping;
use accord_proto::{RegionId, RegionKey};

use super::{Route, SourceMemory};
use crate::address::MrDescriptor;
use crate::engine::Engine;
use crate::error::SubmitError;

/// A peer's device region as GPU `on` of this process reaches it. Holding it keeps an IPC
/// mapping open; the region itself stays its owner's to free (use it only while the owner's
/// registration lives, as with any descriptor).
pub struct DeviceRegionMapping {
    /// Device address of the region's byte 0, valid in the context of GPU `on` (a copy between
    /// it and GPU `on`'s memory is one `cuMemcpyDtoDAsync` there, by unified addressing).
    pub ptr: u64,
    /// Bytes of the region.
    pub len: u64,
    /// The GPU whose memory the region is.
    pub owner_ordinal: u32,
    /// Which route the address comes from ([`Route::CopyEngine`]: this process).
    pub same_process: bool,
    _mapping: Option<Arc<IpcMapping>>,
}

impl std::fmt::Debug for DeviceRegionMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRegionMapping")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("owner_ordinal", &self.owner_ordinal)
            .field("same_process", &self.same_process)
            .finish()
    }
}

impl Engine {
    /// The address at which GPU `on` of this process reaches the device region `dst`, or an
    /// error saying why it cannot (not device memory, the route is not a copy-engine one, the
    /// key or the IPC handle is refused).
    pub fn map_device_region(&self, dst: &MrDescriptor, on: u32) -> Result<DeviceRegionMapping, SubmitError> {
        let no = |why: String| SubmitError::Invalid(format!("no direct access to the peer's region: {why}"));
        let info = dst.device.ok_or_else(|| no("it is not device memory".into()))?;
        let (chosen, local) = self.device_writer().route_to(dst, dst.len, SourceMemory::Device)?;
        let route = self.device_route().map_err(no)?;
        match (chosen, local) {
            (Route::CopyEngine, Some(owner)) => {
                let regions = owner.regions.read().unwrap();
                let (ptr, ordinal) = regions
                    .check_device_write(RegionId(dst.region), RegionKey(dst.key), 0, dst.len)
                    .map_err(|reason| no(format!("the owner refused it: {reason:?}")))?;
                route.reach(on, ordinal).map_err(no)?;
                Ok(DeviceRegionMapping {
                    ptr,
                    len: dst.len,
                    owner_ordinal: ordinal,
                    same_process: true,
                    _mapping: None,
                })
            }
            (Route::CopyEngineIpc, _) => {
                let (ptr, mapping) = route.map_peer_region(dst, on).map_err(no)?;
                Ok(DeviceRegionMapping {
                    ptr,
                    len: dst.len,
                    owner_ordinal: info.ordinal,
                    same_process: false,
                    _mapping: Some(mapping),
                })
            }
            (other, _) => Err(no(format!("a write to it takes the {other:?} route"))),
        }
    }
}
