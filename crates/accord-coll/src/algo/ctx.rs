//! One collective call in progress: its arguments, the descriptor handshake,
//! immediates, and error mapping that names the ranks at fault.

use accord_proto::frame::{FrameError, FrameReader};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::algo::{Algo, Collective};
use crate::dtype::DType;
use crate::error::{CollError, TransportError};
use crate::reduce::{finish_avg, reduce_into, ReduceOp};
use crate::transport::{BufSlice, CollTransport, Imm, LocalBuf, RemoteBufDesc, RemoteSlice, STEP_HANDSHAKE};

/// Most extra u64 fields a handshake may carry.
pub(crate) const HANDSHAKE_EXTRA_MAX: usize = 16;
const HANDSHAKE_VERSION: u8 = 1;
/// Most segments [`Ctx::put_counted`] cuts one write into (bounds the transfers it adds).
pub(crate) const SEGMENTS_PER_WRITE_MAX: usize = 256;

/// Per-peer counts of all_to_allv, in elements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllToAllVLayout {
    /// Elements sent to each peer.
    pub send_counts: Vec<usize>,
    /// Element offset in the send buffer of each peer's block.
    pub send_displs: Vec<usize>,
    /// Elements received from each peer.
    pub recv_counts: Vec<usize>,
    /// Element offset in the receive buffer of each peer's block.
    pub recv_displs: Vec<usize>,
}

/// Arguments of one call, validated by the communicator.
pub(crate) struct Args<'a> {
    pub send: BufSlice<'a>,
    pub recv: BufSlice<'a>,
    /// Elements, meaning per collective (see the communicator methods).
    pub count: usize,
    pub dtype: DType,
    pub op: ReduceOp,
    pub root: usize,
    pub scratch: Option<&'a LocalBuf>,
    /// Pipeline chunks of ring broadcast/reduce.
    pub chunks: usize,
    /// Elements per segment of the pipelined all_reduce schedules (at least 1).
    pub segment_elems: usize,
    pub layout: Option<&'a AllToAllVLayout>,
}

impl Args<'_> {
    pub fn es(&self) -> usize {
        self.dtype.size_bytes()
    }
    /// Scratch slice (panics if the communicator did not provide enough: our invariant).
    pub fn scratch(&self, offset: usize, len: usize) -> BufSlice<'_> {
        let s = self.scratch.expect("algorithm needs scratch; the communicator sizes it");
        assert!(offset + len <= s.len(), "scratch too small: {}+{} > {}", offset, len, s.len());
        s.slice(offset, len)
    }
}

/// The descriptor handshake a rank sends to the ranks that will write into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Handshake {
    pub collective: u8,
    pub algo: u8,
    pub dtype: u8,
    pub op: u8,
    pub root: u32,
    pub count: u64,
    pub param: u64,
    /// Output buffer and the offset of the output slice in it.
    pub recv: Option<(RemoteBufDesc, u64)>,
    pub scratch: Option<RemoteBufDesc>,
    pub extra: Vec<u64>,
}

impl Handshake {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![HANDSHAKE_VERSION, self.collective, self.algo, self.dtype, self.op];
        v.extend_from_slice(&self.root.to_le_bytes());
        v.extend_from_slice(&self.count.to_le_bytes());
        v.extend_from_slice(&self.param.to_le_bytes());
        v.push(u8::from(self.recv.is_some()) | (u8::from(self.scratch.is_some()) << 1));
        if let Some((d, off)) = &self.recv {
            d.encode_into(&mut v);
            v.extend_from_slice(&off.to_le_bytes());
        }
        if let Some(d) = &self.scratch {
            d.encode_into(&mut v);
        }
        assert!(self.extra.len() <= HANDSHAKE_EXTRA_MAX);
        v.push(self.extra.len() as u8);
        for x in &self.extra {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }

