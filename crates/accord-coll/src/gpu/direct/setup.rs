//! Setting up direct calls at a communicator's start: this rank's inbox, and every rank's
//! inbox registration and slot size from the start's meeting.

use std::sync::Arc;

use accord_cuda::{DeviceBuffer, Gpu};

use super::super::board::Board;
use super::super::config::GpuConfig;
use super::super::error::{GpuCollError, GpuResult};
use super::super::registry::{open_registration, PeerMapping};

/// This rank's inbox of direct collectives (VMM memory in the caller's context, which its peers
/// map from its file descriptors) and its slot's bytes, or None where they are off: the knob at
/// 0, one rank, no reduction kernels in the caller's context, or a slot too small to be worth it.
pub fn inbox(
    config: &GpuConfig,
    world_size: usize,
    kernels: bool,
    gpu: &Gpu,
) -> GpuResult<Option<(DeviceBuffer, usize)>> {
    let slot = super::slot_bytes(config.direct_bytes, world_size);
    if slot == 0 || !kernels {
        if config.direct_bytes > 0 && world_size > 1 && !kernels {
            tracing::warn!("ACCORD_GPU_DIRECT_BYTES: no reduction kernels in the caller's context (NVRTC); direct collectives are off");
        }
        return Ok(None);
    }
    Ok(Some((DeviceBuffer::alloc_shareable(gpu, 2 * world_size * slot)?, slot)))
}

/// Every rank's inbox registration id from the blobs of the start's meeting (`id`, slot bytes,
/// little-endian), checking that every rank chose the same slot (`mine`): a rank whose direct
/// calls its peers send the other way would wait for them until its timeout.
pub fn inboxes_of(blobs: &[Vec<u8>], mine: usize) -> GpuResult<Vec<u64>> {
    let mut ids = Vec::with_capacity(blobs.len());
    for (rank, blob) in blobs.iter().enumerate() {
        let word = |at: usize| blob.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
        let (Some(id), Some(slot)) = (word(0), word(8)) else {
            return Err(GpuCollError::Protocol {
                rank,
                what: format!("a start message of {} bytes, not 16", blob.len()),
            });
        };
        if slot != mine as u64 {
            return Err(GpuCollError::InvalidArgument {
                what: format!(
                    "rank {rank} pushes direct calls of up to {slot} bytes a peer and this rank up to {mine}: set the same \
                     ACCORD_GPU_DIRECT_BYTES on every rank (and make NVRTC available to all or none)"
                ),
            });
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Every peer's inbox (registration `ids[p]` in its table on `board`) mapped into `gpu`'s
/// context; None at this rank's index.
pub fn map_peer_inboxes(
    gpu: &Gpu,
    board: &Board,
    rank: usize,
    ids: &[u64],
) -> GpuResult<Vec<Option<Arc<PeerMapping>>>> {
    let map = |(p, &id): (usize, &u64)| match p == rank {
        true => Ok(None),
        false => open_registration(gpu, board, p, id).map(|(mapping, _)| Some(mapping)),
    };
    ids.iter().enumerate().map(map).collect()
}
