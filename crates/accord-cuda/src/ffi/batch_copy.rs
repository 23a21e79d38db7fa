//! The driver's batched copy calls (`cuMemcpyBatchAsync`, `cuMemcpy3DBatchAsync`, CUDA 12.8 and
//! later), whose entry points are looked up through `cuGetProcAddress` at the CUDA version whose
//! signature is called here: CUDA 13 changed both signatures (it dropped the failure index), and
//! binding them by symbol name would abort the process on a driver that lacks the name.

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::driver::{check, driver_version, RawPtr, RawStream};
use crate::error::{CudaError, Result};

/// Queues `dsts.len()` device-to-device copies on `stream` in one call
/// (`cuMemcpyBatchAsync`): each copy's source is read in stream order; the copies among
/// themselves run in any order. `ordinal` is the stream's GPU (the location hint). The arrays
/// are taken by value: the driver's signature wants them mutable, though it only reads them.
pub(crate) fn memcpy_batch_async(
    mut dsts: Vec<u64>,
    mut srcs: Vec<u64>,
    mut sizes: Vec<usize>,
    ordinal: u32,
    stream: RawStream,
) -> Result<()> {
    if dsts.len() != srcs.len() || dsts.len() != sizes.len() {
        return Err(CudaError::InvalidArgument {
            what: "a copy batch needs as many sources and sizes as destinations".into(),
        });
    }
    if dsts.is_empty() {
        return Ok(());
    }
    let here = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal as std::ffi::c_int,
    };
    let mut attrs = [sys::CUmemcpyAttributes {
        srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        srcLocHint: here,
        dstLocHint: here,
        flags: 0,
    }];
    let mut attr_indices = [0usize];
    let entry = batch_1d_entry().map_err(|reason| CudaError::NotAvailable { reason })?;
    // Safety: three arrays of equal length and one attribute applying from copy 0 on, all live
    // for the call (the driver reads them during it); the entry point has the signature its
    // variant names; a bad device address fails the stream.
    let result = unsafe {
        let (d, s, z, n, a, i) = (
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            dsts.len(),
            attrs.as_mut_ptr(),
            attr_indices.as_mut_ptr(),
        );
        match entry {
            Batch1d::V2(f) => f(d, s, z, n, a, i, 1, stream.0),
            Batch1d::V1(f) => {
                let mut failed_at = 0usize;
                f(d, s, z, n, a, i, 1, &mut failed_at, stream.0)
            }
        }
    };
    check("cuMemcpyBatchAsync", result)
}

/// `cuMemcpyBatchAsync` as CUDA 13 declares it (no failure index).
type Batch1dV2 = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    sys::CUstream,
) -> sys::CUresult;
/// `cuMemcpyBatchAsync` as CUDA 12.8 and 12.9 declare it (a failure index before the stream).
type Batch1dV1 = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    sys::CUstream,
) -> sys::CUresult;

/// The driver's `cuMemcpyBatchAsync`, in the signature of the CUDA version it was asked at.
#[derive(Copy, Clone)]
enum Batch1d {
    V2(Batch1dV2),
    V1(Batch1dV1),
}

static BATCH_1D: OnceLock<std::result::Result<Batch1d, String>> = OnceLock::new();

/// `cuMemcpyBatchAsync` at the version [`batch_copy_version`] picks, looked up once (before,
/// it was bound by its CUDA 13 symbol name, which aborts the process on a 12.8 driver).
fn batch_1d_entry() -> std::result::Result<Batch1d, String> {
    BATCH_1D
        .get_or_init(|| {
            let asked = batch_copy_version("cuMemcpyBatchAsync")?;
            let pfn = proc_address(c"cuMemcpyBatchAsync", asked)?;
            // Safety: the driver returned the entry point of the version asked, whose signature
            // the type names.
            Ok(if asked >= 13000 {
                Batch1d::V2(unsafe { std::mem::transmute::<*mut c_void, Batch1dV2>(pfn) })
            } else {
                Batch1d::V1(unsafe { std::mem::transmute::<*mut c_void, Batch1dV1>(pfn) })
            })
        })
        .clone()
}

/// One 2D copy of [`memcpy_2d_batch_async`]: `height` rows of `width` bytes, row `r` read at
/// `src + r * src_pitch` and written at `dst + r * dst_pitch`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawCopy2d {
    pub(crate) dst: RawPtr,
    pub(crate) dst_pitch: usize,
    pub(crate) src: RawPtr,
    pub(crate) src_pitch: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
}

/// `cuMemcpy3DBatchAsync` as CUDA 13 declares it (no failure index).
type Batch3dV2 = unsafe extern "C" fn(
    usize,
    *mut sys::CUDA_MEMCPY3D_BATCH_OP,
    std::ffi::c_ulonglong,
    sys::CUstream,
) -> sys::CUresult;
/// `cuMemcpy3DBatchAsync` as CUDA 12.8 and 12.9 declare it (a failure index before the flags).
type Batch3dV1 = unsafe extern "C" fn(
    usize,
    *mut sys::CUDA_MEMCPY3D_BATCH_OP,
    *mut usize,
    std::ffi::c_ulonglong,
    sys::CUstream,
) -> sys::CUresult;

/// The driver's `cuMemcpy3DBatchAsync`, in the signature of the CUDA version it was asked at.
#[derive(Copy, Clone)]
enum Batch3d {
    V2(Batch3dV2),
    V1(Batch3dV1),
}

/// The entry point, looked up once per process; the error says why there is none.
static BATCH_3D: OnceLock<std::result::Result<Batch3d, String>> = OnceLock::new();

