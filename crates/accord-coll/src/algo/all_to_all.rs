//! all_to_all and all_to_allv: direct (every write issued at once) and
//! pairwise exchange (step `s` writes to `r + s` and waits for `r - s`).
//! Both use immediate step 0 per sender, so ranks may even pick different
//! schedules. Blocks land straight in the receivers' outputs.

use super::ctx::{Args, Ctx, Handshake};
use super::Algo;
use crate::error::CollError;
use crate::transport::CollTransport;

/// Per-peer (send offset, send bytes, recv offset, recv bytes) of this rank.
fn layout(a: &Args<'_>, peer: usize) -> (usize, usize, usize, usize) {
    let es = a.es();
    match a.layout {
        Some(l) => {
            (l.send_displs[peer] * es, l.send_counts[peer] * es, l.recv_displs[peer] * es, l.recv_counts[peer] * es)
        }
        None => {
            let bb = a.count * es;
            (peer * bb, bb, peer * bb, bb)
        }
    }
}

/// Runs all_to_all (`a.layout` None) or all_to_allv.
pub(crate) fn run<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n) = (cx.rank, cx.n);
    let others = super::others(r, n);
    let base = cx.handshake_of(a, true);
    let mine = |peer: usize| -> Handshake {
        let (_, _, roff, rlen) = layout(a, peer);
        let mut h = base.clone();
        if a.layout.is_some() {
            // The receive offset travels per peer; the length is checked by the sender.
            h.recv = h.recv.map(|(d, o)| (d, o + roff as u64));
            h.extra = vec![(rlen / a.es()) as u64];
        }
        h
    };
    // all_to_allv handshakes already point at this rank's block; all_to_all's at the output.
    let dst_off = if a.layout.is_some() { 0 } else { r * a.count * a.es() };
    let send_to = |p: usize, theirs: &Handshake| -> Result<(), CollError> {
        let (soff, slen, _, _) = layout(a, p);
        if a.layout.is_some() {
            let want = theirs.extra.first().copied().unwrap_or(u64::MAX);
            if want != (slen / a.es()) as u64 {
                return Err(CollError::Mismatch {
                    collective: cx.collective.name(),
                    peer: p,
                    field: "count between this pair (send_counts here vs recv_counts there)",
                    ours: (slen / a.es()).to_string(),
                    theirs: want.to_string(),
                });
            }
        }
        cx.put_counted(p, a.send.sub(soff, slen), theirs.recv_at(dst_off), 0, a)
    };
    // Each peer's block arrives in as many segments as its length makes (see `put_counted`).
    let wait_from = |p: usize| -> Result<(), CollError> { cx.wait_counted(p, 0, layout(a, p).3, a) };
    let (soff, slen, roff, _) = layout(a, r);
    match cx.algo {
        Algo::Pairwise => {
            let peers = cx.handshake_each(&others, &others, mine)?;
            for s in 1..n {
                let p = (r + s) % n;
                send_to(p, &peers[&p])?;
                wait_from((r + n - s) % n)?;
            }
            cx.copy(a.send.sub(soff, slen), a.recv.sub(roff, slen))?;
        }
        _ => {
            // Write to each peer as soon as its handshake is in, starting with the next rank
            // (every rank starts with a different peer).
            cx.handshake_each_then(&others, &others, mine, send_to)?;
            // The own block is copied while the peers' blocks are on the wire.
            cx.copy(a.send.sub(soff, slen), a.recv.sub(roff, slen))?;
            for s in 1..n {
                wait_from((r + n - s) % n)?;
            }
        }
    }
    cx.flush()
}
