//! Configuration of the shared-memory datapath, with its `ACCORD_SHM*` overrides in one place.

use std::path::PathBuf;
use std::time::Duration;

use super::ring::{RING_DATA_BYTES_MAX, RING_DATA_BYTES_MIN};
use crate::DatapathError;

/// Default data-area size of one ring (one per sending lane and receiving lane): 8 MiB holds a
/// default window of 60 KiB datagrams (about 70) with room to spare.
pub const SHM_RING_BYTES_DEFAULT: usize = 8 << 20;
/// Default busy-poll before a consumer sleeps: a doorbell round trip through the kernel costs
/// tens of microseconds, so a short spin catches the next burst without one.
pub const SHM_SPIN_DEFAULT: Duration = Duration::from_micros(50);
/// Longest spin one may configure.
pub const SHM_SPIN_MAX: Duration = Duration::from_millis(10);

/// How a [`super::ShmDatapath`] behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmConfig {
    /// Offer and accept rings at all. Default true; false makes the wrapper pass everything
    /// to UDP and refuse peers' offers.
    pub enabled: bool,
    /// Data bytes of each ring this side creates. Default [`SHM_RING_BYTES_DEFAULT`].
    pub ring_bytes: usize,
    /// Directory of the ring files. Default `/dev/shm`. Both sides must see the same one.
    pub dir: PathBuf,
    /// Poll of rings and sockets (yielding the core each turn) before sleeping. Default
    /// [`SHM_SPIN_DEFAULT`].
    pub spin: Duration,
    /// Lend large ring entries in place to callers that accept it ([`crate::RxBuffers::allow_lending`])
    /// instead of copying them into receive slots. Default true; false for comparisons.
    pub lend: bool,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            enabled: true,
            ring_bytes: SHM_RING_BYTES_DEFAULT,
            dir: PathBuf::from("/dev/shm"),
            spin: SHM_SPIN_DEFAULT,
            lend: true,
        }
    }
}

impl ShmConfig {
    /// Applies the `ACCORD_SHM*` knobs (`accord_knobs::of(Component::SharedMemory)`) read
    /// through `lookup`, each parsed by its registered type.
    pub fn with_overrides_from(mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, DatapathError> {
        use accord_knobs::get;
        let env: &dyn Fn(&str) -> Option<String> = &lookup;
        let bad = |e: accord_knobs::KnobError| DatapathError::InvalidConfig(e.to_string());
        if let Some(on) = get(env, "ACCORD_SHM").map_err(bad)? {
            self.enabled = on;
        }
        if let Some(bytes) = get(env, "ACCORD_SHM_RING_BYTES").map_err(bad)? {
            self.ring_bytes = bytes;
        }
        if let Some(dir) = get::<String>(env, "ACCORD_SHM_DIR").map_err(bad)? {
            self.dir = PathBuf::from(dir.trim());
        }
        if let Some(spin) = get(env, "ACCORD_SHM_SPIN_US").map_err(bad)? {
            self.spin = spin;
        }
        if let Some(on) = get(env, "ACCORD_SHM_LEND").map_err(bad)? {
            self.lend = on;
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), DatapathError> {
        if !self.ring_bytes.is_power_of_two() || !(RING_DATA_BYTES_MIN..=RING_DATA_BYTES_MAX).contains(&self.ring_bytes)
        {
            return Err(DatapathError::InvalidConfig(format!(
                "shm ring_bytes {} must be a power of two in {RING_DATA_BYTES_MIN}..={RING_DATA_BYTES_MAX}",
                self.ring_bytes
            )));
        }
        if self.spin > SHM_SPIN_MAX {
            return Err(DatapathError::InvalidConfig(format!("shm spin {:?} exceeds {SHM_SPIN_MAX:?}", self.spin)));
        }
        Ok(())
    }
}
