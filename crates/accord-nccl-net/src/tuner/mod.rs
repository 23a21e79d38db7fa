//! An NCCL tuner in the same library as the net plugin: NCCL 2.28 looks for
//! `ncclTunerPlugin_v5` in the net plugin's library when `NCCL_TUNER_PLUGIN` is unset and no
//! `libnccl-tuner.so` is found, so loading the plugin loads the tuner with no other setting.
//!
//! Why: NCCL's cost model prices a network message at a NIC's few microseconds. Through a
//! host-driven software transport a message costs tens of microseconds on a virtual machine,
//! so NCCL's own choice at small sizes over Accord, Ring/LL on all 4 channels, is the slowest
//! one there is: measured on the 2xH200 host (fourth session sweep, all_reduce busbw, 2 ranks,
//! NCCL_PROTO and NCCL_MIN/MAX_NCHANNELS forced; docs/results/2026-11-22-nccl-plugin.md):
//!
//! | size | NCCL's choice (Ring LL, 4 ch) | Simple 1 ch | Simple 2 ch | Simple 4 ch | LL128 2 ch |
//! |---|---|---|---|---|---|
//! | 256 KiB | 1.76 GB/s | 2.24 | 2.12 | 1.88 | 2.49 |
//! | 1 MiB | 2.30 | 5.85 | 5.33 | 2.92 | 5.25 |
//! | 4 MiB | 9.22 (Simple) | 8.23 | 10.04 | 9.22 | 6.55 |
//! | 8 MiB | 11.57 (Simple) | 8.05 | 11.44 | 11.66 | 7.19 |
//!
//! LL (8-byte lines with flags: twice the bytes, many small messages) never wins; Simple does
//! from about 128 KiB, once each channel carries about 2 MiB of the collective. The policy
//! ([`TunerPolicy::decide`]): for communicators whose traffic crosses the network (more than
//! one node) and collectives of at least [`TunerPolicy::min_bytes`], mark LL and LL128 ignored
//! (NCCL then picks among the Simple entries with its own costs), and give
//! `ceil(bytes / channel_bytes)` channels while that is fewer than
//! [`CHANNELS_LEFT_TO_NCCL_FROM`] (from there NCCL's own channel count stands; it is what
//! large sizes want). `channel_bytes` is 2 MiB, or `NCCL_BUFFSIZE` where that is smaller: a
//! channel is given no more than one of NCCL's buffers' worth of the collective. Single-node
//! communicators and small collectives are left alone.

pub mod ffi;

/// `NCCL_PROTO_LL`, `NCCL_PROTO_LL128`, `NCCL_PROTO_SIMPLE`: protocol columns of the cost table.
pub const PROTO_LL: usize = 0;
/// See [`PROTO_LL`].
pub const PROTO_LL128: usize = 1;
/// See [`PROTO_LL`].
pub const PROTO_SIMPLE: usize = 2;
/// `NCCL_ALGO_PROTO_IGNORE`: a cost-table entry NCCL must not pick.
pub const COST_IGNORE: f32 = -1.0;
/// Largest cost table (algorithms x protocols) accepted; NCCL 2.28 passes 7 x 3.
pub const COST_TABLE_ENTRIES_MAX: usize = 64;
/// Channel counts the policy sets are below this; from this many on NCCL's own choice stands
/// (the plugin's speed property makes NCCL open 4 channels).
pub const CHANNELS_LEFT_TO_NCCL_FROM: u64 = 4;
/// Default of `ACCORD_TUNER_MIN_BYTES`.
pub const TUNER_MIN_BYTES_DEFAULT: u64 = 128 << 10;
/// Default of `ACCORD_TUNER_CHANNEL_BYTES`.
pub const TUNER_CHANNEL_BYTES_DEFAULT: u64 = 2 << 20;

