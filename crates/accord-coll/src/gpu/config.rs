//! The configuration of GPU collectives: every default and its `ACCORD_GPU_*`
//! override, listed in one place.
//!
//! | variable | field | default |
//! |---|---|---|
//! | `ACCORD_GPU_STREAM_ORDER` | [`GpuConfig::stream_order`] (`hostfn`, `stall` or `waitvalue`) | `hostfn` |
//! | `ACCORD_GPU_SCRATCH_BYTES` | [`GpuConfig::scratch_bytes`] | 128 MiB |
//! | `ACCORD_GPU_MAPPINGS_MAX` | [`GpuConfig::mappings_max`] | 256 |
//! | `ACCORD_GPU_REGISTRATIONS_MAX` | [`GpuConfig::registrations_max`] | 1024 |
//! | `ACCORD_GPU_OP_TIMEOUT_MS` | [`GpuConfig::op_timeout`] | 60000 |
//! | `ACCORD_GPU_QUEUE_DEPTH` | [`GpuConfig::queue_depth`] | 64 |
//! | `ACCORD_GPU_STREAMS_PER_PEER` | [`GpuConfig::streams_per_peer`] | 1 |
//! | `ACCORD_GPU_PIPELINE_CHUNK_BYTES` | [`GpuConfig::pipeline_chunk_bytes`] | 16 MiB |
//! | `ACCORD_GPU_PIPELINE_CHUNKS_MAX` | [`GpuConfig::pipeline_chunks_max`] | 16 |
//! | `ACCORD_GPU_PRIVATE_CONTEXT` | [`GpuConfig::private_context`] | 0 |
//! | `ACCORD_GPU_REDUCE_ON_CALLER` | [`GpuConfig::reduce_on_caller`] | 0 |
//! | `ACCORD_GPU_DIRECT_BYTES` | [`GpuConfig::direct_bytes`] | 128 MiB |

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
    /// An event on the user's stream, polled by the progress thread, then a
    /// stream memory wait (`cuStreamWaitValue64`) on a word in pinned host
    /// memory that the progress thread sets when the collective is done. Zero
    /// SMs, and no driver callback thread held: collectives on several
    /// streams, or a framework's own host functions, cannot wait behind it.
    WaitValue,
}

impl std::str::FromStr for StreamOrder {
    type Err = String;
    /// As [`StreamOrder::parse`].
    fn from_str(text: &str) -> Result<StreamOrder, String> {
        StreamOrder::parse(text).ok_or_else(|| format!("unknown stream order {text:?}: use hostfn, stall or waitvalue"))
    }
}

impl StreamOrder {
    /// Parses `hostfn`, `stall` or `waitvalue` (any case; also `host_fn`, `host-fn`, `event`,
    /// `wait_value`, `wait-value`).
    pub fn parse(text: &str) -> Option<StreamOrder> {
        match text.trim().to_ascii_lowercase().as_str() {
            "hostfn" | "host_fn" | "host-fn" => Some(StreamOrder::HostFn),
            "stall" | "event" => Some(StreamOrder::Stall),
            "waitvalue" | "wait_value" | "wait-value" => Some(StreamOrder::WaitValue),
            _ => None,
        }
    }

    /// Short name, as in tables.
    pub fn name(self) -> &'static str {
        match self {
            StreamOrder::HostFn => "hostfn",
            StreamOrder::Stall => "stall",
            StreamOrder::WaitValue => "waitvalue",
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
    /// Run the progress thread's copies in a CUDA context of its own, with the scratch in VMM
    /// memory: copies of VMM memory (PyTorch's under `expandable_segments:True`) then never
    /// wait behind a synchronous call (`tensor.cpu()`) of the application's thread in the
    /// primary context. Requires the `waitvalue` or `hostfn` stream order (the `stall`
    /// kernel cannot run on another context's stream).
    pub private_context: bool,
    /// all_reduce / reduce_scatter: queue the reductions on the caller's stream, in the caller's
    /// context, at call time, gated by words the progress thread sets
    /// ([`super::caller_reduce`]), instead of launching them from the progress thread. With
    /// [`GpuConfig::private_context`] this keeps the reductions out of the private context,
    /// whose kernels the GPU time-slices against the application's. Needs the `waitvalue` order.
    pub reduce_on_caller: bool,
    /// Bytes of the inbox of direct calls ([`super::direct`]): all_reduce and reduce_scatter
    /// calls that push at most `direct_bytes / (2 x ranks)` to each peer run entirely on the
    /// caller's stream, with no host thread in their path. 0 sends every call through the
    /// progress thread. Every rank must set the same value.
    pub direct_bytes: usize,
    /// The most blocks a reduction kernel launches; 0 (the default): one per SM. A reduction
    /// queued beside compute (DDP's backward pass) takes the SMs it occupies from it: with a
    /// grid of 8 blocks per SM a 2-GPU DDP step took 2.53-2.61 ms, with one per SM 1.91-2.24,
    /// alternated over three rounds, and an all_reduce of 64 MiB alone the same 241-250 µs
    /// (`ddp_gpu_variants.sh`, 2xH200, docs/results/2026-11-27-torch-native-backend.md). See
    /// `accord_cuda::Reducer::with_blocks_max`.
    pub reduce_blocks_max: u32,
}

impl GpuConfig {
    /// The most blocks a reduction launches on a GPU of `multiprocessors` SMs:
    /// [`GpuConfig::reduce_blocks_max`], or one per SM where that is 0.
    pub fn reduce_blocks(&self, multiprocessors: u32) -> u32 {
        if self.reduce_blocks_max == 0 {
            multiprocessors
        } else {
            self.reduce_blocks_max
        }
    }
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
            private_context: false,
            reduce_on_caller: false,
            direct_bytes: 128 << 20,
            reduce_blocks_max: 0,
        }
    }
}

