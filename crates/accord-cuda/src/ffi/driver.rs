//! Thin, checked wrappers over the CUDA driver API as `cudarc` loads it at run
//! time. Every function here returns a [`Result`] naming the failed call.
//!
//! Invariant: no function of this module except `ensure_driver` may run
//! before `ensure_driver` returned `Ok`; `cudarc` panics on a missing
//! library. Every handle type of the crate is created only after that, so the
//! safe modules uphold the invariant by construction.

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::error::{driver_error, CudaError, Result};

/// A raw device address.
pub(crate) type RawPtr = u64;

/// Turns a `CUresult` into a `Result`, naming the call.
pub(crate) fn check(call: &'static str, result: sys::CUresult) -> Result<()> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(driver_error(call, result as i32))
    }
}

static DRIVER_STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Loads libcuda and calls `cuInit` once per process. Never panics.
pub(crate) fn ensure_driver() -> Result<()> {
    let state = DRIVER_STATE.get_or_init(|| {
        // Safety: is_culib_present only tries dlopen on candidate names and never panics.
        let present = unsafe { sys::is_culib_present() };
        if !present {
            return Err("no CUDA driver (libcuda.so) on the loader path; install the NVIDIA driver \
                        or add its folder to LD_LIBRARY_PATH"
                .to_string());
        }
        // Safety: the library is present, so the symbol lookup inside cannot panic for cuInit.
        let result = unsafe { sys::cuInit(0) };
        check("cuInit", result).map_err(|e| e.to_string())
    });
    state.clone().map_err(|reason| CudaError::NotAvailable { reason })
}

/// Driver version as `1000 * major + 10 * minor`.
pub(crate) fn driver_version() -> Result<i32> {
    let mut version = 0;
    // Safety: writes one int to a valid local.
    check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut version) })?;
    Ok(version)
}

/// Number of visible devices.
pub(crate) fn device_count() -> Result<i32> {
    let mut count = 0;
    // Safety: writes one int to a valid local.
    let result = unsafe { sys::cuDeviceGetCount(&mut count) };
    if result == sys::CUresult::CUDA_ERROR_NO_DEVICE {
        return Ok(0);
    }
    check("cuDeviceGetCount", result)?;
    Ok(count)
}

/// The device handle of an ordinal.
pub(crate) fn device_get(ordinal: i32) -> Result<sys::CUdevice> {
    let mut device = 0;
    // Safety: writes one CUdevice to a valid local.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, ordinal) })?;
    Ok(device)
}

/// The marketing name of a device.
pub(crate) fn device_name(device: sys::CUdevice) -> Result<String> {
    let mut buffer = [0 as std::ffi::c_char; 256];
    // Safety: the driver writes at most `len` bytes, NUL included, into the buffer.
    check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(buffer.as_mut_ptr(), buffer.len() as i32, device) })?;
    Ok(c_buffer_to_string(&buffer))
}

/// Total memory of a device.
pub(crate) fn device_total_mem(device: sys::CUdevice) -> Result<usize> {
    let mut bytes = 0usize;
    // Safety: writes one usize to a valid local.
    check("cuDeviceTotalMem_v2", unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, device) })?;
    Ok(bytes)
}

/// One integer attribute of a device.
pub(crate) fn device_attribute(device: sys::CUdevice, attribute: sys::CUdevice_attribute) -> Result<i32> {
    let mut value = 0;
    // Safety: writes one int to a valid local.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device) })?;
    Ok(value)
}

/// Compute capability `(major, minor)`.
pub(crate) fn compute_capability(device: sys::CUdevice) -> Result<(i32, i32)> {
    use sys::CUdevice_attribute::*;
    Ok((
        device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// Number of streaming multiprocessors.
pub(crate) fn multiprocessor_count(device: sys::CUdevice) -> Result<i32> {
    device_attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
}

/// The widest pitch a 2D copy may use on a device, in bytes (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`).
pub(crate) fn max_pitch(device: sys::CUdevice) -> Result<u64> {
    let value = device_attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH)?;
    Ok(u64::try_from(value).unwrap_or(0))
}

/// PCI bus id, for example `0000:19:00.0`.
pub(crate) fn device_pci_bus_id(device: sys::CUdevice) -> Result<String> {
    let mut buffer = [0 as std::ffi::c_char; 64];
    // Safety: the driver writes at most `len` bytes, NUL included, into the buffer.
    check("cuDeviceGetPCIBusId", unsafe {
        sys::cuDeviceGetPCIBusId(buffer.as_mut_ptr(), buffer.len() as i32, device)
    })?;
    Ok(c_buffer_to_string(&buffer))
}

fn c_buffer_to_string(buffer: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buffer.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether `device` can map memory of `peer`.
pub(crate) fn can_access_peer(device: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut can = 0;
    // Safety: writes one int to a valid local.
    check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) })?;
    Ok(can != 0)
}

/// A context handle that may cross threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawContext(pub(crate) sys::CUcontext);
// Safety: a CUcontext is a driver handle usable from any thread (the driver API is thread-safe).
unsafe impl Send for RawContext {}
// Safety: as above; the driver serialises concurrent use of one context internally.
unsafe impl Sync for RawContext {}

