//! A file in a shared-memory directory, mapped read-write and shared by several processes of
//! this host: the one place where Accord creates, opens, maps, unmaps and unlinks such a file.
//!
//! Why one place: the shared-memory datagram rings (`accord-net`'s `shm::ring`), the engine's
//! shared host regions (`accord-engine`'s `memory::shared_file`, behind the `CopyIntoSharedHost`
//! route), the host arena and the GPU collectives' flag board (`accord-coll`) all need exactly
//! this, with the same trust rules, and each used to carry its own `mmap`. It lives here, below
//! the datapaths, so the rings can use it too.
//!
//! Trust is that of the shared-memory datagram rings: same user, same host. A file is created
//! with `O_EXCL` and mode 0600 and its pages reserved (a full tmpfs fails at creation, not with
//! a `SIGBUS` later); an existing file is opened with `O_NOFOLLOW` and mapped only if it is a
//! regular file of this user of exactly the expected length. [`SharedMapping::unlink`] removes
//! the name only while it still names the file this mapping holds, and the creator unlinks on
//! drop if it has not yet, so a failed start leaves nothing behind.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Why a shared mapping could not be made or unlinked (the path is in [`SharedMapError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedMapFailure {
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done (`create`, `open`, `resize`, `stat`, `mmap`, `unlink`).
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The pages of a new file could not be reserved.
    #[error("reserve {bytes} bytes: {source} (is the shared-memory directory full?)")]
    Reserve {
        /// Bytes asked for.
        bytes: usize,
        /// The operating system's error.
        source: io::Error,
    },
    /// An existing file's length is not the one expected.
    #[error("holds {actual} bytes where {expected} are expected")]
    WrongLength {
        /// The file's length.
        actual: u64,
        /// The length the caller expected.
        expected: usize,
    },
    /// The file is a link, a directory or a device, or belongs to another user.
    #[error("is not a regular file of this user")]
    NotOwnRegularFile,
    /// A mapping of zero bytes was asked for.
    #[error("a mapping needs at least one byte")]
    Empty,
    /// The path cannot be passed to the kernel.
    #[error("the path contains a NUL byte")]
    NulInPath,
    /// The path names another file than the one this mapping holds (it was replaced).
    #[error("names another file than the one mapped here; left in place")]
    Replaced,
}

/// A shared mapping could not be made or unlinked.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct SharedMapError {
    /// The file.
    pub path: PathBuf,
    /// What failed.
    pub reason: SharedMapFailure,
}

fn fail(path: &Path, reason: SharedMapFailure) -> SharedMapError {
    SharedMapError { path: path.to_path_buf(), reason }
}

fn io_fail<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> SharedMapError + 'a {
    move |source| fail(path, SharedMapFailure::Io { op, source })
}

/// When a mapping's page-table entries are filled.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Pages {
    /// On first touch of each page (the kernel's default).
    OnFirstTouch,
    /// All at once when mapping (`MAP_POPULATE`): for memory that is streamed through at once,
    /// such as a datagram ring, where a fault for every 4 KiB of the first pass made the first
    /// megabytes slower than the loopback sockets the ring replaces.
    Populated,
}

/// A shared-memory file mapped read-write into this process, unmapped on drop.
pub struct SharedMapping {
    path: PathBuf,
    base: NonNull<u8>,
    len: usize,
    /// (device, inode) of the mapped file, so an unlink never removes a file that replaced it.
    identity: (u64, u64),
    /// This mapping created the file: it unlinks it on drop unless that was done already.
    creator: bool,
    unlinked: AtomicBool,
}

// Safety: the mapping is plain shared bytes with no thread affinity; access goes through raw
// copies synchronised by their users (the engine's memory rules) or through atomics (`words`).
unsafe impl Send for SharedMapping {}
// Safety: as above.
unsafe impl Sync for SharedMapping {}

impl std::fmt::Debug for SharedMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMapping").field("path", &self.path).field("len", &self.len).finish_non_exhaustive()
    }
}

