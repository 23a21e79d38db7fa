//! Typed configuration of an engine, its documented defaults, and every `ACCORD_*` environment
//! override in one place ([`EngineConfig::with_overrides_from`]; the knobs' docs are rows of
//! `accord-knobs`' table, `Component::Engine`).

use crate::error::BuildError;
use accord_net::fault::FaultConfig;
use accord_net::shm::ShmConfig;
use accord_proto::cc::CcKind;
use accord_proto::config::PacerOrder;
use accord_proto::path::SelectorKind;
use accord_proto::wire::Integrity;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Most NICs one engine drives.
pub const NICS_MAX: usize = 16;
/// Most worker threads per NIC.
pub const WORKERS_PER_NIC_MAX: usize = 16;
/// Largest UDP payload of one IPv4 datagram (65535 minus IP and UDP headers).
pub const UDP_PAYLOAD_BYTES_MAX: u16 = 65_507;
/// Datagram size used on non-loopback addresses: a 4 KiB payload plus the data header, the
/// MTU of the fabrics Accord targets.
pub const FABRIC_DATAGRAM_BYTES: u16 = 4096 + accord_proto::wire::DATA_HEADER_LEN as u16;
/// Datagram size used when every NIC is a loopback address: loopback's MTU is 64 KiB, so one
/// datagram carries 60 KiB and the per-packet protocol work shrinks fifteen-fold.
pub const LOOPBACK_DATAGRAM_BYTES: u16 = 60 * 1024 + accord_proto::wire::DATA_HEADER_LEN as u16;

/// The CUDA context the copy-engine route submits copies in (`ACCORD_DEVICE_CONTEXT`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DeviceContext {
    /// The device's primary context, the one the CUDA runtime (PyTorch, NCCL) shares.
    Primary,
    /// A context of the engine's own per GPU ([`accord_cuda::Gpu::open_private`]). The driver
    /// serialises calls per context, so copies here never wait behind an application thread's
    /// synchronous call in the primary context (a pageable `cudaMemcpy` waiting for a kernel).
    /// For a library that copies on a thread the application's kernels wait on, such as NCCL's
    /// proxy thread. Costs device memory per GPU (the context's own).
    Private,
}

impl std::str::FromStr for DeviceContext {
    type Err = String;
    /// `primary` or `private`, as `ACCORD_DEVICE_CONTEXT` takes them.
    fn from_str(name: &str) -> Result<Self, String> {
        match name.trim() {
            "primary" => Ok(DeviceContext::Primary),
            "private" => Ok(DeviceContext::Private),
            other => Err(format!("unknown device context {other:?}: use primary or private")),
        }
    }
}

/// Most copy streams per GPU a paged device write is spread over (`ACCORD_DEVICE_COPY_STREAMS`).
pub const DEVICE_COPY_STREAMS_MAX: usize = 16;
/// Default of `ACCORD_DEVICE_COPY_STREAMS`: one stream a paged write. Spreading over 4 or 8
/// streams (with batched 2D copies) gave no consistent gain on 2xH200 and made 2048-block KV
/// writes slower (docs/results/2026-11-26-kv-gpu.md, "2xH200, 2026-11-26"), so it is opt-in.
pub const DEVICE_COPY_STREAMS_DEFAULT: usize = 1;

/// Most receive slots per batch (a worker's; the configuration's bound on `rx_batch_slots`).
pub const RX_BATCH_SLOTS: usize = 64;

/// Default of `ACCORD_CMA_MIN_BYTES`: parts at least this long are pulled.
pub const CMA_MIN_BYTES_DEFAULT: u64 = 64 << 10;

/// How long a lane whose connection to a peer failed is avoided for that peer before it is
/// probed (the default of [`crate::EngineConfig::lane_avoid`]; see `engine/lane_outages.rs`).
pub const LANE_AVOID_AFTER_FAILURE: Duration = Duration::from_secs(30);

