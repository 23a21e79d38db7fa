//! Arrays registered where they are: the cache that lets `accord.Communicator` run collectives
//! on the caller's own memory (a torch CPU tensor, a numpy array) instead of copying it into
//! staging buffers and back.
//!
//! A registration is keyed by the memory's address and length and holds strong references to
//! the object passed, its byte memoryview (a buffer export: numpy arrays and bytearrays cannot
//! be resized while it lives; made at registration for the arrays a call reads without one)
//! and, for a torch tensor, its storage. So the memory stays
//! allocated, and no other array can appear at that address, for as long as it is cached; a
//! hit is therefore always the same memory. The engine holds the same references with every
//! transfer still reading the memory after deregistration.
//!
//! The cache is bounded ([`REGISTRATIONS_MAX`] entries and [`REGISTERED_BYTES_MAX`] bytes
//! held): the least recently used entries are deregistered first, never one the current call
//! uses. The price of the references is that memory the program has dropped stays allocated
//! while its entry is cached (at most the bounds above), until eviction or `close`. So an array
//! used once is kept only while the once-used arrays cached after it hold less than
//! [`COLD_BYTES_MAX`]: code that hands every call a fresh tensor (FSDP2) gets its memory back
//! at once, and the allocator can reuse it. An array the program itself still holds is exempt from
//! that rule: keeping its registration costs no memory, and DDP hands its every call one of a few
//! bucket tensors that live as long as the model. Before this exemption, DDP's three 64 MiB
//! buckets (issue 20's model) evicted one another at every call, and every all_reduce of a step
//! registered its bucket anew (`scripts/ddp_timeline_probe.py`: 0 hits, 48 misses).

use crate::coll_array::Array;
use accord_coll::engine::EngineTransport;
use accord_coll::{CollError, LocalBuf};
use pyo3::prelude::*;

type Comm = accord_coll::Communicator<EngineTransport>;

/// Registrations kept at most (each is one engine region).
pub(crate) const REGISTRATIONS_MAX: usize = 64;
/// Bytes of registered memory kept at most (beyond the arrays of the current call).
pub(crate) const REGISTERED_BYTES_MAX: usize = 1 << 30;

/// Bytes of arrays used by one call only (so far) that the cache keeps for a second use; older
/// ones are deregistered at the next miss. Why: FSDP2 gives each all_gather a fresh output and
/// each reduce_scatter a fresh input. Cached until the bounds above pushed them out, those
/// tensors stayed allocated after the program dropped them, so the allocator could not reuse
/// their memory and every call's new tensor came on fresh pages, which the kernel must zero.
/// A miss costs little: `scripts/registration_probe.py` (2 ranks, 8 MiB a rank) gives 80
/// outputs in turn, every call a miss, 5.55 ms a call against 6.31 for one output reused.
pub(crate) const COLD_BYTES_MAX: usize = 64 << 20;

/// The Python objects whose life keeps a registered array's memory allocated.
struct Holder {
    _obj: Py<PyAny>,
    _bytes_view: Py<PyAny>,
    _storage: Option<Py<PyAny>>,
}

struct Entry {
    addr: usize,
    len: usize,
    buf: LocalBuf,
    /// Whom the cache holds, and how much of its reference counts the cache's own references
    /// make up: what [`Entry::held_elsewhere`] subtracts.
    owner: OwnerRefs,
    /// The call that used it last (see [`Registrations::begin`]).
    last_use: u64,
    /// Calls that used it (1 until a hit).
    uses: u64,
}

/// The object a registration holds, with the share of its reference counts that the cache's
/// own references make up, so that later counts above that share mean the program holds it too.
struct OwnerRefs {
    obj: Py<PyAny>,
    /// References to `obj` the cache's holder made (the object itself, exports that point back).
    own_refs: isize,
    /// For a torch tensor: owners of its `TensorImpl` the holder added (a view made for the
    /// byte export keeps its base), beside the one of `obj` itself.
    own_tensor_uses: Option<i64>,
}

impl OwnerRefs {
    /// `obj`'s Python reference count and, for a torch tensor, its `TensorImpl`'s use count.
    fn counts(obj: &Bound<'_, PyAny>) -> (isize, Option<i64>) {
        (obj.get_refcnt(), tensor_use_count(obj))
    }

