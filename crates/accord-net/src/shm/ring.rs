//! A single-producer, single-consumer ring of variable-length datagrams in a shared file, and
//! the only `unsafe` of the shared-memory datapath (mapping, atomics on the shared header,
//! copies in and out of the data area).
//!
//! Layout (little-endian, positions are byte counters that only grow):
//!
//! | offset | field                                         | written by |
//! |--------|-----------------------------------------------|------------|
//! | 0      | magic `ACCSHMR1` (u64)                        | producer   |
//! | 8      | version (u32), 12: header bytes (u32)         | producer   |
//! | 16     | data bytes (u64, a power of two)              | producer   |
//! | 24     | nonce (u64), named in the attach message      | producer   |
//! | 32     | producer pid (u32), 36: consumer pid (u32)    | each side  |
//! | 64     | head: bytes ever published (u64, own line)    | producer   |
//! | 128    | tail: bytes ever consumed (u64, own line)     | consumer   |
//! | 192    | consumer sleeping (u32), 196: closed bits     | both       |
//! | 256    | data area                                     |            |
//!
//! An entry is a 16-byte header (payload length u32, GSO stride u32, source path u16,
//! destination path u16, kind u8) followed by the payload, padded to 16 bytes; it never wraps:
//! when the end of the area is too close, a pad entry fills it and the entry starts at 0.
//! The producer publishes with a release store of `head`, the consumer frees with a release
//! store of `tail`, each reads the other's with acquire.
//!
//! Trust: the other process can write anything into the mapping at any time. The consumer
//! copies an entry's header out before reading it, bounds-checks every length and position
//! against what it mapped, and reports [`RingError::Corrupt`] instead of following a bad value;
//! payload bytes are copied out with no interpretation. What a same-user process can still do
//! is shrink the file under the mapping (a later access faults): that process could equally
//! attach a debugger to us, so it is outside what this checks. The consumer unlinks the file
//! as soon as it has mapped it, which closes the name to everyone else.

#![allow(unsafe_code)]

use crate::LentBytes;
use accord_sys::shared_map::{Pages, SharedMapError, SharedMapFailure, SharedMapping};
use std::io;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Magic at offset 0 of a ring file.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"ACCSHMR1");
/// Layout version; a consumer refuses any other.
pub const RING_VERSION: u32 = 1;
/// Bytes of the header before the data area.
pub const RING_HEADER_BYTES: usize = 256;
/// Bytes of an entry header; entries start at multiples of this.
pub const ENTRY_HEADER_BYTES: usize = 16;
/// Smallest data area: room for two of the largest entries.
pub const RING_DATA_BYTES_MIN: usize = 256 << 10;
/// Largest data area (bounds the file and the mapping).
pub const RING_DATA_BYTES_MAX: usize = 1 << 30;
/// Largest payload of one entry: the largest datagram a receive slot holds.
pub const ENTRY_PAYLOAD_BYTES_MAX: usize = crate::RX_SLOT_BYTES_MAX;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_HEADER_BYTES: usize = 12;
const OFF_DATA_BYTES: usize = 16;
const OFF_NONCE: usize = 24;
const OFF_PRODUCER_PID: usize = 32;
const OFF_CONSUMER_PID: usize = 36;
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
const OFF_SLEEPING: usize = 192;
const OFF_CLOSED: usize = 196;

const KIND_DATA: u8 = 1;
const KIND_PAD: u8 = 2;
const CLOSED_BY_PRODUCER: u32 = 1;
const CLOSED_BY_CONSUMER: u32 = 2;

/// What went wrong with a ring.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// A system call failed (create, open, map).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The file or its header is not a ring this side can use; the peer stays on UDP.
    #[error("shared-memory ring refused: {0}")]
    Refused(String),
    /// The shared header or an entry holds an impossible value (a buggy or hostile peer):
    /// the ring is abandoned and traffic falls back to UDP.
    #[error("shared-memory ring corrupt: {0}")]
    Corrupt(String),
}

