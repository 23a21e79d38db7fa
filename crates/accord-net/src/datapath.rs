//! The `Datapath` trait and the types that cross it.
//!
//! Shape: the transport hands a *batch* of datagrams per call and receives a
//! batch per call, because per-packet system calls are what caps kernel UDP
//! far below line rate. Receive buffers are allocated to the driver's needs
//! (`alloc_rx_buffers`), filled in place, and reused, so the hot loop never
//! allocates.

use std::net::SocketAddr;
use std::slice::ChunksExactMut;
use std::time::Duration;

use crate::DatapathError;

/// Largest number of slots one [`RxBuffers`] may have: a batch larger than
/// this brings no more syscall amortisation, only cache misses.
pub const RX_SLOTS_MAX: usize = 4096;

/// Most segments one segmented [`TxDatagram`] may carry when the driver
/// splits it in software (no offload); with offload the driver's
/// `gso_max_segments` applies if larger. Matches Linux's `UDP_MAX_SEGMENTS`.
pub const SEGMENTS_PER_SEND_MAX: usize = 64;

/// Largest slot size: the largest UDP payload the IP length field allows,
/// which is also the largest coalesced (GRO) datagram the kernel delivers.
pub const RX_SLOT_BYTES_MAX: usize = 65_535;
/// Bytes of a lent datagram copied into its slot: at least every header the transport parses.
pub const LENT_HEAD_BYTES: usize = 256;
/// Smallest datagram a driver lends instead of copying: control packets (acknowledgements and
/// the like, parsed whole) stay below it.
pub const LEND_MIN_BYTES: usize = 8192;

/// What a driver can do, so the transport can size chunks and choose sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatapathCaps {
    /// Largest payload of one datagram (one segment, when segmenting).
    pub max_payload_bytes: usize,
    /// Most segments one [`TxDatagram`] with `segment_bytes` may carry in
    /// one offloaded send; 1 means no segmentation offload (a segmented
    /// datagram is then split in software by the driver, still correct).
    pub gso_max_segments: u16,
    /// Whether received datagrams may arrive coalesced (see [`RxMeta::segment_bytes`]).
    pub gro: bool,
    /// Whether ECT marking on send and CE reporting on receive work.
    pub ecn: bool,
    /// Whether receive timestamps are reported (none of today's drivers do).
    pub timestamps: bool,
}

/// One datagram to send: borrowed bytes, so a batch costs no copies.
#[derive(Debug, Clone, Copy)]
pub struct TxDatagram<'a> {
    /// Local path (socket) to send from; pairs with the peer's path of the same number.
    pub path: u16,
    /// Destination address (the peer's address for this path).
    pub dst: SocketAddr,
    /// Payload. With `segment_bytes`, the concatenation of several packets;
    /// either way at most `max_payload_bytes` in total.
    pub bytes: &'a [u8],
    /// Segmentation: `bytes` is a run of packets of this size (the last may
    /// be shorter), sent with one offloaded send where the driver can.
    pub segment_bytes: Option<u16>,
    /// Mark the packets ECN-capable (ECT(0)) so switches mark instead of drop.
    pub ecn_capable: bool,
}

impl<'a> TxDatagram<'a> {
    /// A plain (unsegmented, not ECN-capable) datagram.
    pub fn new(path: u16, dst: SocketAddr, bytes: &'a [u8]) -> Self {
        TxDatagram { path, dst, bytes, segment_bytes: None, ecn_capable: false }
    }

