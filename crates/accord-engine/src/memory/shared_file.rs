//! Host memory in a shared-memory file, so that another process on this host can map the same
//! pages.
//!
//! Why: a writer on this host whose source is device memory can then have its GPU's copy engine
//! write straight into the receiver's region (one device-to-host DMA), instead of staging the
//! bytes in its own pinned memory and copying them twice through a datagram ring. The
//! receiver's region is an ordinary engine buffer ([`crate::Engine::alloc_shared`]) whose
//! descriptor carries [`SharedHostInfo`]; the writer derives the file's name from it and maps it
//! once per region ([`SharedFile::open`]).
//!
//! Trust is that of the shared-memory datagram rings: same user, same host. The files are
//! created, checked, mapped and unlinked by [`SharedMapping`] (`O_EXCL` and mode 0600,
//! `O_NOFOLLOW`, a regular file of this user with exactly the advertised size). The owner unlinks its
//! file when the buffer drops; files of processes that died are swept when this process creates
//! its first one.
#![allow(unsafe_code)]

use crate::address::{EngineId, SharedHostInfo};
use accord_sys::shared_map::{SharedMapFailure, SharedMapping};
use std::path::Path;
use std::sync::{Once, OnceLock};

/// Prefix of every shared region file (the sweep only ever removes files with it).
const FILE_PREFIX: &str = "accord-mr-";
/// Page size the mappings are rounded to.
const PAGE_BYTES: usize = 4096;

/// The file name of a region from its owner and its shared-memory identity: everything a peer
/// needs travels in the descriptor as numbers, never as a path.
pub(crate) fn file_name(engine: EngineId, info: SharedHostInfo) -> String {
    format!("{FILE_PREFIX}{}-{:016x}-{:016x}", info.pid, engine.0, info.nonce)
}

/// A mapped region file (the owner's or a peer's mapping of it). The owner created the file
/// and unlinks it when this drops ([`SharedMapping`]'s creator rule).
pub struct SharedFile {
    /// Page-locked for the copy engines on first use (see [`SharedFile::pin_with`]); released
    /// before the mapping goes.
    pin: OnceLock<Result<accord_cuda::HostRangePin, String>>,
    /// The mapping: the region length rounded up to a page.
    map: SharedMapping,
}

impl std::fmt::Debug for SharedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedFile").field("path", &self.map.path()).field("mapped", &self.map.len_bytes()).finish()
    }
}

impl SharedFile {
    /// Creates, sizes and maps a new file for a region of `len` bytes of engine `engine` in
    /// `dir`. The pages are reserved now, so a full tmpfs fails here instead of faulting later.
    pub(crate) fn create(dir: &Path, engine: EngineId, len: usize) -> Result<(SharedFile, SharedHostInfo), String> {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(|| sweep_stale(dir));
        let mapped = len.max(1).next_multiple_of(PAGE_BYTES);
        let info = SharedHostInfo { pid: std::process::id(), nonce: super::random_u64() };
        let map = SharedMapping::create(&dir.join(file_name(engine, info)), mapped).map_err(|e| e.to_string())?;
        Ok((SharedFile { pin: OnceLock::new(), map }, info))
    }

    /// Maps a peer's region file: `len` is the region length its descriptor advertises. Refused
    /// unless the file is a regular file of this user of exactly that length, page-rounded.
    pub(crate) fn open(dir: &Path, engine: EngineId, info: SharedHostInfo, len: u64) -> Result<SharedFile, String> {
        let path = dir.join(file_name(engine, info));
        let mapped = usize::try_from(len)
            .ok()
            .and_then(|l| l.max(1).checked_next_multiple_of(PAGE_BYTES))
            .ok_or_else(|| format!("a region of {len} bytes does not fit this machine"))?;
        let map = SharedMapping::open(&path, mapped).map_err(|e| match e.reason {
            SharedMapFailure::WrongLength { actual, .. } => {
                format!("{} holds {actual} bytes where the descriptor promises {mapped}", path.display())
            }
            _ => e.to_string(),
        })?;
        Ok(SharedFile { pin: OnceLock::new(), map })
    }

