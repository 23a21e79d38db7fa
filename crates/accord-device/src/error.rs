//! Errors: of the communicator's setup and calls ([`DeviceError`]), of one descriptor
//! ([`DescriptorError`]), of a host producer ([`ProducerError`]) and of a bounded wait
//! ([`WaitError`]).

use std::time::Duration;

/// Why a device communicator call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// Memory for a ring, counters, signals or the table could not be had.
    #[error("could not allocate {what}")]
    Memory {
        /// What was being allocated or accessed.
        what: String,
    },
    /// A configuration value is out of range.
    #[error("bad device communicator configuration: {what}")]
    Config {
        /// Which value, and its bounds.
        what: String,
    },
    /// The engine refused to register memory.
    #[error("registering {what} with the engine failed: {reason}")]
    Register {
        /// What was registered.
        what: String,
        /// The engine's reason.
        reason: String,
    },
    /// A collective step (the descriptor exchange) failed.
    #[error("the exchange of {what} between ranks failed: {reason}")]
    Exchange {
        /// What was exchanged.
        what: String,
        /// Why.
        reason: String,
    },
    /// Ranks registered windows of different lengths.
    #[error("window {window}: rank {rank} registered {len} bytes, rank {first_rank} registered {first_len}: every rank must register the same length")]
    WindowLengthMismatch {
        /// Window id.
        window: u32,
        /// The first rank whose length differs from rank `first_rank`'s.
        rank: usize,
        /// Its length.
        len: u64,
        /// The rank compared against (0).
        first_rank: usize,
        /// That rank's length.
        first_len: u64,
    },
    /// An id (ring, signal, counter, window) is out of range.
    #[error("{what} {id} does not exist (there are {count})")]
    NoSuch {
        /// What kind of id.
        what: &'static str,
        /// The id.
        id: u64,
        /// How many exist.
        count: u64,
    },
    /// A host producer was asked for on a GPU placement (its ticket counter is device memory).
    #[error("host producers exist only for host placement: ring {ring}'s ticket counter is in device memory")]
    NotHostPlacement {
        /// The ring.
        ring: usize,
    },
    /// The communicator was closed.
    #[error("the device communicator is closed")]
    Closed,
}

