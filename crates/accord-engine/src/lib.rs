//! `accord-engine`: Accord's TransferEngine over host memory.
//!
//! An [`Engine`] owns worker threads, one per (NIC, worker index), each driving its own UDP
//! sockets and an `accord-proto` endpoint to completion. Applications register memory
//! ([`Engine::alloc`], [`Engine::register_raw`]), share [`MrDescriptor`]s and
//! [`EngineAddress`]es out of band, and move bytes with one-sided writes that carry optional
//! immediates ([`Engine::write`], [`Engine::write_paged`], [`Engine::scatter`]), two-sided
//! sends ([`Engine::send`], [`Engine::post_recvs`]) and barriers ([`Engine::barrier`]).
//! Every submission completes through its [`Transfer`] handle (wait or poll), a callback on
//! the completion thread ([`Transfer::on_complete`]) or a counter ([`Transfer::count_into`]);
//! receivers learn of writes through immediate counters ([`Engine::imm_counter`],
//! [`Engine::expect_imm`]).
//!
//! Routing per peer: peers in the same process get a memcpy on the submitting thread (unless
//! [`EngineConfig::force_network`]); peers on the same host (same `EngineAddress::host`) get
//! the full protocol over shared-memory rings (`accord_net::shm`, [`EngineConfig::shm`]),
//! set up over UDP and falling back to it; everyone else goes over the network.
//!
//! Device memory ([`MemoryKind::CudaDevice`], through [`Engine::register_raw`]): its
//! descriptor carries the allocation's CUDA IPC handle. [`Engine::write`] from or into device
//! memory runs on the copy engine (engine-owned streams, no kernel) where it can: between
//! device regions, and between host and device memory, for a peer in this process directly and
//! for a peer on this host through a cached IPC mapping of its device region. Device memory
//! bound for a host region of another process (this host or another) is staged through a
//! bounded pool of pinned host slots and sent as ordinary host writes. In every route the
//! immediate follows as a zero-byte write once every byte landed. Writes into a device region
//! on another host (or of another process here with `ACCORD_DEVICE_IPC=0`) land chunk by chunk
//! in pinned slots the receiver grants over engine-internal control messages, then go
//! host-to-device there (both engines must know each other). Paged writes and scatters from or
//! into device memory go piece by piece over the same routes, with the immediate after the last
//! piece; sends take host bytes only. CUDA is loaded at run time, so the engine
//! builds and runs without it. Connections open lazily on first use; an engine with
//! several NICs shards large writes across them and moves the shards of a failed NIC to the
//! survivors.
//!
//! ```no_run
//! use accord_engine::{Engine, WriteOp};
//! let a = Engine::builder().build()?;
//! let b = Engine::builder().build()?;
//! a.add_peer(&b.address())?;
//! let src = a.alloc(1 << 20)?;
//! let dst = b.alloc(1 << 20)?;
//! let (h, d) = (src.handle(), dst.descriptor());
//! let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: Some(7) };
//! a.write(&op)?.wait()?;
//! assert_eq!(b.imm_counter(7).value(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod address;
pub mod backoff;
mod completion;
pub mod config;
mod device;
mod engine;
mod error;
mod imm;
pub mod liveness;
pub mod local_ranks;
pub mod log_level;
mod memory;
mod peer_death;
mod recent;
mod recv;
mod tags;
pub mod telemetry;
pub mod wait_spin;
mod worker;