/// Retains the primary context of a device.
pub(crate) fn primary_ctx_retain(device: sys::CUdevice) -> Result<RawContext> {
    let mut ctx = std::ptr::null_mut();
    // Safety: writes one CUcontext to a valid local.
    check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) })?;
    Ok(RawContext(ctx))
}

/// Releases one retain of the primary context.
pub(crate) fn primary_ctx_release(device: sys::CUdevice) -> Result<()> {
    // Safety: called once per successful retain, by the owner of that retain.
    check("cuDevicePrimaryCtxRelease_v2", unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) })
}

/// Creates a context of this process's own on `device`, apart from the primary context that the
/// CUDA runtime (and so PyTorch and NCCL) shares, and leaves the calling thread's current context
/// as it was.
pub(crate) fn private_ctx_create(device: sys::CUdevice) -> Result<RawContext> {
    let previous = current_context()?;
    let mut ctx = std::ptr::null_mut();
    // Safety: writes one CUcontext to a valid local; null parameters ask for a plain context.
    check("cuCtxCreate_v4", unsafe { sys::cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, device) })?;
    // cuCtxCreate pushed the new context onto this thread's stack: pop it, so the caller's
    // context (NCCL's, PyTorch's) is current again.
    let mut popped = std::ptr::null_mut();
    // Safety: writes one CUcontext to a valid local; the stack holds the context just pushed.
    let popped_ok = check("cuCtxPopCurrent_v2", unsafe { sys::cuCtxPopCurrent_v2(&mut popped) });
    if let Err(e) = popped_ok {
        // Safety: ctx was created above and nothing else holds it.
        let _ = unsafe { sys::cuCtxDestroy_v2(ctx) };
        return Err(e);
    }
    ctx_set_current(previous)?;
    Ok(RawContext(ctx))
}

/// Destroys a context made by [`private_ctx_create`].
pub(crate) fn private_ctx_destroy(ctx: RawContext) -> Result<()> {
    // Safety: called once, by the owner of a context this crate created.
    check("cuCtxDestroy_v2", unsafe { sys::cuCtxDestroy_v2(ctx.0) })
}

/// The context current on the calling thread (null when none is).
pub(crate) fn current_context() -> Result<RawContext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // Safety: writes one CUcontext to a valid local.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    Ok(RawContext(ctx))
}

/// Whether a context owns the device memory at `ptr` (`cuMemAlloc`, `cudaMalloc`), as opposed to
/// memory of the virtual memory API (`cuMemCreate`, NCCL's buffers), which belongs to no context.
pub(crate) fn pointer_has_owner_context(ptr: RawPtr) -> Result<bool> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // Safety: CONTEXT writes one CUcontext into the valid local.
    check("cuPointerGetAttribute(CONTEXT)", unsafe {
        sys::cuPointerGetAttribute(
            &mut ctx as *mut sys::CUcontext as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
            ptr,
        )
    })?;
    Ok(!ctx.is_null())
}

/// The driver's unique id of the allocation holding `ptr` (never reused within the process, so
/// a freed and re-allocated range at the same address has a different id).
pub(crate) fn pointer_buffer_id(ptr: RawPtr) -> Result<u64> {
    let mut id: u64 = 0;
    // Safety: BUFFER_ID writes one unsigned long long into the valid local.
    check("cuPointerGetAttribute(BUFFER_ID)", unsafe {
        sys::cuPointerGetAttribute(
            &mut id as *mut u64 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            ptr,
        )
    })?;
    Ok(id)
}

/// Makes `ctx` current on the calling thread (a null `ctx` unbinds the thread).
pub(crate) fn ctx_set_current(ctx: RawContext) -> Result<()> {
    // Safety: ctx is a retained, live context, or null.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx.0) })
}

/// Waits for all work of the current context.
pub(crate) fn ctx_synchronize() -> Result<()> {
    // Safety: no arguments; acts on the current context.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// Enables access from the current context to `peer`'s memory.
/// Returns `Ok(false)` when it was already enabled.
pub(crate) fn ctx_enable_peer_access(peer: RawContext) -> Result<bool> {
    // Safety: peer is a retained, live context; flags must be 0.
    let result = unsafe { sys::cuCtxEnablePeerAccess(peer.0, 0) };
    if result == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(false);
    }
    check("cuCtxEnablePeerAccess", result)?;
    Ok(true)
}

/// A stream handle that may cross threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawStream(pub(crate) sys::CUstream);
// Safety: stream handles are usable from any thread.
unsafe impl Send for RawStream {}
// Safety: the driver serialises concurrent submissions to one stream.
unsafe impl Sync for RawStream {}

/// A stream handle from its address as another library exposes it (PyTorch's `cuda_stream`).
pub(crate) fn raw_stream_from_address(address: u64) -> RawStream {
    RawStream(address as usize as sys::CUstream)
}

/// Creates a stream that does not synchronise with the legacy default stream.
pub(crate) fn stream_create_non_blocking() -> Result<RawStream> {
    let mut stream = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // Safety: writes one CUstream to a valid local; the current context owns it.
    check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut stream, flags) })?;
    Ok(RawStream(stream))
}

