//! Direct schedules: every block moves once, straight from where it is to where it is needed,
//! all peers at once.
//!
//! - all_reduce: a one-step reduce-scatter (rank `r` writes block `b` of its input into rank
//!   `b`'s scratch slot for `r`, for every `b != r` at once; `b` combines the `p - 1` incoming
//!   blocks with its own into its block of the output), then a one-step all-gather (`b` writes
//!   its reduced block into every peer's output at `b`'s offset);
//! - reduce_scatter: the first half alone (the input's blocks are the per-rank outputs);
//! - all_gather: the second half alone (every rank's block to every peer's output).
//!
//! Why: a ring at `p` ranks is `2(p - 1)` dependent steps, each a write, an immediate and a
//! wait on a neighbour that first had to wait on its own; when the cores are busy (the
//! backward pass of CPU DDP) every link of that chain is delayed. Here no rank waits for data a
//! third rank forwarded: two dependent steps whatever `p`. The cost is `p - 1` writes in
//! flight per rank and step instead of one, which suits peers that are cheap to reach all at
//! once (one host: shared memory or CMA), and `(p - 1)` blocks of scratch.
//!
//! Blocks move in segments (`a.segment_elems`), each with its own immediate (step `k` for
//! segment `k`), so the owner reduces a segment as soon as it has landed from every peer and
//! sends it on while later segments are still arriving. The all-gather's segments share one
//! step and are counted (nothing is forwarded, so they need no order).
//!
//! Reduction order: the owner of a block combines the `p` contributions in rank order
//! (`x_0 op x_1 op ... op x_{p-1}`) whatever order they arrive in, so the result depends on the
//! inputs only, not on timing, and is the same in place and out of place. Every rank's copy of
//! a block is its owner's bytes, so results are bit-identical across ranks (as in ring, where
//! also only one rank computes each block).

use std::ops::Range;

use super::ctx::{Args, Ctx, Handshake};
use super::{others, part, segments_per_block};
use crate::error::CollError;
use crate::transport::{BufSlice, CollTransport};

/// Scratch bytes of a direct reduce-scatter whose largest block is `slot_bytes`: one slot per
/// other rank.
pub(crate) fn scratch_bytes(n: usize, slot_bytes: usize) -> usize {
    n.saturating_sub(1) * slot_bytes
}

/// Index of `sender`'s slot in `owner`'s scratch (the other ranks, from the owner's right).
fn slot_of(sender: usize, owner: usize, n: usize) -> usize {
    (sender + n - owner - 1) % n
}

/// Geometry of one direct reduce-scatter, the same on every rank.
struct Plan {
    /// Element range of each rank's block in the input.
    blocks: Vec<Range<usize>>,
    /// Segments per block (empty segments where a block is short).
    segs: usize,
    /// Bytes of one scratch slot (the largest block).
    slot_bytes: usize,
}

impl Plan {
    /// Elements of segment `k` of block `b`, relative to the block's start.
    fn seg(&self, b: usize, k: usize) -> Range<usize> {
        part(self.blocks[b].len(), self.segs, k)
    }

    /// Writes segment `k` of this rank's input block `b` into `b`'s scratch slot for this rank.
    fn give<T: CollTransport + ?Sized>(
        &self,
        cx: &Ctx<'_, T>,
        a: &Args<'_>,
        b: usize,
        theirs: &Handshake,
        k: usize,
    ) -> Result<(), CollError> {
        let es = a.es();
        let seg = self.seg(b, k);
        let src = a.send.sub((self.blocks[b].start + seg.start) * es, seg.len() * es);
        let dst = theirs.scratch_at(slot_of(cx.rank, b, cx.n) * self.slot_bytes + seg.start * es);
        cx.put(b, src, dst, k as u32)
    }

