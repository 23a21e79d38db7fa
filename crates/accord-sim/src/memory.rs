//! A host's memory as the simulator models it: registered regions and posted receive buffers,
//! with real bytes, plus a per-byte placement count so "every byte placed exactly once" can be
//! checked, not assumed.

use accord_proto::wire::RejectReason;
use accord_proto::{ConnectionHandle, LocalMemory, Placement, PlacementTarget, RecvBufferId, RegionId, RegionKey};
use std::collections::{BTreeMap, VecDeque};

/// One registered region.
#[derive(Debug)]
pub struct SimRegion {
    pub key: RegionKey,
    pub bytes: Vec<u8>,
    /// Times each byte was placed (saturating), kept when `track_placements` is on.
    pub placements: Option<Vec<u8>>,
}

/// A posted receive buffer and what landed in it.
#[derive(Debug)]
pub struct SimRecvBuffer {
    pub bytes: Vec<u8>,
    pub claimed_by: Option<ConnectionHandle>,
}

/// Regions and receive buffers of one host.
#[derive(Debug, Default)]
pub struct SimMemory {
    regions: BTreeMap<RegionId, SimRegion>,
    posted: VecDeque<RecvBufferId>,
    buffers: BTreeMap<RecvBufferId, SimRecvBuffer>,
    next_buffer: u64,
    track_placements: bool,
    /// Bytes copied by placements (duplicates would make this exceed what was written).
    pub bytes_placed: u64,
}

impl SimMemory {
    /// `track_placements` keeps a counter per byte (tests); off for large benchmarks.
    pub fn new(track_placements: bool) -> Self {
        SimMemory { track_placements, ..Default::default() }
    }

    pub fn register(&mut self, id: RegionId, key: RegionKey, len: usize) {
        let placements = self.track_placements.then(|| vec![0u8; len]);
        self.regions.insert(id, SimRegion { key, bytes: vec![0; len], placements });
    }

    pub fn deregister(&mut self, id: RegionId) -> Option<SimRegion> {
        self.regions.remove(&id)
    }

    pub fn region(&self, id: RegionId) -> Option<&SimRegion> {
        self.regions.get(&id)
    }

    /// Posts a receive buffer of `len` bytes; sends claim them in posting order.
    pub fn post_recv(&mut self, len: usize) -> RecvBufferId {
        let id = RecvBufferId(self.next_buffer);
        self.next_buffer += 1;
        self.buffers.insert(id, SimRecvBuffer { bytes: vec![0; len], claimed_by: None });
        self.posted.push_back(id);
        id
    }

    pub fn recv_buffer(&self, id: RecvBufferId) -> Option<&SimRecvBuffer> {
        self.buffers.get(&id)
    }

    /// Performs a placement the protocol returned.
    pub fn place(&mut self, placement: &Placement, datagram: &[u8]) {
        let src = &datagram[placement.payload.clone()];
        self.bytes_placed += src.len() as u64;
        match placement.target {
            PlacementTarget::Region { region, offset } => {
                let r = self.regions.get_mut(&region).expect("protocol placed into a region it checked");
                let start = offset as usize;
                r.bytes[start..start + src.len()].copy_from_slice(src);
                if let Some(counts) = r.placements.as_mut() {
                    for c in &mut counts[start..start + src.len()] {
                        *c = c.saturating_add(1);
                    }
                }
            }
            PlacementTarget::RecvBuffer { buffer, offset } => {
                let b = self.buffers.get_mut(&buffer).expect("protocol placed into a buffer it claimed");
                let start = offset as usize;
                b.bytes[start..start + src.len()].copy_from_slice(src);
            }
        }
    }
}

impl LocalMemory for SimMemory {
    fn check_write(&self, region: RegionId, key: RegionKey, offset: u64, len: u64) -> Result<(), RejectReason> {
        let r = self.regions.get(&region).ok_or(RejectReason::UnknownRegion)?;
        if r.key != key {
            return Err(RejectReason::BadKey);
        }
        match offset.checked_add(len) {
            Some(end) if end <= r.bytes.len() as u64 => Ok(()),
            _ => Err(RejectReason::OutOfBounds),
        }
    }

    fn claim_recv_buffer(&mut self, conn: ConnectionHandle, msg_len: u64) -> Result<RecvBufferId, RejectReason> {
        let &id = self.posted.front().ok_or(RejectReason::NoRecvBuffer)?;
        let buffer = self.buffers.get_mut(&id).ok_or(RejectReason::NoRecvBuffer)?;
        if msg_len > buffer.bytes.len() as u64 {
            return Err(RejectReason::MessageTooLarge);
        }
        buffer.claimed_by = Some(conn);
        buffer.bytes.truncate(msg_len as usize);
        self.posted.pop_front();
        Ok(id)
    }
}
