//! Typed configuration of the collectives, with every `ACCORD_*` override in
//! one place.
//!
//! | variable | field | default |
//! |---|---|---|
//! | `ACCORD_COLL_TIMEOUT_MS` | [`CollConfig::timeout`] | 60000 |
//! | `ACCORD_COLL_ABORT_GRACE_MS` | [`CollConfig::abort_grace`] | 200 |
//! | `ACCORD_COLL_SCRATCH_BYTES_MAX` | [`CollConfig::scratch_bytes_max`] | 4 GiB |
//! | `ACCORD_COLL_PIPELINE_CHUNK_BYTES` | [`CollConfig::pipeline_chunk_bytes`] | 256 KiB |
//! | `ACCORD_COLL_SEGMENT_BYTES` | [`CollConfig::segment_bytes`] | 128 KiB |
//! | `ACCORD_COLL_BLOCK_SEGMENTS_MAX` | [`CollConfig::block_segments_max`] | 0 (off) |
//! | `ACCORD_COLL_ARENA` | [`CollConfig::arena`] | 1 (on) |
//! | `ACCORD_COLL_ARENA_SLOT_BYTES` | [`CollConfig::arena_slot_bytes`] | 1 MiB |
//! | `ACCORD_COLL_ARENA_LANES` | [`CollConfig::arena_lanes`] | 4 |
//! | `ACCORD_COLL_ARENA_STREAMING_MIN_BYTES` | [`CollConfig::arena_streaming_min_bytes`] | 16 MiB |
//! | `ACCORD_ALGO_<COLLECTIVE>` | [`CollConfig::algo_overrides`] | none (size-based) |
//! | `ACCORD_BOOTSTRAP_TIMEOUT_MS` | [`crate::store::BootstrapConfig::timeout`] | 300000 |
//!
//! The bootstrap also reads torchrun's `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT` and `LOCAL_RANK` ([`crate::store::BootstrapConfig::from_env`]).
//!
//! `<COLLECTIVE>` is the upper-case collective name: `ALL_REDUCE`, `REDUCE`,
//! `BROADCAST`, `ALL_GATHER`, `REDUCE_SCATTER`, `ALL_TO_ALL`, `ALL_TO_ALLV`,
//! `BARRIER`; the value an algorithm name of that collective (see
//! [`crate::algo::Algo`]), e.g. `ACCORD_ALGO_ALL_REDUCE=ring`.

use std::collections::HashMap;
use std::time::Duration;

use crate::algo::{Algo, Collective};
use crate::error::ConfigError;

/// Size thresholds of the default algorithm choice (bytes; see
/// [`CollConfig::algo_for`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// all_reduce: recursive doubling up to this many bytes.
    pub all_reduce_recursive_doubling_bytes_max: usize,
    /// all_reduce: Rabenseifner up to this many bytes, ring above.
    pub all_reduce_rabenseifner_bytes_max: usize,
    /// reduce and broadcast: binomial tree up to this many bytes, pipelined
    /// ring (chain) above.
    pub tree_bytes_max: usize,
    /// all_gather: Bruck up to this many output bytes, ring above.
    pub all_gather_bruck_bytes_max: usize,
    /// reduce_scatter: recursive halving up to this many input bytes, ring above.
    pub reduce_scatter_halving_bytes_max: usize,
    /// all_to_all(v): direct (all at once) up to this many bytes per peer
    /// block, pairwise exchange above.
    pub all_to_all_direct_block_bytes_max: usize,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            all_reduce_recursive_doubling_bytes_max: 32 * 1024,
            // Measured on 32 cores, 4 and 8 ranks: docs/results/2026-11-22-algo-thresholds.md.
            all_reduce_rabenseifner_bytes_max: 32 << 20,
            tree_bytes_max: 64 * 1024,
            all_gather_bruck_bytes_max: 64 * 1024,
            reduce_scatter_halving_bytes_max: 64 * 1024,
            all_to_all_direct_block_bytes_max: 4 << 20,
        }
    }
}

