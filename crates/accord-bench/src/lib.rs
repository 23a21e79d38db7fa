//! `accord-bench`: Accord's benchmarks and their harnesses, kept out of the libraries.
//!
//! The libraries (`accord-engine`, `accord-coll`, `accord-cuda`) carry no measuring code and
//! never end their process; this crate sits above them and holds:
//!
//! - [`p2p`]: the two-process loopback benchmark behind `accord bench p2p` and
//!   `accord-p2p-bench` (Accord writes against TCP, and against Accord forced onto UDP). It
//!   re-executes the calling binary as its second process, so that binary's `main` calls
//!   [`p2p::run_child_if_requested`] first and exits with the code it returns;
//!   With `--telemetry-ab` it measures instead what telemetry costs a write, in blocks
//!   recording paused and on within the same two processes;
//! - [`paired`]: the median of paired ratios and the order-statistics interval that bounds
//!   it, judged against a cost target;
//! - [`arrivals`]: CLOCK_MONOTONIC stamps of immediate arrivals, shared by the latency benches
//!   of two processes;
//! - the binaries `accord-p2p-bench`, `accord-latency-bench`, `accord-engine-gpu-bench` (engine
//!   writes between GPUs against the copy-engine ceiling) and `accord-gpu-bench` (the GPU
//!   collectives, nccl-tests style). The scripts under `scripts/device/` call them by these names
//!   from `target/release/`.
//!
//! Not here: `accord-cuda-check` stays in `accord-cuda`: it is a device self-check (is a GPU
//! there, do its copies and kernels work), not a bench. The nccl-tests bandwidth formulas
//! (`accord_coll::bench_math`) stay in `accord-coll`: the CLI's nccl-tests report uses them as
//! library math.
//!
//! Dependencies point down only: this crate uses the engine, the collectives and CUDA; none of
//! them uses it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod arrivals;
pub mod p2p;
pub mod paired;
