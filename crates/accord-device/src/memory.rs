//! The memory a device communicator hands to GPU code: rings, control words, counters, signal
//! slots and the device table. Where each lives is a [`Placement`] decision made once per
//! communicator; a `Block` hides whether it is plain host memory (CI, no GPU), mapped pinned
//! host memory (`cuMemHostAlloc(PORTABLE | DEVICEMAP)`, reachable by both sides) or device
//! memory (`cuMemAlloc`, reachable by the GPU and the copy engine only).
//!
//! The crate's unsafe code is here and in the ring's producer and consumer (the copies of a
//! descriptor slot); everything else reads and writes these blocks through `Block::word` (an
//! `AtomicU64` view) and `Block::read`/`Block::write` (bounds-checked copies).
#![allow(unsafe_code)]

use crate::error::DeviceError;
use accord_cuda::{DeviceBuffer, Gpu, PinnedHostBuffer, Stream};
use std::alloc::Layout;
use std::sync::atomic::AtomicU64;

/// Alignment of host blocks: a page, so every 64-byte line a GPU polls is its own and the
/// mapped and host variants have the same alignment.
pub const HOST_BLOCK_ALIGN_BYTES: usize = 4096;

/// Where a device communicator's device-visible memory lives.
#[derive(Clone, Debug, Default)]
pub enum Placement {
    /// Plain host memory: no GPU involved (CI, CPU tests). Device addresses in the table are
    /// the host addresses, so a test can follow every one of them.
    #[default]
    Host,
    /// A GPU: rings and counters in mapped pinned host memory (the proxy polls and bumps them
    /// with host loads and stores, the GPU reaches them over PCIe/C2C); the producers' ticket
    /// counter, their cached consumer index, the signal slots peers write into, and the table
    /// in device memory (the GPU hits them on every operation; peers write signals with the copy
    /// engine).
    Gpu(Gpu),
}

impl Placement {
    /// Whether this placement is on a GPU.
    pub fn is_gpu(&self) -> bool {
        matches!(self, Placement::Gpu(_))
    }
}

/// Zeroed, page-aligned host memory owned by this crate.
pub(crate) struct HostBlock {
    ptr: *mut u8,
    len: usize,
}

// Safety: the block is plain memory; every access goes through atomics or through the
// ring protocol that hands each slot to one side at a time.
unsafe impl Send for HostBlock {}
// Safety: as above.
unsafe impl Sync for HostBlock {}

impl HostBlock {
    pub(crate) fn new(len: usize) -> Result<HostBlock, DeviceError> {
        let len = len.max(1);
        let layout = Layout::from_size_align(len, HOST_BLOCK_ALIGN_BYTES)
            .map_err(|_| DeviceError::Memory { what: format!("a host block of {len} bytes") })?;
        // Safety: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(DeviceError::Memory { what: format!("a host block of {len} bytes (out of memory)") });
        }
        Ok(HostBlock { ptr, len })
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, HOST_BLOCK_ALIGN_BYTES).expect("checked at allocation");
        // Safety: allocated in `new` with this layout; nobody holds a pointer past the block's life.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// One block of memory in one of the three places.
pub(crate) enum Block {
    /// Plain host memory ([`Placement::Host`]).
    Host(HostBlock),
    /// Mapped pinned host memory: host pointer and device address.
    Mapped(PinnedHostBuffer),
    /// Device memory; the host reaches it only through copies.
    Device {
        /// The memory.
        buffer: DeviceBuffer,
        /// The stream copies to and from it run on.
        stream: Stream,
    },
}

/// Which kind of memory a block needs, given the placement.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Host-visible and device-visible (mapped pinned memory on a GPU).
    Shared,
    /// Device memory on a GPU.
    DeviceOnly,
}

impl Block {
    /// A zeroed block of `len` bytes for `placement`.
    pub(crate) fn new(placement: &Placement, want: Want, len: usize) -> Result<Block, DeviceError> {
        let len = len.max(8);
        let cuda = |what: &str, e: accord_cuda::CudaError| DeviceError::Memory { what: format!("{what}: {e}") };
        match (placement, want) {
            (Placement::Host, _) => Ok(Block::Host(HostBlock::new(len)?)),
            (Placement::Gpu(gpu), Want::Shared) => {
                Ok(Block::Mapped(PinnedHostBuffer::alloc(gpu, len).map_err(|e| cuda("mapped host memory", e))?))
            }
            (Placement::Gpu(gpu), Want::DeviceOnly) => {
                let mut buffer = DeviceBuffer::alloc(gpu, len).map_err(|e| cuda("device memory", e))?;
                let stream = Stream::new(gpu).map_err(|e| cuda("a stream", e))?;
                buffer.copy_from_host(0, &vec![0u8; len], &stream).map_err(|e| cuda("zeroing device memory", e))?;
                Ok(Block::Device { buffer, stream })
            }
        }
    }

