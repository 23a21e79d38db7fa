//! [`DeviceComm`]: a device communicator over an `accord-coll` communicator on the engine
//! transport: its rings and proxy threads, windows, signals, counters and device table.

use crate::error::{DescriptorError, DeviceError, WaitError};
use crate::lane::{LaneStreams, PeerLane};
use crate::memory::{Block, Placement, Want};
use crate::proxy::{LaneMemory, ProxyHandle, ProxyTiming};
use crate::ring::{HostProducer, Ring, RING_SLOTS_DEFAULT};
use crate::shared::{Counters, Shared};
use crate::signals::{SignalBoard, SIGNALS_MAX};
use crate::table::TableMemory;
use crate::window::{all_gather_records, descriptor_record, parse_descriptor_records, Window, WINDOWS_MAX};
use accord_coll::engine::EngineTransport;
use accord_coll::Communicator;
use accord_cuda::{DevicePtr, Gpu, Stream};
use accord_engine::{Engine, MemoryKind, MrBuffer, MrDescriptor, MrHandle};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Most rings (proxy threads) of one communicator.
pub const RINGS_MAX: usize = 64;
/// Most counters of one communicator.
pub const COUNTERS_MAX: u32 = 1 << 16;

/// How to build a [`DeviceComm`]. Every rank must pass the same numbers (checked).
#[derive(Clone, Debug)]
pub struct DeviceCommConfig {
    /// Rings, one proxy thread each.
    pub rings: usize,
    /// Slots per ring (a power of two).
    pub slot_count: u32,
    /// Descriptors a proxy takes per turn (capped at `slot_count`; local to this rank). A turn's
    /// items for one peer's stream lane go out as one batch, whose driver calls cost tens of
    /// microseconds whatever its size, so small puts run faster in larger turns, given slots
    /// enough to hold several turns in flight.
    pub descriptors_per_turn: usize,
    /// Signals users may use; one more is allocated for the device barrier (the last id).
    pub user_signals: u32,
    /// Counters.
    pub counters: u32,
    /// Where the device-visible memory lives.
    pub placement: Placement,
    /// The proxy threads' idling and close drain.
    pub timing: ProxyTiming,
    /// How long a [`HostProducer`] waits on a full ring before it fails.
    pub producer_timeout: Duration,
    /// Run descriptors for peers this rank's GPU reaches by address (same host through CUDA
    /// IPC, or this process) on the proxies' stream lanes (see `lane/`) rather than as engine
    /// writes, and give kernels those addresses for direct stores. GPU placement only; off, every
    /// descriptor is an engine write (the baseline the device bench compares the lane with).
    pub stream_lane: bool,
    /// A lane batch whose copies move at least this many bytes queues its signal and done
    /// stores on a second stream, so the next batch's copy need not wait for them; 0 (the
    /// default, `lane/` says why): every batch's stores follow its copies on one stream.
    /// Local to this rank.
    pub lane_stores_aside_bytes: u64,
}

impl Default for DeviceCommConfig {
    fn default() -> Self {
        DeviceCommConfig {
            rings: 1,
            slot_count: RING_SLOTS_DEFAULT,
            descriptors_per_turn: crate::proxy::DESCRIPTORS_PER_TURN_DEFAULT,
            user_signals: 64,
            counters: 64,
            placement: Placement::Host,
            timing: ProxyTiming::default(),
            producer_timeout: Duration::from_secs(30),
            stream_lane: true,
            lane_stores_aside_bytes: crate::lane::DEFAULT_STORES_ASIDE_BYTES,
        }
    }
}

/// What the proxies did so far.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Descriptors executed successfully.
    pub descriptors_executed: u64,
    /// Bytes of successful puts and put_values.
    pub bytes_put: u64,
    /// Signal writes issued to the engine.
    pub signal_writes_issued: u64,
    /// Signal values folded into a later write because one was in flight.
    pub signal_writes_coalesced: u64,
    /// Descriptors refused or failed.
    pub descriptor_errors: u64,
    /// Pushes by [`HostProducer`]s that found their ring full.
    pub ring_full_events: u64,
    /// Batches the proxies queued on stream lanes.
    pub lane_batches: u64,
    /// Driver calls those batches took (copies after merging, stores).
    pub lane_driver_ops: u64,
    /// Descriptors those batches held.
    pub lane_items: u64,
    /// Copies they queued after merging (per batch, with `lane_items`: how well puts merged;
    /// the copy engine spends about a microsecond on each whatever its size).
    pub lane_copies: u64,
    /// Summed over lane batches: the time inside `queue_batch` (merging and the driver calls),
    /// the part of `lane_submit_ns` not spent taking and checking descriptors.
    pub lane_queue_ns: u64,
    /// Summed over the proxies' turns that took descriptors: the time taking them off the ring,
    /// checking them and sorting them into batches (with `lane_queue_ns` and
    /// `lane_retire_ns`, where a proxy's time goes).
    pub take_ns: u64,
    /// Summed over the proxies' looks at their lanes that completed batches: the time retiring
    /// them (completing their tickets, counting, freeing slots).
    pub lane_retire_ns: u64,
    /// Summed over lane batches: from the proxy taking the batch's first descriptor to its
    /// last driver call returning (the host's share of a put's latency).
    pub lane_submit_ns: u64,
    /// Summed over lane batches: from queued to the proxy seeing its done word (the GPU's
    /// share: copy engine, stores, and the proxy's next look).
    pub lane_complete_ns: u64,
}

