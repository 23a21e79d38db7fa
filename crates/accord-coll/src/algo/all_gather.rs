//! all_gather: ring, recursive doubling (with fold-in), Bruck. Every block is
//! written straight into its final place in the peers' outputs; `count` is
//! the per-rank block in elements and the output holds `n` blocks by rank.

use super::ctx::{Args, Ctx};
use super::{part, segments_per_block, Fold, FoldMap};
use crate::error::CollError;
use crate::transport::CollTransport;

/// Ring: step `s` forwards block `r - s` to the right neighbour, in segments with an
/// immediate each (step `s * segs + k`), each forwarded as soon as it lands.
pub(crate) fn ring<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, es, bb) = (cx.rank, cx.n, a.es(), a.count * a.es());
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    let peers = cx.handshake(&cx.handshake_of(a, true), &[right], &[left])?;
    let rh = &peers[&right];
    let segs = segments_per_block(a.count, a.segment_elems, n - 1, 0);
    let seg = |k: usize| {
        let e = part(a.count, segs, k);
        (e.start * es, e.len() * es)
    };
    let step = |s: usize, k: usize| (s * segs + k) as u32;
    for k in 0..segs {
        let (off, len) = seg(k);
        cx.put(right, a.send.sub(off, len), rh.recv_at(r * bb + off), step(0, k))?;
    }
    // The own block is copied while the first segments are on the wire.
    cx.copy(a.send.sub(0, bb), a.recv.sub(r * bb, bb))?;
    for s in 0..n - 1 {
        let b = (r + 2 * n - s - 1) % n;
        for k in 0..segs {
            cx.wait(left, step(s, k))?;
            if s < n - 2 {
                let (off, len) = seg(k);
                let at = b * bb + off;
                cx.put(right, a.recv.sub(at, len), rh.recv_at(at), step(s + 1, k))?;
            }
        }
    }
    cx.flush()
}

/// Recursive doubling over the power-of-two group; folded-out ranks hand
/// their block in first and receive everything else at the end.
pub(crate) fn recursive_doubling<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, bb) = (cx.rank, cx.n, a.count * a.es());
    let f = FoldMap::new(n);
    let steps = f.steps();
    let peers_list = f.exchange_peers(r);
    let peers = cx.handshake(&cx.handshake_of(a, true), &peers_list, &peers_list)?;
    cx.copy(a.send.sub(0, bb), a.recv.sub(r * bb, bb))?;
    let fold_out_step = steps + 1;
    match f.role(r) {
        Fold::Out => {
            cx.put(r + 1, a.send.sub(0, bb), peers[&(r + 1)].recv_at(r * bb), 0)?;
            cx.wait_n(r + 1, fold_out_step, 2)?;
        }
        Fold::In { new_rank: nr, partner_out } => {
            if let Some(p) = partner_out {
                cx.wait(p, 0)?;
            }
            for k in 0..steps {
                let d = 1usize << k;
                let partner = f.real(nr ^ d);
                let lo = nr & !(d - 1);
                let (start, end) = (f.vstart(lo) * bb, f.vstart(lo + d) * bb);
                cx.put(partner, a.recv.sub(start, end - start), peers[&partner].recv_at(start), 1 + k)?;
                cx.wait(partner, 1 + k)?;
            }
            if let Some(p) = partner_out {
                let hp = &peers[&p];
                cx.put(p, a.recv.sub(0, p * bb), hp.recv_at(0), fold_out_step)?;
                let rest = (p + 1) * bb;
                cx.put(p, a.recv.sub(rest, n * bb - rest), hp.recv_at(rest), fold_out_step)?;
            }
        }
    }
    cx.flush()
}

/// The contiguous block ranges `[first, first + cnt)` (mod n) splits into.
fn wrapped(first: usize, cnt: usize, n: usize) -> Vec<(usize, usize)> {
    if cnt == 0 {
        return vec![];
    }
    if first + cnt <= n {
        vec![(first, cnt)]
    } else {
        vec![(first, n - first), (0, first + cnt - n)]
    }
}

/// Bruck: at step k a rank sends the `min(2^k, n - 2^k)` blocks it holds,
/// starting at its own, to rank `r - 2^k`; ceil(log2 n) steps for any n.
/// Blocks are written at their final (absolute) positions, so no rotation.
pub(crate) fn bruck<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, bb) = (cx.rank, cx.n, a.count * a.es());
    let mut dists = Vec::new();
    let mut d = 1;
    while d < n {
        dists.push(d);
        d <<= 1;
    }
    let write_to: Vec<usize> = dists.iter().map(|d| (r + n - d) % n).collect();
    let written_by: Vec<usize> = dists.iter().map(|d| (r + d) % n).collect();
    let peers = cx.handshake(&cx.handshake_of(a, true), &write_to, &written_by)?;
    cx.copy(a.send.sub(0, bb), a.recv.sub(r * bb, bb))?;
    for (k, &d) in dists.iter().enumerate() {
        let cnt = d.min(n - d);
        let dest = (r + n - d) % n;
        for (first, len) in wrapped(r, cnt, n) {
            cx.put(dest, a.recv.sub(first * bb, len * bb), peers[&dest].recv_at(first * bb), k as u32)?;
        }
        let src = (r + d) % n;
        cx.wait_n(src, k as u32, wrapped(src, cnt, n).len() as u32)?;
    }
    cx.flush()
}