/// Everything an engine is built from. Construct with [`crate::Engine::builder`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Local IP of each NIC. Default one NIC on 127.0.0.1.
    pub nics: Vec<IpAddr>,
    /// Worker threads per NIC; each owns its own sockets and protocol endpoint. Default 1.
    pub workers_per_nic: usize,
    /// Paths (UDP sockets, entropy values) per worker. Default 4.
    pub paths_per_worker: u16,
    /// Congestion control (`ACCORD_CC`: `cubic`, `swift`, `eqds`, `fixed`). Default CUBIC with
    /// its default parameters. EQDS's speculative window is raised for large datagrams (see
    /// [`EngineConfig::endpoint_config`]).
    pub cc: CcKind,
    /// How a sender picks the path of each chunk (`ACCORD_PATH_SELECTOR`: `p2c`, `rr`,
    /// `recycle`). Default power-of-two choices.
    pub path_selector: SelectorKind,
    /// Which sender the receiver's EQDS credit pacer serves next (`ACCORD_PACER_ORDER`: `rr`,
    /// `srpt`). Default round robin. The simulator's EQDS results used `srpt`
    /// (docs/results/2026-11-22-eqds.md).
    pub pacer_order: PacerOrder,
    /// End-to-end check of every packet (`ACCORD_INTEGRITY`: `full`, `header`, `off`, `mac`).
    /// Default [`Integrity::Full`]: a CRC32C over header and payload, verified before anything
    /// is parsed. `mac` authenticates every packet under per-connection keys derived from the
    /// job secret (which it requires), for networks outsiders can write to. Every rank of a job
    /// must use the same. Datagrams through shared-memory rings carry a CRC of the header only.
    pub integrity: Integrity,
    /// Line rate of each NIC in Gbit/s. The receiver-driven EQDS grants credit at just under
    /// it (split evenly over the NIC's workers, each of which runs its own endpoint); the
    /// sender-driven policies ignore it. Default 100.
    pub nic_gbps: f64,
    /// Send to same-process peers over the network instead of memcpy. Default false.
    pub force_network: bool,
    /// Largest datagram, header included; 0 (default) picks [`LOOPBACK_DATAGRAM_BYTES`] when
    /// every NIC is a loopback address and [`FABRIC_DATAGRAM_BYTES`] otherwise.
    pub datagram_bytes: u16,
    /// Packets a connection may have in flight (the receiver's window); 0 (default) sizes it
    /// so a window fits half of the receiving sockets' buffers, which on loopback keeps the
    /// sender from overflowing them (a socket overflow is a loss and costs a retransmission).
    pub window_packets: u32,
    /// Writes at least this long are split into one shard per lane (NIC x worker). Default
    /// 256 KiB: on a 32-core host with 4 lanes per rank it lifted all_reduce and all_gather
    /// busbw at 1-4 MiB by 20-80% over 4 MiB (docs/results/2026-11-22-accord-vs-gloo.md).
    pub shard_bytes_min: u64,
    /// A connection with data outstanding and no acknowledgement for this long is given up;
    /// its writes move to another NIC, or to a fresh connection of their own, and are resent
    /// until [`EngineConfig::peer_dead_after`] passes without an answer (so outages shorter
    /// than that heal). A new connection's handshake gets as long. Default 5 s.
    pub idle_timeout: Duration,
    /// How long a lane whose connection to a peer failed is avoided for that peer; then its
    /// worker connects to the peer, and the lane carries parts again once that handshake
    /// succeeded. Default [`LANE_AVOID_AFTER_FAILURE`] (no variable; tests shorten it).
    pub lane_avoid: Duration,
    /// Faults to inject on every NIC (tests and benchmarks). Default none (no wrapper).
    pub fault: Option<FaultConfig>,
    /// Seed of the fault injectors. Default 1.
    pub fault_seed: u64,
    /// The job secret (`ACCORD_JOB_SECRET`, 64 hex digits): when set, connections open only
    /// between engines that prove they hold it, and an engine refuses every peer that does not
    /// (see `accord_proto::admission`). `accord launch` sets one per job. Default none.
    pub job_secret: Option<accord_proto::JobSecret>,
    /// Shared-memory rings for peers on this host (their `EngineAddress::host` equals ours).
    /// Default on, 8 MiB rings; the UDP sockets stay for setup, doorbells and fallback.
    pub shm: ShmConfig,
    /// How long a worker that awaits traffic keeps polling its queue, rings and sockets
    /// (yielding the core each turn) after its last progress before it sleeps; the completion,
    /// device-landing and staging threads poll their queues as long after their last job before
    /// they block (`backoff::recv_hot`). Default [`AWAIT_POLL_DEFAULT`], at most
    /// [`AWAIT_POLL_MAX`]; zero turns it off. See [`AWAIT_POLL_DEFAULT`] for why.
    pub await_poll: Duration,
    /// How long a user thread in [`crate::Transfer::wait`], [`crate::ImmCounter::wait`] (and the
    /// collectives' waits on immediates) polls the completion before it sleeps on a condition
    /// variable. Default [`crate::wait_spin::wait_spin_default`] of this host's cores (1 ms from
    /// 8 cores, else 50 us), at most [`crate::wait_spin::WAIT_SPIN_MAX`]; zero sleeps at once.
    pub wait_spin: Duration,
    /// Writes (shards) of at least [`EngineConfig::cma_min_bytes`] to another process of this
    /// host are pulled by the receiver with one cross-memory copy (`process_vm_readv`) instead
    /// of two through a shared-memory ring; see `engine::route::cma`. Pairs that cannot (no
    /// permission, another pid namespace) stay on the transport by themselves. Default off:
    /// on the 2xH200 host it cut the one-way latency of 64 KiB-1 MiB writes by 15-28%, but
    /// NCCL all_reduce through the plugin (64 KiB pieces) was 4-25% slower with it
    /// (docs/results/2026-11-22-nccl-plugin.md, session 4); `ACCORD_CMA=1` turns it on.
    pub cma: bool,
    /// Shortest part the pull route takes. Default [`crate::CMA_MIN_BYTES_DEFAULT`] (64 KiB).
    pub cma_min_bytes: u64,
    /// Receive slots per batch (datagrams one `recv_batch` may return), at most
    /// [`crate::RX_BATCH_SLOTS`]. 0 (default) picks by datapath: [`LENDING_RX_BATCH_SLOTS`]
    /// when shared memory lends ring entries in place (a lent datagram fills only a slot's
    /// head, so a larger batch costs no cache), otherwise as many slots as fit
    /// the worker's 512 KiB cache target (at least 8), so a copy out of a slot reads what
    /// the kernel just wrote.
    pub rx_batch_slots: usize,
    /// Device memory of peers on this host (other processes) is reached through CUDA IPC and
    /// the copy engine. Off, such peers are treated as remote: device bytes are staged through
    /// pinned host memory over the transport (tests exercise that route on one host). Default on.
    pub device_ipc: bool,
    /// Device bytes bound for a host region of a same-host peer that lives in a shared-memory
    /// file ([`crate::Engine::alloc_shared`]) go in one copy-engine copy into the writer's
    /// mapping of that file, instead of through staging and the transport. Default on.
    pub device_shared_host: bool,
    /// Workers time each phase of their loop (`LaneStats::time`) and print it and
    /// per-connection statistics to stderr every 250 ms (`ACCORD_ENGINE_DEBUG` set, whatever
    /// its value). Default false.
    pub debug_stats: bool,
    /// The CUDA context the copy-engine route submits its copies in. Default
    /// [`DeviceContext::Primary`].
    pub device_context: DeviceContext,
    /// Copy streams per GPU that a paged device write (`CopyEngine`, `CopyEngineIpc`) is spread
    /// over, its copies divided by bytes (`ACCORD_DEVICE_COPY_STREAMS`, 1..=
    /// [`DEVICE_COPY_STREAMS_MAX`]); single device writes take the streams in turn (at least
    /// [`crate::DEVICE_STREAMS_PER_GPU`]). The GPU runs streams' copies on several copy
    /// engines at once. 1: every paged write on one stream. Default
    /// [`DEVICE_COPY_STREAMS_DEFAULT`] (1: the spread was measured and gave no consistent gain).
    pub device_copy_streams: usize,
    /// A paged device write's 2D copies go in batched driver calls (`cuMemcpy3DBatchAsync`)
    /// where the driver has them (`ACCORD_DEVICE_COPY_BATCH_2D`). Default off: measured on 2xH200 it
    /// gave no consistent gain (docs/results/2026-11-26-kv-gpu.md), so it is opt-in.
    pub device_copy_batch_2d: bool,
    /// Bytes per pinned staging slot: device bytes bound for a host region of another process,
    /// or for another host, are copied into such slots and sent one slot per host write.
    /// Default [`crate::device::staging::DEVICE_STAGING_CHUNK_BYTES_DEFAULT`] (4 MiB).
    pub device_staging_chunk_bytes: u64,
    /// Pinned staging slots per engine (allocated on the first staged write); copies of later
    /// chunks overlap the sending of earlier ones as far as free slots allow. Default
    /// [`crate::device::staging::DEVICE_STAGING_CHUNKS_DEFAULT`] (8).
    pub device_staging_chunks: usize,
    /// How long a device-landing rendezvous waits for the other side (a grant, a `Done`, or a
    /// granted chunk) before failing the writer's chunk or reclaiming the receiver's slot.
    /// Default [`LANDING_TIMEOUT_DEFAULT`]; `ACCORD_DEVICE_LANDING_TIMEOUT_MS` sets it in
    /// milliseconds.
    pub device_landing_timeout: Duration,
    /// A chunk of at most 8 bytes bound for the landing route travels inside its ask, and the
    /// receiver copies it at once: one message each way instead of the rendezvous' five (ask,
    /// grant, write and its acknowledgement, landed, done). Signals, flags and `put_value`s
    /// written into another host's GPU are such chunks. Default on;
    /// `ACCORD_DEVICE_LANDING_INLINE=0` keeps every chunk on the rendezvous (the baseline the
    /// benches compare with).
    pub device_landing_inline: bool,
    /// While a wait names a peer (an immediate or message it expects, a receive posted for
    /// it), the engine sends it a zero-byte probe this often, so a peer that went silent is
    /// found even when nothing else is outstanding. Default
    /// [`KEEPALIVE_DEFAULT`]; zero turns probes off.
    pub keepalive: Duration,
    /// A probe unanswered this long declares its peer dead (sticky: its pending and later
    /// work fails at once). Default [`PEER_DEAD_DEFAULT`]. So a peer on
    /// another host that dies is reported within `keepalive + peer_dead_after`. Peers a
    /// pidfd watches are not probed (their pidfd reports their death). Also the bound on
    /// resending after an idle timeout: a transfer whose peer answered nothing this long
    /// since fails with [`crate::TransferError::PeerUnresponsive`].
    pub peer_dead_after: Duration,
    /// Watch the process of every peer on this host through a pidfd: its exit fails its work
    /// within one poll. Default on.
    pub pidfd: bool,
    /// Serve Prometheus metrics on this `host:port` (port 0 picks one). Default off.
    pub metrics_addr: Option<String>,
    /// Write a Chrome/Perfetto trace of transfers (and collective steps) to this file when the
    /// engine is dropped. Default off.
    pub trace_file: Option<std::path::PathBuf>,
}

