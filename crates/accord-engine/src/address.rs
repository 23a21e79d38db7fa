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
    /// The process's start time in clock ticks after boot (0: unknown). With `pid` it names
    /// the process unambiguously, so a same-host peer's exit is watched through a pidfd only
    /// when the process at `pid` is this one (not a recycled pid, not another namespace).
    #[serde(default)]
    pub start_ticks: u64,
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

/// Bytes of an exported CUDA IPC handle ([`accord_cuda::IpcHandle::to_bytes`]).
pub const DEVICE_IPC_HANDLE_BYTES: usize = accord_cuda::ipc::IPC_HANDLE_BYTES;

/// A CUDA IPC handle inside a descriptor. Serialised as hex; parsing checks its length and
/// version, so a malformed one from a peer is a parse error, never a bad mapping.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct DeviceIpcBytes(pub [u8; DEVICE_IPC_HANDLE_BYTES]);

impl std::fmt::Debug for DeviceIpcBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceIpcBytes(..)")
    }
}

impl Serialize for DeviceIpcBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let handle = accord_cuda::IpcHandle::from_bytes(&self.0).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&handle.to_hex())
    }
}

impl<'de> Deserialize<'de> for DeviceIpcBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let handle = accord_cuda::IpcHandle::from_hex(&text).map_err(serde::de::Error::custom)?;
        Ok(DeviceIpcBytes(handle.to_bytes()))
    }
}

/// What a same-host peer needs to reach a device region: the GPU and the region's allocation
/// exported through CUDA IPC (the region starts `alloc_offset` bytes into it).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceRegionInfo {
    /// CUDA device ordinal of the owner.
    pub ordinal: u32,
    /// Offset of the region's first byte in the exported allocation.
    pub alloc_offset: u64,
    /// The exported allocation (absent when the driver refused to export it, e.g. memory
    /// from a stream-ordered pool: then only same-process peers can write the region).
    pub ipc: Option<DeviceIpcBytes>,
}

/// What a same-host peer needs to map a host region that lives in a shared-memory file
/// ([`crate::Engine::alloc_shared`]): the owner's process id and the file's random nonce (with
/// the owner's engine id they name the file; no path travels).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SharedHostInfo {
    /// Process that created the file (stale files of dead processes are swept by it).
    pub pid: u32,
    /// Random part of the file name.
    pub nonce: u64,
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
    /// Set for device memory ([`crate::MemoryKind::CudaDevice`]); absent for host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceRegionInfo>,
    /// Set for host memory in a shared-memory file: a same-host writer whose source is device
    /// memory copies straight into it with its GPU's copy engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedHostInfo>,
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
