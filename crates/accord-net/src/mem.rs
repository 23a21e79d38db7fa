//! An in-process network: lossless, deterministic, bounded.
//!
//! For tests of everything above the datapath (the engine, the fault
//! injector) without sockets, ports or kernel timing. Each endpoint gets a
//! made-up address `10.0.h.h:1000+path`; a datagram is delivered to the
//! endpoint and path whose address is its destination, or dropped and
//! counted if none is. Queues are drop-tail, like a switch port.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::{Datapath, DatapathCaps, DatapathError, RxBuffers, RxMeta, TxDatagram};

/// Default per-endpoint receive queue bound, in packets.
pub const MEM_QUEUE_PACKETS_DEFAULT: usize = 65_536;
/// Most endpoints one [`MemNetwork`] hands out (addresses are 16-bit).
pub const MEM_ENDPOINTS_MAX: u32 = 65_535;
/// First port of an endpoint's paths.
const PORT_BASE: u16 = 1000;
/// Largest payload, as for IPv4 UDP, so code tested here fits the real thing.
const MEM_PAYLOAD_BYTES_MAX: usize = 65_507;

#[derive(Debug)]
struct Packet {
    path: u16,
    src: SocketAddr,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct Inbox {
    queue: Mutex<VecDeque<Packet>>,
    ready: Condvar,
    /// Drop-tail bound of `queue`, in packets.
    queue_packets_max: usize,
}

#[derive(Debug, Default)]
struct Registry {
    routes: HashMap<SocketAddr, (Arc<Inbox>, u16)>,
    endpoints_made: u32,
}

/// Counters of a [`MemNetwork`], shared by all its endpoints.
#[derive(Debug, Default)]
pub struct MemNetworkStats {
    /// Packets dropped because the receiver's queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Packets dropped because no endpoint has the destination address.
    pub dropped_unroutable: AtomicU64,
}

#[derive(Debug, Default)]
struct Shared {
    registry: Mutex<Registry>,
    stats: MemNetworkStats,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data; keep going.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A set of in-process endpoints that can reach each other.
#[derive(Debug, Clone, Default)]
pub struct MemNetwork {
    shared: Arc<Shared>,
}

impl MemNetwork {
    /// An empty network.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an endpoint with `path_count` paths and a receive queue of
    /// `queue_packets_max` packets.
    pub fn endpoint(&self, path_count: u16, queue_packets_max: usize) -> Result<MemDatapath, DatapathError> {
        if path_count == 0 || path_count > u16::MAX - PORT_BASE {
            return Err(DatapathError::InvalidConfig(format!(
                "path_count {path_count} must be in 1..={}",
                u16::MAX - PORT_BASE
            )));
        }
        if queue_packets_max == 0 {
            return Err(DatapathError::InvalidConfig("queue_packets_max must be positive".into()));
        }
        let mut registry = lock(&self.shared.registry);
        if registry.endpoints_made >= MEM_ENDPOINTS_MAX {
            return Err(DatapathError::InvalidConfig(format!(
                "a MemNetwork has at most {MEM_ENDPOINTS_MAX} endpoints"
            )));
        }
        registry.endpoints_made += 1;
        let host = registry.endpoints_made;
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, (host >> 8) as u8, host as u8));
        let inbox = Arc::new(Inbox { queue: Mutex::new(VecDeque::new()), ready: Condvar::new(), queue_packets_max });
        let local_addrs: Vec<SocketAddr> = (0..path_count).map(|path| SocketAddr::new(ip, PORT_BASE + path)).collect();
        for (path, addr) in local_addrs.iter().enumerate() {
            registry.routes.insert(*addr, (inbox.clone(), path as u16));
        }
        Ok(MemDatapath { shared: self.shared.clone(), inbox, local_addrs })
    }

    /// Drop counters of the whole network.
    pub fn stats(&self) -> &MemNetworkStats {
        &self.shared.stats
    }
}

/// One endpoint of a [`MemNetwork`].
#[derive(Debug)]
pub struct MemDatapath {
    shared: Arc<Shared>,
    inbox: Arc<Inbox>,
    local_addrs: Vec<SocketAddr>,
}

impl MemDatapath {
    /// Packets waiting in this endpoint's receive queue.
    pub fn queued_packets(&self) -> usize {
        lock(&self.inbox.queue).len()
    }
}

impl Drop for MemDatapath {
    fn drop(&mut self) {
        let mut registry = lock(&self.shared.registry);
        for addr in &self.local_addrs {
            registry.routes.remove(addr);
        }
    }
}

impl Datapath for MemDatapath {
    fn caps(&self) -> DatapathCaps {
        DatapathCaps {
            max_payload_bytes: MEM_PAYLOAD_BYTES_MAX,
            gso_max_segments: crate::SEGMENTS_PER_SEND_MAX as u16,
            gro: false,
            ecn: false,
            timestamps: false,
        }
    }

    fn path_count(&self) -> u16 {
        self.local_addrs.len() as u16
    }

    fn local_addr(&self, path: u16) -> Option<SocketAddr> {
        self.local_addrs.get(usize::from(path)).copied()
    }

    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DatapathError> {
        self.validate_batch(batch)?;
        let stats = &self.shared.stats;
        for dgram in batch {
            let route = lock(&self.shared.registry).routes.get(&dgram.dst).cloned();
            let Some((inbox, dst_path)) = route else {
                stats.dropped_unroutable.fetch_add(dgram.segment_count() as u64, Ordering::Relaxed);
                continue;
            };
            let src = self.local_addrs[usize::from(dgram.path)];
            let mut queue = lock(&inbox.queue);
            for segment in dgram.segments() {
                if queue.len() >= inbox.queue_packets_max {
                    stats.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                queue.push_back(Packet { path: dst_path, src, bytes: segment.to_vec() });
            }
            drop(queue);
            inbox.ready.notify_all();
        }
        Ok(batch.len())
    }

    fn recv_batch(&mut self, bufs: &mut RxBuffers, max: usize) -> Result<usize, DatapathError> {
        let max = bufs.start_batch(self.rx_slot_bytes(), max)?;
        let mut queue = lock(&self.inbox.queue);
        while bufs.len() < max {
            let Some(packet) = queue.pop_front() else {
                break;
            };
            let meta = RxMeta {
                path: packet.path,
                src: packet.src,
                len: packet.bytes.len(),
                segment_bytes: packet.bytes.len(),
                ecn_ce: false,
                local_channel: false,
            };
            let pushed = bufs.push_copy(&packet.bytes, meta);
            debug_assert!(pushed, "slot size was checked above");
        }
        Ok(bufs.len())
    }

    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, DatapathError> {
        let queue = lock(&self.inbox.queue);
        if !queue.is_empty() {
            return Ok(true);
        }
        let (queue, _) = self.inbox.ready.wait_timeout(queue, timeout).unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(!queue.is_empty())
    }
}

#[cfg(test)]
mod tests;
