//! Registered collective buffers: memory whose address never changes while peers may write
//! into it, and the only place this crate touches it through raw pointers.
#![allow(unsafe_code)]

/// A buffer registered with the engine by address, so it must neither move nor be resized
/// until it is deregistered: either a `Vec` handed to the transport by value (owned here,
/// nothing that could move it is given out), or memory someone else allocated (a tensor's),
/// kept alive by the owner handed in with it (see [`Pinned::external`]).
pub(crate) struct Pinned {
    backing: Backing,
    ptr: *mut u8,
    len: usize,
}

/// What keeps a [`Pinned`] buffer's memory alive.
enum Backing {
    /// The transport owns the allocation.
    Owned(Vec<u8>),
    /// Memory allocated elsewhere, valid as long as this owner lives.
    External(#[allow(dead_code)] Box<dyn std::any::Any + Send + Sync>),
}

// Safety: `Pinned` owns its allocation; the raw pointer is only an alias of that allocation,
// used by the engine's workers (placing peers' writes) and by the collective thread (local
// access), which the collective schedules keep apart (see `view`/`view_mut`).
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    pub(crate) fn new(mut memory: Vec<u8>) -> Self {
        let (ptr, len) = (memory.as_mut_ptr(), memory.len());
        Pinned { backing: Backing::Owned(memory), ptr, len }
    }

    /// Memory at `ptr..ptr + len` that `owner` keeps alive.
    ///
    /// # Safety
    /// The range must be valid for reads and writes for as long as `owner` lives, and nothing
    /// else may hold a Rust reference to it or write it while this `Pinned` exists, except
    /// through the views below under their conditions.
    pub(crate) unsafe fn external(ptr: *mut u8, len: usize, owner: Box<dyn std::any::Any + Send + Sync>) -> Self {
        Pinned { backing: Backing::External(owner), ptr, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Gives the memory back (the region must be deregistered first); external memory gives
    /// back nothing (its owner is dropped here, releasing it).
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self.backing {
            Backing::Owned(memory) => memory,
            Backing::External(_) => Vec::new(),
        }
    }

    /// Bytes `offset..offset + len`, read-only.
    ///
    /// The caller has checked the range. Peers' writes land through the engine while the
    /// buffer is registered; the collective schedules only read a range after waiting for the
    /// immediates of every write into it, and no peer writes a range again before the next
    /// handshake, so no write races this read.
    pub(crate) fn view(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len()), "range checked by the caller");
        // Safety: in bounds of the allocation (asserted above), which lives as long as `self`
        // (owned, or kept alive by the external owner); no concurrent write to these bytes by the protocol argument above.
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
    // Safety: the allocation is owned (or kept alive, for external memory) by the `Pinned`
    // behind `owner`, never moves (no `&mut Vec` is handed out) and lives as long as any clone
    // of `owner`, which the engine holds for every transfer reading it; `into_vec` runs only
    // once every clone is gone.
    unsafe { engine.register_raw_owned(pinned.ptr, pinned.len(), accord_engine::MemoryKind::Host, Some(owner)) }
}
