//! Bootstrap rendezvous: a small TCP key-value store hosted by rank 0, its
//! client, and [`Bootstrap`], which reads torchrun's variables and gathers
//! every rank; or, through [`KeyValueStore`], a store someone else runs.
//!
//! Protocol: frames of a u32 little-endian length and a payload of at most
//! [`FRAME_BYTES_MAX`]; a request is an op byte and fields (strings and byte
//! strings are u32-length-prefixed), a reply a status byte and a body.
//! Malformed input from a client is answered with an error reply (or the
//! connection is closed), never a panic.

mod bootstrap;
mod client;
mod external;
mod server;
mod wire;

pub use bootstrap::{torchrun_agent_holds_master_port, Bootstrap, BootstrapConfig};
pub use client::StoreClient;
pub use external::{all_gather_through, KeyValueStore};
pub use server::StoreServer;
pub use wire::{FRAME_BYTES_MAX, KEYS_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX, WAIT_KEYS_MAX};

#[cfg(test)]
mod tests;