/// Destroys a stream (pending work still completes).
pub(crate) fn stream_destroy(stream: RawStream) -> Result<()> {
    // Safety: called once by the stream's owner.
    check("cuStreamDestroy_v2", unsafe { sys::cuStreamDestroy_v2(stream.0) })
}

/// Blocks until the stream is idle.
pub(crate) fn stream_synchronize(stream: RawStream) -> Result<()> {
    // Safety: stream is live (or null, the legacy default stream).
    check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(stream.0) })
}

/// Whether everything queued on `stream` completed (`Ok(false)`: still running); an error
/// when the stream (its context) met a fault.
pub(crate) fn stream_query(stream: RawStream) -> Result<bool> {
    // Safety: stream is live.
    let result = unsafe { sys::cuStreamQuery(stream.0) };
    if result == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuStreamQuery", result).map(|()| true)
}

/// Most operations of one `cuStreamBatchMemOp` call: the driver documents the count as "less
/// than 256". At 256 a full chunk was refused, and the refusal sends every later store of the
/// process one call each (`Stream::write_values_u64`).
pub(crate) const STREAM_MEM_OPS_PER_CALL_MAX: usize = 255;

/// Queues 64-bit stores, in order, each after the work queued before it and with a memory
/// barrier first, in one `cuStreamBatchMemOp` call (at most [`STREAM_MEM_OPS_PER_CALL_MAX`]).
pub(crate) fn stream_write_values64(stream: RawStream, stores: &[(RawPtr, u64)]) -> Result<()> {
    if stores.is_empty() {
        return Ok(());
    }
    if stores.len() > STREAM_MEM_OPS_PER_CALL_MAX {
        return Err(CudaError::InvalidArgument {
            what: format!("{} stream stores in one call: at most {STREAM_MEM_OPS_PER_CALL_MAX}", stores.len()),
        });
    }
    let mut params: Vec<sys::CUstreamBatchMemOpParams> = stores
        .iter()
        .map(|&(address, value)| {
            // Safety: the union is plain data; all-zero is a valid value of every member.
            let mut p: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
            p.writeValue = sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
                operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_64,
                address,
                __bindgen_anon_1: sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 {
                    value64: value,
                },
                flags: sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                alias: 0,
            };
            p
        })
        .collect();
    // Safety: `params` holds `len` initialised operations and lives through the call (the driver
    // copies them); a bad device address fails the stream, never host memory it does not map.
    check("cuStreamBatchMemOp_v2", unsafe {
        sys::cuStreamBatchMemOp_v2(stream.0, params.len() as u32, params.as_mut_ptr(), 0)
    })
}

/// Queues a 64-bit store of `value` to `addr` on `stream`, after the work queued before it
/// (a stream memory operation: no kernel, no SM). With the default flags the store is preceded
/// by a memory barrier, so every earlier write of the stream is visible before it.
pub(crate) fn stream_write_value64(stream: RawStream, addr: RawPtr, value: u64) -> Result<()> {
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // Safety: a bad device address fails the stream (an error), never host memory it does not map.
    check("cuStreamWriteValue64_v2", unsafe { sys::cuStreamWriteValue64_v2(stream.0, addr, value, flags) })
}

/// Makes `stream` wait on the device until the 64-bit word at `addr` is at least `value`
/// (`cuStreamWaitValue64`, greater-or-equal): a stream memory operation, no kernel.
pub(crate) fn stream_wait_value64_geq(stream: RawStream, addr: RawPtr, value: u64) -> Result<()> {
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // Safety: a bad device address fails the stream (an error), never host memory it does not map.
    check("cuStreamWaitValue64_v2", unsafe { sys::cuStreamWaitValue64_v2(stream.0, addr, value, flags) })
}

/// Makes `stream` wait for `event` on the device.
pub(crate) fn stream_wait_event(stream: RawStream, event: RawEvent) -> Result<()> {
    // Safety: both handles are live; flags must be 0.
    check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(stream.0, event.0, 0) })
}

/// An event handle that may cross threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawEvent(pub(crate) sys::CUevent);
// Safety: event handles are usable from any thread.
unsafe impl Send for RawEvent {}
// Safety: the driver serialises concurrent use of one event.
unsafe impl Sync for RawEvent {}

/// Creates an event; `timing` keeps timestamps, `blocking_sync` makes waits sleep.
pub(crate) fn event_create(timing: bool, blocking_sync: bool) -> Result<RawEvent> {
    let mut flags = 0u32;
    if !timing {
        flags |= sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    }
    if blocking_sync {
        flags |= sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
    }
    let mut event = std::ptr::null_mut();
    // Safety: writes one CUevent to a valid local.
    check("cuEventCreate", unsafe { sys::cuEventCreate(&mut event, flags) })?;
    Ok(RawEvent(event))
}

/// Records `event` on `stream`.
pub(crate) fn event_record(event: RawEvent, stream: RawStream) -> Result<()> {
    // Safety: both handles are live and of the same context.
    check("cuEventRecord", unsafe { sys::cuEventRecord(event.0, stream.0) })
}

