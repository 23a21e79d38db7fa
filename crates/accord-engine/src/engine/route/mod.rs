//! The route layer: how a part's bytes reach the peer, chosen in one place.
//!
//! Why one place: the engine moves bytes nine ways (memcpy, shared-memory rings, UDP, a
//! cross-memory pull, three copy-engine copies, staging, the landing rendezvous). When each
//! was chosen where it was first needed, nobody could say which way a given write took, or
//! where a tenth way belonged. Now [`choose`] is a pure function of what a write is (where its
//! source lives, what its destination is, where the peer lives, its length) and of the
//! configuration's switches, and its truth table is a test (`tests.rs`). A new route is a
//! variant of [`Route`], a row of that table, and a file of its own in this folder.
//!
//! | route | source | destination | peer | switches |
//! |---|---|---|---|---|
//! | [`Route::Memcpy`] | host | host | this process | not `force_network` |
//! | [`Route::Pull`] | host | host | this host | `cma`, write of at least `cma_min_bytes` |
//! | [`Route::SharedMemory`] | host | host | this host | `shm` |
//! | [`Route::Udp`] | host | host | elsewhere, or this host without `shm` | |
//! | [`Route::CopyEngine`] | host or device (one of them device) | host or device | this process | not `force_network` |
//! | [`Route::CopyEngineIpc`] | host or device | device | this host | `device_ipc` |
//! | [`Route::CopyIntoSharedHost`] | device | a shared host region | this host | `device_shared_host` |
//! | [`Route::Staged`] | device | host | another process | |
//! | [`Route::Landing`] | host or device | device | another host, or this host without `device_ipc` | |
//!
//! `force_network` treats a peer in this process as another process of this host. Sends (two
//! sided) take the host routes only, and never [`Route::Pull`].
//!
//! READ ([`read`]) adds no row: a reader's request and the owner's reply are control frames,
//! and the owner writes the bytes into the reader's destination as an ordinary host write, so
//! [`choose`] picks that write's route from the rows above (a peer in this process: one
//! checked memcpy on the reader's thread). With device memory on either side the owner's write
//! is a device write and takes the device rows (a device destination in another process of this
//! host is written through CUDA IPC once the reader announced its handle, landed before).
//!
//! Three choices can still fall back when they run, because what they need is known only
//! then: a pull goes over the transport until the peer has verified us
//! ([`cma`]); shared-memory rings fall back to UDP while they are not set up
//! (`accord_net::shm`); a shared host region that cannot be mapped here is staged instead.

pub(crate) mod cma;
mod copy_engine;
pub(crate) mod direct;
pub(crate) mod dispatch;
mod landed;
pub(crate) mod landing;
pub(crate) mod memcpy;
pub(crate) mod read;
pub(crate) mod shared_host;
mod staged;
pub(crate) mod sweep;

#[cfg(test)]
mod tests;

/// Where a write's source bytes live.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SourceMemory {
    /// Host memory (registered, or bytes the engine holds).
    Host,
    /// Memory of a GPU.
    Device,
}

/// What a write's destination descriptor names.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Destination {
    /// A host region.
    Host,
    /// A host region made with `Engine::alloc_shared` (backed by a shared-memory file).
    SharedHost,
    /// A region of GPU memory.
    Device,
}

/// Where the peer engine lives, seen from this one.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Locality {
    /// In this process.
    SameProcess,
    /// In another process of this host.
    SameHost,
    /// On another host.
    OtherHost,
}

/// What kind of operation the part is.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Operation {
    /// A one-sided write.
    Write,
    /// A two-sided send into the peer's posted buffers.
    Send,
}

