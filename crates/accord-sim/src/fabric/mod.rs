//! A packet-level fabric simulator that runs the real `accord-proto` transport at scale.
//!
//! * [`topology`]: pair, dumbbell, star, 2- and 3-tier fat-trees, with all-shortest-path
//!   routes and the per-switch ECMP hash on (source, destination, path entropy, salt).
//! * [`port`]: output queues in front of links (drop-tail, ECN marking, NDP-style trimming),
//!   scheduled head-of-line only.
//! * [`packet`]: pooled packets with virtual payloads.
//! * [`memory`]: host memory that counts placed bytes per flow instead of copying.
//! * [`sim`]: the event loop and the per-host driver loop.
//! * [`workload`]: permutation, incast, incast with victims, all-to-all.
//! * [`experiments`]: entry points returning result structs (what the CLI wraps).
//!
//! One seed drives everything; a run's [`sim::FabricReport::hash`] covers its completion
//! times and counters, so the same seed gives the same hash.

pub mod experiments;
pub mod memory;
pub mod packet;
pub mod port;
pub mod sim;
pub mod topology;
pub mod workload;

#[cfg(test)]
mod tests;

pub use experiments::{
    incast, permutation, permutation_reporting, ExperimentOptions, FctSummary, IncastOptions, IncastResult,
    PermutationResult,
};
pub use port::{QueueConfig, QueuePolicy};
pub use sim::{FabricConfig, FabricError, FabricReport, FabricSim, FlowResult};
pub use topology::{LinkSpec, Topology, TopologyKind};
pub use workload::{FlowClass, FlowSpec};
