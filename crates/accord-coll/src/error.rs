//! Error enums, one per operation family. Every message says what to do next.

use std::io;
use std::time::Duration;

pub use crate::dtype::ReduceError;

/// Errors of a [`crate::CollTransport`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// A wait passed its deadline.
    #[error("timed out waiting for {what} after {waited:?}; the peer is slow or dead, raise ACCORD_COLL_TIMEOUT_MS if it is only slow")]
    Timeout {
        /// What was awaited, in words.
        what: String,
        /// How long the wait lasted.
        waited: Duration,
    },
    /// Writes to `peer` were still unacknowledged at the deadline. Named apart from
    /// [`Self::Timeout`] so the collective blames that rank and writes its stuck report:
    /// a rank whose only wait was a flush would otherwise fail without saying for whom.
    #[error("rank {peer} did not acknowledge our writes within {waited:?}; it is slow, stuck or dead, raise ACCORD_COLL_TIMEOUT_MS if it is only slow")]
    AckTimeout {
        /// The rank whose acknowledgements were missing.
        peer: usize,
        /// How long the flush waited.
        waited: Duration,
    },
    /// A peer reported being stuck (see [`crate::CollTransport::report_stuck`]);
    /// the collective is abandoned everywhere.
    #[error("rank {reported_by} reported being stuck waiting for rank {waiting_on}; the collective is abandoned")]
    Aborted {
        /// The rank that reported.
        reported_by: usize,
        /// The rank it waited for.
        waiting_on: usize,
    },
    /// A rank index is out of range.
    #[error("rank {rank} is out of range for a world of {world_size}; pass a rank below the world size")]
    BadRank {
        /// The rank given.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// A slice does not fit its buffer.
    #[error("{what}: range {offset}+{len} exceeds the registered length {buf_len}; check offsets and counts")]
    OutOfBounds {
        /// Which access, in words.
        what: &'static str,
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Length of the buffer.
        buf_len: usize,
    },
    /// A buffer handle or remote descriptor is not (or no longer) registered.
    #[error("{what} is not registered (or was deregistered); register the buffer with this transport first")]
    NotRegistered {
        /// Which buffer, in words.
        what: String,
    },
    /// Two local regions given to one local access overlap.
    #[error("local regions overlap ({src_offset}+{len} and {dst_offset}+{len} in one buffer); use disjoint regions")]
    Overlap {
        /// Source offset.
        src_offset: usize,
        /// Destination offset.
        dst_offset: usize,
        /// Length.
        len: usize,
    },
    /// A bounded table or queue is full.
    #[error("{what} is full ({limit} entries); a peer is far ahead or misbehaving")]
    LimitReached {
        /// Which table.
        what: &'static str,
        /// Its named limit.
        limit: usize,
    },
    /// A peer sent something malformed.
    #[error("malformed message from rank {peer}: {reason}; all ranks must run the same Accord version")]
    Malformed {
        /// The sender.
        peer: usize,
        /// What was wrong.
        reason: String,
    },
    /// This rank's transport has stopped (fault injection or shutdown).
    #[error("this rank's transport has stopped; recreate it")]
    Stopped,
    /// A peer stopped acknowledging what we sent it (it died, or every path to it is cut).
    #[error("rank {peer} stopped acknowledging our writes: it died or is unreachable")]
    PeerUnreachable {
        /// The silent rank.
        peer: usize,
    },
    /// The engine declared a peer dead (its process exited, or it answered no keepalive).
    #[error("rank {peer} is dead: {reason}")]
    PeerDied {
        /// The dead rank.
        peer: usize,
        /// Why the engine declared it dead.
        reason: String,
    },
}

/// Errors of the bootstrap store and of [`crate::store::Bootstrap`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A required environment variable is missing.
    #[error("environment variable {name} is not set; launch with torchrun or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT")]
    MissingEnv {
        /// The variable.
        name: &'static str,
    },
    /// An `ACCORD_*` variable does not parse as its registered type.
    #[error("environment variable {0}")]
    Knob(#[from] accord_knobs::KnobError),
    /// An environment variable has an invalid value.
    #[error("environment variable {name}={value:?} is invalid: {reason}")]
    InvalidEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// Socket I/O failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The store could not be reached before the deadline.
    #[error("could not reach the bootstrap store at {addr} within {waited:?}: {last_error}; check MASTER_ADDR/MASTER_PORT and that rank 0 is running")]
    Unreachable {
        /// The address.
        addr: String,
        /// How long we tried.
        waited: Duration,
        /// The last connect error.
        last_error: String,
    },
    /// Some ranks never arrived.
    #[error("ranks {missing:?} never arrived at the bootstrap store within {waited:?}; check that they were launched and can reach MASTER_ADDR")]
    RanksMissing {
        /// The ranks that did not arrive.
        missing: Vec<usize>,
        /// How long we waited.
        waited: Duration,
    },
    /// A key did not appear before the deadline.
    #[error(
        "key(s) {keys:?} did not appear in the store within {waited:?}; the rank that should set them is slow or dead"
    )]
    KeyTimeout {
        /// The missing keys.
        keys: Vec<String>,
        /// How long we waited.
        waited: Duration,
    },
    /// A frame or field broke the protocol or its limits.
    #[error("bootstrap protocol error: {reason}; all ranks must run the same Accord version")]
    Protocol {
        /// What was wrong.
        reason: String,
    },
    /// The server refused a request.
    #[error("the bootstrap store refused the request: {reason}")]
    Refused {
        /// The server's reason.
        reason: String,
    },
}

