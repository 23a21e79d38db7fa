//! Which datapath carried a run's bytes, read from the engine's own counters, so a header
//! never claims "UDP loopback" for bytes that went through shared memory.

use accord_engine::{CmaStats, EngineStats};
use serde::Serialize;

/// Counters of one engine since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Datapath {
    /// Datagrams the engine sent, all datapaths.
    pub datagrams: u64,
    /// Of those, through shared-memory rings.
    pub shm_datagrams: u64,
    /// Bytes that peers pulled straight from this process's memory (`process_vm_readv`).
    pub cma_bytes: u64,
}

impl Datapath {
    /// From an engine's statistics.
    pub fn of(stats: &EngineStats, cma: CmaStats) -> Datapath {
        Datapath {
            datagrams: stats.lanes.iter().map(|l| l.endpoint.datagrams_sent).sum(),
            shm_datagrams: stats.shm_datagrams_sent(),
            cma_bytes: cma.bytes_pulled,
        }
    }

    /// `shared memory` or `kernel UDP` when it carried at least 99% of the datagrams (a few
    /// may take the other path; the header gives the exact counts), else `mixed`.
    pub fn name(&self) -> &'static str {
        if self.datagrams == 0 {
            return "none (no datagrams sent)";
        }
        let share = self.shm_datagrams as f64 / self.datagrams as f64;
        if share >= 0.99 {
            "shared memory"
        } else if share <= 0.01 {
            "kernel UDP"
        } else {
            "mixed shared memory and kernel UDP"
        }
    }

    /// The header line, with the exact counts behind the name.
    pub fn describe(&self) -> String {
        format!(
            "datapath: {} ({} of {} datagrams through shared-memory rings, {} over kernel UDP; {} bytes pulled by peers with process_vm_readv)",
            self.name(),
            self.shm_datagrams,
            self.datagrams,
            self.datagrams - self.shm_datagrams.min(self.datagrams),
            self.cma_bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Datapath;

    #[test]
    fn names_follow_the_counters() {
        let d = |datagrams, shm_datagrams| Datapath { datagrams, shm_datagrams, cma_bytes: 0 };
        assert_eq!(d(10, 10).name(), "shared memory");
        assert_eq!(d(5503, 5499).name(), "shared memory");
        assert!(d(5503, 5499)
            .describe()
            .contains("5499 of 5503 datagrams through shared-memory rings, 4 over kernel UDP"));
        assert_eq!(d(1000, 5).name(), "kernel UDP");
        assert_eq!(d(10, 0).name(), "kernel UDP");
        assert_eq!(d(10, 3).name(), "mixed shared memory and kernel UDP");
        assert_eq!(d(0, 0).name(), "none (no datagrams sent)");
    }
}