/// What was wrong with one descriptor, naming the field and its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorErrorKind {
    /// `peer` is not a rank.
    #[error("peer {peer} is not a rank (world {world})")]
    BadPeer {
        /// The field's value.
        peer: u32,
        /// Ranks in the communicator.
        world: u32,
    },
    /// `op` is not an [`crate::layout::Op`].
    #[error("op {op} is not Put (1), PutValue (2) or Signal (3)")]
    BadOp {
        /// The field's value.
        op: u8,
    },
    /// `signal_op` is not a [`crate::layout::SignalOp`].
    #[error("signal_op {signal_op} is not None (0), Add (1) or Set (2)")]
    BadSignalOp {
        /// The field's value.
        signal_op: u8,
    },
    /// A `Signal` descriptor with `signal_op` None: nothing to do, surely a bug.
    #[error("a Signal descriptor with signal_op None does nothing")]
    SignalWithoutAction,
    /// `flags` has bits other than [`crate::layout::FLAG_COUNTER`].
    #[error("flags {flags:#x} has reserved bits set")]
    ReservedFlags {
        /// The field's value.
        flags: u16,
    },
    /// `window` is not a registered window.
    #[error("window {window} is not registered ({count} windows)")]
    BadWindow {
        /// The field's value.
        window: u32,
        /// Windows registered.
        count: u32,
    },
    /// `src_window` is not a registered window.
    #[error("src_window {src_window} is not registered ({count} windows)")]
    BadSrcWindow {
        /// The field's value.
        src_window: u32,
        /// Windows registered.
        count: u32,
    },
    /// `dst_offset + bytes` runs past the destination window (or overflows).
    #[error("dst_offset {dst_offset} + bytes {bytes} runs past window {window} of {window_bytes} bytes")]
    DstOutOfRange {
        /// Window id.
        window: u32,
        /// The field's value.
        dst_offset: u64,
        /// The field's value.
        bytes: u64,
        /// Window length.
        window_bytes: u64,
    },
    /// `src_offset + bytes` runs past the source window (or overflows).
    #[error("src_offset {src_offset} + bytes {bytes} runs past src_window {src_window} of {window_bytes} bytes")]
    SrcOutOfRange {
        /// Window id.
        src_window: u32,
        /// The field's value.
        src_offset: u64,
        /// The field's value.
        bytes: u64,
        /// Window length.
        window_bytes: u64,
    },
    /// A `Put` of zero bytes.
    #[error("a Put of 0 bytes")]
    ZeroBytes,
    /// A `PutValue` whose `bytes` is not 1..=8.
    #[error("a PutValue of {bytes} bytes (1..=8 allowed)")]
    BadValueBytes {
        /// The field's value.
        bytes: u64,
    },
    /// `signal_id` is not a signal.
    #[error("signal_id {signal_id} is not a signal ({count} signals)")]
    BadSignal {
        /// The field's value.
        signal_id: u32,
        /// Signals per rank.
        count: u32,
    },
    /// `counter_id` is not a counter (with [`crate::layout::FLAG_COUNTER`]).
    #[error("counter_id {counter_id} is not a counter ({count} counters)")]
    BadCounter {
        /// The field's value.
        counter_id: u32,
        /// Counters.
        count: u32,
    },
    /// The engine refused to submit the transfer.
    #[error("the engine refused the write to rank {peer}: {reason}")]
    Submit {
        /// Destination rank.
        peer: u32,
        /// The engine's reason.
        reason: String,
    },
    /// The transfer (the put, or its signal write) failed.
    #[error("the {what} to rank {peer} failed: {error}")]
    Transfer {
        /// "put" or "signal write".
        what: &'static str,
        /// Destination rank.
        peer: u32,
        /// The engine's error.
        error: accord_engine::TransferError,
    },
}

/// A descriptor the proxy refused or that failed: nothing of a refused descriptor was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ring {ring}, ticket {ticket}: {kind}")]
pub struct DescriptorError {
    /// The ring it was read from.
    pub ring: usize,
    /// Its ticket.
    pub ticket: u64,
    /// What was wrong.
    pub kind: DescriptorErrorKind,
}

/// Why a [`crate::HostProducer`] could not publish a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    /// The ring stayed full for the whole timeout: the proxy freed no slot. The ticket is taken
    /// and will never be written, so the ring is wedged from here on (a GPU producer would
    /// spin on instead; a host test fails loudly).
    #[error("ring {ring} stayed full for {waited:?} waiting to write ticket {ticket} (consumed {consumed}, {slot_count} slots): is the proxy running?")]
    RingFull {
        /// The ring.
        ring: usize,
        /// The ticket that could not be written.
        ticket: u64,
        /// The proxy's `consumed` at the end of the wait.
        consumed: u64,
        /// Slots in the ring.
        slot_count: u32,
        /// How long it waited.
        waited: Duration,
    },
}

/// Why a bounded host wait gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The signal did not reach the value in time.
    #[error("signal {signal} reached {reached}, not {wanted}, within {waited:?}; ranks whose slot did not move during the wait: {silent:?} (slots by rank: {slots:?})")]
    SignalTimeout {
        /// The signal.
        signal: u32,
        /// Its value at the end (sum of slots minus base).
        reached: u64,
        /// The value waited for.
        wanted: u64,
        /// How long it waited.
        waited: Duration,
        /// Ranks whose slot did not change during the wait.
        silent: Vec<usize>,
        /// Each rank's slot at the end.
        slots: Vec<u64>,
    },
    /// The id is out of range.
    #[error(transparent)]
    Device(#[from] DeviceError),
}
