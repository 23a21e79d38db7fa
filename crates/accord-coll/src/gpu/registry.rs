//! Buffer registration (this rank's receive buffers, exported as IPC
//! handles through the store) and the bounded cache of peers' buffers
//! mapped into this process.
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

use std::collections::BTreeMap;
use std::sync::Arc;

use accord_cuda::ipc::IPC_HANDLE_BYTES;
use accord_cuda::{DeviceBuffer, DevicePtr, Gpu, IpcHandle, IpcMapping, MappingCache};

use super::error::{GpuCollError, GpuResult};
use crate::store::StoreClient;

/// Store key of `rank`'s registration `id` under `prefix`.
pub fn registration_key(prefix: &str, rank: usize, id: u64) -> String {
    format!("{prefix}/reg/{rank}/{id}")
}

/// This rank's registered buffers: id -> (base, length).
#[derive(Debug)]
pub struct Registrations {
    next_id: u64,
    by_id: BTreeMap<u64, (u64, usize)>,
    max: usize,
}

impl Registrations {
    /// An empty table of at most `max` entries; ids start at 1.
    pub fn new(max: usize) -> Registrations {
        Registrations { next_id: 1, by_id: BTreeMap::new(), max }
    }

    /// The id of the registration exactly covering `buf`, if any.
    pub fn find_exact(&self, base: u64, len: usize) -> Option<u64> {
        self.by_id.iter().find(|(_, &(b, l))| b == base && l == len).map(|(id, _)| *id)
    }

    /// Adds a range and returns its new id.
    pub fn insert(&mut self, base: u64, len: usize) -> GpuResult<u64> {
        if self.by_id.len() >= self.max {
            return Err(GpuCollError::TableFull {
                what: "the registration table",
                max: self.max,
                env: "ACCORD_GPU_REGISTRATIONS_MAX",
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.by_id.insert(id, (base, len));
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
            .find(|(_, &(b, l))| ptr >= b && ptr.saturating_add(len as u64) <= b + l as u64)
            .map(|(id, &(b, _))| (*id, ptr - b))
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

/// Exports `buf` and publishes its handle at `key`.
pub fn publish(store: &mut StoreClient, key: &str, buf: &DeviceBuffer) -> GpuResult<()> {
    let handle = IpcHandle::export(buf)?;
    store.set(key, &handle.to_bytes())?;
    Ok(())
}

/// Peers' buffers mapped here, least recently used evicted first (the cache type the engine's
/// copy-engine route uses too); evicted and stale mappings are retired, not closed.
pub struct PeerMappings {
    gpu: Gpu,
    prefix: String,
    store: StoreClient,
    open: MappingCache<(usize, u64), Arc<IpcMapping>>,
    retired: Vec<Arc<IpcMapping>>,
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
    pub fn new(gpu: Gpu, prefix: String, store: StoreClient, world_size: usize, max: usize) -> PeerMappings {
        PeerMappings {
            gpu,
            prefix,
            store,
            open: MappingCache::new(max),
            retired: Vec::new(),
            epochs: vec![0; world_size],
            max,
        }
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
        for mapping in self.open.remove_where(|(p, _)| *p == peer) {
            self.retire(mapping)?;
        }
        Ok(())
    }

    fn retire(&mut self, mapping: Arc<IpcMapping>) -> GpuResult<()> {
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

    /// The base address, in this process, of `peer`'s registration `id`.
    pub fn resolve(&mut self, peer: usize, id: u64, timeout: std::time::Duration) -> GpuResult<DevicePtr> {
        // The store key is formatted only on a miss: a hit costs one hash lookup, no allocation.
        let (gpu, store, prefix) = (&self.gpu, &mut self.store, &self.prefix);
        let (mapping, evicted) = self.open.get_or_open((peer, id), || {
            open_registration(gpu, store, &registration_key(prefix, peer, id), peer, id, timeout)
        })?;
        if let Some(old) = evicted {
            self.retire(old)?;
        }
        Ok(mapping.ptr())
    }

    /// Closes retired mappings (each close synchronises the GPU: call only
    /// with no collective in flight).
    pub fn close_retired(&mut self) -> usize {
        let count = self.retired.len();
        self.retired.clear();
        count
    }
}

/// Maps `peer`'s registration `id`, whose IPC handle the store holds at `key`.
fn open_registration(
    gpu: &Gpu,
    store: &mut StoreClient,
    key: &str,
    peer: usize,
    id: u64,
    timeout: std::time::Duration,
) -> GpuResult<Arc<IpcMapping>> {
    let bytes = store.get(key, timeout)?;
    let array: [u8; IPC_HANDLE_BYTES] = bytes.as_slice().try_into().map_err(|_| GpuCollError::Protocol {
        rank: peer,
        what: format!("its registration {id} is {} bytes, not an IPC handle", bytes.len()),
    })?;
    let handle = IpcHandle::from_bytes(&array)
        .map_err(|e| GpuCollError::Protocol { rank: peer, what: format!("registration {id}: {e}") })?;
    Ok(Arc::new(IpcMapping::open(gpu, &handle)?))
}
