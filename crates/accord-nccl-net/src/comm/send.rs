//! The send side: the CTS ring the receiver writes into, tag matching, and the data and size
//! writes of each `isend`.

use super::{size_word_offset, SEND_REQUESTS_MAX, SIZE_WORD_BYTES};
use crate::abi::NET_REQUESTS_MAX;
use crate::cts::{CtsEntry, ENTRY_BYTES};
use crate::error::{PluginError, Result};
use crate::mr::MemoryRegion;
use crate::runtime::{imm_for, IndexLease, Runtime};
use accord_engine::{EngineId, ImmCounter, MrBuffer, MrDescriptor, MrHandle, Transfer, WriteOp};
use std::sync::{Arc, Mutex};

/// A send comm before the receiver answered: what the hello carries.
pub struct PreparedSend {
    rt: Arc<Runtime>,
    index: IndexLease,
    /// The slot counters and their values before the peer could know this comm: captured
    /// here, not when the comm completes, since the peer may write as soon as it has our
    /// half of the handshake.
    counters: Vec<ImmCounter>,
    bases: Vec<u64>,
    ring: MrBuffer,
    stage: MrBuffer,
}

impl PreparedSend {
    /// Takes an index and registers the CTS ring and the size staging area.
    pub fn new(rt: Arc<Runtime>) -> Result<PreparedSend> {
        let index = rt.lease_index()?;
        let ring = rt.engine.alloc(NET_REQUESTS_MAX * ENTRY_BYTES)?;
        let stage = rt.engine.alloc(SEND_REQUESTS_MAX * SIZE_WORD_BYTES)?;
        let (counters, bases) = rt.slot_counters(index.index);
        Ok(PreparedSend { rt, index, counters, bases, ring, stage })
    }

    /// The comm index (names the ring's immediates).
    pub fn index(&self) -> u32 {
        self.index.index
    }

    /// Where the receiver writes clear-to-send entries.
    pub fn ring_descriptor(&self) -> MrDescriptor {
        self.ring.descriptor()
    }

    /// Completes the comm with the receiver's answer: its size table, and its bounce pool when
    /// it has one (receives into its GPU memory name ranges of it).
    pub fn finish(
        self,
        peer: EngineId,
        recv_index: u32,
        sizes: MrDescriptor,
        bounce: Option<MrDescriptor>,
    ) -> SendComm {
        let (counters, bases) = (self.counters, self.bases);
        let bounce = bounce.filter(|b| b.engine == peer);
        if let Some(b) = &bounce {
            let engine = &self.rt.engine;
            crate::bounce::pin_for_current_gpu("the peer's bounce pool", |gpu| engine.prepare_shared_peer(b, gpu));
        }
        let _watch = self.rt.engine.watch_peer(peer);
        let inner = SendInner {
            _watch,
            rt: self.rt,
            index: self.index,
            peer,
            recv_index,
            sizes,
            bounce,
            ring: self.ring,
            stage: self.stage,
            counters,
            bases,
            state: Mutex::new(SendState {
                next_seq: 0,
                current: None,
                free_slots: (0..SEND_REQUESTS_MAX as u32).rev().collect(),
            }),
            waiting_for_cts: Mutex::new(None),
        };
        SendComm { inner: Arc::new(inner) }
    }
}

struct Current {
    entry: CtsEntry,
    matched: u32,
}

struct SendState {
    /// Sequence number of the next CTS entry to consume.
    next_seq: u64,
    /// The entry being matched, with a bit per receive already matched.
    current: Option<Current>,
    /// Free send request slots (index into the size staging area).
    free_slots: Vec<u32>,
}

struct SendInner {
    /// Keeps the receiver under keepalive probes while the comm lives (a send waiting for a
    /// clear-to-send has nothing in flight that would notice its death).
    _watch: accord_engine::PeerWatch,
    rt: Arc<Runtime>,
    index: IndexLease,
    peer: EngineId,
    recv_index: u32,
    sizes: MrDescriptor,
    /// The receiver's bounce pool: its full descriptor (with the shared-memory identity that
    /// lets the engine copy device bytes straight into it) replaces what a clear-to-send says.
    bounce: Option<MrDescriptor>,
    ring: MrBuffer,
    stage: MrBuffer,
    counters: Vec<ImmCounter>,
    bases: Vec<u64>,
    state: Mutex<SendState>,
    /// The in-flight record of an `isend` that found no clear-to-send yet (NCCL calls again;
    /// the record stays until one starts, so a dump shows a send stuck on its receiver).
    waiting_for_cts: Mutex<Option<crate::inflight::Tracked>>,
}

