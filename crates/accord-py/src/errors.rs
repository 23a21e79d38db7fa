//! Engine and collective errors as Python exceptions.
//!
//! The hierarchy lives in Python (`accord/errors.py`) so a class can have two bases
//! (`accord.TimeoutError` is also the builtin `TimeoutError`, `accord.InvalidBufferError` also a
//! `ValueError`); this module looks each class up once and raises it with the engine's message,
//! which already says what to do, prefixed by the operation that failed.

use accord_coll::{CollError, TransportError};
use accord_engine::{BarrierError, BuildError, ParseError, RegisterError, SubmitError, TransferError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes of `accord.errors`, by what went wrong.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Anything else the engine reports (`accord.AccordError`, the base of all).
    Accord,
    /// The engine could not be built from its settings.
    Config,
    /// Arguments refused before anything was sent.
    InvalidRequest,
    /// A buffer that cannot be registered, a closed region, a range outside a region.
    InvalidBuffer,
    /// The receiver refused a write or send.
    RemoteAccess,
    /// A peer is unknown or stopped answering.
    Peer,
    /// A wait gave up.
    Timeout,
    /// The engine was closed.
    Shutdown,
}

const KINDS: [Kind; 8] = [
    Kind::Accord,
    Kind::Config,
    Kind::InvalidRequest,
    Kind::InvalidBuffer,
    Kind::RemoteAccess,
    Kind::Peer,
    Kind::Timeout,
    Kind::Shutdown,
];

impl Kind {
    pub(crate) fn class_name(self) -> &'static str {
        match self {
            Kind::Accord => "AccordError",
            Kind::Config => "ConfigError",
            Kind::InvalidRequest => "InvalidRequestError",
            Kind::InvalidBuffer => "InvalidBufferError",
            Kind::RemoteAccess => "RemoteAccessError",
            Kind::Peer => "PeerError",
            Kind::Timeout => "TimeoutError",
            Kind::Shutdown => "ShutdownError",
        }
    }
}

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn class(py: Python<'_>, kind: Kind) -> PyResult<Bound<'_, PyType>> {
    let classes = CLASSES.get_or_try_init(py, || -> PyResult<_> {
        let module = py.import("accord.errors")?;
        KINDS.iter().map(|k| Ok(module.getattr(k.class_name())?.cast_into::<PyType>()?.unbind())).collect()
    })?;
    let index = KINDS.iter().position(|k| *k == kind).expect("every kind is listed in KINDS");
    Ok(classes[index].bind(py).clone())
}

/// An exception of `kind` with `message`.
pub(crate) fn error(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match class(py, kind) {
        Ok(ty) => PyErr::from_type(ty, message),
        Err(lookup) => lookup,
    })
}

/// The engine could not be built.
pub(crate) fn build_error(e: BuildError) -> PyErr {
    error(Kind::Config, format!("building the engine: {e}"))
}

/// Memory could not be registered.
pub(crate) fn register_error(e: RegisterError) -> PyErr {
    let kind = match e {
        RegisterError::BadLength { .. } => Kind::InvalidBuffer,
        RegisterError::TableFull(_)
        | RegisterError::OutOfMemory(_)
        | RegisterError::Device(_)
        | RegisterError::Shared(_) => Kind::Accord,
    };
    error(kind, format!("register: {e}"))
}

/// `op` was refused at submission; nothing was sent.
pub(crate) fn submit_error(op: &str, e: SubmitError) -> PyErr {
    let kind = match e {
        SubmitError::SourceOutOfBounds { .. }
        | SubmitError::DestinationOutOfBounds { .. }
        | SubmitError::UnknownSource => Kind::InvalidBuffer,
        SubmitError::UnknownPeer(_) => Kind::Peer,
        SubmitError::Invalid(_) => Kind::InvalidRequest,
        SubmitError::ShutDown => Kind::Shutdown,
    };
    error(kind, format!("{op}: {e}"))
}

/// A submitted transfer failed.
pub(crate) fn transfer_error(e: TransferError) -> PyErr {
    let kind = match e {
        TransferError::Rejected(_) => Kind::RemoteAccess,
        TransferError::PeerUnreachable
        | TransferError::PeerDied { .. }
        | TransferError::NoReply { .. }
        | TransferError::PeerUnresponsive { .. } => Kind::Peer,
        TransferError::ShutDown => Kind::Shutdown,
        TransferError::Timeout => Kind::Timeout,
    };
    error(kind, format!("transfer failed: {e}"))
}

/// A barrier failed.
pub(crate) fn barrier_error(e: BarrierError) -> PyErr {
    match e {
        BarrierError::Submit(s) => submit_error("barrier", s),
        BarrierError::Transfer(t) => transfer_error(t),
        BarrierError::Timeout { .. } => error(Kind::Timeout, e.to_string()),
    }
}

/// An address or descriptor string did not parse.
pub(crate) fn parse_error(e: ParseError) -> PyErr {
    error(Kind::InvalidRequest, e.to_string())
}

/// The engine was closed before this call.
pub(crate) fn closed(op: &str) -> PyErr {
    error(Kind::Shutdown, format!("{op}: the engine is closed: create a new accord.Engine"))
}

/// A collective failure as the exception of `accord.errors` it belongs to.
pub(crate) fn coll_error(e: CollError) -> PyErr {
    error(coll_error_kind(&e), e.to_string())
}

/// Which exception of `accord.errors` a collective failure belongs to (also for callers that
/// report it without Python: `torch_native`).
pub(crate) fn coll_error_kind(e: &CollError) -> Kind {
    match e {
        CollError::Timeout { .. } => Kind::Timeout,
        CollError::PeerFailed { .. } | CollError::PeerDied { .. } => Kind::Peer,
        CollError::BufferTooSmall { .. } => Kind::InvalidBuffer,
        CollError::InvalidArgument { .. } | CollError::Mismatch { .. } | CollError::Reduce { .. } => {
            Kind::InvalidRequest
        }
        CollError::Config(_) => Kind::Config,
        CollError::Transport { source, .. } => match source {
            TransportError::Timeout { .. } | TransportError::AckTimeout { .. } => Kind::Timeout,
            TransportError::Aborted { .. }
            | TransportError::PeerUnreachable { .. }
            | TransportError::PeerDied { .. } => Kind::Peer,
            TransportError::Stopped => Kind::Shutdown,
            _ => Kind::Accord,
        },
        _ => Kind::Accord,
    }
}
