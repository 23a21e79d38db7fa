//! Typed launches of this crate's own kernels. Each function knows the exact
//! parameter list of the kernel family it launches, which is what makes the
//! raw `cuLaunchKernel` call sound; callers pass only kernels they generated.
//! [`launch_u64_args`] is the one public, `unsafe` launch, for kernels other crates compile
//! (the device API's test kernels): its caller vouches for the parameter list.

use crate::error::{CudaError, Result};
use crate::ffi::driver::{self, KernelArg, LaunchDims, LaunchShape};
use crate::kernels::Kernel;
use crate::memory::DevicePtr;
use crate::stream::Stream;

/// Arguments of one reduction launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReduceLaunch {
    pub(crate) grid_blocks: u32,
    pub(crate) block_threads: u32,
    pub(crate) dst: DevicePtr,
    pub(crate) a: DevicePtr,
    pub(crate) b: DevicePtr,
    pub(crate) count: u64,
    pub(crate) divisor: f64,
}

fn check_kernel(kernel: &Kernel, prefix: &str, stream: &Stream) -> Result<()> {
    if !kernel.name().starts_with(prefix) {
        return Err(CudaError::InvalidArgument { what: format!("kernel {} is not a {prefix}* kernel", kernel.name()) });
    }
    if !kernel.gpu().same_device(stream.gpu()) {
        return Err(CudaError::InvalidArgument { what: "kernel and stream are on different GPUs".into() });
    }
    kernel.gpu().bind()
}

/// Launches an `accord_reduce_*` kernel: `(T* dst, const T* a, const T* b,
/// unsigned long long count, double divisor)`.
pub(crate) fn reduce(kernel: &Kernel, launch: ReduceLaunch, stream: &Stream) -> Result<()> {
    check_kernel(kernel, "accord_reduce_", stream)?;
    let args = [
        KernelArg::U64(launch.dst.0),
        KernelArg::U64(launch.a.0),
        KernelArg::U64(launch.b.0),
        KernelArg::U64(launch.count),
        KernelArg::F64(launch.divisor),
    ];
    let shape = LaunchShape { grid_x: launch.grid_blocks, block_x: launch.block_threads };
    // Safety: accord_reduce_* kernels take exactly these five 8-byte parameters in this order
    // (see reduce::source), and the caller validated that all three ranges hold `count` elements.
    unsafe { driver::launch_kernel(kernel.raw(), shape, stream.raw(), &args) }
}

/// Arguments of one stall launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StallLaunch {
    pub(crate) release_word: DevicePtr,
    pub(crate) target: u64,
    pub(crate) timeout_ns: u64,
    pub(crate) status_word: DevicePtr,
}

/// Launches `accord_stall`: `(const volatile u64* release_word, u64 target,
/// u64 timeout_ns, volatile u64* status_word)`, one thread.
pub(crate) fn stall(kernel: &Kernel, launch: StallLaunch, stream: &Stream) -> Result<()> {
    check_kernel(kernel, "accord_stall", stream)?;
    let args = [
        KernelArg::U64(launch.release_word.0),
        KernelArg::U64(launch.target),
        KernelArg::U64(launch.timeout_ns),
        KernelArg::U64(launch.status_word.0),
    ];
    // Safety: accord_stall takes exactly these four 8-byte parameters (see ordering), and both
    // words are device-mapped pinned memory owned by the StallGate, which outlives the launch
    // (its drop synchronises the GPU).
    unsafe { driver::launch_kernel(kernel.raw(), LaunchShape { grid_x: 1, block_x: 1 }, stream.raw(), &args) }
}

/// Geometry of one launch of [`launch_u64_args`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z (each at least 1).
    pub grid: [u32; 3],
    /// Threads per block in x, y, z (each at least 1).
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// `blocks` blocks of `threads` threads, one-dimensional, no dynamic shared memory.
    pub fn linear(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig { grid: [blocks, 1, 1], block: [threads, 1, 1], shared_bytes: 0 }
    }
}

/// Launches `kernel` on `stream` with `args`, each passed as one 8-byte parameter (a device
/// address or an unsigned 64-bit integer), in order. Works inside a stream capture
/// ([`crate::graph::Graph::capture`]).
///
/// # Safety
/// The kernel's parameter list must be exactly `args.len()` parameters of 8 bytes each
/// (pointers, `unsigned long long`, `long long`, `double` as bits), and every device address
/// among them must cover everything the kernel reads and writes while it runs.
pub unsafe fn launch_u64_args(kernel: &Kernel, config: LaunchConfig, stream: &Stream, args: &[u64]) -> Result<()> {
    if config.grid.contains(&0) || config.block.contains(&0) {
        return Err(CudaError::InvalidArgument {
            what: format!(
                "launch of {}: grid {:?} and block {:?} need every dimension >= 1",
                kernel.name(),
                config.grid,
                config.block
            ),
        });
    }
    if !kernel.gpu().same_device(stream.gpu()) {
        return Err(CudaError::InvalidArgument { what: "kernel and stream are on different GPUs".into() });
    }
    kernel.gpu().bind()?;
    let args: Vec<KernelArg> = args.iter().map(|v| KernelArg::U64(*v)).collect();
    let dims = LaunchDims { grid: config.grid, block: config.block, shared_bytes: config.shared_bytes };
    // Safety: the caller vouches for the parameter list and the addresses (see above).
    unsafe { driver::launch_kernel_dims(kernel.raw(), dims, stream.raw(), &args) }
}
