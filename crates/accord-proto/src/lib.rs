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
//!
//! # Stale frames change nothing
//!
//! A network delivers late duplicates, and a hostile host can replay what it captured. So a
//! frame that *resolves nothing* changes no state: an ACK that newly acknowledges no packet
//! and refuses no live operation, the answer to a probe that is not outstanding on that path,
//! a NACK of a packet not in flight, a Credit frame whose number was already acted on, a
//! HelloAck on an established connection. Such a frame yields no RTT sample, no loss verdict,
//! no path quarantine or revival, no congestion signal, no credit and no counter overwrite
//! (the peer's CE count only ever moves forward); it is dropped and counted in
//! [`ConnectionStats::stale_frames`]. An ACK that does resolve something takes an RTT sample
//! only when it resolved the echoed packet's latest transmission (Karn's rule). The simulator
//! checks the rule around every late replay it delivers (`accord-sim`'s `PairSim`, drawn on by
//! the property tests).
//!
//! # Integrity and admission
//!
//! Every packet carries a CRC32C checked before anything else is read ([`wire::integrity`]);
//! with a job secret, only peers that prove it in the handshake get a connection
//! ([`admission`]). For networks outsiders can write to, the authenticated mode replaces the
//! CRC with a MAC per packet under per-connection keys ([`wire::mac`]): no outsider can forge
//! a packet, and an authentic one replayed changes nothing by the stale-frame rule above.
//! Datagrams that crossed only a shared-memory ring of the job may carry a CRC of the header
//! alone ([`Transmit::for_local_channel`], [`Endpoint::handle_local_datagram`]); one from a
//! network never may.
#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod cc;
pub mod config;
mod conn;
pub mod credit;
pub mod endpoint;
pub mod frame;
pub mod ids;
pub mod names;
pub mod path;
pub mod recv;
pub mod send;
pub mod time;
pub mod wire;

pub use admission::JobSecret;
pub use api::{
    ConnectionError, ConnectionHandle, ConnectionStats, DatagramOutcome, EndpointStats, Event, LocalMemory, PayloadRef,
    PendingSeal, Placement, PlacementTarget, RxMeta, SendRequest, Transmit, WriteRequest,
};
pub use config::{ConfigError, ConnectionConfig, CreditConfig, EndpointConfig, PacerOrder};
pub use endpoint::{ConnectError, Endpoint};
pub use ids::{ConnectionId, OpId, PathId, Psn, RecvBufferId, RegionId, RegionKey};
pub use names::UnknownNameError;
pub use send::{OpError, SubmitError};
pub use time::Instant;
