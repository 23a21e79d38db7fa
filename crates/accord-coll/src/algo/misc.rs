//! Barrier (dissemination) and point-to-point send/recv.

use super::ctx::{Args, Ctx, Handshake};
use crate::error::{CollError, TransportError};
use crate::transport::{CollTransport, Imm, STEP_P2P};

/// Dissemination barrier: at step k signal `r + 2^k`, wait for `r - 2^k`;
/// ceil(log2 n) steps, no data and no handshake.
pub(crate) fn barrier<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>) -> Result<(), CollError> {
    let (r, n) = (cx.rank, cx.n);
    let mut d = 1;
    let mut k = 0u32;
    while d < n {
        cx.t.signal((r + d) % n, cx.imm(k, r)).map_err(|e| cx.fail(e, &[(r + d) % n]))?;
        cx.wait((r + n - d) % n, k)?;
        d <<= 1;
        k += 1;
    }
    Ok(())
}

/// Receiver side: hand our output descriptor to `peer` (tagged with the
/// per-pair sequence `seq`), without waiting.
pub(crate) fn post_recv<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    peer: usize,
    seq: u64,
) -> Result<(), CollError> {
    let tag = Imm::new(seq, STEP_P2P, cx.rank).encode();
    cx.t.send_ctrl(peer, tag, &cx.handshake_of(a, true).encode()).map_err(|e| cx.fail(e, &[peer]))
}

/// Receiver side: wait for the data of `post_recv`'s message.
pub(crate) fn wait_recv<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, peer: usize, seq: u64) -> Result<(), CollError> {
    let imm = Imm::new(seq, STEP_P2P, peer).encode();
    cx.t.wait_imm(imm, 1, cx.deadline).map_err(|e| cx.fail(e, &[peer]))
}

/// Sender side: wait for the receiver's descriptor, check sizes, write.
pub(crate) fn send<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    peer: usize,
    seq: u64,
) -> Result<(), CollError> {
    let tag = Imm::new(seq, STEP_P2P, peer).encode();
    let bytes = cx.t.recv_ctrl(peer, tag, cx.deadline).map_err(|e| cx.fail(e, &[peer]))?;
    let hs = Handshake::decode(&bytes).map_err(|reason| cx.transport(TransportError::Malformed { peer, reason }))?;
    let mine = cx.handshake_of(a, false);
    for (field, ours, theirs) in [("count", mine.count, hs.count), ("dtype", mine.dtype as u64, hs.dtype as u64)] {
        if ours != theirs {
            return Err(CollError::Mismatch {
                collective: cx.collective.name(),
                peer,
                field,
                ours: ours.to_string(),
                theirs: theirs.to_string(),
            });
        }
    }
    if hs.recv.is_none() {
        return Err(cx.transport(TransportError::Malformed { peer, reason: "recv handshake lacks a buffer".into() }));
    }
    let imm = Imm::new(seq, STEP_P2P, cx.rank).encode();
    let src = a.send.sub(0, a.count * a.es());
    let r = if src.len == 0 { cx.t.signal(peer, imm) } else { cx.t.write(peer, src, hs.recv_at(0), Some(imm)) };
    r.map_err(|e| cx.fail(e, &[peer]))?;
    cx.flush()
}
