//! Device memory: allocation, copies on a stream, memset, range validation.
//!
//! Pinned and registered host memory live in [`crate::ffi::host_memory`]
//! because they hand out host references into driver-owned pages.

use std::fmt;

pub use crate::device_ptr::DevicePtr;

use crate::context::Gpu;
use crate::error::{CudaError, Result};
use crate::ffi::driver;
use crate::stream::Stream;

/// Checks that `ptr..ptr+len_bytes` lies inside one live device allocation, or (VMM memory, as
/// PyTorch's expandable segments) inside a run of back-to-back mappings.
/// Works for `cuMemAlloc` memory and IPC mappings (allocation ranges), and
/// for pinned or registered host memory (pointer range attributes).
pub fn check_device_range(ptr: DevicePtr, len_bytes: usize) -> Result<()> {
    let (base, size) = match driver::mem_address_range(ptr.0) {
        Ok(range) => range,
        Err(first) => driver::pointer_range(ptr.0).map_err(|second| CudaError::BadDeviceRange {
            ptr: ptr.0,
            len_bytes,
            detail: format!("{first}; {second}"),
        })?,
    };
    let end = ptr.0.checked_add(len_bytes as u64);
    match end {
        Some(end) if end <= base + size as u64 => Ok(()),
        // VMM memory (PyTorch's expandable segments) is one mapping per segment, back to back.
        // The walk alone: the buffer ids `vmm_span` reads for its fingerprint are not needed to
        // check a range, and this runs on every borrowed buffer of a collective.
        Some(_) if matches!(driver::pointer_has_owner_context(ptr.0), Ok(false)) => {
            vmm_mappings(ptr, len_bytes).map(|_| ())
        }
        _ => Err(CudaError::BadDeviceRange {
            ptr: ptr.0,
            len_bytes,
            detail: format!("the allocation is 0x{base:x}+{size}"),
        }),
    }
}

/// Most back-to-back VMM mappings one range may span (64 GiB of PyTorch's 20 MiB segments).
pub const VMM_SPAN_MAPPINGS_MAX: usize = 3277;

/// The mappings (`(start, size)`, in address order) that `ptr..ptr + len_bytes` spans, which
/// must follow one another with no gap, at most [`VMM_SPAN_MAPPINGS_MAX`]: how VMM memory
/// (PyTorch's expandable segments) lies, one mapping per segment. The one walk both the range
/// check and the export ([`crate::ipc::vmm::export_vmm_range`]) use.
pub(crate) fn vmm_mappings(ptr: DevicePtr, len_bytes: usize) -> Result<Vec<(u64, usize)>> {
    let bad = |detail: String| CudaError::BadDeviceRange { ptr: ptr.0, len_bytes, detail };
    let end = ptr.0.checked_add(len_bytes as u64).ok_or_else(|| bad("it wraps the address space".into()))?;
    let (first, size) = driver::mem_address_range(ptr.0)?;
    let mut mappings = vec![(first, size)];
    let mut reached = first + size as u64;
    while reached < end {
        if mappings.len() == VMM_SPAN_MAPPINGS_MAX {
            return Err(bad(format!("it spans more than {VMM_SPAN_MAPPINGS_MAX} mappings")));
        }
        let (next, next_size) = driver::mem_address_range(reached)
            .map_err(|e| bad(format!("nothing mapped at 0x{reached:x} after 0x{first:x}: {e}")))?;
        if next != reached || next_size == 0 {
            return Err(bad(format!("the mapping after 0x{first:x}..0x{reached:x} starts at 0x{next:x}")));
        }
        mappings.push((next, next_size));
        reached = next + next_size as u64;
    }
    Ok(mappings)
}