/// Blocks until the event completed.
pub(crate) fn event_synchronize(event: RawEvent) -> Result<()> {
    // Safety: event is live.
    check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(event.0) })
}

/// Whether the event completed.
pub(crate) fn event_query(event: RawEvent) -> Result<bool> {
    // Safety: event is live.
    let result = unsafe { sys::cuEventQuery(event.0) };
    if result == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuEventQuery", result)?;
    Ok(true)
}

/// Milliseconds between two completed timing events.
pub(crate) fn event_elapsed_ms(start: RawEvent, end: RawEvent) -> Result<f32> {
    let mut ms = 0f32;
    // Safety: both events are live; writes one float to a valid local.
    check("cuEventElapsedTime_v2", unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.0, end.0) })?;
    Ok(ms)
}

/// Destroys an event.
pub(crate) fn event_destroy(event: RawEvent) -> Result<()> {
    // Safety: called once by the event's owner.
    check("cuEventDestroy_v2", unsafe { sys::cuEventDestroy_v2(event.0) })
}

/// Allocates device memory in the current context.
pub(crate) fn mem_alloc(len_bytes: usize) -> Result<RawPtr> {
    let mut ptr = 0;
    // Safety: writes one CUdeviceptr to a valid local.
    check("cuMemAlloc_v2", unsafe { sys::cuMemAlloc_v2(&mut ptr, len_bytes) })?;
    Ok(ptr)
}

/// Allocates at least `len_bytes` on `device` through the virtual memory API (`cuMemCreate`,
/// mapped at a reserved range and readable and writable by that device), memory that no
/// context owns, as NCCL allocates its buffers. Returns the address and the mapped size (the
/// length rounded up to the allocation granularity); free with [`vmm_free`].
pub(crate) fn vmm_alloc(device: sys::CUdevice, len_bytes: usize) -> Result<(RawPtr, usize)> {
    vmm_alloc_with(device, len_bytes, sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE)
}

/// As [`vmm_alloc`], with memory that can be exported as a POSIX file descriptor
/// ([`mem_export_fd`]), as PyTorch's expandable segments are.
pub(crate) fn vmm_alloc_shareable(device: sys::CUdevice, len_bytes: usize) -> Result<(RawPtr, usize)> {
    vmm_alloc_with(device, len_bytes, sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
}

fn vmm_alloc_with(
    device: sys::CUdevice,
    len_bytes: usize,
    handle_types: sys::CUmemAllocationHandleType,
) -> Result<(RawPtr, usize)> {
    let location = sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device };
    let prop = sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: handle_types,
        location,
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    };
    let mut granularity = 0usize;
    // Safety: writes one size_t; prop is a valid property block.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    let size = len_bytes.max(1).next_multiple_of(granularity.max(1));
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // Safety: writes one handle; prop is valid; flags must be 0.
    check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) })?;
    let mut ptr: RawPtr = 0;
    // Safety: writes one address; no fixed address or alignment requested.
    let reserved = check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) });
    let mapped = reserved.and_then(|()| {
        // Safety: maps the whole allocation at the range just reserved.
        check("cuMemMap", unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) })
    });
    // The mapping holds the physical memory from here on; the handle is not needed any more.
    // Safety: the handle was created above and is released once.
    let _ = unsafe { sys::cuMemRelease(handle) };
    if let Err(e) = mapped {
        if ptr != 0 {
            // Safety: the range reserved above, unmapped.
            let _ = unsafe { sys::cuMemAddressFree(ptr, size) };
        }
        return Err(e);
    }
    let access = sys::CUmemAccessDesc { location, flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    // Safety: the range is mapped; one access descriptor.
    if let Err(e) = check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, size, &access, 1) }) {
        let _ = vmm_free(ptr, size);
        return Err(e);
    }
    Ok((ptr, size))
}

/// Unmaps and frees memory from [`vmm_alloc`] (`ptr` and `size` as it returned them).
pub(crate) fn vmm_free(ptr: RawPtr, size: usize) -> Result<()> {
    // Safety: called once by the allocation's owner after its work finished, as mem_free; a
    // range the driver does not know yields an error, not host UB.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr, size) })?;
    // Safety: as above; the range is no longer mapped.
    check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(ptr, size) })
}

/// The physical allocation mapped at `ptr` (any address inside a `cuMemMap` mapping), with a
/// reference the caller gives back with [`mem_release`]. Memory from `cuMemAlloc` has none: the
/// driver answers `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn mem_retain_allocation_handle(ptr: RawPtr) -> Result<sys::CUmemGenericAllocationHandle> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // Safety: writes one handle; the driver validates the address.
    check("cuMemRetainAllocationHandle", unsafe {
        sys::cuMemRetainAllocationHandle(&mut handle, ptr as usize as *mut c_void)
    })?;
    Ok(handle)
}

