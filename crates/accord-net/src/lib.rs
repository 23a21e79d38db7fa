//! Accord datapaths: the layer that moves opaque datagrams between hosts.
//!
//! The sans-IO transport (`accord-proto`) decides *what* to send on *which*
//! path; this crate only moves the bytes. Everything goes through one
//! [`Datapath`] trait — batch send, batch receive into driver-owned buffers,
//! and a readiness wait — so the engine's worker loop is identical over kernel
//! UDP, an in-process network used by tests, and (later) AF_XDP, libfabric or
//! verbs.
//!
//! Drivers:
//! - [`udp::UdpDatapath`] (Linux): one non-blocking socket per path,
//!   `sendmmsg`/`recvmmsg`, UDP GSO/GRO and ECN when the kernel allows.
//! - [`shm::ShmDatapath`] (Linux): wraps UDP; same-host peers exchange datagrams through
//!   shared-memory rings, UDP carries the attach handshake, doorbells and fallback.
//! - [`mem::MemNetwork`]: lossless in-process network with bounded queues,
//!   for deterministic tests of everything above the datapath.
//!
//! Wrappers that take any driver:
//! - [`fault::FaultInjector`]: seeded drop / duplicate / reorder / corrupt /
//!   delay and path cuts that another thread can trigger at run time.
//! - [`trace::TracingDatapath`]: per-path counters and a bounded header ring.
//!
//! This crate deliberately does not depend on `accord-proto`: a datagram is an
//! opaque byte string here.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
mod datapath;
mod error;
pub mod fault;
pub mod lent;
pub mod mem;
#[cfg(target_os = "linux")]
pub mod pidfd;
#[cfg(target_os = "linux")]
pub mod shm;
#[cfg(target_os = "linux")]
pub mod signal;
pub mod streaming;
pub mod trace;
#[cfg(target_os = "linux")]
pub mod udp;

pub use datapath::{
    Datapath, DatapathCaps, DirectSend, RxBuffers, RxMeta, Segments, TxDatagram, LEND_MIN_BYTES, LENT_HEAD_BYTES,
    RX_SLOTS_MAX, RX_SLOT_BYTES_MAX, SEGMENTS_PER_SEND_MAX,
};
pub use error::DatapathError;
pub use lent::LentBytes;
