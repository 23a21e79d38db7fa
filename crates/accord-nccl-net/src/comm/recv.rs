//! The receive side: request slots, clear-to-send writes, completion by immediate counters and
//! sizes from the size table. A receive into GPU memory names a range of the comm's bounce pool
//! in its clear-to-send and is done once that range was copied into the GPU buffer
//! ([`crate::bounce`]).

use super::{size_word_offset, SIZE_TABLE_BYTES, SIZE_WORD_BYTES, SIZE_WRITES_PER_RECV};
use crate::abi::NET_REQUESTS_MAX;
use crate::bounce::{BounceLease, BouncePool};
use crate::cts::{CtsEntry, CtsRecv, ENTRY_BYTES, RECVS_MAX};
use crate::error::{PluginError, Result};
use crate::mr::MemoryRegion;
use crate::runtime::{imm_for, IndexLease, Runtime};
use accord_engine::{EngineId, ImmCounter, MrBuffer, MrDescriptor, Transfer, WriteOp};
use std::sync::{Arc, Mutex};

/// A receive comm before it is handed to NCCL: what the reply to the sender carries.
pub struct PreparedRecv {
    rt: Arc<Runtime>,
    index: IndexLease,
    /// The slot counters and their values before the peer could know this comm: captured
    /// here, not when the comm completes, since the peer may write as soon as it has our
    /// half of the handshake.
    counters: Vec<ImmCounter>,
    bases: Vec<u64>,
    sizes: MrBuffer,
    cts_stage: MrBuffer,
    bounce: Option<BouncePool>,
}

impl PreparedRecv {
    /// Takes an index and registers the size table, the CTS staging area and, when devices
    /// accept GPU memory, the bounce pool.
    pub fn new(rt: Arc<Runtime>) -> Result<PreparedRecv> {
        let index = rt.lease_index()?;
        let sizes = rt.engine.alloc(SIZE_TABLE_BYTES)?;
        let cts_stage = rt.engine.alloc(NET_REQUESTS_MAX * ENTRY_BYTES)?;
        let bounce = match rt.gpu_buffers {
            true => {
                let buffer = rt.engine.alloc_shared(rt.config.bounce_bytes)?;
                crate::bounce::pin_for_current_gpu("the bounce pool", |gpu| rt.engine.pin_shared(&buffer, gpu));
                Some(BouncePool::new(buffer))
            }
            false => None,
        };
        let (counters, bases) = rt.slot_counters(index.index);
        Ok(PreparedRecv { rt, index, counters, bases, sizes, cts_stage, bounce })
    }

    /// The bounce pool the sender may be told to write into (None without GPU buffers).
    pub fn bounce_descriptor(&self) -> Option<MrDescriptor> {
        self.bounce.as_ref().map(|b| b.buffer().descriptor())
    }

    /// The comm index (names the completion immediates).
    pub fn index(&self) -> u32 {
        self.index.index
    }

    /// Where the sender writes sizes.
    pub fn sizes_descriptor(&self) -> MrDescriptor {
        self.sizes.descriptor()
    }

    /// Completes the comm with the sender's hello.
    pub fn finish(self, peer: EngineId, send_index: u32, ring: MrDescriptor) -> RecvComm {
        let (counters, bases) = (self.counters, self.bases);
        let _watch = self.rt.engine.watch_peer(peer);
        let inner = RecvInner {
            _watch,
            rt: self.rt,
            index: self.index,
            peer,
            send_index,
            ring,
            sizes: self.sizes,
            cts_stage: self.cts_stage,
            bounce: self.bounce,
            counters,
            state: Mutex::new(RecvState { next_seq: 0, busy: [false; NET_REQUESTS_MAX], expected: bases }),
        };
        RecvComm { inner: Arc::new(inner) }
    }
}

struct RecvState {
    next_seq: u64,
    busy: [bool; NET_REQUESTS_MAX],
    /// Per slot, the counter value at which every receive posted so far has landed.
    expected: Vec<u64>,
}

struct RecvInner {
    /// Keeps the sender under keepalive probes while the comm lives (a posted receive has
    /// nothing in flight that would notice its death).
    _watch: accord_engine::PeerWatch,
    rt: Arc<Runtime>,
    index: IndexLease,
    peer: EngineId,
    send_index: u32,
    ring: MrDescriptor,
    sizes: MrBuffer,
    cts_stage: MrBuffer,
    bounce: Option<BouncePool>,
    counters: Vec<ImmCounter>,
    state: Mutex<RecvState>,
}

/// A receive comm (NCCL's `recvComm`).
pub struct RecvComm {
    inner: Arc<RecvInner>,
}

impl std::fmt::Debug for RecvComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvComm").field("index", &self.inner.index.index).finish_non_exhaustive()
    }
}

