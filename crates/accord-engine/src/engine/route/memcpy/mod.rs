//! [`super::Route::Memcpy`]: a part for a peer engine of this process. The destination is
//! checked exactly as the transport's receiver checks a packet (region, key, bounds), then the
//! bytes are copied and the immediate counted.
//!
//! Short parts copy on the submitting thread: a hand-off costs more than the copy. Parts of
//! [`LOCAL_COPY_ASYNC_MIN_BYTES`] and more go to the engine's copy threads ([`pool`]) in chunks,
//! so the submitter returns at once and one large part is copied by several threads. Why: when
//! one process drives several GPUs (`all_reduce_perf -g 2`), NCCL's proxy thread submits every
//! send of both ranks; copying inline held it for each copy, one at a time, and all_reduce
//! through the plugin's host path ran at a single thread's memcpy speed (9.78 GB/s busbw at
//! 256 MiB against 13.67 with the copies forced onto the shared-memory lanes,
//! `scripts/device/nccl_tests.sh`, docs/results/2026-11-26-nccl-plugin-shapes.md).

pub(crate) mod pool;

use std::sync::Arc;

use accord_proto::wire::RejectReason;
use accord_proto::{RegionId, RegionKey};
use pool::CopyTarget;

use crate::completion::TransferState;
use crate::engine::part::PartKind;
use crate::engine::shared::Shared;
use crate::error::TransferError;
use crate::memory::Source;

/// Writes this long or longer are copied by the engine's copy threads, not the submitter.
///
/// 64 KiB, the NCCL plugin's smallest piece (`PIECE_BYTES_MIN` there): with 128 KiB, a plugin
/// engine of 12 workers split NCCL's 1 MiB receives into 11 pieces of 88 KiB and one of 56 KiB,
/// each copied on NCCL's proxy thread, and `all_reduce_perf -g 2` fell from 21.54-23.14 GB/s busbw at 256 MiB
/// to 9.44-10.32, Socket's speed (docs/results/2026-11-27-plugin-workers.md).
pub const LOCAL_COPY_ASYNC_MIN_BYTES: u64 = 64 << 10;

/// Performs a part against a same-process peer on the calling thread: check, copy, count.
pub(crate) fn run_local(peer: &Shared, kind: PartKind, source: &Source) -> Result<(), TransferError> {
    match kind {
        PartKind::Write { region, key, offset, imm } => {
            peer.place(region, key, offset, source).map_err(TransferError::Rejected)?;
            if let Some(imm) = imm {
                peer.count_imm(imm);
            }
            Ok(())
        }
        PartKind::Send { imm } => {
            let mut bytes = vec![0u8; source.len() as usize];
            source.read(0, &mut bytes);
            peer.recv.deliver_local(&bytes, imm, &peer.jobs).map_err(TransferError::Rejected)
        }
    }
}

impl CopyTarget for Shared {
    fn place(&self, region: RegionId, key: RegionKey, offset: u64, source: &Source) -> Result<(), RejectReason> {
        let regions = self.regions.read().unwrap();
        regions.check_write(region, key, offset, source.len())?;
        regions.place_from(region, offset, source);
        Ok(())
    }

    fn count_imm(&self, imm: u32) {
        self.imms.bump(imm, &self.jobs);
    }
}

/// Runs a part against a same-process peer: large writes on `local`'s copy threads, everything
/// else here. `transfer` learns the outcome either way.
pub(crate) fn dispatch_local(
    local: &Shared,
    peer: Arc<Shared>,
    kind: PartKind,
    source: Source,
    transfer: Arc<TransferState>,
) {
    if let PartKind::Write { region, key, offset, imm } = kind {
        if source.len() >= LOCAL_COPY_ASYNC_MIN_BYTES {
            // Refused at once if the destination is wrong, as an inline copy would be.
            let checked = peer.regions.read().unwrap().check_write(region, key, offset, source.len());
            match checked {
                Err(reason) => transfer.part_done(Err(TransferError::Rejected(reason))),
                Ok(()) => {
                    local.local_copies.submit(pool::LocalWrite { peer, region, key, offset, imm, source, transfer })
                }
            }
            return;
        }
    }
    let result = run_local(&peer, kind, &source);
    drop(source); // released before completion, as `Part::finish` does
    transfer.part_done(result);
}

#[cfg(test)]
mod tests;
