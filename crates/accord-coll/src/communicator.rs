//! [`Communicator`]: the collectives of one group of ranks over a
//! [`CollTransport`].
//!
//! Buffers are registered with the communicator's transport
//! ([`Communicator::register`]) and passed as [`BufSlice`]s; peers write
//! straight into them. Counts are in elements of the given [`DType`]. Every
//! rank must call the same collectives in the same order with matching
//! arguments; the per-call handshake detects most mismatches and reports them
//! as [`CollError::Mismatch`]. After a failure that involved peers (timeout,
//! abort, mismatch) the communicator is poisoned: recreate it.

use std::time::Instant;

use crate::algo::{self, Algo, Args, Collective, Ctx};
use crate::config::CollConfig;
use crate::dtype::{DType, Element};
use crate::error::{CollError, TransportError};
use crate::reduce::ReduceOp;
use crate::transport::{BufSlice, CollTransport, LocalBuf, WORLD_SIZE_MAX};

pub use crate::algo::AllToAllVLayout;

/// Input and output of a collective (the same slice for in-place use).
#[derive(Copy, Clone, Debug)]
pub struct Bufs<'a> {
    /// Input.
    pub send: BufSlice<'a>,
    /// Output.
    pub recv: BufSlice<'a>,
}

impl<'a> Bufs<'a> {
    /// Input and output are the same slice.
    pub fn in_place(buf: BufSlice<'a>) -> Bufs<'a> {
        Bufs { send: buf, recv: buf }
    }
}

/// The communicator of one rank.
pub struct Communicator<T: CollTransport> {
    t: T,
    config: CollConfig,
    seq: u64,
    p2p_send_seq: Vec<u64>,
    p2p_recv_seq: Vec<u64>,
    scratch: Option<LocalBuf>,
    /// Registered memory the communicator owns for the copying conveniences
    /// ([`Self::run_staged`]): registered once, grown when needed, so those calls neither
    /// register nor deregister memory and hand peers the same descriptor every time. Only the
    /// communicator reaches it, so a peer can never be handed an address the user has since
    /// freed (the risk of caching registrations of user memory by address).
    staging: Option<LocalBuf>,
    poisoned: Option<String>,
    /// The host arena, mapped at the first arena all_reduce (`None`: not tried yet), or why
    /// this communicator has none.
    arena: std::sync::OnceLock<Result<crate::arena::Arena, crate::arena::Unavailable>>,
    /// What this rank is doing now, for stuck reports ([`crate::report`]).
    progress: std::sync::Arc<crate::report::Progress>,
}

/// What one call asks for, before dispatch.
struct Call<'a> {
    collective: Collective,
    bufs: Bufs<'a>,
    count: usize,
    dtype: DType,
    op: ReduceOp,
    root: usize,
    algo: Option<Algo>,
    send_bytes: usize,
    recv_bytes: usize,
    layout: Option<&'a AllToAllVLayout>,
}

impl<'a> Call<'a> {
    /// The schedule's arguments for this call's (checked) buffers.
    fn args<'b>(&self, bufs: Bufs<'b>, scratch: Option<&'b LocalBuf>, chunks: usize, segment_elems: usize) -> Args<'b>
    where
        'a: 'b,
    {
        Args {
            send: bufs.send,
            recv: bufs.recv,
            count: self.count,
            dtype: self.dtype,
            op: self.op,
            root: self.root,
            scratch,
            chunks,
            segment_elems,
            layout: self.layout,
        }
    }

    /// A call moving `send_bytes` out of and `recv_bytes` into this rank, with no reduction
    /// operator, root 0 and no all_to_allv layout (the fields most collectives leave so).
    #[allow(clippy::too_many_arguments)]
    fn new(
        collective: Collective,
        bufs: Bufs<'a>,
        count: usize,
        dtype: DType,
        algo: Option<Algo>,
        send_bytes: usize,
        recv_bytes: usize,
    ) -> Call<'a> {
        Call { collective, bufs, count, dtype, op: ReduceOp::Sum, root: 0, algo, send_bytes, recv_bytes, layout: None }
    }
}

