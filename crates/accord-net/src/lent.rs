//! Received bytes a datapath lends in place instead of copying them into a receive slot: the
//! payload of a shared-memory ring entry, read straight from the mapping by whoever places it.
//!
//! Why: on a same-host stream the receiver otherwise copies every byte twice (ring -> slot,
//! slot -> destination), and with both directions busy those copies bound the throughput. A
//! lending datapath copies only the first bytes of a datagram (its header, which the caller
//! parses) into the slot and attaches a [`LentBytes`] for the whole datagram.
//!
//! Contract: the memory stays mapped and unchanged by its owner's protocol until the next call
//! of any method of the datapath that lent it (the shared-memory ring hands the space back to
//! its producer only then). A hostile peer may still scribble on it concurrently; the bytes
//! are then only copied, never interpreted in place, so that costs data it sent, nothing else.
#![allow(unsafe_code)]

use std::ptr::NonNull;

/// A read-only view of `len` bytes of shared memory, valid under the module's contract.
#[derive(Debug)]
pub struct LentBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// Safety: the view is only read through raw copies; the memory it names stays mapped for as
// long as the receive slot holding it (see the module's contract), whichever thread reads it.
unsafe impl Send for LentBytes {}

impl LentBytes {
    /// Wraps `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped and readable until the next call of any method of the
    /// datapath that hands this view out (the module's contract).
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize) -> LentBytes {
        LentBytes { ptr, len }
    }

    /// Bytes of the whole datagram.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes from `start` into `dst`; false (copying nothing) when the range
    /// is not inside the datagram.
    pub fn copy_to_slice(&self, start: usize, dst: &mut [u8]) -> bool {
        if start.checked_add(dst.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        // Safety: the source range is inside the lent bytes (checked above, valid by the
        // module's contract); `dst` is the caller's own memory, never inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(start), dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `len` bytes from `start` to `dst`; false (copying nothing) when the range is not
    /// inside the datagram.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and not overlap the lent memory.
    pub unsafe fn copy_to_raw(&self, start: usize, len: usize, dst: *mut u8) -> bool {
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return false;
        }
        // Safety: the source range was checked above and is valid by the module's contract;
        // the caller vouches for `dst`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(start), dst, len) };
        true
    }

    /// As [`LentBytes::copy_to_raw`], with streaming stores ([`crate::streaming`]): for a
    /// destination that a device, not the CPU, reads next.
    ///
    /// # Safety
    /// As for [`LentBytes::copy_to_raw`].
    pub unsafe fn copy_to_raw_streaming(&self, start: usize, len: usize, dst: *mut u8) -> bool {
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return false;
        }
        // Safety: the source range was checked above and is valid by the module's contract;
        // the caller vouches for `dst`, which does not overlap the lent memory.
        unsafe { crate::streaming::copy_streaming(dst, self.ptr.as_ptr().add(start), len) };
        true
    }
}
