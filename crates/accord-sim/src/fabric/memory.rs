//! A host's memory in the fabric: regions that accept writes and count placed bytes per flow
//! instead of copying them (payloads are virtual).

use accord_proto::wire::RejectReason;
use accord_proto::{ConnectionHandle, LocalMemory, Placement, PlacementTarget, RecvBufferId, RegionId, RegionKey};
use std::collections::BTreeMap;

/// One registered region: its key, size, and what landed in it.
#[derive(Clone, Debug)]
pub struct CountingRegion {
    pub key: RegionKey,
    pub len: u64,
    pub bytes_placed: u64,
    pub placements: u64,
    /// Every placement as (offset, len), kept when tracking is on, to prove each byte landed
    /// exactly once.
    pub extents: Option<Vec<(u64, u64)>>,
}

/// Regions of one host. Two-sided sends are refused: the fabric workloads are all writes.
#[derive(Debug, Default)]
pub struct CountingMemory {
    regions: BTreeMap<RegionId, CountingRegion>,
    track_extents: bool,
}

impl CountingMemory {
    /// `track_extents` records every placement (tests); off for large runs.
    pub fn new(track_extents: bool) -> Self {
        CountingMemory { regions: BTreeMap::new(), track_extents }
    }

    /// Registers region `id` of `len` bytes, writable by holders of `key`.
    pub fn register(&mut self, id: RegionId, key: RegionKey, len: u64) {
        let extents = self.track_extents.then(Vec::new);
        self.regions.insert(id, CountingRegion { key, len, bytes_placed: 0, placements: 0, extents });
    }

    /// Region `id` and what landed in it.
    pub fn region(&self, id: RegionId) -> Option<&CountingRegion> {
        self.regions.get(&id)
    }

    /// Counts a placement the protocol returned (never copies).
    pub fn place(&mut self, placement: &Placement) {
        let len = placement.payload.len() as u64;
        if let PlacementTarget::Region { region, offset } = placement.target {
            if let Some(r) = self.regions.get_mut(&region) {
                r.bytes_placed += len;
                r.placements += 1;
                if let Some(extents) = r.extents.as_mut() {
                    extents.push((offset, len));
                }
            }
        }
    }
}

impl CountingRegion {
    /// Whether every byte was placed exactly once (needs tracking on for the strict check;
    /// without it, only the total is compared).
    pub fn check_exactly_once(&self) -> Result<(), String> {
        if self.bytes_placed != self.len {
            return Err(format!("placed {} bytes of {}", self.bytes_placed, self.len));
        }
        let Some(extents) = &self.extents else { return Ok(()) };
        let mut sorted = extents.clone();
        sorted.sort_unstable();
        let mut next = 0;
        for (offset, len) in sorted {
            if offset != next {
                return Err(format!("byte {next}: next placement starts at {offset} (hole or overlap)"));
            }
            next = offset + len;
        }
        if next != self.len {
            return Err(format!("placements end at {next} of {}", self.len));
        }
        Ok(())
    }
}

impl LocalMemory for CountingMemory {
    fn check_write(&self, region: RegionId, key: RegionKey, offset: u64, len: u64) -> Result<(), RejectReason> {
        let r = self.regions.get(&region).ok_or(RejectReason::UnknownRegion)?;
        if r.key != key {
            return Err(RejectReason::BadKey);
        }
        match offset.checked_add(len) {
            Some(end) if end <= r.len => Ok(()),
            _ => Err(RejectReason::OutOfBounds),
        }
    }

    fn claim_recv_buffer(&mut self, _conn: ConnectionHandle, _msg_len: u64) -> Result<RecvBufferId, RejectReason> {
        Err(RejectReason::NoRecvBuffer)
    }
}
