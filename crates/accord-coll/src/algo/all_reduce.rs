//! all_reduce: ring, recursive doubling, Rabenseifner.
//!
//! Recursive doubling first copies the input into the output (skipped in place) and works
//! in place there; ring and Rabenseifner read the input where it is and copy into the output
//! only the segments they reduce there, just before reducing them. Incoming partial results
//! land in scratch.

use super::ctx::{Args, Ctx};
use super::{part, segments_per_block, Fold, FoldMap};
use crate::error::CollError;
use crate::transport::CollTransport;

/// Scratch bytes each algorithm needs for `bytes` of data on `n` ranks.
pub(crate) fn scratch_bytes(algo: super::Algo, bytes: usize, count: usize, es: usize, n: usize) -> usize {
    let f = FoldMap::new(n);
    match algo {
        super::Algo::RecursiveDoubling => (1 + f.steps() as usize) * bytes,
        super::Algo::Rabenseifner => bytes + rab_slot_base(f, count, es, f.steps()),
        super::Algo::Direct => super::direct::scratch_bytes(n, count.div_ceil(n) * es),
        super::Algo::Arena => 0,
        _ => bytes,
    }
}

/// Ring: reduce-scatter then all-gather, 2(n-1) steps, pipelined in segments.
///
/// Reduce-scatter step `s`: block `r-s` goes to the right neighbour's scratch (own input at
/// `s = 0`, then the partial just reduced in scratch); the block `r-s-1` arriving from the
/// left is combined as `scratch op= input` and forwarded next step; at the last step it
/// becomes final in the output (`output = input op scratch`). All-gather: the final blocks
/// travel on into the neighbours' outputs. Peers never write the input, so it may be read
/// at any time.
///
/// Every block moves in `segs` segments, each with its own immediate (step `s * segs + k`),
/// and each segment is forwarded as soon as it is reduced: segment k+1 is on the wire while
/// segment k is reduced, and the all-gather starts with the first final segment.
///
/// The input is read where it is (no up-front copy into the output): only the segments of
/// the block this rank finalises are copied, each right before it is reduced.
pub(crate) fn ring<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, es) = (cx.rank, cx.n, a.es());
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    let peers = cx.handshake(&cx.handshake_of(a, true), &[right], &[left])?;
    let rh = &peers[&right];
    let segs = segments_per_block(a.count.div_ceil(n), a.segment_elems, 2 * (n - 1), 0);
    // Byte offset and length of segment `k` of block `b`.
    let seg = |b: usize, k: usize| {
        let e = part(a.count, n, b);
        let p = part(e.len(), segs, k);
        ((e.start + p.start) * es, p.len() * es)
    };
    let step = |s: usize, k: usize| (s * segs + k) as u32;
    for k in 0..segs {
        let (off, len) = seg(r, k);
        cx.put(right, a.send.sub(off, len), rh.scratch_at(off), step(0, k))?;
    }
    for s in 0..n - 1 {
        let b = (r + 2 * n - s - 1) % n;
        for k in 0..segs {
            let (off, len) = seg(b, k);
            cx.wait(left, step(s, k))?;
            if s < n - 2 {
                cx.reduce(a.scratch(off, len), a.send.sub(off, len), a)?;
                cx.put(right, a.scratch(off, len), rh.scratch_at(off), step(s + 1, k))?;
            } else {
                cx.reduce_from(a.recv.sub(off, len), a.send.sub(off, len), a.scratch(off, len), a)?;
                cx.finish_avg(a.recv.sub(off, len), a)?;
                cx.put(right, a.recv.sub(off, len), rh.recv_at(off), step(n - 1, k))?;
            }
        }
    }
    for s in 0..n - 1 {
        let b = (r + n - s) % n;
        for k in 0..segs {
            cx.wait(left, step(n - 1 + s, k))?;
            if s < n - 2 {
                let (off, len) = seg(b, k);
                cx.put(right, a.recv.sub(off, len), rh.recv_at(off), step(n + s, k))?;
            }
        }
    }
    cx.flush()
}

