//! Accord collectives: communicator, bootstrap store, host-driven zero-copy
//! collective algorithms, element-wise reductions, and bench math.
//!
//! The algorithms ([`algo`]) run on a CPU thread as schedules over a small
//! [`CollTransport`] trait — registered memory, one-sided writes carrying
//! 32-bit immediates counted at the receiver, tagged control messages and
//! deadlines on every wait — which the TransferEngine implements; the
//! in-process [`LocalTransport`] implements it for tests and same-process
//! ranks. Data lands straight in peers' registered user buffers.
//!
//! Entry points: [`Communicator`] (the collectives), [`engine::EngineTransport`] (the
//! collectives over the TransferEngine, bootstrapped the torchrun way), [`store::Bootstrap`]
//! (torchrun-style rendezvous), [`CollConfig`] (every `ACCORD_*` override),
//! [`bench_math`] (nccl-tests bandwidth formulas and tables).
// `unsafe` is confined to `engine::pinned` (views of registered memory); the GPU flag board's
// shared memory is mapped by the engine (`accord_engine::SharedMapping`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod algo;
mod arena;
pub mod bench_math;
mod communicator;
pub mod config;
mod dtype;
pub mod engine;
mod error;
pub mod gpu;
mod local;
pub mod reduce;
pub mod report;
pub mod store;
pub mod transport;

pub use algo::{Algo, AllToAllVLayout, Collective};
pub use communicator::{Bufs, Communicator};
pub use config::CollConfig;
pub use dtype::{DType, Element};
pub use error::{CollError, ConfigError, ReduceError, StoreError, TransportError};
pub use local::{LocalFabric, LocalTransport, CTRL_PENDING_MAX, IMM_VALUES_PENDING_MAX};
pub use reduce::ReduceOp;
pub use transport::{BufSlice, CheckedWrite, CollTransport, Imm, LocalBuf, RemoteBufDesc, RemoteSlice};
