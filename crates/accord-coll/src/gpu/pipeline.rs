//! The pipelined round of all_reduce and reduce_scatter.
//!
//! A round is split into chunks (see [`super::plan::ReduceRound`]). All
//! scatter copies are queued at once on the per-peer scatter streams, one
//! event per chunk; the progress thread then loops, without blocking on any
//! single step:
//! - a scatter chunk whose event completed is signalled to its receiver
//!   (in chunk order, one board signal per chunk per peer);
//! - a chunk whose slices arrived from every peer is reduced on the local
//!   stream, and its gather copies are queued on the per-peer gather streams
//!   behind the reduction's event (a GPU-side wait, no host round trip);
//! - a gather chunk whose event completed is signalled, after every scatter
//!   signal to that peer (so the receiver's counts stay ordered).
//!
//! So the copy engines move chunk k+1 of the scatter while the SMs reduce
//! chunk k and the copy engines push chunk k-1 back out. The receiver knows
//! every count in advance: each peer signals each chunk exactly once per
//! phase, empty slices included.

use std::time::{Duration, Instant};

use accord_cuda::{copy_peer_async, DevicePtr};

use super::board::{Deadline, LIVENESS_CHECK_INTERVAL};
use super::error::{GpuCollError, GpuResult};
use super::plan::{Buf, ReduceRound};
use super::worker::{wait_event, Op, Worker};

/// Where the pipeline of one round stands.
struct Progress {
    /// Next scatter chunk to signal, per peer.
    scatter_signalled: Vec<usize>,
    /// Next gather chunk to signal, per peer.
    gather_signalled: Vec<usize>,
    /// Next chunk to reduce.
    reduced: usize,
}

