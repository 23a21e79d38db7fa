//! What the device routes of one engine share, opened or started on first use. Apart from the
//! routes' logic ([`super::device`]) so that the engine's shared state can hold it without
//! importing the routes, which run from that state.

use std::sync::{Arc, OnceLock};

use super::route::shared_host::PeerFiles;
use crate::device::staging::driver::Stager;
use crate::device::DeviceRoute;

/// What the device routes of one engine share, opened or started on first use.
#[derive(Default)]
pub(crate) struct DevicePaths {
    /// The copy-engine route for device memory.
    pub(super) route: OnceLock<Result<Arc<DeviceRoute>, String>>,
    /// The staging thread and its pinned pool, started on the first staged device write.
    pub(super) staging: OnceLock<Result<Stager, String>>,
    /// Same-host peers' shared region files this engine mapped (`route::shared_host`).
    pub(crate) peer_files: PeerFiles,
}