/// What the tuner does, from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunerPolicy {
    /// Off: every call leaves NCCL's table and channel count as they are.
    pub enabled: bool,
    /// Shortest collective the policy touches.
    pub min_bytes: u64,
    /// Bytes of the collective each channel should carry (unset: [`TUNER_CHANNEL_BYTES_DEFAULT`],
    /// or `NCCL_BUFFSIZE` when that is smaller).
    pub channel_bytes: u64,
    /// Log decisions (once per collective type and power-of-two size).
    pub log: bool,
}

impl Default for TunerPolicy {
    fn default() -> Self {
        TunerPolicy {
            enabled: true,
            min_bytes: TUNER_MIN_BYTES_DEFAULT,
            channel_bytes: TUNER_CHANNEL_BYTES_DEFAULT,
            log: false,
        }
    }
}

/// What [`TunerPolicy::decide`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// LL and LL128 were marked ignored.
    pub simple_only: bool,
    /// The channel count to report (None: leave NCCL's).
    pub channels: Option<u32>,
}

impl TunerPolicy {
    /// The policy with the tuner's knobs (`accord_knobs::of(Component::Tuner)`) read through
    /// `lookup`, each parsed by its registered type; a bad value is an error naming it.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<TunerPolicy, String> {
        use accord_knobs::get;
        let env: &dyn Fn(&str) -> Option<String> = &lookup;
        let mut p = TunerPolicy::default();
        let read = |e: accord_knobs::KnobError| e.to_string();
        if let Some(on) = get(env, "ACCORD_TUNER").map_err(read)? {
            p.enabled = on;
        }
        if let Some(bytes) = get(env, "ACCORD_TUNER_MIN_BYTES").map_err(read)? {
            p.min_bytes = bytes;
        }
        if let Some(bytes) = get(env, "ACCORD_TUNER_CHANNEL_BYTES").map_err(read)? {
            if bytes == 0 {
                return Err("ACCORD_TUNER_CHANNEL_BYTES must be non-zero".into());
            }
            p.channel_bytes = bytes;
        } else if let Some(buffer) = nccl_buffer_bytes(env) {
            // A channel gets no more than one NCCL buffer's worth: with NCCL_BUFFSIZE=1 MiB,
            // 4 MiB on NCCL's 16 channels gave 12.03-13.11 GB/s (g2) and 10.42-12.27 (mp) on the
            // 2xH200 host against 9.41-9.70 and 6.27-8.24 on the 2 channels of 2 MiB each
            // (session 51, docs/results/2026-11-28-plugin-buffers.md section 2, which quotes the command).
            p.channel_bytes = p.channel_bytes.min(buffer);
        }
        if let Some(on) = get(env, "ACCORD_TUNER_LOG").map_err(read)? {
            p.log = on;
        }
        Ok(p)
    }

    /// Adjusts `table` (`algorithms` rows of `protocols` costs, row-major, as NCCL lays it
    /// out) for a collective of `bytes` on a communicator spanning `nodes` nodes.
    pub fn decide(&self, nodes: usize, bytes: u64, table: &mut [f32], protocols: usize) -> Decision {
        if !self.enabled || nodes < 2 || bytes < self.min_bytes || protocols <= PROTO_SIMPLE {
            return Decision::default();
        }
        let mut decision = Decision::default();
        // Only when some Simple entry is valid: a table with none left would leave NCCL nothing.
        if table.chunks_exact(protocols).any(|row| row[PROTO_SIMPLE] >= 0.0) {
            for row in table.chunks_exact_mut(protocols) {
                row[PROTO_LL] = COST_IGNORE;
                row[PROTO_LL128] = COST_IGNORE;
            }
            decision.simple_only = true;
        }
        let channels = bytes.div_ceil(self.channel_bytes).max(1);
        if channels < CHANNELS_LEFT_TO_NCCL_FROM {
            decision.channels = Some(channels as u32);
        }
        decision
    }
}

/// `NCCL_BUFFSIZE` as NCCL reads it (a positive integer of bytes), or None when unset or not
/// one.
fn nccl_buffer_bytes(env: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    env("NCCL_BUFFSIZE")?.trim().parse::<u64>().ok().filter(|b| *b > 0)
}

#[cfg(test)]
mod tests;
