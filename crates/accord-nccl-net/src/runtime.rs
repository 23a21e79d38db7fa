//! The process-wide runtime: one Accord engine whose NICs are the plugin's devices, created by
//! the first successful `init` and kept for the life of the process (NCCL's `devices` and
//! `getProperties` take no context, so devices are process-wide), and the pool of comm indexes
//! that name each comm's immediate counters.

use crate::config::{default_speed_mbps, sysfs_speed_mbps, GpuBuffers, NetConfig};
use crate::error::{PluginError, Result};
use crate::workers::{worker_sizing, NVIDIA_GPU_DIR};
use accord_engine::{Engine, ImmCounter};
use std::collections::VecDeque;
use std::ffi::CString;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Most comms (send, receive) alive at once in this process: each owns
/// [`crate::abi::NET_REQUESTS_MAX`] immediate counters, and the engine counts at most
/// [`accord_engine::IMM_COUNTERS_MAX`] distinct immediates.
pub const COMMS_MAX: usize = 1024;
/// Smallest piece a receive is split into for the sender (see [`Runtime::pieces_for`]).
pub const PIECE_BYTES_MIN: u64 = 64 << 10;
// Every piece of a send that fills its receive (the sender's split: `comm/send.rs`, `piece_bytes`)
// into an engine of this process (one process driving several GPUs) is then copied by the
// engine's copy threads; a shorter one is copied on NCCL's proxy thread, one at a time.
const _: () = assert!(PIECE_BYTES_MIN >= accord_engine::LOCAL_COPY_ASYNC_MIN_BYTES);
/// High bits of every immediate this plugin uses.
pub const IMM_PREFIX: u32 = 0xACC0_0000;
const SLOT_BITS: u32 = 5;
const _: () = assert!(1 << SLOT_BITS == crate::abi::NET_REQUESTS_MAX);
const _: () = assert!(COMMS_MAX * crate::abi::NET_REQUESTS_MAX <= accord_engine::IMM_COUNTERS_MAX / 2);
const _: () = assert!(((COMMS_MAX as u32) << SLOT_BITS) & IMM_PREFIX == 0);

/// The immediate that names request slot `slot` of comm `index`.
pub fn imm_for(index: u32, slot: u32) -> u32 {
    debug_assert!((index as usize) < COMMS_MAX && (slot as usize) < crate::abi::NET_REQUESTS_MAX);
    IMM_PREFIX | index << SLOT_BITS | slot
}

/// One NCCL device: an engine NIC.
#[derive(Debug)]
pub struct Device {
    /// The NIC's local address (setup listeners bind it too).
    pub ip: IpAddr,
    /// Name shown in NCCL's logs.
    pub name: CString,
    /// Unique per device in this process.
    pub guid: u64,
    /// Reported speed in Mbps.
    pub speed_mbps: i32,
}

/// Data bytes of each shared-memory ring the plugin's engine creates, unless
/// `ACCORD_SHM_RING_BYTES` says otherwise: an eighth of the engine's own default.
///
/// Why: with one process per GPU every byte crosses a ring, and the plugin runs many lanes
/// (12 a rank on the 2xH200 host), each with a ring to each peer. At the engine's 8 MiB those
/// rings, by our reading (no cache counters were taken), outgrow the last-level cache beside
/// NCCL's buffers, and their bytes go through memory twice more. Measured in session 50
/// (docs/results/2026-11-28-plugin-rings.md):
/// - nccl-tests' all_reduce at 256 MiB, one process per GPU, 2xH200: 18.44-19.42 GB/s busbw
///   with 2 MiB rings against 15.05-16.26 with 8 MiB, three interleaved rounds of one call;
///   1 MiB gave 20.59 and 32 MiB 15.65 in single runs;
/// - the DDP loop, 2xH100, five rounds over two calls: 1 MiB rings 1.45-1.67x Socket's step
///   (median 1.56), 2 MiB 1.36-1.63x (median 1.40).
pub const PLUGIN_SHM_RING_BYTES: usize = 1 << 20;

