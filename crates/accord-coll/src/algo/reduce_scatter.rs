//! reduce_scatter: ring and recursive halving (with fold-in). The input holds
//! `n` blocks of `count` elements; rank `r` ends with block `r` reduced.

use super::ctx::{Args, Ctx};
use super::{Algo, Fold, FoldMap};
use crate::error::CollError;
use crate::transport::CollTransport;

/// Scratch bytes for `input_bytes` of input on `n` ranks.
pub(crate) fn scratch_bytes(algo: Algo, input_bytes: usize, block_bytes: usize, n: usize) -> usize {
    match algo {
        Algo::RecursiveHalving => {
            let f = FoldMap::new(n);
            2 * input_bytes + halving_slot_base(f, block_bytes, f.steps())
        }
        Algo::Direct => super::direct::scratch_bytes(n, block_bytes),
        _ => input_bytes,
    }
}

/// Largest virtual block in bytes (two real blocks for folded pairs).
fn vblock_max(f: FoldMap, block_bytes: usize) -> usize {
    if f.rem > 0 {
        2 * block_bytes
    } else {
        block_bytes
    }
}

fn halving_slot_base(f: FoldMap, block_bytes: usize, k: u32) -> usize {
    (0..k).map(|j| (f.p >> (j + 1)) * vblock_max(f, block_bytes)).sum()
}

/// Ring: step `s` sends the partial of block `r - s - 1` (own input at
/// `s = 0`) into the right neighbour's scratch, which combines it with its
/// input and forwards it; after n-1 steps block `r` is complete.
pub(crate) fn ring<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, bb) = (cx.rank, cx.n, a.count * a.es());
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    let peers = cx.handshake(&cx.handshake_of(a, false), &[right], &[left])?;
    for s in 0..n - 1 {
        let b = (r + 2 * n - s - 1) % n;
        let src = if s == 0 { a.send.sub(b * bb, bb) } else { a.scratch(b * bb, bb) };
        cx.put(right, src, peers[&right].scratch_at(b * bb), s as u32)?;
        cx.wait(left, s as u32)?;
        let rb = (r + 2 * n - s - 2) % n;
        cx.reduce(a.scratch(rb * bb, bb), a.send.sub(rb * bb, bb), a)?;
    }
    cx.finish_avg(a.scratch(r * bb, bb), a)?;
    cx.copy(a.scratch(r * bb, bb), a.recv.sub(0, bb))?;
    cx.flush()
}

/// Recursive halving over virtual blocks of the power-of-two group, on a
/// working accumulator in scratch (the input is never modified).
pub(crate) fn recursive_halving<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, bb) = (cx.rank, cx.n, a.count * a.es());
    let total = n * bb;
    let f = FoldMap::new(n);
    let steps = f.steps();
    let peers_list = f.exchange_peers(r);
    let peers = cx.handshake(&cx.handshake_of(a, true), &peers_list, &peers_list)?;
    let fold_out_step = steps + 1;
    let acc = a.scratch(0, total);
    let fold_slot = a.scratch(total, total);
    let range = |lo: usize, hi: usize| (f.vstart(lo) * bb, (f.vstart(hi) - f.vstart(lo)) * bb);
    match f.role(r) {
        Fold::Out => {
            cx.put(r + 1, a.send.sub(0, total), peers[&(r + 1)].scratch_at(total), 0)?;
            cx.wait(r + 1, fold_out_step)?;
        }
        Fold::In { new_rank: nr, partner_out } => {
            cx.copy(a.send.sub(0, total), acc)?;
            if let Some(p) = partner_out {
                cx.wait(p, 0)?;
                cx.reduce(acc, fold_slot, a)?;
            }
            let mut lo = 0;
            for k in 0..steps {
                let d = f.p >> (k + 1);
                let partner = f.real(nr ^ d);
                let (keep_lo, give_lo) = if nr & d == 0 { (lo, lo + d) } else { (lo + d, lo) };
                let (give_off, give_len) = range(give_lo, give_lo + d);
                let (keep_off, keep_len) = range(keep_lo, keep_lo + d);
                let slot = 2 * total + halving_slot_base(f, bb, k);
                cx.put(partner, acc.sub(give_off, give_len), peers[&partner].scratch_at(slot), 1 + k)?;
                cx.wait(partner, 1 + k)?;
                cx.reduce(acc.sub(keep_off, keep_len), a.scratch(slot, keep_len), a)?;
                lo = keep_lo;
            }
            let (own_off, own_len) = range(nr, nr + 1);
            cx.finish_avg(acc.sub(own_off, own_len), a)?;
            if let Some(p) = partner_out {
                cx.put(p, acc.sub(p * bb, bb), peers[&p].recv_at(0), fold_out_step)?;
            }
            cx.copy(acc.sub(r * bb, bb), a.recv.sub(0, bb))?;
        }
    }
    cx.flush()
}
