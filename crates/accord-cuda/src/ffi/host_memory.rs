//! Page-locked host memory that GPUs can reach: allocated by the driver
//! ([`PinnedHostBuffer`]) or registered from an existing allocation
//! ([`HostRegistration`] for a vector it owns, [`HostRangePin`] for memory
//! owned elsewhere, such as a shared-memory mapping). All are mapped into the
//! device address space.
//!
//! Data written by the device is defined on the host only after the stream
//! that wrote it was synchronised (or an event after it completed), and
//! likewise in the other direction. Flag words shared with a running kernel
//! go through [`PinnedHostBuffer::atomic_u32`] / [`PinnedHostBuffer::atomic_u64`].

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::context::Gpu;
use crate::error::{CudaError, Result};
use crate::ffi::driver;
use crate::memory::{check_span, DeviceBuffer, DevicePtr};
use crate::stream::Stream;

/// Pinned host memory from `cuMemHostAlloc(PORTABLE | DEVICEMAP)`: usable by
/// every context for fast copies, and readable and writable by kernels
/// through [`PinnedHostBuffer::device_ptr`]. Zeroed at allocation.
///
/// Dropping synchronises the GPU it was allocated with, then frees it, so
/// queued copies never touch freed memory.
pub struct PinnedHostBuffer {
    gpu: Gpu,
    host: *mut u8,
    len_bytes: usize,
    device_ptr: DevicePtr,
}

// Safety: the buffer owns its pages exclusively, like a Box<[u8]>; shared access goes through
// &self methods that only hand out shared slices or atomics.
unsafe impl Send for PinnedHostBuffer {}
// Safety: as above; &self gives read-only slices and atomics only.
unsafe impl Sync for PinnedHostBuffer {}

impl fmt::Debug for PinnedHostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostBuffer")
            .field("len_bytes", &self.len_bytes)
            .field("device_ptr", &self.device_ptr)
            .finish()
    }
}

