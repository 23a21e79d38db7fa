//! `accord-cuda`: Accord's CUDA layer.
//!
//! The CUDA driver API and NVRTC are loaded at run time (through `cudarc`'s
//! dynamic loading), so this crate builds, and its tests pass, on hosts with
//! no GPU and no CUDA: [`probe()`] reports what is there without panicking, and
//! every entry point returns [`CudaError::NotAvailable`] where the driver is
//! missing. GPU tests use [`require_gpu!`] to print `skipped: <reason>`.
//!
//! What it offers:
//! - [`probe()`], [`Availability`], [`DeviceInfo`]: what the host has.
//! - [`Gpu`]: a device's primary context; peer access between GPUs.
//! - [`Stream`], [`Event`]: engine-owned streams, events with elapsed time.
//! - [`DeviceBuffer`], [`PinnedHostBuffer`], [`HostRegistration`]: memory and copies.
//! - [`IpcHandle`], [`IpcMapping`]: device memory shared between processes.
//! - [`copy_peer_async`]: copy-engine transfers between (or within) GPUs;
//!   [`copy_host_to_device_async`], [`copy_device_to_host_async`]: between raw host and device
//!   addresses (staging, registered host regions).
//! - [`Module::compile_and_load_with_includes`](kernels::Module::compile_and_load_with_includes),
//!   [`launch_u64_args`], [`Graph`]: kernels other crates compile (with their headers on the
//!   include path), launched with 8-byte parameters, and captured into CUDA graphs.
//! - [`Reducer`]: NVRTC-compiled `dst = a op b` kernels (sum, prod, min, max,
//!   avg over f32, f16, bf16, i32, i64), cached per (source hash, arch).
//! - [`ordering`]: host functions, host waits on events, and the stall
//!   kernel, for stream order around host-driven collectives.
//! - [`nvrtc_library_dirs`], [`cuda_include_dirs`]: where NVRTC and the CUDA
//!   headers were found (for `LD_LIBRARY_PATH` and NVRTC include paths).
//!
//! # Environment
//!
//! | variable | effect |
//! |---|---|
//! | `ACCORD_CUDA_LIB_DIRS` | extra folders (`:`-separated) searched for `libnvrtc.so*` |
//! | `ACCORD_CUDA_INCLUDE_DIRS` | extra folders searched for `cuda_fp16.h` / `cuda_bf16.h` |
//! | `CUDA_HOME`, `CUDA_PATH` | a CUDA toolkit root searched for both |
//! | `CUDA_VISIBLE_DEVICES` | which GPUs the driver shows (driver's own) |
//!
//! When `libnvrtc` is not on the loader path, it is looked for in those
//! folders, in `/usr/local/cuda*`, and in the `nvidia/cu13/lib` /
//! `nvidia/cuda_nvrtc/lib` folders of Python site-packages, and opened by
//! absolute path before `cudarc` asks for it by soname. If that fails,
//! put [`nvrtc_library_path`] into `LD_LIBRARY_PATH`.
//!
//! # Safety
//!
//! `unsafe` code lives only in [`ffi`]; the rest of the crate denies it.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod context;
pub mod copy;
pub mod device_ptr;
pub mod error;
pub mod ffi;
pub mod graph;
pub mod ipc;
pub mod kernels;
pub mod memory;
pub mod ordering;
pub mod paths;
pub mod probe;
pub mod reduce;
pub mod stream;

pub use context::{CurrentContextGuard, Gpu, PeerAccess};
pub use copy::copy_peer_async;
pub use error::{CudaError, IpcHandleParseError, Result};
pub use ffi::host_memory::{
    copy_device_to_host_async, copy_host_to_device_async, HostDeviceSpan, HostRangePin, HostRegistration,
    PinnedHostBuffer,
};
pub use ffi::launch::{launch_u64_args, LaunchConfig};
pub use graph::Graph;
pub use ipc::{IpcHandle, IpcMapping, MappingCache};
pub use memory::{
    allocation_of, check_device_range, current_device_ordinal, device_ordinal_of, has_owner_context, Allocation,
    DeviceBuffer, DeviceCopy, DevicePtr,
};
pub use ordering::{launch_host_fn, signal_when_done, HostWaiter, StallGate, StallOutcome, StallTicket};
pub use paths::{cuda_include_dirs, nvrtc_library_dirs, nvrtc_library_path};
pub use probe::{probe, Availability, DeviceInfo};
pub use reduce::{DType, ReduceOp, ReduceOpKind, Reducer};
pub use stream::{copy_2d_batch_support, Copy2d, Event, EventKind, Stream};