/// This rank's incoming signal slots, `u64[signal_count][world]`.
enum LocalSignals {
    /// Host memory the engine allocated and registered.
    Host(MrBuffer),
    /// Device memory, registered as such.
    Device { block: Block, handle: MrHandle },
}

/// A device communicator: windows every rank registered, rings GPU threads (or
/// [`HostProducer`]s) write descriptors into, one proxy thread per ring, signals and counters.
///
/// What a device harness calls: [`DeviceComm::new`], [`DeviceComm::register_window`] on every
/// rank, [`DeviceComm::device_table_ptr`] (pass it to the kernel), [`DeviceComm::close`].
pub struct DeviceComm {
    comm: Communicator<EngineTransport>,
    shared: Arc<Shared>,
    placement: Placement,
    rings: Vec<Arc<Ring>>,
    proxies: Vec<ProxyHandle>,
    local_signals: LocalSignals,
    /// `u64[signal_count]`: the sum of each signal at its last reset (device memory on a GPU).
    signal_bases: Mutex<Block>,
    /// One `u64` owned by GPU code.
    barrier_epoch: Block,
    /// Tables built so far (a kernel may still hold an older one's address); the last is current.
    tables: Mutex<Vec<TableMemory>>,
    ring_full_events: Arc<AtomicU64>,
    producer_timeout: Duration,
}

impl std::fmt::Debug for DeviceComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceComm")
            .field("rank", &self.shared.rank)
            .field("world", &self.shared.world)
            .field("rings", &self.rings.len())
            .finish_non_exhaustive()
    }
}

impl DeviceCommConfig {
    /// Checks every value against its bounds; [`DeviceComm::new`] does it first. Public so that
    /// a binding can check before it hands its communicator over, and a bad value leaves that
    /// communicator usable.
    pub fn validate(&self) -> Result<(), DeviceError> {
        let bad = |what: String| Err(DeviceError::Config { what });
        if self.rings == 0 || self.rings > RINGS_MAX {
            return bad(format!("rings {}: give 1..={RINGS_MAX}", self.rings));
        }
        if !self.slot_count.is_power_of_two() || self.slot_count > crate::ring::RING_SLOTS_MAX {
            return bad(format!(
                "slot_count {}: give a power of two at most {}",
                self.slot_count,
                crate::ring::RING_SLOTS_MAX
            ));
        }
        if self.descriptors_per_turn == 0 || self.descriptors_per_turn > crate::ring::RING_SLOTS_MAX as usize {
            return bad(format!(
                "descriptors_per_turn {}: give 1..={} (a turn takes at most slot_count)",
                self.descriptors_per_turn,
                crate::ring::RING_SLOTS_MAX
            ));
        }
        if self.user_signals >= SIGNALS_MAX {
            return bad(format!("user_signals {}: give at most {}", self.user_signals, SIGNALS_MAX - 1));
        }
        if self.counters == 0 || self.counters > COUNTERS_MAX {
            return bad(format!("counters {}: give 1..={COUNTERS_MAX}", self.counters));
        }
        Ok(())
    }
}

