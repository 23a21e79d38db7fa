//! The transport that collectives run over: what a host-driven, zero-copy
//! collective needs from the TransferEngine, and nothing more.
//!
//! # Model
//! - Memory is **registered** with [`CollTransport::register`], which takes the
//!   user's buffer by value (no copy) and returns a [`LocalBuf`] handle. Its
//!   [`RemoteBufDesc`] can be sent to peers, who then [`CollTransport::write`]
//!   straight into it: data lands in the peer's registered user buffer.
//! - A write may carry a 32-bit **immediate**. The receiver counts immediates
//!   per value; a count moves only when every byte of that write has been
//!   placed. [`CollTransport::wait_imm`] waits for and consumes counts.
//! - **Control messages** ([`CollTransport::send_ctrl`]/[`CollTransport::recv_ctrl`])
//!   are small tagged two-sided messages (the engine's `send`), used to hand
//!   buffer descriptors to the peers that will write into them. Delivery is
//!   unordered; the `(sender, tag)` pair identifies a message.
//! - Every wait takes a **deadline**; a wait that passes it returns
//!   [`TransportError::Timeout`], and a stuck report from any peer
//!   ([`CollTransport::report_stuck`]) makes every wait return
//!   [`TransportError::Aborted`] at once, so a failure is seen everywhere
//!   and the ranks can work out together which rank is at fault.
//!
//! # Immediate encoding ([`Imm`])
//! `imm = seq (11 bits) << 21 | step (11 bits) << 10 | sender (10 bits)`:
//! - `sender`: the writing rank, so a receiver waits per sender and a timeout
//!   names exactly the rank that did not deliver ([`WORLD_SIZE_MAX`] = 1024);
//! - `step`: the step of the schedule (`0..=STEP_DATA_MAX`); the values above
//!   are reserved: [`STEP_HANDSHAKE`] tags descriptor handshakes (control
//!   messages) and [`STEP_P2P`] tags point-to-point send/recv;
//! - `seq`: the collective sequence number modulo 2048 (for send/recv, the
//!   per-peer-pair sequence). Every collective that moves data starts with a
//!   handshake, so no rank can run more than one collective ahead of a peer it
//!   writes to, far below the wrap-around.

use accord_proto::frame::{FrameError, FrameReader};
use std::time::Instant;

use crate::error::TransportError;

/// Most ranks a world may have (10 bits of sender in the immediate).
pub const WORLD_SIZE_MAX: usize = 1 << Imm::SENDER_BITS;
/// Largest step number a schedule may use for data.
pub const STEP_DATA_MAX: u32 = (1 << Imm::STEP_BITS) - 3;
/// Step value reserved for descriptor handshakes. (The host arena's setup tags its four
/// control messages with the data steps `STEP_DATA_MAX - 3 ..= STEP_DATA_MAX`: control tags
/// and immediates are counted apart, and the arena sends no immediate.)
pub const STEP_HANDSHAKE: u32 = (1 << Imm::STEP_BITS) - 2;
/// Step value reserved for point-to-point send/recv.
pub const STEP_P2P: u32 = (1 << Imm::STEP_BITS) - 1;
/// Largest opaque token a remote descriptor may carry.
pub const REMOTE_TOKEN_BYTES_MAX: usize = 256;
/// Largest control message.
pub const CTRL_MESSAGE_BYTES_MAX: usize = 64 * 1024;

/// A decoded 32-bit immediate (see the module docs for the layout).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Imm {
    /// Sequence number modulo 2^11.
    pub seq: u32,
    /// Schedule step.
    pub step: u32,
    /// Writing rank.
    pub sender: u32,
}

impl Imm {
    /// Bits of the sequence number.
    pub const SEQ_BITS: u32 = 11;
    /// Bits of the step.
    pub const STEP_BITS: u32 = 11;
    /// Bits of the sender.
    pub const SENDER_BITS: u32 = 10;

    /// Builds an immediate; `seq` is reduced modulo 2^11. Panics (our own
    /// invariant) if step or sender do not fit.
    pub fn new(seq: u64, step: u32, sender: usize) -> Imm {
        assert!(step < (1 << Self::STEP_BITS), "step {step} does not fit the immediate");
        assert!(sender < WORLD_SIZE_MAX, "sender {sender} does not fit the immediate");
        Imm { seq: (seq % (1 << Self::SEQ_BITS)) as u32, step, sender: sender as u32 }
    }

