//! Registered collective buffers: memory whose address never changes while peers may write
//! into it, and the only place this crate touches it through raw pointers.
#![allow(unsafe_code)]

/// A buffer handed to the transport by value. Its heap allocation is registered with the
/// engine by address, so it must neither move nor be resized until it is deregistered; this
/// type owns it and gives out nothing that could do either.
pub(crate) struct Pinned {
    memory: Vec<u8>,
    ptr: *mut u8,
}

// Safety: `Pinned` owns its allocation; the raw pointer is only an alias of that allocation,
// used by the engine's workers (placing peers' writes) and by the collective thread (local
// access), which the collective schedules keep apart (see `view`/`view_mut`).
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    pub(crate) fn new(mut memory: Vec<u8>) -> Self {
        let ptr = memory.as_mut_ptr();
        Pinned { memory, ptr }
    }

    pub(crate) fn len(&self) -> usize {
        self.memory.len()
    }

    /// Gives the memory back (the region must be deregistered first).
    pub(crate) fn into_vec(self) -> Vec<u8> {
        self.memory
    }

    /// Bytes `offset..offset + len`, read-only.
    ///
    /// The caller has checked the range. Peers' writes land through the engine while the
    /// buffer is registered; the collective schedules only read a range after waiting for the
    /// immediates of every write into it, and no peer writes a range again before the next
    /// handshake, so no write races this read.
    pub(crate) fn view(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len()), "range checked by the caller");
        // Safety: in bounds of the owned allocation (asserted above), which lives as long as
        // `self`; no concurrent write to these bytes by the protocol argument above.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }
    }

    /// Bytes `offset..offset + len`, writable. Same conditions as [`Pinned::view`]; in
    /// addition the caller never holds two overlapping views of one buffer at once.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn view_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len()), "range checked by the caller");
        // Safety: in bounds (asserted); exclusive for its lifetime by the caller's contract
        // (disjoint local views, no peer writing these bytes meanwhile).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

/// Registers `pinned` with `engine` for one-sided writes by peers; the engine keeps a clone of
/// the `Arc` with every transfer that reads the region, so the memory outlives them all.
pub(crate) fn register(
    pinned: &std::sync::Arc<Pinned>,
    engine: &accord_engine::Engine,
) -> Result<(accord_engine::MrHandle, accord_engine::MrDescriptor), accord_engine::RegisterError> {
    let owner: accord_engine::MemoryOwner = pinned.clone();
    // Safety: the allocation is owned by the `Pinned` behind `owner`, never moves (no `&mut
    // Vec` is handed out) and lives as long as any clone of `owner`, which the engine holds
    // for every transfer reading it; `into_vec` runs only once every clone is gone.
    unsafe { engine.register_raw_owned(pinned.ptr, pinned.len(), accord_engine::MemoryKind::Host, Some(owner)) }
}
