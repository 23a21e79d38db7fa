//! Sharing device memory between processes of one host (CUDA IPC).
//!
//! # Lifetime rules
//!
//! - The exporter ([`IpcHandle::export`]) must keep its [`DeviceBuffer`]
//!   alive until every importer dropped its [`IpcMapping`]; the protocol
//!   above (the engine) tells the exporter when. Freeing earlier leaves the
//!   importer's mapping pointing at memory the driver may hand out again.
//! - A handle cannot be opened in the process that exported it (the driver
//!   refuses); open it in another process, on any GPU of the host that can
//!   reach the exporter's GPU.
//! - Opening a handle whose exporter exited fails with
//!   [`CudaError::IpcOpen`]: we check that the exporter's pid still exists
//!   before calling the driver, and the driver itself refuses handles of
//!   destroyed allocations. Nothing on our side dereferences a stale handle.
//! - One process should open a given handle once and share the mapping: the engine's
//!   copy-engine route and the GPU collectives keep theirs in a [`MappingCache`].
//!
//! # Future work
//!
//! Legacy IPC handles cover `cuMemAlloc` memory on one host. Memory from the
//! virtual memory management API (`cuMemCreate`) is shared with POSIX file
//! descriptors by [`vmm`]; across the hosts of an NVLink domain it would take fabric
//! handles (`CU_MEM_HANDLE_TYPE_FABRIC`), not built.

mod cache;
pub mod vmm;

pub use cache::MappingCache;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::context::Gpu;
use crate::error::{CudaError, IpcHandleParseError, Result};
use crate::ffi::driver;
use crate::memory::{DeviceBuffer, DevicePtr};

/// Bytes of the driver's opaque handle.
pub const IPC_RAW_HANDLE_BYTES: usize = 64;
/// Version byte written first in a serialised handle.
pub const IPC_HANDLE_VERSION: u8 = 1;
/// Bytes of a serialised [`IpcHandle`]: version, raw handle, length, pid.
pub const IPC_HANDLE_BYTES: usize = 1 + IPC_RAW_HANDLE_BYTES + 8 + 4;

/// A device allocation exported for other processes: the driver's 64-byte
/// opaque handle plus the allocation's length and the exporter's pid.
/// Serialisable as bytes, hex text, or through serde (as hex text).
#[derive(Clone, PartialEq, Eq)]
pub struct IpcHandle {
    raw: [u8; IPC_RAW_HANDLE_BYTES],
    len_bytes: u64,
    exporter_pid: u32,
}

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcHandle")
            .field("len_bytes", &self.len_bytes)
            .field("exporter_pid", &self.exporter_pid)
            .finish()
    }
}

impl IpcHandle {
    /// Exports the whole of `buffer`. See the module's lifetime rules.
    pub fn export(buffer: &DeviceBuffer) -> Result<IpcHandle> {
        buffer.gpu().bind()?;
        let raw = driver::ipc_get_mem_handle(buffer.ptr().0)?;
        Ok(IpcHandle { raw, len_bytes: buffer.len_bytes() as u64, exporter_pid: std::process::id() })
    }

    /// Exports the allocation that holds `ptr..ptr + len_bytes` on `gpu`
    /// (memory registered by address, not owned as a [`DeviceBuffer`]).
    /// Returns the handle (of the whole allocation) and `ptr`'s offset in it,
    /// which the opener adds to the mapped base.
    pub fn export_range(gpu: &Gpu, ptr: DevicePtr, len_bytes: usize) -> Result<(IpcHandle, u64)> {
        gpu.bind()?;
        crate::memory::check_device_range(ptr, len_bytes)?;
        let (base, size) = driver::mem_address_range(ptr.0)?;
        let raw = driver::ipc_get_mem_handle(base)?;
        let handle = IpcHandle { raw, len_bytes: size as u64, exporter_pid: std::process::id() };
        Ok((handle, ptr.0 - base))
    }

    /// Builds a handle from its parts (for tests and foreign exporters).
    pub fn from_parts(raw: [u8; IPC_RAW_HANDLE_BYTES], len_bytes: u64, exporter_pid: u32) -> IpcHandle {
        IpcHandle { raw, len_bytes, exporter_pid }
    }

    /// The driver's opaque bytes.
    pub fn raw(&self) -> &[u8; IPC_RAW_HANDLE_BYTES] {
        &self.raw
    }

    /// Length of the exported allocation.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// The exporting process.
    pub fn exporter_pid(&self) -> u32 {
        self.exporter_pid
    }