pub use accord_net::fault::{FaultConfig, FaultControl};
pub use accord_net::shm::{ShmConfig, ShmStats};
pub use accord_net::signal;
pub use accord_net::streaming;
/// The selector types of [`EngineConfig`]'s `cc`, `path_selector`, `pacer_order` and
/// `integrity`, so users need not depend on `accord-proto` to set them (each parses its name).
pub use accord_proto::{
    cc::{CcKind, UnknownCcError},
    config::PacerOrder,
    path::SelectorKind,
    wire::Integrity,
    UnknownNameError,
};
pub use accord_proto::{path::PathStats, ConnectionStats};
pub use accord_sys::shared_map::{SharedMapError, SharedMapFailure, SharedMapping};
pub use address::{
    DeviceIpcBytes, DeviceRegionInfo, EngineAddress, EngineId, MrDescriptor, SharedHostInfo, DEVICE_IPC_HANDLE_BYTES,
};
pub use completion::{Transfer, COMPLETION_JOBS_MAX};
pub use config::{
    DeviceContext, EngineConfig, AWAIT_POLL_DEFAULT, AWAIT_POLL_MAX, DEVICE_COPY_STREAMS_DEFAULT,
    DEVICE_COPY_STREAMS_MAX,
};
pub use device::staging::{
    DEVICE_STAGING_CHUNKS_DEFAULT, DEVICE_STAGING_CHUNKS_MAX, DEVICE_STAGING_CHUNK_BYTES_DEFAULT,
    DEVICE_STAGING_CHUNK_BYTES_MAX, DEVICE_STAGING_CHUNK_BYTES_MIN, DEVICE_STAGING_POOL_BYTES_MAX,
    STAGED_WRITES_ACTIVE_MAX,
};
pub use device::{DEVICE_COPIES_IN_FLIGHT_MAX, DEVICE_STREAMS_PER_GPU, IPC_MAPPINGS_MAX};
pub use engine::route::cma::{CmaStats, CMA_MIN_BYTES_DEFAULT, CMA_PULLS_IN_FLIGHT_MAX, CMA_VERIFIED_PEERS_MAX};
pub use engine::route::direct::DeviceRegionMapping;
pub use engine::route::landing::{
    LandingStats, LANDING_ASKS_MAX, LANDING_ASKS_PER_PEER_MAX, LANDING_CONTROL_QUEUE_MAX, LANDING_REQUESTS_MAX,
    LANDING_TIMEOUT_DEFAULT,
};
pub use engine::route::memcpy::pool::{LOCAL_COPY_CHUNKS_QUEUED_MAX, LOCAL_COPY_CHUNK_BYTES, LOCAL_COPY_THREADS_MAX};
pub use engine::route::memcpy::LOCAL_COPY_ASYNC_MIN_BYTES;
pub use engine::shared::{LANE_AVOID_AFTER_FAILURE, PEERS_MAX, SUBMISSIONS_QUEUED_MAX};
pub use engine::{Engine, EngineBuilder, EngineStats, PagedWriteOp, ScatterDst, StridedPagedWriteOp, WriteOp};
pub use engine::{
    PagedReadOp, RawBuffer, ReadOp, ReadStats, READ_ASSEMBLIES_MAX, READ_ASSEMBLY_FRAMES_MAX, READ_DST_INFOS_KEPT,
    READ_FLOOR_BYTES_PER_SEC, READ_PIECES_PER_REQUEST_MAX, READ_REQUESTS_IN_FLIGHT_MAX, READ_SERVED_REMEMBERED,
    READ_WRITE_BACKS_QUEUED_MAX, READ_WRITE_BACK_RUNS_QUEUED_MAX,
};
pub use engine::{PAGES_PER_WRITE_MAX, SCATTER_DESTINATIONS_MAX, SHARD_ALIGN_BYTES};
pub use error::{BarrierError, BuildError, ParseError, RangeError, RegisterError, SubmitError, TransferError};
pub use imm::{ImmCounter, ImmError, IMM_COUNTERS_MAX, IMM_EXPECTATIONS_MAX, IMM_LOST_TRACKED_MAX};
pub use liveness::{PeerDeath, PeerWaitError, PeerWatch};
pub use memory::{
    current_gpu, device_memory_has_owner_context, device_ordinal_of, gpus_visible, MemoryKind, MemoryOwner, MrBuffer,
    MrHandle, ALLOC_ALIGN_BYTES, REGIONS_MAX, REGION_BYTES_MAX,
};
pub use recv::{RecvHandler, RecvMessage, RECV_BUFFERS_MAX, RECV_BUFFER_BYTES_MAX};
pub use worker::cutoff::LANE_CUT_OFF_AFTER;
pub use worker::{LaneStats, WorkerTime, BACKLOG_PARTS_MAX, IDLE_WAIT_MAX, RX_BATCH_SLOTS};