/// The runtime shared by every context and comm.
pub struct Runtime {
    /// The engine every connection runs over.
    pub engine: Engine,
    /// Devices, in NCCL order.
    pub devices: Vec<Device>,
    /// The configuration in effect.
    pub config: NetConfig,
    /// Most pieces per receive this process asks its senders for (0: one engine-sharded write).
    pub pieces_max: u32,
    /// What decided the engine's worker count (the init log line names it).
    pub workers_source: String,
    /// Whether devices report `NCCL_PTR_CUDA` and accept GPU memory (`ACCORD_NET_GPU_BUFFERS`,
    /// resolved: auto means a GPU is visible).
    pub gpu_buffers: bool,
    free_indexes: Arc<Mutex<VecDeque<u32>>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("devices", &self.devices).finish_non_exhaustive()
    }
}

static RUNTIME: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);

/// The runtime, starting it on first use.
pub fn start() -> Result<Arc<Runtime>> {
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = slot.as_ref() {
        return Ok(rt.clone());
    }
    let rt = Arc::new(Runtime::new(NetConfig::from_env()?)?);
    *slot = Some(rt.clone());
    Ok(rt)
}

/// The runtime if `init` succeeded before.
pub fn current() -> Result<Arc<Runtime>> {
    RUNTIME.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(PluginError::NotInitialised)
}

fn guid_for(index: usize, ip: IpAddr) -> u64 {
    // FNV-1a of the address, with the device index in the low byte so guids stay unique.
    let bytes = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    (hash & !0xff) | index as u64
}

impl Runtime {
    /// Builds the engine on the configured devices (the engine's `ACCORD_*` overrides apply).
    pub fn new(config: NetConfig) -> Result<Runtime> {
        let cores = accord_engine::config::host_cores();
        let workers = worker_sizing(|n| std::env::var(n).ok(), cores, Path::new(NVIDIA_GPU_DIR));
        let gpu_buffers = match config.gpu_buffers {
            GpuBuffers::On => true,
            GpuBuffers::Off => false,
            GpuBuffers::Auto => accord_engine::gpus_visible() > 0,
        };
        let mut builder = Engine::builder().nics(config.devices.iter().map(|d| d.ip));
        if gpu_buffers {
            // Copies are issued on NCCL's proxy thread, which NCCL's kernels wait on: they must
            // not queue behind the application's synchronous calls in the primary context.
            builder = builder.device_context(accord_engine::DeviceContext::Private);
        }
        if let Some(count) = workers.workers {
            builder = builder.workers_per_nic(count);
        }
        builder = builder.shm_ring_bytes(PLUGIN_SHM_RING_BYTES);
        let engine = builder.build()?;
        let devices = engine
            .config()
            .nics
            .iter()
            .enumerate()
            .map(|(i, ip)| {
                let interface = config.devices.iter().find(|d| d.ip == *ip).and_then(|d| d.interface.clone());
                let speed_mbps = config
                    .speed_mbps
                    .unwrap_or_else(|| default_speed_mbps(*ip, interface.as_deref(), sysfs_speed_mbps));
                let label = interface.map_or_else(|| ip.to_string(), |n| format!("{n}:{ip}"));
                Device {
                    ip: *ip,
                    name: CString::new(format!("accord{i}({label})")).unwrap_or_default(),
                    guid: guid_for(i, *ip),
                    speed_mbps,
                }
            })
            .collect();
        let free_indexes = Arc::new(Mutex::new((0..COMMS_MAX as u32).collect()));
        let lanes = (engine.config().nics.len() * engine.config().workers_per_nic) as u32;
        let pieces_max = config.pieces_max.unwrap_or(lanes).min(crate::cts::PIECES_MAX);
        crate::log::set_event_budget(config.trace_events);
        Ok(Runtime { engine, devices, config, pieces_max, workers_source: workers.source, gpu_buffers, free_indexes })
    }

