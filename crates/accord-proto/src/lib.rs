//! `accord-proto`: Accord's transport as a sans-IO state machine.
//!
//! No sockets, no threads, no clock reads; randomness only from a seed the caller gives. The
//! same code therefore runs over UDP (`accord-net`), in property tests, and in the simulator
//! (`accord-sim`). See `../shared/DESIGN.md` §2 for the contract.
#![forbid(unsafe_code)]

pub mod cc;
pub mod ids;
pub mod time;
pub mod wire;

pub use ids::{ConnectionId, OpId, PathId, Psn, RecvBufferId, RegionId, RegionKey};
pub use time::Instant;