impl SharedMapping {
    /// Creates the file `path` (which must not exist), `len` zeroed bytes with their pages
    /// reserved, and maps it. The name stays until [`SharedMapping::unlink`] or this mapping's
    /// drop.
    pub fn create(path: &Path, len: usize) -> Result<SharedMapping, SharedMapError> {
        SharedMapping::create_with(path, len, Pages::OnFirstTouch)
    }

    /// As [`SharedMapping::create`], with the page-table entries filled as `pages` says.
    pub fn create_with(path: &Path, len: usize, pages: Pages) -> Result<SharedMapping, SharedMapError> {
        check_path(path, len)?;
        let file = open_file(path, true)?;
        let mapped = (|| {
            file.set_len(len as u64).map_err(io_fail(path, "resize"))?;
            // Safety: an open descriptor we own; reserves the pages of the whole file.
            let reserve = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
            if reserve != 0 {
                let source = io::Error::from_raw_os_error(reserve);
                return Err(fail(path, SharedMapFailure::Reserve { bytes: len, source }));
            }
            let meta = file.metadata().map_err(io_fail(path, "stat"))?;
            SharedMapping::map(&file, path, len, (meta.dev(), meta.ino()), true, pages)
        })();
        if mapped.is_err() {
            let _ = std::fs::remove_file(path);
        }
        mapped
    }

    /// Maps the existing file `path`, which must be a regular file of this user of exactly
    /// `len` bytes.
    pub fn open(path: &Path, len: usize) -> Result<SharedMapping, SharedMapError> {
        SharedMapping::open_with(path, len, Pages::OnFirstTouch)
    }

    /// As [`SharedMapping::open`], with the page-table entries filled as `pages` says.
    pub fn open_with(path: &Path, len: usize, pages: Pages) -> Result<SharedMapping, SharedMapError> {
        check_path(path, len)?;
        let file = open_file(path, false)?;
        let meta = file.metadata().map_err(io_fail(path, "stat"))?;
        // Safety: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        if !meta.file_type().is_file() || meta.uid() != uid {
            return Err(fail(path, SharedMapFailure::NotOwnRegularFile));
        }
        if meta.len() != len as u64 {
            return Err(fail(path, SharedMapFailure::WrongLength { actual: meta.len(), expected: len }));
        }
        SharedMapping::map(&file, path, len, (meta.dev(), meta.ino()), false, pages)
    }

    fn map(
        file: &File,
        path: &Path,
        len: usize,
        identity: (u64, u64),
        creator: bool,
        pages: Pages,
    ) -> Result<SharedMapping, SharedMapError> {
        let flags = match pages {
            Pages::OnFirstTouch => libc::MAP_SHARED,
            Pages::Populated => libc::MAP_SHARED | libc::MAP_POPULATE,
        };
        // Safety: a fresh shared mapping of a descriptor we hold open, of the file's length; the
        // kernel checks the arguments and the result is checked before use. The descriptor may
        // be closed afterwards.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, file.as_raw_fd(), 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(fail(path, SharedMapFailure::Io { op: "mmap", source: io::Error::last_os_error() }));
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| {
            fail(path, SharedMapFailure::Io { op: "mmap", source: io::ErrorKind::InvalidData.into() })
        })?;
        let mapping =
            SharedMapping { path: path.to_path_buf(), base, len, identity, creator, unlinked: AtomicBool::new(false) };
        // Mappings start on a page boundary; `words` relies on it.
        debug_assert_eq!(mapping.addr() % std::mem::align_of::<AtomicU64>(), 0);
        Ok(mapping)
    }

    /// Removes the file's name, once every process that needs it has it mapped (their mappings
    /// stay valid). Idempotent; refuses (leaving it) a file that replaced the one mapped here,
    /// and succeeds if the name is already gone.
    pub fn unlink(&self) -> Result<(), SharedMapError> {
        if self.unlinked.load(Ordering::Acquire) {
            return Ok(());
        }
        match std::fs::symlink_metadata(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_fail(&self.path, "unlink")(e)),
            Ok(meta) if (meta.dev(), meta.ino()) != self.identity => {
                return Err(fail(&self.path, SharedMapFailure::Replaced));
            }
            Ok(_) => match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_fail(&self.path, "unlink")(e)),
                _ => {}
            },
        }
        self.unlinked.store(true, Ordering::Release);
        Ok(())
    }

    /// The mapping as 64-bit atomic words (`len / 8` of them; indexing is bounds-checked).
    /// For files every process touches only through atomics, such as a flag board; never
    /// use it on memory that is also copied into with plain writes.
    pub fn words(&self) -> &[AtomicU64] {
        // Safety: the mapping is page-aligned (so 8-byte aligned), `len / 8` words long, and
        // lives as long as `&self`; AtomicU64 has the layout of u64 and its interior
        // mutability makes a shared view of memory other processes change sound, as long as
        // they too change it only atomically (this method's contract above).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU64>(), self.len / 8) }
    }

    /// The mapping as 32-bit atomic words (`len / 4` of them), for futexes
    /// (`accord_sys::futex`). Same contract as [`Self::words`]; a word used through this view
    /// must not also be used through that one.
    pub fn words32(&self) -> &[AtomicU32] {
        // Safety: as for `words`: page-aligned, `len / 4` words, alive as long as `&self`, and
        // only ever changed atomically by this method's contract.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU32>(), self.len / 4) }
    }

    /// Bytes `offset..offset + len` of the mapping, or `None` past its end.
    ///
    /// # Safety
    /// While the slice lives, no thread or process may write these bytes: the caller's own
    /// protocol (flags in [`Self::words`] with release and acquire, say) must order every
    /// writer before this read.
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| {
            // Safety: in bounds (checked above) of a mapping that lives as long as `&self`;
            // no concurrent writer, by the caller's contract.
            unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) }
        })
    }

    /// Bytes `offset..offset + len` of the mapping for writing, or `None` past its end.
    ///
    /// # Safety
    /// While the slice lives, no other thread or process may read or write these bytes, and
    /// no other slice of this mapping may overlap them: the caller's protocol must give this
    /// writer the range alone.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> Option<&mut [u8]> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| {
            // Safety: in bounds of a live mapping; exclusive by the caller's contract.
            unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) }
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes mapped.
    #[inline]
    pub fn len_bytes(&self) -> usize {
        self.len
    }

    /// The first mapped byte (for raw copies and page-locking); valid while `self` lives.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Address of the first byte in this process.
    #[inline]
    pub fn addr(&self) -> usize {
        self.base.as_ptr() as usize
    }
}

