//! Sharing VMM memory (`cuMemCreate`) between processes of one host, by POSIX file descriptors.
//!
//! Why: CUDA IPC handles ([`crate::IpcHandle`]) exist only for `cuMemAlloc` memory, and that
//! memory belongs to the context that allocated it, so the driver makes a copy of it wait
//! behind that context's synchronous calls (a `tensor.cpu()` of the application's thread
//! stalls the GPU collectives' progress thread). Memory from `cuMemCreate` belongs to no
//! context: copied from a private context it never waits there
//! (`scripts/device/vmm_ipc_probe.py`, docs/results/2026-11-26-torch-gpu-path.md). PyTorch
//! allocates that way under `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, with POSIX fd
//! handles, one mapping per segment (20 MiB each in torch 2.11).
//!
//! A range is exported as the list of mappings it spans ([`VmmExport`]): each a file descriptor
//! of its physical allocation, its offset from the first mapping's start and its size. Another
//! process takes the descriptors ([`take_fd_of`], `pidfd_getfd`), and [`VmmMapping::map`]
//! reserves one address range and maps every piece at its offset, so the exporter's range
//! appears contiguous there too.
//!
//! # Lifetime rules
//! - The exporter keeps its memory mapped until every importer dropped its [`VmmMapping`]. The
//!   physical memory itself outlives an early free (the importer's mapping holds a reference),
//!   so a late importer reads stale bytes, never another allocation's.
//! - The exporter keeps the descriptors of [`VmmExport`] open until importers have taken them.

use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

use crate::context::Gpu;
use crate::error::{CudaError, Result};
use crate::ffi::driver;
use crate::memory::DevicePtr;

/// Most pieces one range may have (the walk's bound, [`crate::memory::VMM_SPAN_MAPPINGS_MAX`]:
/// 64 GiB of PyTorch's 20 MiB segments). A peer naming more is refused before anything is mapped.
pub const VMM_PIECES_MAX: usize = crate::memory::VMM_SPAN_MAPPINGS_MAX;

/// One mapping of an exported range: its physical allocation as a file descriptor, where it
/// starts relative to the first piece, and its size.
#[derive(Debug)]
pub struct VmmPiece {
    /// Offset from the first piece's start.
    pub offset: u64,
    /// Bytes of the mapping.
    pub len_bytes: u64,
    /// The allocation, exported.
    pub fd: OwnedFd,
}

/// A device range exported for other processes of this host.
#[derive(Debug)]
pub struct VmmExport {
    /// The mappings the range spans, in address order.
    pub pieces: Vec<VmmPiece>,
    /// The exported pointer's offset from the first piece's start.
    pub ptr_offset: u64,
}

/// Exports the mappings that `[ptr, ptr + len_bytes)` spans on `gpu`. Fails with
/// `InvalidArgument` for memory that is not VMM memory created exportable as a POSIX fd (for
/// instance `cuMemAlloc` memory, or PyTorch's without expandable segments).
/// Each mapping is taken to map its whole allocation handle from offset 0 (as PyTorch's
/// expandable segments do): the importer maps each handle at offset 0 for the mapping's size,
/// so a mapping made at an offset into its handle would be read wrongly on the peer.
pub fn export_vmm_range(gpu: &Gpu, ptr: DevicePtr, len_bytes: usize) -> Result<VmmExport> {
    if len_bytes == 0 {
        return Err(CudaError::InvalidArgument { what: "an exported range needs at least one byte".into() });
    }
    let _restore = gpu.bind_scoped()?;
    let mappings = crate::memory::vmm_mappings(ptr, len_bytes)?;
    let first = mappings[0].0;
    let mut pieces = Vec::with_capacity(mappings.len());
    for (base, size) in mappings {
        let handle = driver::mem_retain_allocation_handle(base).map_err(|e| CudaError::InvalidArgument {
            what: format!("0x{base:x} is not VMM memory ({e}); allocate with cuMemCreate, e.g. PyTorch with expandable_segments:True"),
        })?;
        let exported = driver::mem_handle_exports_fd(handle).and_then(|fd_ok| {
            if fd_ok {
                driver::mem_export_fd(handle)
            } else {
                Err(CudaError::InvalidArgument {
                    what: format!("the allocation at 0x{base:x} was not created exportable as a POSIX fd"),
                })
            }
        });
        let _ = driver::mem_release(handle);
        pieces.push(VmmPiece { offset: base - first, len_bytes: size as u64, fd: exported? });
    }
    Ok(VmmExport { pieces, ptr_offset: ptr.0 - first })
}

