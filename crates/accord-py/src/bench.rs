//! The Rust side of the binding-overhead benchmark (`python -m accord._bench`): the same
//! write-and-wait loop as the Python side, on the same engine and regions, without Python in
//! the loop.

use crate::engine::Engine;
use crate::errors::{submit_error, transfer_error};
use crate::region::MemoryRegion;
use crate::values::Descriptor;
use accord_engine::WriteOp;
use pyo3::prelude::*;
use std::time::Instant;

/// Most iterations one call runs (the loop holds no GIL and cannot be interrupted).
const BENCH_ITERATIONS_MAX: u64 = 10_000_000;

/// Runs `iterations` times `engine.write(src, dst, nbytes).wait()` in Rust with the GIL
/// released; returns the elapsed seconds.
#[pyfunction]
pub(crate) fn _bench_write_loop(
    py: Python<'_>,
    engine: PyRef<'_, Engine>,
    src: PyRef<'_, MemoryRegion>,
    dst: PyRef<'_, Descriptor>,
    nbytes: u64,
    iterations: u64,
) -> PyResult<f64> {
    let iterations = iterations.min(BENCH_ITERATIONS_MAX);
    let live = engine.core.engine("_bench_write_loop")?;
    let (handle, dst) = (src.inner.handle, dst.inner);
    let op = WriteOp { src: &handle, src_offset: 0, dst: &dst, dst_offset: 0, len: nbytes, imm: None };
    py.detach(|| {
        let start = Instant::now();
        for _ in 0..iterations {
            live.write(&op).map_err(|e| submit_error("write", e))?.wait().map_err(transfer_error)?;
        }
        Ok(start.elapsed().as_secs_f64())
    })
}
