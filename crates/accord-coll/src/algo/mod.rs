//! Collective algorithms as schedules over a [`crate::CollTransport`].
//!
//! Every schedule is host-driven and zero-copy: a rank writes straight from
//! its registered send (or result) buffer into the peer's registered user
//! output buffer. A registered **scratch** buffer on the receiver is used only
//! where a reduction needs the incoming data *before* combining it with local
//! data (writing into the output directly would destroy the local operand):
//! - ring all_reduce / reduce_scatter: one slot per block (1x the vector);
//! - recursive doubling all_reduce: a fold-in slot plus one full-vector slot
//!   per step (1 + log2 p vectors; that is why it is only the default for
//!   small messages);
//! - Rabenseifner: a fold-in slot plus per-step slots that halve (about 2x);
//! - recursive halving reduce_scatter: a working accumulator, a fold-in slot
//!   and halving slots (about 4x the input at most);
//! - binomial reduce: an accumulator plus one slot per child;
//! - ring (chain) reduce: one slot per chunk (1x);
//! - direct all_reduce / reduce_scatter (`direct.rs`): one slot per other rank, each the
//!   largest block ((p-1)/p of the all_reduce vector, (p-1)/p of the reduce_scatter input).
//!
//! Slots are never reused within one collective, so a fast peer can never
//! overwrite data a slow rank has not consumed; across collectives the
//! per-call handshake (each rank hands its descriptors to the ranks that will
//! write into it, only once it has entered the call) orders reuse. Broadcast,
//! all_gather, all_to_all(v), send/recv and barrier need no scratch.
//!
//! Why the handshake stays per call even where the descriptors are the same as last time:
//! it is the receiver's "ready" — its output is the user's memory for this call only, and
//! its scratch may still be read by its previous collective. Caching descriptors would save
//! only the bytes of that one message, not the message (a one-way latency, which every
//! rank pays at once, not a round trip). Removing it would take per-peer credits for the
//! scratch (returned at the end of each call, double-buffered by sequence parity) and is
//! not done. Registrations are not per call: callers register their buffers once
//! ([`crate::Communicator::register`], memory owned by the transport until deregistered),
//! and the copying conveniences stage through one buffer the communicator owns
//! ([`crate::Communicator::run_staged`]); peers' descriptor tokens are parsed once per
//! token by the engine transport.
//!
//! Direct all_reduce (all peers at once: every rank writes block b of its input to rank b,
//! which reduces it in rank order and writes the result to every peer; two dependent steps
//! whatever p, against 2(p-1) for ring) and its two halves, direct reduce_scatter and
//! direct all_gather, are chosen only when forced (`ACCORD_ALGO_ALL_REDUCE=direct`, or the
//! per-call algorithm); see `direct.rs` for why and for its reduction order.
//!
//! Large steps of ring, Rabenseifner and direct all_reduce, direct reduce_scatter and
//! all_gather, ring all_gather, all_to_all(v) and Rabenseifner's all-gather move in segments of `ACCORD_COLL_SEGMENT_BYTES`, each carrying an
//! immediate: a segment is reduced or forwarded as soon as it lands, while the next is on
//! the wire.
//!
//! Arena all_reduce (`crate::arena`: forced, or with `ACCORD_COLL_ARENA=1` wherever every rank
//! shares one host and no algorithm is forced) is not a schedule over the transport: the ranks
//! share a memory file, each copies its input in, reduces its own block of every copy and
//! copies the reduced blocks out, ordered by flags in that file. The communicator maps it at
//! its first all_reduce, or learns that it cannot and uses the size rule from then on.
//!
//! Ranks that are not a power of two are folded in (recursive doubling,
//! Rabenseifner, recursive halving): with `p` the largest power of two not
//! above `n` and `rem = n - p`, each even rank below `2 rem` hands its data to
//! the next odd rank, the `p` remaining ranks run the power-of-two schedule,
//! and the odd ranks hand the result back.

mod all_gather;
mod all_reduce;
mod all_to_all;
mod ctx;
mod direct;
mod misc;
mod reduce_scatter;
mod rooted;

use std::fmt;
use std::ops::Range;

pub use ctx::AllToAllVLayout;
pub(crate) use ctx::{Args, Ctx, Handshake};
pub(crate) use misc::{barrier, post_recv, send, wait_recv};
pub(crate) use rooted::pipeline_chunks;

use crate::error::ConfigError;