/// Reads count knob `name` through `env`, which must lie in `min..=max`.
fn count(env: &dyn Fn(&str) -> Option<String>, name: &str, min: usize, max: usize) -> GpuResult<Option<usize>> {
    match accord_knobs::get::<usize>(env, name).map_err(knob_error)? {
        Some(v) if !(min..=max).contains(&v) => {
            Err(GpuCollError::InvalidArgument { what: format!("{name}={v}: expected an integer in {min}..={max}") })
        }
        v => Ok(v),
    }
}

fn knob_error(e: accord_knobs::KnobError) -> GpuCollError {
    GpuCollError::InvalidArgument { what: e.to_string() }
}

/// Puts a knob's value, when it is set, in its field.
fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

impl GpuConfig {
    /// Defaults with the process environment's overrides.
    pub fn from_env() -> GpuResult<GpuConfig> {
        GpuConfig::from_lookup(|k| std::env::var(k).ok())
    }

    /// Defaults with overrides from `lookup` (the environment, or a map in tests), each knob
    /// parsed by its registered type (`accord_knobs::of(Component::GpuCollectives)`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> GpuResult<GpuConfig> {
        let env: &dyn Fn(&str) -> Option<String> = &lookup;
        let mut c = GpuConfig::default();
        set(&mut c.stream_order, accord_knobs::choice(env, "ACCORD_GPU_STREAM_ORDER").map_err(knob_error)?);
        set(&mut c.scratch_bytes, count(env, "ACCORD_GPU_SCRATCH_BYTES", 4096, 1 << 40)?);
        set(&mut c.mappings_max, count(env, "ACCORD_GPU_MAPPINGS_MAX", 1, 1 << 16)?);
        set(
            &mut c.registrations_max,
            count(env, "ACCORD_GPU_REGISTRATIONS_MAX", 1, super::board::REGISTRATIONS_MAX_LIMIT)?,
        );
        let day_ms = 24 * 3600 * 1000;
        let timeout = count(env, "ACCORD_GPU_OP_TIMEOUT_MS", 1, day_ms)?;
        set(&mut c.op_timeout, timeout.map(|ms| Duration::from_millis(ms as u64)));
        set(&mut c.queue_depth, count(env, "ACCORD_GPU_QUEUE_DEPTH", 1, QUEUE_DEPTH_MAX)?);
        set(&mut c.streams_per_peer, count(env, "ACCORD_GPU_STREAMS_PER_PEER", 1, STREAMS_PER_PEER_MAX)?);
        set(&mut c.pipeline_chunk_bytes, count(env, "ACCORD_GPU_PIPELINE_CHUNK_BYTES", 4096, 1 << 40)?);
        let chunks = count(env, "ACCORD_GPU_PIPELINE_CHUNKS_MAX", 1, PIPELINE_CHUNKS_MAX_LIMIT)?;
        set(&mut c.pipeline_chunks_max, chunks);
        set(&mut c.private_context, accord_knobs::get::<bool>(env, "ACCORD_GPU_PRIVATE_CONTEXT").map_err(knob_error)?);
        set(
            &mut c.reduce_on_caller,
            accord_knobs::get::<bool>(env, "ACCORD_GPU_REDUCE_ON_CALLER").map_err(knob_error)?,
        );
        set(&mut c.direct_bytes, count(env, "ACCORD_GPU_DIRECT_BYTES", 0, 1 << 40)?);
        let blocks = count(env, "ACCORD_GPU_REDUCE_BLOCKS_MAX", 0, 1 << 20)?;
        set(&mut c.reduce_blocks_max, blocks.map(|b| b as u32));
        Ok(c)
    }
}
