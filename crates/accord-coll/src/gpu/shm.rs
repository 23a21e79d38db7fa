//! A shared-memory segment of 64-bit atomic words, mapped into every rank's
//! process (a file under `/dev/shm`, created by rank 0, opened by the others,
//! unlinked once everyone has it open so nothing is left behind on a crash).
//!
//! This is the only module of the GPU collectives with `unsafe` code: the
//! `mmap`/`munmap` calls and the view of the mapping as atomics.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use super::error::{GpuCollError, GpuResult};

/// Largest segment accepted (words), a bound on what a peer can make us map.
pub const SEGMENT_WORDS_MAX: usize = 1 << 20;

/// A mapped segment of `words` atomic u64 words, unmapped on drop.
#[derive(Debug)]
pub struct SharedWords {
    base: *mut AtomicU64,
    words: usize,
    path: PathBuf,
}

// Safety: the mapping is plain shared memory accessed only through atomics; the pointer stays
// valid until drop, and no thread-affine state is involved.
unsafe impl Send for SharedWords {}
// Safety: as above; every access is an atomic operation on a word of the mapping.
unsafe impl Sync for SharedWords {}

fn shm_error(path: &Path, reason: impl std::fmt::Display) -> GpuCollError {
    GpuCollError::SharedMemory { path: path.display().to_string(), reason: reason.to_string() }
}

impl SharedWords {
    /// Creates a new zero-filled segment at `path` (which must not exist).
    pub fn create(path: &Path, words: usize) -> GpuResult<SharedWords> {
        check_words(path, words)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| shm_error(path, format!("create: {e}")))?;
        file.set_len((words * 8) as u64).map_err(|e| shm_error(path, format!("resize: {e}")))?;
        SharedWords::map(file, path, words)
    }

    /// Opens the segment another process created at `path`.
    pub fn open(path: &Path, words: usize) -> GpuResult<SharedWords> {
        check_words(path, words)?;
        let file =
            OpenOptions::new().read(true).write(true).open(path).map_err(|e| shm_error(path, format!("open: {e}")))?;
        let len = file.metadata().map_err(|e| shm_error(path, format!("stat: {e}")))?.len();
        if len != (words * 8) as u64 {
            return Err(shm_error(path, format!("is {len} bytes, expected {}; ranks run different builds", words * 8)));
        }
        SharedWords::map(file, path, words)
    }

    fn map(file: File, path: &Path, words: usize) -> GpuResult<SharedWords> {
        // Safety: a fresh shared mapping of a file we hold open, of exactly its length; the result is
        // checked against MAP_FAILED before use. The file descriptor may be closed after mmap.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                words * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(shm_error(path, format!("mmap: {}", std::io::Error::last_os_error())));
        }
        Ok(SharedWords { base: ptr.cast::<AtomicU64>(), words, path: path.to_path_buf() })
    }

    /// Removes the file name (the mapping stays valid in every process that has it).
    pub fn unlink(&self) -> GpuResult<()> {
        std::fs::remove_file(&self.path).map_err(|e| shm_error(&self.path, format!("unlink: {e}")))
    }

    /// Word `index`. Panics if out of range (our own layout's invariant).
    pub fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index < self.words, "shared word {index} is outside the {}-word segment", self.words);
        // Safety: index is in range; the mapping is page-aligned (so every word is 8-byte aligned),
        // lives as long as &self, and AtomicU64 has the layout of u64. Other processes only use
        // atomic operations on it too.
        unsafe { &*self.base.add(index) }
    }

    /// Number of words.
    pub fn len_words(&self) -> usize {
        self.words
    }
}

fn check_words(path: &Path, words: usize) -> GpuResult<()> {
    if words == 0 || words > SEGMENT_WORDS_MAX {
        return Err(shm_error(path, format!("{words} words is outside 1..={SEGMENT_WORDS_MAX}")));
    }
    Ok(())
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // Safety: base/words are exactly what mmap returned; no reference into the mapping outlives
        // self (word() borrows self).
        unsafe {
            libc::munmap(self.base.cast(), self.words * 8);
        }
    }
}
