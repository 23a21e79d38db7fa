//! Copy-engine transfers between GPUs (and within one). No kernel is ever
//! launched for a copy, so transfers take no SMs from the user's compute.

use crate::context::Gpu;
use crate::error::{CudaError, Result};
use crate::ffi::driver;
use crate::memory::{check_device_range, DevicePtr};
use crate::stream::Stream;

/// Queues a copy of `len_bytes` from `src_ptr` (memory of `src_gpu`) to
/// `dst_ptr` (memory of `dst_gpu`) on `stream`, which must belong to one of
/// the two GPUs.
///
/// Within one GPU this is `cuMemcpyDtoDAsync`; between two it is
/// `cuMemcpyPeerAsync`, which goes over NVLink/PCIe P2P when peer access is
/// possible (enable it with [`Gpu::enable_peer_access`] for the fastest path)
/// and is staged through the host otherwise. Both ranges are checked to lie
/// inside live allocations before anything is queued. A zero length is a no-op.
pub fn copy_peer_async(
    dst_ptr: DevicePtr,
    dst_gpu: &Gpu,
    src_ptr: DevicePtr,
    src_gpu: &Gpu,
    len_bytes: usize,
    stream: &Stream,
) -> Result<()> {
    if len_bytes == 0 {
        return Ok(());
    }
    if !stream.gpu().same_device(dst_gpu) && !stream.gpu().same_device(src_gpu) {
        return Err(CudaError::InvalidArgument {
            what: format!(
                "the stream is on GPU {} but the copy runs between GPUs {} and {}; use a stream of either",
                stream.gpu().ordinal(),
                src_gpu.ordinal(),
                dst_gpu.ordinal()
            ),
        });
    }
    stream.gpu().bind()?;
    check_device_range(src_ptr, len_bytes)?;
    check_device_range(dst_ptr, len_bytes)?;
    if dst_gpu.same_device(src_gpu) {
        driver::memcpy_dtod_async(dst_ptr.0, src_ptr.0, len_bytes, stream.raw())
    } else {
        driver::memcpy_peer_async(
            dst_ptr.0,
            dst_gpu.raw_context(),
            src_ptr.0,
            src_gpu.raw_context(),
            len_bytes,
            stream.raw(),
        )
    }
}
