//! Batch registration: many buffers in one call, all or nothing.
//!
//! Why: a serving engine registers a KV cache of one tensor per layer (80 for a 70B model),
//! a trainer hundreds of weight tensors. One call checks every buffer first and takes the region
//! table's lock once, so either every buffer is registered or none is (no half-registered set
//! to unwind when buffer 57 is refused).

use super::Engine;
use crate::address::MrDescriptor;
use crate::error::RegisterError;
use crate::memory::{random_u64, MemoryKind, MemoryOwner, MrHandle, Region, REGIONS_MAX, REGION_BYTES_MAX};
use accord_proto::RegionKey;

/// One buffer of [`Engine::register_many`]: memory the caller owns, as for
/// [`Engine::register_raw_owned`].
#[derive(Clone)]
pub struct RawBuffer {
    /// First byte.
    pub ptr: *mut u8,
    /// Bytes (1..=[`REGION_BYTES_MAX`]).
    pub len: usize,
    /// Host or device memory.
    pub kind: MemoryKind,
    /// Keeps the memory alive while transfers read it (see [`Engine::register_raw_owned`]).
    pub owner: Option<MemoryOwner>,
}

impl std::fmt::Debug for RawBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBuffer").field("ptr", &self.ptr).field("len", &self.len).field("kind", &self.kind).finish()
    }
}

impl Engine {
    /// Registers every buffer of `buffers`, or none: each is checked (length, null, device
    /// memory the driver knows) and the table's room for all of them before any is inserted.
    /// Returns the handles and descriptors in the order given.
    ///
    /// # Safety
    /// As [`Engine::register_raw_owned`], for every buffer.
    #[allow(unsafe_code)]
    pub unsafe fn register_many(&self, buffers: &[RawBuffer]) -> Result<Vec<(MrHandle, MrDescriptor)>, RegisterError> {
        let mut prepared = Vec::with_capacity(buffers.len());
        for b in buffers {
            if b.len == 0 || b.len as u64 > REGION_BYTES_MAX || b.ptr.is_null() {
                return Err(RegisterError::BadLength { len: b.len as u64, max: REGION_BYTES_MAX });
            }
            let (device, info) = match b.kind {
                MemoryKind::Host | MemoryKind::HostForDevice => (None, None),
                MemoryKind::CudaDevice { ordinal } => {
                    (Some(ordinal), Some(self.device_region_info(b.ptr as u64, b.len, ordinal)?))
                }
            };
            let region = Region {
                base: b.ptr as usize,
                len: b.len as u64,
                key: RegionKey(random_u64()),
                keep: b.owner.clone(),
                device,
                streamed: b.kind == MemoryKind::HostForDevice,
            };
            prepared.push((region, info));
        }
        let mut table = self.shared.regions.write().unwrap();
        if table.len().saturating_add(prepared.len()) > REGIONS_MAX {
            return Err(RegisterError::TableFull(REGIONS_MAX));
        }
        let mut out: Vec<(MrHandle, MrDescriptor)> = Vec::with_capacity(prepared.len());
        for (region, info) in prepared {
            let (key, len) = (region.key, region.len);
            let id = match table.insert(region) {
                Ok(id) => id,
                Err(e) => {
                    // Not expected after the room check; undo what this call inserted.
                    for (handle, _) in &out {
                        table.remove(handle.region);
                    }
                    return Err(e);
                }
            };
            let handle = MrHandle { engine: self.id(), region: id, len };
            let descriptor =
                MrDescriptor { engine: self.id(), region: id.0, key: key.0, len, device: info, shared: None };
            out.push((handle, descriptor));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryKind, WriteOp};
    use std::sync::Arc;
    use std::time::Duration;

    fn buffers(lens: &[usize]) -> (Vec<Arc<Vec<u8>>>, Vec<RawBuffer>) {
        let owned: Vec<Arc<Vec<u8>>> = lens.iter().map(|&l| Arc::new(vec![0u8; l])).collect();
        let raw = owned
            .iter()
            .map(|v| RawBuffer {
                ptr: v.as_ptr() as *mut u8,
                len: v.len(),
                kind: MemoryKind::Host,
                owner: Some(v.clone() as MemoryOwner),
            })
            .collect();
        (owned, raw)
    }

    #[test]
    #[allow(unsafe_code)]
    fn many_buffers_register_at_once_and_each_takes_writes() {
        let (a, b) = (Engine::builder().ignore_env().build().unwrap(), Engine::builder().ignore_env().build().unwrap());
        let (owned, raw) = buffers(&[100, 4096, 1, 70_000]);
        // Safety: each buffer is kept alive by its owner for as long as the region needs it.
        let regs = unsafe { b.register_many(&raw) }.unwrap();
        assert_eq!(regs.len(), 4);
        let src = a.alloc(70_000).unwrap();
        src.write_at(0, &vec![7u8; 70_000]).unwrap();
        let h = src.handle();
        for ((handle, d), v) in regs.iter().zip(&owned) {
            assert_eq!(handle.len(), v.len() as u64);
            let op = WriteOp { src: &h, src_offset: 0, dst: d, dst_offset: 0, len: d.len, imm: None };
            a.write(&op).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
            assert!(b.deregister(handle), "registered until now");
            assert!(v.iter().all(|&x| x == 7), "a write into a batch-registered buffer landed");
        }
        let ids: std::collections::HashSet<_> = regs.iter().map(|(h, _)| h.region).collect();
        assert_eq!(ids.len(), 4, "distinct regions");
    }

    #[test]
    #[allow(unsafe_code)]
    fn one_bad_buffer_registers_none() {
        let e = Engine::builder().ignore_env().build().unwrap();
        let (_owned, mut raw) = buffers(&[64, 64, 64]);
        raw[1].len = 0;
        let before = e.shared.regions.read().unwrap().len();
        // Safety: as above.
        let got = unsafe { e.register_many(&raw) };
        assert!(matches!(got, Err(RegisterError::BadLength { len: 0, .. })), "{got:?}");
        assert_eq!(e.shared.regions.read().unwrap().len(), before, "nothing registered");
        raw[1].len = 64;
        raw[2].ptr = std::ptr::null_mut();
        // Safety: as above.
        assert!(unsafe { e.register_many(&raw) }.is_err());
        assert_eq!(e.shared.regions.read().unwrap().len(), before, "nothing registered");
        // Safety: as above (an empty batch registers nothing and succeeds).
        assert!(unsafe { e.register_many(&[]) }.unwrap().is_empty());
    }
}
