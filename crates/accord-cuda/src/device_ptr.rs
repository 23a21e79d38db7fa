//! A device address: the one type every other module of this crate passes, in a file of its own
//! so that streams, copies and launches name it without importing the memory module (which
//! itself queues work on streams). `crate::memory` re-exports it.

use std::fmt;

/// A device address in the unified virtual address space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `offset_bytes` further on.
    pub fn offset(self, offset_bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + offset_bytes as u64)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr(0x{:x})", self.0)
    }
}
