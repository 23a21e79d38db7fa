//! all_reduce: ring, recursive doubling, Rabenseifner.
//!
//! All three first copy the input into the output (skipped in place) and then
//! work in place on the output; incoming partial results land in scratch.

use super::ctx::{Args, Ctx};
use super::{part, Fold, FoldMap};
use crate::error::CollError;
use crate::transport::CollTransport;

/// Scratch bytes each algorithm needs for `bytes` of data on `n` ranks.
pub(crate) fn scratch_bytes(algo: super::Algo, bytes: usize, count: usize, es: usize, n: usize) -> usize {
    let f = FoldMap::new(n);
    match algo {
        super::Algo::RecursiveDoubling => (1 + f.steps() as usize) * bytes,
        super::Algo::Rabenseifner => bytes + rab_slot_base(f, count, es, f.steps()),
        _ => bytes,
    }
}

/// Ring: reduce-scatter then all-gather, 2(n-1) steps.
///
/// Reduce-scatter step `s`: send block `r-s` (own input at `s = 0`, then the
/// partial just reduced in scratch) into the right neighbour's scratch; the
/// block `r-s-1` arriving from the left is combined as `scratch op= output`
/// and forwarded next step; at the last step it becomes final in the output.
/// All-gather: the final blocks travel on into the neighbours' outputs.
/// Output blocks are only read as input before any final value can arrive.
pub(crate) fn ring<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, es) = (cx.rank, cx.n, a.es());
    cx.copy(a.send, a.recv)?;
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    let peers = cx.handshake(&cx.handshake_of(a, true), &[right], &[left])?;
    let rh = &peers[&right];
    let blk = |b: usize| {
        let e = part(a.count, n, b);
        (e.start * es, e.len() * es)
    };
    for s in 0..n - 1 {
        let send_b = (r + n - s) % n;
        let (off, len) = blk(send_b);
        let src = if s == 0 { a.recv.sub(off, len) } else { a.scratch(off, len) };
        cx.put(right, src, rh.scratch_at(off), s as u32)?;
        cx.wait(left, s as u32)?;
        let recv_b = (r + 2 * n - s - 1) % n;
        let (off, len) = blk(recv_b);
        if s < n - 2 {
            cx.reduce(a.scratch(off, len), a.recv.sub(off, len), a)?;
        } else {
            cx.reduce(a.recv.sub(off, len), a.scratch(off, len), a)?;
            cx.finish_avg(a.recv.sub(off, len), a)?;
        }
    }
    for s in 0..n - 1 {
        let step = (n - 1 + s) as u32;
        let (off, len) = blk((r + 1 + n - s) % n);
        cx.put(right, a.recv.sub(off, len), rh.recv_at(off), step)?;
        cx.wait(left, step)?;
    }
    cx.flush()
}

/// Fold peers of a rank: (write_to, written_by) additions.
fn fold_peers(f: FoldMap, r: usize) -> Vec<usize> {
    match f.role(r) {
        Fold::Out => vec![r + 1],
        Fold::In { partner_out: Some(p), .. } => vec![p],
        Fold::In { .. } => vec![],
    }
}

/// Recursive doubling: log2(p) full-vector exchanges among the power-of-two
/// group, with fold-in/out of the extra ranks. Results are bitwise equal on
/// every rank (each exchange combines the same two operands on both sides).
pub(crate) fn recursive_doubling<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, bytes) = (cx.rank, a.count * a.es());
    let f = FoldMap::new(cx.n);
    let steps = f.steps();
    cx.copy(a.send, a.recv)?;
    let mut peers_list = fold_peers(f, r);
    if let Fold::In { new_rank, .. } = f.role(r) {
        peers_list.extend((0..steps).map(|k| f.real(new_rank ^ (1 << k))));
    }
    let peers = cx.handshake(&cx.handshake_of(a, true), &peers_list, &peers_list)?;
    let fold_out_step = steps + 1;
    match f.role(r) {
        Fold::Out => {
            cx.put(r + 1, a.recv, peers[&(r + 1)].scratch_at(0), 0)?;
            cx.wait(r + 1, fold_out_step)?;
        }
        Fold::In { new_rank, partner_out } => {
            if let Some(p) = partner_out {
                cx.wait(p, 0)?;
                cx.reduce(a.recv, a.scratch(0, bytes), a)?;
            }
            for k in 0..steps {
                let partner = f.real(new_rank ^ (1 << k));
                let slot = (1 + k as usize) * bytes;
                cx.put(partner, a.recv, peers[&partner].scratch_at(slot), 1 + k)?;
                cx.wait(partner, 1 + k)?;
                cx.flush()?; // our source is about to change
                cx.reduce(a.recv, a.scratch(slot, bytes), a)?;
            }
            cx.finish_avg(a.recv, a)?;
            if let Some(p) = partner_out {
                cx.put(p, a.recv, peers[&p].recv_at(0), fold_out_step)?;
            }
        }
    }
    cx.flush()
}

