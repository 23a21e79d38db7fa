//! The [`Engine`]: construction, memory registration, peers, immediates, statistics, shutdown.
//! Transfers (`write`, `write_paged`, `scatter`, `send`, `barrier`) live in `ops`.

pub(crate) mod control;
mod device;
mod device_paths;
mod device_pieces;
mod lane_outages;
mod ops;
#[cfg(test)]
mod paged_host_cost;
pub(crate) mod part;
mod register_many;
pub(crate) mod route;
pub(crate) mod shared;

pub use ops::{
    PagedWriteOp, ScatterDst, StridedPagedWriteOp, WriteOp, PAGES_PER_WRITE_MAX, SCATTER_DESTINATIONS_MAX,
    SHARD_ALIGN_BYTES,
};
pub use register_many::RawBuffer;
pub use route::read::{
    PagedReadOp, ReadOp, ReadStats, READ_ASSEMBLIES_MAX, READ_ASSEMBLY_FRAMES_MAX, READ_DST_INFOS_KEPT,
    READ_FLOOR_BYTES_PER_SEC, READ_PIECES_PER_REQUEST_MAX, READ_REQUESTS_IN_FLIGHT_MAX, READ_SERVED_REMEMBERED,
    READ_WRITE_BACKS_QUEUED_MAX, READ_WRITE_BACK_RUNS_QUEUED_MAX,
};