impl<T: CollTransport> Communicator<T> {
    /// A communicator over `transport`.
    pub fn new(transport: T, config: CollConfig) -> Result<Self, CollError> {
        let n = transport.world_size();
        if n == 0 || n > WORLD_SIZE_MAX || transport.rank() >= n {
            return Err(CollError::InvalidArgument {
                collective: "communicator",
                reason: format!(
                    "rank {} of world {n} is invalid; worlds have 1..={WORLD_SIZE_MAX} ranks",
                    transport.rank()
                ),
            });
        }
        let progress = crate::report::Progress::new(
            transport.rank(),
            transport.world_size(),
            transport.comm_id(),
            transport.peer_reporter(),
        );
        Ok(Communicator {
            progress,
            t: transport,
            config,
            seq: 0,
            p2p_send_seq: vec![0; n],
            p2p_recv_seq: vec![0; n],
            scratch: None,
            staging: None,
            poisoned: None,
            arena: std::sync::OnceLock::new(),
        })
    }

    /// This rank's stuck report now: the collective in progress, whom it waits for, and the
    /// transport's view of them (see [`crate::report`]).
    pub fn stuck_report(&self, trigger: &str) -> crate::report::StuckReport {
        self.progress.report(trigger)
    }

    /// The progress board itself: a handle that reports while a call runs on another thread.
    pub fn progress(&self) -> std::sync::Arc<crate::report::Progress> {
        self.progress.clone()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.t.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.t.world_size()
    }

    /// The configuration.
    pub fn config(&self) -> &CollConfig {
        &self.config
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.t
    }

    /// Number of collectives called so far (the next call's sequence number).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Registers `memory` so collectives can use it (no copy).
    pub fn register(&self, memory: Vec<u8>) -> Result<LocalBuf, CollError> {
        self.t.register(memory).map_err(|source| CollError::Transport { collective: "register", source })
    }

    /// Registers a copy of `data` (a convenience; [`Self::register`] avoids the copy).
    pub fn register_typed<E: Element>(&self, data: &[E]) -> Result<LocalBuf, CollError> {
        self.register(bytemuck::cast_slice(data).to_vec())
    }

    /// Reads a registered slice as elements.
    pub fn read_typed<E: Element>(&self, slice: BufSlice<'_>) -> Result<Vec<E>, CollError> {
        let mut bytes = vec![0u8; slice.len];
        self.t.read_local(slice, &mut bytes).map_err(|source| CollError::Transport { collective: "read", source })?;
        let elems = slice.len / std::mem::size_of::<E>();
        let mut out = vec![E::zeroed(); elems];
        bytemuck::cast_slice_mut::<E, u8>(&mut out).copy_from_slice(&bytes[..elems * std::mem::size_of::<E>()]);
        Ok(out)
    }

    /// Deregisters a buffer and returns its memory.
    pub fn deregister(&self, buf: LocalBuf) -> Result<Vec<u8>, CollError> {
        self.t.deregister(buf).map_err(|source| CollError::Transport { collective: "deregister", source })
    }

    /// all_reduce of `count` elements: every output holds the element-wise reduction of all inputs.
    pub fn all_reduce(
        &mut self,
        bufs: Bufs<'_>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        algo: Option<Algo>,
    ) -> Result<(), CollError> {
        let b = count * dtype.size_bytes();
        self.run(Call { op, ..Call::new(Collective::AllReduce, bufs, count, dtype, algo, b, b) })
    }

    /// reduce of `count` elements to `root` (the output matters only there).
    pub fn reduce(
        &mut self,
        bufs: Bufs<'_>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        algo: Option<Algo>,
    ) -> Result<(), CollError> {
        let b = count * dtype.size_bytes();
        let recv_bytes = if self.rank() == root { b } else { 0 };
        self.run(Call { op, root, ..Call::new(Collective::Reduce, bufs, count, dtype, algo, b, recv_bytes) })
    }

    /// broadcast of `count` elements from `root`'s input to every output.
    pub fn broadcast(
        &mut self,
        bufs: Bufs<'_>,
        count: usize,
        dtype: DType,
        root: usize,
        algo: Option<Algo>,
    ) -> Result<(), CollError> {
        let b = count * dtype.size_bytes();
        let send_bytes = if self.rank() == root { b } else { 0 };
        self.run(Call { root, ..Call::new(Collective::Broadcast, bufs, count, dtype, algo, send_bytes, b) })
    }

