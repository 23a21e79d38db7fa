//! Registered memory: the region table workers check and place into, engine-owned buffers, and
//! the only raw copies of the engine (into and out of registered memory).
//!
//! Soundness rests on two rules: (1) a placement happens while the worker holds the table's
//! read lock, after `check_write` accepted the same range under that lock, and `deregister`
//! takes the write lock, so no placement can start or still run once `deregister` returned;
//! (2) a source range is read only while its region's allocation is kept alive (engine-owned
//! buffers hold an `Arc`) or the caller of [`crate::Engine::register_raw`] promised it stays
//! valid until the transfers using it completed.
#![allow(unsafe_code)]

use crate::address::{EngineId, MrDescriptor};
use crate::error::{RangeError, RegisterError};
use accord_proto::wire::RejectReason;
use accord_proto::{RegionId, RegionKey};
use std::alloc::Layout;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, RwLock};

pub(crate) mod shared_file;

/// Most regions one engine may have registered at once.
pub const REGIONS_MAX: usize = 1 << 20;
/// Largest single region.
pub const REGION_BYTES_MAX: u64 = 1 << 40;
/// Alignment of engine-owned buffers (a page).
pub const ALLOC_ALIGN_BYTES: usize = 4096;
/// Region id of every engine's zero-length control region (barrier immediates land there).
pub(crate) const CONTROL_REGION: RegionId = RegionId(0);

/// Whether `len` bytes at `offset` lie inside a region of `region_len` bytes (no overflow).
pub(crate) fn check_range(offset: u64, len: u64, region_len: u64) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= region_len)
}

/// Where registered memory lives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Ordinary host memory.
    Host,
    /// Host memory that a device reads next, not the CPU: pinned staging buffers such as NCCL's
    /// host buffers, which its GPU kernels read. Peers' bytes land in it with streaming stores
    /// that bypass the CPU's cache (`accord_net::streaming`): a third less memory traffic per
    /// copy, and the cache left to the CPU's own data. Memory the CPU reads next should stay
    /// [`MemoryKind::Host`], where those reads would then miss.
    HostForDevice,
    /// CUDA device memory (`cuMemAlloc`) of the GPU with this ordinal. Written by the copy
    /// engine, never by the host: as a destination, for peers in this process or on this host
    /// only; as a source, also towards host regions anywhere (staged through pinned memory; see
    /// [`crate::Engine::write`]).
    CudaDevice {
        /// CUDA device ordinal.
        ordinal: u32,
    },
}

/// The ordinal of the GPU owning device memory at `ptr`, for memory another library allocated
/// (register it as [`MemoryKind::CudaDevice`] with this ordinal).
pub fn device_ordinal_of(ptr: u64) -> Result<u32, RegisterError> {
    accord_cuda::device_ordinal_of(accord_cuda::DevicePtr(ptr))
        .map_err(|e| RegisterError::Device(format!("{ptr:#x} is not device memory the driver knows: {e}")))
}

/// Whether a CUDA context owns the device memory at `ptr` (`cudaMalloc`), as opposed to memory of
/// the virtual memory API (`cuMemCreate`; NCCL's buffers by default). Copies of context-owned
/// memory wait behind that context's synchronous calls even in a private context
/// ([`crate::DeviceContext::Private`]).
pub fn device_memory_has_owner_context(ptr: u64) -> Result<bool, RegisterError> {
    accord_cuda::has_owner_context(accord_cuda::DevicePtr(ptr))
        .map_err(|e| RegisterError::Device(format!("{ptr:#x} is not device memory the driver knows: {e}")))
}

/// The GPU whose CUDA context is current on the calling thread (NCCL's threads have their
/// device's), if any: the GPU to page-lock shared regions for ([`crate::Engine::pin_shared`]).
pub fn current_gpu() -> Option<u32> {
    accord_cuda::current_device_ordinal()
}

