//! `accord._accord`: the native half of the `accord` Python package (PyO3, abi3 for Python
//! 3.9+), binding the TransferEngine of `accord-engine`.
//!
//! Python sees `Engine` (`engine`), `MemoryRegion` (`region`), `Transfer` (`transfer`),
//! `ImmCounter` (`transfer`), `Address` (`values`), `Descriptor` (`values`) and
//! `ScatterDst` (`values`), re-exported by `python/accord/__init__.py` together with the
//! exception hierarchy of `accord/errors.py` and the asyncio helpers of `accord/_aio.py`. The
//! typed stubs are `python/accord/_accord.pyi`; `tests/python/test_stubs.py` runs
//! `mypy.stubtest` so they cannot drift from this module.
//!
//! Rules kept throughout: every call that can block or run long releases the GIL
//! (`Python::detach`); waits run in slices of `WAIT_SLICE` (`values`) and check for signals
//! between them, so Ctrl-C interrupts them; no lock is held while waiting for the GIL (see
//! `core`); registered memory stays referenced until it is deregistered and no transfer reads
//! it any more (see `region`).
//!
//! Logging: `log_bridge` forwards the engine's `tracing` events to `logging.getLogger("accord")`
//! from a thread of its own, so no engine thread ever waits for the GIL.
//!
//! Collectives: `Communicator` (`coll`, arrays checked by `coll_array` and registered in place
//! through the cache of `coll_reg`, or copied where they cannot be) binds the
//! `accord-coll` communicator over the TransferEngine; `accord.run` (`python/accord/_run.py`)
//! launches a job of local processes for it.
//!
//! Device-initiated communication: `DeviceComm` and `HostProducer` (`device`, re-exported by
//! `python/accord/device.py`) bind `accord-device`'s device communicator over a handed-over
//! `Communicator`.
#![deny(unsafe_code)]

mod bench;
mod coll;
mod coll_array;
mod coll_helper;
mod coll_reg;
mod coll_staging;
mod coll_store;
mod core;
mod device;
mod dlpack;
mod engine;
mod errors;
mod gpu_coll;
mod log_bridge;
mod recv;
mod region;
mod torch_native;
mod transfer;
mod values;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _accord(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::Engine>()?;
    m.add_class::<coll::Communicator>()?;
    m.add_class::<gpu_coll::GpuCommunicator>()?;
    m.add_class::<device::DeviceComm>()?;
    m.add_class::<device::HostProducer>()?;
    m.add_class::<region::MemoryRegion>()?;
    m.add_class::<transfer::Transfer>()?;
    m.add_class::<transfer::ImmCounter>()?;
    m.add_class::<values::Address>()?;
    m.add_class::<values::Descriptor>()?;
    m.add_class::<values::ScatterDst>()?;
    m.add_function(wrap_pyfunction!(core::_close_all, m)?)?;
    m.add_function(wrap_pyfunction!(torch_native::_torch_native_api, m)?)?;
    m.add_function(wrap_pyfunction!(bench::_bench_write_loop, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_coll::_take_fd_of, m)?)?;
    m.add_function(wrap_pyfunction!(log_bridge::_install_log_bridge, m)?)?;
    m.add_function(wrap_pyfunction!(log_bridge::_set_log_threshold, m)?)?;
    m.add_function(wrap_pyfunction!(log_bridge::_log_records_dropped, m)?)?;
    m.add("WAIT_SLICE_S", values::WAIT_SLICE.as_secs_f64())?;
    m.add("RECV_QUEUED_MAX", recv::RECV_QUEUED_MAX)?;
    m.add("DEVICE_LAYOUT_VERSION", accord_device::layout::LAYOUT_VERSION)?;
    m.add("DEVICE_RING_SLOTS_DEFAULT", accord_device::RING_SLOTS_DEFAULT)?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