/// Opens `path` read-write without following a link: a new file (`O_EXCL`, mode 0600) when
/// `create`, else an existing one.
fn open_file(path: &Path, create: bool) -> Result<File, SharedMapError> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    if create {
        options.create_new(true).mode(0o600);
    }
    options.open(path).map_err(io_fail(path, if create { "create" } else { "open" }))
}

fn check_path(path: &Path, len: usize) -> Result<(), SharedMapError> {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(fail(path, SharedMapFailure::NulInPath));
    }
    if len == 0 {
        return Err(fail(path, SharedMapFailure::Empty));
    }
    Ok(())
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // Safety: our mapping of `len` bytes, unmapped once; no reference into it outlives self
        // (`words` borrows self; raw users hold the mapping while they copy).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        if self.creator {
            // Best effort: the name may have been removed or replaced by someone else.
            let _ = self.unlink();
        }
    }
}

/// A private directory removed with everything in it when dropped, for tests of crates that
/// make shared files (no tempfile crate among Accord's dependencies). Built for this crate's
/// tests and, with the `test-support` feature, for other crates' tests.
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub struct TestDir(pub PathBuf);

#[cfg(any(test, feature = "test-support"))]
impl TestDir {
    /// A fresh directory under the system's temporary directory, named by this process and a
    /// counter and the clock, so parallel tests never share one.
    pub fn new() -> TestDir {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let count = NEXT.fetch_add(1, Ordering::Relaxed);
        let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("accord-shared-map-test-{}-{count}-{clock:x}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TestDir(path)
    }
}

#[cfg(any(test, feature = "test-support"))]
impl Default for TestDir {
    fn default() -> Self {
        TestDir::new()
    }
}

#[cfg(any(test, feature = "test-support"))]
impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests;