    /// The 32-bit wire value.
    pub fn encode(self) -> u32 {
        (self.seq << (Self::STEP_BITS + Self::SENDER_BITS)) | (self.step << Self::SENDER_BITS) | self.sender
    }

    /// Inverse of [`Imm::encode`].
    pub fn decode(v: u32) -> Imm {
        Imm {
            seq: v >> (Self::STEP_BITS + Self::SENDER_BITS),
            step: (v >> Self::SENDER_BITS) & ((1 << Self::STEP_BITS) - 1),
            sender: v & ((1 << Self::SENDER_BITS) - 1),
        }
    }
}

/// A registered local buffer. Owned by the user; hand it back with
/// [`CollTransport::deregister`] to get the memory back.
#[derive(Debug, PartialEq, Eq)]
pub struct LocalBuf {
    id: u64,
    len: usize,
    desc: RemoteBufDesc,
}

impl LocalBuf {
    /// Made by transports in [`CollTransport::register`].
    pub fn new(id: u64, len: usize, desc: RemoteBufDesc) -> LocalBuf {
        LocalBuf { id, len, desc }
    }
    /// The transport's id of this registration.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Registered length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer has zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The descriptor peers need to write into this buffer.
    pub fn remote_desc(&self) -> &RemoteBufDesc {
        &self.desc
    }
    /// The whole buffer as a slice.
    pub fn all(&self) -> BufSlice<'_> {
        BufSlice { buf: self, offset: 0, len: self.len }
    }
    /// `len` bytes at `offset` (bounds are checked where the slice is used).
    pub fn slice(&self, offset: usize, len: usize) -> BufSlice<'_> {
        BufSlice { buf: self, offset, len }
    }
}

/// A byte range of a registered local buffer.
#[derive(Copy, Clone, Debug)]
pub struct BufSlice<'a> {
    /// The buffer.
    pub buf: &'a LocalBuf,
    /// Start, in bytes.
    pub offset: usize,
    /// Length, in bytes.
    pub len: usize,
}

impl<'a> BufSlice<'a> {
    /// A sub-range, relative to this slice.
    pub fn sub(&self, offset: usize, len: usize) -> BufSlice<'a> {
        BufSlice { buf: self.buf, offset: self.offset + offset, len }
    }
    /// Whether two slices are the very same region.
    pub fn same_region(&self, other: &BufSlice<'_>) -> bool {
        self.buf.id == other.buf.id && self.offset == other.offset && self.len == other.len
    }
    /// Checks the range against the registered length.
    pub fn check(&self, what: &'static str) -> Result<(), TransportError> {
        if self.offset.checked_add(self.len).is_none_or(|end| end > self.buf.len) {
            return Err(TransportError::OutOfBounds {
                what,
                offset: self.offset,
                len: self.len,
                buf_len: self.buf.len,
            });
        }
        Ok(())
    }
}

/// What a peer needs to write into a registered buffer: the owner, the length,
/// and an opaque transport token (for the engine: the serialised memory-region
/// descriptor with its remote key).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteBufDesc {
    /// The owning rank.
    pub rank: usize,
    /// Registered length in bytes.
    pub len: u64,
    /// Transport-specific token, at most [`REMOTE_TOKEN_BYTES_MAX`] bytes.
    pub token: Vec<u8>,
}

impl RemoteBufDesc {
    /// Appends the wire form: rank u32, len u64, token length u16, token.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.rank as u32).to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.token);
    }

    /// Parses the wire form from the front of `input`, returning the rest.
    pub fn decode(input: &[u8]) -> Result<(RemoteBufDesc, &[u8]), String> {
        let mut reader = FrameReader::new(input);
        let desc = RemoteBufDesc::read(&mut reader)?;
        Ok((desc, reader.rest()))
    }

    /// Reads the wire form at `reader`'s position.
    pub fn read(reader: &mut FrameReader<'_>) -> Result<RemoteBufDesc, String> {
        let header = |e: FrameError| format!("descriptor header: {e}");
        let rank = reader.u32().map_err(header)? as usize;
        let len = reader.u64().map_err(header)?;
        let token_len = reader.u16().map_err(header)? as usize;
        if token_len > REMOTE_TOKEN_BYTES_MAX {
            return Err(format!("descriptor token of {token_len} bytes is longer than {REMOTE_TOKEN_BYTES_MAX}"));
        }
        let token = reader.bytes(token_len).map_err(|e| format!("descriptor token: {e}"))?.to_vec();
        Ok(RemoteBufDesc { rank, len, token })
    }
}