use crate::address::{EngineAddress, EngineId, MrDescriptor};
use crate::completion::{run_completion_thread, Job, COMPLETION_JOBS_MAX};
use crate::config::EngineConfig;
use crate::error::{BuildError, RegisterError, SubmitError};
use crate::imm::{ImmCounter, ImmTable};
use crate::memory::{random_u64, Allocation, MemoryKind, MrBuffer, MrHandle, Region, RegionTable, REGION_BYTES_MAX};
use crate::recv::{RecvHandler, RecvMessage, RecvPool};
use crate::worker::{LaneStats, Worker};
use accord_net::fault::{FaultControl, FaultInjector, FaultStats};
use accord_net::shm::{ShmConfig, ShmDatapath};
use accord_net::udp::{UdpConfig, UdpDatapath};
use accord_net::Datapath;
use accord_proto::{Endpoint, RegionKey};
use part::Command;
use shared::{Lane, Shared, PEERS_MAX, SUBMISSIONS_QUEUED_MAX};
use std::collections::HashMap;
use std::net::{IpAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Refuses an engine allocation of no bytes or more than a region may hold.
fn check_alloc_len(len: usize) -> Result<(), RegisterError> {
    if len == 0 || len as u64 > REGION_BYTES_MAX {
        return Err(RegisterError::BadLength { len: len as u64, max: REGION_BYTES_MAX });
    }
    Ok(())
}

/// The control region: barrier immediates land there, and the landing rendezvous' messages,
/// which workers hand to [`landing`] instead of placing (the memory only backs same-process
/// writes, which skip the worker).
fn control_region(key: RegionKey) -> Result<Region, BuildError> {
    let memory =
        Arc::new(Allocation::new(control::CONTROL_MESSAGE_BYTES).map_err(|e| BuildError::Invalid(e.to_string()))?);
    let keep: crate::memory::MemoryOwner = memory.clone();
    let len = control::CONTROL_MESSAGE_BYTES as u64;
    Ok(Region { base: memory.base(), len, key, keep: Some(keep), device: None, streamed: false })
}

/// Builds an [`Engine`]; every setting has an `ACCORD_*` override (see
/// [`EngineConfig::with_overrides_from`]) applied at [`EngineBuilder::build`].
#[derive(Clone, Debug, Default)]
pub struct EngineBuilder {
    config: EngineConfig,
    ignore_env: bool,
    /// Whether [`EngineBuilder::workers_per_nic`] chose the count: it then stands over the
    /// count derived from a launcher's rank count (`ACCORD_WORKERS_PER_NIC` still wins).
    workers_chosen: bool,
}

impl EngineBuilder {
    /// Starts from a whole configuration.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }
    /// Local IP of each NIC (one UDP datapath per NIC and worker).
    pub fn nics(mut self, ips: impl IntoIterator<Item = IpAddr>) -> Self {
        self.config.nics = ips.into_iter().collect();
        self
    }
    /// Worker threads per NIC.
    pub fn workers_per_nic(mut self, count: usize) -> Self {
        self.config.workers_per_nic = count;
        self.workers_chosen = true;
        self
    }
    /// Paths (sockets, entropy values) per worker.
    pub fn paths(mut self, count: u16) -> Self {
        self.config.paths_per_worker = count;
        self
    }
    /// Congestion control (parse a name with `str::parse`: `cubic`, `swift`, `eqds`, `fixed`).
    pub fn congestion_control(mut self, cc: accord_proto::cc::CcKind) -> Self {
        self.config.cc = cc;
        self
    }
    /// Send to same-process peers over the network (benchmarks, tests).
    pub fn force_network(mut self, force: bool) -> Self {
        self.config.force_network = force;
        self
    }
    /// A connection with data outstanding and no acknowledgement for this long fails over.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.config.idle_timeout = timeout;
        self
    }
    /// Writes at least this long are split across lanes.
    pub fn shard_bytes_min(mut self, bytes: u64) -> Self {
        self.config.shard_bytes_min = bytes;
        self
    }
    /// Injects faults on every NIC (tests, benchmarks); seeded by `seed`.
    pub fn fault_injection(mut self, fault: accord_net::fault::FaultConfig, seed: u64) -> Self {
        self.config.fault = Some(fault);
        self.config.fault_seed = seed;
        self
    }
    /// How long a worker awaiting traffic polls before sleeping (zero: sleep at once);
    /// `ACCORD_AWAIT_POLL_US` still overrides it.
    pub fn await_poll(mut self, poll: Duration) -> Self {
        self.config.await_poll = poll;
        self
    }
    /// Large writes to other processes of this host pulled by the receiver (default off).
    pub fn cma(mut self, on: bool) -> Self {
        self.config.cma = on;
        self
    }
    /// How long a thread waiting on a transfer or an immediate counter polls before it sleeps.
    pub fn wait_spin(mut self, spin: Duration) -> Self {
        self.config.wait_spin = spin;
        self
    }
    /// The CUDA context the copy-engine route copies in (see [`crate::DeviceContext`]);
    /// `ACCORD_DEVICE_CONTEXT` overrides it.
    pub fn device_context(mut self, context: crate::DeviceContext) -> Self {
        self.config.device_context = context;
        self
    }

    /// Shared-memory rings for same-host peers (`enabled: false` keeps them on UDP).
    pub fn shm(mut self, shm: ShmConfig) -> Self {
        self.config.shm = shm;
        self
    }
    /// How long a shared-memory receiver polls its rings before it sleeps; `ACCORD_SHM_SPIN_US`
    /// still overrides it. A later [`EngineBuilder::shm`] replaces the whole shared-memory
    /// configuration, this included.
    pub fn shm_spin(mut self, spin: Duration) -> Self {
        self.config.shm.spin = spin;
        self
    }

    /// Data bytes of each shared-memory ring this engine creates (a power of two in
    /// 256 KiB..=1 GiB, checked at build); `ACCORD_SHM_RING_BYTES` still overrides it. A later
    /// [`EngineBuilder::shm`] replaces the whole shared-memory configuration, this included.
    pub fn shm_ring_bytes(mut self, bytes: usize) -> Self {
        self.config.shm.ring_bytes = bytes;
        self
    }

    /// Ignores `ACCORD_*` environment overrides (tests that must not be affected).
    pub fn ignore_env(mut self) -> Self {
        self.ignore_env = true;
        self
    }

    /// The configuration with the `ACCORD_*` overrides read through `lookup` (none with
    /// [`EngineBuilder::ignore_env`]). A worker count chosen here stands over the one sized from
    /// a launcher's rank count; `ACCORD_WORKERS_PER_NIC` stands over both.
    pub(crate) fn configured(self, lookup: impl Fn(&str) -> Option<String>) -> Result<EngineConfig, BuildError> {
        if self.ignore_env {
            return Ok(self.config);
        }
        let chosen = self.workers_chosen.then_some(self.config.workers_per_nic);
        let knob_set = lookup("ACCORD_WORKERS_PER_NIC").is_some();
        let mut config = self.config.with_overrides_from(lookup)?;
        if let (Some(count), false) = (chosen, knob_set) {
            config.workers_per_nic = count;
        }
        Ok(config)
    }

    /// Opens the NICs, starts the workers and the completion thread.
    pub fn build(self) -> Result<Engine, BuildError> {
        // A misspelt or renamed ACCORD_* variable would otherwise be ignored without a word.
        accord_knobs::warn_unknown_once();
        let config = self.configured(|n| std::env::var(n).ok())?;
        config.validate()?;
        Engine::start(config)
    }
}

