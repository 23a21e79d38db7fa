//! Paged writes and scatters that touch device memory (a device source, or a device
//! destination). A paged write from device memory into a device region on one host goes as
//! batched copies on one stream with one event (`paged_through_copy_engine`); otherwise each
//! contiguous piece goes as one device write, by whichever route
//! [`Engine::write_device`] picks for it (copy engine in this process or through CUDA IPC,
//! staged through pinned slots, landed at the receiver), and the user's one transfer completes
//! when every piece did.
//!
//! Why this shape: a KV-cache move is a paged write out of GPU memory; every route already
//! moves one contiguous range correctly and counts its immediate after its last byte, so a
//! paged write is those ranges plus one immediate after all of them (a paged write's
//! immediate is counted once; a scatter's once per destination, as on the host path).

use std::sync::Arc;

use super::device::DeviceWriter;
use super::ops::{PagedWriteOp, ScatterDst};
use super::route::dispatch::dispatch_part;
use super::{Engine, WriteOp};
use crate::completion::{Transfer, TransferState};
use crate::error::SubmitError;
use crate::memory::MrHandle;

/// One contiguous piece: (destination offset, source offset, length) of one destination.
pub(super) type Piece = (u64, u64, u64);

impl Engine {
    /// Whether `src` names a device region of this engine.
    pub(super) fn is_device_region(&self, src: &MrHandle) -> Result<bool, SubmitError> {
        if src.engine != self.id() {
            return Err(SubmitError::UnknownSource);
        }
        let regions = self.shared.regions.read().unwrap();
        Ok(regions.get(src.region).ok_or(SubmitError::UnknownSource)?.device.is_some())
    }

    /// A paged write whose source or destination is device memory; `runs` are its contiguous
    /// runs (already bounds-checked against the destination).
    pub(super) fn write_paged_device(&self, op: &PagedWriteOp<'_>, runs: &[Piece]) -> Result<Transfer, SubmitError> {
        self.device_writer().write_runs(op, runs)
    }

    /// A scatter from device memory: one device write per destination, each with `imm`.
    pub(super) fn scatter_device(
        &self,
        src: &MrHandle,
        dsts: &[ScatterDst],
        imm: Option<u32>,
    ) -> Result<Transfer, SubmitError> {
        let state = self.shared.new_transfer(dsts.len());
        for d in dsts {
            let piece =
                WriteOp { src, src_offset: d.src_offset, dst: &d.dst, dst_offset: d.dst_offset, len: d.len, imm };
            self.piece_into(&piece, &state)?;
        }
        Ok(Transfer { state })
    }

    /// Submits one piece as its own device write; its outcome completes one part of `state`.
    fn piece_into(&self, piece: &WriteOp<'_>, state: &Arc<TransferState>) -> Result<(), SubmitError> {
        self.device_writer().piece_into(piece, state)
    }
}