/// Configuration of a [`crate::Communicator`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollConfig {
    /// How long a collective may wait for its peers before it fails naming them.
    pub timeout: Duration,
    /// After a timeout, how long to wait for another rank's failure report
    /// before blaming the rank we waited for (so the root cause is named,
    /// not a live rank that was itself stuck).
    pub abort_grace: Duration,
    /// Largest registered scratch buffer a communicator may hold.
    pub scratch_bytes_max: usize,
    /// Chunk size of the pipelined (chain) broadcast and reduce.
    pub pipeline_chunk_bytes: usize,
    /// Segment size of the pipelined ring and Rabenseifner all_reduce: each step's block
    /// moves in segments of about this size, so that segment k+1 is on the wire while
    /// segment k is reduced. Every rank must use the same value (the handshake checks).
    /// Also the segment size of counted writes (all_to_all(v), Rabenseifner's all-gather).
    /// Below the engine's shard size (`ACCORD_SHARD_BYTES`, 256 KiB) a segment carries its
    /// immediate with its data and the segments of a block spread over the lanes
    /// round-robin; at or above it each segment is sharded and its immediate follows the
    /// shards' acknowledgements, one round trip later.
    pub segment_bytes: usize,
    /// At most this many segments per block of a segmented all_reduce (a block: the vector
    /// over the ranks); a larger block gets segments larger than `segment_bytes`, so a call
    /// waits for fewer immediates (see `algo::call_segment_elems`). 0: no limit, every
    /// segment `segment_bytes` (the default: on the 32-core host, 4 and 8 ranks, CPU DDP was
    /// faster without the cap, `scripts/device/ddp_cpu_variants.sh`, stop 35). Every rank must
    /// use the same value (the handshake checks the segment it gives).
    pub block_segments_max: usize,
    /// all_reduce goes through the host arena (`crate::arena`) whenever every rank is on one
    /// host and no algorithm is forced. On by default: on the 2-core machine it made CPU DDP
    /// steps 2.5-28% faster in 5 of 5 pairs (2 and 4 ranks), and ran the engine's schedules'
    /// all_reduce 1.0-2.6x faster at 16-64 MiB on idle cores and small calls 6.7-66x; with two
    /// busy loops beside 4 ranks it was 9-22% slower at 64 MiB, where every wait for all ranks
    /// costs a scheduling turn (`docs/results/2026-11-27-host-arena.md`). On the 32-core host
    /// it took a ~50M-parameter CPU DDP step from 1.07-1.17x gloo's speed to 1.35-1.36x at 4
    /// ranks and from 0.98-0.99x to 1.21-1.26x at 8 (one lane; lanes: `arena_lanes`).
    /// Every rank must use the same value (ranks that differ fail their first all_reduce with
    /// a mismatch).
    pub arena: bool,
    /// The arena all_reduce's chunk: each rank's slot in the host arena, which holds three
    /// buffers of one slot per rank and lane (`crate::arena`), so a communicator of n ranks
    /// keeps 3 n slots per lane of the shared-memory directory (96 MiB at 8 ranks and 4
    /// lanes). 1 MiB: as fast as 256 KiB on idle cores and 3.6-3.9x faster at 64 MiB on busy
    /// ones (fewer chunks, fewer waits for all ranks). Rounded up to whole 8-byte words. Every
    /// rank must use the same value (rank 0 refuses the arena otherwise, and all fall back).
    pub arena_slot_bytes: usize,
    /// The most threads (lanes) one arena all_reduce moves its bytes with: a call of 4k slots
    /// is cut into k parts (at most this many), each through its own copy of the protocol
    /// (`crate::arena`), so a 25 MB DDP bucket is copied and reduced by 4 threads where one
    /// thread copies at one core's memory speed. On the 32-core host (~50M-parameter CPU DDP,
    /// two rounds) the step was 1.40-1.61x gloo's speed with 4 lanes against 1.33-1.40x with 1
    /// at 4 ranks, 1.34x against 1.26-1.31x at 8; 8 lanes were within those rounds' spread
    /// (1.52-1.61x, 1.36-1.42x) and keep twice the shared memory. The arena keeps 3 n slots per
    /// lane; where the shared-memory directory has no room for them, rank 0 halves the lanes
    /// until the file fits (a warning says so). 1: one thread, as before lanes existed. At most
    /// 64. Every rank must use the same value (rank 0 refuses the arena otherwise: all fall
    /// back to the size rule, and a call that forces the arena fails).
    pub arena_lanes: usize,
    /// Arena all_reduces of at least this many bytes write their result into the output with
    /// streaming stores (`accord_engine::streaming`), which skip reading the output's lines
    /// first and leave the cache to the arena's slots; 0: never. For large calls, whose output
    /// the cache would not keep until it is read anyway (a DDP bucket: the backward pass and
    /// the other buckets push it out before the optimizer reads it). 16 MiB: on a 32-core
    /// host (2xH100, ~50M-parameter CPU DDP, two paired rounds at 4 and 8 ranks) the 64 MiB
    /// all_reduce alone ran 1.09-1.33x faster in all four pairs and the DDP step was faster in
    /// three of four (0.79, 0.97, 0.89 and 1.03 of the plain step); at 16 MiB the op was level
    /// (6.74 against 6.61 GB/s, mean of four) (`docs/results/2026-11-28-streaming-stores.md`).
    pub arena_streaming_min_bytes: usize,
    /// Algorithm forced per collective (`ACCORD_ALGO_<COLLECTIVE>`).
    pub algo_overrides: HashMap<Collective, Algo>,
    /// Size thresholds of the default choice.
    pub thresholds: Thresholds,
}