/// The TransferEngine: registered memory, one-sided writes with immediates, two-sided sends,
/// barriers, over worker threads (one per NIC and worker index). Cheap to share: all methods
/// take `&self`. Dropping it stops the workers; unfinished transfers fail with `ShutDown`.
pub struct Engine {
    metrics_addr: Option<std::net::SocketAddr>,
    shared: Arc<Shared>,
    address: EngineAddress,
    threads: Mutex<Vec<JoinHandle<()>>>,
    completion_thread: Mutex<Option<JoinHandle<()>>>,
    fault_controls: Vec<(usize, Arc<FaultControl>)>,
    barrier_seen: Mutex<HashMap<u32, u64>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("address", &self.address).finish_non_exhaustive()
    }
}

/// Statistics of an engine, read at run time.
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    /// Per lane (NIC x worker), in lane order.
    pub lanes: Vec<LaneStats>,
    /// Fault injector counters per lane (empty without injection).
    pub faults: Vec<FaultStats>,
    /// Immediates dropped because the counter table was full.
    pub imm_overflow: u64,
}

impl EngineStats {
    /// Datagrams that could not be attributed (malformed, unknown connection, bad token,
    /// failed end-to-end check), all lanes: garbage sent at the engine's ports ends up here.
    pub fn datagrams_dropped(&self) -> u64 {
        self.lanes
            .iter()
            .map(|l| {
                let e = &l.endpoint;
                e.malformed + e.unknown_connection + e.bad_token + e.bad_checksum + e.integrity_mismatch + e.bad_tag
            })
            .sum()
    }

    /// Datagrams dropped by the end-to-end check (corrupted on the way), all lanes.
    pub fn bad_checksums(&self) -> u64 {
        self.lanes.iter().map(|l| l.endpoint.bad_checksum + l.endpoint.integrity_mismatch).sum()
    }
    /// Datagrams whose MAC tag failed (forged, corrupted, or another connection's), all lanes;
    /// only the authenticated mode (`ACCORD_INTEGRITY=mac`) counts them.
    pub fn bad_tags(&self) -> u64 {
        self.lanes.iter().map(|l| l.endpoint.bad_tag).sum()
    }
    /// Wake datagrams sent to workers that had said they sleep, all lanes.
    pub fn wakes(&self) -> u64 {
        self.lanes.iter().map(|l| l.wakes).sum()
    }
    /// Doorbells rung for sleeping shared-memory consumers of peers, all lanes.
    pub fn shm_doorbells(&self) -> u64 {
        self.lanes.iter().filter_map(|l| l.shm).map(|s| s.doorbells_sent).sum()
    }
    /// Datagrams sent through shared-memory rings, all lanes.
    pub fn shm_datagrams_sent(&self) -> u64 {
        self.lanes.iter().filter_map(|l| l.shm).map(|s| s.tx_datagrams).sum()
    }
    /// Parts moved to another lane after a connection failed.
    pub fn failovers(&self) -> u64 {
        self.lanes.iter().map(|l| l.failovers).sum()
    }
    /// Packets retransmitted on live connections.
    pub fn retransmits(&self) -> u64 {
        self.lanes.iter().map(|l| l.retransmits).sum()
    }
    /// Packets declared lost and then acknowledged after all, summed over lanes: timeouts that
    /// fired on late acknowledgements (each teaches its connection a longer RTO).
    pub fn spurious_losses(&self) -> u64 {
        self.lanes.iter().map(|l| l.spurious_losses).sum()
    }
}