/// The CUDA version whose signature of a batched copy call this crate uses on this driver:
/// 13.0 on a CUDA 13 driver, 12.8 on 12.8 and 12.9 (CUDA 13 dropped the failure-index
/// parameter of `cuMemcpyBatchAsync` and `cuMemcpy3DBatchAsync`, so asking a 13 driver for the
/// 12.8 entry, or the reverse, would call a function through the wrong signature); an error on
/// older drivers, which have neither.
fn batch_copy_version(call: &str) -> std::result::Result<i32, String> {
    let version = driver_version().map_err(|e| e.to_string())?;
    match version {
        v if v >= 13000 => Ok(13000),
        v if v >= 12080 => Ok(12080),
        v => Err(format!("driver {}.{} predates {call} (CUDA 12.8)", v / 1000, v % 1000 / 10)),
    }
}

/// The driver's entry point of `symbol` as CUDA `version` declares it, through
/// `cuGetProcAddress`: never through a symbol name, since a missing symbol would abort in the
/// loader instead of being an answer.
fn proc_address(symbol: &CStr, version: i32) -> std::result::Result<*mut c_void, String> {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // Safety: a NUL-terminated name and two valid locals the driver writes.
    let result = unsafe {
        sys::cuGetProcAddress_v2(
            symbol.as_ptr(),
            &mut pfn,
            version,
            sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
            &mut status,
        )
    };
    check("cuGetProcAddress", result).map_err(|e| e.to_string())?;
    if status != sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS || pfn.is_null() {
        return Err(format!("the driver has no {symbol:?} for CUDA {version} ({status:?})"));
    }
    Ok(pfn)
}

/// `cuMemcpy3DBatchAsync` at the version [`batch_copy_version`] picks, looked up once.
fn batch_3d_entry() -> std::result::Result<Batch3d, String> {
    BATCH_3D
        .get_or_init(|| {
            let asked = batch_copy_version("cuMemcpy3DBatchAsync")?;
            let pfn = proc_address(c"cuMemcpy3DBatchAsync", asked)?;
            // Safety: the driver returned the entry point of the version asked, whose signature
            // the type names.
            Ok(if asked >= 13000 {
                Batch3d::V2(unsafe { std::mem::transmute::<*mut c_void, Batch3dV2>(pfn) })
            } else {
                Batch3d::V1(unsafe { std::mem::transmute::<*mut c_void, Batch3dV1>(pfn) })
            })
        })
        .clone()
}

/// Whether this driver has `cuMemcpy3DBatchAsync` (the error says why not).
pub(crate) fn memcpy_2d_batch_supported() -> std::result::Result<(), String> {
    batch_3d_entry().map(|_| ())
}

/// Queues `copies` (2D, device to device, at most [`COPIES_2D_PER_BATCH_CALL`]) on `stream` in
/// one `cuMemcpy3DBatchAsync` call: each is one operation of depth 1 between two pointer
/// operands (element size 1, so widths and row lengths are bytes). The batch starts after the
/// work queued before it; its copies run in any order among themselves. `ordinal` is the
/// stream's GPU (the location hint, ignored for device memory).
pub(crate) fn memcpy_2d_batch_async(copies: &[RawCopy2d], ordinal: u32, stream: RawStream) -> Result<()> {
    if copies.is_empty() {
        return Ok(());
    }
    if copies.len() > COPIES_2D_PER_BATCH_CALL {
        return Err(CudaError::InvalidArgument {
            what: format!("{} 2D copies in one batch: at most {COPIES_2D_PER_BATCH_CALL}", copies.len()),
        });
    }
    let entry = batch_3d_entry().map_err(|reason| CudaError::NotAvailable { reason })?;
    let here = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal as std::ffi::c_int,
    };
    let operand = |ptr: RawPtr, pitch: usize, height: usize| sys::CUmemcpy3DOperand {
        type_: sys::CUmemcpy3DOperandType::CU_MEMCPY_OPERAND_TYPE_POINTER,
        op: sys::CUmemcpy3DOperand_st__bindgen_ty_1 {
            ptr: sys::CUmemcpy3DOperand_st__bindgen_ty_1__bindgen_ty_1 {
                ptr,
                rowLength: pitch,
                layerHeight: height,
                locHint: here,
            },
        },
    };
    let mut ops: Vec<sys::CUDA_MEMCPY3D_BATCH_OP> = copies
        .iter()
        .map(|c| sys::CUDA_MEMCPY3D_BATCH_OP {
            src: operand(c.src, c.src_pitch, c.height),
            dst: operand(c.dst, c.dst_pitch, c.height),
            extent: sys::CUextent3D { width: c.width, height: c.height, depth: 1 },
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            flags: 0,
        })
        .collect();
    // Safety: `ops` holds `len` initialised operations, live through the call (the driver reads
    // them during it); the entry point has the signature its variant names; device addresses
    // were checked by the caller, and a bad one fails the call or the stream, never host memory.
    let result = unsafe {
        match entry {
            Batch3d::V2(f) => f(ops.len(), ops.as_mut_ptr(), 0, stream.0),
            Batch3d::V1(f) => {
                let mut failed_at = 0usize;
                f(ops.len(), ops.as_mut_ptr(), &mut failed_at, 0, stream.0)
            }
        }
    };
    check("cuMemcpy3DBatchAsync", result)
}

/// Most 2D copies of one [`memcpy_2d_batch_async`] call (the host builds one array of this
/// many operations, about 180 KiB).
pub(crate) const COPIES_2D_PER_BATCH_CALL: usize = 1024;