/// Default [`crate::EngineConfig::keepalive`]: one probe a second per watched peer costs
/// nothing measurable, and bounds detection across hosts at about
/// `KEEPALIVE_DEFAULT + PEER_DEAD_DEFAULT`.
pub const KEEPALIVE_DEFAULT: Duration = Duration::from_secs(1);

/// Default [`crate::EngineConfig::peer_dead_after`]: the protocol's default idle timeout, so a
/// probe is given as long as any write is before its connection is failed.
pub const PEER_DEAD_DEFAULT: Duration = Duration::from_secs(5);

/// Default [`EngineConfig::device_landing_timeout`]: how long the landing rendezvous waits for
/// a quiet peer before it reclaims a slot or fails a chunk.
pub const LANDING_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Receive batch of a lending shared-memory datapath (see [`EngineConfig::rx_batch_slots`]):
/// 32 rather than the 8 full 64 KiB slots that fit the cache target, so a worker takes more
/// ring datagrams per call (NCCL all_reduce at 256 MiB, 2 channels: 10.36 vs 9.51 GB/s in one
/// call of run 4, docs/results/2026-11-22-nccl-plugin.md).
pub const LENDING_RX_BATCH_SLOTS: usize = 32;

/// Default of [`EngineConfig::await_poll`].
///
/// Why poll: a message through the engine crosses several threads that each may be asleep
/// (the sending worker, woken by a datagram when its command arrives; the receiving worker,
/// woken by the ring's doorbell; the same again for the acknowledgement and, in the NCCL
/// plugin, for the clear-to-send before the data). On a virtual machine one wake-up costs
/// tens of microseconds, several per message, which at 64-256 KiB messages is more than the
/// copy. A worker that awaits something (its operations are unacknowledged, it has datagrams
/// to send, or it received within this window, so the next piece of a stream is due) keeps
/// polling instead, and neither its submitters nor its ring producers need to wake it.
///
/// Why bounded: polling costs a core while it lasts. It stops this long after the worker's
/// last progress, so an idle engine (no traffic for 0.5 ms) sleeps as before, and a busy one
/// polls only between datagrams of work it is waiting for. Each turn yields the core, so on a
/// host with more threads than cores the poll does not starve the thread it waits for.
pub const AWAIT_POLL_DEFAULT: Duration = Duration::from_micros(500);
/// Longest [`EngineConfig::await_poll`] one may configure.
pub const AWAIT_POLL_MAX: Duration = Duration::from_millis(10);

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            nics: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            workers_per_nic: 1,
            paths_per_worker: 4,
            cc: CcKind::Cubic(Default::default()),
            path_selector: SelectorKind::PowerOfTwoChoices,
            pacer_order: PacerOrder::RoundRobin,
            integrity: Integrity::Full,
            nic_gbps: 100.0,
            force_network: false,
            datagram_bytes: 0,
            window_packets: 0,
            shard_bytes_min: 256 << 10,
            idle_timeout: Duration::from_secs(5),
            lane_avoid: LANE_AVOID_AFTER_FAILURE,
            fault: None,
            fault_seed: 1,
            job_secret: None,
            shm: ShmConfig::default(),
            await_poll: AWAIT_POLL_DEFAULT,
            wait_spin: crate::wait_spin::wait_spin_default(host_cores()),
            rx_batch_slots: 0,
            cma: false,
            cma_min_bytes: CMA_MIN_BYTES_DEFAULT,
            device_ipc: true,
            device_shared_host: true,
            device_context: DeviceContext::Primary,
            device_copy_streams: DEVICE_COPY_STREAMS_DEFAULT,
            device_copy_batch_2d: false,
            debug_stats: false,
            device_staging_chunk_bytes: crate::device::staging::DEVICE_STAGING_CHUNK_BYTES_DEFAULT,
            device_staging_chunks: crate::device::staging::DEVICE_STAGING_CHUNKS_DEFAULT,
            device_landing_timeout: LANDING_TIMEOUT_DEFAULT,
            device_landing_inline: true,
            keepalive: KEEPALIVE_DEFAULT,
            peer_dead_after: PEER_DEAD_DEFAULT,
            pidfd: true,
            metrics_addr: None,
            trace_file: None,
        }
    }
}