impl Engine {
    /// A builder with the defaults of [`EngineConfig`].
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    fn start(config: EngineConfig) -> Result<Engine, BuildError> {
        let id = EngineId(random_u64());
        let mut datapaths: Vec<(usize, usize, Box<dyn Datapath>)> = vec![];
        let mut fault_controls = vec![];
        let mut nic_addrs = vec![];
        for (nic, ip) in config.nics.iter().enumerate() {
            let mut workers = vec![];
            for worker in 0..config.workers_per_nic {
                let udp =
                    UdpConfig::default().with_env_overrides().map_err(|source| BuildError::Datapath { nic, source })?;
                let udp = UdpConfig { ip: *ip, path_count: config.paths_per_worker, base_port: 0, ..udp };
                let dp = UdpDatapath::bind(udp).map_err(|source| BuildError::Datapath { nic, source })?;
                let addrs: Vec<_> = (0..dp.path_count()).filter_map(|p| dp.local_addr(p)).collect();
                workers.push(addrs);
                // Always wrapped: when disabled it refuses peers' offers instead of letting them
                // reach the protocol as malformed datagrams.
                let dp =
                    ShmDatapath::new(dp, config.shm.clone()).map_err(|source| BuildError::Datapath { nic, source })?;
                let dp: Box<dyn Datapath> = match &config.fault {
                    Some(f) => {
                        let seed = config.fault_seed.wrapping_add((nic * 1000 + worker) as u64);
                        let fi = FaultInjector::new(dp, f.clone(), seed)
                            .map_err(|source| BuildError::Datapath { nic, source })?;
                        fault_controls.push((nic, fi.control()));
                        Box::new(fi)
                    }
                    None => Box::new(dp),
                };
                datapaths.push((nic, worker, dp));
            }
            nic_addrs.push(workers);
        }
        let waker = UdpSocket::bind((config.nics[0], 0)).map_err(BuildError::Thread)?;
        let waker_addr = waker.local_addr().map_err(BuildError::Thread)?;
        let (jobs, jobs_rx) = sync_channel(COMPLETION_JOBS_MAX);
        let mut receivers = vec![];
        let mut lanes = vec![];
        for (i, (nic, worker, _)) in datapaths.iter().enumerate() {
            let (tx, rx) = sync_channel(SUBMISSIONS_QUEUED_MAX);
            receivers.push(rx);
            lanes.push(Lane {
                nic: *nic,
                worker: *worker,
                commands: tx,
                sleeping: AtomicBool::new(false),
                wakes_sent: std::sync::atomic::AtomicU64::new(0),
                wake_target: nic_addrs[*nic][*worker][0],
                expected: std::sync::atomic::AtomicUsize::new(0),
            });
            let _ = i;
        }
        let mut table = RegionTable::default();
        let control_key = RegionKey(random_u64());
        let control_id = table.insert(control_region(control_key)?).map_err(|e| BuildError::Invalid(e.to_string()))?;
        let control =
            MrDescriptor { engine: id, region: control_id.0, key: control_key.0, len: 0, device: None, shared: None };
        let address = EngineAddress {
            id,
            nics: nic_addrs,
            host: crate::address::this_host().to_string(),
            pid: std::process::id(),
            start_ticks: accord_net::pidfd::own_start_ticks(),
            control,
        };
        let private_contexts = config.private_device_contexts();
        let lane_count = lanes.len();
        let shared = Arc::new(Shared {
            id,
            control,
            config: config.clone(),
            epoch: std::time::Instant::now(),
            regions: Arc::new(RwLock::new(table)),
            imms: ImmTable::new(config.wait_spin),
            recv: RecvPool::default(),
            jobs,
            lanes,
            waker,
            waker_addr,
            peers: RwLock::new(HashMap::new()),
            dead_lanes: Mutex::new(lane_outages::LaneOutages::default()),
            lane_outages_any: AtomicBool::new(false),
            next_lane: AtomicUsize::new(0),
            tags: crate::tags::TagSource::new(random_u64()),
            seen_tags: Default::default(),
            landing: route::landing::state::Landing::new(Box::new(move |ordinal, slot_bytes, slots| {
                crate::device::cuda_staging::open_cuda_landing(ordinal, slot_bytes, slots, private_contexts)
            })),
            cma: route::cma::state::Cma::new(id),
            liveness: Default::default(),
            read: route::read::ReadState::default(),
            local_copies: route::memcpy::pool::LocalCopies::new(lane_count),
            devices: device_paths::DevicePaths::default(),
        });
        let completion_poll = config.await_poll;
        let completion_thread = std::thread::Builder::new()
            .name("accord-completion".into())
            .spawn(move || run_completion_thread(jobs_rx, completion_poll))
            .map_err(BuildError::Thread)?;
        let mut threads = vec![];
        let control = control_routes();
        for (lane, ((nic, worker, dp), rx)) in datapaths.into_iter().zip(receivers).enumerate() {
            let ep = Endpoint::new(config.endpoint_config(), random_u64())
                .map_err(|e| BuildError::Invalid(e.to_string()))?;
            let w = Worker::new(lane, shared.clone(), rx, dp, ep, control.clone())
                .map_err(|source| BuildError::Datapath { nic, source })?;
            let t = std::thread::Builder::new()
                .name(format!("accord-w{nic}.{worker}"))
                .spawn(move || w.run())
                .map_err(BuildError::Thread)?;
            threads.push(t);
        }
        let weak = Arc::downgrade(&shared);
        let watcher = std::thread::Builder::new()
            .name("accord-liveness".into())
            .spawn(move || crate::liveness::run(weak))
            .map_err(BuildError::Thread)?;
        threads.push(watcher);
        if let Some(path) = &config.trace_file {
            crate::telemetry::enable_trace(path.clone());
        }
        let mut metrics_addr = None;
        if let Some(addr) = &config.metrics_addr {
            let (bound, thread) =
                crate::telemetry::start_metrics_server(addr, Arc::downgrade(&shared)).map_err(BuildError::Invalid)?;
            tracing::info!(%bound, "metrics endpoint up");
            metrics_addr = Some(bound);
            threads.push(thread);
        }
        shared::register_local(&shared);
        tracing::debug!(
            engine = id.0,
            lanes = threads.len(),
            shm = shared.config.shm.enabled,
            cma = shared.config.cma,
            "engine started"
        );
        Ok(Engine {
            metrics_addr,
            shared,
            address,
            threads: Mutex::new(threads),
            completion_thread: Mutex::new(Some(completion_thread)),
            fault_controls,
            barrier_seen: Mutex::new(HashMap::new()),
        })
    }