/// Whether the allocation behind `handle` was created exportable as a POSIX fd.
pub(crate) fn mem_handle_exports_fd(handle: sys::CUmemGenericAllocationHandle) -> Result<bool> {
    let mut prop = std::mem::MaybeUninit::<sys::CUmemAllocationProp>::zeroed();
    // Safety: writes one property block into the zeroed local.
    check("cuMemGetAllocationPropertiesFromHandle", unsafe {
        sys::cuMemGetAllocationPropertiesFromHandle(prop.as_mut_ptr(), handle)
    })?;
    // Safety: the driver filled the block; every bit pattern of its integer fields is valid,
    // and the handle-type field is read as its raw value.
    let types = unsafe { std::ptr::addr_of!((*prop.as_ptr()).requestedHandleTypes).cast::<u32>().read() };
    Ok(types & sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 != 0)
}

/// Exports `handle` as a new POSIX file descriptor, owned by the caller.
pub(crate) fn mem_export_fd(handle: sys::CUmemGenericAllocationHandle) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut fd: std::ffi::c_int = -1;
    // Safety: a POSIX-fd export writes one int.
    check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    // Safety: the driver returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// The allocation a POSIX fd exported by [`mem_export_fd`] (here or in another process)
/// stands for, as a handle the caller releases with [`mem_release`] once mapped.
pub(crate) fn mem_import_fd(fd: std::os::fd::BorrowedFd<'_>) -> Result<sys::CUmemGenericAllocationHandle> {
    use std::os::fd::AsRawFd;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // Safety: writes one handle; for a POSIX fd the "OS handle" is the descriptor's number
    // passed as a pointer-sized value, which the driver only reads.
    check("cuMemImportFromShareableHandle", unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            fd.as_raw_fd() as isize as *mut c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    })?;
    Ok(handle)
}

/// Drops a reference to a physical allocation (its mappings keep it alive).
pub(crate) fn mem_release(handle: sys::CUmemGenericAllocationHandle) -> Result<()> {
    // Safety: the handle came from retain, import or create, and is released once.
    check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
}

/// Reserves `size` bytes of device address space (a multiple of the granularity).
pub(crate) fn mem_address_reserve(size: usize) -> Result<RawPtr> {
    let mut ptr: RawPtr = 0;
    // Safety: writes one address; no fixed address or alignment requested.
    check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) })?;
    Ok(ptr)
}

/// Maps `size` bytes of `handle` at `ptr` (inside a reserved range) and lets `device` read and
/// write them.
pub(crate) fn mem_map_for(
    ptr: RawPtr,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
    device: sys::CUdevice,
) -> Result<()> {
    // Safety: the caller reserved [ptr, ptr + size); the driver checks the handle and size.
    check("cuMemMap", unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) })?;
    let location = sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device };
    let access = sys::CUmemAccessDesc { location, flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    // Safety: the range was mapped just above; one access descriptor.
    let granted = check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, size, &access, 1) });
    if granted.is_err() {
        // Safety: the mapping made above, unmapped once.
        let _ = unsafe { sys::cuMemUnmap(ptr, size) };
    }
    granted
}

/// Unmaps `[ptr, ptr + size)` mapped by [`mem_map_for`].
pub(crate) fn mem_unmap(ptr: RawPtr, size: usize) -> Result<()> {
    // Safety: the caller's own mapping, unmapped once after its copies finished.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr, size) })
}

/// Gives back a range from [`mem_address_reserve`] (nothing mapped in it any more).
pub(crate) fn mem_address_free(ptr: RawPtr, size: usize) -> Result<()> {
    // Safety: the caller's reservation, freed once.
    check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(ptr, size) })
}

/// Frees device memory.
pub(crate) fn mem_free(ptr: RawPtr) -> Result<()> {
    // Safety: called once by the allocation's owner after its work finished.
    check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr) })
}

/// The allocation `(base, len_bytes)` containing `ptr`.
pub(crate) fn mem_address_range(ptr: RawPtr) -> Result<(RawPtr, usize)> {
    let mut base = 0;
    let mut len = 0usize;
    // Safety: writes to valid locals; the driver validates ptr itself.
    check("cuMemGetAddressRange_v2", unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut len, ptr) })?;
    Ok((base, len))
}

/// The range `(start, len_bytes)` the driver tracks for `ptr`, from pointer
/// attributes (covers pinned and registered host memory too).
pub(crate) fn pointer_range(ptr: RawPtr) -> Result<(RawPtr, usize)> {
    let mut start: RawPtr = 0;
    let mut size: usize = 0;
    // Safety: RANGE_START_ADDR writes one CUdeviceptr into the valid local.
    check("cuPointerGetAttribute(RANGE_START_ADDR)", unsafe {
        sys::cuPointerGetAttribute(
            &mut start as *mut RawPtr as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            ptr,
        )
    })?;
    // Safety: RANGE_SIZE writes one size_t into the valid local.
    check("cuPointerGetAttribute(RANGE_SIZE)", unsafe {
        sys::cuPointerGetAttribute(
            &mut size as *mut usize as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            ptr,
        )
    })?;
    Ok((start, size))
}