/// The configuration's switches that steer routing (see [`crate::EngineConfig`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RouteSwitches {
    /// `ACCORD_FORCE_NETWORK`: peers in this process are treated as other processes.
    pub(crate) force_network: bool,
    /// `ACCORD_SHM`: shared-memory rings to peers of this host.
    pub(crate) shm: bool,
    /// `ACCORD_CMA`: the pull route between processes of this host.
    pub(crate) cma: bool,
    /// `ACCORD_CMA_MIN_BYTES`: the shortest write that is pulled.
    pub(crate) cma_min_bytes: u64,
    /// `ACCORD_DEVICE_IPC`: device regions of peers on this host are written through CUDA IPC.
    pub(crate) device_ipc: bool,
    /// `ACCORD_DEVICE_SHARED_HOST`: device bytes go straight into a peer's shared host region.
    pub(crate) device_shared_host: bool,
}

impl RouteSwitches {
    /// The switches of `config`.
    pub(crate) fn of(config: &crate::EngineConfig) -> RouteSwitches {
        RouteSwitches {
            force_network: config.force_network,
            shm: config.shm.enabled,
            cma: config.cma,
            cma_min_bytes: config.cma_min_bytes,
            device_ipc: config.device_ipc,
            device_shared_host: config.device_shared_host,
        }
    }
}

/// Everything [`choose`] looks at.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RouteInputs {
    pub(crate) operation: Operation,
    pub(crate) source: SourceMemory,
    pub(crate) destination: Destination,
    pub(crate) locality: Locality,
    /// Bytes of the part.
    pub(crate) len: u64,
    pub(crate) switches: RouteSwitches,
}

/// How a part's bytes reach the peer (the table in this module's documentation).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Route {
    /// A copy on the submitting thread into the peer engine of this process ([`memcpy`]).
    Memcpy,
    /// The receiver reads the writer's memory with one cross-memory copy ([`cma`]).
    Pull,
    /// The transport over shared-memory rings to a peer of this host (falls back to UDP).
    SharedMemory,
    /// The transport over UDP.
    Udp,
    /// One copy-engine copy in this process (device to device, host to device, device to host).
    CopyEngine,
    /// A copy-engine copy into a peer's device region mapped through its CUDA IPC handle.
    CopyEngineIpc,
    /// A device-to-host copy into this process's mapping of a peer's shared host region.
    CopyIntoSharedHost,
    /// Device bytes through pinned staging slots, each chunk an ordinary host write.
    Staged,
    /// Chunk by chunk through the receiver's pinned landing slots, then host to device there.
    Landing,
}

impl Route {
    /// Whether the route runs on a copy engine or stages device memory (a route of
    /// `Engine::write_device`), rather than moving host bytes through a lane or a memcpy.
    pub(crate) fn is_device_route(self) -> bool {
        matches!(
            self,
            Route::CopyEngine | Route::CopyEngineIpc | Route::CopyIntoSharedHost | Route::Staged | Route::Landing
        )
    }
}

/// The route for `inputs`: the one decision of this module (see the table above).
pub(crate) fn choose(inputs: RouteInputs) -> Route {
    let RouteInputs { operation, source, destination, locality, len, switches } = inputs;
    let locality = match locality {
        Locality::SameProcess if switches.force_network => Locality::SameHost,
        other => other,
    };
    let device_involved = source == SourceMemory::Device || destination == Destination::Device;
    if !device_involved || operation == Operation::Send {
        return match locality {
            Locality::SameProcess => Route::Memcpy,
            Locality::SameHost if operation == Operation::Write && switches.cma && len >= switches.cma_min_bytes => {
                Route::Pull
            }
            Locality::SameHost if switches.shm => Route::SharedMemory,
            Locality::SameHost | Locality::OtherHost => Route::Udp,
        };
    }
    match (locality, destination) {
        (Locality::SameProcess, _) => Route::CopyEngine,
        (Locality::SameHost, Destination::Device) if switches.device_ipc => Route::CopyEngineIpc,
        (_, Destination::Device) => Route::Landing,
        (Locality::SameHost, Destination::SharedHost) if switches.device_shared_host => Route::CopyIntoSharedHost,
        (_, Destination::Host | Destination::SharedHost) => Route::Staged,
    }
}
