//! Copies whose destination the CPU will not read next: non-temporal ("streaming") stores.
//!
//! Why: a plain store to a line the cache does not hold first reads that line from memory (the
//! read for ownership), so copying N bytes into cold memory moves 3N bytes through it, and the
//! copied lines then push the CPU's own data out of the cache. Streaming stores write whole
//! lines straight to memory: 2N bytes moved and the cache left alone. That is right for memory
//! a device reads next by DMA (NCCL's pinned host buffers, which its GPU kernels read), and
//! wrong for memory the CPU reads next (a collective reducing what just arrived), which would
//! then miss. So it is the registrant's choice per region
//! (`accord_engine::MemoryKind::HostForDevice`), never the default.
//!
//! Measured with `scripts/device/nontemporal_copy_probe.c` (60 KiB and 512 KiB pieces out of a
//! warm source into a cold destination, the engine's shared-memory receive): 1.95-2.44x the
//! bytes a second of memcpy at 1, 8, 16 and 24 threads on the 2xH200 host's 32-core Xeon
//! (docs/results/2026-11-28-streaming-stores.md), 1.30-1.37x on the 2-core EPYC development
//! machine.
#![allow(unsafe_code)]

/// Copies shorter than this use plain stores: the fence a streaming copy ends with, and the
/// plain stores of its unaligned head and tail, cost more than they save on a few lines.
pub const STREAMING_COPY_MIN_BYTES: usize = 4096;

/// Bytes copied with streaming stores in this process, summed over threads: the proof that a
/// path took them (stop 49 could only argue from code that the plugin's receives did).
static BYTES_STREAMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes this process has copied with streaming stores so far (plain-store copies not counted).
pub fn bytes_streamed() -> u64 {
    BYTES_STREAMED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Copies `len` bytes from `src` to `dst`, with streaming stores where the platform has them
/// and `len` is at least [`STREAMING_COPY_MIN_BYTES`], plain ones otherwise. Ends with a store
/// fence: every byte is visible to other cores and devices before any later store of this
/// thread (such as the completion that tells a reader the bytes are there).
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the two ranges must
/// not overlap.
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAMING_COPY_MIN_BYTES {
        // Safety: forwarded from this function's contract.
        unsafe { copy_streaming_x86_64(dst, src, len) };
        // One relaxed add per copy of at least 4 KiB: noise beside the copy.
        BYTES_STREAMED.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        return;
    }
    // Safety: forwarded from this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Copies all of `src` into `dst` (equal lengths) as [`copy_streaming`] does: the safe form for
/// two slices, which cannot overlap.
pub fn copy_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "a streaming copy between slices of different lengths");
    // Safety: two slices, one of them mutable, are valid and never overlap.
    unsafe { copy_streaming(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// SSE2 (part of every x86-64): plain stores up to the destination's first 16-byte boundary,
/// then 64 bytes (a cache line) a step of unaligned loads and aligned streaming stores, plain
/// stores for the tail, and `sfence`.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming_x86_64(mut dst: *mut u8, mut src: *const u8, mut len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = dst.align_offset(16).min(len);
    // Safety (this block and the loop): every access stays inside the `len` bytes the caller
    // vouched for; the streaming stores' addresses are 16-byte aligned (after `head`).
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        dst = dst.add(head);
        src = src.add(head);
        len -= head;
        while len >= 64 {
            let a = _mm_loadu_si128(src as *const __m128i);
            let b = _mm_loadu_si128(src.add(16) as *const __m128i);
            let c = _mm_loadu_si128(src.add(32) as *const __m128i);
            let d = _mm_loadu_si128(src.add(48) as *const __m128i);
            _mm_stream_si128(dst as *mut __m128i, a);
            _mm_stream_si128(dst.add(16) as *mut __m128i, b);
            _mm_stream_si128(dst.add(32) as *mut __m128i, c);
            _mm_stream_si128(dst.add(48) as *mut __m128i, d);
            dst = dst.add(64);
            src = src.add(64);
            len -= 64;
        }
        std::ptr::copy_nonoverlapping(src, dst, len);
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests;
