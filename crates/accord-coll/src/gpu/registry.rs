//! Buffer registration (this rank's receive buffers, exported as IPC
//! handles into its table on the flag board) and the bounded cache of peers'
//! buffers mapped into this process.
//!
//! # Invalidation
//!
//! Registration ids are never reused on a rank, so a cached mapping can only
//! ever stand for the allocation it was opened for. When a rank deregisters a
//! buffer it bumps its epoch on the flag board; peers then retire every
//! mapping of that rank (re-opening the live ones on next use). Retired and
//! evicted mappings are closed only when no collective is in flight
//! ([`super::GpuCommunicator::release_mappings`], or on drop): closing one
//! synchronises the whole context, which would wait for a user stream that is
//! itself waiting for the collective.
//!
//! # Memory a framework allocated
//!
//! [`super::GpuCommunicator::register_allocation_of`] registers the whole
//! `cuMemAlloc` allocation holding a tensor (one registration covers every
//! tensor a caching allocator carves from that segment), keyed by the driver's
//! buffer id: a segment freed and re-allocated at the same address has a new
//! id, so its stale registration is dropped, never reused.

use std::collections::BTreeMap;
use std::sync::Arc;

use accord_cuda::ipc::vmm::{take_fd_of, VmmMapping};
use accord_cuda::{DevicePtr, Gpu, IpcHandle, IpcMapping, MappingCache};

use super::board::{entry_of, Board, Exported, REG_ENTRIES};
use super::error::{GpuCollError, GpuResult};

/// One registered range of this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// First byte.
    pub base: u64,
    /// Length in bytes.
    pub len: usize,
    /// The driver's id of the allocation, for ranges registered by address (None: a buffer the
    /// caller owns and deregisters itself).
    pub buffer_id: Option<u64>,
    /// The submission count of the last collective that received into it.
    pub last_use: u64,
}

/// This rank's registered buffers: id -> range.
#[derive(Debug)]
pub struct Registrations {
    next_id: u64,
    by_id: BTreeMap<u64, Registration>,
    max: usize,
}

impl Registrations {
    /// An empty table of at most `max` entries (at most [`REG_ENTRIES`]); ids start at 1.
    pub fn new(max: usize) -> Registrations {
        Registrations { next_id: 1, by_id: BTreeMap::new(), max: max.min(REG_ENTRIES) }
    }

    /// The id of the registration exactly covering `buf`, if any.
    pub fn find_exact(&self, base: u64, len: usize) -> Option<u64> {
        self.by_id.iter().find(|(_, r)| r.base == base && r.len == len).map(|(id, _)| *id)
    }

    /// The registration of the allocation starting at `base`, registered by address.
    pub fn find_allocation(&self, base: u64) -> Option<(u64, Registration)> {
        self.by_id.iter().find(|(_, r)| r.base == base && r.buffer_id.is_some()).map(|(id, r)| (*id, *r))
    }

    /// Adds a range and returns its new id, whose board entry no live registration holds.
    pub fn insert(&mut self, base: u64, len: usize) -> GpuResult<u64> {
        self.insert_entry(Registration { base, len, buffer_id: None, last_use: 0 })
    }

    /// Adds a range registered by address (see the module docs) and returns its new id.
    pub fn insert_allocation(&mut self, base: u64, len: usize, buffer_id: u64) -> GpuResult<u64> {
        self.insert_entry(Registration { base, len, buffer_id: Some(buffer_id), last_use: 0 })
    }

    fn insert_entry(&mut self, reg: Registration) -> GpuResult<u64> {
        if self.by_id.len() >= self.max {
            return Err(GpuCollError::TableFull {
                what: "the registration table",
                max: self.max,
                env: "ACCORD_GPU_REGISTRATIONS_MAX",
            });
        }
        // Fewer live ids than entries, so one of the next REG_ENTRIES ids has a free entry.
        let taken = |id: u64| self.by_id.keys().any(|&live| entry_of(live) == entry_of(id));
        let mut id = self.next_id;
        while taken(id) {
            id += 1;
        }
        self.next_id = id + 1;
        self.by_id.insert(id, reg);
        Ok(id)
    }

    /// Removes `id`; whether it was there.
    pub fn remove(&mut self, id: u64) -> bool {
        self.by_id.remove(&id).is_some()
    }

    /// `(id, offset)` of the registration holding `ptr..ptr+len`.
    pub fn lookup(&self, ptr: u64, len: usize) -> Option<(u64, u64)> {
        self.by_id
            .iter()
            .find(|(_, r)| ptr >= r.base && ptr.saturating_add(len as u64) <= r.base + r.len as u64)
            .map(|(id, r)| (*id, ptr - r.base))
    }

    /// The registration `id`, if live.
    pub fn lookup_id(&self, id: u64) -> Option<Registration> {
        self.by_id.get(&id).copied()
    }

    /// Notes that the collective numbered `submitted` receives into `id`.
    pub fn touch(&mut self, id: u64, submitted: u64) {
        if let Some(r) = self.by_id.get_mut(&id) {
            r.last_use = submitted;
        }
    }

    /// The least recently used registration by address whose last collective is done
    /// (`completed` collectives finished): the one to drop when the table is full.
    pub fn evictable(&self, completed: u64) -> Option<u64> {
        self.by_id
            .iter()
            .filter(|(_, r)| r.buffer_id.is_some() && r.last_use <= completed)
            .min_by_key(|(_, r)| r.last_use)
            .map(|(id, _)| *id)
    }

    /// Whether the table is full.
    pub fn is_full(&self) -> bool {
        self.by_id.len() >= self.max
    }

