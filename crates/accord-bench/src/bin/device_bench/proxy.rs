//! The one place `accord-device-bench` calls the host side of the device API
//! (`accord_device::DeviceComm`): open over a communicator, register device windows, hand the
//! device table to kernels, read errors and statistics, close. If the host API's names change,
//! only this file changes.

use accord_coll::engine::EngineTransport;
use accord_coll::Communicator;
use accord_cuda::{DeviceBuffer, Gpu};

/// How the bench sizes the device communicator (the same on every rank).
#[derive(Clone, Copy, Debug)]
pub struct ProxyConfig {
    /// Rings, one proxy thread each (1: "one proxy thread" of the descriptor-rate target).
    pub rings: usize,
    /// Slots per ring (a power of two).
    pub slot_count: u32,
    /// Descriptors a proxy takes per turn.
    pub descriptors_per_turn: usize,
    /// Signals the kernels use (the barrier's is added by the host side).
    pub user_signals: u32,
    /// Stream lanes on (`DeviceCommConfig::stream_lane`).
    pub stream_lane: bool,
    /// Counters.
    pub counters: u32,
}

/// What the proxies did so far, as the bench reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Descriptors executed successfully.
    pub executed: u64,
    /// Bytes put.
    pub bytes: u64,
    /// Descriptors refused or failed.
    pub errors: u64,
    /// Signal writes issued, and folded into a later one.
    pub signal_writes: u64,
    /// Signal values coalesced.
    pub signal_coalesced: u64,
    /// Stream-lane batches, their driver calls, and their summed host and GPU time (ns).
    pub lane_batches: u64,
    /// Driver calls of the lane batches.
    pub lane_ops: u64,
    /// Summed host time of the lane batches (ns).
    pub lane_submit_ns: u64,
    /// Summed time from queued to done of the lane batches (ns).
    pub lane_complete_ns: u64,
    /// Descriptors the lane batches held, and the copies they queued after merging.
    pub lane_items: u64,
    /// Copies the lane batches queued after merging.
    pub lane_copies: u64,
    /// Summed time inside the batches' queueing (merging and driver calls, ns).
    pub lane_queue_ns: u64,
    /// Summed time the proxies took, checked and sorted descriptors (ns).
    pub take_ns: u64,
    /// Summed time the proxies retired completed lane batches (ns).
    pub lane_retire_ns: u64,
}

impl ProxyStats {
    /// What moved between `earlier` and these statistics (every field is a running total).
    pub fn since(&self, earlier: &ProxyStats) -> ProxyStats {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        ProxyStats {
            executed: d(self.executed, earlier.executed),
            bytes: d(self.bytes, earlier.bytes),
            errors: d(self.errors, earlier.errors),
            signal_writes: d(self.signal_writes, earlier.signal_writes),
            signal_coalesced: d(self.signal_coalesced, earlier.signal_coalesced),
            lane_batches: d(self.lane_batches, earlier.lane_batches),
            lane_ops: d(self.lane_ops, earlier.lane_ops),
            lane_submit_ns: d(self.lane_submit_ns, earlier.lane_submit_ns),
            lane_complete_ns: d(self.lane_complete_ns, earlier.lane_complete_ns),
            lane_items: d(self.lane_items, earlier.lane_items),
            lane_copies: d(self.lane_copies, earlier.lane_copies),
            lane_queue_ns: d(self.lane_queue_ns, earlier.lane_queue_ns),
            take_ns: d(self.take_ns, earlier.take_ns),
            lane_retire_ns: d(self.lane_retire_ns, earlier.lane_retire_ns),
        }
    }
}

mod imp {
    use super::*;
    use accord_device::{DeviceComm, DeviceCommConfig, Placement};
    use accord_engine::MemoryKind;

    /// A rank's device communicator.
    pub struct Proxy {
        comm: DeviceComm,
    }

    impl Proxy {
        /// Builds the device communicator on this rank's GPU (collective).
        pub fn open(comm: Communicator<EngineTransport>, gpu: &Gpu, config: ProxyConfig) -> Result<Proxy, String> {
            let config = DeviceCommConfig {
                rings: config.rings,
                slot_count: config.slot_count,
                descriptors_per_turn: config.descriptors_per_turn,
                user_signals: config.user_signals,
                counters: config.counters,
                placement: Placement::Gpu(gpu.clone()),
                stream_lane: config.stream_lane,
                ..DeviceCommConfig::default()
            };
            let comm = DeviceComm::new(comm, config).map_err(|e| format!("DeviceComm::new: {e}"))?;
            Ok(Proxy { comm })
        }

        /// Registers the whole of `buffer` as the next window (collective); returns its id.
        pub fn register_device_window(&mut self, buffer: &DeviceBuffer) -> Result<u32, String> {
            let kind = MemoryKind::CudaDevice { ordinal: buffer.gpu().ordinal() as u32 };
            // Safety: the bench keeps every window's buffer alive until after `close` (the
            // buffers are declared before the proxy in `rank_main` and dropped after it), and
            // holds no Rust reference into device memory.
            #[allow(unsafe_code)]
            let id = unsafe { self.comm.register_window(buffer.ptr().0 as *mut u8, buffer.len_bytes(), kind) };
            id.map_err(|e| format!("register_window: {e}"))
        }

        /// The device table's device address, for kernels.
        pub fn table_ptr(&self) -> Result<u64, String> {
            self.comm.device_table_ptr().map_err(|e| format!("device_table_ptr: {e}"))
        }

        /// The communicator the device communicator was built over (host barriers, exchanges).
        pub fn communicator(&mut self) -> &mut Communicator<EngineTransport> {
            self.comm.communicator()
        }

        /// Every descriptor error the proxies recorded, as text.
        pub fn errors(&self) -> Vec<String> {
            self.comm.errors().iter().map(|e| e.to_string()).collect()
        }

        /// The proxies' counters.
        pub fn stats(&self) -> ProxyStats {
            let s = self.comm.stats();
            ProxyStats {
                executed: s.descriptors_executed,
                bytes: s.bytes_put,
                errors: s.descriptor_errors,
                signal_writes: s.signal_writes_issued,
                signal_coalesced: s.signal_writes_coalesced,
                lane_batches: s.lane_batches,
                lane_ops: s.lane_driver_ops,
                lane_submit_ns: s.lane_submit_ns,
                lane_complete_ns: s.lane_complete_ns,
                lane_items: s.lane_items,
                lane_copies: s.lane_copies,
                lane_queue_ns: s.lane_queue_ns,
                take_ns: s.take_ns,
                lane_retire_ns: s.lane_retire_ns,
            }
        }

        /// Stops the proxies and deregisters the windows.
        pub fn close(self) -> Result<(), String> {
            self.comm.close().map_err(|e| format!("close: {e}"))
        }
    }
}

pub use imp::Proxy;

/// The device API's defaults for a ring's slots and a proxy's turn (the bench's defaults too).
pub use accord_device::{DESCRIPTORS_PER_TURN_DEFAULT, RING_SLOTS_DEFAULT, RING_SLOTS_MAX};