/// A collective operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Reduce everywhere.
    AllReduce,
    /// Reduce to a root.
    Reduce,
    /// Root to everyone.
    Broadcast,
    /// Everyone's block to everyone.
    AllGather,
    /// Reduce, each rank keeping one block.
    ReduceScatter,
    /// Personalised exchange with equal blocks.
    AllToAll,
    /// Personalised exchange with per-peer counts and displacements.
    AllToAllV,
    /// Point-to-point send and receive.
    SendRecv,
    /// Synchronisation.
    Barrier,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 9] = [
        Collective::AllReduce,
        Collective::Reduce,
        Collective::Broadcast,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::SendRecv,
        Collective::Barrier,
    ];

    /// Snake-case name (also the `ACCORD_ALGO_<NAME>` suffix, upper-cased).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Reduce => "reduce",
            Collective::Broadcast => "broadcast",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_allv",
            Collective::SendRecv => "sendrecv",
            Collective::Barrier => "barrier",
        }
    }

    /// Wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The algorithms implemented for this collective.
    pub const fn algorithms(self) -> &'static [Algo] {
        match self {
            Collective::AllReduce => {
                &[Algo::Ring, Algo::RecursiveDoubling, Algo::Rabenseifner, Algo::Direct, Algo::Arena]
            }
            Collective::Reduce => &[Algo::BinomialTree, Algo::Ring],
            Collective::Broadcast => &[Algo::BinomialTree, Algo::Ring],
            Collective::AllGather => &[Algo::Ring, Algo::RecursiveDoubling, Algo::Bruck, Algo::Direct],
            Collective::ReduceScatter => &[Algo::Ring, Algo::RecursiveHalving, Algo::Direct],
            Collective::AllToAll | Collective::AllToAllV => &[Algo::Pairwise, Algo::Direct],
            Collective::SendRecv => &[Algo::Direct],
            Collective::Barrier => &[Algo::Dissemination],
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A collective algorithm.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Ring: reduce-scatter + all-gather (all_reduce), neighbour exchange
    /// (all_gather, reduce_scatter), pipelined chain (broadcast, reduce).
    Ring,
    /// Recursive doubling (all_reduce, all_gather), with fold-in for any n.
    RecursiveDoubling,
    /// Recursive halving reduce-scatter + recursive doubling all-gather.
    Rabenseifner,
    /// Binomial tree (broadcast, reduce).
    BinomialTree,
    /// Bruck's log-step all_gather, for any n.
    Bruck,
    /// Recursive halving (reduce_scatter), with fold-in for any n.
    RecursiveHalving,
    /// Pairwise exchange: one peer per step (all_to_all(v)).
    Pairwise,
    /// All peers at once (all_to_all(v), send/recv); for all_reduce, reduce_scatter and
    /// all_gather every block straight to its destination in one step (`direct.rs`).
    Direct,
    /// Dissemination (barrier).
    Dissemination,
    /// Through a shared-memory arena every rank of one host maps (all_reduce; `crate::arena`).
    Arena,
}