    /// What the cache holds of `obj` once its holder exists, given the counts before.
    fn after_holding(obj: &Bound<'_, PyAny>, before: (isize, Option<i64>)) -> OwnerRefs {
        let kept = obj.clone().unbind();
        let (refs, uses) = Self::counts(obj);
        OwnerRefs {
            obj: kept,
            own_refs: refs - before.0,
            own_tensor_uses: uses.zip(before.1).map(|(after, before)| after - before),
        }
    }

    /// Whether anything besides the cache holds the object: a Python reference the cache did not
    /// make, or (torch) an owner of its tensor beyond its Python object and the cache's views,
    /// such as DDP's reducer holding a bucket. When unsure, false: the entry is then treated as
    /// before the exemption existed.
    fn held_elsewhere(&self, py: Python<'_>) -> bool {
        let obj = self.obj.bind(py);
        if obj.get_refcnt() > self.own_refs {
            return true;
        }
        // Asked only of what was a tensor with a use count at registration.
        let Some(own) = self.own_tensor_uses else { return false };
        obj.call_method0("_use_count").and_then(|uses| uses.extract::<i64>()).is_ok_and(|uses| uses > 1 + own)
    }
}

/// A torch tensor's `TensorImpl` use count (`Tensor._use_count`), or None for other objects
/// and torch builds without it.
fn tensor_use_count(obj: &Bound<'_, PyAny>) -> Option<i64> {
    if !crate::coll_array::is_torch_tensor(obj) {
        return None;
    }
    obj.call_method0("_use_count").ok()?.extract::<i64>().ok()
}

/// The registration cache of one communicator.
#[derive(Default)]
pub(crate) struct Registrations {
    entries: Vec<Entry>,
    bytes: usize,
    call: u64,
    hits: u64,
    misses: u64,
}

impl Registrations {
    /// Starts a call: entries looked up from now until the next `begin` are never evicted.
    pub(crate) fn begin(&mut self) {
        self.call += 1;
    }

    /// The id of the registration of `array`'s memory, registering it on a miss. `array`
    /// must be writable (`addr` set); the caller checks that.
    pub(crate) fn lookup(&mut self, comm: &Comm, array: &Array<'_>) -> PyResult<u64> {
        let addr = array.addr.expect("only writable arrays are registered in place");
        let len = array.nbytes;
        if let Some(id) = self.hit(addr, len) {
            return Ok(id);
        }
        self.misses += 1;
        self.evict(array.obj.py(), comm, len);
        let storage = match array.obj.getattr("untyped_storage") {
            Ok(method) => Some(method.call0()?.unbind()),
            Err(_) => None,
        };
        let refs_before = OwnerRefs::counts(&array.obj);
        let holder = Holder {
            _obj: array.obj.clone().unbind(),
            // Made here for an array read without one (a plain torch tensor or numpy array): the
            // export is what stops numpy from resizing a registered array.
            _bytes_view: array.bytes_view()?.unbind(),
            _storage: storage,
        };
        let owner = OwnerRefs::after_holding(&array.obj, refs_before);
        // Safety: `addr..addr + len` is the writable memory behind `array`'s buffer (checked
        // in `coll_array::array`), kept allocated and in place by `holder`'s references for as
        // long as the transport or the engine holds it; collectives touch it only through the
        // transport, and the caller's thread waits for the call to finish before returning
        // the memory to Python code.
        #[allow(unsafe_code)]
        let buf = unsafe { comm.transport().register_external(addr as *mut u8, len, Box::new(holder)) }
            .map_err(|source| crate::errors::coll_error(CollError::Transport { collective: "register", source }))?;
        self.bytes += len;
        let id = buf.id();
        self.entries.push(Entry { addr, len, buf, owner, last_use: self.call, uses: 1 });
        Ok(id)
    }

    /// The id of the registration of exactly `addr..addr + len`, if cached (counted as a hit
    /// and kept for this call).
    fn hit(&mut self, addr: usize, len: usize) -> Option<u64> {
        let i = self.position(addr, len)?;
        Some(self.count_hit(i))
    }