    /// Bytes in the block.
    pub(crate) fn len(&self) -> usize {
        match self {
            Block::Host(b) => b.len,
            Block::Mapped(b) => b.len_bytes(),
            Block::Device { buffer, .. } => buffer.len_bytes(),
        }
    }

    /// The address GPU code uses (the host address for [`Block::Host`]).
    pub(crate) fn device_addr(&self) -> u64 {
        match self {
            Block::Host(b) => b.ptr as u64,
            Block::Mapped(b) => b.device_ptr().0,
            Block::Device { buffer, .. } => buffer.ptr().0,
        }
    }

    /// The host address, where the host can load and store (not for device memory).
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        match self {
            Block::Host(b) => Some(b.ptr),
            Block::Mapped(b) => Some(b.host_ptr()),
            Block::Device { .. } => None,
        }
    }

    /// The 8-byte word at `index` as an atomic the host shares with GPU code; `None` for device
    /// memory or past the end.
    pub(crate) fn word(&self, index: usize) -> Option<&AtomicU64> {
        let base = self.host_ptr()?;
        let end = index.checked_add(1)?.checked_mul(8)?;
        if end > self.len() {
            return None;
        }
        // Safety: in bounds, 8-byte aligned (page-aligned base), valid as long as &self;
        // AtomicU64 tolerates concurrent writers (GPU stores, engine placement).
        Some(unsafe { AtomicU64::from_ptr(base.add(index * 8) as *mut u64) })
    }

    /// Copies `out.len()` bytes from `offset` (device memory through a blocking copy).
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), DeviceError> {
        let end = offset.checked_add(out.len()).filter(|&e| e <= self.len());
        if end.is_none() {
            return Err(DeviceError::Memory { what: format!("a read of {} bytes at {offset}", out.len()) });
        }
        match self {
            Block::Device { buffer, stream } => buffer
                .copy_to_host(offset, out, stream)
                .map_err(|e| DeviceError::Memory { what: format!("reading device memory: {e}") }),
            _ => {
                let base = self.host_ptr().expect("host-visible");
                // Safety: in bounds (checked above); the block outlives the copy. Racing
                // writers (GPU, engine) write whole aligned words, which readers take as such.
                unsafe { std::ptr::copy_nonoverlapping(base.add(offset), out.as_mut_ptr(), out.len()) };
                Ok(())
            }
        }
    }

    /// Copies `data` to `offset` (device memory through a blocking copy).
    pub(crate) fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), DeviceError> {
        let end = offset.checked_add(data.len()).filter(|&e| e <= self.len());
        if end.is_none() {
            return Err(DeviceError::Memory { what: format!("a write of {} bytes at {offset}", data.len()) });
        }
        match self {
            Block::Device { buffer, stream } => buffer
                .copy_from_host(offset, data, stream)
                .map_err(|e| DeviceError::Memory { what: format!("writing device memory: {e}") }),
            _ => {
                let base = self.host_ptr().expect("host-visible");
                // Safety: in bounds (checked above); &mut self: no other host writer.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(offset), data.len()) };
                Ok(())
            }
        }
    }
}

/// Copies a `#[repr(C)]` plain-data value's bytes (the layout structs) for writing into a block.
pub(crate) fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
    let mut out = vec![0u8; std::mem::size_of::<T>()];
    // Safety: T is one of this crate's repr(C) layout structs of integers; reading its bytes
    // (padding included, which these structs do not have) is defined.
    unsafe { std::ptr::copy_nonoverlapping(value as *const T as *const u8, out.as_mut_ptr(), out.len()) };
    out
}

/// Copies a slice of plain-data values' bytes.
pub(crate) fn bytes_of_slice<T: Copy>(values: &[T]) -> Vec<u8> {
    values.iter().flat_map(|v| bytes_of(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn host_blocks_are_zeroed_aligned_and_bounded() {
        let mut b = Block::new(&Placement::Host, Want::DeviceOnly, 100).unwrap();
        assert_eq!(b.device_addr() % HOST_BLOCK_ALIGN_BYTES as u64, 0);
        assert_eq!(b.device_addr(), b.host_ptr().unwrap() as u64, "host placement: the device sees host addresses");
        let mut out = [1u8; 100];
        b.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
        b.write(8, &7u64.to_le_bytes()).unwrap();
        assert_eq!(b.word(1).unwrap().load(Ordering::Acquire), 7);
        assert!(b.word(12).is_none(), "word 12 ends at byte 104, past the 100-byte block");
        assert!(b.write(99, &[0, 0]).is_err());
        assert!(b.read(usize::MAX, &mut [0u8; 2]).is_err());
    }
}
