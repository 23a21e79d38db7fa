//! Rooted collectives: reduce and broadcast, as binomial trees or pipelined
//! chains ("ring"). Ranks are renumbered relative to the root
//! (`v = (r - root) mod n`).

use super::ctx::{Args, Ctx};
use super::{part, Algo};
use crate::error::CollError;
use crate::transport::CollTransport;

/// Scratch bytes for reduce.
pub(crate) fn reduce_scratch_bytes(algo: Algo, bytes: usize, n: usize) -> usize {
    match algo {
        Algo::BinomialTree => (1 + (usize::BITS - n.leading_zeros()) as usize) * bytes,
        _ => bytes,
    }
}

/// A tree link: (virtual rank, mask of the link).
type Link = (usize, usize);

/// Binomial tree links of virtual rank `v`: (parent and the mask of the link
/// to it, children with their link masks, in increasing mask order).
fn binomial(v: usize, n: usize) -> (Option<Link>, Vec<Link>) {
    let mut children = Vec::new();
    let mut mask = 1;
    while mask < n {
        if v & mask != 0 {
            return (Some((v - mask, mask)), children);
        }
        if v + mask < n {
            children.push((v + mask, mask));
        }
        mask <<= 1;
    }
    (None, children)
}

/// Number of pipeline chunks for `count` elements of `es` bytes.
pub(crate) fn pipeline_chunks(count: usize, es: usize, chunk_bytes: usize) -> usize {
    let want = (count * es).div_ceil(chunk_bytes.max(1));
    want.clamp(1, (crate::transport::STEP_DATA_MAX as usize + 1).min(count.max(1)))
}

/// Binomial reduce: leaves write their input straight into the parent's
/// per-child scratch slot; inner ranks accumulate (in scratch, or in the
/// output at the root) and pass the partial up.
pub(crate) fn reduce_binomial<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, bytes) = (cx.rank, cx.n, a.count * a.es());
    let real = |v: usize| (v + a.root) % n;
    let v = (r + n - a.root) % n;
    let (parent, children) = binomial(v, n);
    let write_to: Vec<usize> = parent.iter().map(|&(p, _)| real(p)).collect();
    let written_by: Vec<usize> = children.iter().map(|&(c, _)| real(c)).collect();
    let peers = cx.handshake(&cx.handshake_of(a, parent.is_none()), &write_to, &written_by)?;
    let slot = |mask: usize| (1 + mask.trailing_zeros() as usize) * bytes;
    let acc = if parent.is_none() {
        a.recv.sub(0, bytes)
    } else if children.is_empty() {
        a.send.sub(0, bytes)
    } else {
        a.scratch(0, bytes)
    };
    cx.copy(a.send.sub(0, bytes), acc)?;
    for &(c, mask) in &children {
        cx.wait(real(c), mask.trailing_zeros())?;
        cx.reduce(acc, a.scratch(slot(mask), bytes), a)?;
    }
    match parent {
        Some((p, mask)) => cx.put(real(p), acc, peers[&real(p)].scratch_at(slot(mask)), mask.trailing_zeros())?,
        None => cx.finish_avg(acc, a)?,
    }
    cx.flush()
}

/// Chain reduce towards the root (`v = n-1 -> ... -> 0`), pipelined in
/// `a.chunks` chunks: each rank combines a chunk as soon as it arrives in its
/// scratch and passes it on.
pub(crate) fn reduce_ring<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, es) = (cx.rank, cx.n, a.es());
    let real = |v: usize| (v + a.root) % n;
    let v = (r + n - a.root) % n;
    let next = (v > 0).then(|| real(v - 1));
    let prev = (v + 1 < n).then(|| real(v + 1));
    let peers = cx.handshake(&cx.handshake_of(a, v == 0), next.as_slice(), prev.as_slice())?;
    if v == 0 {
        cx.copy(a.send.sub(0, a.count * es), a.recv.sub(0, a.count * es))?;
    }
    for j in 0..a.chunks {
        let e = part(a.count, a.chunks, j);
        let (off, len) = (e.start * es, e.len() * es);
        let mine = match prev {
            None => a.send.sub(off, len),
            Some(p) => {
                cx.wait(p, j as u32)?;
                if v == 0 {
                    cx.reduce(a.recv.sub(off, len), a.scratch(off, len), a)?;
                    cx.finish_avg(a.recv.sub(off, len), a)?;
                    continue;
                }
                cx.reduce(a.scratch(off, len), a.send.sub(off, len), a)?;
                a.scratch(off, len)
            }
        };
        if let Some(nx) = next {
            cx.put(nx, mine, peers[&nx].scratch_at(off), j as u32)?;
        }
    }
    cx.flush()
}

/// Binomial broadcast: each rank receives once, straight into its output,
/// and forwards to its children, largest subtree first.
pub(crate) fn broadcast_binomial<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, bytes) = (cx.rank, cx.n, a.count * a.es());
    let real = |v: usize| (v + a.root) % n;
    let v = (r + n - a.root) % n;
    let (parent, mut children) = binomial(v, n);
    children.reverse();
    let write_to: Vec<usize> = children.iter().map(|&(c, _)| real(c)).collect();
    let written_by: Vec<usize> = parent.iter().map(|&(p, _)| real(p)).collect();
    let peers = cx.handshake(&cx.handshake_of(a, true), &write_to, &written_by)?;
    let src = match parent {
        None => {
            cx.copy(a.send.sub(0, bytes), a.recv.sub(0, bytes))?;
            a.send.sub(0, bytes)
        }
        Some((p, _)) => {
            cx.wait(real(p), 0)?;
            a.recv.sub(0, bytes)
        }
    };
    for &(c, _) in &children {
        cx.put(real(c), src, peers[&real(c)].recv_at(0), 0)?;
    }
    cx.flush()
}

/// Chain broadcast from the root (`v = 0 -> 1 -> ... -> n-1`), pipelined in
/// `a.chunks` chunks written straight into each next rank's output.
pub(crate) fn broadcast_ring<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
    let (r, n, es) = (cx.rank, cx.n, a.es());
    let real = |v: usize| (v + a.root) % n;
    let v = (r + n - a.root) % n;
    let next = (v + 1 < n).then(|| real(v + 1));
    let prev = (v > 0).then(|| real(v - 1));
    let peers = cx.handshake(&cx.handshake_of(a, true), next.as_slice(), prev.as_slice())?;
    let source = if v == 0 { a.send } else { a.recv };
    for j in 0..a.chunks {
        let e = part(a.count, a.chunks, j);
        let (off, len) = (e.start * es, e.len() * es);
        if let Some(p) = prev {
            cx.wait(p, j as u32)?;
        }
        if let Some(nx) = next {
            cx.put(nx, source.sub(off, len), peers[&nx].recv_at(off), j as u32)?;
        }
    }
    if v == 0 {
        cx.copy(a.send.sub(0, a.count * es), a.recv.sub(0, a.count * es))?;
    }
    cx.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_tree_covers_every_rank_once() {
        for n in 1..20 {
            let mut seen = vec![0; n];
            for v in 0..n {
                let (parent, children) = binomial(v, n);
                assert_eq!(parent.is_none(), v == 0);
                for (c, _) in children {
                    seen[c] += 1;
                    assert_eq!(binomial(c, n).0.unwrap().0, v);
                }
            }
            assert!(seen[1..].iter().all(|&s| s == 1), "n={n} {seen:?}");
        }
    }
}