/// The span of [`vmm_mappings`]: `(first mapping's start, last mapping's end, a fingerprint of
/// the mappings' buffer ids)`. A mapping that is unmapped and replaced gets a new buffer id, so
/// the fingerprint changes.
fn vmm_span(ptr: DevicePtr, len_bytes: usize) -> Result<(u64, u64, u64)> {
    let mappings = vmm_mappings(ptr, len_bytes)?;
    let mut fingerprint = 0xcbf2_9ce4_8422_2325;
    for &(start, _) in &mappings {
        fingerprint = fold_id(fingerprint, driver::pointer_buffer_id(start)?);
    }
    let (first, last) = (mappings[0], mappings[mappings.len() - 1]);
    Ok((first.0, last.0 + last.1 as u64, fingerprint))
}

/// FNV-1a over the bytes of `id`, continuing from `hash`.
fn fold_id(hash: u64, id: u64) -> u64 {
    id.to_le_bytes().iter().fold(hash, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The ordinal of the GPU that owns device memory at `ptr` (for memory handed over by another
/// library, such as NCCL's buffers, whose GPU the caller does not know).
pub fn device_ordinal_of(ptr: DevicePtr) -> Result<u32> {
    driver::ensure_driver()?;
    driver::pointer_device_ordinal(ptr.0)
}

/// Whether a CUDA context owns the device memory at `ptr`: true for `cuMemAlloc`/`cudaMalloc`
/// memory, false for the virtual memory API's (`cuMemCreate`, which NCCL uses for its buffers
/// by default). Copies of context-owned memory wait behind that context's synchronous calls even
/// when submitted from a private context ([`crate::Gpu::open_private`]).
pub fn has_owner_context(ptr: DevicePtr) -> Result<bool> {
    driver::ensure_driver()?;
    driver::pointer_has_owner_context(ptr.0)
}

/// The GPU whose context is current on the calling thread (a library such as NCCL sets its
/// device on the threads that call us), or `None` without a driver or a current context.
pub fn current_device_ordinal() -> Option<u32> {
    driver::ensure_driver().ok()?;
    driver::current_context_device().ok().flatten()
}

/// The `cuMemAlloc` allocation holding device memory at `ptr`: where it starts, how long it is,
/// and the driver's id of it, which is never reused in this process. A library that caches
/// something per allocation of memory it did not allocate (a framework's caching allocator may
/// free a segment and get the same address back for a new one) keys the cache by that id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// First byte of the allocation.
    pub base: DevicePtr,
    /// Its length in bytes.
    pub len_bytes: usize,
    /// The driver's id of it (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub buffer_id: u64,
}

/// The allocation holding `ptr..ptr + len_bytes`, which must lie inside it.
/// For VMM memory the "allocation" is the run of back-to-back mappings the range spans, and the
/// id a fingerprint of theirs.
pub fn allocation_of(ptr: DevicePtr, len_bytes: usize) -> Result<Allocation> {
    driver::ensure_driver()?;
    if matches!(driver::pointer_has_owner_context(ptr.0), Ok(false)) {
        let (base, end, buffer_id) = vmm_span(ptr, len_bytes.max(1))?;
        return Ok(Allocation { base: DevicePtr(base), len_bytes: (end - base) as usize, buffer_id });
    }
    check_device_range(ptr, len_bytes)?;
    let (base, len) = driver::mem_address_range(ptr.0)?;
    let buffer_id = driver::pointer_buffer_id(ptr.0)?;
    Ok(Allocation { base: DevicePtr(base), len_bytes: len, buffer_id })
}

/// Checks `offset_bytes + len_bytes <= capacity_bytes` without overflow.
pub(crate) fn check_span(what: &str, offset_bytes: usize, len_bytes: usize, capacity_bytes: usize) -> Result<()> {
    match offset_bytes.checked_add(len_bytes) {
        Some(end) if end <= capacity_bytes => Ok(()),
        _ => Err(CudaError::InvalidArgument {
            what: format!(
                "{what}: offset {offset_bytes} + length {len_bytes} exceeds the {capacity_bytes} bytes available"
            ),
        }),
    }
}

/// Memory on one GPU from `cuMemAlloc`, freed on drop.
///
/// Dropping frees the memory; like `cudaFree`, the driver's free waits for
/// work already queued on the device, so dropping a buffer with copies in
/// flight is safe, but slow.
pub struct DeviceBuffer {
    gpu: Gpu,
    ptr: DevicePtr,
    len_bytes: usize,
    /// Who frees the memory on drop.
    owner: Owner,
}

/// How a [`DeviceBuffer`]'s memory is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// `cuMemAlloc`: freed with `cuMemFree`.
    Alloc,
    /// [`DeviceBuffer::alloc_unowned`]: unmapped and freed, `.0` bytes mapped.
    Vmm(usize),
    /// [`DeviceBuffer::borrow_raw`]: someone else's memory, never freed here.
    Borrowed,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("gpu", &self.gpu.ordinal())
            .field("ptr", &self.ptr)
            .field("len_bytes", &self.len_bytes)
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `len_bytes` (at least 1) on `gpu`; the contents are undefined.
    pub fn alloc(gpu: &Gpu, len_bytes: usize) -> Result<DeviceBuffer> {
        if len_bytes == 0 {
            return Err(CudaError::InvalidArgument { what: "a device buffer needs at least one byte".into() });
        }
        gpu.bind()?;
        let ptr = DevicePtr(driver::mem_alloc(len_bytes)?);
        Ok(DeviceBuffer { gpu: gpu.clone(), ptr, len_bytes, owner: Owner::Alloc })
    }

    /// As [`DeviceBuffer::alloc`], through the virtual memory API (`cuMemCreate`): memory that
    /// no CUDA context owns ([`has_owner_context`] is false), as NCCL allocates its buffers by
    /// default. Copies of it from a private context ([`Gpu::open_private`]) never wait behind
    /// the primary context's synchronous calls.
    pub fn alloc_unowned(gpu: &Gpu, len_bytes: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::alloc_vmm(gpu, len_bytes, driver::vmm_alloc)
    }

    fn alloc_vmm(gpu: &Gpu, len_bytes: usize, alloc: fn(i32, usize) -> Result<(u64, usize)>) -> Result<DeviceBuffer> {
        if len_bytes == 0 {
            return Err(CudaError::InvalidArgument { what: "a device buffer needs at least one byte".into() });
        }
        let _restore = gpu.bind_scoped()?;
        let (ptr, mapped) = alloc(gpu.raw_device(), len_bytes)?;
        Ok(DeviceBuffer { gpu: gpu.clone(), ptr: DevicePtr(ptr), len_bytes, owner: Owner::Vmm(mapped) })
    }

    /// As [`DeviceBuffer::alloc_unowned`], and exportable to other processes as POSIX file
    /// descriptors ([`crate::ipc::vmm::export_vmm_range`]), as PyTorch's expandable segments are.
    pub fn alloc_shareable(gpu: &Gpu, len_bytes: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::alloc_vmm(gpu, len_bytes, driver::vmm_alloc_shareable)
    }

    /// A view of device memory someone else allocated (a framework's tensor), which dropping the
    /// view never frees: how a library hands its own memory to calls that take a buffer. The
    /// range is checked against the driver's allocation.
    ///
    /// # Contract
    /// The host never dereferences the address, so misuse cannot corrupt this process's memory,
    /// but copies into memory freed under the view would land in whatever the driver reused it
    /// for: the memory must stay allocated, on `gpu`, for as long as the view and every copy queued
    /// on it live.
    pub fn borrow_raw(gpu: &Gpu, ptr: DevicePtr, len_bytes: usize) -> Result<DeviceBuffer> {
        if len_bytes == 0 {
            return Err(CudaError::InvalidArgument { what: "a device buffer needs at least one byte".into() });
        }
        gpu.bind()?;
        check_device_range(ptr, len_bytes)?;
        Ok(DeviceBuffer { gpu: gpu.clone(), ptr, len_bytes, owner: Owner::Borrowed })
    }

    /// Whether dropping this buffer leaves the memory to its owner ([`DeviceBuffer::borrow_raw`]).
    pub fn is_borrowed(&self) -> bool {
        self.owner == Owner::Borrowed
    }

    /// The device address of the first byte (256-byte aligned).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The GPU holding the memory.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.gpu().same_device(&self.gpu) {
            Ok(())
        } else {
            Err(CudaError::InvalidArgument {
                what: format!(
                    "the stream is on GPU {} but the buffer on GPU {}; use a stream of the buffer's GPU, \
                     or copy_peer_async between GPUs",
                    stream.gpu().ordinal(),
                    self.gpu.ordinal()
                ),
            })
        }
    }

    /// Copies `src` into the buffer at `offset_bytes`, and waits for the copy.
    pub fn copy_from_host(&mut self, offset_bytes: usize, src: &[u8], stream: &Stream) -> Result<()> {
        check_span("copy_from_host", offset_bytes, src.len(), self.len_bytes)?;
        self.check_stream(stream)?;
        self.gpu.bind()?;
        driver::memcpy_htod_blocking(self.ptr.0 + offset_bytes as u64, src, stream.raw())
    }

    /// Copies from the buffer at `offset_bytes` into `dst`, and waits for the copy.
    pub fn copy_to_host(&self, offset_bytes: usize, dst: &mut [u8], stream: &Stream) -> Result<()> {
        check_span("copy_to_host", offset_bytes, dst.len(), self.len_bytes)?;
        self.check_stream(stream)?;
        self.gpu.bind()?;
        driver::memcpy_dtoh_blocking(dst, self.ptr.0 + offset_bytes as u64, stream.raw())
    }

    /// Queues a device-to-device copy of `len_bytes` from `src` (same GPU)
    /// into this buffer, on the copy engine.
    pub fn copy_from_device_async(&mut self, copy: DeviceCopy<'_>, stream: &Stream) -> Result<()> {
        check_span("copy_from_device_async (destination)", copy.dst_offset_bytes, copy.len_bytes, self.len_bytes)?;
        check_span("copy_from_device_async (source)", copy.src_offset_bytes, copy.len_bytes, copy.src.len_bytes)?;
        if !copy.src.gpu.same_device(&self.gpu) {
            return Err(CudaError::InvalidArgument {
                what: "source and destination are on different GPUs; use copy_peer_async".into(),
            });
        }
        self.check_stream(stream)?;
        self.gpu.bind()?;
        driver::memcpy_dtod_async(
            self.ptr.0 + copy.dst_offset_bytes as u64,
            copy.src.ptr.0 + copy.src_offset_bytes as u64,
            copy.len_bytes,
            stream.raw(),
        )
    }

    /// Queues setting `len_bytes` bytes from `offset_bytes` to `value`.
    pub fn memset_async(&mut self, offset_bytes: usize, len_bytes: usize, value: u8, stream: &Stream) -> Result<()> {
        check_span("memset_async", offset_bytes, len_bytes, self.len_bytes)?;
        self.check_stream(stream)?;
        self.gpu.bind()?;
        driver::memset_d8_async(self.ptr.0 + offset_bytes as u64, value, len_bytes, stream.raw())
    }
}

/// What [`DeviceBuffer::copy_from_device_async`] copies: named fields, so
/// source and destination offsets cannot be swapped by position.
#[derive(Clone, Copy, Debug)]
pub struct DeviceCopy<'a> {
    /// The buffer to read.
    pub src: &'a DeviceBuffer,
    /// Where in `src` to start.
    pub src_offset_bytes: usize,
    /// Where in the destination to start.
    pub dst_offset_bytes: usize,
    /// Bytes to copy.
    pub len_bytes: usize,
}

impl<'a> DeviceCopy<'a> {
    /// The whole of `src` to the start of the destination.
    pub fn whole(src: &'a DeviceBuffer) -> DeviceCopy<'a> {
        DeviceCopy { src, src_offset_bytes: 0, dst_offset_bytes: 0, len_bytes: src.len_bytes }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(_restore) = self.gpu.bind_scoped() {
            let _ = match self.owner {
                Owner::Vmm(mapped) => driver::vmm_free(self.ptr.0, mapped),
                Owner::Alloc => driver::mem_free(self.ptr.0),
                Owner::Borrowed => Ok(()),
            };
        }
    }
}
