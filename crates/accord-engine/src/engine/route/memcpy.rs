//! [`super::Route::Memcpy`]: a part for a peer engine of this process runs on the submitting
//! thread. The destination is checked exactly as the transport's receiver checks a packet
//! (region, key, bounds), then the bytes are copied and the immediate counted.

use crate::engine::part::PartKind;
use crate::engine::shared::Shared;
use crate::error::TransferError;
use crate::memory::Source;

/// Performs a part against a same-process peer: check, copy, count.
pub(crate) fn run_local(peer: &Shared, kind: PartKind, source: &Source) -> Result<(), TransferError> {
    match kind {
        PartKind::Write { region, key, offset, imm } => {
            {
                let regions = peer.regions.read().unwrap();
                regions.check_write(region, key, offset, source.len()).map_err(TransferError::Rejected)?;
                regions.place_from(region, offset, source);
            }
            if let Some(imm) = imm {
                peer.imms.bump(imm, &peer.jobs);
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