    /// all_gather: each input has `count` elements; each output `count * n`, by rank.
    pub fn all_gather(
        &mut self,
        bufs: Bufs<'_>,
        count: usize,
        dtype: DType,
        algo: Option<Algo>,
    ) -> Result<(), CollError> {
        let b = count * dtype.size_bytes();
        let n = self.world_size();
        self.run(Call::new(Collective::AllGather, bufs, count, dtype, algo, b, b * n))
    }

    /// reduce_scatter: each input has `count * n` elements; rank r's output gets the reduction of block r (`count` elements).
    pub fn reduce_scatter(
        &mut self,
        bufs: Bufs<'_>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        algo: Option<Algo>,
    ) -> Result<(), CollError> {
        let b = count * dtype.size_bytes();
        let n = self.world_size();
        self.run(Call { op, ..Call::new(Collective::ReduceScatter, bufs, count, dtype, algo, b * n, b) })
    }

    /// all_to_all: block j (`count` elements) of each input goes to rank j, landing at block r of its output.
    pub fn all_to_all(
        &mut self,
        bufs: Bufs<'_>,
        count: usize,
        dtype: DType,
        algo: Option<Algo>,
    ) -> Result<(), CollError> {
        let b = count * dtype.size_bytes() * self.world_size();
        self.run(Call::new(Collective::AllToAll, bufs, count, dtype, algo, b, b))
    }

    /// all_to_allv with per-peer counts and displacements (elements). The
    /// count this rank sends to j must equal the count j expects from it.
    pub fn all_to_allv(
        &mut self,
        bufs: Bufs<'_>,
        layout: &AllToAllVLayout,
        dtype: DType,
        algo: Option<Algo>,
    ) -> Result<(), CollError> {
        let n = self.world_size();
        let es = dtype.size_bytes();
        let lens = [&layout.send_counts, &layout.send_displs, &layout.recv_counts, &layout.recv_displs];
        if lens.iter().any(|v| v.len() != n) {
            return Err(CollError::InvalidArgument {
                collective: "all_to_allv",
                reason: format!("counts and displacements need {n} entries each (one per rank)"),
            });
        }
        let extent = |c: &[usize], d: &[usize]| c.iter().zip(d).map(|(c, d)| (c + d) * es).max().unwrap_or(0);
        let send_bytes = extent(&layout.send_counts, &layout.send_displs);
        let recv_bytes = extent(&layout.recv_counts, &layout.recv_displs);
        if layout.send_counts[self.rank()] != layout.recv_counts[self.rank()] {
            return Err(CollError::InvalidArgument {
                collective: "all_to_allv",
                reason: "send_counts[rank] must equal recv_counts[rank] (the block this rank keeps)".into(),
            });
        }
        self.run(Call {
            layout: Some(layout),
            ..Call::new(Collective::AllToAllV, bufs, 0, dtype, algo, send_bytes, recv_bytes)
        })
    }

    /// Dissemination barrier.
    pub fn barrier(&mut self) -> Result<(), CollError> {
        self.check_usable()?;
        let seq = self.next_seq();
        if self.world_size() == 1 {
            return Ok(());
        }
        let cx = self.ctx(Collective::Barrier, Algo::Dissemination, seq);
        let r = algo::barrier(&cx);
        self.outcome(r)
    }

    /// Sends `count` elements to `peer`, which must call [`Self::recv`] (or
    /// [`Self::send_recv`]). Blocks until the receiver is ready and the data is placed.
    pub fn send(&mut self, peer: usize, buf: BufSlice<'_>, count: usize, dtype: DType) -> Result<(), CollError> {
        self.p2p(Some((peer, buf)), None, count, dtype)
    }

    /// Receives `count` elements from `peer` into `buf`.
    pub fn recv(&mut self, peer: usize, buf: BufSlice<'_>, count: usize, dtype: DType) -> Result<(), CollError> {
        self.p2p(None, Some((peer, buf)), count, dtype)
    }