impl Algo {
    const NAMES: [(Algo, &'static str); 10] = [
        (Algo::Ring, "ring"),
        (Algo::RecursiveDoubling, "recursive_doubling"),
        (Algo::Rabenseifner, "rabenseifner"),
        (Algo::BinomialTree, "binomial_tree"),
        (Algo::Bruck, "bruck"),
        (Algo::RecursiveHalving, "recursive_halving"),
        (Algo::Pairwise, "pairwise"),
        (Algo::Direct, "direct"),
        (Algo::Dissemination, "dissemination"),
        (Algo::Arena, "arena"),
    ];

    /// Snake-case name.
    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(a, _)| *a == self).map(|(_, n)| *n).expect("every algo is named")
    }

    /// Wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Parses `name` (case-insensitive; `-` and `_` alike; `tree` and `rd` accepted as
    /// short forms) and checks it is implemented for `collective`.
    pub fn parse_for(collective: Collective, name: &str) -> Result<Algo, ConfigError> {
        let norm = name.to_ascii_lowercase().replace('-', "_");
        let norm = match norm.as_str() {
            "tree" | "binomial" => "binomial_tree",
            "rd" => "recursive_doubling",
            "rh" => "recursive_halving",
            "pipelined" | "pipeline" | "chain" => "ring",
            other => other,
        };
        Self::NAMES.iter().find(|(a, n)| *n == norm && collective.algorithms().contains(a)).map(|(a, _)| *a).ok_or_else(
            || ConfigError::UnknownAlgorithm {
                collective: collective.name(),
                name: name.to_string(),
                valid: collective.algorithms().iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
            },
        )
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Scratch bytes `algo` needs for `collective` on `count` elements of `es` bytes.
pub(crate) fn scratch_bytes(collective: Collective, algo: Algo, count: usize, es: usize, n: usize) -> usize {
    let bytes = count * es;
    match collective {
        Collective::AllReduce => all_reduce::scratch_bytes(algo, bytes, count, es, n),
        Collective::Reduce => rooted::reduce_scratch_bytes(algo, bytes, n),
        Collective::ReduceScatter => reduce_scatter::scratch_bytes(algo, n * bytes, bytes, n),
        _ => 0,
    }
}

/// Runs the schedule of `cx.algo` for `cx.collective`.
pub(crate) fn dispatch<T: crate::CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
) -> Result<(), crate::CollError> {
    match (cx.collective, cx.algo) {
        (Collective::AllReduce, Algo::Ring) => all_reduce::ring(cx, a),
        (Collective::AllReduce, Algo::RecursiveDoubling) => all_reduce::recursive_doubling(cx, a),
        (Collective::AllReduce, Algo::Rabenseifner) => all_reduce::rabenseifner(cx, a),
        (Collective::AllReduce, Algo::Direct) => direct::all_reduce(cx, a),
        (Collective::Reduce, Algo::BinomialTree) => rooted::reduce_binomial(cx, a),
        (Collective::Reduce, Algo::Ring) => rooted::reduce_ring(cx, a),
        (Collective::Broadcast, Algo::BinomialTree) => rooted::broadcast_binomial(cx, a),
        (Collective::Broadcast, Algo::Ring) => rooted::broadcast_ring(cx, a),
        (Collective::AllGather, Algo::Ring) => all_gather::ring(cx, a),
        (Collective::AllGather, Algo::RecursiveDoubling) => all_gather::recursive_doubling(cx, a),
        (Collective::AllGather, Algo::Bruck) => all_gather::bruck(cx, a),
        (Collective::AllGather, Algo::Direct) => direct::all_gather(cx, a),
        (Collective::ReduceScatter, Algo::Ring) => reduce_scatter::ring(cx, a),
        (Collective::ReduceScatter, Algo::RecursiveHalving) => reduce_scatter::recursive_halving(cx, a),
        (Collective::ReduceScatter, Algo::Direct) => direct::reduce_scatter(cx, a),
        (Collective::AllToAll | Collective::AllToAllV, Algo::Pairwise | Algo::Direct) => all_to_all::run(cx, a),
        (c, algo) => Err(crate::CollError::Config(Algo::parse_for(c, algo.name()).unwrap_err())),
    }
}

/// The ranks other than `r` of `n`, from `r`'s right: every rank starts with a different peer
/// (all_to_all's and the direct schedules' order).
pub(crate) fn others(r: usize, n: usize) -> Vec<usize> {
    (1..n).map(|s| (r + s) % n).collect()
}

/// Element range of part `index` when `count` elements are split into `parts`
/// balanced parts (sizes differ by at most one).
pub(crate) fn part(count: usize, parts: usize, index: usize) -> Range<usize> {
    let at = |i: usize| (count as u128 * i as u128 / parts as u128) as usize;
    at(index)..at(index + 1)
}

/// Segments per block of a pipelined schedule: blocks of up to `block_elems_max` elements cut
/// into segments of about `segment_elems`, limited so that `steps` steps of that many
/// segments each fit the immediate's step numbers (`STEP_DATA_MAX`, less `reserved` steps
/// the schedule numbers otherwise). Depends only on values every rank shares.
pub(crate) fn segments_per_block(block_elems_max: usize, segment_elems: usize, steps: usize, reserved: usize) -> usize {
    let wanted = block_elems_max.div_ceil(segment_elems.max(1)).max(1);
    let budget = (crate::transport::STEP_DATA_MAX as usize + 1).saturating_sub(reserved) / steps.max(1);
    wanted.min(budget.max(1))
}

