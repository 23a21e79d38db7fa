//! [`super::Route::Staged`]: device memory bound for a host region of another process (this
//! host or another) goes through a bounded pool of pinned host slots: each chunk is copied
//! device-to-host into a slot, then sent as an ordinary host write, copies overlapping sends
//! (`ACCORD_DEVICE_STAGING_*`). The immediate goes once every chunk was delivered.

use super::dispatch::{dispatch_part, PartSpec};
use crate::completion::Transfer;
use crate::device::staging::driver::{FinishWrite, SendChunk, StagedJob, StagedSource};
use crate::engine::device::DeviceWriter;
use crate::engine::part::write_kind;
use crate::engine::WriteOp;
use crate::error::SubmitError;

impl DeviceWriter<'_> {
    /// Device memory to a host region of another process: staged through pinned slots, each
    /// chunk an ordinary host write; the immediate once every chunk was delivered.
    pub(crate) fn write_staged(&self, op: &WriteOp<'_>, source: StagedSource) -> Result<Transfer, SubmitError> {
        let peer = op.dst.engine;
        self.check_peer(peer)?;
        let stager = self.stager(source.ordinal)?;
        let state = self.device_transfer(op, 1);
        let (dst, dst_offset) = (*op.dst, op.dst_offset);
        let shared = self.shared.clone();
        let send: SendChunk = Box::new(move |offset, source| {
            let chunk = shared.new_internal_transfer(1);
            let kind = write_kind(&dst, dst_offset + offset, None);
            dispatch_part(&shared, PartSpec { peer, kind, source, lane: None }, chunk.clone());
            Transfer { state: chunk }
        });
        let user = state.clone();
        let finish: FinishWrite = Box::new(move |result| user.part_done(result));
        stager.submit(StagedJob { source, len: op.len, send, finish }).map_err(SubmitError::Invalid)?;
        Ok(Transfer { state })
    }
}