    /// Number of registrations.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// A peer's registered memory mapped in this process: through a CUDA IPC handle, or VMM
/// memory mapped from the peer's file descriptors.
#[derive(Debug)]
pub enum PeerMapping {
    /// `cuMemAlloc` memory.
    Ipc(IpcMapping),
    /// `cuMemCreate` memory ([`accord_cuda::ipc::vmm`]).
    Vmm(VmmMapping),
}

impl PeerMapping {
    /// Where the exported memory starts here.
    pub fn ptr(&self) -> DevicePtr {
        match self {
            PeerMapping::Ipc(m) => m.ptr(),
            PeerMapping::Vmm(m) => m.base(),
        }
    }

    /// Bytes mapped.
    pub fn len_bytes(&self) -> usize {
        match self {
            PeerMapping::Ipc(m) => m.len_bytes(),
            PeerMapping::Vmm(m) => m.len_bytes(),
        }
    }
}

/// Peers' buffers mapped here, least recently used evicted first (the cache type the engine's
/// copy-engine route uses too); evicted and stale mappings are retired, not closed.
pub struct PeerMappings {
    gpu: Gpu,
    open: MappingCache<(usize, u64), (Arc<PeerMapping>, u64)>,
    retired: Vec<Arc<PeerMapping>>,
    epochs: Vec<u64>,
    max: usize,
}

impl std::fmt::Debug for PeerMappings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerMappings").field("open", &self.open.len()).field("retired", &self.retired.len()).finish()
    }
}

impl PeerMappings {
    /// An empty cache of at most `max` open (and `max` retired) mappings.
    pub fn new(gpu: Gpu, world_size: usize, max: usize) -> PeerMappings {
        PeerMappings { gpu, open: MappingCache::new(max), retired: Vec::new(), epochs: vec![0; world_size], max }
    }

    /// Mappings opened since creation (a cache-miss counter).
    pub fn opened_total(&self) -> u64 {
        self.open.opened_total()
    }

    /// Retires every mapping of `peer` if its deregistration epoch moved.
    pub fn observe_epoch(&mut self, peer: usize, epoch: u64) -> GpuResult<()> {
        if self.epochs[peer] == epoch {
            return Ok(());
        }
        self.epochs[peer] = epoch;
        for (mapping, _) in self.open.remove_where(|(p, _)| *p == peer) {
            self.retire(mapping)?;
        }
        Ok(())
    }

    fn retire(&mut self, mapping: Arc<PeerMapping>) -> GpuResult<()> {
        if self.retired.len() >= self.max {
            return Err(GpuCollError::TableFull {
                what: "the retired peer mappings (closed by release_mappings)",
                max: self.max,
                env: "ACCORD_GPU_MAPPINGS_MAX",
            });
        }
        self.retired.push(mapping);
        Ok(())
    }

    /// The base address, in this process, of `peer`'s registration `id`, mapped from the
    /// handle in `peer`'s table on `board` on first use.
    pub fn resolve(&mut self, board: &Board, peer: usize, id: u64) -> GpuResult<DevicePtr> {
        let gpu = &self.gpu;
        let ((mapping, offset), evicted) =
            self.open.get_or_open((peer, id), || open_registration(gpu, board, peer, id))?;
        if let Some((old, _)) = evicted {
            self.retire(old)?;
        }
        Ok(mapping.ptr().offset(offset as usize))
    }

    /// Closes retired mappings (each close synchronises the GPU: call only
    /// with no collective in flight).
    pub fn close_retired(&mut self) -> usize {
        let count = self.retired.len();
        self.retired.clear();
        count
    }
}

/// Maps `peer`'s registration `id` from the handle or descriptors in its table on `board`.
pub(crate) fn open_registration(gpu: &Gpu, board: &Board, peer: usize, id: u64) -> GpuResult<(Arc<PeerMapping>, u64)> {
    let reg = board.read_registration(peer, id)?;
    let outside = |len: u64| GpuCollError::Protocol {
        rank: peer,
        what: format!("registration {id} starts at {} in memory of {len} bytes", reg.offset),
    };
    let mapping = match &reg.exported {
        Exported::Ipc(raw) => {
            let handle = IpcHandle::from_bytes(raw)
                .map_err(|e| GpuCollError::Protocol { rank: peer, what: format!("registration {id}: {e}") })?;
            if reg.offset >= handle.len_bytes() {
                return Err(outside(handle.len_bytes()));
            }
            PeerMapping::Ipc(IpcMapping::open(gpu, &handle)?)
        }
        Exported::Vmm(pieces) => {
            let total: u64 = pieces.iter().map(|&(_, len)| len).sum();
            if reg.offset >= total {
                return Err(outside(total));
            }
            let pid = board.rank_pid(peer);
            let taken = pieces.iter().map(|&(fd, _)| take_fd_of(pid, fd)).collect::<Result<Vec<_>, _>>()?;
            let mut offset = 0u64;
            let mut layout = Vec::with_capacity(pieces.len());
            for (&(_, len), fd) in pieces.iter().zip(&taken) {
                layout.push((offset, len, std::os::fd::AsFd::as_fd(fd)));
                offset += len;
            }
            PeerMapping::Vmm(VmmMapping::map(gpu, &layout)?)
        }
    };
    let mapping = Arc::new(mapping);
    tracing::debug!(
        peer,
        id,
        ptr = mapping.ptr().0,
        len = mapping.len_bytes(),
        offset = reg.offset,
        "mapped a peer's registration"
    );
    Ok((mapping, reg.offset))
}