impl Default for CollConfig {
    fn default() -> Self {
        CollConfig {
            timeout: Duration::from_secs(60),
            abort_grace: Duration::from_millis(200),
            scratch_bytes_max: 4 << 30,
            pipeline_chunk_bytes: 256 * 1024,
            segment_bytes: 128 * 1024,
            block_segments_max: 0,
            arena: true,
            arena_slot_bytes: 1 << 20,
            arena_lanes: 4,
            arena_streaming_min_bytes: 16 << 20,
            algo_overrides: HashMap::new(),
            thresholds: Thresholds::default(),
        }
    }
}

/// The most lanes `ACCORD_COLL_ARENA_LANES` may ask for: each is a thread per call and three
/// slots per rank of shared memory.
const MAX_ARENA_LANES: u64 = 64;

/// `value` unless it is zero, which `knob` refuses.
fn at_least_one(knob: &str, value: Option<u64>) -> Result<Option<u64>, ConfigError> {
    one_to(knob, value, u64::MAX)
}

/// `value` unless it is zero or above `max`, which `knob` refuses.
fn one_to(knob: &str, value: Option<u64>, max: u64) -> Result<Option<u64>, ConfigError> {
    let refuse = |v: u64, reason: String| ConfigError::Invalid { name: knob.to_string(), value: v.to_string(), reason };
    match value {
        Some(0) => Err(refuse(0, "must be at least 1".into())),
        Some(v) if v > max => Err(refuse(v, format!("at most {max}"))),
        v => Ok(v),
    }
}