/// Most workers the automatic choice gives one engine.
pub const AUTO_WORKERS_PER_NIC_MAX: usize = 8;

/// Cores this process may run on (its affinity and cgroup quota, as the standard library reads
/// them); 1 when unknown. What worker counts and poll windows are sized from.
pub fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Workers per NIC for an engine sharing `cores` with `local_ranks` others like it: half of
/// its share of the cores, at least one, at most [`AUTO_WORKERS_PER_NIC_MAX`].
///
/// Each worker is a copy engine (one core moves a few GB/s), so more lanes carry more while
/// cores are free: on a 32-core host with 2 ranks, NCCL all_reduce at 256 MiB through the
/// plugin reached 16.4 GB/s with 8 workers against 9.9 with 4, and 12 gave no more (17.5,
/// inside that host's noise; docs/results/2026-11-22-nccl-plugin.md, run 4). Half the share,
/// not all of it: the rank's own threads (the training loop, NCCL's proxy, the CUDA driver)
/// need cores too, and workers poll while they await traffic ([`AWAIT_POLL_DEFAULT`]), so a
/// worker per core would oversubscribe the host.
pub fn workers_for_share(cores: usize, local_ranks: usize) -> usize {
    (cores / local_ranks.max(1) / 2).clamp(1, AUTO_WORKERS_PER_NIC_MAX)
}