/// The ordinal of the GPU whose memory `ptr` is (pointer attributes; fails for host memory the
/// driver does not know).
pub(crate) fn pointer_device_ordinal(ptr: RawPtr) -> Result<u32> {
    let mut ordinal: std::os::raw::c_int = -1;
    // Safety: DEVICE_ORDINAL writes one int into the valid local.
    check("cuPointerGetAttribute(DEVICE_ORDINAL)", unsafe {
        sys::cuPointerGetAttribute(
            &mut ordinal as *mut std::os::raw::c_int as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    })?;
    u32::try_from(ordinal).map_err(|_| CudaError::InvalidArgument {
        what: format!("the driver reports ordinal {ordinal} for pointer {ptr:#x}"),
    })
}

/// The ordinal of the device whose context is current on the calling thread, if one is.
pub(crate) fn current_context_device() -> Result<Option<u32>> {
    if current_context()?.0.is_null() {
        return Ok(None);
    }
    let mut device: sys::CUdevice = 0;
    // Safety: writes one CUdevice to a valid local; a context is current.
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut device) })?;
    Ok(u32::try_from(device).ok())
}

/// Device-to-device copy on a stream (copy engine).
pub(crate) fn memcpy_dtod_async(dst: RawPtr, src: RawPtr, len_bytes: usize, stream: RawStream) -> Result<()> {
    // Safety: device addresses are validated by the caller; a bad one yields an error, not host UB.
    check("cuMemcpyDtoDAsync_v2", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len_bytes, stream.0) })
}

/// One 2D device-to-device copy on a stream (`cuMemcpy2DAsync`, copy engine): `height` rows of
/// `width` bytes, row `r` read at `src + r * src_pitch` and written at `dst + r * dst_pitch`.
/// Both addresses are device memory reachable from the current context (this GPU's, a peer's
/// with peer access, or a peer process's mapped here through CUDA IPC); both pitches at least
/// `width` and at most the device's `CU_DEVICE_ATTRIBUTE_MAX_PITCH`.
pub(crate) fn memcpy_2d_dtod_async(
    dst: RawPtr,
    dst_pitch: usize,
    src: RawPtr,
    src_pitch: usize,
    width: usize,
    height: usize,
    stream: RawStream,
) -> Result<()> {
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    };
    // Safety: the descriptor is a valid local the driver reads during the call; device
    // addresses are validated by the caller, and a bad one fails the call or the stream, never
    // host memory.
    check("cuMemcpy2DAsync_v2", unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.0) })
}

/// Copy between the memories of two contexts on a stream (copy engine).
pub(crate) fn memcpy_peer_async(
    dst: RawPtr,
    dst_ctx: RawContext,
    src: RawPtr,
    src_ctx: RawContext,
    len_bytes: usize,
    stream: RawStream,
) -> Result<()> {
    // Safety: contexts are live; device addresses are validated by the caller.
    check("cuMemcpyPeerAsync", unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx.0, src, src_ctx.0, len_bytes, stream.0) })
}

/// Host-to-device copy.
///
/// # Safety
/// `src` must stay valid and unchanged until the copy completed on `stream`.
pub(crate) unsafe fn memcpy_htod_async(dst: RawPtr, src: *const u8, len_bytes: usize, stream: RawStream) -> Result<()> {
    // Safety: the caller guarantees src..src+len stays valid until completion.
    check("cuMemcpyHtoDAsync_v2", unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len_bytes, stream.0) })
}

/// Device-to-host copy.
///
/// # Safety
/// `dst` must stay valid, and not be read, until the copy completed on `stream`.
pub(crate) unsafe fn memcpy_dtoh_async(dst: *mut u8, src: RawPtr, len_bytes: usize, stream: RawStream) -> Result<()> {
    // Safety: the caller guarantees dst..dst+len stays valid and unread until completion.
    check("cuMemcpyDtoHAsync_v2", unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len_bytes, stream.0) })
}

/// Synchronous host-to-device copy from a slice (copy, then wait).
pub(crate) fn memcpy_htod_blocking(dst: RawPtr, src: &[u8], stream: RawStream) -> Result<()> {
    // Safety: the slice outlives the call, and the call waits for the copy before returning.
    unsafe { memcpy_htod_async(dst, src.as_ptr(), src.len(), stream)? };
    stream_synchronize(stream)
}

/// Synchronous device-to-host copy into a slice (copy, then wait).
pub(crate) fn memcpy_dtoh_blocking(dst: &mut [u8], src: RawPtr, stream: RawStream) -> Result<()> {
    // Safety: the slice is borrowed mutably for the whole call, which waits for the copy.
    unsafe { memcpy_dtoh_async(dst.as_mut_ptr(), src, dst.len(), stream)? };
    stream_synchronize(stream)
}

/// Sets `len_bytes` bytes to `value` on a stream.
pub(crate) fn memset_d8_async(dst: RawPtr, value: u8, len_bytes: usize, stream: RawStream) -> Result<()> {
    // Safety: device address validated by the caller.
    check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(dst, value, len_bytes, stream.0) })
}

/// Allocates pinned host memory, portable and device-mapped.
pub(crate) fn mem_host_alloc_mapped(len_bytes: usize) -> Result<*mut u8> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    // Safety: writes one pointer to a valid local.
    check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut ptr, len_bytes, flags) })?;
    Ok(ptr as *mut u8)
}

