//! A few 64-bit words in pinned host memory, mapped for the GPU: what streams store into
//! (`cuStreamWriteValue64`) and wait on (`cuStreamWaitValue64`) and host threads read and write
//! as plain atomics, never calling the driver for them. The stream order words
//! ([`super::worker::MemoryGate`]), the direct calls' own progress words
//! ([`super::direct::OwnStreamWords`]) and stream marks ([`super::marks`]) are such words.

use std::sync::atomic::{AtomicU64, Ordering};

use accord_cuda::{DevicePtr, Gpu, PinnedHostBuffer};

use super::error::GpuResult;

/// `count` words, all 0 at first (the allocation zeroes them).
pub struct PinnedWords {
    buffer: PinnedHostBuffer,
}

impl std::fmt::Debug for PinnedWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.buffer.len_bytes() / 8;
        f.debug_list().entries((0..count).map(|i| self.load(i))).finish()
    }
}

impl PinnedWords {
    /// `count` (at least 1) zeroed words, pinned and mapped in `gpu`'s context and portable to
    /// every context of the process.
    pub fn new(gpu: &Gpu, count: usize) -> GpuResult<PinnedWords> {
        Ok(PinnedWords { buffer: PinnedHostBuffer::alloc(gpu, count.max(1) * 8)? })
    }

    /// The address streams use for word `i`.
    pub fn ptr(&self, i: usize) -> DevicePtr {
        self.buffer.device_ptr().offset(8 * i)
    }

    /// Word `i` for the host (None past the end).
    pub fn word(&self, i: usize) -> Option<&AtomicU64> {
        self.buffer.atomic_u64(i).ok()
    }

    /// Word `i`'s value (0 past the end).
    pub fn load(&self, i: usize) -> u64 {
        self.word(i).map_or(0, |w| w.load(Ordering::Acquire))
    }
}