/// One receive of a grouped `irecv`.
#[derive(Copy, Clone, Debug)]
pub struct RecvArgs<'a> {
    /// Address of the buffer.
    pub data: usize,
    /// Its capacity.
    pub size: u64,
    /// NCCL's tag.
    pub tag: i32,
    /// Its registration (None allowed for zero bytes).
    pub region: Option<&'a MemoryRegion>,
}

impl RecvComm {
    /// Posts a grouped receive, or returns None when all request slots are busy.
    pub fn irecv(&self, recvs: &[RecvArgs<'_>]) -> Result<Option<RecvRequest>> {
        if recvs.is_empty() || recvs.len() > RECVS_MAX {
            return Err(PluginError::InvalidArgument(format!(
                "irecv of {} receives: this plugin groups 1..={RECVS_MAX} (maxRecvs)",
                recvs.len()
            )));
        }
        let mut entries = Vec::with_capacity(recvs.len());
        let mut landings = Vec::with_capacity(recvs.len());
        for r in recvs {
            let registered = r.region.and_then(|m| m.registration.as_ref().map(|reg| (m, reg)));
            let (cts, landing) = match (r.size, registered) {
                (0, _) => (CtsRecv { tag: r.tag, pieces: 1, ..CtsRecv::default() }, None),
                (size, Some((region, (_, desc)))) if region.device => {
                    let offset = region.offset_of(r.data, size)?;
                    let pool = self.inner.bounce.as_ref().ok_or_else(|| {
                        PluginError::InvalidArgument("a receive into GPU memory on a comm without a bounce pool".into())
                    })?;
                    let Some(lease) = pool.lease(size)? else {
                        crate::gpu_stats::add(crate::gpu_stats::Counter::BounceWaits, 1);
                        crate::log::event(line!(), || format!("irecv of {size} B waits: the bounce pool is full"));
                        return Ok(None);
                    };
                    let bounce = pool.buffer().descriptor();
                    // One piece: the sender's GPU copies it in one DMA (or the engine shards it
                    // over lanes when the sender is elsewhere).
                    let cts = CtsRecv {
                        tag: r.tag,
                        region: bounce.region,
                        key: bounce.key,
                        region_len: bounce.len,
                        offset: lease.offset,
                        size,
                        pieces: 1,
                    };
                    (cts, Some(Landing { lease, dst: *desc, dst_offset: offset, capacity: size }))
                }
                (size, Some((region, (_, desc)))) => {
                    let cts = CtsRecv {
                        tag: r.tag,
                        region: desc.region,
                        key: desc.key,
                        region_len: desc.len,
                        offset: region.offset_of(r.data, size)?,
                        size,
                        pieces: self.inner.rt.pieces_for(size),
                    };
                    (cts, None)
                }
                (size, None) => {
                    return Err(PluginError::InvalidArgument(format!(
                        "irecv of {size} bytes without a registered mhandle"
                    )))
                }
            };
            entries.push(cts);
            landings.push(landing);
        }
        let inner = &self.inner;
        let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        let seq = state.next_seq;
        let slot = (seq % NET_REQUESTS_MAX as u64) as u32;
        if state.busy[slot as usize] {
            return Ok(None);
        }
        let entry = CtsEntry { seq, slot, recvs: entries };
        let stage_offset = slot as usize * ENTRY_BYTES;
        inner.cts_stage.write_at(stage_offset, &entry.encode()).expect("stage slot in range");
        let op = WriteOp {
            src: &inner.cts_stage.handle(),
            src_offset: stage_offset as u64,
            dst: &inner.ring,
            dst_offset: stage_offset as u64,
            len: ENTRY_BYTES as u64,
            imm: Some(imm_for(inner.send_index, slot)),
        };
        let cts = inner.rt.engine.write(&op)?;
        state.next_seq += 1;
        state.busy[slot as usize] = true;
        let writes: u64 = entry.recvs.iter().map(|r| u64::from(r.pieces) + SIZE_WRITES_PER_RECV).sum();
        state.expected[slot as usize] += writes;
        let target = state.expected[slot as usize];
        crate::log::event(line!(), || {
            let what: Vec<String> = entry
                .recvs
                .iter()
                .zip(&landings)
                .map(|(r, l)| format!("{}B tag {}{}", r.size, r.tag, if l.is_some() { " gpu" } else { "" }))
                .collect();
            format!("irecv comm {} seq {seq} slot {slot}: {what:?}", inner.index.index)
        });
        let tracked = crate::inflight::track(
            crate::inflight::Direction::Recv,
            crate::inflight::Waiting::Data,
            inner.index.index,
            inner.peer,
            recvs.iter().map(|r| r.size).sum(),
            recvs[0].tag,
        );
        // The clock is read only for receives into GPU memory (their land time), not host ones.
        let posted_at = landings.iter().any(Option::is_some).then(std::time::Instant::now);
        Ok(Some(RecvRequest {
            _tracked: tracked,
            comm: inner.clone(),
            slot,
            count: recvs.len(),
            target,
            cts,
            landings,
            copies: Mutex::new(None),
            posted_at,
        }))
    }

    /// The peer engine (statistics, logs).
    pub fn peer(&self) -> EngineId {
        self.inner.peer
    }

    /// The plugin's index of this comm (its in-flight records carry it).
    pub fn index(&self) -> u32 {
        self.inner.index.index
    }

    /// The engine this comm runs on (for the in-flight dump's header).
    pub fn engine_id(&self) -> EngineId {
        self.inner.rt.engine.id()
    }
}

/// Where a receive into GPU memory goes once its bytes are in the bounce pool.
struct Landing {
    lease: BounceLease,
    /// The GPU buffer's registration and the receive's offset in it.
    dst: MrDescriptor,
    dst_offset: u64,
    capacity: u64,
}

/// An outstanding grouped receive.
pub struct RecvRequest {
    _tracked: crate::inflight::Tracked,
    comm: Arc<RecvInner>,
    slot: u32,
    count: usize,
    target: u64,
    cts: Transfer,
    /// Per receive, its bounce range when it lands in GPU memory.
    landings: Vec<Option<Landing>>,
    /// The bounce-to-GPU copies, once the bytes arrived (None before), and when they were issued.
    copies: Mutex<Option<(Vec<Transfer>, std::time::Instant)>>,
    /// When `irecv` posted it ([`crate::gpu_stats`]).
    posted_at: Option<std::time::Instant>,
}

impl std::fmt::Debug for RecvRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRequest").field("slot", &self.slot).field("count", &self.count).finish_non_exhaustive()
    }
}