/// GPUs this process can use (0 without a CUDA driver): whether device memory may be
/// registered here at all.
pub fn gpus_visible() -> usize {
    accord_cuda::probe().device_count
}

/// Receivers refuse a write with bytes into device memory over the network (with this code):
/// only the copy-engine route may write device regions.
pub(crate) const REJECT_DEVICE_REGION: RejectReason = RejectReason::Other(0x100);

/// The local handle on a registered region: use it as the source of writes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MrHandle {
    pub(crate) engine: EngineId,
    pub(crate) region: RegionId,
    pub(crate) len: u64,
}

impl MrHandle {
    /// Length of the region in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the region is empty (never, for registered regions).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A page-aligned, zeroed allocation owned by the engine: on the heap, or in a shared-memory
/// file a same-host peer can map ([`shared_file`]).
pub(crate) struct Allocation {
    ptr: NonNull<u8>,
    backing: Backing,
}

enum Backing {
    Heap(Layout),
    Shared(shared_file::SharedFile),
}

// Safety: the allocation is plain bytes with no thread affinity; all access goes through raw
// copies whose synchronisation the module rules above describe.
unsafe impl Send for Allocation {}
// Safety: as above; shared access only copies bytes.
unsafe impl Sync for Allocation {}

impl Allocation {
    pub(crate) fn new(len: usize) -> Result<Self, RegisterError> {
        let layout = Layout::from_size_align(len.max(1), ALLOC_ALIGN_BYTES)
            .map_err(|_| RegisterError::BadLength { len: len as u64, max: REGION_BYTES_MAX })?;
        // Safety: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(RegisterError::OutOfMemory(len))?;
        Ok(Allocation { ptr, backing: Backing::Heap(layout) })
    }

    /// `len` zeroed bytes in a new shared-memory file under `dir` (see [`shared_file`]).
    pub(crate) fn new_shared(
        dir: &std::path::Path,
        engine: EngineId,
        len: usize,
    ) -> Result<(Self, crate::address::SharedHostInfo), RegisterError> {
        let (file, info) = shared_file::SharedFile::create(dir, engine, len).map_err(RegisterError::Shared)?;
        let ptr = NonNull::new(file.base() as *mut u8).expect("mappings are never null");
        Ok((Allocation { ptr, backing: Backing::Shared(file) }, info))
    }

