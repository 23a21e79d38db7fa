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

/// One round of a reducing collective (it fits the scratch buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceRound {
    /// Blocks pushed into their owners' scratch.
    pub scatter: Phase,
    /// This rank's reduction (none if its block is empty this round).
    pub reduce: Option<ReduceWork>,
    /// all_reduce: the reduced block pushed into every peer's receive buffer.
    pub gather: Option<Phase>,
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
    if bytes_per_rank == 0 {
        return Plan::Copy(Phase::default());
    }
    let pushes = (0..n)
        .map(|dst| Push {
            dst_rank: dst,
            src: Buf::Send,
            src_offset: 0,
            dst: Buf::Recv,
            dst_offset: me * bytes_per_rank,
            len: bytes_per_rank,
        })
        .collect();
    Plan::Copy(Phase { pushes, sources: others(n, me) })
}

/// all_to_all: send block `dst` into `dst`'s receive buffer at block `me`.
pub fn all_to_all(n: usize, me: usize, bytes_per_rank: usize) -> Plan {
    if bytes_per_rank == 0 {
        return Plan::Copy(Phase::default());
    }
    let pushes = (0..n)
        .map(|dst| Push {
            dst_rank: dst,
            src: Buf::Send,
            src_offset: dst * bytes_per_rank,
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
}

/// Blocks of a reducing collective: `(send offset in elements, receive
/// offset in elements, len in elements)` of block `i`, per round.
fn reduce_rounds(
    shape: ReduceShape,
    block: impl Fn(usize) -> (usize, usize, usize),
    with_gather: bool,
) -> Vec<ReduceRound> {
    let ReduceShape { n, me, element_bytes: e, scratch_bytes } = shape;
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
        let (my_send, my_recv, my_len) = part(me);
        let mut scatter = Phase::default();
        for dst in others(n, me) {
            let (send_at, _, len) = part(dst);
            if len > 0 {
                scatter.pushes.push(Push {
                    dst_rank: dst,
                    src: Buf::Send,
                    src_offset: send_at * e,
                    dst: Buf::Scratch,
                    dst_offset: scratch_slot(n, me, dst) * cap * e,
                    len: len * e,
                });
            }
        }
        if my_len > 0 {
            scatter.sources = others(n, me);
        }
        let reduce = (my_len > 0).then(|| ReduceWork {
            dst_offset: my_recv * e,
            own_offset: my_send * e,
            scratch_offsets: others(n, me).into_iter().map(|s| scratch_slot(n, s, me) * cap * e).collect(),
            count: my_len,
        });
        let gather = with_gather.then(|| {
            let mut phase = Phase::default();
            if my_len > 0 {
                for dst in others(n, me) {
                    phase.pushes.push(Push {
                        dst_rank: dst,
                        src: Buf::Recv,
                        src_offset: my_recv * e,
                        dst: Buf::Recv,
                        dst_offset: my_recv * e,
                        len: my_len * e,
                    });
                }
            }
            phase.sources = others(n, me).into_iter().filter(|&s| part(s).2 > 0).collect();
            phase
        });
        out.push(ReduceRound { scatter, reduce, gather });
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
