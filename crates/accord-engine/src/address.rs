//! The values engines exchange: an engine's address and memory-region descriptors.

use crate::error::ParseError;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// This host's name as engines advertise it (read once): peers whose address names the same
/// host get shared-memory rings.
pub(crate) fn this_host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string())
}

/// A random 64-bit identity, unique per engine instance (a restarted process gets a new one).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EngineId(pub u64);

/// What a peer needs to reach an engine. Small, serialisable, shareable out of band.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineAddress {
    /// The engine's identity.
    pub id: EngineId,
    /// Per NIC, per worker, the socket address of each path (path `i` pairs with path `i`).
    pub nics: Vec<Vec<Vec<SocketAddr>>>,
    /// Host name, for same-host detection and diagnostics.
    pub host: String,
    /// Process id, for same-process detection and diagnostics.
    pub pid: u32,
    /// The engine's control region (zero bytes long): barriers write immediates to it.
    pub control: MrDescriptor,
}

impl EngineAddress {
    /// Serialises to a compact string (JSON).
    pub fn to_string_compact(&self) -> String {
        serde_json::to_string(self).expect("addresses always serialise")
    }

    /// Parses what [`EngineAddress::to_string_compact`] produced.
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        serde_json::from_str(s.trim()).map_err(|source| ParseError { what: "engine address", source })
    }
}

/// What a peer needs to write into a registered region: its engine, id, key and length.
/// Holding a descriptor is the permission to write; share it only with trusted peers.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MrDescriptor {
    /// Engine that owns the region.
    pub engine: EngineId,
    /// Region id at that engine.
    pub region: u32,
    /// Random key authorising writes.
    pub key: u64,
    /// Length in bytes.
    pub len: u64,
}

impl MrDescriptor {
    /// Serialises to a compact string (JSON).
    pub fn to_string_compact(&self) -> String {
        serde_json::to_string(self).expect("descriptors always serialise")
    }

    /// Parses what [`MrDescriptor::to_string_compact`] produced.
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        serde_json::from_str(s.trim()).map_err(|source| ParseError { what: "region descriptor", source })
    }
}