/// Checks a ring file name: `accord-` then letters, digits, `-` or `_`, at most 64 bytes,
/// so a name from a peer can never leave the ring directory.
pub fn valid_ring_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with("accord-")
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A ring file's mapping: an [`accord_sys::SharedMapping`] (which creates, checks, maps,
/// unmaps and unlinks the file, with every page-table entry filled at once: [`Pages::Populated`]),
/// read and written only through the accessors below.
struct Mapping {
    shared: SharedMapping,
}

/// A ring error from a failed mapping: the system's errors stay `Io` (a link in the file's place
/// is one: it is opened without following links), a file this side may not map (wrong length,
/// not a regular file of this user) is `Refused`; either way the peer stays on UDP.
fn mapping_err(context: &'static str) -> impl FnOnce(SharedMapError) -> RingError {
    move |SharedMapError { path, reason }| match reason {
        SharedMapFailure::Io { source, .. } | SharedMapFailure::Reserve { source, .. } => {
            RingError::Io { context, source }
        }
        other => RingError::Refused(format!("{}: {other}", path.display())),
    }
}

impl Mapping {
    fn base(&self) -> *mut u8 {
        self.shared.as_ptr()
    }

    fn len(&self) -> usize {
        self.shared.len_bytes()
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= RING_HEADER_BYTES);
        // Safety: `off` is a constant header offset, 8-aligned (mmap returns page-aligned
        // memory) and inside the mapping; AtomicU64 has the layout of u64 and any bit pattern
        // is valid; the reference lives no longer than `self`.
        unsafe { &*self.base().add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= RING_HEADER_BYTES);
        // Safety: as for `u64_at`, with 4-byte alignment.
        unsafe { &*self.base().add(off).cast::<AtomicU32>() }
    }

    /// Copies `src` into the data area at `off`.
    fn write_data(&self, off: usize, src: &[u8]) {
        assert!(RING_HEADER_BYTES + off + src.len() <= self.len(), "ring write out of bounds");
        // Safety: bounds checked above; `src` is our own memory, never inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base().add(RING_HEADER_BYTES + off), src.len()) }
    }

    /// A view of `len` bytes of the data area at `off`, for a consumer that released nothing
    /// past them yet.
    fn lend(&self, off: usize, len: usize) -> LentBytes {
        assert!(RING_HEADER_BYTES + off + len <= self.len(), "ring lend out of bounds");
        // Safety: the range is inside the mapping (checked above), which lives as long as the
        // consumer; the consumer hands the space back to the producer only in `release`, so
        // the view is valid under `LentBytes`' contract (the shared-memory datapath releases
        // only at its next call).
        unsafe { LentBytes::new(NonNull::new_unchecked(self.base().add(RING_HEADER_BYTES + off)), len) }
    }

    /// Copies from the data area at `off` into `dst`.
    fn read_data(&self, off: usize, dst: &mut [u8]) {
        assert!(RING_HEADER_BYTES + off + dst.len() <= self.len(), "ring read out of bounds");
        // Safety: bounds checked above; `dst` is our own memory. The peer may write these
        // bytes concurrently (only a hostile one would); the copy then yields some bytes, which
        // are never interpreted in place.
        unsafe { std::ptr::copy_nonoverlapping(self.base().add(RING_HEADER_BYTES + off), dst.as_mut_ptr(), dst.len()) }
    }
}

/// The writing side of a ring. Created here, attached by the peer.
pub struct Producer {
    map: Mapping,
    data_bytes: u64,
    nonce: u64,
    /// Bytes written (published or not).
    head: u64,
    /// Last `tail` read from the consumer.
    tail_seen: u64,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("path", &self.path()).field("head", &self.head).finish_non_exhaustive()
    }
}

/// Where `push` put an entry, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Written (visible to the consumer after `publish`).
    Written,
    /// No room now: the consumer has not caught up.
    Full,
    /// The fill function declined; nothing was appended.
    Cancelled,
}