/// A destination range in a peer's registered buffer; its length is the
/// length of the source slice.
#[derive(Copy, Clone, Debug)]
pub struct RemoteSlice<'a> {
    /// The peer's buffer.
    pub desc: &'a RemoteBufDesc,
    /// Start, in bytes.
    pub offset: usize,
}

/// A write that passed the checks every transport makes before it ([`CollTransport::write`]):
/// what [`CollTransport::write_checked`] receives.
#[derive(Copy, Clone, Debug)]
pub struct CheckedWrite<'a> {
    /// The destination rank (below the transport's world size).
    pub peer: usize,
    /// The local source range (inside its buffer).
    pub src: BufSlice<'a>,
    /// The destination range (the peer's buffer, inside it).
    pub dst: RemoteSlice<'a>,
    /// The immediate the receiver counts once every byte landed.
    pub imm: Option<u32>,
}

/// The checks every transport makes before a write: the source range fits its buffer, the
/// descriptor belongs to `peer`, and the destination range fits the peer's buffer.
pub fn check_write(peer: usize, src: BufSlice<'_>, dst: &RemoteSlice<'_>) -> Result<(), TransportError> {
    src.check("write source")?;
    if dst.desc.rank != peer {
        return Err(TransportError::NotRegistered {
            what: format!("descriptor of rank {} used for a write to rank {peer}", dst.desc.rank),
        });
    }
    let dst_len = dst.desc.len as usize;
    if dst.offset.checked_add(src.len).is_none_or(|end| end > dst_len) {
        return Err(TransportError::OutOfBounds {
            what: "write destination",
            offset: dst.offset,
            len: src.len,
            buf_len: dst_len,
        });
    }
    Ok(())
}

/// The checks before a local access: both ranges fit their buffers, and when they are in one
/// buffer (`same_buffer`) they do not overlap.
pub fn check_local_access(src: BufSlice<'_>, dst: BufSlice<'_>, same_buffer: bool) -> Result<(), TransportError> {
    src.check("local source")?;
    dst.check("local destination")?;
    if same_buffer {
        let (a, b) = (src.offset, dst.offset);
        let disjoint = a + src.len <= b || b + dst.len <= a || src.len == 0 || dst.len == 0;
        if !disjoint {
            return Err(TransportError::Overlap { src_offset: a, dst_offset: b, len: src.len.max(dst.len) });
        }
    }
    Ok(())
}

/// Local memory access callback: a read view of the source and a write view of
/// the destination.
pub type LocalAccessFn<'f> = dyn FnMut(&[u8], &mut [u8]) + 'f;

/// What host-driven zero-copy collectives need from a transport.
///
/// Implemented in-process by [`crate::LocalTransport`]; the TransferEngine
/// adapter implements it with registered memory regions, one-sided writes with
/// immediates, and sends.
pub trait CollTransport: Send + Sync {
    /// This rank.
    fn rank(&self) -> usize;

    /// Number of ranks (at most [`WORLD_SIZE_MAX`]).
    fn world_size(&self) -> usize;

    /// Registers `memory` for one-sided writes by peers, taking ownership so no
    /// one else aliases it while peers may write.
    fn register(&self, memory: Vec<u8>) -> Result<LocalBuf, TransportError>;

    /// Deregisters and returns the memory. The caller guarantees no peer still
    /// writes into it (collectives finish with all their writes placed).
    fn deregister(&self, buf: LocalBuf) -> Result<Vec<u8>, TransportError>;

    /// [`TransportError::BadRank`] unless `peer` is a rank of this job (below
    /// [`Self::world_size`]).
    fn check_peer(&self, peer: usize) -> Result<(), TransportError> {
        let world_size = self.world_size();
        if peer >= world_size {
            return Err(TransportError::BadRank { rank: peer, world_size });
        }
        Ok(())
    }

    /// One-sided write of `src` into `dst` on `peer`, carrying `imm` if given.
    /// Non-blocking: the source must stay untouched until [`Self::flush`]
    /// returns. The receiver's count of `imm` moves once all bytes are placed.
    ///
    /// Makes the checks every transport makes before a write ([`Self::check_peer`],
    /// [`check_write`]) and hands the write to [`Self::write_checked`], so no transport can
    /// skip them.
    fn write(
        &self,
        peer: usize,
        src: BufSlice<'_>,
        dst: RemoteSlice<'_>,
        imm: Option<u32>,
    ) -> Result<(), TransportError> {
        self.check_peer(peer)?;
        check_write(peer, src, &dst)?;
        self.write_checked(CheckedWrite { peer, src, dst, imm })
    }