impl PinnedHostBuffer {
    /// Allocates `len_bytes` (at least 1) of pinned, device-mapped host memory.
    pub fn alloc(gpu: &Gpu, len_bytes: usize) -> Result<PinnedHostBuffer> {
        if len_bytes == 0 {
            return Err(CudaError::InvalidArgument { what: "a pinned buffer needs at least one byte".into() });
        }
        gpu.bind()?;
        let host = driver::mem_host_alloc_mapped(len_bytes)?;
        let mut buffer = PinnedHostBuffer { gpu: gpu.clone(), host, len_bytes, device_ptr: DevicePtr(0) };
        // Safety: host..host+len was just allocated by us and nothing else references it.
        unsafe { std::ptr::write_bytes(host, 0, len_bytes) };
        buffer.device_ptr = DevicePtr(driver::mem_host_device_pointer(host)?);
        Ok(buffer)
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The address kernels use to reach this memory (equal to the host
    /// address on systems with unified addressing).
    pub fn device_ptr(&self) -> DevicePtr {
        self.device_ptr
    }

    /// The host address, for handing to a NIC or another library.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The contents; defined only once device work writing them completed.
    pub fn as_slice(&self) -> &[u8] {
        // Safety: host..host+len is owned by self and lives as long as the borrow.
        unsafe { std::slice::from_raw_parts(self.host, self.len_bytes) }
    }

    /// The contents, mutably; make sure no device work reads them meanwhile.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // Safety: host..host+len is owned by self, and &mut self makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len_bytes) }
    }

    fn check_atomic(&self, index: usize, width: usize) -> Result<*mut u8> {
        check_span("atomic word", index * width, width, self.len_bytes)?;
        // Pages from the driver are page-aligned, so index*width is naturally aligned.
        Ok(self.host.wrapping_add(index * width))
    }

    /// The `index`-th 32-bit word as an atomic shared with device kernels.
    pub fn atomic_u32(&self, index: usize) -> Result<&AtomicU32> {
        let ptr = self.check_atomic(index, 4)?;
        // Safety: in bounds, 4-byte aligned (page-aligned base), and lives as long as &self;
        // AtomicU32 tolerates concurrent writers (the device writes with its own atomics/stores).
        Ok(unsafe { AtomicU32::from_ptr(ptr as *mut u32) })
    }

    /// The `index`-th 64-bit word as an atomic shared with device kernels.
    pub fn atomic_u64(&self, index: usize) -> Result<&AtomicU64> {
        let ptr = self.check_atomic(index, 8)?;
        // Safety: in bounds, 8-byte aligned (page-aligned base), and lives as long as &self.
        Ok(unsafe { AtomicU64::from_ptr(ptr as *mut u64) })
    }

    /// Queues a copy of `len_bytes` from `offset_bytes` of this buffer to `dst` at `dst_offset_bytes`.
    pub fn copy_to_device_async(&self, span: HostDeviceSpan, dst: &mut DeviceBuffer, stream: &Stream) -> Result<()> {
        check_span("pinned copy source", span.host_offset_bytes, span.len_bytes, self.len_bytes)?;
        check_span("pinned copy destination", span.device_offset_bytes, span.len_bytes, dst.len_bytes())?;
        same_gpu(dst.gpu(), stream)?;
        stream.gpu().bind()?;
        // Safety: the source lies in this buffer, whose drop synchronises the GPU before freeing.
        unsafe {
            driver::memcpy_htod_async(
                dst.ptr().0 + span.device_offset_bytes as u64,
                self.host.add(span.host_offset_bytes),
                span.len_bytes,
                stream.raw(),
            )
        }
    }

    /// Queues a copy of `len_bytes` from `src` into this buffer.
    pub fn copy_from_device_async(&mut self, span: HostDeviceSpan, src: &DeviceBuffer, stream: &Stream) -> Result<()> {
        check_span("pinned copy destination", span.host_offset_bytes, span.len_bytes, self.len_bytes)?;
        check_span("pinned copy source", span.device_offset_bytes, span.len_bytes, src.len_bytes())?;
        same_gpu(src.gpu(), stream)?;
        stream.gpu().bind()?;
        // Safety: the destination lies in this buffer, whose drop synchronises the GPU before freeing.
        unsafe {
            driver::memcpy_dtoh_async(
                self.host.add(span.host_offset_bytes),
                src.ptr().0 + span.device_offset_bytes as u64,
                span.len_bytes,
                stream.raw(),
            )
        }
    }
}

/// Queues a copy of `len_bytes` from host memory at `src` into device memory at `dst` on
/// `stream` (`cuMemcpyHtoDAsync`): asynchronous for pinned sources; for pageable ones the driver
/// stages the bytes before returning. `dst` may be this process's allocation or an IPC mapping
/// opened in the stream's context; it is checked to lie inside one live allocation first. A zero
/// length is a no-op.
///
/// # Safety
/// `src..src + len_bytes` must be valid for reads and stay valid and unchanged until the copy
/// completed on `stream` (an event recorded after it completed).
pub unsafe fn copy_host_to_device_async(
    dst: DevicePtr,
    src: *const u8,
    len_bytes: usize,
    stream: &Stream,
) -> Result<()> {
    if len_bytes == 0 {
        return Ok(());
    }
    stream.gpu().bind()?;
    crate::memory::check_device_range(dst, len_bytes)?;
    // Safety: the device range was checked above; the caller vouches for the host range.
    unsafe { driver::memcpy_htod_async(dst.0, src, len_bytes, stream.raw()) }
}

/// Queues a copy of `len_bytes` from device memory at `src` into host memory at `dst` on
/// `stream` (`cuMemcpyDtoHAsync`): asynchronous for pinned destinations; into pageable memory
/// the driver returns only once the copy completed. `src` is checked to lie inside one live
/// allocation first. A zero length is a no-op.
///
/// # Safety
/// `dst..dst + len_bytes` must be valid for writes, and neither read, written nor freed by
/// anyone else until the copy completed on `stream`.
pub unsafe fn copy_device_to_host_async(dst: *mut u8, src: DevicePtr, len_bytes: usize, stream: &Stream) -> Result<()> {
    if len_bytes == 0 {
        return Ok(());
    }
    stream.gpu().bind()?;
    crate::memory::check_device_range(src, len_bytes)?;
    // Safety: the device range was checked above; the caller vouches for the host range.
    unsafe { driver::memcpy_dtoh_async(dst, src.0, len_bytes, stream.raw()) }
}

/// Which bytes a pinned copy moves; named so host and device offsets cannot be swapped.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostDeviceSpan {
    /// Offset in the host buffer.
    pub host_offset_bytes: usize,
    /// Offset in the device buffer.
    pub device_offset_bytes: usize,
    /// Bytes to copy.
    pub len_bytes: usize,
}

impl HostDeviceSpan {
    /// `len_bytes` from offset 0 to offset 0.
    pub fn prefix(len_bytes: usize) -> HostDeviceSpan {
        HostDeviceSpan { host_offset_bytes: 0, device_offset_bytes: 0, len_bytes }
    }
}

fn same_gpu(gpu: &Gpu, stream: &Stream) -> Result<()> {
    if gpu.same_device(stream.gpu()) {
        Ok(())
    } else {
        Err(CudaError::InvalidArgument { what: "the stream must belong to the device buffer's GPU".into() })
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        // Wait for queued copies before the pages go away; on failure leak rather than risk a
        // device write into freed memory.
        if self.gpu.synchronize().is_ok() {
            // Safety: allocated by mem_host_alloc_mapped, no borrow outlives self, GPU idle.
            let _ = unsafe { driver::mem_free_host(self.host) };
        }
    }
}