impl Producer {
    /// Creates `dir/name` (mode 0600, must not exist), sizes and maps it, writes the header.
    pub fn create(dir: &Path, name: &str, data_bytes: usize, nonce: u64) -> Result<Producer, RingError> {
        if !valid_ring_name(name) {
            return Err(RingError::Refused(format!("ring name {name:?} is not valid")));
        }
        if !data_bytes.is_power_of_two() || !(RING_DATA_BYTES_MIN..=RING_DATA_BYTES_MAX).contains(&data_bytes) {
            return Err(RingError::Refused(format!(
                "ring size {data_bytes} must be a power of two in {RING_DATA_BYTES_MIN}..={RING_DATA_BYTES_MAX}"
            )));
        }
        let path = dir.join(name);
        let len = RING_HEADER_BYTES + data_bytes;
        // O_EXCL, mode 0600, O_NOFOLLOW; the pages are reserved now: on a size-limited tmpfs (a
        // container's /dev/shm) a sparse file would fault (SIGBUS) on first touch of a page
        // beyond the limit; this way the shortage is an error here and the peer stays on UDP.
        let shared =
            SharedMapping::create_with(&path, len, Pages::Populated).map_err(mapping_err("creating a ring file"))?;
        let map = Mapping { shared };
        map.u32_at(OFF_VERSION).store(RING_VERSION, Ordering::Relaxed);
        map.u32_at(OFF_HEADER_BYTES).store(RING_HEADER_BYTES as u32, Ordering::Relaxed);
        map.u64_at(OFF_DATA_BYTES).store(data_bytes as u64, Ordering::Relaxed);
        map.u64_at(OFF_NONCE).store(nonce, Ordering::Relaxed);
        map.u32_at(OFF_PRODUCER_PID).store(std::process::id(), Ordering::Relaxed);
        map.u64_at(OFF_MAGIC).store(RING_MAGIC, Ordering::Release);
        Ok(Producer { map, data_bytes: data_bytes as u64, nonce, head: 0, tail_seen: 0 })
    }

    /// The file's path (the consumer unlinks it once mapped; `drop` does too).
    pub fn path(&self) -> &Path {
        self.map.shared.path()
    }

    /// The nonce written into the header.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Appends one entry. Nothing is visible to the consumer until [`Producer::publish`].
    /// `payload.len()` must be at most [`ENTRY_PAYLOAD_BYTES_MAX`] (the caller validated it).
    pub fn push(
        &mut self,
        payload: &[u8],
        segment_bytes: u32,
        src_path: u16,
        dst_path: u16,
    ) -> Result<Push, RingError> {
        self.push_with(payload.len(), segment_bytes, src_path, dst_path, |slot| {
            slot.copy_from_slice(payload);
            true
        })
    }