    /// The packets this datagram puts on the wire, in order (an empty
    /// datagram is one empty packet). Yields nothing for an invalid zero
    /// segment size, which `send_batch` rejects anyway.
    pub fn segments(&self) -> Segments<'a> {
        let stride = match self.segment_bytes {
            Some(s) => usize::from(s),
            None => self.bytes.len().max(1),
        };
        Segments { rest: self.bytes, stride, empty_pending: stride != 0 && self.bytes.is_empty() }
    }

    /// Number of packets this datagram puts on the wire.
    pub fn segment_count(&self) -> usize {
        match self.segment_bytes {
            Some(0) => 0,
            Some(s) => self.bytes.len().div_ceil(usize::from(s)).max(1),
            None => 1,
        }
    }

    /// Checks this datagram against a driver's limits. Drivers call it on a
    /// whole batch before sending anything, so a bad batch sends nothing.
    pub fn validate(&self, caps: &DatapathCaps, path_count: u16) -> Result<(), DatapathError> {
        if self.path >= path_count {
            return Err(DatapathError::UnknownPath { path: self.path, path_count });
        }
        match self.segment_bytes {
            None => {
                if self.bytes.len() > caps.max_payload_bytes {
                    return Err(DatapathError::MessageTooLarge { len: self.bytes.len(), max: caps.max_payload_bytes });
                }
            }
            Some(segment_bytes) => {
                let invalid =
                    |reason| DatapathError::InvalidSegmentation { len: self.bytes.len(), segment_bytes, reason };
                if segment_bytes == 0 {
                    return Err(invalid("segment size is zero"));
                }
                if usize::from(segment_bytes) > caps.max_payload_bytes {
                    return Err(DatapathError::MessageTooLarge {
                        len: usize::from(segment_bytes),
                        max: caps.max_payload_bytes,
                    });
                }
                if self.bytes.len() > caps.max_payload_bytes {
                    return Err(DatapathError::MessageTooLarge { len: self.bytes.len(), max: caps.max_payload_bytes });
                }
                let segments_max = usize::from(caps.gso_max_segments).max(SEGMENTS_PER_SEND_MAX);
                if self.segment_count() > segments_max {
                    return Err(invalid("too many segments"));
                }
            }
        }
        Ok(())
    }
}

/// Iterator over the packets of a [`TxDatagram`], from [`TxDatagram::segments`].
#[derive(Debug, Clone)]
pub struct Segments<'a> {
    rest: &'a [u8],
    stride: usize,
    empty_pending: bool,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.empty_pending {
            self.empty_pending = false;
            return Some(&[]);
        }
        if self.stride == 0 || self.rest.is_empty() {
            return None;
        }
        let (head, tail) = self.rest.split_at(self.stride.min(self.rest.len()));
        self.rest = tail;
        Some(head)
    }
}

/// What is known about one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    /// Local path (socket) it arrived on.
    pub path: u16,
    /// Sender's address.
    pub src: SocketAddr,
    /// Bytes in the slot.
    pub len: usize,
    /// GRO stride: the slot holds packets of this size (last may be shorter).
    /// Equal to `len` when not coalesced.
    pub segment_bytes: usize,
    /// The network marked congestion (ECN CE) on this datagram.
    pub ecn_ce: bool,
    /// It came through a same-host channel of this job (a shared-memory ring), not a network:
    /// the receiver may accept a lighter seal for it (see [`Datapath::is_local_channel`]).
    pub local_channel: bool,
}

impl RxMeta {
    /// Number of packets in the slot.
    pub fn segment_count(&self) -> usize {
        if self.segment_bytes == 0 {
            return usize::from(self.len > 0);
        }
        self.len.div_ceil(self.segment_bytes).max(1)
    }
}

/// A reusable pool of receive slots: one contiguous allocation, filled by
/// `recv_batch`, read by the caller, reused on the next call.
#[derive(Debug)]
pub struct RxBuffers {
    storage: Box<[u8]>,
    slot_bytes: usize,
    slot_count: usize,
    metas: Vec<RxMeta>,
    /// Per filled slot: the whole datagram in place, when the driver lent it (then the slot
    /// holds only its first bytes; see [`RxBuffers::allow_lending`]).
    lent: Vec<Option<crate::LentBytes>>,
    lending: bool,
}

impl RxBuffers {
    /// Allocates `slot_count` slots of `slot_bytes` each. Prefer
    /// [`Datapath::alloc_rx_buffers`], which picks the size the driver needs.
    pub fn new(slot_count: usize, slot_bytes: usize) -> Result<Self, DatapathError> {
        if slot_count == 0 || slot_count > RX_SLOTS_MAX {
            return Err(DatapathError::InvalidConfig(format!(
                "receive slot count {slot_count} must be in 1..={RX_SLOTS_MAX}"
            )));
        }
        if slot_bytes == 0 || slot_bytes > RX_SLOT_BYTES_MAX {
            return Err(DatapathError::InvalidConfig(format!(
                "receive slot size {slot_bytes} must be in 1..={RX_SLOT_BYTES_MAX}"
            )));
        }
        Ok(RxBuffers {
            storage: vec![0u8; slot_count * slot_bytes].into_boxed_slice(),
            slot_bytes,
            slot_count,
            metas: Vec::with_capacity(slot_count),
            lent: Vec::with_capacity(slot_count),
            lending: false,
        })
    }

    /// Number of filled slots.
    pub fn len(&self) -> usize {
        self.metas.len()
    }