    pub(crate) fn base(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The shared-memory file behind the allocation, if it has one.
    pub(crate) fn shared_file(&self) -> Option<&shared_file::SharedFile> {
        match &self.backing {
            Backing::Shared(file) => Some(file),
            Backing::Heap(_) => None,
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // Safety: allocated in `new` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
        // A shared file unmaps itself (and its owner unlinks it) when the backing drops.
    }
}

/// A random 64-bit value from the operating system (engine ids, region keys, file nonces).
pub(crate) fn random_u64() -> u64 {
    use rand::RngCore;
    rand::rngs::OsRng.next_u64()
}

/// One registered region.
#[derive(Clone)]
pub(crate) struct Region {
    pub(crate) base: usize,
    pub(crate) len: u64,
    pub(crate) key: RegionKey,
    /// Keeps the memory alive while any transfer reads it: the engine's allocation, or the
    /// owner a caller handed to [`crate::Engine::register_raw_owned`].
    pub(crate) keep: Option<MemoryOwner>,
    /// The GPU ordinal for device memory; `None` for host memory.
    pub(crate) device: Option<u32>,
    /// Incoming bytes land with streaming stores ([`MemoryKind::HostForDevice`]).
    pub(crate) streamed: bool,
}

impl Region {
    /// Copies `len` bytes from `src` to `dst`, inside this region: with streaming stores where
    /// this region takes them ([`MemoryKind::HostForDevice`]), plain ones otherwise.
    ///
    /// # Safety
    /// `dst..dst + len` must lie inside this registered region, `src` must be valid for reads
    /// of `len` bytes, and the two ranges must not overlap.
    unsafe fn land(&self, dst: *mut u8, src: *const u8, len: usize) {
        // Safety: forwarded from this function's contract.
        unsafe {
            if self.streamed {
                accord_net::streaming::copy_streaming(dst, src, len)
            } else {
                std::ptr::copy_nonoverlapping(src, dst, len)
            }
        }
    }
}

/// Whatever keeps registered memory alive; every transfer reading the region holds a clone,
/// so the memory outlives the last of them even when the region is deregistered first.
pub type MemoryOwner = Arc<dyn std::any::Any + Send + Sync>;

/// The regions of one engine, shared by its workers behind a `RwLock`.
#[derive(Default)]
pub(crate) struct RegionTable {
    map: HashMap<RegionId, Region>,
    next_id: u32,
}

/// The shared table.
pub(crate) type Regions = Arc<RwLock<RegionTable>>;

impl RegionTable {
    pub(crate) fn insert(&mut self, region: Region) -> Result<RegionId, RegisterError> {
        if self.map.len() >= REGIONS_MAX {
            return Err(RegisterError::TableFull(REGIONS_MAX));
        }
        let id = if self.map.is_empty() && self.next_id == 0 {
            CONTROL_REGION
        } else {
            loop {
                self.next_id = self.next_id.wrapping_add(1).max(1);
                if !self.map.contains_key(&RegionId(self.next_id)) {
                    break RegionId(self.next_id);
                }
            }
        };
        self.map.insert(id, region);
        Ok(id)
    }

    /// Regions registered (the control region included).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn remove(&mut self, id: RegionId) -> Option<Region> {
        self.map.remove(&id)
    }

    pub(crate) fn get(&self, id: RegionId) -> Option<&Region> {
        self.map.get(&id)
    }

    /// The protocol's check before any byte is placed.
    pub(crate) fn check_write(&self, id: RegionId, key: RegionKey, offset: u64, len: u64) -> Result<(), RejectReason> {
        let region = self.map.get(&id).ok_or(RejectReason::UnknownRegion)?;
        if region.key != key {
            return Err(RejectReason::BadKey);
        }
        match offset.checked_add(len) {
            Some(end) if end <= region.len => {}
            _ => return Err(RejectReason::OutOfBounds),
        }
        if region.device.is_some() && len > 0 {
            return Err(REJECT_DEVICE_REGION);
        }
        Ok(())
    }

    /// The check of a copy-engine write into a device region: `(device address, ordinal)` of
    /// the first byte. The caller must keep the region registered until the copy completed.
    pub(crate) fn check_device_write(
        &self,
        id: RegionId,
        key: RegionKey,
        offset: u64,
        len: u64,
    ) -> Result<(u64, u32), RejectReason> {
        let region = self.map.get(&id).ok_or(RejectReason::UnknownRegion)?;
        if region.key != key {
            return Err(RejectReason::BadKey);
        }
        match (offset.checked_add(len), region.device) {
            (Some(end), Some(ordinal)) if end <= region.len => Ok((region.base as u64 + offset, ordinal)),
            (_, None) => Err(RejectReason::UnknownRegion),
            _ => Err(RejectReason::OutOfBounds),
        }
    }

    /// The check of a copy-engine write into a host region of this process (a device source in
    /// this process): the host address of the first byte and what keeps the memory alive. The
    /// caller holds the owner until the copy completed.
    pub(crate) fn check_host_write(
        &self,
        id: RegionId,
        key: RegionKey,
        offset: u64,
        len: u64,
    ) -> Result<(usize, Option<MemoryOwner>), RejectReason> {
        self.check_write(id, key, offset, len)?;
        let region = self.map.get(&id).ok_or(RejectReason::UnknownRegion)?;
        if region.device.is_some() {
            return Err(REJECT_DEVICE_REGION);
        }
        Ok((region.base + offset as usize, region.keep.clone()))
    }

    /// Copies `bytes` into region `id` at `offset`. Returns false (copying nothing) if the
    /// range is not inside a registered region.
    pub(crate) fn place(&self, id: RegionId, offset: u64, bytes: &[u8]) -> bool {
        let Some(region) = self.map.get(&id) else { return false };
        if bytes.is_empty() {
            return true;
        }
        if region.device.is_some() {
            return false; // device memory: never written by the host
        }
        match offset.checked_add(bytes.len() as u64) {
            Some(end) if end <= region.len => {}
            _ => return false,
        }
        // Safety: the range was just checked against the region, which is registered and so
        // valid memory (rule 1 of the module: deregistration waits for this read lock).
        let dst = (region.base + offset as usize) as *mut u8;
        unsafe { region.land(dst, bytes.as_ptr(), bytes.len()) };
        true
    }
}

impl RegionTable {
    /// As [`RegionTable::place`], with the bytes `start..start + len` of a datagram the
    /// datapath lent in place (read straight from a shared-memory ring: one copy fewer).
    pub(crate) fn place_lent(
        &self,
        id: RegionId,
        offset: u64,
        lent: &accord_net::LentBytes,
        start: usize,
        len: usize,
    ) -> bool {
        let Some(region) = self.map.get(&id) else { return false };
        if len == 0 {
            return true;
        }
        if region.device.is_some() {
            return false; // device memory: never written by the host
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= region.len => {}
            _ => return false,
        }
        // Safety: the destination range was just checked against the region, which is
        // registered and so valid memory (rule 1 of the module); the lent bytes are shared
        // memory of a ring, never inside a region.
        let dst = (region.base + offset as usize) as *mut u8;
        unsafe {
            if region.streamed {
                lent.copy_to_raw_streaming(start, len, dst)
            } else {
                lent.copy_to_raw(start, len, dst)
            }
        }
    }

