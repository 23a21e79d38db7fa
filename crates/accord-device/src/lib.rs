//! `accord-device`: device-initiated communication over every route the engine has.
//!
//! A CUDA kernel names "rank r's window at offset o" and puts, signals and waits without
//! returning to the host. GPU threads write 64-byte descriptors ([`layout::Descriptor`]) into a
//! bounded ring in mapped host memory; CPU proxy threads drain it. A peer this rank's GPU
//! reaches by address (CUDA IPC on one host, or this process) is served by a stream lane:
//! batched copy-engine copies and stream stores, no engine write per descriptor. Every other
//! peer gets ordinary engine writes, so the engine's route layer picks shared memory or the
//! network across hosts. No RDMA NIC and no NVSHMEM are needed.
//!
//! The layout in [`layout`] is the contract with the CUDA header
//! (`include/accord/device.cuh`); a test compiles that header with the host compiler and checks
//! every offset against this crate's.
#![warn(missing_docs)]
#![deny(unsafe_code)]

mod comm;
pub mod error;
mod lane;
pub mod lane_cost;
pub mod layout;
pub mod memory;
mod proxy;
pub mod ring;
mod shared;
mod signals;
mod table;
pub mod watcher;
mod window;

pub use comm::{DeviceComm, DeviceCommConfig, DeviceStats, COUNTERS_MAX, RINGS_MAX};
pub use error::{DescriptorError, DescriptorErrorKind, DeviceError, ProducerError, WaitError};
pub use lane::DEFAULT_STORES_ASIDE_BYTES;
pub use memory::Placement;
pub use proxy::{ProxyTiming, DESCRIPTORS_PER_TURN_DEFAULT};
pub use ring::{HostProducer, Ring, RingConsumer, RING_SLOTS_DEFAULT, RING_SLOTS_MAX};
pub use shared::ERRORS_KEPT_MAX;
pub use signals::SIGNALS_MAX;
pub use watcher::{HostWatcher, WatchTiming};
pub use window::{EXCHANGE_RECORD_BYTES, WINDOWS_MAX};
