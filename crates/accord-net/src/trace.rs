//! A tracing wrapper: per-path packet and byte counters readable from any
//! thread, and a bounded ring of datagram headers for debugging.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::{Datapath, DatapathError, RxBuffers, TxDatagram};

/// Bytes of each datagram kept in a [`TraceRecord`]: enough for any of our
/// headers, little enough to keep tracing cheap.
pub const TRACE_HEADER_BYTES: usize = 32;
/// Most records one tracer keeps.
pub const TRACE_RECORDS_MAX: usize = 1 << 20;

/// Which records the ring keeps once it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceKeep {
    /// Keep the first `records_max` datagrams and stop recording (the
    /// start of a run is usually where a handshake bug shows).
    #[default]
    First,
    /// Keep the latest `records_max`, overwriting the oldest.
    Latest,
}

/// How a [`TracingDatapath`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceConfig {
    /// Ring size in records; 0 records nothing (counters only). At most
    /// [`TRACE_RECORDS_MAX`].
    pub records_max: usize,
    /// Which records to keep when full.
    pub keep: TraceKeep,
}

impl Default for TraceConfig {
    /// Counters plus the first 1024 datagrams.
    fn default() -> Self {
        TraceConfig { records_max: 1024, keep: TraceKeep::First }
    }
}

/// Direction of a traced datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Handed to the inner datapath and accepted.
    Tx,
    /// Received from the inner datapath.
    Rx,
}

/// One traced datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// Clock time of the call that moved it.
    pub at: Duration,
    /// Sent or received.
    pub direction: Direction,
    /// Local path.
    pub path: u16,
    /// Destination (Tx) or source (Rx).
    pub peer: SocketAddr,
    /// Full length of the datagram.
    pub len: usize,
    /// Segment size (GSO on Tx, GRO on Rx); equals `len` when not segmented.
    pub segment_bytes: usize,
    /// First bytes of the datagram; `header_len` of them are valid.
    pub header: [u8; TRACE_HEADER_BYTES],
    /// Valid bytes in `header`.
    pub header_len: u8,
}

impl TraceRecord {
    /// The valid header bytes.
    pub fn header_bytes(&self) -> &[u8] {
        &self.header[..usize::from(self.header_len)]
    }
}

/// A snapshot of one path's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounters {
    /// Packets sent (segments of a GSO send count one each).
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets received (segments of a GRO datagram count one each).
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
}

#[derive(Debug, Default)]
struct PathAtomics {
    tx_packets: AtomicU64,
    tx_bytes: AtomicU64,
    rx_packets: AtomicU64,
    rx_bytes: AtomicU64,
}

/// Per-path counters, shared so another thread can read them while traffic runs.
#[derive(Debug)]
pub struct TraceCounters {
    paths: Vec<PathAtomics>,
}

impl TraceCounters {
    /// Counters of `path`, or `None` for an unknown path.
    pub fn path(&self, path: u16) -> Option<PathCounters> {
        let p = self.paths.get(usize::from(path))?;
        Some(PathCounters {
            tx_packets: p.tx_packets.load(Ordering::Relaxed),
            tx_bytes: p.tx_bytes.load(Ordering::Relaxed),
            rx_packets: p.rx_packets.load(Ordering::Relaxed),
            rx_bytes: p.rx_bytes.load(Ordering::Relaxed),
        })
    }

    /// Sum over all paths.
    pub fn total(&self) -> PathCounters {
        (0..self.paths.len() as u16).filter_map(|p| self.path(p)).fold(PathCounters::default(), |a, b| PathCounters {
            tx_packets: a.tx_packets + b.tx_packets,
            tx_bytes: a.tx_bytes + b.tx_bytes,
            rx_packets: a.rx_packets + b.rx_packets,
            rx_bytes: a.rx_bytes + b.rx_bytes,
        })
    }
}

/// Wraps a datapath, counting and recording what crosses it.
pub struct TracingDatapath<D: Datapath> {
    inner: D,
    config: TraceConfig,
    clock: Arc<dyn Clock>,
    counters: Arc<TraceCounters>,
    records: VecDeque<TraceRecord>,
}

impl<D: Datapath> std::fmt::Debug for TracingDatapath<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracingDatapath")
            .field("config", &self.config)
            .field("records", &self.records.len())
            .field("total", &self.counters.total())
            .finish_non_exhaustive()
    }
}