    /// This engine's identity.
    pub fn id(&self) -> EngineId {
        self.shared.id
    }

    /// What a peer needs to reach this engine (serialise with
    /// [`EngineAddress::to_string_compact`]).
    pub fn address(&self) -> EngineAddress {
        self.address.clone()
    }

    /// The configuration in effect (after environment overrides).
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Introduces a peer so writes to its descriptors can reach it. Connections open lazily on
    /// the first transfer. Same-process peers need no introduction for writes.
    pub fn add_peer(&self, address: &EngineAddress) -> Result<(), SubmitError> {
        let mut peers = self.shared.peers.write().unwrap();
        if peers.len() >= PEERS_MAX && !peers.contains_key(&address.id) {
            return Err(SubmitError::Invalid(format!("{PEERS_MAX} peers known already")));
        }
        if address.nics.iter().any(|n| n.is_empty() || n.iter().any(Vec::is_empty)) || address.nics.is_empty() {
            return Err(SubmitError::Invalid("peer address lists a NIC or worker without paths".into()));
        }
        let known = peers.insert(address.id, address.clone()).is_some_and(|old| old == *address);
        drop(peers);
        if !known {
            tracing::debug!(peer = address.id.0, pid = address.pid, nics = address.nics.len(), "peer added");
        }
        // A peer on this host gets its rings now, so its first transfer already finds them.
        // (Same-process peers use memcpy unless the network is forced.)
        let same_process = address.pid == std::process::id() && !self.shared.config.force_network;
        if !known && !same_process && self.shared.config.shm.enabled && self.shared.peer_on_this_host(address.id) {
            for lane in 0..self.shared.lanes.len() {
                let _ = self.shared.send_command(lane, Command::OfferShm(address.id));
            }
        }
        // Its process is watched, so its exit fails its work at once.
        if !known && !same_process && self.shared.config.pidfd && self.shared.peer_on_this_host(address.id) {
            self.shared.liveness.watch_process(address.id, address.pid, address.start_ticks);
        }
        // And the pull route asks to be verified now, so large writes find it ready.
        if !known && address.pid != std::process::id() && self.shared.config.cma {
            route::cma::introduce(&self.shared, address.id);
        }
        Ok(())
    }

    /// Allocates `len` zeroed, page-aligned bytes and registers them.
    pub fn alloc(&self, len: usize) -> Result<MrBuffer, RegisterError> {
        check_alloc_len(len)?;
        self.register_allocation(Allocation::new(len)?, len, None)
    }

    /// As [`Engine::alloc`], in a shared-memory file (under `ACCORD_SHM_DIR`, default
    /// `/dev/shm`) that a peer on this host may map: its descriptor carries
    /// [`crate::SharedHostInfo`], and a same-host peer writing into it from device memory then
    /// has its GPU's copy engine write straight into these pages (one DMA, no staging, no
    /// datagrams; `ACCORD_DEVICE_SHARED_HOST`). Every other writer writes it as ordinary memory.
    /// Copies between it and this process's GPUs page-lock it on first use.
    pub fn alloc_shared(&self, len: usize) -> Result<MrBuffer, RegisterError> {
        check_alloc_len(len)?;
        let (alloc, info) = Allocation::new_shared(&self.shared.config.shm.dir, self.id(), len)?;
        self.register_allocation(alloc, len, Some(info))
    }

