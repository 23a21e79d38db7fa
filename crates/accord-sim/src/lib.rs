//! `accord-sim`: runs the very same `accord-proto` code on a virtual clock.
//!
//! Events are ordered by (time, sequence), so one seed gives one result. The harness here
//! joins two hosts by links with rate, propagation and faults (loss, duplication, reordering,
//! corruption caught by the link's frame check, per-path cut), checks the protocol's
//! invariants on every event, and verifies delivered bytes against their sources at the end.
//! A go-back-N transport (what RDMA NICs do in hardware) runs on the same links as a baseline.
#![forbid(unsafe_code)]

pub mod events;
pub mod fabric;
pub mod gbn;
pub mod link;
pub mod memory;
pub mod pair;
pub mod scenarios;

pub use link::{FaultConfig, LinkConfig};
pub use pair::{PairConfig, PairSim, Side, SimError};