    /// The transport's own part of [`Self::write`], once its checks passed.
    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<(), TransportError>;

    /// An immediate with no payload (a zero-byte write).
    fn signal(&self, peer: usize, imm: u32) -> Result<(), TransportError>;

    /// Waits until every write issued so far has completed at the sender (all
    /// bytes acknowledged), so its sources may be reused. Past `deadline` it fails with
    /// [`TransportError::AckTimeout`] naming the first rank still owing acknowledgements.
    fn flush(&self, deadline: Instant) -> Result<(), TransportError>;

    /// Waits until `count` immediates of value `imm` have arrived, then
    /// consumes them. Immediates that arrive before the wait are kept.
    fn wait_imm(&self, imm: u32, count: u32, deadline: Instant) -> Result<(), TransportError>;

    /// Sends a small tagged control message (at most [`CTRL_MESSAGE_BYTES_MAX`]).
    fn send_ctrl(&self, peer: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError>;

    /// Receives the control message `tag` from `peer`, waiting until `deadline`.
    fn recv_ctrl(&self, peer: usize, tag: u32, deadline: Instant) -> Result<Vec<u8>, TransportError>;

    /// Runs `f` over a read view of `src` and a write view of `dst`, both local
    /// registered memory (regions of one buffer must not overlap). This is how
    /// local copies and reductions touch registered memory.
    fn access_local(
        &self,
        src: BufSlice<'_>,
        dst: BufSlice<'_>,
        f: &mut LocalAccessFn<'_>,
    ) -> Result<(), TransportError>;

    /// Copies bytes out of a registered buffer.
    fn read_local(&self, src: BufSlice<'_>, out: &mut [u8]) -> Result<(), TransportError>;

    /// Copies bytes into a registered buffer.
    fn write_local(&self, dst: BufSlice<'_>, data: &[u8]) -> Result<(), TransportError>;

    /// Tells every peer that this rank is stuck waiting for `waiting_on`
    /// (it timed out, or was interrupted by another report); from then on
    /// their waits return [`TransportError::Aborted`]. Best effort; a dead
    /// rank reports nothing, which is how the others find it.
    fn report_stuck(&self, waiting_on: usize);

    /// Stuck reports received so far, as `(reporter, waiting_on)`, first
    /// report per reporter.
    fn stuck_reports(&self) -> Vec<(usize, usize)>;

    /// Why this transport declared `rank` dead (its process exited, it answered no
    /// keepalive), or `None` if it did not or cannot tell. The blame path asks it about the
    /// rank the reports lead to, so the error says the rank died, not only that it went quiet.
    fn peer_death(&self, _rank: usize) -> Option<String> {
        None
    }

    /// The shared-memory directory where the ranks may map a host arena (`crate::arena`) if
    /// they turn out to share a host, or `None`: the arena bypasses the transport's routes, so
    /// a transport that must carry every byte itself (a simulator, a run forced onto the
    /// network routes, shared memory turned off) has none.
    fn host_memory_dir(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// Names the communicator in stuck reports: equal on every rank of it (empty: unknown).
    fn comm_id(&self) -> String {
        String::new()
    }

    /// What stuck reports say of an awaited rank (liveness, per-path statistics); `None` when
    /// the transport has nothing to say.
    fn peer_reporter(&self) -> Option<crate::report::PeerReporter> {
        None
    }

    /// All-gather of small blobs (e.g. descriptors at setup): returns every
    /// rank's blob, indexed by rank. The default uses control messages tagged
    /// `tag`; an engine may route it through the bootstrap store instead.
    fn exchange_blobs(&self, tag: u32, blob: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>, TransportError> {
        let (me, n) = (self.rank(), self.world_size());
        for peer in (0..n).filter(|&p| p != me) {
            self.send_ctrl(peer, tag, blob)?;
        }
        (0..n).map(|peer| if peer == me { Ok(blob.to_vec()) } else { self.recv_ctrl(peer, tag, deadline) }).collect()
    }
}

#[cfg(test)]
mod tests;