    /// Copies all of `src` into region `id` at `offset` (a same-process peer's write). Returns
    /// false (copying nothing) if the range is not inside a registered region.
    pub(crate) fn place_from(&self, id: RegionId, offset: u64, src: &Source) -> bool {
        let Some(region) = self.map.get(&id) else { return false };
        let len = src.len();
        match offset.checked_add(len) {
            Some(end) if end <= region.len => {}
            _ => return false,
        }
        if len == 0 {
            return true;
        }
        if region.device.is_some() {
            return false; // device memory: never written by the host
        }
        let dst = (region.base + offset as usize) as *mut u8;
        match src {
            // Safety: both ranges are inside live memory (the destination checked above under
            // the table's lock, the source by rule 2); `land` only where they do not overlap,
            // `copy` (which allows it) where they do.
            Source::Region { base, .. }
                if *base + len as usize <= dst as usize || dst as usize + len as usize <= *base =>
            unsafe { region.land(dst, *base as *const u8, len as usize) },
            Source::Region { base, .. } => unsafe { std::ptr::copy(*base as *const u8, dst, len as usize) },
            // Safety: the destination range was checked above; the source is our own slice.
            Source::Bytes(b) => unsafe { region.land(dst, b.as_ptr(), b.len()) },
        }
        true
    }
}

/// Bytes a transfer reads from: a range of registered memory, or bytes the engine owns.
#[derive(Clone)]
pub(crate) enum Source {
    /// `len` bytes at `base`, kept alive by `keep` or by the register_raw contract.
    Region { base: usize, len: u64, _keep: Option<MemoryOwner> },
    /// A send's bytes, copied at submission.
    Bytes(Arc<[u8]>),
}

impl Source {
    /// A source over `region[offset..offset + len]`; the caller checked the bounds.
    pub(crate) fn from_region(region: &Region, offset: u64, len: u64) -> Source {
        debug_assert!(offset + len <= region.len);
        Source::Region { base: region.base + offset as usize, len, _keep: region.keep.clone() }
    }

