//! How an owner learns a reader's device destination, so that a READ into GPU memory of another
//! process of this host is written through CUDA IPC ([`crate::engine::route::Route::CopyEngineIpc`])
//! rather than landed through the reader's pinned slots.
//!
//! Why frames of their own: the owner's copy engine maps the destination from its descriptor's
//! IPC handle (77 bytes), and a request frame has 40 bytes of payload. So before its first read
//! into a device region from a given owner, the reader announces the region: [`DST_INFO_FRAMES`]
//! frames (kind [`DST_INFO`], one announcement id in `req`, the region and the frame's index in
//! the halves) carrying the region's key and length, its offset in the exported allocation, its GPU
//! and the handle. The owner assembles them and keeps the result per (reader, region), bound to
//! the key: a request whose key differs (the region id was reused) does not use it, and one that
//! reaches past the announced length is refused, since a copy through the handle is checked by
//! nobody at the reader.
//!
//! As for any write through CUDA IPC, the reader's memory is written directly: deregistering a
//! destination while a read into it is in flight leaves that read's bytes to land in the
//! allocation all the same (the landing route checks the region when each chunk lands).
//!
//! Only between processes of one host (a reader announces nothing to an owner in its own process
//! or on another host), and used only by an owner with `device_ipc` on.
//!
//! Best effort, never needed for correctness: frames may arrive after the request they precede
//! (another lane), or not at all; the owner then lands the write, as without an announcement.
//! A handle that does not parse is dropped. Both sides are bounded
//! ([`READ_DST_INFOS_KEPT`]; partial announcements too).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::address::{DeviceIpcBytes, DeviceRegionInfo, EngineId, DEVICE_IPC_HANDLE_BYTES};

/// The frame kind of an announcement (requests are 1, replies 2).
pub(crate) const DST_INFO: u8 = 3;
/// Frames of one announcement.
pub(crate) const DST_INFO_FRAMES: u32 = 4;
/// Destinations an owner remembers (and announcements a reader remembers having sent, and
/// partial announcements an owner keeps); past it the oldest half is forgotten.
pub const READ_DST_INFOS_KEPT: usize = 4096;

const WORDS: usize = 4 * DST_INFO_FRAMES as usize;
const HANDLE_WORDS: usize = DEVICE_IPC_HANDLE_BYTES.div_ceil(8);
const HEAD_WORDS: usize = 3;
/// Where the region's length is, after the handle.
const LEN_WORD: usize = HEAD_WORDS + HANDLE_WORDS;
const _: () = assert!(LEN_WORD < WORDS, "an announcement holds key, offset, GPU, handle and length");

/// What an owner knows of a reader's device region.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Announced {
    /// The region's length: a read reaching past it is refused.
    pub(crate) len: u64,
    /// Its GPU, its offset in the exported allocation, the handle.
    pub(crate) info: DeviceRegionInfo,
}

/// The words of an announcement of a region with `key`, `len` bytes and `info` (which must carry
/// a handle), frame by frame.
pub(crate) fn encode(key: u64, len: u64, info: &DeviceRegionInfo) -> Option<[[u64; 4]; DST_INFO_FRAMES as usize]> {
    let handle = info.ipc?;
    let mut words = [0u64; WORDS];
    words[0] = key;
    words[1] = info.alloc_offset;
    words[2] = u64::from(info.ordinal);
    let mut bytes = [0u8; HANDLE_WORDS * 8];
    bytes[..DEVICE_IPC_HANDLE_BYTES].copy_from_slice(&handle.0);
    for (i, chunk) in bytes.chunks_exact(8).enumerate() {
        words[HEAD_WORDS + i] = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
    }
    words[LEN_WORD] = len;
    let mut frames = [[0u64; 4]; DST_INFO_FRAMES as usize];
    for (i, frame) in frames.iter_mut().enumerate() {
        frame.copy_from_slice(&words[4 * i..4 * i + 4]);
    }
    Some(frames)
}

/// The key and destination an assembled announcement describes; `None` when the handle does
/// not parse or a field is out of range.
pub(crate) fn decode(words: &[u64; WORDS]) -> Option<(u64, Announced)> {
    let ordinal = u32::try_from(words[2]).ok()?;
    let mut bytes = [0u8; HANDLE_WORDS * 8];
    for (i, chunk) in bytes.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&words[HEAD_WORDS + i].to_le_bytes());
    }
    if bytes[DEVICE_IPC_HANDLE_BYTES..].iter().any(|&b| b != 0) || words[LEN_WORD + 1..].iter().any(|&w| w != 0) {
        return None;
    }
    let mut handle = [0u8; DEVICE_IPC_HANDLE_BYTES];
    handle.copy_from_slice(&bytes[..DEVICE_IPC_HANDLE_BYTES]);
    accord_cuda::IpcHandle::from_bytes(&handle).ok()?;
    let info = DeviceRegionInfo { ordinal, alloc_offset: words[1], ipc: Some(DeviceIpcBytes(handle)) };
    Some((words[0], Announced { len: words[LEN_WORD], info }))
}

/// An announcement being assembled.
struct Partial {
    region: u32,
    words: [u64; WORDS],
    have: u32,
}

/// Both sides' memory of announcements.
#[derive(Default)]
pub(crate) struct DstInfos {
    /// Owner side: (reader, region) -> (key, destination).
    known: Mutex<HashMap<(EngineId, u32), (u64, Announced)>>,
    /// Owner side: (reader, announcement id) -> frames so far.
    partial: Mutex<HashMap<(EngineId, u64), Partial>>,
    /// Reader side: (owner, region, key) announced.
    announced: Mutex<HashSet<(EngineId, u32, u64)>>,
}

