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
        match (chosen, local) {
            (Route::CopyEngine, Some(owner)) => {
                let route = self.device_route().map_err(no)?;
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
                let route = self.device_route().map_err(no)?;
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

#[cfg(test)]
mod tests {
    //! The refusals of `map_device_region`, which need no GPU: each names why, and none maps
    //! anything. (An address is handed out only on a GPU host: the device bench covers it.)
    use crate::engine::route::landing::tests::{device_dst, engine, pair};
    use crate::{Engine, SubmitError};

    fn refusal(e: SubmitError) -> String {
        match e {
            SubmitError::Invalid(why) => why,
            other => panic!("expected a refusal naming why, got {other:?}"),
        }
    }

    #[test]
    fn a_host_region_is_refused_as_not_device_memory() {
        let a = Engine::builder().ignore_env().build().unwrap();
        let host = a.alloc(4096).unwrap();
        let why = refusal(a.map_device_region(&host.descriptor(), 0).unwrap_err());
        assert!(why.contains("not device memory"), "{why}");
    }

    #[test]
    fn a_region_reached_only_over_the_network_names_its_route() {
        // Both engines force the network, so a same-process peer counts as another process of
        // this host, and its device region (described without an IPC handle) lands.
        let (a, b) = (engine(2_000), engine(2_000));
        pair(&a, &b);
        let (_memory, d) = device_dst(&b, 4096);
        let why = refusal(a.map_device_region(&d, 0).unwrap_err());
        assert!(why.contains("Landing"), "{why}");
    }

    #[test]
    fn an_unknown_peer_is_named() {
        let (a, b) = (engine(2_000), engine(2_000));
        let (_memory, d) = device_dst(&b, 4096);
        assert!(matches!(a.map_device_region(&d, 0), Err(SubmitError::UnknownPeer(_))));
    }
}