    /// The bytes `offset..offset + len` of this source (within it; the caller checked), kept
    /// alive as the whole is.
    pub(crate) fn slice(&self, offset: u64, len: u64) -> Source {
        debug_assert!(offset + len <= self.len());
        match self {
            Source::Region { base, _keep, .. } => {
                Source::Region { base: base + offset as usize, len, _keep: _keep.clone() }
            }
            Source::Bytes(b) => Source::Bytes(Arc::from(&b[offset as usize..(offset + len) as usize])),
        }
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Source::Region { len, .. } => *len,
            Source::Bytes(b) => b.len() as u64,
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`. Returns false when the range is
    /// outside the source (a protocol bug; nothing is copied).
    pub(crate) fn read(&self, offset: u64, dst: &mut [u8]) -> bool {
        match offset.checked_add(dst.len() as u64) {
            Some(end) if end <= self.len() => {}
            _ => return false,
        }
        match self {
            Source::Region { base, .. } => {
                // Safety: in bounds of the source range (checked above), which is valid memory
                // by rule 2 of the module.
                unsafe {
                    std::ptr::copy_nonoverlapping((base + offset as usize) as *const u8, dst.as_mut_ptr(), dst.len())
                }
            }
            Source::Bytes(b) => dst.copy_from_slice(&b[offset as usize..offset as usize + dst.len()]),
        }
        true
    }
}

/// A page-aligned buffer the engine allocated and registered. Dropping it deregisters the
/// region; transfers still reading it keep the memory alive until they finish.
///
/// Access is by copy ([`MrBuffer::write_at`], [`MrBuffer::read_at`]) rather than by slice:
/// peers may write the region at any moment, and a Rust reference must never see bytes change
/// underneath it.
pub struct MrBuffer {
    pub(crate) alloc: Arc<Allocation>,
    pub(crate) handle: MrHandle,
    pub(crate) descriptor: MrDescriptor,
    pub(crate) regions: Regions,
}

impl MrBuffer {
    /// The local handle (source of writes).
    pub fn handle(&self) -> MrHandle {
        self.handle
    }
    /// The descriptor to give peers (destination of their writes).
    pub fn descriptor(&self) -> MrDescriptor {
        self.descriptor
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.handle.len as usize
    }
    /// Whether the buffer is empty (never: registration needs at least one byte).
    pub fn is_empty(&self) -> bool {
        self.handle.len == 0
    }
    /// Address of the first byte, for FFI. Writing through it races with peers' writes.
    pub fn as_ptr(&self) -> *const u8 {
        self.alloc.base() as *const u8
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), RangeError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(RangeError { offset: offset as u64, len: len as u64, region_len: self.handle.len }),
        }
    }

    /// Copies `bytes` into the buffer at `offset`.
    pub fn write_at(&self, offset: usize, bytes: &[u8]) -> Result<(), RangeError> {
        self.check(offset, bytes.len())?;
        // Safety: the range is inside the live allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (self.alloc.base() + offset) as *mut u8, bytes.len()) };
        Ok(())
    }

    /// Copies `dst.len()` bytes from the buffer at `offset` into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), RangeError> {
        self.check(offset, dst.len())?;
        // Safety: the range is inside the live allocation (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping((self.alloc.base() + offset) as *const u8, dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// The whole buffer, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v).expect("whole buffer is in range");
        v
    }

    /// Sets every byte to `value`.
    pub fn fill(&self, value: u8) {
        // Safety: exactly the live allocation.
        unsafe { std::ptr::write_bytes(self.alloc.base() as *mut u8, value, self.len()) };
    }
}

impl std::fmt::Debug for MrBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrBuffer").field("handle", &self.handle).finish_non_exhaustive()
    }
}

impl Drop for MrBuffer {
    fn drop(&mut self) {
        if let Ok(mut table) = self.regions.write() {
            table.remove(self.handle.region);
        }
    }
}

#[cfg(test)]
mod tests;