    /// Whether no slot is filled.
    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// Capacity in slots.
    pub fn slot_count(&self) -> usize {
        self.slot_count
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// The `index`-th received datagram, if filled.
    pub fn get(&self, index: usize) -> Option<(&[u8], &RxMeta)> {
        let meta = self.metas.get(index)?;
        let start = index * self.slot_bytes;
        Some((&self.storage[start..start + meta.len], meta))
    }

    /// All received datagrams, in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &RxMeta)> + '_ {
        (0..self.metas.len()).filter_map(move |i| self.get(i))
    }

    /// The packets of the `index`-th datagram, split at its GRO stride.
    pub fn segments(&self, index: usize) -> impl Iterator<Item = &[u8]> + '_ {
        let (bytes, stride) = match self.get(index) {
            Some((bytes, meta)) => (bytes, meta.segment_bytes.max(1)),
            None => (&[][..], 1),
        };
        bytes.chunks(stride)
    }

    /// Empties all slots (drivers do this at the start of `recv_batch`).
    pub fn clear(&mut self) {
        self.metas.clear();
        self.lent.clear();
    }

    /// Fails unless every slot holds `required` bytes (the most a driver delivers in one
    /// datagram), so nothing is ever truncated.
    pub fn check_slot_bytes(&self, required: usize) -> Result<(), DatapathError> {
        if self.slot_bytes() < required {
            return Err(DatapathError::RxSlotTooSmall { slot_bytes: self.slot_bytes(), required });
        }
        Ok(())
    }

    /// The start of a driver's `recv_batch`: checks the slot size against `required`, empties
    /// the slots, and returns how many datagrams the call may deliver (`max`, at most the
    /// slot count).
    pub fn start_batch(&mut self, required: usize, max: usize) -> Result<usize, DatapathError> {
        self.check_slot_bytes(required)?;
        self.clear();
        Ok(max.min(self.slot_count()))
    }

    /// Lets drivers lend datagrams in place instead of copying them whole: such a slot holds
    /// only the datagram's first [`LENT_HEAD_BYTES`] (its header; the rest of the slot is
    /// stale), and [`RxBuffers::lent`] gives the whole datagram, readable until the next call
    /// of any method of the datapath. Only for callers that read payloads through
    /// [`RxBuffers::lent`] when it is set; off by default.
    pub fn allow_lending(&mut self, on: bool) {
        self.lending = on;
    }

    /// Whether the caller accepts lent datagrams.
    pub fn lending_allowed(&self) -> bool {
        self.lending
    }

    /// The whole `index`-th datagram in place, when the driver lent it.
    pub fn lent(&self, index: usize) -> Option<&crate::LentBytes> {
        self.lent.get(index)?.as_ref()
    }

    /// For drivers: marks the next free slot filled with `meta`, its first bytes copied and
    /// the whole datagram lent. False (and nothing changed) as for [`RxBuffers::commit`], or
    /// when lending is not allowed.
    pub fn commit_lent(&mut self, meta: RxMeta, lent: crate::LentBytes) -> bool {
        if !self.lending || lent.len() != meta.len || !self.commit(meta) {
            return false;
        }
        *self.lent.last_mut().expect("commit pushed one") = Some(lent);
        true
    }

    /// For drivers: the unfilled slots, in order, each `slot_bytes` long.
    pub fn free_slots_mut(&mut self) -> ChunksExactMut<'_, u8> {
        let start = self.metas.len() * self.slot_bytes;
        self.storage[start..].chunks_exact_mut(self.slot_bytes)
    }

    /// For drivers: marks the next free slot filled with `meta`. Returns
    /// false (and changes nothing) if all slots are full or `meta.len` does
    /// not fit a slot.
    pub fn commit(&mut self, meta: RxMeta) -> bool {
        if self.metas.len() >= self.slot_count || meta.len > self.slot_bytes {
            debug_assert!(false, "commit beyond the slot pool: {meta:?}");
            return false;
        }
        self.metas.push(meta);
        self.lent.push(None);
        true
    }

    /// For drivers: copies `bytes` into the next free slot and commits it
    /// with `meta` (its `len` is overwritten). Returns false if full or too large.
    pub fn push_copy(&mut self, bytes: &[u8], mut meta: RxMeta) -> bool {
        if self.metas.len() >= self.slot_count || bytes.len() > self.slot_bytes {
            return false;
        }
        let start = self.metas.len() * self.slot_bytes;
        self.storage[start..start + bytes.len()].copy_from_slice(bytes);
        meta.len = bytes.len();
        self.metas.push(meta);
        self.lent.push(None);
        true
    }

    /// Keeps only the datagrams for which `keep` says true, compacting the
    /// survivors to the front in their original order (used by wrappers that
    /// filter received traffic).
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8], &RxMeta) -> bool) {
        let mut write = 0;
        for read in 0..self.metas.len() {
            let meta = self.metas[read];
            let start = read * self.slot_bytes;
            if !keep(&self.storage[start..start + meta.len], &meta) {
                continue;
            }
            if write != read {
                let dst = write * self.slot_bytes;
                let copied = if self.lent[read].is_some() { meta.len.min(LENT_HEAD_BYTES) } else { meta.len };
                self.storage.copy_within(start..start + copied, dst);
                self.metas[write] = meta;
                self.lent.swap(write, read);
            }
            write += 1;
        }
        self.metas.truncate(write);
        self.lent.truncate(write);
    }

    /// Mutable access to the bytes of a filled slot (wrappers that corrupt
    /// or rewrite received data use it).
    pub fn get_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        let len = self.metas.get(index)?.len;
        let start = index * self.slot_bytes;
        Some(&mut self.storage[start..start + len])
    }
}