impl SendInner {
    /// Records (once, until a send starts) that an `isend` waits for the receiver.
    fn note_waiting_for_cts(&self, size: u64, tag: i32) {
        let mut waiting = self.waiting_for_cts.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.is_none() {
            *waiting = Some(crate::inflight::track(
                crate::inflight::Direction::Send,
                crate::inflight::Waiting::ClearToSend,
                self.index.index,
                self.peer,
                size,
                tag,
            ));
        }
    }

    /// The receiver's bounce pool, when a clear-to-send entry names it (a receive into GPU memory).
    fn bounce_named_by(&self, recv: &crate::cts::CtsRecv) -> Option<MrDescriptor> {
        self.bounce.filter(|b| b.region == recv.region && b.key == recv.key)
    }
}

/// A send comm (NCCL's `sendComm`).
pub struct SendComm {
    inner: Arc<SendInner>,
}

impl std::fmt::Debug for SendComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendComm").field("index", &self.inner.index.index).finish_non_exhaustive()
    }
}

/// Pieces start on this boundary (the last piece takes the rest).
const PIECE_ALIGN_BYTES: u64 = 4096;

/// Bytes of every piece but the last when `len` bytes go in `pieces` pieces: whole pages, rounded
/// down, so the last piece (the rest) is the longest. So no piece of a send that fills its
/// receive is shorter than [`crate::runtime::PIECE_BYTES_MIN`] (the receiver asked for at most
/// capacity / that many pieces), and where the receiver is in this process every piece goes to
/// the engine's copy threads, none to NCCL's proxy thread. Rounded up instead, a 1 MiB send in
/// 12 pieces ended with one of 56 KiB. With fewer pages than pieces the pieces are one page
/// each and the last ones empty (an empty piece still writes, zero bytes, so the count holds).
fn piece_bytes(len: u64, pieces: u64) -> u64 {
    let pages = len / pieces.max(1) / PIECE_ALIGN_BYTES;
    if pages == 0 {
        PIECE_ALIGN_BYTES
    } else {
        pages * PIECE_ALIGN_BYTES
    }
}

/// Where piece `index` of `pieces` starts and how long it is, for a send of `len` bytes.
fn piece_span(len: u64, pieces: u64, index: u64) -> (u64, u64) {
    let step = piece_bytes(len, pieces);
    let start = (index * step).min(len);
    let end = if index + 1 == pieces { len } else { (start + step).min(len) };
    (start, end - start)
}

/// What `isend` was asked to send.
#[derive(Copy, Clone, Debug)]
pub struct SendArgs<'a> {
    /// Address of the first byte.
    pub data: usize,
    /// Bytes to send.
    pub size: u64,
    /// NCCL's tag.
    pub tag: i32,
    /// The registration of the buffer (None allowed for zero bytes).
    pub region: Option<&'a MemoryRegion>,
}

impl SendArgs<'_> {
    /// The registration and offset of the first `len` bytes to send.
    fn source(&self, len: u64) -> Result<(&MrHandle, u64)> {
        let region = self.region.ok_or_else(|| {
            PluginError::InvalidArgument(format!("isend of {len} bytes without a registered mhandle"))
        })?;
        let (src, _) = region
            .registration
            .as_ref()
            .ok_or_else(|| PluginError::InvalidArgument("isend from a zero-byte registration".to_string()))?;
        Ok((src, region.offset_of(self.data, len)?))
    }
}

impl SendComm {
    /// The plugin's index of this comm (its in-flight records carry it).
    pub fn index(&self) -> u32 {
        self.inner.index.index
    }

    /// The engine this comm runs on (for the in-flight dump's header).
    pub fn engine_id(&self) -> accord_engine::EngineId {
        self.inner.rt.engine.id()
    }