/// Errors of configuration parsing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// An `ACCORD_*` variable does not parse as its registered type.
    #[error("{0}")]
    Knob(#[from] accord_knobs::KnobError),
    /// An `ACCORD_*` variable has an invalid value.
    #[error("{name}={value:?} is invalid: {reason}")]
    Invalid {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// Why.
        reason: String,
    },
    /// An algorithm name is unknown for a collective.
    #[error("unknown algorithm {name:?} for {collective}; use one of {valid}")]
    UnknownAlgorithm {
        /// The collective.
        collective: &'static str,
        /// The name given.
        name: String,
        /// The valid names, comma-separated.
        valid: String,
    },
}

/// Errors of a collective call on a [`crate::Communicator`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollError {
    /// Peers did not make progress before the deadline.
    #[error("{collective} (seq {seq}) gave up after {waited:?} (limit {timeout:?}) waiting for rank(s) {missing:?}; they are dead, stuck or unreachable, recreate the communicator without them (or raise ACCORD_COLL_TIMEOUT_MS if they are only slow)")]
    Timeout {
        /// The collective.
        collective: &'static str,
        /// Its sequence number.
        seq: u64,
        /// Ranks we waited for in vain.
        missing: Vec<usize>,
        /// How long this rank had waited when it gave up: less than `timeout` when the
        /// transport reported a peer unreachable first.
        waited: Duration,
        /// The configured timeout.
        timeout: Duration,
    },
    /// A rank failed; found by following other ranks' stuck reports.
    #[error("{collective} (seq {seq}) failed: rank {failed_rank} stopped responding (rank {reported_by} was waiting for it); recreate the communicator without it")]
    PeerFailed {
        /// The collective.
        collective: &'static str,
        /// Its sequence number.
        seq: u64,
        /// The failed rank.
        failed_rank: usize,
        /// The rank that reported it.
        reported_by: usize,
    },
    /// The engine declared a rank dead (its process exited, or it answered no keepalive)
    /// while this rank waited for it: the collective ends at once, naming it.
    #[error("{collective} (seq {seq}) failed: rank {rank} is dead ({reason}); recreate the communicator without it")]
    PeerDied {
        /// The collective.
        collective: &'static str,
        /// Its sequence number.
        seq: u64,
        /// The dead rank.
        rank: usize,
        /// Why the engine declared it dead.
        reason: String,
    },
    /// A buffer is too small or a count is inconsistent.
    #[error(
        "{collective}: {what} needs {needed_bytes} bytes but has {have_bytes}; pass a larger buffer or a smaller count"
    )]
    BufferTooSmall {
        /// The collective.
        collective: &'static str,
        /// Which buffer.
        what: &'static str,
        /// Bytes needed.
        needed_bytes: usize,
        /// Bytes available.
        have_bytes: usize,
    },
    /// Two ranks called a collective with different arguments.
    #[error("{collective}: rank {peer} called with {field} = {theirs} but this rank used {ours}; every rank must pass the same {field}")]
    Mismatch {
        /// The collective.
        collective: &'static str,
        /// The peer that disagrees.
        peer: usize,
        /// The argument.
        field: &'static str,
        /// Our value.
        ours: String,
        /// Theirs.
        theirs: String,
    },
    /// An argument is invalid on this rank alone.
    #[error("{collective}: invalid argument: {reason}")]
    InvalidArgument {
        /// The collective.
        collective: &'static str,
        /// What was wrong and how to fix it.
        reason: String,
    },
    /// The reduction kernel rejected its inputs.
    #[error("{collective}: {source}")]
    Reduce {
        /// The collective.
        collective: &'static str,
        /// The kernel's error.
        #[source]
        source: ReduceError,
    },
    /// Configuration (including algorithm names) is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The transport failed in a way not covered above.
    #[error("{collective}: transport error: {source}")]
    Transport {
        /// The collective.
        collective: &'static str,
        /// The transport's error.
        #[source]
        source: TransportError,
    },
    /// An earlier collective failed; the communicator is unusable.
    #[error("the communicator was aborted by an earlier failure ({reason}); create a new one")]
    Poisoned {
        /// The first failure.
        reason: String,
    },
}