/// What [`Datapath::send_direct`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectSend {
    /// Written in place and sent.
    Sent,
    /// The fill function declined (its bytes were not available): nothing was sent.
    Cancelled,
    /// The channel to that destination has no room now: send it through `send_batch` later.
    Full,
    /// No in-place channel to that destination: use `send_batch`.
    Unsupported,
}

/// A batched datagram service over numbered local paths.
///
/// A path is one local endpoint (for UDP: one socket, one source port) and
/// therefore one value of the entropy the fabric hashes on; path `i` of a
/// peer pairs with the peer's path `i`. All calls are non-blocking except
/// [`Datapath::wait_readable`], which idle workers use to sleep.
pub trait Datapath: Send {
    /// What this driver can do; may change at run time only by losing a
    /// capability (for example GSO disabled after the NIC refused it).
    fn caps(&self) -> DatapathCaps;

    /// Number of paths; valid path ids are `0..path_count()`.
    fn path_count(&self) -> u16;

    /// Local address of `path`, or `None` for an unknown path (an `Option`
    /// rather than a panic, since the id may come from configuration).
    fn local_addr(&self, path: u16) -> Option<SocketAddr>;

    /// Sends a prefix of `batch` and returns its length. A full socket
    /// buffer returns a short count (possibly 0): retry the rest later,
    /// after [`Datapath::wait_readable`] or a timer. A malformed datagram
    /// anywhere in the batch fails the call before anything is sent.
    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DatapathError>;

    /// Clears `bufs` and fills up to `max` of its slots with datagrams that
    /// have already arrived, on any path; returns how many. Never blocks.
    fn recv_batch(&mut self, bufs: &mut RxBuffers, max: usize) -> Result<usize, DatapathError>;

    /// Blocks until a datagram may be available on any path or `timeout`
    /// passes; returns whether something may be readable. Spurious `true`
    /// is allowed; callers then find `recv_batch` returns 0.
    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, DatapathError>;

    /// Whether a same-host channel (a shared-memory ring) holds a datagram, checked without a
    /// system call: what a polling caller looks at between the [`Datapath::wait_readable`]
    /// calls that also poll the sockets. A hint (false for drivers without such a channel).
    fn local_channel_has_data(&self) -> bool {
        false
    }

    /// Whether a datagram sent to `dst` now goes through a same-host channel of this job (a
    /// shared-memory ring) rather than a network, so the sender may seal it for that channel
    /// (its header only). A wrapper that alters datagrams (fault injection) says false: what
    /// it carries must be sealed as for a network. False for drivers without such a channel.
    fn is_local_channel(&self, _dst: SocketAddr) -> bool {
        false
    }

    /// Slot size `recv_batch` needs so no datagram is ever truncated.
    fn rx_slot_bytes(&self) -> usize {
        let caps = self.caps();
        if caps.gro {
            RX_SLOT_BYTES_MAX
        } else {
            caps.max_payload_bytes.clamp(1, RX_SLOT_BYTES_MAX)
        }
    }

    /// Allocates receive buffers sized for this driver.
    fn alloc_rx_buffers(&self, slot_count: usize) -> Result<RxBuffers, DatapathError> {
        RxBuffers::new(slot_count, self.rx_slot_bytes())
    }