impl EngineConfig {
    /// Applies the engine's `ACCORD_*` knobs (`accord_knobs::of(Component::Engine)`) read
    /// through `lookup` (tests pass a closure over a map), each parsed by its registered type;
    /// a bad value is an error naming the knob, the value and what it accepts.
    pub fn with_overrides_from(mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, BuildError> {
        use accord_knobs::{choice, get, is_set};
        let env: &dyn Fn(&str) -> Option<String> = &lookup;
        if let Some(list) = get::<String>(env, "ACCORD_NICS")? {
            self.nics = parse_nics(&list)?;
        }
        set(&mut self.workers_per_nic, get(env, "ACCORD_WORKERS_PER_NIC")?);
        set(&mut self.paths_per_worker, get(env, "ACCORD_PATHS")?);
        set(&mut self.cc, choice(env, "ACCORD_CC")?);
        set(&mut self.path_selector, choice(env, "ACCORD_PATH_SELECTOR")?);
        set(&mut self.pacer_order, choice(env, "ACCORD_PACER_ORDER")?);
        set(&mut self.integrity, choice(env, "ACCORD_INTEGRITY")?);
        if let Some(hex) = get::<String>(env, "ACCORD_JOB_SECRET")? {
            // The value is never echoed into the error: it is a secret.
            let secret = accord_proto::JobSecret::from_hex(&hex)
                .ok_or_else(|| BuildError::Invalid("ACCORD_JOB_SECRET must be 64 hex digits (32 bytes)".to_string()))?;
            self.job_secret = Some(secret);
        }
        set(&mut self.nic_gbps, get(env, "ACCORD_NIC_GBPS")?);
        set(&mut self.force_network, get(env, "ACCORD_FORCE_NETWORK")?);
        set(&mut self.datagram_bytes, get(env, "ACCORD_DATAGRAM_BYTES")?);
        set(&mut self.window_packets, get(env, "ACCORD_WINDOW_PACKETS")?);
        set(&mut self.shard_bytes_min, get(env, "ACCORD_SHARD_BYTES")?);
        set(&mut self.idle_timeout, get(env, "ACCORD_IDLE_TIMEOUT_MS")?);
        set(&mut self.rx_batch_slots, get(env, "ACCORD_RX_BATCH_SLOTS")?);
        set(&mut self.await_poll, get(env, "ACCORD_AWAIT_POLL_US")?);
        set(&mut self.cma, get(env, "ACCORD_CMA")?);
        set(&mut self.cma_min_bytes, get(env, "ACCORD_CMA_MIN_BYTES")?);
        set(&mut self.wait_spin, get(env, "ACCORD_WAIT_SPIN_US")?);
        set(&mut self.device_ipc, get(env, "ACCORD_DEVICE_IPC")?);
        set(&mut self.device_shared_host, get(env, "ACCORD_DEVICE_SHARED_HOST")?);
        set(&mut self.device_context, choice(env, "ACCORD_DEVICE_CONTEXT")?);
        set(&mut self.device_copy_streams, get(env, "ACCORD_DEVICE_COPY_STREAMS")?);
        set(&mut self.device_copy_batch_2d, get(env, "ACCORD_DEVICE_COPY_BATCH_2D")?);
        set(&mut self.device_staging_chunk_bytes, get(env, "ACCORD_DEVICE_STAGING_CHUNK_BYTES")?);
        set(&mut self.device_staging_chunks, get(env, "ACCORD_DEVICE_STAGING_CHUNKS")?);
        set(&mut self.device_landing_timeout, get(env, "ACCORD_DEVICE_LANDING_TIMEOUT_MS")?);
        set(&mut self.device_landing_inline, get(env, "ACCORD_DEVICE_LANDING_INLINE")?);
        set(&mut self.keepalive, get(env, "ACCORD_KEEPALIVE_MS")?);
        set(&mut self.peer_dead_after, get(env, "ACCORD_PEER_DEAD_MS")?);
        set(&mut self.pidfd, get(env, "ACCORD_PIDFD")?);
        if let Some(addr) = get::<String>(env, "ACCORD_METRICS_ADDR")? {
            self.metrics_addr = Some(addr.trim().to_string()).filter(|v| !v.is_empty());
        }
        if let Some(path) = get::<String>(env, "ACCORD_TRACE_FILE")? {
            self.trace_file = Some(std::path::PathBuf::from(path.trim())).filter(|p| !p.as_os_str().is_empty());
        }
        if let Some(p) = get(env, "ACCORD_LOSS")? {
            self.fault.get_or_insert_with(FaultConfig::default).drop = p;
        }
        if let Some(p) = get(env, "ACCORD_REORDER")? {
            self.fault.get_or_insert_with(FaultConfig::default).reorder = p;
        }
        self.debug_stats |= is_set(env, "ACCORD_ENGINE_DEBUG")?;
        self.size_workers_to_host(&lookup, host_cores());
        self.shm = self.shm.with_overrides_from(&lookup).map_err(|e| BuildError::Invalid(e.to_string()))?;
        Ok(self)
    }

    /// Unless `ACCORD_WORKERS_PER_NIC` is set, sizes the workers to this rank's share of `cores`
    /// when a launcher says how many ranks share the host ([`crate::local_ranks`]).
    pub(crate) fn size_workers_to_host(&mut self, lookup: impl Fn(&str) -> Option<String>, cores: usize) {
        if let crate::local_ranks::WorkerCountSource::Launcher { ranks, .. } =
            crate::local_ranks::worker_count_source(lookup)
        {
            self.workers_per_nic = workers_for_share(cores, ranks);
        }
    }

    /// Whether device copies go in contexts of the engine's own ([`DeviceContext::Private`]).
    pub fn private_device_contexts(&self) -> bool {
        self.device_context == DeviceContext::Private
    }

    /// Checks ranges before any thread or socket exists.
    pub fn validate(&self) -> Result<(), BuildError> {
        if self.nics.is_empty() || self.nics.len() > NICS_MAX {
            return Err(BuildError::Invalid(format!("{} NICs: give 1..={NICS_MAX} local addresses", self.nics.len())));
        }
        if self.workers_per_nic == 0 || self.workers_per_nic > WORKERS_PER_NIC_MAX {
            return Err(BuildError::Invalid(format!("workers_per_nic must be in 1..={WORKERS_PER_NIC_MAX}")));
        }
        if self.paths_per_worker == 0 || self.paths_per_worker > accord_proto::config::PATH_COUNT_MAX {
            return Err(BuildError::Invalid(format!(
                "paths_per_worker must be in 1..={}",
                accord_proto::config::PATH_COUNT_MAX
            )));
        }
        if self.datagram_bytes != 0 && self.datagram_bytes > UDP_PAYLOAD_BYTES_MAX {
            return Err(BuildError::Invalid(format!("datagram_bytes must be at most {UDP_PAYLOAD_BYTES_MAX}")));
        }
        if self.nic_gbps.is_nan() || self.nic_gbps <= 0.0 {
            return Err(BuildError::Invalid(format!("nic_gbps {} must be positive", self.nic_gbps)));
        }
        if self.wait_spin > crate::wait_spin::WAIT_SPIN_MAX {
            let max = crate::wait_spin::WAIT_SPIN_MAX;
            return Err(BuildError::Invalid(format!("wait_spin {:?} exceeds {max:?}", self.wait_spin)));
        }
        if self.await_poll > AWAIT_POLL_MAX {
            return Err(BuildError::Invalid(format!("await_poll {:?} exceeds {AWAIT_POLL_MAX:?}", self.await_poll)));
        }
        if self.rx_batch_slots > RX_BATCH_SLOTS {
            return Err(BuildError::Invalid(format!("rx_batch_slots must be at most {RX_BATCH_SLOTS}")));
        }
        if self.shard_bytes_min == 0 || self.idle_timeout.is_zero() {
            return Err(BuildError::Invalid("shard_bytes_min and idle_timeout must be non-zero".into()));
        }
        if self.integrity == Integrity::Mac && self.job_secret.is_none() {
            return Err(BuildError::Invalid(accord_proto::ConfigError::MacWithoutSecret.to_string()));
        }
        self.validate_device_staging()?;
        self.shm.validate().map_err(|e| BuildError::Invalid(e.to_string()))?;
        if let Some(f) = &self.fault {
            f.validate().map_err(|e| BuildError::Invalid(e.to_string()))?;
        }
        Ok(())
    }

    fn validate_device_staging(&self) -> Result<(), BuildError> {
        use crate::device::staging::{
            DEVICE_STAGING_CHUNKS_MAX, DEVICE_STAGING_CHUNK_BYTES_MAX, DEVICE_STAGING_CHUNK_BYTES_MIN,
            DEVICE_STAGING_POOL_BYTES_MAX,
        };
        let bytes = self.device_staging_chunk_bytes;
        if !(DEVICE_STAGING_CHUNK_BYTES_MIN..=DEVICE_STAGING_CHUNK_BYTES_MAX).contains(&bytes) {
            return Err(BuildError::Invalid(format!(
                "device_staging_chunk_bytes {bytes} must be in \
                 {DEVICE_STAGING_CHUNK_BYTES_MIN}..={DEVICE_STAGING_CHUNK_BYTES_MAX}"
            )));
        }
        let streams = self.device_copy_streams;
        if streams == 0 || streams > DEVICE_COPY_STREAMS_MAX {
            return Err(BuildError::Invalid(format!(
                "device_copy_streams {streams} must be in 1..={DEVICE_COPY_STREAMS_MAX}"
            )));
        }
        let chunks = self.device_staging_chunks;
        if chunks == 0 || chunks > DEVICE_STAGING_CHUNKS_MAX {
            return Err(BuildError::Invalid(format!(
                "device_staging_chunks {chunks} must be in 1..={DEVICE_STAGING_CHUNKS_MAX}"
            )));
        }
        if self.peer_dead_after.is_zero() {
            return Err(BuildError::Invalid("peer_dead_after must be non-zero".into()));
        }
        if self.device_landing_timeout < Duration::from_millis(1) {
            return Err(BuildError::Invalid("device_landing_timeout must be at least 1 ms".into()));
        }
        if bytes.saturating_mul(chunks as u64) > DEVICE_STAGING_POOL_BYTES_MAX {
            return Err(BuildError::Invalid(format!(
                "{chunks} staging chunks of {bytes} bytes exceed {DEVICE_STAGING_POOL_BYTES_MAX} pinned bytes: \
                 use fewer or smaller chunks"
            )));
        }
        Ok(())
    }

    /// The datagram size in effect (see [`EngineConfig::datagram_bytes`]).
    pub fn effective_datagram_bytes(&self) -> u16 {
        if self.datagram_bytes != 0 {
            self.datagram_bytes
        } else if self.nics.iter().all(IpAddr::is_loopback) {
            LOOPBACK_DATAGRAM_BYTES
        } else {
            FABRIC_DATAGRAM_BYTES
        }
    }

    /// The window in effect (see [`EngineConfig::window_packets`]).
    pub fn effective_window_packets(&self) -> u32 {
        let max = accord_proto::config::RECV_WINDOW_PACKETS_MAX;
        if self.window_packets != 0 {
            return self.window_packets.clamp(16, max);
        }
        // A datagram costs about twice its size in socket buffer (the kernel's truesize).
        let buffer = u64::from(self.paths_per_worker) * accord_net::udp::SOCKET_BUFFER_BYTES_DEFAULT as u64;
        let packets = buffer / 2 / (2 * u64::from(self.effective_datagram_bytes()));
        (packets as u32).clamp(16, max)
    }

    /// The protocol configuration every worker's endpoint uses.
    pub fn endpoint_config(&self) -> accord_proto::EndpointConfig {
        let mut ep = accord_proto::EndpointConfig::default();
        let c = &mut ep.connection;
        c.max_datagram_bytes = self.effective_datagram_bytes();
        c.path_count = self.paths_per_worker;
        c.cc = self.cc.clone();
        c.selector = self.path_selector;
        if let CcKind::Eqds(eqds) = &mut c.cc {
            // Large loopback datagrams: speculate at least a few of them.
            eqds.speculative_bytes = eqds.speculative_bytes.max(8 * u64::from(c.max_datagram_bytes));
        }
        let workers = self.workers_per_nic.max(1) as f64;
        ep.credit.line_rate_bytes_per_sec = ((self.nic_gbps * 1e9 / 8.0 / workers) as u64).max(1);
        ep.credit.order = self.pacer_order;
        ep.integrity = self.integrity;
        ep.secret = self.job_secret;
        let c = &mut ep.connection;
        c.idle_timeout = self.idle_timeout;
        // First contact gets the same bound as a live connection's silence: an overloaded peer
        // that answers its first Hello late is slow, not gone.
        c.handshake_timeout = self.idle_timeout;
        c.recv_window_packets = self.effective_window_packets();
        if c.max_datagram_bytes > FABRIC_DATAGRAM_BYTES {
            // Chunks of a few large datagrams, so a path still gets several packets per decision.
            c.chunk_bytes = 4 * u32::from(c.max_datagram_bytes);
        }
        ep
    }
}

/// Puts a knob's value, when it is set, in its field.
fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

/// `ACCORD_NICS`: comma-separated IP addresses.
fn parse_nics(list: &str) -> Result<Vec<IpAddr>, BuildError> {
    list.split(',').map(|ip| ip.trim().parse()).collect::<Result<_, _>>().map_err(|_| {
        BuildError::Knob(accord_knobs::KnobError::Invalid {
            knob: "ACCORD_NICS".into(),
            value: list.to_string(),
            expected: "comma-separated IP addresses, e.g. 10.0.0.1,10.0.0.2".into(),
        })
    })
}

#[cfg(test)]
mod knob_tests;
