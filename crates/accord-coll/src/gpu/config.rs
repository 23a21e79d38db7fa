//! The configuration of GPU collectives: every default and its `ACCORD_GPU_*`
//! override, listed in one place.
//!
//! | variable | field | default |
//! |---|---|---|
//! | `ACCORD_GPU_STREAM_ORDER` | [`GpuConfig::stream_order`] (`hostfn` or `stall`) | `hostfn` |
//! | `ACCORD_GPU_SCRATCH_BYTES` | [`GpuConfig::scratch_bytes`] | 128 MiB |
//! | `ACCORD_GPU_MAPPINGS_MAX` | [`GpuConfig::mappings_max`] | 256 |
//! | `ACCORD_GPU_REGISTRATIONS_MAX` | [`GpuConfig::registrations_max`] | 1024 |
//! | `ACCORD_GPU_OP_TIMEOUT_MS` | [`GpuConfig::op_timeout`] | 60000 |
//! | `ACCORD_GPU_QUEUE_DEPTH` | [`GpuConfig::queue_depth`] | 64 |
//! | `ACCORD_GPU_STREAMS_PER_PEER` | [`GpuConfig::streams_per_peer`] | 1 |
//! | `ACCORD_GPU_PIPELINE_CHUNK_BYTES` | [`GpuConfig::pipeline_chunk_bytes`] | 16 MiB |
//! | `ACCORD_GPU_PIPELINE_CHUNKS_MAX` | [`GpuConfig::pipeline_chunks_max`] | 16 |

use std::time::Duration;

use super::error::{GpuCollError, GpuResult};

/// How a collective keeps CUDA stream order on the caller's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamOrder {
    /// A host function on the user's stream tells the progress thread that
    /// prior work completed and blocks the stream until the collective is
    /// done. Zero SMs; the driver's callback thread is held while it waits.
    HostFn,
    /// An event on the user's stream, polled by the progress thread, then a
    /// one-thread stall kernel that holds later work until the progress
    /// thread releases it. One SM slot (one thread) while it waits.
    Stall,
}

impl StreamOrder {
    /// Parses `hostfn` or `stall`.
    pub fn parse(text: &str) -> Option<StreamOrder> {
        match text.trim().to_ascii_lowercase().as_str() {
            "hostfn" | "host_fn" | "host-fn" => Some(StreamOrder::HostFn),
            "stall" | "event" => Some(StreamOrder::Stall),
            _ => None,
        }
    }

    /// Short name, as in tables.
    pub fn name(self) -> &'static str {
        match self {
            StreamOrder::HostFn => "hostfn",
            StreamOrder::Stall => "stall",
        }
    }
}

/// Configuration of a [`super::GpuCommunicator`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuConfig {
    /// Stream-order mechanism for new collectives (changeable later with
    /// [`super::GpuCommunicator::set_stream_order`]).
    pub stream_order: StreamOrder,
    /// Bytes of the per-rank scratch buffer that all_reduce and
    /// reduce_scatter receive peers' blocks into; larger calls run in rounds.
    pub scratch_bytes: usize,
    /// Most peer buffer mappings kept open (least recently used closed first).
    pub mappings_max: usize,
    /// Most buffers registered at once on this rank.
    pub registrations_max: usize,
    /// Longest wait for a peer or a copy within one collective.
    pub op_timeout: Duration,
    /// Most collectives queued for the progress thread; a further call blocks.
    pub queue_depth: usize,
    /// Copy-engine streams per peer; large pushes are split across them.
    pub streams_per_peer: usize,
    /// all_reduce / reduce_scatter: target bytes of one block's slice per
    /// pipeline chunk (scatter, reduction and gather of consecutive chunks overlap).
    pub pipeline_chunk_bytes: usize,
    /// Most pipeline chunks per round (events are allocated for this many).
    pub pipeline_chunks_max: usize,
}