    /// Tells the driver that the peer whose paths are `peer_paths` (path 0 first) runs on this
    /// host, so a driver with a same-host channel (shared memory) may set one up; the others
    /// ignore it. Traffic keeps flowing through the ordinary paths until the channel is up.
    fn offer_local_channel(&mut self, _peer_paths: &[SocketAddr]) {}

    /// Counters of the same-host channel, for drivers that have one.
    #[cfg(target_os = "linux")]
    fn local_channel_stats(&self) -> Option<crate::shm::stats::ShmStats> {
        None
    }

    /// Sends one datagram of `len` bytes from `path` to `dst` by letting `fill` write it where
    /// the receiver will read it (a shared-memory ring), saving the copy through a transmit
    /// buffer. Drivers without such a channel to `dst` answer [`DirectSend::Unsupported`] (the
    /// default), and so do wrappers that must see every datagram (fault injection, tracing).
    fn send_direct(
        &mut self,
        _path: u16,
        _dst: SocketAddr,
        _len: usize,
        _fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<DirectSend, DatapathError> {
        Ok(DirectSend::Unsupported)
    }

    /// Checks every datagram of `batch` against this driver's limits (see
    /// [`TxDatagram::validate`]): drivers call it first, so a bad batch sends nothing.
    fn validate_batch(&self, batch: &[TxDatagram<'_>]) -> Result<(), DatapathError> {
        let (caps, path_count) = (self.caps(), self.path_count());
        batch.iter().try_for_each(|dgram| dgram.validate(&caps, path_count))
    }
}

/// The methods by which a wrapper (the fault injector, the tracer, the shared-memory rings)
/// is the datapath it wraps: its capabilities, paths and their addresses are those of the
/// inner datapath held in field `$inner`. Used inside `impl Datapath for Wrapper`.
macro_rules! wrapped_identity {
    ($inner:ident) => {
        fn caps(&self) -> $crate::DatapathCaps {
            self.$inner.caps()
        }
        fn path_count(&self) -> u16 {
            self.$inner.path_count()
        }
        fn local_addr(&self, path: u16) -> Option<std::net::SocketAddr> {
            self.$inner.local_addr(path)
        }
    };
}
pub(crate) use wrapped_identity;

/// The local-channel methods of a wrapper that has no channel of its own and leaves the inner
/// datapath's (in field `$inner`) alone: slot size, channel offers and channel counters pass
/// through. Used inside `impl Datapath for Wrapper` by the fault injector and the tracer.
macro_rules! wrapped_local_channel {
    ($inner:ident) => {
        fn rx_slot_bytes(&self) -> usize {
            self.$inner.rx_slot_bytes()
        }
        fn offer_local_channel(&mut self, peer_paths: &[std::net::SocketAddr]) {
            self.$inner.offer_local_channel(peer_paths)
        }
        #[cfg(target_os = "linux")]
        fn local_channel_stats(&self) -> Option<$crate::shm::stats::ShmStats> {
            self.$inner.local_channel_stats()
        }
    };
}
pub(crate) use wrapped_local_channel;

impl<D: Datapath + ?Sized> Datapath for Box<D> {
    fn caps(&self) -> DatapathCaps {
        (**self).caps()
    }
    fn path_count(&self) -> u16 {
        (**self).path_count()
    }
    fn local_addr(&self, path: u16) -> Option<SocketAddr> {
        (**self).local_addr(path)
    }
    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DatapathError> {
        (**self).send_batch(batch)
    }
    fn recv_batch(&mut self, bufs: &mut RxBuffers, max: usize) -> Result<usize, DatapathError> {
        (**self).recv_batch(bufs, max)
    }
    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, DatapathError> {
        (**self).wait_readable(timeout)
    }
    fn local_channel_has_data(&self) -> bool {
        (**self).local_channel_has_data()
    }
    fn is_local_channel(&self, dst: SocketAddr) -> bool {
        (**self).is_local_channel(dst)
    }
    fn rx_slot_bytes(&self) -> usize {
        (**self).rx_slot_bytes()
    }
    fn offer_local_channel(&mut self, peer_paths: &[SocketAddr]) {
        (**self).offer_local_channel(peer_paths)
    }
    fn send_direct(
        &mut self,
        path: u16,
        dst: SocketAddr,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<DirectSend, DatapathError> {
        (**self).send_direct(path, dst, len, fill)
    }
    #[cfg(target_os = "linux")]
    fn local_channel_stats(&self) -> Option<crate::shm::stats::ShmStats> {
        (**self).local_channel_stats()
    }
}

#[cfg(test)]
mod tests;
