//! Comms and their data path: receiver-driven rendezvous over the engine.
//!
//! - The receiver's `irecv` takes request slot `seq % 32` and writes a clear-to-send entry
//!   (tags, capacities, destination regions) into slot `seq % 32` of the sender's CTS ring,
//!   with the immediate of (sender comm, slot): the sender's per-slot counter says when that
//!   entry has fully landed, so it never reads a half-written one.
//! - The sender's `isend` consumes entries in sequence order and matches its tag inside the
//!   current entry (grouped receives: each receive of the group is matched once), then writes
//!   `min(send size, receive size)` bytes straight into the receiver's buffer, in as many
//!   pieces as the entry asks (the receiver picks one per engine lane, so pieces travel on
//!   different lanes at once, each counted as it lands instead of behind a trailer), and the
//!   size as a word into the receiver's size table, all with the immediate of (receiver comm,
//!   slot). An empty piece (a zero-byte or short message) writes zero bytes, still counted.
//! - The receiver's `test` is done once its slot counter moved by pieces + 1 per receive of
//!   the group; it then reads the sizes from the size table.
//!
//! Immediate counters only move once every byte of a write landed, so completion implies the
//! data is in place. At most one CTS write per ring slot and one pair of writes per receive
//! are in flight, which bounds everything without further flow control.

pub mod recv;
pub mod send;

pub use recv::{RecvComm, RecvRequest};
pub use send::{SendComm, SendRequest};

/// Bytes of one size word in the receiver's size table.
pub const SIZE_WORD_BYTES: usize = 8;
/// Writes with the receiver's immediate per matched receive besides its data pieces: the size word.
pub const SIZE_WRITES_PER_RECV: u64 = 1;
/// Most send requests outstanding per send comm: NCCL's 32 times the grouped receive bound.
pub const SEND_REQUESTS_MAX: usize = crate::abi::NET_REQUESTS_MAX * crate::cts::RECVS_MAX;

/// Offset of the size word for receive `index` of request slot `slot` in the size table.
pub fn size_word_offset(slot: u32, index: usize) -> u64 {
    ((slot as usize * crate::cts::RECVS_MAX + index) * SIZE_WORD_BYTES) as u64
}

/// Bytes of a receive comm's size table.
pub const SIZE_TABLE_BYTES: usize = crate::abi::NET_REQUESTS_MAX * crate::cts::RECVS_MAX * SIZE_WORD_BYTES;