impl CollConfig {
    /// The algorithm for one call: the per-call choice if any, else the
    /// `ACCORD_ALGO_<COLLECTIVE>` override, else by size:
    ///
    /// | collective | rule (bytes = the size named in [`crate::config::Thresholds`]) |
    /// |---|---|
    /// | all_reduce | ≤ 32 KiB recursive doubling; ≤ 32 MiB Rabenseifner; else ring |
    /// | reduce, broadcast | ≤ 64 KiB binomial tree; else ring (pipelined chain) |
    /// | all_gather | output ≤ 64 KiB Bruck; else ring |
    /// | reduce_scatter | input ≤ 64 KiB recursive halving; else ring |
    /// | all_to_all(v) | per-peer block ≤ 4 MiB direct; else pairwise |
    /// | barrier | dissemination |
    ///
    /// `bytes` is the size the rule for `collective` names. Every rank must reach
    /// the same choice (the handshake checks it).
    pub fn algo_for(&self, collective: Collective, bytes: usize, per_call: Option<Algo>) -> Algo {
        if let Some(a) = per_call.or_else(|| self.algo_overrides.get(&collective).copied()) {
            return a;
        }
        let t = &self.thresholds;
        match collective {
            Collective::AllReduce if bytes <= t.all_reduce_recursive_doubling_bytes_max => Algo::RecursiveDoubling,
            Collective::AllReduce if bytes <= t.all_reduce_rabenseifner_bytes_max => Algo::Rabenseifner,
            Collective::AllReduce => Algo::Ring,
            Collective::Reduce | Collective::Broadcast if bytes <= t.tree_bytes_max => Algo::BinomialTree,
            Collective::Reduce | Collective::Broadcast => Algo::Ring,
            Collective::AllGather if bytes <= t.all_gather_bruck_bytes_max => Algo::Bruck,
            Collective::AllGather => Algo::Ring,
            Collective::ReduceScatter if bytes <= t.reduce_scatter_halving_bytes_max => Algo::RecursiveHalving,
            Collective::ReduceScatter => Algo::Ring,
            Collective::AllToAll | Collective::AllToAllV if bytes <= t.all_to_all_direct_block_bytes_max => {
                Algo::Direct
            }
            Collective::AllToAll | Collective::AllToAllV => Algo::Pairwise,
            Collective::SendRecv => Algo::Direct,
            Collective::Barrier => Algo::Dissemination,
        }
    }

    /// Defaults with the process environment's `ACCORD_*` overrides applied.
    pub fn from_env() -> Result<CollConfig, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Defaults with overrides from `lookup` (the environment, or a map in tests), each knob
    /// parsed by its registered type (`accord_knobs::of(Component::Collectives)`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<CollConfig, ConfigError> {
        use accord_knobs::get;
        let env: &dyn Fn(&str) -> Option<String> = &lookup;
        let mut c = CollConfig::default();
        if let Some(ms) = at_least_one("ACCORD_COLL_TIMEOUT_MS", get(env, "ACCORD_COLL_TIMEOUT_MS")?)? {
            c.timeout = Duration::from_millis(ms);
        }
        if let Some(grace) = get(env, "ACCORD_COLL_ABORT_GRACE_MS")? {
            c.abort_grace = grace;
        }
        if let Some(bytes) = get(env, "ACCORD_COLL_SCRATCH_BYTES_MAX")? {
            c.scratch_bytes_max = bytes;
        }
        let chunk = "ACCORD_COLL_PIPELINE_CHUNK_BYTES";
        if let Some(bytes) = at_least_one(chunk, get(env, chunk)?)? {
            c.pipeline_chunk_bytes = bytes as usize;
        }
        let segment = "ACCORD_COLL_SEGMENT_BYTES";
        if let Some(bytes) = at_least_one(segment, get(env, segment)?)? {
            c.segment_bytes = bytes as usize;
        }
        if let Some(segments) = get::<usize>(env, "ACCORD_COLL_BLOCK_SEGMENTS_MAX")? {
            c.block_segments_max = segments;
        }
        if let Some(on) = get::<bool>(env, "ACCORD_COLL_ARENA")? {
            c.arena = on;
        }
        let slot = "ACCORD_COLL_ARENA_SLOT_BYTES";
        if let Some(bytes) = at_least_one(slot, get(env, slot)?)? {
            c.arena_slot_bytes = bytes as usize;
        }
        let lanes = "ACCORD_COLL_ARENA_LANES";
        if let Some(n) = one_to(lanes, get(env, lanes)?, MAX_ARENA_LANES)? {
            c.arena_lanes = n as usize;
        }
        if let Some(bytes) = get::<usize>(env, "ACCORD_COLL_ARENA_STREAMING_MIN_BYTES")? {
            c.arena_streaming_min_bytes = bytes;
        }
        for coll in Collective::ALL {
            let name = format!("ACCORD_ALGO_{}", coll.name().to_ascii_uppercase());
            if let Some(v) = get::<String>(env, &name)? {
                c.algo_overrides.insert(coll, Algo::parse_for(coll, v.trim())?);
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
