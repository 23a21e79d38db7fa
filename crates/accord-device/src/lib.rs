//! `accord-device`: device-initiated communication over every route the engine has.
//!
//! A CUDA kernel names "rank r's window at offset o" and puts, signals and waits without
//! returning to the host. GPU threads write 64-byte descriptors ([`layout::Descriptor`]) into a
//! bounded ring in mapped host memory; CPU proxy threads drain it and run each descriptor as an
//! ordinary engine write, so the engine's route layer picks the copy engine through IPC on one
//! host, shared memory, or the network across hosts. No RDMA NIC and no NVSHMEM are needed.
//!
//! The layout in [`layout`] is the contract with the CUDA header
//! (`include/accord/device.cuh`); a test compiles that header with the host compiler and checks
//! every offset against this crate's.
#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod error;
pub mod layout;
pub mod memory;
pub mod ring;

pub use error::{DescriptorError, DescriptorErrorKind, DeviceError, ProducerError, WaitError};
pub use memory::Placement;
pub use ring::{HostProducer, Ring, RingConsumer, RING_SLOTS_DEFAULT, RING_SLOTS_MAX};