impl<D: Datapath> TracingDatapath<D> {
    /// Wraps `inner`, timing records with the system clock.
    pub fn new(inner: D, config: TraceConfig) -> Result<Self, DatapathError> {
        Self::with_clock(inner, config, Arc::new(SystemClock::new()))
    }

    /// Wraps `inner`, timing records with `clock`.
    pub fn with_clock(inner: D, config: TraceConfig, clock: Arc<dyn Clock>) -> Result<Self, DatapathError> {
        if config.records_max > TRACE_RECORDS_MAX {
            return Err(DatapathError::InvalidConfig(format!(
                "records_max {} exceeds {TRACE_RECORDS_MAX}",
                config.records_max
            )));
        }
        let paths = (0..inner.path_count()).map(|_| PathAtomics::default()).collect();
        Ok(TracingDatapath {
            inner,
            config,
            clock,
            counters: Arc::new(TraceCounters { paths }),
            records: VecDeque::with_capacity(config.records_max.min(4096)),
        })
    }

    /// Shared per-path counters.
    pub fn counters(&self) -> Arc<TraceCounters> {
        self.counters.clone()
    }

    /// Recorded datagrams, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &TraceRecord> + '_ {
        self.records.iter()
    }

    /// Takes the recorded datagrams out, leaving the ring empty (and, in
    /// `First` mode, recording again).
    pub fn take_records(&mut self) -> Vec<TraceRecord> {
        self.records.drain(..).collect()
    }

    /// The wrapped datapath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Mutable access to the wrapped datapath.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    fn record(&mut self, record: impl FnOnce() -> TraceRecord) {
        if self.config.records_max == 0 {
            return;
        }
        if self.records.len() >= self.config.records_max {
            match self.config.keep {
                TraceKeep::First => return,
                TraceKeep::Latest => {
                    self.records.pop_front();
                }
            }
        }
        self.records.push_back(record());
    }
}

fn header_of(bytes: &[u8]) -> ([u8; TRACE_HEADER_BYTES], u8) {
    let mut header = [0u8; TRACE_HEADER_BYTES];
    let n = bytes.len().min(TRACE_HEADER_BYTES);
    header[..n].copy_from_slice(&bytes[..n]);
    (header, n as u8)
}

impl<D: Datapath> Datapath for TracingDatapath<D> {
    crate::datapath::wrapped_identity!(inner);

    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DatapathError> {
        let sent = self.inner.send_batch(batch)?;
        let at = self.clock.now();
        for dgram in &batch[..sent.min(batch.len())] {
            if let Some(p) = self.counters.paths.get(usize::from(dgram.path)) {
                p.tx_packets.fetch_add(dgram.segment_count() as u64, Ordering::Relaxed);
                p.tx_bytes.fetch_add(dgram.bytes.len() as u64, Ordering::Relaxed);
            }
            self.record(|| {
                let (header, header_len) = header_of(dgram.bytes);
                TraceRecord {
                    at,
                    direction: Direction::Tx,
                    path: dgram.path,
                    peer: dgram.dst,
                    len: dgram.bytes.len(),
                    segment_bytes: dgram.segment_bytes.map_or(dgram.bytes.len(), usize::from),
                    header,
                    header_len,
                }
            });
        }
        Ok(sent)
    }

    fn recv_batch(&mut self, bufs: &mut RxBuffers, max: usize) -> Result<usize, DatapathError> {
        let received = self.inner.recv_batch(bufs, max)?;
        let at = self.clock.now();
        for (bytes, meta) in bufs.iter() {
            if let Some(p) = self.counters.paths.get(usize::from(meta.path)) {
                p.rx_packets.fetch_add(meta.segment_count() as u64, Ordering::Relaxed);
                p.rx_bytes.fetch_add(meta.len as u64, Ordering::Relaxed);
            }
            self.record(|| {
                let (header, header_len) = header_of(bytes);
                TraceRecord {
                    at,
                    direction: Direction::Rx,
                    path: meta.path,
                    peer: meta.src,
                    len: meta.len,
                    segment_bytes: meta.segment_bytes,
                    header,
                    header_len,
                }
            });
        }
        Ok(received)
    }

    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, DatapathError> {
        self.inner.wait_readable(timeout)
    }

    fn local_channel_has_data(&self) -> bool {
        self.inner.local_channel_has_data()
    }

    fn is_local_channel(&self, dst: SocketAddr) -> bool {
        self.inner.is_local_channel(dst)
    }

    crate::datapath::wrapped_local_channel!(inner);
}

#[cfg(test)]
mod tests;