impl DeviceComm {
    /// Builds the communicator on every rank (collective: every rank calls it with the same
    /// configuration). Allocates the rings, signals and counters, exchanges the signal slots'
    /// descriptors, and starts one proxy thread per ring.
    pub fn new(mut comm: Communicator<EngineTransport>, config: DeviceCommConfig) -> Result<DeviceComm, DeviceError> {
        config.validate()?;
        let engine = comm.transport().engine().clone();
        // A descriptor may name this rank itself. The engine copies writes to itself in
        // process, except when the network is forced; then it must know its own address.
        engine.add_peer(&engine.address()).map_err(|e| DeviceError::Config {
            what: format!("introducing the engine to itself for writes to this rank: {e}"),
        })?;
        let rank = comm.rank() as u32;
        let world = comm.world_size() as u32;
        let signal_count = config.user_signals + 1;
        let placement = config.placement.clone();
        let slots_bytes = signal_count as usize * world as usize * 8;
        let register = |what: &str, e: accord_engine::RegisterError| DeviceError::Register {
            what: what.to_string(),
            reason: e.to_string(),
        };
        let (local_signals, signals_desc) = match &placement {
            Placement::Host => {
                let buf = engine.alloc(slots_bytes).map_err(|e| register("the signal slots", e))?;
                let desc = buf.descriptor();
                (LocalSignals::Host(buf), desc)
            }
            Placement::Gpu(gpu) => {
                let block = Block::new(&placement, Want::DeviceOnly, slots_bytes)?;
                let kind = MemoryKind::CudaDevice { ordinal: gpu.ordinal() as u32 };
                // Safety: the block is device memory this communicator owns; it outlives the
                // registration (deregistered in close before the block drops).
                #[allow(unsafe_code)]
                let (handle, desc) = unsafe { engine.register_raw(block.device_addr() as *mut u8, slots_bytes, kind) }
                    .map_err(|e| register("the signal slots", e))?;
                (LocalSignals::Device { block, handle }, desc)
            }
        };
        // Every rank's configuration and signal slots, in one exchange.
        let mut record = Vec::new();
        for v in
            [config.rings as u64, u64::from(config.slot_count), u64::from(signal_count), u64::from(config.counters)]
        {
            record.extend_from_slice(&v.to_le_bytes());
        }
        record.extend_from_slice(&descriptor_record(slots_bytes as u64, &signals_desc));
        let records = all_gather_records(&mut comm, "the signal slots", &record)?;
        for (r, rec) in records.iter().enumerate() {
            if rec.len() < 32 || rec[..32] != record[..32] {
                return Err(DeviceError::Config {
                    what: format!("rank {r}'s rings, slot_count, signals or counters differ from rank {rank}'s"),
                });
            }
        }
        let tails: Vec<Vec<u8>> = records.iter().map(|r| r[32..].to_vec()).collect();
        let peer_signals = parse_descriptor_records(u32::MAX, "the signal slots", &tails)?;

        let signal_cells =
            source_cells(&engine, &placement, slots_bytes).map_err(|e| register("the signal cells", e))?;
        let counters = Block::new(&placement, Want::Shared, config.counters as usize * 8)?;
        // Device memory, not mapped host memory: wait_signal reads a signal's base on entry, and a
        // mapped word is a PCIe read (about 2 us on the 2xH200 host) in front of its first poll.
        // The host reads and resets it through blocking copies (read_signal, reset_signal), which
        // are not on any kernel's path.
        let signal_bases = Mutex::new(Block::new(&placement, Want::DeviceOnly, signal_count as usize * 8)?);
        let barrier_epoch = Block::new(&placement, Want::DeviceOnly, 8)?;
        let lane_gpu = match (&placement, config.stream_lane) {
            (Placement::Gpu(gpu), true) => Some(gpu.clone()),
            _ => None,
        };
        let lanes: Vec<Option<PeerLane>> = match &lane_gpu {
            Some(gpu) => {
                let aside = config.lane_stores_aside_bytes > 0;
                (0..world).map(|p| open_lane(&engine, gpu, &peer_signals[p as usize], rank, aside)).collect()
            }
            None => (0..world).map(|_| None).collect(),
        };
        let lane_gpu = lane_gpu.filter(|_| lanes.iter().any(|l: &Option<PeerLane>| l.is_some()));
        let shared = Arc::new(Shared {
            engine: engine.clone(),
            rank,
            world,
            signal_count,
            counter_count: config.counters,
            windows: RwLock::new(Vec::new()),
            window_count: AtomicUsize::new(0),
            signal_board: SignalBoard::new(world, signal_count),
            signal_cells,
            peer_signals,
            lane_gpu,
            lanes,
            lane_stores_aside_bytes: config.lane_stores_aside_bytes,
            counters,
            errors: Mutex::new(Vec::new()),
            stats: Counters::default(),
        });
        let mut rings = Vec::with_capacity(config.rings);
        let mut proxies = Vec::with_capacity(config.rings);
        for index in 0..config.rings {
            let ring = Arc::new(Ring::new(index, config.slot_count, &placement)?);
            let staging = source_cells(&engine, &placement, config.slot_count as usize * 8)
                .map_err(|e| register("a ring's value staging", e))?;
            let lane = match shared.lane_gpu {
                Some(_) => Some(LaneMemory {
                    done: Block::new(&placement, Want::Shared, world as usize * 8)?,
                    values: Block::new(&placement, Want::Shared, config.slot_count as usize * 8)?,
                }),
                None => None,
            };
            let proxy = ProxyHandle::spawn(
                ring.clone(),
                shared.clone(),
                staging,
                lane,
                config.timing,
                config.descriptors_per_turn.min(config.slot_count as usize),
            )
            .map_err(|e| DeviceError::Memory { what: format!("a proxy thread: {e}") })?;
            rings.push(ring);
            proxies.push(proxy);
        }
        Ok(DeviceComm {
            comm,
            shared,
            placement,
            rings,
            proxies,
            local_signals,
            signal_bases,
            barrier_epoch,
            tables: Mutex::new(Vec::new()),
            ring_full_events: Arc::new(AtomicU64::new(0)),
            producer_timeout: config.producer_timeout,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.shared.rank as usize
    }

    /// Ranks.
    pub fn world(&self) -> usize {
        self.shared.world as usize
    }

    /// Signals per rank, the barrier's included.
    pub fn signal_count(&self) -> u32 {
        self.shared.signal_count
    }

    /// The signal the device barrier uses (the last one).
    pub fn barrier_signal(&self) -> u32 {
        self.shared.signal_count - 1
    }

    /// Counters.
    pub fn counter_count(&self) -> u32 {
        self.shared.counter_count
    }

    /// Windows registered so far.
    pub fn window_count(&self) -> u32 {
        self.shared.windows.read().unwrap_or_else(|e| e.into_inner()).len() as u32
    }

    /// The placement the communicator was built with.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The underlying communicator (host collectives between device work).
    pub fn communicator(&mut self) -> &mut Communicator<EngineTransport> {
        &mut self.comm
    }

    /// Registers `len` bytes at `ptr` as the next window (collective: every rank calls it, in
    /// the same order, with the same `len`). Returns the window id, the same on every rank.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be memory of `kind`, valid until [`DeviceComm::close`] returned;
    /// peers write it at any time meanwhile, so no Rust reference to it may be alive.
    #[allow(unsafe_code)]
    pub unsafe fn register_window(&mut self, ptr: *mut u8, len: usize, kind: MemoryKind) -> Result<u32, DeviceError> {
        // Safety: forwarded to the caller.
        let (handle, desc) = unsafe { self.shared.engine.register_raw(ptr, len, kind) }
            .map_err(|e| DeviceError::Register { what: format!("a window of {len} bytes"), reason: e.to_string() })?;
        self.exchange_window(handle, desc, ptr as u64, kind, None)
    }

    /// As [`DeviceComm::register_window`], in host memory the engine allocates (zeroed) and
    /// the communicator owns; read and write it with [`DeviceComm::read_window`] and
    /// [`DeviceComm::write_window`].
    pub fn alloc_window(&mut self, len: usize) -> Result<u32, DeviceError> {
        let buf = self
            .shared
            .engine
            .alloc(len)
            .map_err(|e| DeviceError::Register { what: format!("a window of {len} bytes"), reason: e.to_string() })?;
        let (handle, desc, base) = (buf.handle(), buf.descriptor(), buf.as_ptr() as u64);
        self.exchange_window(handle, desc, base, MemoryKind::Host, Some(buf))
    }

    fn exchange_window(
        &mut self,
        local: MrHandle,
        desc: MrDescriptor,
        base: u64,
        kind: MemoryKind,
        owned: Option<MrBuffer>,
    ) -> Result<u32, DeviceError> {
        let id = self.window_count();
        let result = if id as usize >= WINDOWS_MAX {
            Err(DeviceError::Config { what: format!("window {id}: at most {WINDOWS_MAX} windows") })
        } else {
            all_gather_records(&mut self.comm, &format!("window {id}"), &descriptor_record(desc.len, &desc))
                .and_then(|records| parse_descriptor_records(id, &format!("window {id}"), &records))
        };
        match result {
            Ok(peers) => {
                self.map_window_on_lanes(&peers);
                let window = Window { local, base, len: desc.len, kind, peers, owned };
                let mut windows = self.shared.windows.write().unwrap_or_else(|e| e.into_inner());
                windows.push(window);
                self.shared.window_count.store(windows.len(), Ordering::Release);
                Ok(id)
            }
            Err(e) => {
                if owned.is_none() {
                    self.shared.engine.deregister(&local);
                }
                Err(e)
            }
        }
    }

    /// Maps the new window of every peer with a lane (0 where it cannot be reached: its puts
    /// then go through the engine).
    fn map_window_on_lanes(&self, peers: &[MrDescriptor]) {
        let Some(gpu) = &self.shared.lane_gpu else { return };
        for (p, lane) in self.shared.lanes.iter().enumerate() {
            let Some(lane) = lane else { continue };
            let addr = match peers[p]
                .device
                .map(|_| self.shared.engine.map_device_region(&peers[p], gpu.ordinal() as u32))
            {
                Some(Ok(m)) => {
                    let ptr = m.ptr;
                    lane.mappings.lock().unwrap_or_else(|e| e.into_inner()).push(m);
                    ptr
                }
                Some(Err(e)) => {
                    tracing::debug!(peer = p, error = %e, "window not reachable by address: its puts go through the engine");
                    0
                }
                None => 0,
            };
            lane.windows.write().unwrap_or_else(|e| e.into_inner()).push(addr);
        }
    }

    fn owned_window<R>(&self, id: u32, f: impl FnOnce(&MrBuffer) -> R) -> Result<R, DeviceError> {
        let windows = self.shared.windows.read().unwrap_or_else(|e| e.into_inner());
        let count = windows.len() as u64;
        match windows.get(id as usize).and_then(|w| w.owned.as_ref()) {
            Some(buf) => Ok(f(buf)),
            None => Err(DeviceError::NoSuch { what: "communicator-allocated window", id: u64::from(id), count }),
        }
    }

    /// Copies bytes out of window `id` (one [`DeviceComm::alloc_window`] made).
    pub fn read_window(&self, id: u32, offset: usize, out: &mut [u8]) -> Result<(), DeviceError> {
        self.owned_window(id, |b| b.read_at(offset, out))?
            .map_err(|e| DeviceError::Memory { what: format!("window {id}: {e}") })
    }

    /// Copies bytes into window `id` (one [`DeviceComm::alloc_window`] made).
    pub fn write_window(&self, id: u32, offset: usize, data: &[u8]) -> Result<(), DeviceError> {
        self.owned_window(id, |b| b.write_at(offset, data))?
            .map_err(|e| DeviceError::Memory { what: format!("window {id}: {e}") })
    }

    /// Window `id` on this rank: its address, length and kind of memory.
    pub fn window_info(&self, id: u32) -> Result<(u64, u64, MemoryKind), DeviceError> {
        let windows = self.shared.windows.read().unwrap_or_else(|e| e.into_inner());
        let count = windows.len() as u64;
        windows.get(id as usize).map(|w| (w.base, w.len, w.kind)).ok_or(DeviceError::NoSuch {
            what: "window",
            id: u64::from(id),
            count,
        })
    }

    /// A producer that writes descriptors into ring `ring` as a GPU thread would (host
    /// placement only).
    pub fn host_producer(&self, ring: usize) -> Result<HostProducer, DeviceError> {
        let r = self.ring(ring)?;
        HostProducer::new(r.clone(), self.producer_timeout, self.ring_full_events.clone())
    }

    fn ring(&self, ring: usize) -> Result<&Arc<Ring>, DeviceError> {
        self.rings.get(ring).ok_or(DeviceError::NoSuch {
            what: "ring",
            id: ring as u64,
            count: self.rings.len() as u64,
        })
    }

    /// Ring `ring`'s control words: `(consumed, completed, error)`.
    pub fn ring_control(&self, ring: usize) -> Result<(u64, u64, u64), DeviceError> {
        let r = self.ring(ring)?;
        Ok((
            r.consumed().load(Ordering::Acquire),
            r.completed().load(Ordering::Acquire),
            r.error().load(Ordering::Acquire),
        ))
    }

    /// Waits until ring `ring` completed at least `tickets` tickets; the completed count
    /// reached, or an error naming the ring on timeout.
    pub fn wait_completed(&self, ring: usize, tickets: u64, timeout: Duration) -> Result<u64, DeviceError> {
        let r = self.ring(ring)?;
        let deadline = Instant::now() + timeout;
        loop {
            let done = r.completed().load(Ordering::Acquire);
            if done >= tickets {
                return Ok(done);
            }
            if Instant::now() >= deadline {
                return Err(DeviceError::Config {
                    what: format!("ring {ring} completed {done} of {tickets} tickets within {timeout:?}"),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn check_signal(&self, id: u32) -> Result<(), DeviceError> {
        if id >= self.shared.signal_count {
            return Err(DeviceError::NoSuch {
                what: "signal",
                id: u64::from(id),
                count: u64::from(self.shared.signal_count),
            });
        }
        Ok(())
    }

    /// Each rank's slot of signal `id` at this rank (rank `r`'s running contribution).
    pub fn signal_slots(&self, id: u32) -> Result<Vec<u64>, DeviceError> {
        self.check_signal(id)?;
        let world = self.world();
        let mut bytes = vec![0u8; world * 8];
        let offset = id as usize * world * 8;
        match &self.local_signals {
            LocalSignals::Host(buf) => {
                buf.read_at(offset, &mut bytes).map_err(|e| DeviceError::Memory { what: e.to_string() })?
            }
            LocalSignals::Device { block, .. } => block.read(offset, &mut bytes)?,
        }
        Ok(bytes.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    fn signal_base(&self, id: u32) -> Result<u64, DeviceError> {
        let mut word = [0u8; 8];
        self.signal_bases.lock().unwrap_or_else(|p| p.into_inner()).read(id as usize * 8, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    /// The sum of every rank's slot of signal `id` here.
    fn slot_sum(&self, id: u32) -> Result<u64, DeviceError> {
        Ok(self.signal_slots(id)?.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
    }

    /// Signal `id` at this rank: the sum of every rank's slot minus the sum at its last reset.
    pub fn read_signal(&self, id: u32) -> Result<u64, DeviceError> {
        Ok(self.slot_sum(id)?.wrapping_sub(self.signal_base(id)?))
    }

    /// Resets signal `id` to zero here (records the current sum as its base).
    pub fn reset_signal(&self, id: u32) -> Result<(), DeviceError> {
        let sum = self.slot_sum(id)?;
        self.signal_bases.lock().unwrap_or_else(|p| p.into_inner()).write(id as usize * 8, &sum.to_le_bytes())
    }

    /// Waits until signal `id` is at least `at_least`; its value. Bounded by `timeout`: the
    /// error names the signal, the value reached and the ranks whose slots did not move.
    pub fn wait_signal(&self, id: u32, at_least: u64, timeout: Duration) -> Result<u64, WaitError> {
        let start = Instant::now();
        let first = self.signal_slots(id)?;
        // The base once, as the device's wait_signal reads it: it changes only by reset_signal,
        // which must not run during a wait, and on a GPU each read is a blocking copy.
        let base = self.signal_base(id)?;
        let mut polls = 0u32;
        loop {
            let value = self.slot_sum(id)?.wrapping_sub(base);
            if value >= at_least {
                return Ok(value);
            }
            if start.elapsed() >= timeout {
                let slots = self.signal_slots(id)?;
                let silent = (0..slots.len()).filter(|&r| slots[r] == first[r]).collect();
                return Err(WaitError::SignalTimeout {
                    signal: id,
                    reached: value,
                    wanted: at_least,
                    waited: start.elapsed(),
                    silent,
                    slots,
                });
            }
            polls += 1;
            if polls < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Counter `id`.
    pub fn counter(&self, id: u32) -> Result<u64, DeviceError> {
        self.shared.counters.word(id as usize).filter(|_| id < self.shared.counter_count).map_or(
            Err(DeviceError::NoSuch {
                what: "counter",
                id: u64::from(id),
                count: u64::from(self.shared.counter_count),
            }),
            |w| Ok(w.load(Ordering::Acquire)),
        )
    }

    /// Every descriptor error recorded so far (at most [`ERRORS_KEPT_MAX`]).
    pub fn errors(&self) -> Vec<DescriptorError> {
        self.shared.errors.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Takes the recorded descriptor errors, leaving none.
    pub fn take_errors(&self) -> Vec<DescriptorError> {
        std::mem::take(&mut *self.shared.errors.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A snapshot of what the proxies did.
    pub fn stats(&self) -> DeviceStats {
        let c = &self.shared.stats;
        DeviceStats {
            descriptors_executed: c.descriptors_executed.load(Ordering::Relaxed),
            bytes_put: c.bytes_put.load(Ordering::Relaxed),
            signal_writes_issued: c.signal_writes_issued.load(Ordering::Relaxed),
            signal_writes_coalesced: c.signal_writes_coalesced.load(Ordering::Relaxed),
            descriptor_errors: c.descriptor_errors.load(Ordering::Relaxed),
            ring_full_events: self.ring_full_events.load(Ordering::Relaxed),
            lane_batches: c.lane_batches.load(Ordering::Relaxed),
            lane_driver_ops: c.lane_driver_ops.load(Ordering::Relaxed),
            lane_items: c.lane_items.load(Ordering::Relaxed),
            lane_copies: c.lane_copies.load(Ordering::Relaxed),
            lane_queue_ns: c.lane_queue_ns.load(Ordering::Relaxed),
            take_ns: c.take_ns.load(Ordering::Relaxed),
            lane_retire_ns: c.lane_retire_ns.load(Ordering::Relaxed),
            lane_submit_ns: c.lane_submit_ns.load(Ordering::Relaxed),
            lane_complete_ns: c.lane_complete_ns.load(Ordering::Relaxed),
        }
    }

    /// Signal writes in flight (0 once every signal write completed at this end).
    pub fn signal_writes_in_flight(&self) -> usize {
        self.shared.signal_board.in_flight()
    }

    /// The device table as built now (host copy): every address is as GPU code sees it.
    pub fn device_table(&self) -> Result<crate::layout::DeviceTable, DeviceError> {
        Ok(self.current_table()?.0)
    }

    /// The device address of the device table (device memory on a GPU, host memory on a
    /// host placement) to pass to kernels. Rebuilt when windows were registered since the last
    /// call; earlier tables stay valid until [`DeviceComm::close`].
    pub fn device_table_ptr(&self) -> Result<u64, DeviceError> {
        Ok(self.current_table()?.1)
    }

    fn current_table(&self) -> Result<(crate::layout::DeviceTable, u64), DeviceError> {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let windows = self.shared.windows.read().unwrap_or_else(|e| e.into_inner());
        if tables.last().map(|t| t.window_count) != Some(windows.len()) {
            let signals = match &self.local_signals {
                LocalSignals::Host(b) => b.as_ptr() as u64,
                LocalSignals::Device { block, .. } => block.device_addr(),
            };
            let inputs = crate::table::TableInputs {
                rank: self.shared.rank,
                world: self.shared.world,
                signal_count: self.shared.signal_count,
                counter_count: self.shared.counter_count,
                rings: self.rings.iter().map(|r| r.device()).collect(),
                windows: windows.iter().map(|w| (w.base, w.len)).collect(),
                readable_windows: readable_windows(&self.placement, windows.iter().map(|w| w.kind)),
                peer_bases: (0..windows.len())
                    .map(|w| {
                        self.lane_addresses(|l| {
                            l.windows.read().unwrap_or_else(|e| e.into_inner()).get(w).copied().unwrap_or(0)
                        })
                    })
                    .collect(),
                peer_signals: self.lane_addresses(|l| l.signal_slots),
                signals,
                signal_bases: self.signal_bases.lock().unwrap_or_else(|p| p.into_inner()).device_addr(),
                counters: self.shared.counters.device_addr(),
                barrier_epoch: self.barrier_epoch.device_addr(),
            };
            tables.push(TableMemory::build(&self.placement, &inputs)?);
        }
        let t = tables.last().expect("built above");
        Ok((t.table, t.device_addr()))
    }

    /// One address per peer from its lane (0 for a peer without one).
    fn lane_addresses(&self, of: impl Fn(&PeerLane) -> u64) -> Vec<u64> {
        self.shared.lanes.iter().map(|l| l.as_ref().map_or(0, &of)).collect()
    }

    /// Stops the proxies (after draining what is in flight, bounded by the close drain),
    /// deregisters the windows and the signal slots. Close after a barrier that follows every
    /// rank's last device work, and free a window's memory only after that: a peer's engine
    /// writes into this rank fail once it closed, but a peer's stream lane copies by address
    /// (its mapping of the window, checked when the window was registered), so a put still in
    /// flight from a peer that skipped the barrier lands in the window's memory whatever it has
    /// become.
    pub fn close(mut self) -> Result<(), DeviceError> {
        self.shutdown();
        Ok(())
    }

    fn shutdown(&mut self) {
        for p in &mut self.proxies {
            p.stop();
        }
        self.proxies.clear();
        let engine = self.shared.engine.clone();
        for w in self.shared.windows.write().unwrap_or_else(|e| e.into_inner()).drain(..) {
            if w.owned.is_none() {
                engine.deregister(&w.local);
            }
        }
        if let LocalSignals::Device { handle, .. } = &self.local_signals {
            engine.deregister(handle);
        }
    }
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The stream lane to `peer` (see `lane/`; `aside`: its second stream for stores made now),
/// if GPU `gpu` reaches its signal slots by
/// address and the driver accepts a stream store into them: probed once by storing this rank's
/// current contribution (0: nothing was signalled yet) into its own slot of signal 0 there.
fn open_lane(engine: &Engine, gpu: &Gpu, slots: &MrDescriptor, rank: u32, aside: bool) -> Option<PeerLane> {
    let why_not = |e: String| {
        tracing::debug!(peer = %slots.engine.0, error = %e, "no stream lane to this peer: its descriptors go through the engine");
        None
    };
    let mapping = match engine.map_device_region(slots, gpu.ordinal() as u32) {
        Ok(m) => m,
        Err(e) => return why_not(e.to_string()),
    };
    let stream = match Stream::new(gpu) {
        Ok(s) => s,
        Err(e) => return why_not(e.to_string()),
    };
    let own_slot_of_signal_0 = mapping.ptr + u64::from(rank) * 8;
    let probe = gpu
        .bind()
        .and_then(|()| stream.write_value_u64(DevicePtr(own_slot_of_signal_0), 0))
        .and_then(|()| stream.synchronize());
    if let Err(e) = probe {
        return why_not(format!("a stream store into its signal slots failed: {e}"));
    }
    Some(PeerLane {
        streams: Mutex::new(LaneStreams::new(stream, aside)),
        signal_slots: mapping.ptr,
        windows: RwLock::new(Vec::new()),
        mappings: Mutex::new(vec![mapping]),
    })
}

/// `DeviceTable::readable_windows` for windows of `kinds`, in id order: the windows in this
/// placement's GPU's own memory (the first 32). Host windows are left out even when page-locked:
/// nothing here says a GPU thread may load from them, and a load from pageable memory faults.
fn readable_windows(placement: &Placement, kinds: impl Iterator<Item = MemoryKind>) -> u32 {
    let gpu = match placement {
        Placement::Gpu(gpu) => Some(gpu.ordinal() as u32),
        Placement::Host => None,
    };
    readable_bits(gpu, kinds)
}

/// The bits of [`readable_windows`] for the GPU of ordinal `gpu` (none: host placement).
fn readable_bits(gpu: Option<u32>, kinds: impl Iterator<Item = MemoryKind>) -> u32 {
    let Some(mine) = gpu else { return 0 };
    kinds.take(32).enumerate().fold(0, |bits, (w, kind)| match kind {
        MemoryKind::CudaDevice { ordinal } if ordinal == mine => bits | (1 << w),
        _ => bits,
    })
}

/// Host memory the proxy writes small values from (signal values, `put_value`s). On a GPU it is
/// page-locked once, here, for that GPU's copy engines, so each 8-byte copy into a peer's device
/// memory is a DMA rather than a pass through the driver's staging buffer; page-locking
/// synchronises with the device, so it is done before any kernel runs, never on the data path.
/// (On the 2xH200 host it did not change the kernel-to-kernel ping-pong, whose 1.19 ms one way
/// has another cause: docs/results/2026-11-26-device-api.md.)
fn source_cells(
    engine: &accord_engine::Engine,
    placement: &Placement,
    len: usize,
) -> Result<accord_engine::MrBuffer, accord_engine::RegisterError> {
    match placement {
        Placement::Host => engine.alloc(len),
        Placement::Gpu(gpu) => {
            let cells = engine.alloc_shared(len)?;
            engine.pin_shared(&cells, gpu.ordinal() as u32)?;
            Ok(cells)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_comm_can_move_between_threads_and_its_state_is_shared_safely() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<DeviceComm>();
        send_sync::<Shared>();
    }

    #[test]
    fn only_this_gpus_own_windows_are_marked_readable() {
        let kinds = [
            MemoryKind::CudaDevice { ordinal: 1 },
            MemoryKind::Host,
            MemoryKind::CudaDevice { ordinal: 0 },
            MemoryKind::CudaDevice { ordinal: 1 },
        ];
        assert_eq!(readable_bits(Some(1), kinds.into_iter()), 0b1001);
        assert_eq!(readable_bits(None, kinds.into_iter()), 0, "host placement: no GPU reads");
        let many = std::iter::repeat_n(MemoryKind::CudaDevice { ordinal: 0 }, 40);
        assert_eq!(readable_bits(Some(0), many), u32::MAX, "windows 32 and up have no bit");
    }

    #[test]
    fn bad_configurations_are_refused_naming_the_value() {
        let bad = [
            DeviceCommConfig { rings: 0, ..DeviceCommConfig::default() },
            DeviceCommConfig { rings: RINGS_MAX + 1, ..DeviceCommConfig::default() },
            DeviceCommConfig { user_signals: SIGNALS_MAX, ..DeviceCommConfig::default() },
            DeviceCommConfig { counters: 0, ..DeviceCommConfig::default() },
            DeviceCommConfig { slot_count: 12, ..DeviceCommConfig::default() },
            DeviceCommConfig { descriptors_per_turn: 0, ..DeviceCommConfig::default() },
        ];
        for config in bad {
            assert!(matches!(config.validate(), Err(DeviceError::Config { .. })), "{config:?}");
        }
        assert!(DeviceCommConfig::default().validate().is_ok());
    }
}