    /// Starts a send, or returns None when it cannot start yet (no matching clear-to-send
    /// has arrived, or every request slot is busy); NCCL calls again later.
    pub fn isend(&self, args: SendArgs<'_>) -> Result<Option<SendRequest>> {
        let inner = &self.inner;
        crate::error::check_peer(&inner.rt.engine, inner.peer)?;
        let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.free_slots.is_empty() {
            return Ok(None);
        }
        if state.current.is_none() {
            let seq = state.next_seq;
            let slot = (seq % NET_REQUESTS_MAX as u64) as usize;
            let arrivals = inner.counters[slot].value() - inner.bases[slot];
            if arrivals < seq / NET_REQUESTS_MAX as u64 + 1 {
                inner.note_waiting_for_cts(args.size, args.tag);
                return Ok(None);
            }
            let mut bytes = [0u8; ENTRY_BYTES];
            inner.ring.read_at(slot * ENTRY_BYTES, &mut bytes).expect("ring slot in range");
            let entry = CtsEntry::decode(&bytes, seq)?;
            if entry.slot as usize != slot {
                return Err(PluginError::Protocol(format!("entry {seq} names slot {} instead of {slot}", entry.slot)));
            }
            state.current = Some(Current { entry, matched: 0 });
        }
        let current = state.current.as_mut().expect("set above");
        let free = |i: usize| current.matched & (1 << i) == 0;
        let Some(index) = (0..current.entry.recvs.len()).find(|&i| free(i) && current.entry.recvs[i].tag == args.tag)
        else {
            crate::log::event(line!(), || {
                format!(
                    "isend comm {} tag {} waits: the current clear-to-send has no free receive with that tag",
                    inner.index.index, args.tag
                )
            });
            // As with NCCL's own transports, a send whose tag the receiver's next irecv does not
            // (or no longer) wait for is not an error: it waits, and NCCL calls again.
            inner.note_waiting_for_cts(args.size, args.tag);
            return Ok(None);
        };
        current.matched |= 1 << index;
        let recv = current.entry.recvs[index];
        let recv_slot = current.entry.slot;
        if current.matched.count_ones() as usize == current.entry.recvs.len() {
            state.current = None;
            state.next_seq += 1;
        }
        let len = args.size.min(recv.size);
        let imm = Some(imm_for(inner.recv_index, recv_slot));
        let slot = state.free_slots.pop().expect("checked non-empty");
        let stage_handle = inner.stage.handle();
        let stage_offset = slot as usize * SIZE_WORD_BYTES;
        inner.stage.write_at(stage_offset, &len.to_le_bytes()).expect("stage slot in range");
        crate::log::event(line!(), || {
            format!("isend comm {} {len}B tag {}: submitting to receiver slot {recv_slot}", inner.index.index, args.tag)
        });
        let submit = || -> Result<Vec<Transfer>> {
            let mut transfers = Vec::with_capacity(recv.pieces as usize + 1);
            let pieces = u64::from(recv.pieces);
            let source = if len == 0 { None } else { Some(args.source(len)?) };
            for i in 0..pieces {
                let (start, piece_len) = piece_span(len, pieces, i);
                let transfer = match source {
                    Some((src, src_offset)) if piece_len > 0 => {
                        let dst = inner.bounce_named_by(&recv).unwrap_or(MrDescriptor {
                            engine: inner.peer,
                            region: recv.region,
                            key: recv.key,
                            len: recv.region_len,
                            device: None,
                            shared: None,
                        });
                        let op = WriteOp {
                            src,
                            src_offset: src_offset + start,
                            dst: &dst,
                            dst_offset: recv.offset + start,
                            len: piece_len,
                            imm,
                        };
                        if pieces == 1 {
                            inner.rt.engine.write(&op)?
                        } else {
                            inner.rt.engine.write_unsharded(&op)?
                        }
                    }
                    _ => {
                        let op = WriteOp {
                            src: &stage_handle,
                            src_offset: 0,
                            dst: &inner.sizes,
                            dst_offset: 0,
                            len: 0,
                            imm,
                        };
                        inner.rt.engine.write(&op)?
                    }
                };
                transfers.push(transfer);
            }
            let op = WriteOp {
                src: &stage_handle,
                src_offset: stage_offset as u64,
                dst: &inner.sizes,
                dst_offset: size_word_offset(recv_slot, index),
                len: SIZE_WORD_BYTES as u64,
                imm,
            };
            transfers.push(inner.rt.engine.write(&op)?);
            Ok(transfers)
        };
        match submit() {
            Ok(transfers) => {
                crate::log::event(line!(), || {
                    let into = if inner.bounce_named_by(&recv).is_some() { "the bounce pool" } else { "a host buffer" };
                    let from = match args.region {
                        Some(r) if r.device => "GPU",
                        _ => "host",
                    };
                    format!(
                        "isend comm {} {len}B tag {} from {from} memory into {into}, receiver slot {recv_slot}, {} piece(s)",
                        inner.index.index, args.tag, recv.pieces
                    )
                });
                *inner.waiting_for_cts.lock().unwrap_or_else(|e| e.into_inner()) = None;
                let tracked = crate::inflight::track(
                    crate::inflight::Direction::Send,
                    crate::inflight::Waiting::WritesToLand,
                    inner.index.index,
                    inner.peer,
                    len,
                    args.tag,
                );
                let from_gpu = args.region.is_some_and(|r| r.device).then(std::time::Instant::now);
                Ok(Some(SendRequest { comm: inner.clone(), slot, size: len, transfers, _tracked: tracked, from_gpu }))
            }
            Err(e) => {
                state.free_slots.push(slot);
                Err(e)
            }
        }
    }
}