    /// Appends one entry of `len` payload bytes that `fill` writes in place (no copy through a
    /// buffer of ours); if `fill` returns false nothing is appended ([`Push::Cancelled`]).
    pub fn push_with(
        &mut self,
        len: usize,
        segment_bytes: u32,
        src_path: u16,
        dst_path: u16,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Result<Push, RingError> {
        if len > ENTRY_PAYLOAD_BYTES_MAX {
            return Err(RingError::Refused(format!("entry of {len} bytes exceeds {ENTRY_PAYLOAD_BYTES_MAX}")));
        }
        let need = entry_bytes(len);
        let off = self.head % self.data_bytes;
        let contig = self.data_bytes - off;
        let total = if need > contig { contig + need } else { need };
        if self.head + total - self.tail_seen > self.data_bytes {
            self.refresh_tail()?;
            if self.head + total - self.tail_seen > self.data_bytes {
                return Ok(Push::Full);
            }
        }
        let mut off = off as usize;
        if need > contig {
            self.map.write_data(off, &entry_header(KIND_PAD, (contig as usize - ENTRY_HEADER_BYTES) as u32, 0, 0, 0));
            self.head += contig;
            off = 0;
        }
        let start = RING_HEADER_BYTES + off + ENTRY_HEADER_BYTES;
        assert!(start + len <= self.map.len(), "ring slot out of bounds");
        // Safety: in bounds (checked above) and past everything published, so the consumer does
        // not read it before the next publish and no other slice of ours covers it; the
        // mutable borrow of `self` keeps it unique on this side. (A hostile consumer writing
        // there could only corrupt what it is about to receive.)
        let slot = unsafe { std::slice::from_raw_parts_mut(self.map.base().add(start), len) };
        if !fill(slot) {
            return Ok(Push::Cancelled);
        }
        self.map.write_data(off, &entry_header(KIND_DATA, len as u32, segment_bytes, src_path, dst_path));
        self.head += need;
        Ok(Push::Written)
    }

    fn refresh_tail(&mut self) -> Result<(), RingError> {
        let tail = self.map.u64_at(OFF_TAIL).load(Ordering::Acquire);
        if tail > self.head || tail < self.tail_seen {
            return Err(RingError::Corrupt(format!(
                "consumer tail {tail} outside {}..={} (the consumer wrote garbage)",
                self.tail_seen, self.head
            )));
        }
        self.tail_seen = tail;
        Ok(())
    }

    /// Makes every pushed entry visible, then reports whether the consumer said it is going to
    /// sleep (and clears that, so one doorbell answers one sleep). The SeqCst fence pairs with
    /// the consumer's in [`Consumer::prepare_sleep`]: either it sees our head or we see its flag.
    pub fn publish(&mut self) -> bool {
        self.map.u64_at(OFF_HEAD).store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        let sleeping = self.map.u32_at(OFF_SLEEPING);
        sleeping.load(Ordering::Relaxed) != 0 && sleeping.swap(0, Ordering::AcqRel) != 0
    }

    /// Whether the consumer closed its side (dropped, or abandoned the ring as corrupt).
    pub fn consumer_closed(&self) -> bool {
        self.map.u32_at(OFF_CLOSED).load(Ordering::Acquire) & CLOSED_BY_CONSUMER != 0
    }

    /// The consumer's process id as it wrote it (0 before attach); untrusted, used only to ask
    /// the kernel whether that process is alive.
    pub fn consumer_pid(&self) -> u32 {
        self.map.u32_at(OFF_CONSUMER_PID).load(Ordering::Relaxed)
    }

    /// Bytes pushed and not yet consumed (as of the last tail read).
    pub fn bytes_queued(&self) -> u64 {
        self.head - self.tail_seen
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.map.u32_at(OFF_CLOSED).fetch_or(CLOSED_BY_PRODUCER, Ordering::Release);
        // The name goes now if the consumer never took the file (the mapping's own drop would
        // too): only while it still names this ring's file.
        let _ = self.map.shared.unlink();
    }
}

/// What [`Consumer::pop`] copied out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Payload bytes copied.
    pub len: usize,
    /// GSO stride the producer gave (0 or >= len: not segmented).
    pub segment_bytes: u32,
    /// Producer's path the datagram was sent from.
    pub src_path: u16,
    /// Our path it was sent to.
    pub dst_path: u16,
}

/// The reading side of a ring, attached to a file the peer created.
pub struct Consumer {
    map: Mapping,
    data_bytes: u64,
    /// Bytes consumed (published to the producer by `release`).
    tail: u64,
    /// Last head read, validated.
    head_seen: u64,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer").field("tail", &self.tail).finish_non_exhaustive()
    }
}

