//! [`super::Route::Landing`]: host or device memory into a device region the copy engine
//! cannot reach (another host, or this host with `ACCORD_DEVICE_IPC=0`), chunk by chunk
//! through the receiver's pinned landing slots (the rendezvous is [`crate::engine::route::landing`]);
//! a device source is staged through this engine's own slots first. The immediate goes once
//! every chunk reached device memory there.

use crate::completion::Transfer;
use crate::device::staging::driver::{FinishWrite, SendChunk, StagedJob, StagedSource};
use crate::engine::device::DeviceWriter;
use crate::engine::device::LocalSource;
use crate::engine::route::landing;
use crate::engine::WriteOp;
use crate::error::SubmitError;
use crate::memory::{MemoryOwner, Source};

impl DeviceWriter<'_> {
    /// Host or device memory into a device region the copy engine cannot reach (another host,
    /// or this host with `device_ipc` off): chunk by chunk through the receiver's landing slots
    /// ([`super::landing`]); a device source is staged through this engine's pinned slots
    /// first. The immediate goes once every chunk reached device memory.
    pub(crate) fn write_landed(
        &self,
        op: &WriteOp<'_>,
        src: LocalSource,
        keep: Vec<MemoryOwner>,
    ) -> Result<Transfer, SubmitError> {
        let peer = op.dst.engine;
        self.check_peer(peer)?;
        let (dst, dst_offset) = (*op.dst, op.dst_offset);
        match src {
            LocalSource::Device { ptr, ordinal } => {
                let stager = self.stager(ordinal)?;
                let state = self.device_transfer(op, 1);
                let user = state.clone();
                let finish: FinishWrite = Box::new(move |result| user.part_done(result));
                let shared = self.shared.clone();
                let send: SendChunk = Box::new(move |offset, source| {
                    landing::land_chunk(&shared, peer, dst, dst_offset + offset, source)
                });
                let source = StagedSource { ptr, ordinal, _keep: keep };
                stager.submit(StagedJob { source, len: op.len, send, finish }).map_err(SubmitError::Invalid)?;
                Ok(Transfer { state })
            }
            LocalSource::Host { addr } => {
                let chunk_bytes = self.shared.config.device_staging_chunk_bytes.max(1);
                let count = op.len.div_ceil(chunk_bytes);
                // One part per chunk (an empty write: one part, done at once).
                let state = self.device_transfer(op, count.max(1) as usize);
                if count == 0 {
                    state.part_done(Ok(()));
                }
                let owner = keep.into_iter().next();
                for index in 0..count {
                    let offset = index * chunk_bytes;
                    let len = chunk_bytes.min(op.len - offset);
                    let source = Source::Region { base: addr + offset as usize, len, _keep: owner.clone() };
                    let chunk = landing::land_chunk(self.shared, peer, dst, dst_offset + offset, source);
                    let user = state.clone();
                    chunk.on_complete(move |result| user.part_done(result));
                }
                Ok(Transfer { state })
            }
        }
    }
}
