//! How long the plugin's engine keeps polling before its threads sleep. NCCL's traffic comes in
//! bursts: a DDP bucket's all_reduce once the backward pass made its gradients, the next a few
//! hundred microseconds later. The engine's defaults (a worker polls 0.5 ms after its last
//! progress, a shared-memory receiver 50 us) suit a library that shares the host with anything;
//! under NCCL a thread asleep when the next burst comes costs a wake-up per worker, tens of
//! microseconds each on a virtual machine, at every step of the burst's pipeline.
//!
//! Measured on the 2xH200 host (stop 43, `scripts/device/ddp_transports.sh`, DDP over 2 GPUs,
//! one process each, paired rounds in one call): the step was 1.62x and 1.64x tuned Socket with
//! a 2 ms receiver spin and a 5 ms worker poll, against 1.47x and 1.50x with the engine's
//! defaults; with no polling at all (both 0) it fell to 1.12-1.26x in another call
//! (docs/results/2026-11-27-device-latency-and-ddp-polling.md). The cost is a core per worker
//! for up to 5 ms after traffic stops, while the job trains; `ACCORD_AWAIT_POLL_US` and
//! `ACCORD_SHM_SPIN_US` still set either window.

use std::time::Duration;

/// How long a plugin engine's worker that awaits traffic polls before it sleeps.
pub const PLUGIN_AWAIT_POLL: Duration = Duration::from_millis(5);

/// How long a plugin engine's shared-memory receiver polls its rings before it sleeps.
pub const PLUGIN_SHM_SPIN: Duration = Duration::from_millis(2);

/// `builder` with the plugin's poll windows (the engine's knobs, read at build, still win).
pub fn with_plugin_polling(builder: accord_engine::EngineBuilder) -> accord_engine::EngineBuilder {
    builder.await_poll(PLUGIN_AWAIT_POLL).shm_spin(PLUGIN_SHM_SPIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_windows_fit_the_engines_limits() {
        assert!(PLUGIN_AWAIT_POLL <= accord_engine::config::AWAIT_POLL_MAX);
        let shm = accord_engine::ShmConfig { spin: PLUGIN_SHM_SPIN, ..accord_engine::ShmConfig::default() };
        assert!(shm.validate().is_ok(), "the receiver spin is within the engine's limit");
        assert!(PLUGIN_AWAIT_POLL > accord_engine::config::AWAIT_POLL_DEFAULT, "longer than the engine's own");
    }
}