impl Consumer {
    /// Opens `dir/name`, maps it and validates the header against what the attach message
    /// said; unlinks the name once mapped. Any mismatch is `Refused`.
    pub fn attach(dir: &Path, name: &str, data_bytes: u64, nonce: u64) -> Result<Consumer, RingError> {
        if !valid_ring_name(name) {
            return Err(RingError::Refused(format!("ring name {name:?} is not valid")));
        }
        if !data_bytes.is_power_of_two()
            || !(RING_DATA_BYTES_MIN as u64..=RING_DATA_BYTES_MAX as u64).contains(&data_bytes)
        {
            return Err(RingError::Refused(format!("ring size {data_bytes} is out of range")));
        }
        let path = dir.join(name);
        let len = RING_HEADER_BYTES + data_bytes as usize;
        // A regular file of this user of exactly `len` bytes, opened without following a link.
        let shared = SharedMapping::open_with(&path, len, Pages::Populated)
            .map_err(mapping_err("opening a peer's ring file"))?;
        // Once mapped, the name has served; the mapping stays. A name that meanwhile names
        // another file is left alone (the header check below still decides about this one).
        let _ = shared.unlink();
        let map = Mapping { shared };
        let magic = map.u64_at(OFF_MAGIC).load(Ordering::Acquire);
        let version = map.u32_at(OFF_VERSION).load(Ordering::Relaxed);
        let header = map.u32_at(OFF_HEADER_BYTES).load(Ordering::Relaxed);
        let size = map.u64_at(OFF_DATA_BYTES).load(Ordering::Relaxed);
        let found = map.u64_at(OFF_NONCE).load(Ordering::Relaxed);
        if magic != RING_MAGIC || version != RING_VERSION || header as usize != RING_HEADER_BYTES {
            return Err(RingError::Refused(format!("bad header: magic {magic:#x} version {version} header {header}")));
        }
        if size != data_bytes || found != nonce {
            return Err(RingError::Refused(format!(
                "header says {size} bytes, nonce {found:#x}; the attach message said {data_bytes}, {nonce:#x}"
            )));
        }
        let head = map.u64_at(OFF_HEAD).load(Ordering::Acquire);
        let tail = map.u64_at(OFF_TAIL).load(Ordering::Relaxed);
        if tail > head || head - tail > data_bytes || tail % ENTRY_HEADER_BYTES as u64 != 0 {
            return Err(RingError::Refused(format!("head {head} / tail {tail} impossible")));
        }
        map.u32_at(OFF_CONSUMER_PID).store(std::process::id(), Ordering::Relaxed);
        Ok(Consumer { map, data_bytes, tail, head_seen: tail })
    }

    /// Copies the next entry's payload into `out` and advances past it; `None` when empty.
    /// `out` must hold [`ENTRY_PAYLOAD_BYTES_MAX`] bytes. Call [`Consumer::release`] after a
    /// batch so the producer sees the room.
    pub fn pop(&mut self, out: &mut [u8]) -> Result<Option<Entry>, RingError> {
        Ok(self.pop_lending(out, false)?.map(|(e, _)| e))
    }

    /// As [`Consumer::pop`], but with `lend` an unsegmented entry of at least
    /// [`crate::LEND_MIN_BYTES`] is not copied whole: only its first [`crate::LENT_HEAD_BYTES`]
    /// go to `out`, and the whole payload is lent in place. The lent bytes stay valid until
    /// [`Consumer::release`] (the producer may reuse the space only then) and while `self`
    /// lives.
    pub fn pop_lending(&mut self, out: &mut [u8], lend: bool) -> Result<Option<(Entry, Option<LentBytes>)>, RingError> {
        // Bounded: at most one pad entry precedes a data entry.
        for _ in 0..2 {
            if self.tail == self.head_seen {
                let head = self.map.u64_at(OFF_HEAD).load(Ordering::Acquire);
                if head < self.head_seen || head - self.tail > self.data_bytes {
                    return Err(RingError::Corrupt(format!("head {head} with tail {}", self.tail)));
                }
                self.head_seen = head;
                if head == self.tail {
                    return Ok(None);
                }
            }
            let available = self.head_seen - self.tail;
            let off = self.tail % self.data_bytes;
            let contig = self.data_bytes - off;
            if available < ENTRY_HEADER_BYTES as u64 {
                return Err(RingError::Corrupt(format!("{available} bytes published, less than an entry header")));
            }
            let mut header = [0u8; ENTRY_HEADER_BYTES];
            self.map.read_data(off as usize, &mut header);
            let (kind, len, segment_bytes, src_path, dst_path) = parse_entry_header(&header);
            match kind {
                KIND_PAD => {
                    if u64::from(len) + ENTRY_HEADER_BYTES as u64 != contig || available < contig {
                        return Err(RingError::Corrupt(format!("pad of {len} bytes at {off} of {}", self.data_bytes)));
                    }
                    self.tail += contig;
                }
                KIND_DATA => {
                    let len = len as usize;
                    let need = entry_bytes(len);
                    if len > ENTRY_PAYLOAD_BYTES_MAX || need > contig || need > available {
                        return Err(RingError::Corrupt(format!(
                            "entry of {len} bytes at {off}: {available} published, {contig} before the end"
                        )));
                    }
                    if out.len() < len {
                        return Err(RingError::Corrupt(format!(
                            "entry of {len} bytes exceeds the {} given",
                            out.len()
                        )));
                    }
                    let at = off as usize + ENTRY_HEADER_BYTES;
                    let unsegmented = segment_bytes == 0 || segment_bytes as usize >= len;
                    let lent = if lend && unsegmented && len >= crate::LEND_MIN_BYTES {
                        self.map.read_data(at, &mut out[..crate::LENT_HEAD_BYTES]);
                        Some(self.map.lend(at, len))
                    } else {
                        self.map.read_data(at, &mut out[..len]);
                        None
                    };
                    self.tail += need;
                    return Ok(Some((Entry { len, segment_bytes, src_path, dst_path }, lent)));
                }
                other => return Err(RingError::Corrupt(format!("entry kind {other} at {off}"))),
            }
        }
        Ok(None)
    }

