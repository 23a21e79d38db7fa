//! The one error enum of every datapath operation.

use std::io;
use std::net::SocketAddr;

/// Everything a datapath can fail with. Each message says what to do next.
///
/// Transient conditions of a lossy network (a full socket buffer, an
/// unreachable host) are *not* errors: a full buffer shows up as a short
/// count from `send_batch`, an unreachable host as a silently lost datagram,
/// exactly as the transport above expects from a datagram service.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatapathError {
    /// A path's socket could not be bound.
    #[error(
        "could not bind the socket of path {path} to {addr}: {source}; \
         choose a free base port, or base_port 0 for ephemeral ports"
    )]
    Bind {
        /// The path whose socket failed.
        path: u16,
        /// The address that was asked for.
        addr: SocketAddr,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A system call failed in a way the driver cannot absorb as packet loss.
    #[error("{context}: {source}")]
    Io {
        /// What the driver was doing, phrased so the next step is clear.
        context: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// An option was asked for that this driver or host cannot provide.
    #[error("{option} is not supported here: {reason}")]
    Unsupported {
        /// The option's name.
        option: &'static str,
        /// Why, and what to use instead.
        reason: String,
    },
    /// A datagram (or one GSO segment) is larger than the driver can carry.
    #[error(
        "datagram of {len} bytes exceeds the maximum of {max} bytes; \
         split it, or check DatapathCaps::max_payload_bytes before sending"
    )]
    MessageTooLarge {
        /// Bytes asked for.
        len: usize,
        /// The limit that applied.
        max: usize,
    },
    /// A GSO send was malformed (zero segment size, too many segments).
    #[error(
        "invalid segmented send of {len} bytes in segments of {segment_bytes}: {reason}; \
         respect DatapathCaps::gso_max_segments and use a non-zero segment size"
    )]
    InvalidSegmentation {
        /// Total bytes of the send.
        len: usize,
        /// Segment size that was asked for.
        segment_bytes: u16,
        /// What rule was broken.
        reason: &'static str,
    },
    /// A datagram named a path this datapath does not have.
    #[error("path {path} does not exist: this datapath has {path_count} paths (0..{path_count})")]
    UnknownPath {
        /// The path that was named.
        path: u16,
        /// How many paths there are.
        path_count: u16,
    },
    /// The destination's address family differs from the path socket's.
    #[error(
        "destination {dst} cannot be reached from path {path} bound to {local}; \
         bind the datapath on an address of the same family (IPv4 or IPv6)"
    )]
    AddressFamilyMismatch {
        /// The path used.
        path: u16,
        /// Its local address.
        local: SocketAddr,
        /// The destination asked for.
        dst: SocketAddr,
    },
    /// Receive slots are too small for what this driver may deliver.
    #[error(
        "receive slots of {slot_bytes} bytes are smaller than the {required} bytes this \
         datapath may deliver; allocate buffers with Datapath::alloc_rx_buffers"
    )]
    RxSlotTooSmall {
        /// Slot size of the buffers given.
        slot_bytes: usize,
        /// Slot size this driver needs.
        required: usize,
    },
    /// A configuration value is out of range.
    #[error("invalid datapath configuration: {0}")]
    InvalidConfig(String),
}

impl DatapathError {
    /// Wraps an I/O error with what the driver was doing.
    pub fn io(context: &'static str, source: io::Error) -> Self {
        DatapathError::Io { context, source }
    }
}
