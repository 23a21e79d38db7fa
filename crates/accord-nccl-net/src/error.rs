//! Errors of the plugin, one enum, each variant saying what to do, each mapped to the NCCL
//! result code NCCL expects for it.

use crate::abi::{self, NcclResult};

/// Why a plugin call failed. Logged through NCCL's logger, returned as an NCCL code.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A call before `init` succeeded, or after `finalize`.
    #[error(
        "the Accord net plugin is not initialised: NCCL must call init first (did init fail? see the earlier warning)"
    )]
    NotInitialised,
    /// The configuration (`ACCORD_NET_*`, `ACCORD_*`) is invalid.
    #[error("invalid Accord net configuration: {0}")]
    Config(String),
    /// The engine could not be built.
    #[error("starting the Accord engine failed: {0}")]
    Engine(#[from] accord_engine::BuildError),
    /// A device index outside `0..devices()`.
    #[error("device {dev} does not exist: this plugin has {count} devices (set ACCORD_NET_IFS for more)")]
    NoSuchDevice {
        /// Asked index.
        dev: i32,
        /// Devices there are.
        count: usize,
    },
    /// NCCL passed a null pointer or an out-of-range value where the ABI requires one.
    #[error("invalid argument from NCCL: {0}")]
    InvalidArgument(String),
    /// The request needs something this plugin does not offer (CUDA pointers, DMA-BUF, ...).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The connection handle is not one of ours.
    #[error("the connection handle is not an Accord handle (magic {magic:#x}): were both ranks started with the same NCCL_NET?")]
    BadHandle {
        /// The magic found.
        magic: u32,
    },
    /// Connection setup over the TCP side channel failed.
    #[error("connection setup with {peer} failed: {reason}: check the address is reachable (ACCORD_NET_IFS) and the peer is alive")]
    Setup {
        /// The side channel's peer.
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// The peer listens on a loopback address of another machine (the default device,
    /// 127.0.0.1, is for jobs on one host).
    #[error(
        "the peer listens on {peer}, a loopback address of another machine: this job spans hosts, so set \
         ACCORD_NET_IFS on every rank to an interface the hosts reach each other by (for example the one \
         in NCCL_SOCKET_IFNAME)"
    )]
    LoopbackAcrossMachines {
        /// The peer's setup address.
        peer: String,
    },
    /// A bounded table is full.
    #[error("{what} is full ({max} entries): close comms or requests first")]
    TableFull {
        /// Which table.
        what: &'static str,
        /// Its bound.
        max: usize,
    },
    /// Memory registration with the engine failed.
    #[error("registering memory failed: {0}")]
    Register(#[from] accord_engine::RegisterError),
    /// The engine refused a submission.
    #[error("submitting a transfer failed: {0}")]
    Submit(#[from] accord_engine::SubmitError),
    /// A transfer failed after submission.
    #[error("a transfer failed: {0}")]
    Transfer(#[from] accord_engine::TransferError),
    /// The engine declared the peer dead (its process exited, or it answered no keepalive):
    /// reported as `ncclRemoteError`, as NCCL's own transports report a peer that went away.
    #[error("the peer engine {peer:x} is dead: {reason}; NCCL aborts the communicator")]
    PeerDied {
        /// The peer engine.
        peer: u64,
        /// Why the engine declared it dead.
        reason: String,
    },
    /// The peer broke the protocol (malformed clear-to-send, unmatched tag).
    #[error("protocol violation on this comm: {0}: both ranks must use the same plugin build")]
    Protocol(String),
    /// A panic inside the plugin, caught at the FFI boundary.
    #[error("internal error (panic) in {0}: please report it with the NCCL log")]
    Panic(&'static str),
}

impl PluginError {
    /// The NCCL result code for this error.
    pub fn code(&self) -> NcclResult {
        match self {
            PluginError::InvalidArgument(_) | PluginError::NoSuchDevice { .. } => abi::NCCL_INVALID_ARGUMENT,
            PluginError::NotInitialised
            | PluginError::BadHandle { .. }
            | PluginError::LoopbackAcrossMachines { .. } => abi::NCCL_INVALID_USAGE,
            PluginError::Setup { .. } | PluginError::Engine(_) => abi::NCCL_SYSTEM_ERROR,
            PluginError::Transfer(_) | PluginError::Protocol(_) | PluginError::PeerDied { .. } => {
                abi::NCCL_REMOTE_ERROR
            }
            PluginError::Config(_)
            | PluginError::Unsupported(_)
            | PluginError::TableFull { .. }
            | PluginError::Register(_)
            | PluginError::Submit(_)
            | PluginError::Panic(_) => abi::NCCL_INTERNAL_ERROR,
        }
    }
}

/// Fails with [`PluginError::PeerDied`] once the engine declared `peer` dead (one atomic load
/// while nobody died): how a request waiting on a peer that died ends instead of hanging.
pub fn check_peer(engine: &accord_engine::Engine, peer: accord_engine::EngineId) -> Result<()> {
    match engine.peer_death(peer) {
        Some(cause) => Err(PluginError::PeerDied { peer: peer.0, reason: cause.to_string() }),
        None => Ok(()),
    }
}

/// Shorthand.
pub type Result<T, E = PluginError> = std::result::Result<T, E>;
