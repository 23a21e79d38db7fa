//! `accord-sys`: operating-system questions several Accord crates ask, answered once.
//!
//! Why a crate of its own: the shared-memory rings (`accord-net`), CUDA IPC mappings
//! (`accord-cuda`) and the GPU collectives' flag board (`accord-coll`, through the engine) all
//! need to know whether a peer process still runs, and `accord-net` and `accord-cuda` have no
//! common dependency but the knob registry, which must stay free of OS code (as must
//! `accord-proto`). Each had its own answer, and they disagreed about zombies. This crate
//! depends on nothing of ours, so every crate can name it. The same holds for mapping a
//! shared-memory file ([`shared_map`]): the datagram rings below the engine and the regions,
//! arena and flag board above it share one implementation and its trust rules.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod futex;
mod process;
pub mod shared_map;

pub use shared_map::{Pages, SharedMapError, SharedMapFailure, SharedMapping};

pub use process::{pidfd_open, process_alive, take_fd_of};