/// Start of the Rabenseifner halving slot of step `k` (after the fold slot).
fn rab_slot_base(f: FoldMap, count: usize, es: usize, k: u32) -> usize {
    let block_max = count.div_ceil(f.p.max(1));
    (0..k).map(|j| (f.p >> (j + 1)) * block_max * es).sum()
}

/// Rabenseifner: recursive-halving reduce-scatter over p blocks, then
/// recursive-doubling all-gather straight into the partners' outputs.
pub(crate) fn rabenseifner<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, es, bytes) = (cx.rank, a.es(), a.count * a.es());
    let f = FoldMap::new(cx.n);
    let steps = f.steps();
    cx.copy(a.send, a.recv)?;
    let mut peers_list = fold_peers(f, r);
    if let Fold::In { new_rank, .. } = f.role(r) {
        peers_list.extend((0..steps).map(|k| f.real(new_rank ^ (1 << k))));
    }
    let peers = cx.handshake(&cx.handshake_of(a, true), &peers_list, &peers_list)?;
    let fold_out_step = 2 * steps + 1;
    // Byte range of virtual blocks [lo, hi).
    let range = |lo: usize, hi: usize| {
        let s = part(a.count, f.p, lo).start * es;
        let e = if hi == 0 { 0 } else { part(a.count, f.p, hi - 1).end * es };
        (s, e - s)
    };
    match f.role(r) {
        Fold::Out => {
            cx.put(r + 1, a.recv, peers[&(r + 1)].scratch_at(0), 0)?;
            cx.wait(r + 1, fold_out_step)?;
        }
        Fold::In { new_rank: nr, partner_out } => {
            if let Some(p) = partner_out {
                cx.wait(p, 0)?;
                cx.reduce(a.recv, a.scratch(0, bytes), a)?;
            }
            let mut lo = 0;
            for k in 0..steps {
                let d = f.p >> (k + 1);
                let partner_nr = nr ^ d;
                let partner = f.real(partner_nr);
                let (keep_lo, give_lo) = if nr & d == 0 { (lo, lo + d) } else { (lo + d, lo) };
                let (give_off, give_len) = range(give_lo, give_lo + d);
                let (keep_off, keep_len) = range(keep_lo, keep_lo + d);
                let slot = bytes + rab_slot_base(f, a.count, es, k);
                cx.put(partner, a.recv.sub(give_off, give_len), peers[&partner].scratch_at(slot), 1 + k)?;
                cx.wait(partner, 1 + k)?;
                cx.reduce(a.recv.sub(keep_off, keep_len), a.scratch(slot, keep_len), a)?;
                lo = keep_lo;
            }
            let (own_off, own_len) = range(nr, nr + 1);
            cx.finish_avg(a.recv.sub(own_off, own_len), a)?;
            for k in 0..steps {
                let d = 1usize << k;
                let partner = f.real(nr ^ d);
                let my_lo = nr & !(d - 1);
                let (off, len) = range(my_lo, my_lo + d);
                let step = steps + 1 + k;
                cx.put(partner, a.recv.sub(off, len), peers[&partner].recv_at(off), step)?;
                cx.wait(partner, step)?;
            }
            if let Some(p) = partner_out {
                cx.put(p, a.recv, peers[&p].recv_at(0), fold_out_step)?;
            }
        }
    }
    cx.flush()
}