    /// The ids of the registrations of exactly these regions, if every one is cached (each then
    /// counted as a hit and kept for this call); `None`, counting nothing, if one is not. Needs
    /// no Python object: `torch_native` calls it without the GIL.
    pub(crate) fn hit_all(&mut self, regions: &[(usize, usize)]) -> Option<Vec<u64>> {
        let found: Vec<usize> = regions.iter().map(|&(addr, len)| self.position(addr, len)).collect::<Option<_>>()?;
        Some(found.into_iter().map(|i| self.count_hit(i)).collect())
    }

    fn position(&self, addr: usize, len: usize) -> Option<usize> {
        self.entries.iter().position(|e| e.addr == addr && e.len == len)
    }

    /// Counts a hit on entry `i`, keeps it for this call, and gives its id.
    fn count_hit(&mut self, i: usize) -> u64 {
        self.entries[i].last_use = self.call;
        self.entries[i].uses += 1;
        self.hits += 1;
        self.entries[i].buf.id()
    }

    /// The registered buffer `id` (from [`Self::lookup`] in this call, so never evicted since).
    pub(crate) fn buf(&self, id: u64) -> &LocalBuf {
        &self.entries.iter().find(|e| e.buf.id() == id).expect("looked up in this call").buf
    }

    /// Deregisters the once-used entries the program no longer holds past [`COLD_BYTES_MAX`]
    /// (newest kept first), then least recently used entries, never one of this call, until
    /// `incoming` more bytes and one more entry fit the bounds.
    fn evict(&mut self, py: Python<'_>, comm: &Comm, incoming: usize) {
        // Only once-used entries can be cold, and they can be stale only when together they
        // pass the cold bound: below it, skip asking each whether the program holds it (for a
        // tensor a Python call, up to REGISTRATIONS_MAX of them on every miss).
        let once_used_bytes: usize =
            self.entries.iter().filter(|e| e.uses == 1 && e.last_use != self.call).map(|e| e.len).sum();
        if once_used_bytes > COLD_BYTES_MAX {
            self.evict_stale(py, comm);
        }
        while self.entries.len() >= REGISTRATIONS_MAX || self.bytes + incoming > REGISTERED_BYTES_MAX {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.last_use != self.call)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(i, _)| i);
            let Some(i) = oldest else { break };
            self.remove(comm, i);
        }
    }

    /// Deregisters the once-used entries the program no longer holds, past the newest
    /// [`COLD_BYTES_MAX`] of them.
    fn evict_stale(&mut self, py: Python<'_>, comm: &Comm) {
        let mut cold: Vec<usize> = (0..self.entries.len())
            .filter(|&i| {
                let e = &self.entries[i];
                e.uses == 1 && e.last_use != self.call && !e.owner.held_elsewhere(py)
            })
            .collect();
        cold.sort_by_key(|&i| std::cmp::Reverse(self.entries[i].last_use));
        let mut kept = 0;
        let mut stale: Vec<usize> = cold
            .into_iter()
            .filter(|&i| {
                kept += self.entries[i].len;
                kept > COLD_BYTES_MAX
            })
            .collect();
        stale.sort_unstable_by(|a, b| b.cmp(a));
        for i in stale {
            self.remove(comm, i);
        }
    }

    /// Deregisters entry `i`. A refusal (transfers still reading it) is harmless: the engine
    /// keeps the memory alive through the holder until they are done.
    fn remove(&mut self, comm: &Comm, i: usize) {
        let entry = self.entries.remove(i);
        self.bytes -= entry.len;
        let _ = comm.deregister(entry.buf);
    }

    /// Deregisters everything (before the communicator is dropped or closed).
    pub(crate) fn clear(&mut self, comm: &Comm) {
        for entry in self.entries.drain(..) {
            let _ = comm.deregister(entry.buf);
        }
        self.bytes = 0;
    }

    /// (entries, bytes, hits, misses), for tests and diagnostics.
    pub(crate) fn stats(&self) -> (usize, usize, u64, u64) {
        (self.entries.len(), self.bytes, self.hits, self.misses)
    }
}