/// Recursive doubling: log2(p) full-vector exchanges among the power-of-two
/// group, with fold-in/out of the extra ranks. Results are bitwise equal on
/// every rank (each exchange combines the same two operands on both sides).
pub(crate) fn recursive_doubling<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, bytes) = (cx.rank, a.count * a.es());
    let f = FoldMap::new(cx.n);
    let steps = f.steps();
    cx.copy(a.send, a.recv)?;
    let peers_list = f.exchange_peers(r);
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

/// The segment plan of Rabenseifner's halving steps (the same on every rank).
///
/// At step `k` a rank gives away `d = p >> (k+1)` virtual blocks. That range is cut in two
/// halves (at the middle block, or at the middle element when `d = 1`) and each half in
/// `segs[k]` segments, each with its own immediate. The receiver of a range forwards one
/// half of it at the next step; both sides send and reduce that half first, and the
/// receiver posts the next step's writes as soon as it is reduced, so the next step's
/// transfer overlaps this step's remaining reduction.
struct HalvingPlan {
    /// Segments per half, by step.
    segs: Vec<usize>,
    /// First immediate step of each halving step (after the fold-in step 0).
    base: Vec<usize>,
    /// First immediate step after the halving steps.
    end: usize,
}

impl HalvingPlan {
    fn new(f: FoldMap, count: usize, segment_elems: usize) -> HalvingPlan {
        let steps = f.steps() as usize;
        let block_max = count.div_ceil(f.p.max(1));
        // Reserved: the fold-in step, one all-gather step per halving step, the fold-out step.
        let reserved = 2 + steps;
        let segs: Vec<usize> = (0..steps)
            .map(|k| {
                let half_max = (block_max * (f.p >> (k + 1))).div_ceil(2);
                segments_per_block(half_max, segment_elems, 2 * steps, reserved)
            })
            .collect();
        let mut base = Vec::with_capacity(steps);
        let mut next = 1;
        for s in &segs {
            base.push(next);
            next += 2 * s;
        }
        HalvingPlan { segs, base, end: next }
    }

    fn imm_step(&self, k: usize, half: usize, j: usize) -> u32 {
        (self.base[k] + half * self.segs[k] + j) as u32
    }
}

/// Element range of half `h` of the `d` virtual blocks from `lo` (`count` elements in `p` blocks).
fn half_range(count: usize, p: usize, lo: usize, d: usize, h: usize) -> std::ops::Range<usize> {
    let start = part(count, p, lo).start;
    let end = part(count, p, lo + d - 1).end;
    if d >= 2 {
        let mid = part(count, p, lo + d / 2).start;
        if h == 0 {
            start..mid
        } else {
            mid..end
        }
    } else {
        let e = part(end - start, 2, h);
        start + e.start..start + e.end
    }
}