    /// The engine settings that shape throughput, for the init log line: a table's figures can
    /// then be tied to the worker count and ring size they ran with, which the environment
    /// (launcher variables, the host's cores and GPUs, `ACCORD_*`) decides at run time.
    pub fn datapath_summary(&self) -> String {
        let c = self.engine.config();
        let shm = if c.shm.enabled {
            format!("shared memory on ({} KiB rings)", c.shm.ring_bytes >> 10)
        } else {
            "shared memory off".into()
        };
        let gpu = if self.gpu_buffers {
            format!(
                "GPU buffers on ({} KiB bounce pool per receive comm, same-host copy-engine route {}, copies in {:?} contexts)",
                self.config.bounce_bytes >> 10,
                if c.device_shared_host { "on" } else { "off" },
                c.device_context
            )
        } else {
            "GPU buffers off".into()
        };
        format!(
            "{} worker(s) per device ({}), up to {} piece(s) per message, {shm}, cross-memory pulls {}, streaming stores \
             into host buffers {}, {gpu}",
            c.workers_per_nic,
            self.workers_source,
            self.pieces_max,
            if c.cma { "on" } else { "off" },
            if self.config.streaming_stores { "on" } else { "off" }
        )
    }

    /// The device `dev`, or the error NCCL should see.
    pub fn device(&self, dev: i32) -> Result<&Device> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or(PluginError::NoSuchDevice { dev, count: self.devices.len() })
    }

    /// Pieces the sender should write a receive of `capacity` bytes in: one per lane, but
    /// none under [`PIECE_BYTES_MIN`] (a piece costs a write and an immediate).
    pub fn pieces_for(&self, capacity: u64) -> u32 {
        let by_size = (capacity / PIECE_BYTES_MIN).clamp(1, u64::from(crate::cts::PIECES_MAX)) as u32;
        by_size.min(self.pieces_max).max(1)
    }

    /// Takes a free comm index (the least recently freed, so counters of a closed comm rest
    /// as long as possible before reuse).
    pub fn lease_index(&self) -> Result<IndexLease> {
        let index = self
            .free_indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
            .ok_or(PluginError::TableFull { what: "the comm table", max: COMMS_MAX })?;
        Ok(IndexLease { index, pool: self.free_indexes.clone() })
    }

    /// The counters of a comm's request slots and their values now (the comm's zero).
    pub fn slot_counters(&self, index: u32) -> (Vec<ImmCounter>, Vec<u64>) {
        let counters: Vec<ImmCounter> = (0..crate::abi::NET_REQUESTS_MAX as u32)
            .map(|slot| self.engine.imm_counter(imm_for(index, slot)))
            .collect();
        let bases = counters.iter().map(ImmCounter::value).collect();
        (counters, bases)
    }
}

/// A comm index, returned to the pool when dropped.
#[derive(Debug)]
pub struct IndexLease {
    /// The index, `< COMMS_MAX`.
    pub index: u32,
    pool: Arc<Mutex<VecDeque<u32>>>,
}

impl Drop for IndexLease {
    fn drop(&mut self) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).push_back(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediates_are_distinct_per_comm_and_slot() {
        let mut seen = std::collections::HashSet::new();
        for index in [0, 1, COMMS_MAX as u32 - 1] {
            for slot in 0..crate::abi::NET_REQUESTS_MAX as u32 {
                assert!(seen.insert(imm_for(index, slot)));
                assert_eq!(imm_for(index, slot) & 0xfff0_0000, IMM_PREFIX);
            }
        }
    }

    #[test]
    fn guids_are_unique_per_device() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        assert_ne!(guid_for(0, ip), guid_for(1, ip));
        assert_ne!(guid_for(0, ip), guid_for(0, "127.0.0.2".parse().unwrap()));
    }

    #[test]
    fn indexes_come_back_and_are_reused_last() {
        let rt = Runtime::new(NetConfig::default()).expect("engine on loopback");
        let a = rt.lease_index().unwrap();
        let first = a.index;
        drop(a);
        let b = rt.lease_index().unwrap();
        assert_ne!(b.index, first, "a freed index goes to the back of the queue");
        let (counters, bases) = rt.slot_counters(b.index);
        assert_eq!(counters.len(), crate::abi::NET_REQUESTS_MAX);
        assert!(bases.iter().all(|v| *v == 0));
    }
}