/// Frees memory from [`mem_host_alloc_mapped`].
///
/// # Safety
/// `ptr` came from `mem_host_alloc_mapped`, no reference into it remains, and
/// no device work that uses it is pending.
pub(crate) unsafe fn mem_free_host(ptr: *mut u8) -> Result<()> {
    // Safety: upheld by the caller as documented.
    check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(ptr as *mut c_void) })
}

/// The device address of pinned, mapped host memory.
pub(crate) fn mem_host_device_pointer(host: *mut u8) -> Result<RawPtr> {
    let mut ptr = 0;
    // Safety: the driver only looks the address up; flags must be 0.
    check("cuMemHostGetDevicePointer_v2", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut ptr, host as *mut c_void, 0)
    })?;
    Ok(ptr)
}

/// Page-locks and maps existing host memory.
///
/// # Safety
/// `host..host+len_bytes` must be one live allocation of the caller that stays
/// alive until [`mem_host_unregister`].
pub(crate) unsafe fn mem_host_register(host: *mut u8, len_bytes: usize) -> Result<()> {
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    // Safety: upheld by the caller as documented.
    check("cuMemHostRegister_v2", unsafe { sys::cuMemHostRegister_v2(host as *mut c_void, len_bytes, flags) })
}

/// Undoes [`mem_host_register`].
///
/// # Safety
/// No device work using the range may be pending.
pub(crate) unsafe fn mem_host_unregister(host: *mut u8) -> Result<()> {
    // Safety: upheld by the caller as documented.
    check("cuMemHostUnregister", unsafe { sys::cuMemHostUnregister(host as *mut c_void) })
}

/// Exports a `cuMemAlloc` allocation as a 64-byte IPC handle.
pub(crate) fn ipc_get_mem_handle(ptr: RawPtr) -> Result<[u8; 64]> {
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // Safety: writes one handle to a valid local.
    check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) })?;
    Ok(handle.reserved.map(|c| c as u8))
}

/// Maps another process's allocation into the current context.
pub(crate) fn ipc_open_mem_handle(raw: &[u8; 64]) -> Result<RawPtr> {
    let handle = sys::CUipcMemHandle { reserved: raw.map(|b| b as std::ffi::c_char) };
    let mut ptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // Safety: the handle is plain bytes the driver validates; writes one pointer to a valid local.
    check("cuIpcOpenMemHandle_v2", unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags) })?;
    Ok(ptr)
}

/// Unmaps an IPC mapping.
pub(crate) fn ipc_close_mem_handle(ptr: RawPtr) -> Result<()> {
    // Safety: called once by the mapping's owner.
    check("cuIpcCloseMemHandle", unsafe { sys::cuIpcCloseMemHandle(ptr) })
}

/// A loaded module that may cross threads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawModule(pub(crate) sys::CUmodule);
// Safety: module handles are usable from any thread.
unsafe impl Send for RawModule {}
// Safety: module handles are immutable after loading.
unsafe impl Sync for RawModule {}

/// A kernel function that may cross threads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawFunction(pub(crate) sys::CUfunction);
// Safety: function handles are usable from any thread.
unsafe impl Send for RawFunction {}
// Safety: function handles are immutable after lookup.
unsafe impl Sync for RawFunction {}

/// Loads a cubin into the current context.
pub(crate) fn module_load_data(image: &[u8]) -> Result<RawModule> {
    let mut module = std::ptr::null_mut();
    // Safety: image is a complete cubin from NVRTC that outlives the call.
    check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) })?;
    Ok(RawModule(module))
}

/// Unloads a module.
pub(crate) fn module_unload(module: RawModule) -> Result<()> {
    // Safety: called once by the module's owner.
    check("cuModuleUnload", unsafe { sys::cuModuleUnload(module.0) })
}

/// Looks a kernel up by its `extern "C"` name.
pub(crate) fn module_get_function(module: RawModule, name: &CStr) -> Result<RawFunction> {
    let mut function = std::ptr::null_mut();
    // Safety: name is NUL-terminated; writes one handle to a valid local.
    check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut function, module.0, name.as_ptr()) })?;
    Ok(RawFunction(function))
}

/// One kernel argument: a device address, a count or a scalar.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KernelArg {
    /// A device pointer or unsigned 64-bit count.
    U64(u64),
    /// A double-precision scalar.
    F64(f64),
}

/// Launch geometry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchShape {
    /// Blocks in x.
    pub(crate) grid_x: u32,
    /// Threads per block in x.
    pub(crate) block_x: u32,
}

/// Launches a kernel whose parameters are exactly `args`, in order.
///
/// # Safety
/// `args` must match the kernel's parameter list in number and type, and every
/// device pointer among them must cover what the kernel touches.
pub(crate) unsafe fn launch_kernel(
    function: RawFunction,
    shape: LaunchShape,
    stream: RawStream,
    args: &[KernelArg],
) -> Result<()> {
    let dims = LaunchDims { grid: [shape.grid_x, 1, 1], block: [shape.block_x, 1, 1], shared_bytes: 0 };
    // Safety: forwarded; the caller upholds launch_kernel_dims' contract.
    unsafe { launch_kernel_dims(function, dims, stream, args) }
}