/// Forgets about half of `map` when it holds [`READ_DST_INFOS_KEPT`] (no order is kept: any
/// half will do, what is forgotten is announced again or landed).
fn bound<K: std::hash::Hash + Eq + Clone, V>(map: &mut HashMap<K, V>) {
    if map.len() >= READ_DST_INFOS_KEPT {
        let drop: Vec<K> = map.keys().take(READ_DST_INFOS_KEPT / 2).cloned().collect();
        for k in drop {
            map.remove(&k);
        }
    }
}

impl DstInfos {
    /// Reader side: whether (owner, region, key) still needs announcing (and now counts as
    /// announced).
    pub(crate) fn should_announce(&self, owner: EngineId, region: u32, key: u64) -> bool {
        let mut announced = self.announced.lock().unwrap();
        if announced.len() >= READ_DST_INFOS_KEPT {
            announced.clear();
        }
        announced.insert((owner, region, key))
    }

    /// Owner side: frame `index` of announcement `id` of `reader` about `region`. Returns true
    /// when it completed a valid announcement.
    pub(crate) fn take_frame(&self, reader: EngineId, id: u64, region: u32, index: u32, words: [u64; 4]) -> bool {
        if index >= DST_INFO_FRAMES {
            return false;
        }
        let complete = {
            let mut partial = self.partial.lock().unwrap();
            bound(&mut partial);
            let entry = partial.entry((reader, id)).or_insert(Partial { region, words: [0; WORDS], have: 0 });
            if entry.region != region {
                return false;
            }
            let at = 4 * index as usize;
            entry.words[at..at + 4].copy_from_slice(&words);
            entry.have |= 1 << index;
            if entry.have != (1 << DST_INFO_FRAMES) - 1 {
                return false;
            }
            partial.remove(&(reader, id)).map(|p| p.words)
        };
        let Some((key, announced)) = complete.as_ref().and_then(decode) else { return false };
        let mut known = self.known.lock().unwrap();
        bound(&mut known);
        known.insert((reader, region), (key, announced));
        true
    }

    /// Owner side: what `reader` announced of `region`, if it was announced with `key`.
    pub(crate) fn lookup(&self, reader: EngineId, region: u32, key: u64) -> Option<Announced> {
        let known = self.known.lock().unwrap();
        known.get(&(reader, region)).and_then(|&(k, info)| (k == key).then_some(info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A destination with a well-formed handle (version byte, raw handle, length, exporter).
    fn info() -> DeviceRegionInfo {
        let mut handle = [7u8; DEVICE_IPC_HANDLE_BYTES];
        handle[0] = accord_cuda::ipc::IPC_HANDLE_VERSION;
        DeviceRegionInfo { ordinal: 1, alloc_offset: 4096, ipc: Some(DeviceIpcBytes(handle)) }
    }

    #[test]
    fn an_announcement_round_trips_in_any_frame_order_and_is_bound_to_its_key() {
        let frames = encode(0xfeed, 1 << 20, &info()).unwrap();
        let infos = DstInfos::default();
        let reader = EngineId(9);
        for &i in &[2usize, 0, 3] {
            assert!(!infos.take_frame(reader, 77, 5, i as u32, frames[i]));
        }
        assert_eq!(infos.lookup(reader, 5, 0xfeed), None, "incomplete");
        assert!(infos.take_frame(reader, 77, 5, 1, frames[1]));
        assert_eq!(infos.lookup(reader, 5, 0xfeed), Some(Announced { len: 1 << 20, info: info() }));
        assert_eq!(infos.lookup(reader, 5, 0xbeef), None, "another key: the region was reused");
        assert_eq!(infos.lookup(EngineId(8), 5, 0xfeed), None, "another reader");
        assert_eq!(infos.lookup(reader, 6, 0xfeed), None, "another region");
    }

    #[test]
    fn malformed_announcements_are_dropped() {
        let infos = DstInfos::default();
        let mut frames = encode(1, 64, &info()).unwrap();
        assert!(!infos.take_frame(EngineId(1), 1, 5, DST_INFO_FRAMES, frames[0]), "index out of range");
        // A bad handle version.
        frames[0][HEAD_WORDS] ^= 0xff;
        for (i, f) in frames.iter().enumerate() {
            assert!(!infos.take_frame(EngineId(1), 2, 5, i as u32, *f));
        }
        assert_eq!(infos.lookup(EngineId(1), 5, 1), None);
        // Frames of one announcement naming two regions.
        let frames = encode(1, 64, &info()).unwrap();
        assert!(!infos.take_frame(EngineId(1), 3, 5, 0, frames[0]));
        assert!(!infos.take_frame(EngineId(1), 3, 6, 1, frames[1]));
        // No handle: nothing to announce.
        assert!(encode(1, 64, &DeviceRegionInfo { ipc: None, ..info() }).is_none());
    }

    #[test]
    fn memory_is_bounded_and_a_reader_announces_once_per_region_and_key() {
        let infos = DstInfos::default();
        let frames = encode(1, 64, &info()).unwrap();
        for id in 0..(READ_DST_INFOS_KEPT as u64 + 10) {
            infos.take_frame(EngineId(id), id, 5, 0, frames[0]);
        }
        assert!(infos.partial.lock().unwrap().len() <= READ_DST_INFOS_KEPT);
        assert!(infos.should_announce(EngineId(1), 5, 9));
        assert!(!infos.should_announce(EngineId(1), 5, 9));
        assert!(infos.should_announce(EngineId(1), 5, 10), "a new key is a new region");
    }
}
