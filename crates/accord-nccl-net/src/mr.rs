//! Memory NCCL registers (`regMr`), registered with the engine as caller-owned memory: host
//! memory always, GPU memory when the devices report `NCCL_PTR_CUDA` (`ACCORD_NET_GPU_BUFFERS`;
//! NCCL then keeps its buffers on the GPU where GPUDirect applies, and the copy engines move
//! them, see [`crate::bounce`]). This module holds the plugin's one call to
//! `Engine::register_raw`.
#![allow(unsafe_code)]

use crate::abi;
use crate::error::{PluginError, Result};
use crate::runtime::Runtime;
use accord_engine::{MemoryKind, MrDescriptor, MrHandle};

/// What an NCCL `mhandle` points at.
#[derive(Debug)]
pub struct MemoryRegion {
    /// The engine registration (None for a zero-byte registration: nothing to move).
    pub registration: Option<(MrHandle, MrDescriptor)>,
    /// First byte.
    pub base: usize,
    /// Length in bytes.
    pub len: usize,
    /// GPU memory (`NCCL_PTR_CUDA`): receives into it land in the comm's bounce pool first.
    pub device: bool,
}

impl MemoryRegion {
    /// Registers `len` bytes at `ptr` of NCCL pointer type `ptr_type`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes until [`MemoryRegion::deregister`]
    /// returned and every transfer using it completed: NCCL's `regMr` contract (it keeps the
    /// buffer until `deregMr` and deregisters no buffer with requests outstanding).
    pub unsafe fn register(rt: &Runtime, ptr: *mut u8, len: usize, ptr_type: i32) -> Result<MemoryRegion> {
        let device = match ptr_type {
            abi::PTR_HOST => false,
            abi::PTR_CUDA if rt.gpu_buffers => true,
            _ => {
                return Err(PluginError::Unsupported(format!(
                    "memory of pointer type {ptr_type} (this plugin takes NCCL_PTR_HOST{}; set \
                     ACCORD_NET_GPU_BUFFERS=1 for GPU memory)",
                    if rt.gpu_buffers { " and NCCL_PTR_CUDA" } else { " only" }
                )))
            }
        };
        if len == 0 {
            return Ok(MemoryRegion { registration: None, base: ptr as usize, len: 0, device });
        }
        if ptr.is_null() {
            return Err(PluginError::InvalidArgument(format!("regMr of {len} bytes at a null pointer")));
        }
        if device && accord_engine::device_memory_has_owner_context(ptr as u64)? {
            crate::gpu_stats::add(crate::gpu_stats::Counter::RegMrRefused, 1);
            // Copies of such memory wait behind any synchronous call of the application in its
            // context, even from the engine's private context: an NCCL kernel waiting on them
            // and an application thread in a pageable cudaMemcpy waiting on that kernel would
            // deadlock. NCCL's own buffers come from cuMemCreate unless NCCL_CUMEM_ENABLE=0.
            return Err(PluginError::Unsupported(format!(
                "GPU memory at {ptr:?} belongs to a CUDA context (cudaMalloc): the plugin copies only \
                 context-free memory (cuMemCreate, NCCL's default with NCCL_CUMEM_ENABLE=1), since copies of \
                 context memory can deadlock against the application's synchronous cudaMemcpy"
            )));
        }
        let kind = if device {
            MemoryKind::CudaDevice { ordinal: accord_engine::device_ordinal_of(ptr as u64)? }
        } else if rt.config.streaming_stores {
            // NCCL's host buffers are read next by its GPU kernels, not by the CPU.
            MemoryKind::HostForDevice
        } else {
            MemoryKind::Host
        };
        // Safety: the caller keeps `ptr..ptr+len` valid until `deregister` (this function's
        // contract); no Rust reference to it exists.
        let registration = unsafe { rt.engine.register_raw(ptr, len, kind)? };
        if device {
            crate::gpu_stats::add(crate::gpu_stats::Counter::RegMrGpu, 1);
        }
        Ok(MemoryRegion { registration: Some(registration), base: ptr as usize, len, device })
    }

    /// Deregisters: once this returns no peer write lands in the memory.
    pub fn deregister(self, rt: &Runtime) {
        if let Some((handle, _)) = self.registration {
            rt.engine.deregister(&handle);
        }
    }

    /// The offset of `ptr..ptr+len` in this region, if it lies inside.
    pub fn offset_of(&self, ptr: usize, len: u64) -> Result<u64> {
        let offset = ptr.checked_sub(self.base).map(|o| o as u64);
        match offset {
            Some(o) if o.checked_add(len).is_some_and(|end| end <= self.len as u64) => Ok(o),
            _ => Err(PluginError::InvalidArgument(format!(
                "buffer {ptr:#x}+{len} lies outside its registered region {:#x}+{}: pass the mhandle registered \
                 for this buffer",
                self.base, self.len
            ))),
        }
    }
}