/// The order in which halves of step `k`'s range travel: the half its receiver gives away
/// at step `k+1` first. `nr` is either end's virtual rank (they agree on that bit).
fn half_order(f: FoldMap, nr: usize, k: usize) -> [usize; 2] {
    let next_d = f.p >> (k + 2);
    if next_d == 0 || nr & next_d != 0 {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Rabenseifner: recursive-halving reduce-scatter over p blocks, then
/// recursive-doubling all-gather straight into the partners' outputs.
/// The halving steps are pipelined in segments (see [`HalvingPlan`]). The input is read
/// where it is: the first step gives from it and copies only the segments it keeps, each
/// right before reducing it (a folded-in rank first combines its partner's vector into the
/// output and works from there).
pub(crate) fn rabenseifner<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, es, bytes) = (cx.rank, a.es(), a.count * a.es());
    let f = FoldMap::new(cx.n);
    let steps = f.steps();
    let peers_list = f.exchange_peers(r);
    let peers = cx.handshake(&cx.handshake_of(a, true), &peers_list, &peers_list)?;
    let plan = HalvingPlan::new(f, a.count, a.segment_elems);
    let fold_out_step = (plan.end + steps as usize) as u32;
    // Byte range of virtual blocks [lo, hi).
    let range = |lo: usize, hi: usize| {
        let s = part(a.count, f.p, lo).start * es;
        let e = if hi == 0 { 0 } else { part(a.count, f.p, hi - 1).end * es };
        (s, e - s)
    };
    match f.role(r) {
        Fold::Out => {
            cx.put_counted(r + 1, a.send, peers[&(r + 1)].scratch_at(0), 0, a)?;
            cx.wait_counted(r + 1, fold_out_step, bytes, a)?;
        }
        Fold::In { new_rank: nr, partner_out } => {
            // Where the first step's operands are: the input, or the output once a fold-in
            // partner's vector was combined into it.
            let input = match partner_out {
                Some(p) => {
                    cx.wait_counted(p, 0, bytes, a)?;
                    cx.reduce_from(a.recv, a.send, a.scratch(0, bytes), a)?;
                    a.recv
                }
                None => a.send,
            };
            let input_of = |k: usize| if k == 0 { input } else { a.recv };
            // (partner, keep_lo, give_lo) of halving step k.
            let split = |k: usize, lo: usize| {
                let d = f.p >> (k + 1);
                let partner = f.real(nr ^ d);
                if nr & d == 0 {
                    (partner, lo, lo + d)
                } else {
                    (partner, lo + d, lo)
                }
            };
            // Posts every segment of step k's range from `give_lo` to its partner.
            let give = |k: usize, give_lo: usize, partner: usize| -> Result<(), CollError> {
                let d = f.p >> (k + 1);
                let start = part(a.count, f.p, give_lo).start;
                let slot = bytes + rab_slot_base(f, a.count, es, k as u32);
                for h in half_order(f, nr, k) {
                    let half = half_range(a.count, f.p, give_lo, d, h);
                    for j in 0..plan.segs[k] {
                        let e = part(half.len(), plan.segs[k], j);
                        let (off, len) = ((half.start + e.start) * es, e.len() * es);
                        let dst = peers[&partner].scratch_at(slot + off - start * es);
                        cx.put(partner, input_of(k).sub(off, len), dst, plan.imm_step(k, h, j))?;
                    }
                }
                Ok(())
            };
            let mut lo = 0;
            if steps > 0 {
                let (partner, _, give_lo) = split(0, lo);
                give(0, give_lo, partner)?;
            }
            for k in 0..steps as usize {
                let d = f.p >> (k + 1);
                let (partner, keep_lo, _) = split(k, lo);
                let start = part(a.count, f.p, keep_lo).start;
                let slot = bytes + rab_slot_base(f, a.count, es, k as u32);
                for (i, h) in half_order(f, nr, k).into_iter().enumerate() {
                    let half = half_range(a.count, f.p, keep_lo, d, h);
                    for j in 0..plan.segs[k] {
                        let e = part(half.len(), plan.segs[k], j);
                        let (off, len) = ((half.start + e.start) * es, e.len() * es);
                        cx.wait(partner, plan.imm_step(k, h, j))?;
                        let theirs = a.scratch(slot + off - start * es, len);
                        cx.reduce_from(a.recv.sub(off, len), input_of(k).sub(off, len), theirs, a)?;
                    }
                    // The half reduced first is the next step's range to give: send it now.
                    if i == 0 && k + 1 < steps as usize {
                        let (next_partner, _, next_give_lo) = split(k + 1, keep_lo);
                        give(k + 1, next_give_lo, next_partner)?;
                    }
                }
                lo = keep_lo;
            }
            let (own_off, own_len) = range(nr, nr + 1);
            cx.finish_avg(a.recv.sub(own_off, own_len), a)?;
            for k in 0..steps {
                let d = 1usize << k;
                let partner = f.real(nr ^ d);
                let my_lo = nr & !(d - 1);
                let (off, len) = range(my_lo, my_lo + d);
                let step = (plan.end + k as usize) as u32;
                cx.put_counted(partner, a.recv.sub(off, len), peers[&partner].recv_at(off), step, a)?;
                let their_lo = (nr ^ d) & !(d - 1);
                cx.wait_counted(partner, step, range(their_lo, their_lo + d).1, a)?;
            }
            if let Some(p) = partner_out {
                cx.put_counted(p, a.recv, peers[&p].recv_at(0), fold_out_step, a)?;
            }
        }
    }
    cx.flush()
}
