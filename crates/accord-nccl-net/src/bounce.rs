//! The bounce pool of a receive comm: shared host memory ([`accord_engine::Engine::alloc_shared`])
//! that receives into GPU memory land in first.
//!
//! Why: only the copy engine may write GPU memory, and NCCL's receive buffer belongs to the
//! receiving process. So the receiver names a range of its pool in the clear-to-send instead
//! of its GPU buffer; a sender on this host has its GPU copy its bytes straight into that
//! range (one device-to-host DMA through its mapping of the pool), a sender elsewhere writes
//! them over the transport; and the receiver copies the range into the GPU buffer
//! (host-to-device DMA) before `test` reports the receive done. Each receive holds its range
//! from `irecv` until its request is released.
//!
//! Ranges are page-aligned, allocated first-fit and coalesced when returned; a receive that
//! does not fit now waits (`irecv` returns no request and NCCL calls again).
//!
//! Both ends page-lock the pool for their GPU when the comm is set up ([`pin_for_current_gpu`]),
//! on NCCL's setup thread: page-locking synchronises with the GPU, so doing it on the progress
//! thread while a collective kernel waits for that thread would deadlock.

use crate::error::{PluginError, Result};
use accord_engine::MrBuffer;
use std::sync::{Arc, Mutex};

/// Ranges start on this boundary (the copy engines' efficient alignment; also a page).
pub const RANGE_ALIGN_BYTES: u64 = 4096;

/// Free ranges `(offset, len)`, sorted by offset, never adjacent (coalesced).
#[derive(Debug)]
struct FreeList {
    ranges: Vec<(u64, u64)>,
}

impl FreeList {
    fn new(len: u64) -> FreeList {
        FreeList { ranges: vec![(0, len)] }
    }

    /// First fit: the offset of `len` bytes taken from the first free range that holds them.
    fn take(&mut self, len: u64) -> Option<u64> {
        let i = self.ranges.iter().position(|&(_, free)| free >= len)?;
        let (offset, free) = self.ranges[i];
        if free == len {
            self.ranges.remove(i);
        } else {
            self.ranges[i] = (offset + len, free - len);
        }
        Some(offset)
    }

    /// Returns a range taken before, merging it with its free neighbours.
    fn give(&mut self, offset: u64, len: u64) {
        let i = self.ranges.partition_point(|&(o, _)| o < offset);
        debug_assert!(i == 0 || self.ranges[i - 1].0 + self.ranges[i - 1].1 <= offset, "double free");
        let joins_prev = i > 0 && self.ranges[i - 1].0 + self.ranges[i - 1].1 == offset;
        let joins_next = i < self.ranges.len() && offset + len == self.ranges[i].0;
        match (joins_prev, joins_next) {
            (true, true) => {
                self.ranges[i - 1].1 += len + self.ranges[i].1;
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i - 1].1 += len,
            (false, true) => self.ranges[i] = (offset, len + self.ranges[i].1),
            (false, false) => self.ranges.insert(i, (offset, len)),
        }
    }
}

/// A receive comm's pool.
#[derive(Debug)]
pub struct BouncePool {
    buffer: MrBuffer,
    free: Arc<Mutex<FreeList>>,
}

impl BouncePool {
    /// A pool over `buffer` (a shared host region).
    pub fn new(buffer: MrBuffer) -> BouncePool {
        let free = Arc::new(Mutex::new(FreeList::new(buffer.len() as u64)));
        BouncePool { buffer, free }
    }

    /// The region the clear-to-send names and the receiver copies from.
    pub fn buffer(&self) -> &MrBuffer {
        &self.buffer
    }

    /// A range of `len` bytes (> 0), `None` while the pool is too full, or an error when `len`
    /// exceeds the whole pool (it would never fit).
    pub fn lease(&self, len: u64) -> Result<Option<BounceLease>> {
        let rounded = len.max(1).next_multiple_of(RANGE_ALIGN_BYTES);
        if rounded > self.buffer.len() as u64 {
            return Err(PluginError::InvalidArgument(format!(
                "a receive of {len} bytes into GPU memory exceeds the {} byte bounce pool: raise \
                 ACCORD_NET_BOUNCE_BYTES",
                self.buffer.len()
            )));
        }
        let offset = self.free.lock().unwrap_or_else(|e| e.into_inner()).take(rounded);
        Ok(offset.map(|offset| BounceLease { offset, len: rounded, free: self.free.clone() }))
    }
}

/// A range of the pool, returned when dropped.
#[derive(Debug)]
pub struct BounceLease {
    /// Offset in the pool's region.
    pub offset: u64,
    len: u64,
    free: Arc<Mutex<FreeList>>,
}

impl Drop for BounceLease {
    fn drop(&mut self) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).give(self.offset, self.len);
    }
}

/// Page-locks a bounce pool for the copy engines of the GPU current on this thread (NCCL's
/// setup threads have their device's context current): `pin` does it for the receiver's own
/// pool, or maps and pins a peer's. Without a current GPU, or on failure, the pool works
/// unpinned (the driver stages the copies), so this only logs.
pub fn pin_for_current_gpu(what: &str, pin: impl FnOnce(u32) -> std::result::Result<(), accord_engine::RegisterError>) {
    match accord_engine::current_gpu() {
        Some(gpu) => {
            if let Err(e) = pin(gpu) {
                crate::log::warn(
                    line!(),
                    &format!("{what}: not page-locked for GPU {gpu} ({e}); copies will be slower"),
                );
            }
        }
        None => crate::log::warn(
            line!(),
            &format!("{what}: no CUDA context is current on NCCL's setup thread, so it is not page-locked"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn ranges_are_taken_first_fit_and_coalesce_when_given_back() {
        let mut f = FreeList::new(100);
        let a = f.take(30).unwrap();
        let b = f.take(30).unwrap();
        let c = f.take(30).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(f.take(20), None, "10 bytes left");
        f.give(b, 30);
        assert_eq!(f.take(20), Some(30), "first fit reuses the hole");
        f.give(30, 20);
        f.give(a, 30);
        f.give(c, 30);
        assert_eq!(f.ranges, vec![(0, 100)], "everything merged back");
    }

    /// Random takes and gives never hand out overlapping ranges and always merge back whole.
    #[test]
    fn random_use_never_overlaps_and_merges_back() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut f = FreeList::new(1 << 20);
        let mut held: Vec<(u64, u64)> = Vec::new();
        for _ in 0..5000 {
            if held.is_empty() || rng.gen_bool(0.55) {
                let len = rng.gen_range(1..=64u64) * 4096;
                if let Some(o) = f.take(len) {
                    assert!(held.iter().all(|&(ho, hl)| o + len <= ho || ho + hl <= o), "overlap");
                    held.push((o, len));
                }
            } else {
                let (o, l) = held.swap_remove(rng.gen_range(0..held.len()));
                f.give(o, l);
            }
        }
        for (o, l) in held {
            f.give(o, l);
        }
        assert_eq!(f.ranges, vec![(0, 1 << 20)]);
    }
}
