//! Reading a DLPack capsule (`obj.__dlpack__()`, the legacy unversioned `DLManagedTensor`): the
//! only raw-pointer code of the crate. The layout is DLPack's stable C ABI (`dlpack.h`,
//! `DLPACK_VERSION` 0.x and the legacy capsule of 1.x).
//!
//! The capsule is kept, not consumed: it is never renamed to `used_dltensor`, so the producer's
//! capsule destructor still owns the tensor and calls its deleter when the capsule dies. Holding
//! the capsule therefore keeps the memory alive.
#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_void;

/// `DLDevice`.
#[repr(C)]
#[derive(Copy, Clone)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Copy, Clone)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (only the tensor is read; the deleter belongs to the capsule).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// DLPack device types whose memory the host can read and write directly.
pub(crate) const DEVICE_CPU: i32 = 1;
/// CUDA device memory.
pub(crate) const DEVICE_CUDA: i32 = 2;
/// CUDA pinned host memory.
pub(crate) const DEVICE_CUDA_HOST: i32 = 3;
/// ROCm device memory.
pub(crate) const DEVICE_ROCM: i32 = 10;
/// ROCm pinned host memory.
pub(crate) const DEVICE_ROCM_HOST: i32 = 11;
/// CUDA managed (unified) memory.
pub(crate) const DEVICE_CUDA_MANAGED: i32 = 13;
/// Most dimensions accepted (DLPack producers stay far below).
const NDIM_MAX: i32 = 64;

/// What a capsule describes, checked: a C-contiguous range of host memory.
#[derive(Debug)]
pub(crate) struct TensorView {
    /// First byte (data + byte_offset).
    pub(crate) ptr: usize,
    /// Bytes spanned.
    pub(crate) nbytes: usize,
    /// DLPack device type.
    pub(crate) device_type: i32,
}

/// Reads the tensor in a `dltensor` capsule. Errors are plain strings; the caller adds context.
pub(crate) fn read_capsule(capsule: &Bound<'_, PyAny>) -> Result<TensorView, String> {
    let name = c"dltensor";
    // Safety: `capsule` is a live object (we hold a reference); PyCapsule_GetPointer checks the
    // type and name itself and returns null (setting an exception we clear) on a mismatch.
    let raw = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), name.as_ptr()) };
    if raw.is_null() {
        // Clear the exception PyCapsule_GetPointer set; we report our own.
        let _ = PyErr::take(capsule.py());
        return Err("__dlpack__() did not return an unused 'dltensor' capsule".into());
    }
    // Safety: a 'dltensor' capsule holds a DLManagedTensor (the DLPack contract), alive while
    // the capsule is; we only read it while holding the capsule.
    let tensor = unsafe { &(*(raw as *const DlManagedTensor)).dl_tensor };
    if tensor.ndim < 0 || tensor.ndim > NDIM_MAX {
        return Err(format!("tensor has {} dimensions (at most {NDIM_MAX} accepted)", tensor.ndim));
    }
    let ndim = tensor.ndim as usize;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // Safety: DLPack guarantees `shape` points at `ndim` values for the capsule's life.
        unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }
    };
    let strides: Option<&[i64]> = if tensor.strides.is_null() || ndim == 0 {
        None
    } else {
        // Safety: a non-null `strides` points at `ndim` values (DLPack contract).
        Some(unsafe { std::slice::from_raw_parts(tensor.strides, ndim) })
    };
    let bits = u64::from(tensor.dtype.bits) * u64::from(tensor.dtype.lanes);
    if bits == 0 || bits % 8 != 0 {
        return Err(format!("elements of {bits} bits are not whole bytes"));
    }
    let mut count: u64 = 1;
    for &dim in shape {
        let dim = u64::try_from(dim).map_err(|_| format!("negative dimension {dim}"))?;
        count = count.checked_mul(dim).ok_or("shape overflows")?;
    }
    if let Some(strides) = strides {
        let mut expected: i64 = 1;
        for (&dim, &stride) in shape.iter().zip(strides).rev() {
            if dim != 1 && stride != expected {
                return Err(format!("not C-contiguous (shape {shape:?}, strides {strides:?} in elements)"));
            }
            expected = expected.saturating_mul(dim);
        }
    }
    let nbytes = count.checked_mul(bits / 8).ok_or("size overflows")?;
    let ptr = (tensor.data as usize)
        .checked_add(usize::try_from(tensor.byte_offset).map_err(|_| "byte_offset overflows")?)
        .ok_or("address overflows")?;
    Ok(TensorView {
        ptr,
        nbytes: usize::try_from(nbytes).map_err(|_| "size overflows")?,
        device_type: tensor.device.device_type,
    })
}
