//! Push plans: which byte ranges each rank copies into which peer's buffer,
//! per collective. Pure functions of (world size, rank, sizes), so every
//! rank derives the same plan and knows, without asking, who pushes into it.

/// A buffer of the collective on the rank that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// The caller's send buffer.
    Send,
    /// The caller's (registered) receive buffer.
    Recv,
    /// The communicator's scratch buffer.
    Scratch,
}

/// One copy-engine copy from a local buffer into `dst_rank`'s buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Push {
    /// Where it goes (may be this rank: a local copy).
    pub dst_rank: usize,
    /// Which local buffer it reads.
    pub src: Buf,
    /// Offset into it.
    pub src_offset: usize,
    /// Which buffer of the destination rank it writes.
    pub dst: Buf,
    /// Offset into that.
    pub dst_offset: usize,
    /// Bytes.
    pub len: usize,
}

/// A set of pushes issued together; the phase ends when they completed and
/// every rank in `sources` signalled its pushes into this rank.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Phase {
    /// This rank's copies.
    pub pushes: Vec<Push>,
    /// Remote ranks that push into this rank in this phase.
    pub sources: Vec<usize>,
}

/// A local reduction `dst = own op scratch[0] op scratch[1] ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceWork {
    /// Offset of the result in the receive buffer.
    pub dst_offset: usize,
    /// Offset of this rank's own contribution in the send buffer.
    pub own_offset: usize,
    /// Offsets of the peers' contributions in the scratch buffer.
    pub scratch_offsets: Vec<usize>,
    /// Elements.
    pub count: usize,
}

/// One pipeline chunk of a reducing round: a slice of every block.
///
/// Every rank signals every other rank exactly once per chunk per phase
/// (scatter, then gather), even when its slice is empty, so the receiver's
/// expected counts follow from the chunk count alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReduceChunk {
    /// This chunk's slices pushed into their owners' scratch.
    pub scatter: Vec<Push>,
    /// This rank's reduction of its own slice (none if the slice is empty).
    pub reduce: Option<ReduceWork>,
    /// all_reduce: the reduced slice pushed into every peer's receive buffer.
    pub gather: Vec<Push>,
}

/// One round of a reducing collective (it fits the scratch buffer), split
/// into chunks so that the scatter of chunk k+1, the reduction of chunk k and
/// the gather of chunk k-1 overlap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceRound {
    /// The chunks, in issue order (the same count on every rank).
    pub chunks: Vec<ReduceChunk>,
    /// Whether reduced slices are gathered back (all_reduce) or not (reduce_scatter).
    pub with_gather: bool,
}

/// The whole schedule of one collective on one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// One round of plain copies.
    Copy(Phase),
    /// Rounds of scatter, reduce and (all_reduce) gather.
    Reduce(Vec<ReduceRound>),
}

impl Plan {
    /// Rounds (flag-board sequence numbers) the plan takes.
    pub fn round_count(&self) -> usize {
        match self {
            Plan::Copy(_) => 1,
            Plan::Reduce(rounds) => rounds.len(),
        }
    }
}

fn others(n: usize, me: usize) -> Vec<usize> {
    (0..n).filter(|&r| r != me).collect()
}

/// all_gather: block `me` of `bytes_per_rank` into everyone's receive buffer at `me * bytes_per_rank`.
pub fn all_gather(n: usize, me: usize, bytes_per_rank: usize) -> Plan {
    block_to_every_rank(n, me, bytes_per_rank, |_| 0)
}

/// all_to_all: send block `dst` into `dst`'s receive buffer at block `me`.
pub fn all_to_all(n: usize, me: usize, bytes_per_rank: usize) -> Plan {
    block_to_every_rank(n, me, bytes_per_rank, |dst| dst * bytes_per_rank)
}