impl RecvRequest {
    /// Receives in the group.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Whether every receive of the group landed: the sizes received once done.
    pub fn test(&self) -> Result<Option<Vec<u64>>> {
        match self.cts.poll() {
            Some(Err(e)) => return Err(e.into()),
            None => return crate::error::check_peer(&self.comm.rt.engine, self.comm.peer).map(|()| None),
            Some(Ok(())) => {}
        }
        if self.comm.counters[self.slot as usize].value() < self.target {
            return crate::error::check_peer(&self.comm.rt.engine, self.comm.peer).map(|()| None);
        }
        let sizes: Vec<u64> = (0..self.count)
            .map(|i| {
                let mut word = [0u8; SIZE_WORD_BYTES];
                self.comm.sizes.read_at(size_word_offset(self.slot, i) as usize, &mut word).expect("in table");
                u64::from_le_bytes(word)
            })
            .collect();
        let index = self.comm.index.index;
        if self.landings.iter().all(Option::is_none) {
            crate::log::event(line!(), || format!("recv comm {index} slot {} done: {sizes:?}", self.slot));
            return Ok(Some(sizes));
        }
        let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        if copies.is_none() {
            crate::log::event(line!(), || {
                format!("recv comm {index} slot {} landed {sizes:?}: copying to the GPU", self.slot)
            });
            if let Some(posted_at) = self.posted_at {
                crate::gpu_stats::add(crate::gpu_stats::Counter::LandNsTotal, crate::gpu_stats::ns_since(posted_at));
            }
            *copies = Some((self.start_copies(&sizes)?, std::time::Instant::now()));
        }
        let (transfers, issued_at) = copies.as_ref().expect("started above");
        for copy in transfers {
            match copy.poll() {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(None),
            }
        }
        {
            use crate::gpu_stats::{add, max, ns_since, Counter};
            let copy_ns = ns_since(*issued_at);
            add(Counter::GpuRecvs, 1);
            add(Counter::GpuRecvBytes, sizes.iter().sum());
            add(Counter::CopyNsTotal, copy_ns);
            max(Counter::CopyNsMax, copy_ns);
        }
        crate::log::event(line!(), || format!("recv comm {index} slot {} done: {sizes:?}", self.slot));
        Ok(Some(sizes))
    }

    /// Copies each received bounce range into its GPU buffer (the sizes the sender wrote).
    fn start_copies(&self, sizes: &[u64]) -> Result<Vec<Transfer>> {
        let pool = self.comm.bounce.as_ref().expect("landings imply a pool");
        let src = pool.buffer().handle();
        let mut copies = Vec::new();
        for (landing, &size) in self.landings.iter().zip(sizes) {
            let Some(l) = landing else { continue };
            if size > l.capacity {
                return Err(PluginError::Protocol(format!(
                    "the sender reports {size} bytes for a receive of {} bytes",
                    l.capacity
                )));
            }
            if size == 0 {
                continue;
            }
            let op = WriteOp {
                src: &src,
                src_offset: l.lease.offset,
                dst: &l.dst,
                dst_offset: l.dst_offset,
                len: size,
                imm: None,
            };
            copies.push(self.comm.rt.engine.write(&op)?);
        }
        Ok(copies)
    }
}

impl Drop for RecvRequest {
    fn drop(&mut self) {
        self.comm.state.lock().unwrap_or_else(|e| e.into_inner()).busy[self.slot as usize] = false;
    }
}
