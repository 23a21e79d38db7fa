//! The error enum of GPU collectives. Every message says what to do next.

use std::time::Duration;

use accord_cuda::CudaError;

use crate::error::StoreError;

/// Everything a [`super::GpuCommunicator`] operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuCollError {
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Cuda(#[from] CudaError),
    /// The bootstrap store failed.
    #[error("bootstrap store: {0}")]
    Store(#[from] StoreError),
    /// An argument was out of range.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// What was wrong, with the valid range.
        what: String,
    },
    /// A receive buffer was not registered.
    #[error(
        "the receive buffer at 0x{ptr:x}+{len_bytes} is not inside a registered buffer; \
         call GpuCommunicator::register on it first (peers write into it)"
    )]
    NotRegistered {
        /// Start of the range.
        ptr: u64,
        /// Its length.
        len_bytes: usize,
    },
    /// A bounded table is full.
    #[error("{what} holds at most {max} entries; deregister buffers you no longer use, or raise {env}")]
    TableFull {
        /// The table.
        what: &'static str,
        /// Its bound.
        max: usize,
        /// The environment variable that raises it.
        env: &'static str,
    },
    /// The shared-memory flag segment could not be created or mapped.
    #[error("shared-memory flag segment {path}: {reason}; check that /dev/shm is writable and has space")]
    SharedMemory {
        /// The segment's path.
        path: String,
        /// What failed.
        reason: String,
    },
    /// A peer process exited or closed its communicator.
    #[error("rank {rank} (pid {pid}) {how}; every rank must stay until the last collective completed")]
    PeerGone {
        /// The peer's rank.
        rank: usize,
        /// The peer's pid.
        pid: u32,
        /// Exited or closed.
        how: &'static str,
    },
    /// A peer failed and told everyone.
    #[error("rank {rank} aborted its collectives after an error; look at that rank's log for the cause")]
    PeerAborted {
        /// The rank that aborted.
        rank: usize,
    },
    /// A wait did not finish in time.
    #[error("timed out after {waited:?} waiting for {what}; a peer is slow, stuck or issued collectives in another order (raise ACCORD_GPU_OP_TIMEOUT_MS if only slow)")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// Two ranks disagree about a collective (order or sizes).
    #[error("protocol mismatch with rank {rank}: {what}; every rank must call the same collectives in the same order")]
    Protocol {
        /// The peer.
        rank: usize,
        /// What disagreed.
        what: String,
    },
    /// Queuing a collective on the caller's stream failed part way (caller-stream reductions);
    /// the progress thread fails it in queue order.
    #[error("queuing the collective on the caller's stream failed part way ({why}); the stream was let past it")]
    QueueFailed {
        /// The queuing error.
        why: String,
    },
    /// An earlier collective failed; the communicator can no longer be used.
    #[error("an earlier collective failed ({first}); create a new communicator after fixing the cause")]
    Failed {
        /// The first error, as text.
        first: String,
    },
}

/// Result alias of the GPU collectives.
pub type GpuResult<T> = std::result::Result<T, GpuCollError>;
