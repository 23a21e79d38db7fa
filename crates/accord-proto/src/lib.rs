//! `accord-proto`: Accord's transport as a sans-IO state machine.
//!
//! No sockets, no threads, no clock reads; randomness only from a seed the caller gives. The
//! same code therefore runs over UDP (`accord-net`), in property tests, and in the simulator
//! (`accord-sim`). See `../shared/DESIGN.md` §2 for the contract and [`api`] for the driver
//! loop.
//!
//! Delivery is reliable and unordered: every data packet names its destination (region, key,
//! offset, or the send it belongs to), so it can be placed on arrival in any order; the
//! receiver validates before placing; immediates count only once every byte of their write is
//! placed; completion at the sender means every packet was acknowledged.
#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod cc;
pub mod config;
mod conn;
pub mod credit;
pub mod endpoint;
pub mod ids;
pub mod path;
pub mod recv;
pub mod send;
pub mod time;
pub mod wire;

pub use admission::JobSecret;
pub use api::{
    ConnectionError, ConnectionHandle, ConnectionStats, DatagramOutcome, EndpointStats, Event, LocalMemory, PayloadRef,
    Placement, PlacementTarget, RxMeta, SendRequest, Transmit, WriteRequest,
};
pub use config::{ConfigError, ConnectionConfig, CreditConfig, EndpointConfig, PacerOrder};
pub use endpoint::{ConnectError, Endpoint};
pub use ids::{ConnectionId, OpId, PathId, Psn, RecvBufferId, RegionId, RegionKey};
pub use send::{OpError, SubmitError};
pub use time::Instant;