/// Checks a peer's piece list before anything is mapped: at least one piece, at most
/// [`VMM_PIECES_MAX`], no empty piece, each starting where the one before ended (from 0), and
/// a total that fits. Returns the total.
pub fn check_pieces(pieces: &[(u64, u64)]) -> Result<u64> {
    if pieces.is_empty() || pieces.len() > VMM_PIECES_MAX {
        return Err(CudaError::InvalidArgument {
            what: format!("{} pieces; a range has 1..={VMM_PIECES_MAX}", pieces.len()),
        });
    }
    let mut expected = 0u64;
    for (i, &(offset, len)) in pieces.iter().enumerate() {
        if offset != expected || len == 0 {
            return Err(CudaError::InvalidArgument {
                what: format!("piece {i} at offset {offset} of {len} bytes; expected a non-empty piece at {expected}"),
            });
        }
        expected = offset
            .checked_add(len)
            .ok_or_else(|| CudaError::InvalidArgument { what: format!("piece {i} ends past 2^64") })?;
    }
    if expected > isize::MAX as u64 {
        return Err(CudaError::InvalidArgument { what: format!("a range of {expected} bytes is too large") });
    }
    Ok(expected)
}

/// Takes a duplicate of process `pid`'s descriptor `fd` ([`accord_sys::take_fd_of`]);
/// a failure names the process and why. Refused (EPERM, kept as the error's kind by
/// `accord_sys`, which rewrites the message) it also names the cause most hosts
/// have: Yama's ptrace scope 1 (Ubuntu's default) lets a process take descriptors only from its
/// descendants, and ranks started by one launcher are siblings.
pub fn take_fd_of(pid: u32, fd: RawFd) -> Result<OwnedFd> {
    accord_sys::take_fd_of(pid, fd).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            " (sharing VMM memory between processes needs ptrace permission over the exporter: \
             check kernel.yama.ptrace_scope, 0 allows it between processes of one user)"
        } else {
            ""
        };
        CudaError::VmmShare { exporter_pid: pid, reason: format!("{e}{hint}") }
    })
}

/// Another process's exported range, mapped here for one GPU: one reserved address range with
/// every piece at its offset. Unmapped and given back on drop.
#[derive(Debug)]
pub struct VmmMapping {
    gpu: Gpu,
    base: u64,
    len_bytes: usize,
    mapped: Vec<(u64, usize)>,
}

impl VmmMapping {
    /// Maps `pieces` (offset, size, descriptor, as [`check_pieces`] accepts them) readable and
    /// writable by `gpu`.
    pub fn map(gpu: &Gpu, pieces: &[(u64, u64, BorrowedFd<'_>)]) -> Result<VmmMapping> {
        let layout: Vec<(u64, u64)> = pieces.iter().map(|&(o, l, _)| (o, l)).collect();
        let total = check_pieces(&layout)? as usize;
        let _restore = gpu.bind_scoped()?;
        let base = driver::mem_address_reserve(total)?;
        let mut mapping = VmmMapping { gpu: gpu.clone(), base, len_bytes: total, mapped: Vec::new() };
        for &(offset, len, fd) in pieces {
            let handle = driver::mem_import_fd(fd)?;
            let mapped = driver::mem_map_for(base + offset, len as usize, handle, gpu.raw_device());
            let _ = driver::mem_release(handle);
            mapped?;
            mapping.mapped.push((base + offset, len as usize));
        }
        Ok(mapping)
    }

    /// Where the exporter's first piece starts here (add [`VmmExport::ptr_offset`]).
    pub fn base(&self) -> DevicePtr {
        DevicePtr(self.base)
    }

    /// Bytes mapped.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        let Ok(_restore) = self.gpu.bind_scoped() else { return };
        for &(ptr, len) in &self.mapped {
            let _ = driver::mem_unmap(ptr, len);
        }
        let _ = driver::mem_address_free(self.base, self.len_bytes);
    }
}

/// Borrowed views of an export's pieces, as [`VmmMapping::map`] takes them (the same process
/// may map its own export; other processes take the descriptors with [`take_fd_of`] first).
pub fn pieces_of(export: &VmmExport) -> Vec<(u64, u64, BorrowedFd<'_>)> {
    use std::os::fd::AsFd;
    export.pieces.iter().map(|p| (p.offset, p.len_bytes, p.fd.as_fd())).collect()
}

#[cfg(test)]
mod tests;