    /// Fixed-layout bytes: version, raw handle, length (little endian), pid (little endian).
    pub fn to_bytes(&self) -> [u8; IPC_HANDLE_BYTES] {
        let mut out = [0u8; IPC_HANDLE_BYTES];
        out[0] = IPC_HANDLE_VERSION;
        out[1..65].copy_from_slice(&self.raw);
        out[65..73].copy_from_slice(&self.len_bytes.to_le_bytes());
        out[73..77].copy_from_slice(&self.exporter_pid.to_le_bytes());
        out
    }

    /// Parses [`IpcHandle::to_bytes`]'s output.
    pub fn from_bytes(bytes: &[u8; IPC_HANDLE_BYTES]) -> std::result::Result<IpcHandle, IpcHandleParseError> {
        if bytes[0] != IPC_HANDLE_VERSION {
            return Err(IpcHandleParseError::Version { expected: IPC_HANDLE_VERSION, got: bytes[0] });
        }
        let mut raw = [0u8; IPC_RAW_HANDLE_BYTES];
        raw.copy_from_slice(&bytes[1..65]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[65..73]);
        let mut pid = [0u8; 4];
        pid.copy_from_slice(&bytes[73..77]);
        Ok(IpcHandle { raw, len_bytes: u64::from_le_bytes(len), exporter_pid: u32::from_le_bytes(pid) })
    }

    /// Lower-case hex of [`IpcHandle::to_bytes`].
    pub fn to_hex(&self) -> String {
        self.to_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`IpcHandle::to_hex`]'s output.
    pub fn from_hex(text: &str) -> std::result::Result<IpcHandle, IpcHandleParseError> {
        let text = text.trim();
        if text.len() != IPC_HANDLE_BYTES * 2 {
            return Err(IpcHandleParseError::Length { expected: IPC_HANDLE_BYTES * 2, got: text.len() });
        }
        let mut bytes = [0u8; IPC_HANDLE_BYTES];
        let digits = text.as_bytes();
        for (i, byte) in bytes.iter_mut().enumerate() {
            let hi = hex_value(digits[2 * i]).ok_or(IpcHandleParseError::NotHex { index: 2 * i })?;
            let lo = hex_value(digits[2 * i + 1]).ok_or(IpcHandleParseError::NotHex { index: 2 * i + 1 })?;
            *byte = (hi << 4) | lo;
        }
        IpcHandle::from_bytes(&bytes)
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

impl Serialize for IpcHandle {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for IpcHandle {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<IpcHandle, D::Error> {
        let text = String::deserialize(deserializer)?;
        IpcHandle::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// Another process's device allocation mapped into this process. Unmapped on
/// drop (after synchronising the GPU, so queued copies finish first).
pub struct IpcMapping {
    gpu: Gpu,
    ptr: DevicePtr,
    len_bytes: usize,
    exporter_pid: u32,
}

impl fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcMapping")
            .field("gpu", &self.gpu.ordinal())
            .field("ptr", &self.ptr)
            .field("len_bytes", &self.len_bytes)
            .field("exporter_pid", &self.exporter_pid)
            .finish()
    }
}

impl IpcMapping {
    /// Maps `handle` into `gpu`'s context (peer access enabled lazily by the driver).
    pub fn open(gpu: &Gpu, handle: &IpcHandle) -> Result<IpcMapping> {
        let exporter_pid = handle.exporter_pid;
        if exporter_pid == std::process::id() {
            return Err(CudaError::IpcOpen {
                exporter_pid,
                reason: "this process exported the handle; use the DeviceBuffer directly".into(),
            });
        }
        if !accord_sys::process_alive(exporter_pid) {
            return Err(CudaError::IpcOpen { exporter_pid, reason: "the exporting process has exited".into() });
        }
        gpu.bind()?;
        let ptr = driver::ipc_open_mem_handle(&handle.raw)
            .map_err(|e| CudaError::IpcOpen { exporter_pid, reason: e.to_string() })?;
        Ok(IpcMapping { gpu: gpu.clone(), ptr: DevicePtr(ptr), len_bytes: handle.len_bytes as usize, exporter_pid })
    }

    /// The mapped address, valid in this process on the mapping's GPU.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Length of the mapped allocation.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The GPU whose context holds the mapping.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.gpu.synchronize().is_ok() {
            let _ = driver::ipc_close_mem_handle(self.ptr.0);
        }
    }
}

#[cfg(test)]
mod tests;
