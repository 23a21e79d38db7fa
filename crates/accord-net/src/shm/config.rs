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

/// Environment variables that override [`ShmConfig`] fields, and what each sets.
pub const SHM_ENV_OVERRIDES: &[(&str, &str)] = &[
    ("ACCORD_SHM", "enabled (0 or 1; default 1): same-host peers exchange datagrams through shared-memory rings"),
    ("ACCORD_SHM_RING_BYTES", "ring_bytes: data bytes of each ring, a power of two in 256 KiB..=1 GiB (default 8 MiB)"),
    ("ACCORD_SHM_DIR", "dir: where ring files are created and opened (default /dev/shm; tests point it elsewhere)"),
    ("ACCORD_SHM_SPIN_US", "spin: microseconds a receiver polls its rings and sockets before sleeping (default 50)"),
    ("ACCORD_SHM_LEND", "lend (0 or 1; default 1): large datagrams are placed straight from the ring (one copy fewer)"),
];

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
    /// Applies [`SHM_ENV_OVERRIDES`] read through `lookup`.
    pub fn with_overrides_from(mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, DatapathError> {
        let bad = |name: &str, value: &str| DatapathError::InvalidConfig(format!("{name}={value:?} is not valid"));
        for (name, _) in SHM_ENV_OVERRIDES {
            let Some(value) = lookup(name) else { continue };
            let v = value.trim();
            match *name {
                "ACCORD_SHM" | "ACCORD_SHM_LEND" => {
                    let on = match v {
                        "1" | "true" | "on" => true,
                        "0" | "false" | "off" => false,
                        _ => return Err(bad(name, &value)),
                    };
                    if *name == "ACCORD_SHM" {
                        self.enabled = on;
                    } else {
                        self.lend = on;
                    }
                }
                "ACCORD_SHM_RING_BYTES" => self.ring_bytes = v.parse().map_err(|_| bad(name, &value))?,
                "ACCORD_SHM_DIR" => self.dir = PathBuf::from(v),
                "ACCORD_SHM_SPIN_US" => self.spin = Duration::from_micros(v.parse().map_err(|_| bad(name, &value))?),
                _ => {}
            }
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
