//! The same-host shared-host route: device bytes bound for a host region of another process on
//! this host that lives in a shared-memory file ([`crate::Engine::alloc_shared`]) go in one
//! copy-engine copy (`cuMemcpyDtoHAsync`) into this process's mapping of that file; the
//! immediate follows as a zero-byte write once the copy completed, as on every device route.
//!
//! Why: the staged route for such writes costs two DMAs' worth of pinned staging plus two CPU
//! copies through the datagram rings, which binds same-host NCCL traffic to host memory
//! bandwidth; this route costs one DMA and no CPU copy (see
//! `docs/design/same-host-copy-engine-route.md`).
//!
//! The writer maps a peer's file on first use and keeps the mapping (at most
//! [`SHARED_MAPPINGS_MAX`], the oldest dropped first). A mapping that fails (the file is gone,
//! of another size, the peer on another host) leaves the write on the staged route, with one
//! warning per process.
//!
//! Page-locking is never done on the data path: `cuMemHostRegister` synchronises with work
//! queued on the device, so pinning inside a write, while a kernel (an NCCL collective, say)
//! waits for that very write, deadlocks. Callers pin ahead, where the GPU may wait:
//! [`crate::Engine::pin_shared`] for their own regions, [`crate::Engine::prepare_shared_peer`]
//! for a peer's. An unpinned file still works, through the driver's staging, only slower.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::address::{EngineId, MrDescriptor, SharedHostInfo};
use crate::memory::shared_file::SharedFile;

/// Most peer region files kept mapped at once.
pub const SHARED_MAPPINGS_MAX: usize = 256;

type Key = (EngineId, u32, u64, SharedHostInfo);

/// This engine's mappings of same-host peers' shared region files.
#[derive(Default)]
pub(crate) struct PeerFiles {
    maps: Mutex<HashMap<Key, (Arc<SharedFile>, u64)>>,
    clock: std::sync::atomic::AtomicU64,
    warned: AtomicBool,
}

impl PeerFiles {
    /// The mapping of `dst`'s file (opened and cached on first use), or why it cannot be mapped.
    pub(crate) fn mapping(
        &self,
        dir: &Path,
        dst: &MrDescriptor,
        info: SharedHostInfo,
    ) -> Result<Arc<SharedFile>, String> {
        let key = (dst.engine, dst.region, dst.key, info);
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut maps = self.maps.lock().unwrap();
        if let Some((file, last_use)) = maps.get_mut(&key) {
            *last_use = now;
            return Ok(file.clone());
        }
        let file = Arc::new(SharedFile::open(dir, dst.engine, info, dst.len)?);
        if maps.len() >= SHARED_MAPPINGS_MAX {
            let oldest = maps.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                maps.remove(&oldest); // transfers still copying hold their own Arc
            }
        }
        maps.insert(key, (file.clone(), now));
        Ok(file)
    }

    /// As [`PeerFiles::mapping`] for the data path: `None` (with one warning per process) when
    /// the file cannot be mapped, so the write takes the staged route.
    pub(crate) fn mapping_or_warn(
        &self,
        dir: &Path,
        dst: &MrDescriptor,
        info: SharedHostInfo,
    ) -> Option<Arc<SharedFile>> {
        match self.mapping(dir, dst, info) {
            Ok(file) => Some(file),
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "cannot map a same-host peer's shared region; staging instead");
                }
                None
            }
        }
    }

    /// Mappings held now.
    pub(crate) fn len(&self) -> usize {
        self.maps.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, WriteOp};
    use std::time::Duration;

    fn engine() -> Engine {
        Engine::builder().ignore_env().force_network(true).build().expect("engine builds")
    }

    /// A shared region is an ordinary destination for host writes, and a same-host peer's
    /// mapping of it (what the device route copies into) aliases the owner's bytes.
    #[test]
    fn a_shared_region_takes_host_writes_and_peers_map_the_same_pages() {
        let (a, b) = (engine(), engine());
        a.add_peer(&b.address()).unwrap();
        b.add_peer(&a.address()).unwrap();
        let dst = b.alloc_shared(100_000).unwrap();
        let d = dst.descriptor();
        let info = d.shared.expect("alloc_shared descriptors say where the file is");
        let parsed = MrDescriptor::parse(&d.to_string_compact()).unwrap();
        assert_eq!(parsed, d, "the shared identity survives the descriptor's text form");

        let src = a.alloc(4096).unwrap();
        src.fill(0x33);
        let op = WriteOp { src: &src.handle(), src_offset: 0, dst: &d, dst_offset: 8192, len: 4096, imm: Some(5) };
        a.write(&op).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(b.imm_counter(5).wait(1, Duration::from_secs(20)), 1);

        let dir = &a.config().shm.dir;
        let files = PeerFiles::default();
        let mapping = files.mapping(dir, &d, info).expect("same host, same user: mappable");
        // Safety: the mapping is live and 100_000 bytes rounded up to pages long.
        #[allow(unsafe_code)]
        unsafe {
            assert_eq!(*((mapping.base() + 8192) as *const u8), 0x33, "the peer sees the written bytes");
            *((mapping.base() + 99_999) as *mut u8) = 0x77;
        }
        let mut last = [0u8; 1];
        dst.read_at(99_999, &mut last).unwrap();
        assert_eq!(last[0], 0x77, "and the owner sees the peer's");
        let again = files.mapping(dir, &d, info).unwrap();
        assert!(Arc::ptr_eq(&mapping, &again), "mapped once per region");
        assert_eq!(files.len(), 1);
    }

    /// A descriptor whose length or identity does not match a file is not mapped (the write
    /// then takes the staged route), and the cache stays bounded.
    #[test]
    fn mismatched_descriptors_are_not_mapped_and_the_cache_is_bounded() {
        let b = engine();
        let dst = b.alloc_shared(8192).unwrap();
        let d = dst.descriptor();
        let info = d.shared.unwrap();
        let dir = b.config().shm.dir.clone();
        let files = PeerFiles::default();
        let longer = MrDescriptor { len: 1 << 20, ..d };
        assert!(files.mapping(&dir, &longer, info).unwrap_err().contains("promises"), "a file smaller than promised");
        let other = SharedHostInfo { nonce: info.nonce.wrapping_add(1), ..info };
        assert!(files.mapping_or_warn(&dir, &d, other).is_none(), "no such file");
        assert_eq!(files.len(), 0);

        let regions: Vec<_> = (0..SHARED_MAPPINGS_MAX + 3).map(|_| b.alloc_shared(4096).unwrap()).collect();
        for r in &regions {
            let d = r.descriptor();
            assert!(files.mapping(&dir, &d, d.shared.unwrap()).is_ok());
        }
        assert_eq!(files.len(), SHARED_MAPPINGS_MAX);
    }
}