/// Launch geometry in three dimensions, with dynamic shared memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchDims {
    /// Blocks in x, y, z.
    pub(crate) grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub(crate) block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub(crate) shared_bytes: u32,
}

/// Launches a kernel whose parameters are exactly `args`, in order, with `dims`.
///
/// # Safety
/// As [`launch_kernel`].
pub(crate) unsafe fn launch_kernel_dims(
    function: RawFunction,
    dims: LaunchDims,
    stream: RawStream,
    args: &[KernelArg],
) -> Result<()> {
    let mut storage: Vec<KernelArg> = args.to_vec();
    let mut params: Vec<*mut c_void> = storage
        .iter_mut()
        .map(|arg| match arg {
            KernelArg::U64(v) => v as *mut u64 as *mut c_void,
            KernelArg::F64(v) => v as *mut f64 as *mut c_void,
        })
        .collect();
    // Safety: params point into `storage`, alive across the call (the driver copies them);
    // the caller guarantees they match the kernel signature.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            function.0,
            dims.grid[0],
            dims.grid[1],
            dims.grid[2],
            dims.block[0],
            dims.block[1],
            dims.block[2],
            dims.shared_bytes,
            stream.0,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// A captured graph, before instantiation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawGraph(pub(crate) sys::CUgraph);

/// An instantiated graph that may cross threads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawGraphExec(pub(crate) sys::CUgraphExec);
// Safety: executable graph handles are usable from any thread; launches are serialised by the
// driver per stream.
unsafe impl Send for RawGraphExec {}
// Safety: as above; the handle is not mutated after instantiation.
unsafe impl Sync for RawGraphExec {}

/// Starts capturing `stream` into a graph. Thread-local mode: only this thread's unsafe calls
/// are refused while capturing, so other threads (the engine's, a proxy's) keep using CUDA.
pub(crate) fn stream_begin_capture(stream: RawStream) -> Result<()> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // Safety: stream is live and not the legacy default stream (ours are non-blocking).
    check("cuStreamBeginCapture_v2", unsafe { sys::cuStreamBeginCapture_v2(stream.0, mode) })
}

/// Ends the capture of `stream` and returns the graph.
pub(crate) fn stream_end_capture(stream: RawStream) -> Result<RawGraph> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // Safety: writes one CUgraph to a valid local.
    check("cuStreamEndCapture", unsafe { sys::cuStreamEndCapture(stream.0, &mut graph) })?;
    if graph.is_null() {
        return Err(CudaError::InvalidArgument { what: "the capture produced no graph".into() });
    }
    Ok(RawGraph(graph))
}

/// Instantiates `graph`.
pub(crate) fn graph_instantiate(graph: RawGraph) -> Result<RawGraphExec> {
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // Safety: graph is live; writes one handle to a valid local.
    check("cuGraphInstantiateWithFlags", unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph.0, 0) })?;
    Ok(RawGraphExec(exec))
}

/// Destroys a graph (its instantiations live on).
pub(crate) fn graph_destroy(graph: RawGraph) -> Result<()> {
    // Safety: called once by the graph's owner.
    check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph.0) })
}

/// Launches an instantiated graph on `stream`.
pub(crate) fn graph_launch(exec: RawGraphExec, stream: RawStream) -> Result<()> {
    // Safety: both handles are live and of the current context.
    check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(exec.0, stream.0) })
}

/// Destroys an instantiated graph.
pub(crate) fn graph_exec_destroy(exec: RawGraphExec) -> Result<()> {
    // Safety: called once by the owner, after its launches completed.
    check("cuGraphExecDestroy", unsafe { sys::cuGraphExecDestroy(exec.0) })
}

/// Type of the boxed callback handed to [`launch_host_func`].
pub(crate) type HostCallback = Box<dyn FnOnce() + Send + 'static>;

unsafe extern "C" fn host_func_trampoline(user_data: *mut c_void) {
    // Safety: user_data is the Box<HostCallback> leaked by launch_host_func, and the driver
    // calls this exactly once.
    let callback: Box<HostCallback> = unsafe { Box::from_raw(user_data as *mut HostCallback) };
    // A panic must not unwind into the driver's thread.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback));
}

/// Enqueues `callback` on `stream`; the driver runs it on its own thread once
/// prior work on the stream completed. It must not call CUDA.
pub(crate) fn launch_host_func(stream: RawStream, callback: HostCallback) -> Result<()> {
    let user_data = Box::into_raw(Box::new(callback)) as *mut c_void;
    // Safety: the trampoline reclaims user_data exactly once when the driver runs it.
    let result = unsafe { sys::cuLaunchHostFunc(stream.0, Some(host_func_trampoline), user_data) };
    if result != sys::CUresult::CUDA_SUCCESS {
        // Safety: the driver rejected the launch, so it never took ownership of user_data.
        drop(unsafe { Box::from_raw(user_data as *mut HostCallback) });
    }
    check("cuLaunchHostFunc", result)
}
