//! Windows: a buffer every rank registered collectively, named on the device by its id (0, 1,
//! 2, ... in registration order, the same on every rank), plus the collective exchange of
//! engine descriptors that registration and setup share.
//!
//! A descriptor travels in its engine text form (`MrDescriptor::to_string_compact`, the token
//! `accord-coll`'s `EngineTransport` already puts on the wire for its registered buffers), so
//! a peer parses it with the same checked `MrDescriptor::parse`.

use crate::error::DeviceError;
use accord_coll::engine::EngineTransport;
use accord_coll::{Bufs, Communicator, DType};
use accord_engine::{MemoryKind, MrBuffer, MrDescriptor, MrHandle};

/// Bytes of one rank's record in a descriptor exchange: a length, a 2-byte token length and
/// the token. An engine descriptor's text, IPC handle included, is a few hundred bytes.
pub const EXCHANGE_RECORD_BYTES: usize = 1024;
/// Most windows one communicator registers.
pub const WINDOWS_MAX: usize = 1024;

/// One registered window, as the proxy sees it.
#[derive(Debug)]
pub(crate) struct Window {
    /// This rank's region (source of puts).
    pub(crate) local: MrHandle,
    /// Address of this rank's window (host, or device for [`MemoryKind::CudaDevice`]).
    pub(crate) base: u64,
    /// Bytes (the same on every rank).
    pub(crate) len: u64,
    /// Where this rank's window lives.
    pub(crate) kind: MemoryKind,
    /// Every rank's descriptor, indexed by rank (this rank's own included).
    pub(crate) peers: Vec<MrDescriptor>,
    /// The memory, when the communicator allocated it ([`crate::DeviceComm::alloc_window`]).
    pub(crate) owned: Option<MrBuffer>,
}

/// Every rank's `record` (at most [`EXCHANGE_RECORD_BYTES`] - 2 bytes), indexed by rank: one
/// all_gather over the communicator.
pub(crate) fn all_gather_records(
    comm: &mut Communicator<EngineTransport>,
    what: &str,
    record: &[u8],
) -> Result<Vec<Vec<u8>>, DeviceError> {
    let fail = |reason: String| DeviceError::Exchange { what: what.to_string(), reason };
    if record.len() + 2 > EXCHANGE_RECORD_BYTES {
        return Err(fail(format!("this rank's record of {} bytes does not fit {EXCHANGE_RECORD_BYTES}", record.len())));
    }
    let world = comm.world_size();
    let mut mine = vec![0u8; EXCHANGE_RECORD_BYTES];
    mine[..2].copy_from_slice(&(record.len() as u16).to_le_bytes());
    mine[2..2 + record.len()].copy_from_slice(record);
    let send = comm.register(mine).map_err(|e| fail(e.to_string()))?;
    let recv = comm.register(vec![0u8; EXCHANGE_RECORD_BYTES * world]).map_err(|e| fail(e.to_string()))?;
    let gathered = comm
        .all_gather(Bufs { send: send.all(), recv: recv.all() }, EXCHANGE_RECORD_BYTES, DType::U8, None)
        .and_then(|()| comm.read_typed::<u8>(recv.all()));
    let _ = comm.deregister(send);
    let _ = comm.deregister(recv);
    let all = gathered.map_err(|e| fail(e.to_string()))?;
    all.chunks(EXCHANGE_RECORD_BYTES)
        .enumerate()
        .map(|(rank, rec)| {
            let len = u16::from_le_bytes([rec[0], rec[1]]) as usize;
            if len + 2 > EXCHANGE_RECORD_BYTES {
                return Err(fail(format!("rank {rank} sent a record length of {len}")));
            }
            Ok(rec[2..2 + len].to_vec())
        })
        .collect()
}

/// A record: a `u64` length then the descriptor's text.
pub(crate) fn descriptor_record(len: u64, desc: &MrDescriptor) -> Vec<u8> {
    let mut out = len.to_le_bytes().to_vec();
    out.extend_from_slice(desc.to_string_compact().as_bytes());
    out
}

/// Parses every rank's [`descriptor_record`]; checks each rank's length equals rank 0's.
pub(crate) fn parse_descriptor_records(
    window: u32,
    what: &str,
    records: &[Vec<u8>],
) -> Result<Vec<MrDescriptor>, DeviceError> {
    let fail = |reason: String| DeviceError::Exchange { what: what.to_string(), reason };
    let mut out = Vec::with_capacity(records.len());
    let mut first_len = 0;
    for (rank, rec) in records.iter().enumerate() {
        if rec.len() < 8 {
            return Err(fail(format!("rank {rank} sent a record of {} bytes", rec.len())));
        }
        let len = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
        if rank == 0 {
            first_len = len;
        } else if len != first_len {
            return Err(DeviceError::WindowLengthMismatch { window, rank, len, first_rank: 0, first_len });
        }
        let text = std::str::from_utf8(&rec[8..]).map_err(|e| fail(format!("rank {rank}: {e}")))?;
        let desc = MrDescriptor::parse(text).map_err(|e| fail(format!("rank {rank}: {e}")))?;
        if desc.len < len {
            return Err(fail(format!("rank {rank}'s region has {} bytes, fewer than its window's {len}", desc.len)));
        }
        out.push(desc);
    }
    Ok(out)
}