    /// Address of the first byte in this process.
    pub(crate) fn base(&self) -> usize {
        self.map.addr()
    }

    /// Bytes mapped.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.map.len_bytes()
    }

    /// Page-locks the mapping for the copy engines with GPU `gpu` (`cuMemHostRegister`, once;
    /// later calls return the first call's outcome). Copies into unpinned memory still work,
    /// through the driver's bounce buffers, but at a fraction of the speed.
    pub(crate) fn pin_with(&self, gpu: &accord_cuda::Gpu) -> Result<(), String> {
        self.pin
            .get_or_init(|| {
                // Safety: the mapping lives as long as self, and the pin is released before the
                // mapping (field order, and Drop below); the engine holds the file (a
                // transfer's keep) until every copy against it completed, so none is pending
                // when the pin drops.
                unsafe { accord_cuda::HostRangePin::new(gpu, self.map.as_ptr(), self.map.len_bytes()) }
                    .map_err(|e| format!("page-locking {}: {e}", self.map.path().display()))
            })
            .as_ref()
            .map(|_| ())
            .map_err(Clone::clone)
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        // The pin goes first; the mapping then unmaps itself (and the owner's unlinks the file).
        drop(self.pin.take());
    }
}

/// Removes region files left by processes of this user that no longer run (best effort).
fn sweep_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(FILE_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !accord_sys::process_alive(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use accord_sys::shared_map::TestDir;

    fn dir() -> TestDir {
        TestDir::new()
    }

    #[test]
    fn a_peer_mapping_sees_the_owners_bytes_and_the_file_goes_with_the_owner() {
        let d = dir();
        let engine = EngineId(0xabc);
        let (owner, info) = SharedFile::create(&d.0, engine, 10_000).unwrap();
        assert_eq!(owner.mapped_bytes(), 12_288, "rounded to pages");
        let peer = SharedFile::open(&d.0, engine, info, 10_000).unwrap();
        // Safety: both mappings are live and 12 KiB long.
        unsafe {
            std::ptr::write_bytes((peer.base() + 5000) as *mut u8, 0x5a, 100);
            assert_eq!(*((owner.base() + 5050) as *const u8), 0x5a);
        }
        let path = d.0.join(file_name(engine, info));
        assert!(path.exists());
        drop(owner);
        assert!(!path.exists(), "the owner unlinks its file");
        // Safety: the peer's mapping outlives the unlink.
        unsafe { assert_eq!(*((peer.base() + 5099) as *const u8), 0x5a) };
    }

    #[test]
    fn a_mapping_is_refused_for_a_wrong_size_a_missing_file_or_a_link() {
        let d = dir();
        let engine = EngineId(7);
        let (_owner, info) = SharedFile::create(&d.0, engine, 8192).unwrap();
        let err = SharedFile::open(&d.0, engine, info, 1 << 20).unwrap_err();
        assert!(err.contains("promises"), "{err}");
        let other = SharedHostInfo { nonce: info.nonce ^ 1, ..info };
        assert!(SharedFile::open(&d.0, engine, other, 8192).unwrap_err().contains("open"));
        let link_info = SharedHostInfo { nonce: 42, ..info };
        std::os::unix::fs::symlink(d.0.join(file_name(engine, info)), d.0.join(file_name(engine, link_info))).unwrap();
        assert!(SharedFile::open(&d.0, engine, link_info, 8192).is_err(), "links are not followed");
    }

    #[test]
    fn files_of_dead_processes_are_swept_and_others_kept() {
        let d = dir();
        let dead = d.0.join(format!("{FILE_PREFIX}{}-1-2", i32::MAX - 1));
        let alive = d.0.join(format!("{FILE_PREFIX}{}-1-2", std::process::id()));
        let foreign = d.0.join("other-file");
        for p in [&dead, &alive, &foreign] {
            std::fs::write(p, b"x").unwrap();
        }
        sweep_stale(&d.0);
        assert!(!dead.exists());
        assert!(alive.exists() && foreign.exists());
    }
}