/// Largest accepted [`GpuConfig::pipeline_chunks_max`].
pub const PIPELINE_CHUNKS_MAX_LIMIT: usize = 64;

/// Largest accepted [`GpuConfig::streams_per_peer`].
pub const STREAMS_PER_PEER_MAX: usize = 8;
/// Largest accepted [`GpuConfig::queue_depth`].
pub const QUEUE_DEPTH_MAX: usize = 4096;

impl Default for GpuConfig {
    fn default() -> GpuConfig {
        GpuConfig {
            stream_order: StreamOrder::HostFn,
            scratch_bytes: 128 << 20,
            mappings_max: 256,
            registrations_max: 1024,
            op_timeout: Duration::from_secs(60),
            queue_depth: 64,
            streams_per_peer: 1,
            pipeline_chunk_bytes: 16 << 20,
            pipeline_chunks_max: 16,
        }
    }
}

fn parse_num(name: &'static str, value: &str, min: usize, max: usize) -> GpuResult<usize> {
    match value.trim().parse::<usize>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(GpuCollError::InvalidArgument {
            what: format!("{name}={value:?}: expected an integer in {min}..={max}"),
        }),
    }
}

impl GpuConfig {
    /// Defaults with the process environment's overrides.
    pub fn from_env() -> GpuResult<GpuConfig> {
        GpuConfig::from_lookup(|k| std::env::var(k).ok())
    }

    /// Defaults with overrides from `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> GpuResult<GpuConfig> {
        let mut config = GpuConfig::default();
        if let Some(v) = lookup("ACCORD_GPU_STREAM_ORDER") {
            config.stream_order = StreamOrder::parse(&v).ok_or_else(|| GpuCollError::InvalidArgument {
                what: format!("ACCORD_GPU_STREAM_ORDER={v:?}: expected hostfn or stall"),
            })?;
        }
        if let Some(v) = lookup("ACCORD_GPU_SCRATCH_BYTES") {
            config.scratch_bytes = parse_num("ACCORD_GPU_SCRATCH_BYTES", &v, 4096, 1 << 40)?;
        }
        if let Some(v) = lookup("ACCORD_GPU_MAPPINGS_MAX") {
            config.mappings_max = parse_num("ACCORD_GPU_MAPPINGS_MAX", &v, 1, 1 << 16)?;
        }
        if let Some(v) = lookup("ACCORD_GPU_REGISTRATIONS_MAX") {
            config.registrations_max = parse_num("ACCORD_GPU_REGISTRATIONS_MAX", &v, 1, 1 << 16)?;
        }
        if let Some(v) = lookup("ACCORD_GPU_OP_TIMEOUT_MS") {
            config.op_timeout =
                Duration::from_millis(parse_num("ACCORD_GPU_OP_TIMEOUT_MS", &v, 1, 24 * 3600 * 1000)? as u64);
        }
        if let Some(v) = lookup("ACCORD_GPU_QUEUE_DEPTH") {
            config.queue_depth = parse_num("ACCORD_GPU_QUEUE_DEPTH", &v, 1, QUEUE_DEPTH_MAX)?;
        }
        if let Some(v) = lookup("ACCORD_GPU_STREAMS_PER_PEER") {
            config.streams_per_peer = parse_num("ACCORD_GPU_STREAMS_PER_PEER", &v, 1, STREAMS_PER_PEER_MAX)?;
        }
        if let Some(v) = lookup("ACCORD_GPU_PIPELINE_CHUNK_BYTES") {
            config.pipeline_chunk_bytes = parse_num("ACCORD_GPU_PIPELINE_CHUNK_BYTES", &v, 4096, 1 << 40)?;
        }
        if let Some(v) = lookup("ACCORD_GPU_PIPELINE_CHUNKS_MAX") {
            config.pipeline_chunks_max = parse_num("ACCORD_GPU_PIPELINE_CHUNKS_MAX", &v, 1, PIPELINE_CHUNKS_MAX_LIMIT)?;
        }
        Ok(config)
    }
}