    /// Registers an engine-owned allocation of `len` bytes as a new region (the buffer's memory
    /// lives as long as the region or the buffer, whichever is longer).
    fn register_allocation(
        &self,
        alloc: Allocation,
        len: usize,
        shared: Option<crate::SharedHostInfo>,
    ) -> Result<MrBuffer, RegisterError> {
        let alloc = Arc::new(alloc);
        let key = RegionKey(random_u64());
        let keep: crate::memory::MemoryOwner = alloc.clone();
        let region =
            Region { base: alloc.base(), len: len as u64, key, keep: Some(keep), device: None, streamed: false };
        let id = self.shared.regions.write().unwrap().insert(region)?;
        let handle = MrHandle { engine: self.id(), region: id, len: len as u64 };
        let descriptor =
            MrDescriptor { engine: self.id(), region: id.0, key: key.0, len: len as u64, device: None, shared };
        Ok(MrBuffer { alloc, handle, descriptor, regions: self.shared.regions.clone() })
    }

    /// Registers memory the caller owns (FFI: Python buffers, pinned memory).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes until [`Engine::deregister`]
    /// returned and every transfer that reads it completed; peers may write it at any time
    /// while registered, so no Rust reference to it may be alive meanwhile.
    // The FFI entry point: unsafe only because the caller vouches for the memory; the body
    // does no raw access (copies happen in `memory`).
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        kind: MemoryKind,
    ) -> Result<(MrHandle, MrDescriptor), RegisterError> {
        // Safety: forwarded; the caller upholds register_raw's contract.
        unsafe { self.register_raw_owned(ptr, len, kind, None) }
    }

    /// As [`Engine::register_raw`], with an `owner` that keeps the memory alive: every transfer
    /// reading the region holds a clone of it, so the memory outlives transfers still in flight
    /// after [`Engine::deregister`] (a retransmission, a failover) instead of relying on the
    /// caller to wait for them.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes for as long as `owner` (or a clone)
    /// lives, or, without an owner, as for [`Engine::register_raw`]; no Rust reference to it
    /// may be alive while it is registered.
    #[allow(unsafe_code)]
    pub unsafe fn register_raw_owned(
        &self,
        ptr: *mut u8,
        len: usize,
        kind: MemoryKind,
        owner: Option<crate::memory::MemoryOwner>,
    ) -> Result<(MrHandle, MrDescriptor), RegisterError> {
        if len == 0 || len as u64 > REGION_BYTES_MAX || ptr.is_null() {
            return Err(RegisterError::BadLength { len: len as u64, max: REGION_BYTES_MAX });
        }
        let key = RegionKey(random_u64());
        let (device, info) = match kind {
            MemoryKind::Host | MemoryKind::HostForDevice => (None, None),
            MemoryKind::CudaDevice { ordinal } => {
                let info = self.device_region_info(ptr as u64, len, ordinal)?;
                (Some(ordinal), Some(info))
            }
        };
        let streamed = kind == MemoryKind::HostForDevice;
        let region = Region { base: ptr as usize, len: len as u64, key, keep: owner, device, streamed };
        let id = self.shared.regions.write().unwrap().insert(region)?;
        let handle = MrHandle { engine: self.id(), region: id, len: len as u64 };
        Ok((
            handle,
            MrDescriptor { engine: self.id(), region: id.0, key: key.0, len: len as u64, device: info, shared: None },
        ))
    }

    /// Deregisters a region: once this returns no peer write lands in it. Returns false if it
    /// was not registered. (An [`MrBuffer`] deregisters itself when dropped.)
    pub fn deregister(&self, handle: &MrHandle) -> bool {
        handle.engine == self.id()
            && handle.region != crate::memory::CONTROL_REGION
            && self.shared.regions.write().unwrap().remove(handle.region).is_some()
    }

    /// Posts `count` receive buffers of `len` bytes for peers' sends, and sets the handler that
    /// consumes them (on the completion thread; buffers are re-posted after it returns).
    /// Returns how many were posted.
    pub fn post_recvs(
        &self,
        len: usize,
        count: usize,
        handler: impl Fn(RecvMessage<'_>) + Send + Sync + 'static,
    ) -> usize {
        let len = len.min(crate::recv::RECV_BUFFER_BYTES_MAX);
        let handler: RecvHandler = Arc::new(handler);
        self.shared.recv.post(len, count, handler)
    }

    /// The counter of writes with immediate `imm` that fully landed here.
    pub fn imm_counter(&self, imm: u32) -> ImmCounter {
        let lost = self.shared.imms.lost.clone();
        match self.shared.imms.slot(imm) {
            Some(slot) => ImmCounter::new(slot, imm, lost),
            None => {
                tracing::error!(imm, "immediate counter table full; this counter will never move");
                ImmCounter::new(ImmTable::new(Duration::ZERO).slot(imm).expect("empty table has room"), imm, lost)
            }
        }
    }

    /// Forgets the counter of `imm` whatever its value, so the table (at most
    /// [`crate::IMM_COUNTERS_MAX`] counters) has room for new immediates; returns the value it
    /// had, or None when there was none. Handles still held keep the final value.
    pub fn release_imm(&self, imm: u32) -> Option<u64> {
        self.shared.imms.release(imm)
    }

    /// Writes that landed here but were never counted because the counter table was full, as
    /// (immediate, writes lost) since the last call: the receiver's poll for lost work (their
    /// senders saw them complete). [`ImmCounter::wait_checked`] reports the same per counter.
    pub fn imm_overflows(&self) -> Vec<(u32, u64)> {
        self.shared.imms.drain_lost()
    }

    /// Waits until `count` writes with `imm` have landed (beyond those already taken), then
    /// takes them: the counter drops by `count` and is freed when it reaches zero. For
    /// immediates used as one-shot signals (collectives); don't mix with [`Engine::expect_imm`]
    /// on the same value. Fails with the value seen when `timeout` passes first.
    pub fn take_imm(&self, imm: u32, count: u64, timeout: std::time::Duration) -> Result<(), u64> {
        self.shared.imms.take(imm, count, timeout)
    }

    /// As [`Engine::take_imm`], for an immediate expected from `peer`: fails with
    /// [`crate::PeerWaitError::PeerDied`] within [`crate::liveness::WAIT_SLICE`] of `peer` being
    /// declared dead, and keeps `peer` probed while it waits (see [`crate::liveness`]).
    pub fn take_imm_from(
        &self,
        imm: u32,
        count: u64,
        timeout: std::time::Duration,
        peer: EngineId,
    ) -> Result<(), crate::PeerWaitError> {
        crate::liveness::take_imm_from(&self.shared, imm, count, timeout, peer)
    }

    /// Keeps `peer` under keepalive probes while the returned guard lives: a wait that
    /// expects something from it (a receive, a clear-to-send) holds one, so a peer that
    /// dies or goes silent is declared dead (see [`crate::liveness`]).
    pub fn watch_peer(&self, peer: EngineId) -> crate::PeerWatch {
        crate::PeerWatch::new(&self.shared, peer)
    }

    /// Why `peer` was declared dead, if it was (one atomic load while no peer died).
    pub fn peer_death(&self, peer: EngineId) -> Option<crate::PeerDeath> {
        self.shared.liveness.death(peer)
    }

    /// Every peer declared dead so far, with the reason.
    pub fn dead_peers(&self) -> Vec<(EngineId, crate::PeerDeath)> {
        self.shared.liveness.deaths()
    }

    /// Distinct immediate counters currently held.
    pub fn imm_counters_held(&self) -> usize {
        self.shared.imms.len()
    }

    /// The immediate counters held, with their values (diagnostics: a value that stays above
    /// zero was never taken or waited for).
    pub fn imm_counters(&self) -> Vec<(u32, u64)> {
        self.shared.imms.held()
    }

    /// Runs `callback(value)` on the completion thread once the counter of `imm` reaches
    /// `count` (an absolute value; at once if already reached). Returns false if too many
    /// callbacks already wait on this counter.
    pub fn expect_imm(&self, imm: u32, count: u64, callback: impl FnOnce(u64) + Send + 'static) -> bool {
        self.imm_counter(imm).expect(count, Box::new(callback), &self.shared.jobs)
    }

    /// Fault injectors' run-time controls, as (NIC index, control) per lane; empty unless
    /// built with fault injection.
    pub fn fault_controls(&self) -> &[(usize, Arc<FaultControl>)] {
        &self.fault_controls
    }

    /// Cuts every path of NIC `nic` in both directions (needs fault injection; tests use it to
    /// kill a NIC). Returns false when there is nothing to cut.
    pub fn cut_nic(&self, nic: usize) -> bool {
        let mut any = false;
        for (n, control) in &self.fault_controls {
            if *n == nic {
                for p in 0..self.shared.config.paths_per_worker {
                    any |= control.cut_path(p);
                }
            }
        }
        any
    }

    /// Blackholes every NIC of this engine, both directions, for `duration` (at most
    /// [`accord_net::fault::BLACKHOLE_MAX`]): an outage that heals by itself, as a switch
    /// reboot would (needs fault injection; tests use it). Returns false when there is nothing
    /// to blackhole.
    pub fn blackhole(&self, duration: Duration) -> bool {
        for (_, control) in &self.fault_controls {
            control.blackhole_for(duration);
        }
        !self.fault_controls.is_empty()
    }

    /// Drops every datagram arriving at this engine for `duration` (at most
    /// [`accord_net::fault::BLACKHOLE_MAX`]) while its sends go out: peers receive its writes
    /// but it hears none of their acknowledgements (needs fault injection; tests use it).
    /// Returns false when there is no fault injector.
    pub fn deafen(&self, duration: Duration) -> bool {
        for (_, control) in &self.fault_controls {
            control.deafen_for(duration);
        }
        !self.fault_controls.is_empty()
    }

    /// Per-connection counters, per-path ones included, of every lane: for `peer` only, or for
    /// every connection (`None`), each with the peer it belongs to (`None` for one a peer
    /// opened and we have not used). Asks each worker; waits up to a second for each. What
    /// stuck reports and metrics read.
    pub fn connection_stats(
        &self,
        peer: Option<EngineId>,
    ) -> Vec<(usize, Option<EngineId>, accord_proto::ConnectionStats)> {
        self.shared.connection_stats(peer)
    }

    /// Where the metrics endpoint listens (`ACCORD_METRICS_ADDR`, [`EngineConfig::metrics_addr`]),
    /// when it is up.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// The Prometheus text the metrics endpoint would serve now (see [`crate::telemetry`]).
    pub fn metrics_text(&self) -> String {
        crate::telemetry::render(&self.shared)
    }

    /// Counters of every lane (asks each worker; waits up to a second for each).
    pub fn stats(&self) -> EngineStats {
        let mut stats = EngineStats {
            imm_overflow: self.shared.imms.overflow.load(Ordering::Relaxed),
            faults: self.fault_controls.iter().map(|(_, c)| c.stats()).collect(),
            ..Default::default()
        };
        for lane in 0..self.shared.lanes.len() {
            let (tx, rx) = sync_channel(1);
            if self.shared.send_command(lane, Command::Stats(tx)).is_ok() {
                let mut lane_stats = rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
                lane_stats.wakes = self.shared.lanes[lane].wakes_sent.load(Ordering::Relaxed);
                stats.lanes.push(lane_stats);
            }
        }
        stats
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        shared::unregister_local(self.shared.id);
        // Counter waits end now rather than at their timeouts: nothing will move them again.
        self.shared.imms.close();
        self.shared.liveness.stop();
        // Queued same-process copies finish first; later ones copy on their submitter.
        self.shared.local_copies.stop();
        for lane in 0..self.shared.lanes.len() {
            let _ = self.shared.send_command(lane, Command::Shutdown);
        }
        for t in self.threads.lock().unwrap().drain(..) {
            let _ = t.join();
        }
        // Reads waiting for an owner's reply: no worker is left to take it or to expire them.
        route::read::fail_all_pending(&self.shared);
        let _ = self.shared.jobs.send(Job::Stop);
        if let Err(e) = crate::telemetry::flush_trace() {
            tracing::warn!(error = %e, "could not write the trace file (ACCORD_TRACE_FILE)");
        }
        if let Some(t) = self.completion_thread.lock().unwrap().take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The routes that exchange control frames with their counterparts in peer engines, as the
/// workers look them up.
fn control_routes() -> crate::worker::control::ControlRoutes {
    crate::worker::control::ControlRoutes::default()
        .on(control::RouteTag::Landing, route::landing::deliver_control)
        .on(control::RouteTag::Pull, route::cma::serve)
        .sweep_with(route::cma::sweep)
        .on(control::RouteTag::Read, route::read::serve)
        .sweep_with(route::read::sweep)
}

#[cfg(test)]
pub(crate) mod tests;