    /// Sends to `send_peer` and receives from `recv_peer` at once (no deadlock
    /// when every rank does it, as in a ring shift).
    pub fn send_recv(
        &mut self,
        send: (usize, BufSlice<'_>),
        recv: (usize, BufSlice<'_>),
        count: usize,
        dtype: DType,
    ) -> Result<(), CollError> {
        self.p2p(Some(send), Some(recv), count, dtype)
    }

    /// all_reduce of a plain slice (copies into and out of registered memory:
    /// a convenience, not the zero-copy path; see [`Self::run_staged`]).
    pub fn all_reduce_typed<E: Element>(&mut self, data: &mut [E], op: ReduceOp) -> Result<(), CollError> {
        let count = data.len();
        self.run_staged(bytemuck::cast_slice_mut(data), |c, bufs| c.all_reduce(bufs, count, E::DTYPE, op, None))
    }

    /// Runs `f` in place on a copy of `data` in the communicator's own registered staging
    /// buffer, then copies the result back into `data`: for callers whose memory is not
    /// registered (bindings, slices). The staging buffer is registered once and reused, so
    /// repeated calls cost two copies and no registration.
    pub fn run_staged(
        &mut self,
        data: &mut [u8],
        f: impl FnOnce(&mut Self, Bufs<'_>) -> Result<(), CollError>,
    ) -> Result<(), CollError> {
        let transport_err = |collective: &'static str| move |source| CollError::Transport { collective, source };
        let len = data.len();
        let staging = match self.staging.take() {
            Some(buf) if buf.len() >= len => buf,
            old => {
                if let Some(old) = old {
                    self.deregister(old)?;
                }
                let grown = len.max(4096).next_power_of_two().min(self.config.scratch_bytes_max.max(len));
                self.register(vec![0u8; grown])?
            }
        };
        let slice = staging.slice(0, len);
        let result = self
            .t
            .write_local(slice, data)
            .map_err(transport_err("staging"))
            .and_then(|_| f(self, Bufs::in_place(slice)))
            .and_then(|_| self.t.read_local(slice, data).map_err(transport_err("staging")));
        match self.staging {
            None => self.staging = Some(staging),
            // `f` staged something itself meanwhile: keep that one.
            Some(_) => {
                let _ = self.deregister(staging);
            }
        }
        result
    }

    /// Whether `c` goes through the host arena if the ranks share one (the transport's
    /// directory for it is checked at the arena's setup): an all_reduce with no algorithm
    /// forced, with the arena on. Every rank reaches the same answer from the same call and
    /// configuration.
    fn arena_by_default(&self, c: &Call<'_>) -> bool {
        c.collective == Collective::AllReduce
            && self.config.arena
            && c.algo.is_none()
            && !self.config.algo_overrides.contains_key(&Collective::AllReduce)
    }

    fn check_usable(&self) -> Result<(), CollError> {
        match &self.poisoned {
            Some(reason) => Err(CollError::Poisoned { reason: reason.clone() }),
            None => Ok(()),
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq - 1
    }

    /// The host arena's shape from this communicator's configuration.
    fn arena_shape(&self) -> crate::arena::Shape {
        crate::arena::Shape::new(self.config.arena_slot_bytes, self.config.arena_lanes)
    }

    fn ctx(&self, collective: Collective, algo: Algo, seq: u64) -> Ctx<'_, T> {
        self.progress.begin(collective.name(), algo.name(), seq);
        Ctx {
            progress: &self.progress,
            t: &self.t,
            collective,
            algo,
            seq,
            rank: self.rank(),
            n: self.world_size(),
            deadline: Instant::now() + self.config.timeout,
            timeout: self.config.timeout,
            abort_grace: self.config.abort_grace,
        }
    }

    fn outcome(&mut self, r: Result<(), CollError>) -> Result<(), CollError> {
        self.progress.end(r.is_ok());
        if let Err(e) = &r {
            self.poisoned.get_or_insert_with(|| e.to_string());
        }
        r
    }

    fn check_slice(
        &self,
        collective: Collective,
        what: &'static str,
        s: BufSlice<'_>,
        needed_bytes: usize,
    ) -> Result<(), CollError> {
        s.check(what)
            .map_err(|e| CollError::InvalidArgument { collective: collective.name(), reason: e.to_string() })?;
        if s.len < needed_bytes {
            return Err(CollError::BufferTooSmall {
                collective: collective.name(),
                what,
                needed_bytes,
                have_bytes: s.len,
            });
        }
        Ok(())
    }

    fn ensure_scratch(&mut self, collective: Collective, bytes: usize) -> Result<(), CollError> {
        if bytes == 0 || self.scratch.as_ref().is_some_and(|s| s.len() >= bytes) {
            return Ok(());
        }
        if bytes > self.config.scratch_bytes_max {
            return Err(CollError::InvalidArgument {
                collective: collective.name(),
                reason: format!(
                    "needs {bytes} bytes of scratch, above the limit of {}; raise ACCORD_COLL_SCRATCH_BYTES_MAX or choose a ring algorithm",
                    self.config.scratch_bytes_max
                ),
            });
        }
        if let Some(old) = self.scratch.take() {
            self.deregister(old)?;
        }
        let grown = bytes.max(4096).next_power_of_two().min(self.config.scratch_bytes_max.max(bytes));
        self.scratch = Some(self.register(vec![0u8; grown])?);
        Ok(())
    }

    fn run(&mut self, c: Call<'_>) -> Result<(), CollError> {
        self.check_usable()?;
        let seq = self.next_seq();
        let (n, r, es) = (self.world_size(), self.rank(), c.dtype.size_bytes());
        if c.root >= n {
            return Err(CollError::InvalidArgument {
                collective: c.collective.name(),
                reason: format!("root {} is not a rank of this world of {n}", c.root),
            });
        }
        self.check_slice(c.collective, "send buffer", c.bufs.send, c.send_bytes)?;
        self.check_slice(c.collective, "recv buffer", c.bufs.recv, c.recv_bytes)?;
        if let Some(algo) = c.algo {
            if !c.collective.algorithms().contains(&algo) {
                return Err(Algo::parse_for(c.collective, algo.name()).unwrap_err().into());
            }
        }
        let bufs = Bufs { send: c.bufs.send.sub(0, c.send_bytes), recv: c.bufs.recv.sub(0, c.recv_bytes) };
        if c.layout.is_none() && (c.count == 0 || n == 1) {
            return self.run_local(&c, bufs);
        }
        let size_bytes = match c.collective {
            Collective::AllGather | Collective::ReduceScatter => c.count * es * n,
            Collective::AllToAllV => {
                let l = c.layout.expect("all_to_allv has a layout");
                l.send_counts.iter().chain(&l.recv_counts).max().copied().unwrap_or(0) * es
            }
            _ => c.count * es,
        };
        let mut algo = self.config.algo_for(c.collective, size_bytes, c.algo);
        let segment_elems = algo::call_segment_elems(
            c.collective,
            c.count,
            n,
            es,
            self.config.segment_bytes,
            self.config.block_segments_max,
        );
        let args_with = |scratch, chunks| c.args(bufs, scratch, chunks, segment_elems);
        if self.arena_by_default(&c) {
            match self.arena.get() {
                Some(Ok(_)) => algo = Algo::Arena,
                Some(Err(_)) => {}
                None => {
                    // The first all_reduce: every rank asks in this same call.
                    let available = {
                        let cx = self.ctx(c.collective, Algo::Arena, seq);
                        crate::arena::available(&cx, &args_with(None, 1), &self.arena, self.arena_shape())
                    };
                    match available {
                        Ok(true) => algo = Algo::Arena,
                        Ok(false) => {}
                        Err(e) => return self.outcome(Err(e)),
                    }
                }
            }
        }
        let scratch_bytes = algo::scratch_bytes(c.collective, algo, c.count, es, n);
        self.ensure_scratch(c.collective, scratch_bytes)?;
        let chunks = match (c.collective, algo) {
            (Collective::Reduce | Collective::Broadcast, Algo::Ring) => {
                algo::pipeline_chunks(c.count, es, self.config.pipeline_chunk_bytes)
            }
            _ => 1,
        };
        let args = args_with(if scratch_bytes > 0 { self.scratch.as_ref() } else { None }, chunks);
        let cx = self.ctx(c.collective, algo, seq);
        tracing::trace!(collective = c.collective.name(), %algo, seq, rank = r, count = c.count, "collective");
        let result = match algo {
            Algo::Arena => {
                crate::arena::run(&cx, &args, &self.arena, self.arena_shape(), self.config.arena_streaming_min_bytes)
            }
            _ => algo::dispatch(&cx, &args),
        };
        self.outcome(result)
    }

    /// One rank, or nothing to move: only local copies.
    fn run_local(&mut self, c: &Call<'_>, bufs: Bufs<'_>) -> Result<(), CollError> {
        let r = self.rank();
        let len = c.count * c.dtype.size_bytes();
        let (src, dst) = match c.collective {
            Collective::AllGather => (bufs.send, bufs.recv.sub(r * len, len)),
            Collective::ReduceScatter => (bufs.send.sub(r * len, len), bufs.recv),
            _ => (bufs.send.sub(0, len.min(bufs.send.len)), bufs.recv.sub(0, len.min(bufs.recv.len))),
        };
        if src.len == dst.len && src.len > 0 && !src.same_region(&dst) {
            let collective = c.collective.name();
            self.t
                .access_local(src, dst, &mut |s, d| d.copy_from_slice(s))
                .map_err(|source: TransportError| CollError::Transport { collective, source })?;
        }
        Ok(())
    }

    fn p2p(
        &mut self,
        send: Option<(usize, BufSlice<'_>)>,
        recv: Option<(usize, BufSlice<'_>)>,
        count: usize,
        dtype: DType,
    ) -> Result<(), CollError> {
        self.check_usable()?;
        let n = self.world_size();
        let bytes = count * dtype.size_bytes();
        // A send to oneself paired with a receive from oneself (what a one-rank ring does) is a
        // local copy, as in NCCL.
        let me = self.rank();
        if let (Some((sp, sb)), Some((rp, rb))) = (send, recv) {
            if sp == me && rp == me {
                self.check_slice(Collective::SendRecv, "send buffer", sb, bytes)?;
                self.check_slice(Collective::SendRecv, "recv buffer", rb, bytes)?;
                let (src, dst) = (sb.sub(0, bytes), rb.sub(0, bytes));
                if src.same_region(&dst) {
                    return Ok(());
                }
                return self
                    .t
                    .access_local(src, dst, &mut |s, d| d.copy_from_slice(s))
                    .map_err(|source| CollError::Transport { collective: "sendrecv", source });
            }
        }
        for (peer, buf, what) in
            send.iter().map(|(p, b)| (*p, *b, "send buffer")).chain(recv.iter().map(|(p, b)| (*p, *b, "recv buffer")))
        {
            if peer >= n || peer == self.rank() {
                return Err(CollError::InvalidArgument {
                    collective: "sendrecv",
                    reason: format!("peer {peer} must be another rank of this world of {n}"),
                });
            }
            self.check_slice(Collective::SendRecv, what, buf, bytes)?;
        }
        let send_seq = send.map(|(p, _)| {
            self.p2p_send_seq[p] += 1;
            self.p2p_send_seq[p] - 1
        });
        let recv_seq = recv.map(|(p, _)| {
            self.p2p_recv_seq[p] += 1;
            self.p2p_recv_seq[p] - 1
        });
        let empty = send.or(recv).expect("send or recv").1.buf.slice(0, 0);
        fn args<'a>(send: BufSlice<'a>, recv: BufSlice<'a>, count: usize, dtype: DType) -> Args<'a> {
            Args {
                send,
                recv,
                count,
                dtype,
                op: ReduceOp::Sum,
                root: 0,
                scratch: None,
                chunks: 1,
                segment_elems: 1,
                layout: None,
            }
        }
        let cx = self.ctx(Collective::SendRecv, Algo::Direct, 0);
        let result = (|| {
            if let (Some((p, b)), Some(seq)) = (recv, recv_seq) {
                algo::post_recv(&cx, &args(empty, b.sub(0, bytes), count, dtype), p, seq)?;
            }
            if let (Some((p, b)), Some(seq)) = (send, send_seq) {
                algo::send(&cx, &args(b.sub(0, bytes), empty, count, dtype), p, seq)?;
            }
            if let (Some((p, _)), Some(seq)) = (recv, recv_seq) {
                algo::wait_recv(&cx, p, seq)?;
            }
            Ok(())
        })();
        self.outcome(result)
    }
}

#[cfg(test)]
mod tests;
