//! `accord-nccl-net`: the NCCL net plugin `libnccl-net-accord.so`.
//!
//! With `NCCL_NET_PLUGIN=<path to the .so> NCCL_NET=Accord`, NCCL's inter-node traffic flows
//! through Accord's engine (multipath UDP transport with congestion control and loss
//! recovery). The library exports `ncclNetPlugin_v11` (NCCL 2.28) and `ncclNetPlugin_v10`
//! (NCCL 2.25-2.27), and an NCCL tuner, `ncclTunerPlugin_v5`/`_v4` ([`tuner`]), which NCCL
//! loads from the net plugin's library by itself.
//!
//! Layers, top down:
//! - [`ffi`]: the exported tables; every entry point catches panics and maps errors to NCCL
//!   codes with a reason logged through NCCL's logger ([`log`]).
//! - [`setup`]: `listen`/`connect`/`accept` as non-blocking state machines over a TCP side
//!   channel that only exchanges engine addresses and comm descriptors ([`handle`]).
//! - [`comm`]: the data path, receiver-driven rendezvous over engine writes with immediates
//!   (clear-to-send entries, [`cts`]), host memory registered with the engine ([`mr`]).
//! - [`runtime`]: one engine per process whose NICs are NCCL's devices ([`config`]:
//!   `ACCORD_NET_IFS` and friends).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod abi;
pub mod bounce;
pub mod comm;
pub mod config;
pub mod cts;
pub mod engine_log;
pub mod error;
pub mod ffi;
pub mod gdr_level;
pub mod gpu_stats;
pub mod handle;
mod ifaddrs;
pub mod inflight;
pub mod log;
pub mod mr;
pub mod runtime;
pub mod setup;
pub mod tuner;
pub mod workers;

pub use config::NetConfig;
pub use error::PluginError;
pub use ffi::{ncclNetPlugin_v10, ncclNetPlugin_v11};
pub use tuner::ffi::{ncclTunerPlugin_v4, ncclTunerPlugin_v5};

#[cfg(test)]
mod tests;