impl DeviceWriter<'_> {
    /// The runs of a paged write touching device memory, as one transfer: batched copies on one
    /// stream where the copy engine reaches the destination, else one device write per run; the
    /// immediate once, after all of them. Also the owner's write back of a batched READ
    /// (`route::read::paged`), which has no `Engine`, only the shared state.
    pub(crate) fn write_runs(&self, op: &PagedWriteOp<'_>, runs: &[Piece]) -> Result<Transfer, SubmitError> {
        // Device to device on one host: every piece in batched copy calls and one event.
        if let Some(transfer) = self.paged_through_copy_engine(op, runs)? {
            return Ok(transfer);
        }
        let state = self.shared.new_transfer(runs.len().max(1));
        if let Some(imm) = op.imm {
            let trailer = WriteOp { src: op.src, src_offset: 0, dst: op.dst, dst_offset: 0, len: 0, imm: Some(imm) };
            let (shared, spec) = (self.shared.clone(), super::device::imm_part(&trailer, imm));
            *state.trailer.lock().unwrap() = Some(Box::new(move |st| dispatch_part(&shared, spec, st)));
        }
        if runs.is_empty() {
            state.part_done(Ok(()));
        }
        for &(dst_offset, src_offset, len) in runs {
            let piece = WriteOp { src: op.src, src_offset, dst: op.dst, dst_offset, len, imm: None };
            self.piece_into(&piece, &state)?;
        }
        Ok(Transfer { state })
    }

    /// Submits one piece as its own device write; its outcome completes one part of `state`.
    fn piece_into(&self, piece: &WriteOp<'_>, state: &Arc<TransferState>) -> Result<(), SubmitError> {
        let transfer = self.write_device(piece)?;
        let state = state.clone();
        transfer.on_complete(move |result| state.part_done(result));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::device::staging::tests::{fake_device, pattern, rig, staging_engine, wait_free};
    use crate::engine::tests::{assert_pages_landed, write_paged_counted_once};
    use crate::{PagedWriteOp, ScatterDst, TransferError, WriteOp};
    use accord_proto::wire::RejectReason;
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(20);

    /// A paged write out of (fake) device memory, staged to another engine's host region: pages
    /// land where the page map says, runs of consecutive pages go as one piece, and the
    /// immediate is counted once, after every page.
    #[test]
    fn paged_writes_from_device_memory_land_page_by_page_with_one_immediate() {
        const PAGE: usize = 16 << 10;
        let r = rig(5, 64 << 10, 3, None, WAIT);
        let b = staging_engine(WAIT);
        r.a.add_peer(&b.address()).unwrap();
        let src = pattern(32 * PAGE, 5);
        let h = fake_device(&r.a, &src);
        let dst = b.alloc(40 * PAGE).unwrap();
        let d = dst.descriptor();
        // Source pages 0..8 to 10..18 (one run), then 20, 3, 31 scattered.
        let src_pages: Vec<u64> = (0..8).chain([20, 3, 31]).collect();
        let dst_pages: Vec<u64> = (10..18).chain([0, 39, 25]).collect();
        write_paged_counted_once(&r.a, &b, &h, &d, PAGE, (&src_pages, &dst_pages), 11);
        let got = dst.to_vec();
        assert_pages_landed(&got, &src, PAGE, (&src_pages, &dst_pages));
        let written: usize = dst_pages.len() * PAGE;
        assert!(got.iter().filter(|&&x| x != 0).count() <= written, "nothing outside the pages");
        wait_free(&r.pool);
    }

    /// A paged write out of (fake) device memory whose last page is out of bounds (on either
    /// side) is refused at submission, before any page moves: nothing placed, nothing counted.
    #[test]
    fn paged_writes_from_device_memory_refused_at_their_last_page_place_nothing() {
        const PAGE: usize = 4 << 10;
        let r = rig(7, 64 << 10, 3, None, WAIT);
        let b = staging_engine(WAIT);
        r.a.add_peer(&b.address()).unwrap();
        let src = pattern(16 * PAGE, 7);
        let h = fake_device(&r.a, &src);
        let dst = b.alloc(16 * PAGE).unwrap();
        let d = dst.descriptor();
        let good: Vec<u64> = (0..12).collect();
        let bad: Vec<u64> = (0..11).chain([16]).collect();
        for (src_pages, dst_pages) in [(&good, &bad), (&bad, &good)] {
            let op = PagedWriteOp { src: &h, dst: &d, page_bytes: PAGE as u64, src_pages, dst_pages, imm: Some(5) };
            assert!(r.a.write_paged(&op).is_err(), "page 16 of 16 is refused");
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(b.imm_counter(5).value(), 0, "a refused write counts nothing");
        assert!(dst.to_vec().iter().all(|&x| x == 0), "a refused write places nothing");
        wait_free(&r.pool);
    }

    /// A scatter out of device memory: every destination gets its range and counts the
    /// immediate once; a refused destination fails the scatter.
    #[test]
    fn scatters_from_device_memory_reach_every_destination() {
        let r = rig(6, 64 << 10, 3, None, WAIT);
        let (b, c) = (staging_engine(WAIT), staging_engine(WAIT));
        r.a.add_peer(&b.address()).unwrap();
        r.a.add_peer(&c.address()).unwrap();
        let src = pattern(400_000, 6);
        let h = fake_device(&r.a, &src);
        let (db, dc) = (b.alloc(200_000).unwrap(), c.alloc(200_000).unwrap());
        let dsts = [
            ScatterDst { dst: db.descriptor(), dst_offset: 1000, src_offset: 0, len: 150_000 },
            ScatterDst { dst: dc.descriptor(), dst_offset: 0, src_offset: 150_000, len: 200_000 },
        ];
        r.a.scatter(&h, &dsts, Some(4)).unwrap().wait_timeout(WAIT).unwrap();
        assert_eq!(b.imm_counter(4).wait(1, WAIT), 1);
        assert_eq!(c.imm_counter(4).wait(1, WAIT), 1);
        assert_eq!(&db.to_vec()[1000..151_000], &src[..150_000]);
        assert_eq!(&dc.to_vec()[..], &src[150_000..350_000]);
        let mut forged = dsts;
        forged[1].dst.key ^= 1;
        let got = r.a.scatter(&h, &forged, Some(4)).unwrap().wait_timeout(WAIT);
        assert_eq!(got, Err(TransferError::Rejected(RejectReason::BadKey)));
        // A paged write with no pages still counts its immediate once; bad sizes are errors.
        let d = db.descriptor();
        let empty = PagedWriteOp { src: &h, dst: &d, page_bytes: 4096, src_pages: &[], dst_pages: &[], imm: Some(8) };
        r.a.write_paged(&empty).unwrap().wait_timeout(WAIT).unwrap();
        assert_eq!(b.imm_counter(8).wait(1, WAIT), 1);
        let op = WriteOp { src: &h, src_offset: 399_999, dst: &d, dst_offset: 0, len: 2, imm: None };
        assert!(r.a.write(&op).is_err(), "a source range past the device region is refused");
        wait_free(&r.pool);
    }
}