    pub fn decode(b: &[u8]) -> Result<Handshake, String> {
        let truncated = |e: FrameError| format!("handshake truncated: {e}");
        let mut r = FrameReader::new(b);
        let head: [u8; 5] = r.array().map_err(truncated)?;
        if head[0] != HANDSHAKE_VERSION {
            return Err(format!("handshake version {} (expected {HANDSHAKE_VERSION})", head[0]));
        }
        let root = r.u32().map_err(truncated)?;
        let count = r.u64().map_err(truncated)?;
        let param = r.u64().map_err(truncated)?;
        let flags = r.u8().map_err(truncated)?;
        let recv = if flags & 1 != 0 {
            let d = RemoteBufDesc::read(&mut r)?;
            Some((d, r.u64().map_err(truncated)?))
        } else {
            None
        };
        let scratch = if flags & 2 != 0 { Some(RemoteBufDesc::read(&mut r)?) } else { None };
        let n = r.u8().map_err(truncated)? as usize;
        if n > HANDSHAKE_EXTRA_MAX {
            return Err(format!("handshake has {n} extra fields, limit {HANDSHAKE_EXTRA_MAX}"));
        }
        let extra = (0..n).map(|_| r.u64().map_err(truncated)).collect::<Result<Vec<_>, _>>()?;
        Ok(Handshake {
            collective: head[1],
            algo: head[2],
            dtype: head[3],
            op: head[4],
            root,
            count,
            param,
            recv,
            scratch,
            extra,
        })
    }

    /// Where to write `offset` bytes into the peer's output slice.
    pub fn recv_at(&self, offset: usize) -> RemoteSlice<'_> {
        let (d, base) = self.recv.as_ref().expect("checked by Ctx::handshake");
        RemoteSlice { desc: d, offset: *base as usize + offset }
    }

    /// Where to write `offset` bytes into the peer's scratch.
    pub fn scratch_at(&self, offset: usize) -> RemoteSlice<'_> {
        RemoteSlice { desc: self.scratch.as_ref().expect("checked by Ctx::handshake"), offset }
    }
}

/// Handshakes received, by peer.
pub(crate) type Peers = HashMap<usize, Handshake>;

/// One collective call in progress.
pub(crate) struct Ctx<'a, T: CollTransport + ?Sized> {
    pub t: &'a T,
    pub collective: Collective,
    pub algo: Algo,
    pub seq: u64,
    pub rank: usize,
    pub n: usize,
    pub deadline: Instant,
    pub timeout: Duration,
    pub abort_grace: Duration,
    /// The communicator's progress board (stuck reports).
    pub progress: &'a crate::report::Progress,
}

fn dedup(v: &[usize]) -> Vec<usize> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

