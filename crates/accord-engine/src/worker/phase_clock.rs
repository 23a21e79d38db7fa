//! Where a worker's time goes, phase by phase of its loop (`ACCORD_ENGINE_DEBUG`).
//!
//! Why: a worker that polls shows 100% of a core whether it copies, runs the protocol or waits,
//! so per-thread CPU cannot say what bounds a stream. At stop 49 streaming stores, which cut a
//! cold copy's memory traffic by a third, did not move the NCCL plugin's one-process-per-GPU
//! shape (docs/results/2026-11-28-streaming-stores.md); this split says where its workers' time
//! goes instead (receiving and placing, transmitting, protocol, polling). Session 50 read it
//! there: a quarter idle (docs/results/2026-11-28-plugin-rings.md). Off, a lap is one branch.

use std::time::Instant;

/// Nanoseconds one worker spent in each phase of its loop, since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerTime {
    /// Taking commands: submissions handed to the protocol, stats, probes.
    pub commands_ns: u64,
    /// Receiving datagrams and placing their bytes (the receive-side copies).
    pub receive_ns: u64,
    /// The protocol's timers (retransmissions, acknowledgements due).
    pub timers_ns: u64,
    /// Building and sending datagrams (the send-side copies into rings or sockets).
    pub transmit_ns: u64,
    /// Protocol events (completions, failures), lane cut-offs and the control routes' sweep.
    pub events_ns: u64,
    /// Polling for traffic after a turn with no progress, before sleeping.
    pub poll_ns: u64,
    /// Asleep (blocked on the datapath) after the poll window ran out.
    pub sleep_ns: u64,
}

impl WorkerTime {
    /// The sum over phases.
    pub fn total_ns(&self) -> u64 {
        self.commands_ns
            + self.receive_ns
            + self.timers_ns
            + self.transmit_ns
            + self.events_ns
            + self.poll_ns
            + self.sleep_ns
    }

    /// Adds `other`'s time phase by phase (a sum over lanes).
    pub fn add(&mut self, other: &WorkerTime) {
        self.commands_ns += other.commands_ns;
        self.receive_ns += other.receive_ns;
        self.timers_ns += other.timers_ns;
        self.transmit_ns += other.transmit_ns;
        self.events_ns += other.events_ns;
        self.poll_ns += other.poll_ns;
        self.sleep_ns += other.sleep_ns;
    }

    /// One line of each phase's share, e.g. `receive 41% transmit 30% ... of 2.0 s`.
    pub fn shares(&self) -> String {
        let total = self.total_ns().max(1) as f64;
        let share = |ns: u64| 100.0 * ns as f64 / total;
        format!(
            "commands {:.0}% receive {:.0}% timers {:.0}% transmit {:.0}% events {:.0}% poll {:.0}% sleep {:.0}% of {:.3} s",
            share(self.commands_ns),
            share(self.receive_ns),
            share(self.timers_ns),
            share(self.transmit_ns),
            share(self.events_ns),
            share(self.poll_ns),
            share(self.sleep_ns),
            self.total_ns() as f64 / 1e9
        )
    }
}

/// Times the phases of a worker's loop when on.
pub(crate) struct PhaseClock {
    on: bool,
    last: Instant,
}

impl PhaseClock {
    pub(crate) fn new(on: bool) -> PhaseClock {
        PhaseClock { on, last: Instant::now() }
    }

    /// Adds the time since the previous lap to `into` (nothing when off).
    pub(crate) fn lap(&mut self, into: &mut u64) {
        if self.on {
            let now = Instant::now();
            *into += now.duration_since(self.last).as_nanos() as u64;
            self.last = now;
        }
    }
}