/// One push of `bytes_per_rank` into every rank's receive buffer at block `me`, read from the
/// send buffer at `src_offset(dst)`: the shape all_gather and all_to_all share.
fn block_to_every_rank(n: usize, me: usize, bytes_per_rank: usize, src_offset: impl Fn(usize) -> usize) -> Plan {
    if bytes_per_rank == 0 {
        return Plan::Copy(Phase::default());
    }
    let pushes = (0..n)
        .map(|dst| Push {
            dst_rank: dst,
            src: Buf::Send,
            src_offset: src_offset(dst),
            dst: Buf::Recv,
            dst_offset: me * bytes_per_rank,
            len: bytes_per_rank,
        })
        .collect();
    Plan::Copy(Phase { pushes, sources: others(n, me) })
}

/// sendrecv on the ring: send to `me + 1`, receive from `me - 1` (mod n).
pub fn sendrecv(n: usize, me: usize, bytes: usize) -> Plan {
    if bytes == 0 {
        return Plan::Copy(Phase::default());
    }
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let push = Push { dst_rank: next, src: Buf::Send, src_offset: 0, dst: Buf::Recv, dst_offset: 0, len: bytes };
    Plan::Copy(Phase { pushes: vec![push], sources: if prev == me { vec![] } else { vec![prev] } })
}

/// broadcast from `root` (the root also copies send to recv).
pub fn broadcast(n: usize, me: usize, root: usize, bytes: usize) -> Plan {
    if bytes == 0 {
        return Plan::Copy(Phase::default());
    }
    if me == root {
        let pushes = (0..n)
            .map(|dst| Push { dst_rank: dst, src: Buf::Send, src_offset: 0, dst: Buf::Recv, dst_offset: 0, len: bytes })
            .collect();
        Plan::Copy(Phase { pushes, sources: vec![] })
    } else {
        Plan::Copy(Phase { pushes: vec![], sources: vec![root] })
    }
}

/// The scratch slot that `sender`'s block occupies at `receiver` (0..n-1).
pub fn scratch_slot(n: usize, sender: usize, receiver: usize) -> usize {
    (sender + n - receiver - 1) % n
}

/// Elements of one block per round that fit `scratch_bytes` with `n - 1` slots.
pub fn round_elements_max(n: usize, scratch_bytes: usize, element_bytes: usize) -> usize {
    (scratch_bytes / n.saturating_sub(1).max(1) / element_bytes.max(1)).max(1)
}

/// Splits `count` elements into `n` blocks: `(start, len)` of block `i`.
pub fn block_of(count: usize, n: usize, i: usize) -> (usize, usize) {
    let base = count / n;
    let rem = count % n;
    let start = i * base + i.min(rem);
    (start, base + usize::from(i < rem))
}

/// Shape of a reducing collective.
#[derive(Clone, Copy, Debug)]
pub struct ReduceShape {
    /// Ranks.
    pub n: usize,
    /// This rank.
    pub me: usize,
    /// Bytes per element.
    pub element_bytes: usize,
    /// Scratch bytes per rank.
    pub scratch_bytes: usize,
    /// Target bytes of one block's slice per pipeline chunk.
    pub chunk_bytes: usize,
    /// Most chunks per round.
    pub chunks_max: usize,
}

/// Chunks of a round whose longest block is `longest_bytes`.
pub fn chunk_count(longest_bytes: usize, chunk_bytes: usize, chunks_max: usize) -> usize {
    longest_bytes.div_ceil(chunk_bytes.max(1)).clamp(1, chunks_max.max(1))
}

/// Rounds whose longest block reaches this size end in a ramp of smaller chunks.
pub const RAMP_BYTES_MIN: usize = 2 << 20;

/// Relative sizes of a round's chunks: equal chunks of about `chunk_bytes`, the last one split
/// into a half and two quarters. Once the scatter is over only the last chunk's reduction and
/// gather remain, so a small last chunk shortens the tail, while the big chunks before it keep
/// each copy long enough to run the copy engine at full rate.
pub fn chunk_weights(longest_bytes: usize, chunk_bytes: usize, chunks_max: usize) -> Vec<u64> {
    if longest_bytes < RAMP_BYTES_MIN || chunks_max < 3 {
        return vec![1; chunk_count(longest_bytes, chunk_bytes, chunks_max)];
    }
    let nominal = chunk_count(longest_bytes, chunk_bytes, chunks_max - 2);
    let mut weights = vec![4; nominal - 1];
    weights.extend([2, 1, 1]);
    weights
}