impl Worker {
    /// Runs one pipelined round (`seq` already posted ready).
    pub(super) fn run_reduce_round(
        &mut self,
        op: &Op,
        seq: u64,
        round: &ReduceRound,
        first_chunk: u64,
        deadline: Deadline,
    ) -> GpuResult<()> {
        // Where the caller's stream reduces (super::caller_reduce), this thread only tells it
        // which chunks arrived and waits on its words; `first_chunk` numbers this round's chunks
        // within the call.
        let caller = match (&self.caller, op.caller_chunks) {
            (Some(c), Some(numbers)) => Some((std::sync::Arc::clone(c), numbers)),
            _ => None,
        };
        let count = round.chunks.len();
        if count > self.pipeline.chunks_max() {
            return Err(GpuCollError::InvalidArgument {
                what: format!(
                    "a round of {count} chunks exceeds the {} the worker has events for",
                    self.pipeline.chunks_max()
                ),
            });
        }
        let me = self.rank;
        let others: Vec<usize> = (0..self.world_size).filter(|&r| r != me).collect();
        let base: Vec<u64> = self.expected.clone();
        // Queue every scatter copy now; the copy engines work through them in order.
        let mut scratch_base: Vec<Option<DevicePtr>> = vec![None; self.world_size];
        for (c, chunk) in round.chunks.iter().enumerate() {
            for push in &chunk.scatter {
                let peer = push.dst_rank;
                let dst = match scratch_base[peer] {
                    Some(b) => b,
                    None => {
                        let b = self.remote_ptr(peer, seq, Buf::Scratch, 0, deadline)?;
                        scratch_base[peer] = Some(b);
                        b
                    }
                };
                let src = self.local_ptr(op, push.src, push.src_offset);
                let streams = &self.peer_streams[peer];
                let stream = &streams[c % streams.len()];
                copy_peer_async(dst.offset(push.dst_offset), &self.gpu, src, &self.gpu, push.len, stream)?;
            }
            for &peer in &others {
                let streams = &self.peer_streams[peer];
                self.pipeline.scatter_events[peer][c].record(&streams[c % streams.len()])?;
            }
        }
        let phases = 1 + u64::from(round.with_gather);
        let mut at = Progress {
            scatter_signalled: vec![0; self.world_size],
            gather_signalled: vec![0; self.world_size],
            reduced: 0,
        };
        let mut recv_base: Vec<Option<DevicePtr>> = vec![None; self.world_size];
        let mut polls: u32 = 0;
        let mut liveness_at = Instant::now();
        loop {
            let mut moved = false;
            for &peer in &others {
                while at.scatter_signalled[peer] < count
                    && self.pipeline.scatter_events[peer][at.scatter_signalled[peer]].is_complete()?
                {
                    self.shared.board.signal_done(me, peer);
                    at.scatter_signalled[peer] += 1;
                    moved = true;
                }
            }
            while at.reduced < count
                && others.iter().all(|&s| self.shared.board.done_count(s, me) > base[s] + at.reduced as u64)
            {
                let c = at.reduced;
                let chunk = &round.chunks[c];
                match &caller {
                    Some((words, numbers)) => words.set_arrived(*numbers, first_chunk + c as u64),
                    None => {
                        if let Some(work) = &chunk.reduce {
                            self.reduce(op, work)?;
                        }
                        self.pipeline.reduce_events[c].record(&self.local_stream)?;
                    }
                }
                if round.with_gather {
                    for push in &chunk.gather {
                        let peer = push.dst_rank;
                        let dst = match recv_base[peer] {
                            Some(b) => b,
                            None => {
                                let b = self.remote_ptr(peer, seq, Buf::Recv, 0, deadline)?;
                                recv_base[peer] = Some(b);
                                b
                            }
                        };
                        let src = self.local_ptr(op, push.src, push.src_offset);
                        let streams = &self.pipeline.gather_streams[peer];
                        let stream = &streams[c % streams.len()];
                        match &caller {
                            // A stream memory wait on plain pinned memory: no driver call into
                            // the caller's context.
                            Some((words, numbers)) => {
                                let j = first_chunk + c as u64;
                                stream.wait_value_u64_geq(words.reduced_ptr(numbers.word(j)), numbers.number(j))?
                            }
                            None => stream.wait_event(&self.pipeline.reduce_events[c])?,
                        }
                        copy_peer_async(dst.offset(push.dst_offset), &self.gpu, src, &self.gpu, push.len, stream)?;
                    }
                    for &peer in &others {
                        let streams = &self.pipeline.gather_streams[peer];
                        self.pipeline.gather_events[peer][c].record(&streams[c % streams.len()])?;
                    }
                }
                at.reduced += 1;
                moved = true;
            }
            if round.with_gather {
                for &peer in &others {
                    while at.scatter_signalled[peer] == count
                        && at.gather_signalled[peer] < at.reduced
                        && self.pipeline.gather_events[peer][at.gather_signalled[peer]].is_complete()?
                    {
                        self.shared.board.signal_done(me, peer);
                        at.gather_signalled[peer] += 1;
                        moved = true;
                    }
                }
            }
            let mine_done = at.reduced == count
                && others.iter().all(|&p| {
                    at.scatter_signalled[p] == count && (!round.with_gather || at.gather_signalled[p] == count)
                });
            if mine_done {
                break;
            }
            if moved {
                polls = 0;
                continue;
            }
            polls = polls.saturating_add(1);
            if polls < 64 {
                std::hint::spin_loop();
                continue;
            }
            if Instant::now() >= deadline.at {
                return Err(GpuCollError::Timeout {
                    what: format!("pipelined round: {} of {count} chunks reduced", at.reduced),
                    waited: deadline.budget,
                });
            }
            if liveness_at.elapsed() >= LIVENESS_CHECK_INTERVAL {
                for &peer in &others {
                    self.shared.board.check_peer(peer)?;
                }
                liveness_at = Instant::now();
            }
            if polls < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(10));
            }
        }
        for &src in &others {
            self.expected[src] = base[src] + phases * count as u64;
            self.shared.board.wait_done(src, me, self.expected[src], deadline)?;
        }
        // The scratch must be free (and reduce_scatter's result written) before the next round or the release.
        if count > 0 {
            match &caller {
                Some((words, numbers)) => words.wait_reduced(*numbers, first_chunk + count as u64 - 1, deadline)?,
                None => wait_event(&self.pipeline.reduce_events[count - 1], deadline, "the reduction kernels")?,
            }
        }
        Ok(())
    }
}
