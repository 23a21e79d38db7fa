//! The streams and per-chunk events of the pipelined all_reduce round ([`super::pipeline`]),
//! made once per communicator. A file of its own so that the progress thread's state
//! ([`super::worker::Worker`]) can hold them without importing the round's logic, which is
//! itself a method of the worker.

use accord_cuda::{Event, EventKind, Gpu, Stream};

use super::error::GpuResult;

/// Streams and per-chunk events of the pipeline, indexed by peer rank.
pub struct PipelineStreams {
    /// Gather streams per peer (scatter uses the worker's peer streams).
    pub gather_streams: Vec<Vec<Stream>>,
    /// One event per chunk per peer: scatter chunk copied.
    pub scatter_events: Vec<Vec<Event>>,
    /// One event per chunk per peer: gather chunk copied.
    pub gather_events: Vec<Vec<Event>>,
    /// One event per chunk: reduction done on the local stream.
    pub reduce_events: Vec<Event>,
}

impl PipelineStreams {
    /// Streams and events for `chunks_max` chunks with every peer of `rank`.
    pub fn new(
        gpu: &Gpu,
        world_size: usize,
        rank: usize,
        streams_per_peer: usize,
        chunks_max: usize,
    ) -> GpuResult<PipelineStreams> {
        let events = |n: usize| (0..n).map(|_| Event::new(gpu, EventKind::SyncOnly)).collect::<Result<Vec<_>, _>>();
        let mut out = PipelineStreams {
            gather_streams: Vec::with_capacity(world_size),
            scatter_events: Vec::with_capacity(world_size),
            gather_events: Vec::with_capacity(world_size),
            reduce_events: events(chunks_max)?,
        };
        for peer in 0..world_size {
            let (s, c) = if peer == rank { (0, 0) } else { (streams_per_peer, chunks_max) };
            out.gather_streams.push((0..s).map(|_| Stream::new(gpu)).collect::<Result<Vec<_>, _>>()?);
            out.scatter_events.push(events(c)?);
            out.gather_events.push(events(c)?);
        }
        Ok(out)
    }

    /// Chunks a round may have.
    pub fn chunks_max(&self) -> usize {
        self.reduce_events.len()
    }
}