/// The segment (elements) of one call: `segment_bytes`, except that an all_reduce's block
/// (its `count` over `n` ranks) moves in at most `block_segments_max` segments (0: no limit),
/// larger segments for larger blocks.
///
/// Why: every segment is a wait for its immediate (polled, yielded, or slept on), and while
/// DDP's backward pass keeps every core busy each wait competes for a core: a 32 MiB bucket
/// in 128 KiB segments (128 waits a step) took 28-85 ms during the backward pass against
/// 9-24 ms alone (`scripts/ddp_timeline_probe.py --width 2048`, 2 ranks on the shared 2-core
/// machine). Capped at 16 segments a block, the median DDP step of
/// `scripts/device/torch_backend_bench.py --backend accord --device cpu --skip ops,sms,fsdp2
/// --iters 10 --warmup 2 --width 2048` (torchrun, 2 ranks there, 10 rounds alternated with
/// the cap off) was 0.116 s against 0.149 s, faster in 7 of the 10 rounds; in 8 more rounds
/// with a busy loop beside the ranks 0.158 s against 0.190 s, faster in all 8. The mechanism is
/// unconfirmed (docs/results/2026-11-26-cpu-ddp-timeline.md); the 32-core host's A/B is
/// `scripts/device/ddp_cpu_variants.sh` (its `ACCORD_COLL_BLOCK_SEGMENTS_MAX` rows). On that
/// host (stop 35, 4 and 8 ranks, one run each) the cap made CPU DDP slower, 0.2496 s against
/// 0.2312 s and 0.4105 against 0.3833, so it is off by default (0) and stays a knob. Sixteen
/// segments still pipeline a block (the wire and the reduction overlap after the first
/// sixteenth). Depends only on values every rank shares (the handshake checks the result).
pub(crate) fn call_segment_elems(
    collective: Collective,
    count: usize,
    n: usize,
    es: usize,
    segment_bytes: usize,
    block_segments_max: usize,
) -> usize {
    let base = (segment_bytes / es.max(1)).max(1);
    if collective != Collective::AllReduce || block_segments_max == 0 {
        return base;
    }
    base.max(count.div_ceil(n.max(1)).div_ceil(block_segments_max))
}

/// `(p, rem)`: the largest power of two `p <= n` and `n - p`.
pub(crate) fn pow2_floor(n: usize) -> (usize, usize) {
    let p = if n == 0 { 0 } else { 1usize << (usize::BITS - 1 - n.leading_zeros()) };
    (p, n - p)
}

/// Fold-in of a non-power-of-two world: this rank's role.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fold {
    /// An even rank below `2 rem`: hands its data to `rank + 1`, gets the result back.
    Out,
    /// A rank in the power-of-two group, with its index there; `partner_out`
    /// is the folded-out rank it serves (if any).
    In { new_rank: usize, partner_out: Option<usize> },
}

/// Fold geometry for `n` ranks.
#[derive(Copy, Clone, Debug)]
pub(crate) struct FoldMap {
    pub p: usize,
    pub rem: usize,
}

impl FoldMap {
    pub fn new(n: usize) -> FoldMap {
        let (p, rem) = pow2_floor(n);
        FoldMap { p, rem }
    }
    /// log2(p).
    pub fn steps(&self) -> u32 {
        self.p.trailing_zeros()
    }
    pub fn role(&self, rank: usize) -> Fold {
        if rank < 2 * self.rem {
            if rank % 2 == 0 {
                Fold::Out
            } else {
                Fold::In { new_rank: rank / 2, partner_out: Some(rank - 1) }
            }
        } else {
            Fold::In { new_rank: rank - self.rem, partner_out: None }
        }
    }
    /// Real rank of group member `new_rank`.
    pub fn real(&self, new_rank: usize) -> usize {
        if new_rank < self.rem {
            2 * new_rank + 1
        } else {
            new_rank + self.rem
        }
    }
    /// The ranks `rank` exchanges with in a folded recursive doubling or halving, in order:
    /// its fold partner (if any), then, for a rank of the power-of-two group, its partner at
    /// each step.
    pub fn exchange_peers(&self, rank: usize) -> Vec<usize> {
        match self.role(rank) {
            Fold::Out => vec![rank + 1],
            Fold::In { new_rank, partner_out } => {
                partner_out.into_iter().chain((0..self.steps()).map(|k| self.real(new_rank ^ (1 << k)))).collect()
            }
        }
    }
    /// First real block of virtual block `v` (virtual blocks of the group are
    /// contiguous runs of real per-rank blocks: two for folded pairs).
    pub fn vstart(&self, v: usize) -> usize {
        if v <= self.rem {
            2 * v
        } else {
            v + self.rem
        }
    }
}

#[cfg(test)]
mod tests;