    /// Reduces segment `k` of this rank's block into `out` (the block's place in the output),
    /// in rank order, waiting for each peer's segment just before it is needed; finishes `Avg`.
    /// Returns the segment's byte range within the block.
    fn reduce_own<T: CollTransport + ?Sized>(
        &self,
        cx: &Ctx<'_, T>,
        a: &Args<'_>,
        out: BufSlice<'_>,
        k: usize,
    ) -> Result<(usize, usize), CollError> {
        let (r, n, es) = (cx.rank, cx.n, a.es());
        let seg = self.seg(r, k);
        let (off, len) = (seg.start * es, seg.len() * es);
        let out_seg = out.sub(off, len);
        let own = a.send.sub(self.blocks[r].start * es + off, len);
        let theirs = |q: usize| a.scratch(slot_of(q, r, n) * self.slot_bytes + off, len);
        // The running result lives in the output, except in place when lower ranks come first:
        // writing them into the output would destroy this rank's operand before its turn. Then
        // it lives in rank 0's slot (its operand, the first one) and is copied out at the end.
        let acc = if r > 0 && own.same_region(&out_seg) { theirs(0) } else { out_seg };
        for q in 0..n {
            let operand = if q == r {
                own
            } else {
                cx.wait(q, k as u32)?;
                theirs(q)
            };
            if q == 0 {
                cx.copy(operand, acc)?;
            } else {
                cx.reduce(acc, operand, a)?;
            }
        }
        cx.copy(acc, out_seg)?;
        cx.finish_avg(out_seg, a)?;
        Ok((off, len))
    }
}

/// all_reduce: one-step reduce-scatter into scratch, one-step all-gather into the outputs.
pub(crate) fn all_reduce<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, es) = (cx.rank, cx.n, a.es());
    let block_max = a.count.div_ceil(n);
    // One step number per reduce-scatter segment, one more for the all-gather.
    let segs = segments_per_block(block_max, a.segment_elems, 1, 1);
    let plan = Plan { blocks: (0..n).map(|b| part(a.count, n, b)).collect(), segs, slot_bytes: block_max * es };
    let gather_step = segs as u32;
    let peers = scatter(cx, a, &plan, &cx.handshake_of(a, true))?;
    let own = &plan.blocks[r];
    let out = a.recv.sub(own.start * es, own.len() * es);
    let others = others(r, n);
    for k in 0..segs {
        let (off, len) = plan.reduce_own(cx, a, out, k)?;
        for &b in &others {
            cx.put(b, out.sub(off, len), peers[&b].recv_at(own.start * es + off), gather_step)?;
        }
    }
    for &q in &others {
        cx.wait_n(q, gather_step, segs as u32)?;
    }
    cx.flush()
}

/// reduce_scatter: the input's `n` blocks of `count` elements go straight to their owners'
/// scratch; each rank reduces its block into its output.
pub(crate) fn reduce_scatter<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (n, bb) = (cx.n, a.count * a.es());
    let segs = segments_per_block(a.count, a.segment_elems, 1, 0);
    let plan = Plan { blocks: (0..n).map(|b| b * a.count..(b + 1) * a.count).collect(), segs, slot_bytes: bb };
    scatter(cx, a, &plan, &cx.handshake_of(a, false))?;
    let out = a.recv.sub(0, bb);
    for k in 0..segs {
        plan.reduce_own(cx, a, out, k)?;
    }
    cx.flush()
}

/// Handshakes with every other rank and writes every segment of every peer's block to it:
/// the first segment as soon as that peer's handshake is in (so a late rank does not hold up
/// the others), the rest segment by segment across peers (every owner gets its first segments
/// from everyone before anyone's later ones).
fn scatter<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    plan: &Plan,
    mine: &Handshake,
) -> Result<super::ctx::Peers, CollError> {
    let others = others(cx.rank, cx.n);
    let peers = cx.handshake_each_then(&others, &others, |_| mine.clone(), |b, hs| plan.give(cx, a, b, hs, 0))?;
    for k in 1..plan.segs {
        for &b in &others {
            plan.give(cx, a, b, &peers[&b], k)?;
        }
    }
    Ok(peers)
}

/// all_gather: this rank's block straight into every peer's output at its offset, in counted
/// segments, each peer's as soon as its handshake is in.
pub(crate) fn all_gather<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, bb) = (cx.rank, cx.n, a.count * a.es());
    let others = others(r, n);
    let mine = cx.handshake_of(a, true);
    let mine_block = a.send.sub(0, bb);
    cx.handshake_each_then(
        &others,
        &others,
        |_| mine.clone(),
        |p, theirs| cx.put_counted(p, mine_block, theirs.recv_at(r * bb), 0, a),
    )?;
    // The own block is copied while the others are on the wire.
    cx.copy(mine_block, a.recv.sub(r * bb, bb))?;
    for &q in &others {
        cx.wait_counted(q, 0, bb, a)?;
    }
    cx.flush()
}