/// Splits `len` elements by `weights`: `(start, len)` of chunk `c` (every rank gets the same
/// boundaries for the same block length).
pub fn weighted_slice(len: usize, weights: &[u64], c: usize) -> (usize, usize) {
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum::<u128>().max(1);
    let before: u128 = weights[..c].iter().map(|&w| u128::from(w)).sum();
    let at = |w: u128| (len as u128 * w / total) as usize;
    let start = at(before);
    (start, at(before + u128::from(weights[c])) - start)
}

/// Blocks of a reducing collective: `(send offset in elements, receive
/// offset in elements, len in elements)` of block `i`, per round.
fn reduce_rounds(
    shape: ReduceShape,
    block: impl Fn(usize) -> (usize, usize, usize),
    with_gather: bool,
) -> Vec<ReduceRound> {
    let ReduceShape { n, me, element_bytes: e, scratch_bytes, chunk_bytes, chunks_max } = shape;
    let cap = round_elements_max(n, scratch_bytes, e);
    let longest = (0..n).map(|i| block(i).2).max().unwrap_or(0);
    let rounds = longest.div_ceil(cap);
    let mut out = Vec::with_capacity(rounds);
    for r in 0..rounds {
        // (send offset, recv offset, len) of block i in round r.
        let part = |i: usize| {
            let (send_at, recv_at, len) = block(i);
            let done = (r * cap).min(len);
            let this = (len - done).min(cap);
            (send_at + done, recv_at + done, this)
        };
        let longest_now = (0..n).map(|i| part(i).2).max().unwrap_or(0);
        let weights = chunk_weights(longest_now * e, chunk_bytes, chunks_max);
        let count = weights.len();
        // (send offset, recv offset, offset inside the round's slot, len) of block i in chunk c.
        let slice = |i: usize, c: usize| {
            let (send_at, recv_at, len) = part(i);
            let (at, this) = weighted_slice(len, &weights, c);
            (send_at + at, recv_at + at, at, this)
        };
        let mut chunks = Vec::with_capacity(count);
        for c in 0..count {
            let mut chunk = ReduceChunk::default();
            for dst in others(n, me) {
                let (send_at, _, at, len) = slice(dst, c);
                if len > 0 {
                    chunk.scatter.push(Push {
                        dst_rank: dst,
                        src: Buf::Send,
                        src_offset: send_at * e,
                        dst: Buf::Scratch,
                        dst_offset: (scratch_slot(n, me, dst) * cap + at) * e,
                        len: len * e,
                    });
                }
            }
            let (my_send, my_recv, my_at, my_len) = slice(me, c);
            if my_len > 0 {
                chunk.reduce = Some(ReduceWork {
                    dst_offset: my_recv * e,
                    own_offset: my_send * e,
                    scratch_offsets: others(n, me)
                        .into_iter()
                        .map(|s| (scratch_slot(n, s, me) * cap + my_at) * e)
                        .collect(),
                    count: my_len,
                });
                if with_gather {
                    for dst in others(n, me) {
                        chunk.gather.push(Push {
                            dst_rank: dst,
                            src: Buf::Recv,
                            src_offset: my_recv * e,
                            dst: Buf::Recv,
                            dst_offset: my_recv * e,
                            len: my_len * e,
                        });
                    }
                }
            }
            chunks.push(chunk);
        }
        out.push(ReduceRound { chunks, with_gather });
    }
    out
}

/// all_reduce of `count` elements: reduce-scatter into scratch, reduce,
/// all-gather of the reduced blocks; rounds as the scratch allows.
pub fn all_reduce(shape: ReduceShape, count: usize) -> Plan {
    let n = shape.n;
    Plan::Reduce(reduce_rounds(
        shape,
        |i| {
            let (start, len) = block_of(count, n, i);
            (start, start, len)
        },
        true,
    ))
}

/// reduce_scatter: block `i` (of `count_per_rank`) of every rank's send
/// buffer reduced into rank `i`'s receive buffer.
pub fn reduce_scatter(shape: ReduceShape, count_per_rank: usize) -> Plan {
    Plan::Reduce(reduce_rounds(shape, |i| (i * count_per_rank, 0, count_per_rank), false))
}