/// An outstanding `isend`.
pub struct SendRequest {
    comm: Arc<SendInner>,
    slot: u32,
    size: u64,
    transfers: Vec<Transfer>,
    _tracked: crate::inflight::Tracked,
    /// When a send from GPU memory started ([`crate::gpu_stats`]); None for host memory.
    from_gpu: Option<std::time::Instant>,
}

impl std::fmt::Debug for SendRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRequest").field("slot", &self.slot).field("size", &self.size).finish_non_exhaustive()
    }
}

impl SendRequest {
    /// Whether every write (pieces and size word) completed: `Some(bytes sent)` once done.
    pub fn test(&self) -> Result<Option<u64>> {
        let mut done = true;
        for t in &self.transfers {
            match t.poll() {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(e.into()),
                None => done = false,
            }
        }
        if done {
            if let Some(started) = self.from_gpu {
                use crate::gpu_stats::{add, max, ns_since, Counter};
                let send_ns = ns_since(started);
                add(Counter::GpuSends, 1);
                add(Counter::GpuSendBytes, self.size);
                add(Counter::SendNsTotal, send_ns);
                max(Counter::SendNsMax, send_ns);
            }
            crate::log::event(line!(), || format!("send comm {} of {}B done", self.comm.index.index, self.size));
        } else {
            crate::error::check_peer(&self.comm.rt.engine, self.comm.peer)?;
        }
        Ok(done.then_some(self.size))
    }
}

impl Drop for SendRequest {
    fn drop(&mut self) {
        self.comm.state.lock().unwrap_or_else(|e| e.into_inner()).free_slots.push(self.slot);
    }
}

#[cfg(test)]
mod piece_tests {
    use super::*;

    /// The pieces tile the send exactly, in order, each non-empty where there are bytes enough.
    fn spans(len: u64, pieces: u64) -> Vec<(u64, u64)> {
        let spans: Vec<_> = (0..pieces).map(|i| piece_span(len, pieces, i)).collect();
        let mut at = 0;
        for &(start, n) in &spans {
            assert!(n == 0 || start == at, "{len} in {pieces}: a gap or overlap at {start}");
            at = start + n;
        }
        assert_eq!(at, len, "{len} in {pieces}: the pieces cover the send");
        spans
    }

    #[test]
    fn no_piece_of_a_full_receive_is_shorter_than_the_smallest_piece() {
        let min = crate::runtime::PIECE_BYTES_MIN;
        for (len, pieces) in [(1 << 20, 12), (1 << 20, 16), (512 << 10, 8), ((1 << 20) + 4096 * 3 + 7, 12)] {
            for (start, n) in spans(len, pieces) {
                assert!(n >= min, "{len} in {pieces}: a piece of {n} bytes at {start}");
                assert!(start % PIECE_ALIGN_BYTES == 0, "pieces start on a page");
            }
        }
    }

    #[test]
    fn short_sends_leave_the_last_pieces_empty() {
        let s = spans(5000, 4);
        assert_eq!(s[0], (0, 4096));
        assert_eq!(s[1], (4096, 904));
        assert_eq!(s[2].1 + s[3].1, 0);
        assert_eq!(spans(0, 3).iter().map(|s| s.1).sum::<u64>(), 0);
        assert_eq!(spans(100, 1), vec![(0, 100)]);
    }
}