/// Existing host memory (a `Vec<u8>` given to it) page-locked and mapped for
/// the GPUs with `cuMemHostRegister(PORTABLE | DEVICEMAP)`, for staging
/// without a copy into a pinned buffer. Owns the vector while registered, so
/// it cannot be freed or reallocated under the driver.
pub struct HostRegistration {
    gpu: Gpu,
    data: Vec<u8>,
    device_ptr: DevicePtr,
}

impl fmt::Debug for HostRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRegistration")
            .field("len_bytes", &self.data.len())
            .field("device_ptr", &self.device_ptr)
            .finish()
    }
}

impl HostRegistration {
    /// Registers `data` (non-empty).
    pub fn new(gpu: &Gpu, mut data: Vec<u8>) -> Result<HostRegistration> {
        if data.is_empty() {
            return Err(CudaError::InvalidArgument { what: "cannot register an empty buffer".into() });
        }
        gpu.bind()?;
        // Safety: the vector's heap range stays alive and unmoved while self owns it, and is
        // unregistered in drop/into_inner before it can be freed.
        unsafe { driver::mem_host_register(data.as_mut_ptr(), data.len())? };
        let device_ptr = match driver::mem_host_device_pointer(data.as_mut_ptr()) {
            Ok(p) => DevicePtr(p),
            Err(e) => {
                // Safety: registered just above, no device work queued yet.
                let _ = unsafe { driver::mem_host_unregister(data.as_mut_ptr()) };
                return Err(e);
            }
        };
        Ok(HostRegistration { gpu: gpu.clone(), data, device_ptr })
    }

    /// The address kernels and copies use to reach the memory.
    pub fn device_ptr(&self) -> DevicePtr {
        self.device_ptr
    }

    /// The contents; defined only once device work writing them completed.
    pub fn as_slice(&self) -> &[u8] {
        &self.data
    }

    /// The contents, mutably; make sure no device work reads them meanwhile.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.data
    }

    /// Synchronises the GPU, unregisters, and gives the vector back.
    pub fn into_inner(mut self) -> Result<Vec<u8>> {
        self.unregister()?;
        Ok(std::mem::take(&mut self.data))
    }

    fn unregister(&mut self) -> Result<()> {
        if self.data.is_empty() {
            return Ok(());
        }
        self.gpu.synchronize()?;
        // Safety: registered in new(); the GPU is idle so no device work uses the range.
        unsafe { driver::mem_host_unregister(self.data.as_mut_ptr()) }
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.unregister().is_err() {
            // Leak rather than free pages the device might still write.
            std::mem::forget(std::mem::take(&mut self.data));
        }
    }
}

/// Host memory owned elsewhere (a shared-memory mapping, say) page-locked with
/// `cuMemHostRegister(PORTABLE | DEVICEMAP)` for as long as this lives, so copy
/// engines reach it at full speed from every context of the process.
///
/// Dropping unregisters without synchronising any GPU (an owner that keeps the pin alive until
/// its last copy's event completed, as the engine does, never waits on unrelated work such as
/// a running collective kernel).
pub struct HostRangePin {
    gpu: Gpu,
    host: *mut u8,
    len_bytes: usize,
}

// Safety: the pin only names the range; it never reads or writes through the pointer.
unsafe impl Send for HostRangePin {}
// Safety: as above.
unsafe impl Sync for HostRangePin {}

impl fmt::Debug for HostRangePin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRangePin").field("host", &self.host).field("len_bytes", &self.len_bytes).finish()
    }
}

impl HostRangePin {
    /// Page-locks `host..host + len_bytes` (non-empty, page-aligned as mappings are).
    ///
    /// # Safety
    /// The range must be one live mapping or allocation that outlives the returned pin, and no
    /// device work queued against the range may still be pending when the pin drops.
    pub unsafe fn new(gpu: &Gpu, host: *mut u8, len_bytes: usize) -> Result<HostRangePin> {
        if len_bytes == 0 || host.is_null() {
            return Err(CudaError::InvalidArgument { what: "cannot pin an empty or null host range".into() });
        }
        let _restore = gpu.bind_scoped()?;
        // Safety: upheld by the caller.
        unsafe { driver::mem_host_register(host, len_bytes)? };
        Ok(HostRangePin { gpu: gpu.clone(), host, len_bytes })
    }

    /// Bytes pinned.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The address device work (stream memory operations, kernels) uses for the range's first
    /// byte (the host address itself on systems with unified addressing).
    pub fn device_ptr(&self) -> Result<DevicePtr> {
        let _restore = self.gpu.bind_scoped()?;
        Ok(DevicePtr(driver::mem_host_device_pointer(self.host)?))
    }
}

impl Drop for HostRangePin {
    fn drop(&mut self) {
        // Safety: registered in new(); no copy against the range is pending (new's contract).
        // A failure leaves the pages locked until the owner unmaps them; nothing to undo here.
        if let Ok(_restore) = self.gpu.bind_scoped() {
            let _ = unsafe { driver::mem_host_unregister(self.host) };
        }
    }
}