impl<T: CollTransport + ?Sized> Ctx<'_, T> {
    /// The immediate of `step` sent by `sender` in this call.
    pub fn imm(&self, step: u32, sender: usize) -> u32 {
        Imm::new(self.seq, step, sender).encode()
    }

    /// This rank's handshake for `a`.
    pub fn handshake_of(&self, a: &Args<'_>, needs_recv: bool) -> Handshake {
        Handshake {
            collective: self.collective.code(),
            algo: self.algo.code(),
            dtype: a.dtype.code(),
            op: a.op.code(),
            root: a.root as u32,
            count: a.count as u64,
            // The pipelining parameter that must match: it decides the immediates' step numbers
            // and counts.
            param: if matches!(self.collective, Collective::Reduce | Collective::Broadcast) {
                a.chunks
            } else {
                a.segment_elems
            } as u64,
            recv: needs_recv.then(|| (a.recv.buf.remote_desc().clone(), a.recv.offset as u64)),
            scratch: a.scratch.map(|s| s.remote_desc().clone()),
            extra: Vec::new(),
        }
    }

    /// Sends `mine` to every rank in `written_by` and collects the handshakes of
    /// every rank in `write_to`, checking that they called the same collective
    /// with the same arguments.
    pub fn handshake(&self, mine: &Handshake, write_to: &[usize], written_by: &[usize]) -> Result<Peers, CollError> {
        self.handshake_each(write_to, written_by, |_| mine.clone())
    }

    /// Like [`Self::handshake`] with a per-peer handshake (all_to_allv).
    pub fn handshake_each(
        &self,
        write_to: &[usize],
        written_by: &[usize],
        mine: impl Fn(usize) -> Handshake,
    ) -> Result<Peers, CollError> {
        self.handshake_each_then(&dedup(write_to), written_by, mine, |_, _| Ok(()))
    }

    /// Like [`Self::handshake_each`], waiting for the peers of `write_to` in the order given
    /// and calling `ready(peer, handshake)` as soon as each one's handshake is checked, so a
    /// schedule can start writing to a peer while others have not entered the call yet.
    pub fn handshake_each_then(
        &self,
        write_to: &[usize],
        written_by: &[usize],
        mine: impl Fn(usize) -> Handshake,
        mut ready: impl FnMut(usize, &Handshake) -> Result<(), CollError>,
    ) -> Result<Peers, CollError> {
        let tag = self.imm(STEP_HANDSHAKE, self.rank);
        for peer in dedup(written_by) {
            self.t.send_ctrl(peer, tag, &mine(peer).encode()).map_err(|e| self.fail(e, &[peer]))?;
        }
        let mut peers = Peers::new();
        let mut missing = Vec::new();
        let mut first_err = None;
        for &peer in write_to {
            if peers.contains_key(&peer) || missing.contains(&peer) {
                continue;
            }
            let waiting = self.progress.waiting(peer, "handshake", None, 1);
            let received = self.t.recv_ctrl(peer, self.imm(STEP_HANDSHAKE, peer), self.deadline);
            drop(waiting);
            match received {
                Ok(bytes) => {
                    let hs = Handshake::decode(&bytes)
                        .map_err(|reason| self.transport(TransportError::Malformed { peer, reason }))?;
                    self.check_peer(peer, &mine(peer), &hs)?;
                    if first_err.is_none() && missing.is_empty() {
                        ready(peer, &hs)?;
                    }
                    peers.insert(peer, hs);
                }
                Err(TransportError::Timeout { .. }) => missing.push(peer),
                Err(e) => {
                    first_err.get_or_insert((e, peer));
                }
            }
        }
        if let Some((e, peer)) = first_err {
            return Err(self.fail(e, &[peer]));
        }
        if !missing.is_empty() {
            return Err(self.blame(missing));
        }
        Ok(peers)
    }

    fn check_peer(&self, peer: usize, mine: &Handshake, theirs: &Handshake) -> Result<(), CollError> {
        let mismatch = |field: &'static str, ours: String, theirs: String| CollError::Mismatch {
            collective: self.collective.name(),
            peer,
            field,
            ours,
            theirs,
        };
        if theirs.collective != mine.collective {
            let name = |c: u8| Collective::ALL.iter().find(|x| x.code() == c).map_or("?", |x| x.name()).to_string();
            return Err(mismatch("collective", name(mine.collective), name(theirs.collective)));
        }
        // all_to_all(v) schedules interoperate, so ranks may choose differently.
        let schedules_interoperate = matches!(self.collective, Collective::AllToAll | Collective::AllToAllV);
        if theirs.algo != mine.algo && !schedules_interoperate {
            let name = |c: u8| {
                self.collective.algorithms().iter().find(|x| x.code() == c).map_or("?", |x| x.name()).to_string()
            };
            return Err(mismatch(
                "algorithm (set ACCORD_ALGO_* identically everywhere)",
                name(mine.algo),
                name(theirs.algo),
            ));
        }
        for (field, a, b) in [
            ("dtype", mine.dtype as u64, theirs.dtype as u64),
            ("op", mine.op as u64, theirs.op as u64),
            ("root", mine.root as u64, theirs.root as u64),
            ("count", mine.count, theirs.count),
            (
                "pipeline chunks or segments (ACCORD_COLL_PIPELINE_CHUNK_BYTES, ACCORD_COLL_SEGMENT_BYTES, \
                 ACCORD_COLL_BLOCK_SEGMENTS_MAX)",
                mine.param,
                theirs.param,
            ),
        ] {
            if a != b {
                return Err(mismatch(field, a.to_string(), b.to_string()));
            }
        }
        if mine.recv.is_some() && theirs.recv.is_none() || mine.scratch.is_some() && theirs.scratch.is_none() {
            return Err(self.transport(TransportError::Malformed { peer, reason: "handshake lacks a buffer".into() }));
        }
        Ok(())
    }

    /// Writes `src` to `dst` on `peer` with this rank's immediate of `step`
    /// (an immediate-only signal when `src` is empty).
    pub fn put(&self, peer: usize, src: BufSlice<'_>, dst: RemoteSlice<'_>, step: u32) -> Result<(), CollError> {
        let imm = self.imm(step, self.rank);
        let r = if src.len == 0 { self.t.signal(peer, imm) } else { self.t.write(peer, src, dst, Some(imm)) };
        r.map_err(|e| self.fail(e, &[peer]))
    }

    /// Segments [`Self::put_counted`] cuts `bytes` of `a`'s dtype into (at least 1, at most
    /// [`SEGMENTS_PER_WRITE_MAX`]); a receiver computes the count from the length it expects.
    pub fn segments_for(&self, a: &Args<'_>, bytes: usize) -> usize {
        (bytes / a.es()).div_ceil(a.segment_elems.max(1)).clamp(1, SEGMENTS_PER_WRITE_MAX)
    }

    /// Writes `src` to `dst` on `peer` in [`Self::segments_for`] segments, each carrying this
    /// rank's immediate of `step`; the receiver waits for that many with [`Self::wait_n`].
    /// Segments below the engine's shard size carry their immediate with their data (a
    /// sharded write sends it only after every shard is acknowledged) and spread over lanes.
    pub fn put_counted(
        &self,
        peer: usize,
        src: BufSlice<'_>,
        dst: RemoteSlice<'_>,
        step: u32,
        a: &Args<'_>,
    ) -> Result<(), CollError> {
        let es = a.es();
        debug_assert_eq!(src.len % es, 0, "writes move whole elements");
        let segs = self.segments_for(a, src.len);
        let elems = src.len / es;
        for j in 0..segs {
            let e = super::part(elems, segs, j);
            let (off, len) = (e.start * es, e.len() * es);
            self.put(peer, src.sub(off, len), RemoteSlice { desc: dst.desc, offset: dst.offset + off }, step)?;
        }
        Ok(())
    }

    /// Waits for `peer`'s write of `bytes` sent with [`Self::put_counted`] at `step`.
    pub fn wait_counted(&self, peer: usize, step: u32, bytes: usize, a: &Args<'_>) -> Result<(), CollError> {
        self.wait_n(peer, step, self.segments_for(a, bytes) as u32)
    }

    /// Waits for `peer`'s immediate of `step`.
    pub fn wait(&self, peer: usize, step: u32) -> Result<(), CollError> {
        self.wait_n(peer, step, 1)
    }

    /// Waits for `count` of `peer`'s immediates of `step`.
    pub fn wait_n(&self, peer: usize, step: u32, count: u32) -> Result<(), CollError> {
        if count == 0 {
            return Ok(());
        }
        let _waiting = self.progress.waiting(peer, "data", Some(step), count);
        self.t.wait_imm(self.imm(step, peer), count, self.deadline).map_err(|e| self.fail(e, &[peer]))
    }

    /// Waits for this rank's writes to complete.
    pub fn flush(&self) -> Result<(), CollError> {
        self.t.flush(self.deadline).map_err(|e| self.fail(e, &[]))
    }

    /// Local copy (skipped when both are the same region).
    pub fn copy(&self, src: BufSlice<'_>, dst: BufSlice<'_>) -> Result<(), CollError> {
        if src.same_region(&dst) || src.len == 0 {
            return Ok(());
        }
        assert_eq!(src.len, dst.len, "local copy of unequal lengths");
        self.t.access_local(src, dst, &mut |s, d| d.copy_from_slice(s)).map_err(|e| self.transport(e))
    }

    /// `dst = dst (op) src`, locally.
    pub fn reduce(&self, dst: BufSlice<'_>, src: BufSlice<'_>, a: &Args<'_>) -> Result<(), CollError> {
        if dst.len == 0 {
            return Ok(());
        }
        let mut result = Ok(());
        self.t
            .access_local(src, dst, &mut |s, d| result = reduce_into(d, s, a.dtype, a.op))
            .map_err(|e| self.transport(e))?;
        result.map_err(|source| CollError::Reduce { collective: self.collective.name(), source })
    }

    /// `dst = input (op) other`, locally: `input` is copied into `dst` first (skipped when
    /// they are the same region, as in place), so a schedule reads its input where it is
    /// and copies a segment only right before reducing it, while it is in cache.
    pub fn reduce_from(
        &self,
        dst: BufSlice<'_>,
        input: BufSlice<'_>,
        other: BufSlice<'_>,
        a: &Args<'_>,
    ) -> Result<(), CollError> {
        self.copy(input, dst)?;
        self.reduce(dst, other, a)
    }

    /// Finishes `Avg` on a local result region.
    pub fn finish_avg(&self, buf: BufSlice<'_>, a: &Args<'_>) -> Result<(), CollError> {
        if a.op != ReduceOp::Avg || buf.len == 0 {
            return Ok(());
        }
        let mut result = Ok(());
        let n = self.n;
        self.t
            .access_local(buf.buf.slice(0, 0), buf, &mut |_, d| result = finish_avg(d, a.dtype, a.op, n))
            .map_err(|e| self.transport(e))?;
        result.map_err(|source| CollError::Reduce { collective: self.collective.name(), source })
    }

    pub fn transport(&self, source: TransportError) -> CollError {
        CollError::Transport { collective: self.collective.name(), source }
    }

    /// Maps a transport error of an operation involving `suspects` (the
    /// ranks we were waiting for).
    pub fn fail(&self, e: TransportError, suspects: &[usize]) -> CollError {
        match e {
            TransportError::Timeout { .. } if !suspects.is_empty() => self.blame(suspects.to_vec()),
            TransportError::Aborted { .. } => self.blame(suspects.to_vec()),
            // The transport itself saw which peer went silent: start the blame there.
            TransportError::PeerUnreachable { peer } | TransportError::AckTimeout { peer, .. } => {
                self.blame(vec![peer])
            }
            // The engine saw the rank die: no need to follow other ranks' reports. Tell them
            // (best effort), so ranks not waiting on it stop too.
            TransportError::PeerDied { peer, reason } => {
                // A wait on it may have ended already (a handshake's): the report still names it.
                let _waiting = (!self.progress.waits_on(peer)).then(|| self.progress.waiting(peer, "data", None, 0));
                self.progress.write_if_configured("peer_died");
                self.t.report_stuck(peer);
                tracing::warn!(collective = self.collective.name(), seq = self.seq, rank = peer, %reason, "peer died");
                CollError::PeerDied { collective: self.collective.name(), seq: self.seq, rank: peer, reason }
            }
            other => self.transport(other),
        }
    }

    /// Works out which rank is at fault once this rank is stuck waiting for
    /// `missing` (after a timeout, or interrupted by another rank's report).
    ///
    /// Every stuck rank reports whom it waits for; after `abort_grace` this
    /// rank follows the chain of reports from its own suspect (A waits for B,
    /// B for C, ...) to a rank that reported nothing: a dead rank never
    /// reports, while a live rank that was itself stuck does. So every rank
    /// names the root cause, not the neighbour that was waiting on it.
    fn blame(&self, missing: Vec<usize>) -> CollError {
        {
            // The report lists whom this rank waited for (the waits themselves have ended).
            let _waiting: Vec<_> = missing
                .iter()
                .filter(|&&m| !self.progress.waits_on(m))
                .map(|&m| self.progress.waiting(m, "data", None, 0))
                .collect();
            self.progress.write_if_configured("deadline");
        }
        if let Some(&first) = missing.first() {
            self.t.report_stuck(first);
        }
        std::thread::sleep(self.abort_grace);
        let reports: HashMap<usize, usize> = self.t.stuck_reports().into_iter().collect();
        let start = match missing.first() {
            Some(&m) => m,
            // Not waiting for anyone in particular: start from any report.
            None => match reports.values().next() {
                Some(&w) => w,
                None => return self.transport(TransportError::Stopped),
            },
        };
        let (mut cur, mut reporter, mut hops) = (start, None, 0);
        while let Some(&next) = reports.get(&cur) {
            if next == cur || hops > self.n || next == self.rank {
                break; // a cycle: no single culprit, keep the last one reached
            }
            reporter = Some(cur);
            cur = next;
            hops += 1;
        }
        if let Some(reason) = (cur != self.rank).then(|| self.t.peer_death(cur)).flatten() {
            tracing::warn!(collective = self.collective.name(), seq = self.seq, ?missing, rank = cur, %reason, "collective failed: peer died");
            return CollError::PeerDied { collective: self.collective.name(), seq: self.seq, rank: cur, reason };
        }
        tracing::warn!(
            collective = self.collective.name(),
            seq = self.seq,
            ?missing,
            culprit = cur,
            "collective failed"
        );
        match reporter {
            None => {
                // The collective started `timeout` before its deadline.
                let left = self.deadline.saturating_duration_since(std::time::Instant::now());
                let waited = self.timeout.saturating_sub(left);
                CollError::Timeout {
                    collective: self.collective.name(),
                    seq: self.seq,
                    missing,
                    waited,
                    timeout: self.timeout,
                }
            }
            Some(reported_by) => CollError::PeerFailed {
                collective: self.collective.name(),
                seq: self.seq,
                failed_rank: cur,
                reported_by,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Progress;
    use crate::{LocalFabric, LocalTransport};

    /// An all_reduce context of 3 ranks on `rank`'s local transport, already past its deadline,
    /// with a 1 ms grace for reports.
    fn ctx_of<'a>(t: &'a LocalTransport, rank: usize, seq: u64, progress: &'a Progress) -> Ctx<'a, LocalTransport> {
        progress.begin("all_reduce", "ring", seq);
        Ctx {
            t,
            collective: Collective::AllReduce,
            algo: Algo::Ring,
            seq,
            rank,
            n: 3,
            deadline: Instant::now(),
            timeout: Duration::from_millis(50),
            abort_grace: Duration::from_millis(1),
            progress,
        }
    }

    /// A flush that ran out of time on rank 2's acknowledgements blames rank 2 and tells the
    /// others so: the rank whose only wait was that flush must not fail without naming anyone
    /// (a doctor run once named the waiting rank instead, as it had written no report).
    #[test]
    fn an_ack_timeout_blames_the_silent_peer_and_tells_the_others() {
        let ts = LocalFabric::create(3).unwrap();
        let progress = Progress::new(1, 3, "c0".into(), None);
        let ctx = ctx_of(&ts[1], 1, 4, &progress);
        let e = ctx.fail(TransportError::AckTimeout { peer: 2, waited: Duration::from_millis(50) }, &[]);
        assert!(matches!(&e, CollError::Timeout { missing, .. } if missing == &[2]), "{e}");
        assert_eq!(ts[0].stuck_reports(), vec![(1, 2)]);
        let plain = ctx.fail(TransportError::Timeout { what: "x".into(), waited: Duration::ZERO }, &[]);
        assert!(matches!(plain, CollError::Transport { .. }), "a timeout with no suspect stays a transport error");
    }

    /// Rank 0 waited for rank 1, which reported waiting for rank 2: the reports alone say
    /// rank 2 stopped responding; once the transport knows rank 2's process exited, the error
    /// says that instead (CI once saw the weaker message where a test expected the death).
    #[test]
    fn blame_names_a_dead_culprit_with_the_transports_reason() {
        let ts = LocalFabric::create(3).unwrap();
        let progress = Progress::new(0, 3, "c0".into(), None);
        let ctx = ctx_of(&ts[0], 0, 9, &progress);
        ts[1].report_stuck(2);
        let aborted = || TransportError::Aborted { reported_by: 1, waiting_on: 2 };
        let e = ctx.fail(aborted(), &[1]);
        assert!(matches!(e, CollError::PeerFailed { failed_rank: 2, reported_by: 1, .. }), "{e}");
        ts[0].declare_dead(2, "its process (pid 7 on this host) exited");
        let e = ctx.fail(aborted(), &[1]);
        assert!(matches!(&e, CollError::PeerDied { rank: 2, reason, .. } if reason.contains("pid 7")), "{e}");
        assert!(e.to_string().contains("rank 2 is dead"), "{e}");
    }
}