    /// Hands consumed space back to the producer.
    pub fn release(&mut self) {
        self.map.u64_at(OFF_TAIL).store(self.tail, Ordering::Release);
    }

    /// Whether an entry is (probably) waiting; a cheap check for spinning.
    pub fn has_data(&self) -> bool {
        self.tail != self.head_seen || self.map.u64_at(OFF_HEAD).load(Ordering::Acquire) != self.tail
    }

    /// Announces that this side is about to sleep; returns true if data arrived meanwhile (then
    /// do not sleep). The SeqCst fence pairs with the producer's in [`Producer::publish`].
    pub fn prepare_sleep(&self) -> bool {
        self.map.u32_at(OFF_SLEEPING).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.has_data()
    }

    /// Clears the sleeping flag after waking.
    pub fn woke(&self) {
        self.map.u32_at(OFF_SLEEPING).store(0, Ordering::Relaxed);
    }

    /// Whether the producer dropped its side.
    pub fn producer_closed(&self) -> bool {
        self.map.u32_at(OFF_CLOSED).load(Ordering::Acquire) & CLOSED_BY_PRODUCER != 0
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // Tells the producer to stop using this ring (it falls back to UDP).
        self.map.u32_at(OFF_CLOSED).fetch_or(CLOSED_BY_CONSUMER, Ordering::Release);
        self.map.u32_at(OFF_SLEEPING).store(0, Ordering::Relaxed);
    }
}

/// Bytes an entry with `len` payload bytes occupies.
fn entry_bytes(len: usize) -> u64 {
    (ENTRY_HEADER_BYTES + len.div_ceil(ENTRY_HEADER_BYTES) * ENTRY_HEADER_BYTES) as u64
}

fn entry_header(kind: u8, len: u32, segment_bytes: u32, src_path: u16, dst_path: u16) -> [u8; ENTRY_HEADER_BYTES] {
    let mut h = [0u8; ENTRY_HEADER_BYTES];
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4..8].copy_from_slice(&segment_bytes.to_le_bytes());
    h[8..10].copy_from_slice(&src_path.to_le_bytes());
    h[10..12].copy_from_slice(&dst_path.to_le_bytes());
    h[12] = kind;
    h
}

fn parse_entry_header(h: &[u8; ENTRY_HEADER_BYTES]) -> (u8, u32, u32, u16, u16) {
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
    (h[12], u32_at(0), u32_at(4), u16_at(8), u16_at(10))
}

/// Test hooks: write raw values into a ring's shared header or data area, as a hostile peer
/// could.
#[cfg(test)]
pub(crate) mod hostile {
    use super::*;

    pub(crate) fn set_head(p: &Producer, head: u64) {
        p.map.u64_at(OFF_HEAD).store(head, Ordering::Release);
    }
    pub(crate) fn set_tail(p: &Producer, tail: u64) {
        p.map.u64_at(OFF_TAIL).store(tail, Ordering::Release);
    }
    pub(crate) fn write_entry_header(p: &Producer, off: usize, kind: u8, len: u32) {
        p.map.write_data(off, &entry_header(kind, len, 0, 0, 0));
    }
    pub(crate) fn set_magic(p: &Producer, magic: u64) {
        p.map.u64_at(OFF_MAGIC).store(magic, Ordering::Release);
    }
    pub(crate) fn set_data_bytes(p: &Producer, bytes: u64) {
        p.map.u64_at(OFF_DATA_BYTES).store(bytes, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
