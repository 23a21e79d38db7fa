//! The C functions `accord.torch`'s compiled backend (`python/accord/native/torch_backend.cpp`)
//! calls for the ops it runs without Python: an all_reduce of a CUDA tensor queued on the
//! group's stream, and a synchronous all_reduce of a CPU tensor already registered.
//!
//! Why: torch reaches a Python backend through Python at every op, and a CUDA-aware future made
//! in Python finds its tensors by pickling them. A DDP step pays both at every bucket on its
//! autograd thread, which bound the 2-GPU step (docs/results/2026-11-27-direct-gpu-calls.md).
//! The compiled backend calls these functions directly, from threads that hold no GIL.
//!
//! The table is C: a version, then function pointers (`accord_torch_api.h` in the same folder
//! as the C++ file declares the same layout). Each function takes the address
//! `_native_handle()` gave for a `Communicator` or `GpuCommunicator`, which the caller keeps
//! alive, and returns [`DONE`], [`DECLINED`] (the caller goes the Python way, which does
//! everything the fast way does not) or [`FAILED`] with the exception's kind and message in a
//! [`Failure`]. No function unwinds into C: a panic becomes a failure.

use crate::coll::Communicator;
use crate::errors::{coll_error_kind, Kind};
use crate::gpu_coll::GpuCommunicator;
use accord_coll::{DType, ReduceOp};
use pyo3::prelude::*;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;

/// The layout's version; the C++ side refuses a table of another.
pub const ABI: u32 = 1;
/// The op ran (or, on the GPU, was queued).
pub const DONE: i32 = 0;
/// Not run: the caller takes the Python path.
pub const DECLINED: i32 = 1;
/// Failed: see the [`Failure`].
pub const FAILED: i32 = 2;

/// Bytes of a failure's message, its NUL included.
const MESSAGE_BYTES: usize = 1024;

/// Why a call failed: the class of `accord.errors` (by name, NUL-terminated) and the message.
#[repr(C)]
pub struct Failure {
    class_name: [c_char; 32],
    message: [c_char; MESSAGE_BYTES],
}

/// The functions, in the order `accord_torch_api.h` declares them.
#[repr(C)]
pub struct Api {
    abi: u32,
    gpu_all_reduce:
        unsafe extern "C" fn(usize, u64, usize, *const c_char, *const c_char, u64, u64, *mut u64, *mut Failure) -> i32,
    gpu_wait_mark: unsafe extern "C" fn(usize, u64, u64, *mut Failure) -> i32,
    gpu_mark_reached: unsafe extern "C" fn(usize, u64, *mut i32, *mut Failure) -> i32,
    gpu_check: unsafe extern "C" fn(usize, *mut Failure) -> i32,
    host_all_reduce: unsafe extern "C" fn(usize, u64, usize, *const c_char, *const c_char, *mut Failure) -> i32,
}

static API: Api = Api { abi: ABI, gpu_all_reduce, gpu_wait_mark, gpu_mark_reached, gpu_check, host_all_reduce };

/// The address of the function table (a static: valid for the life of the process).
#[pyfunction]
pub fn _torch_native_api() -> usize {
    &API as *const Api as usize
}

/// Writes `kind` and `message` into `out` (truncated to fit, at a character boundary).
fn fail(out: *mut Failure, kind: Kind, message: &str) -> i32 {
    if out.is_null() {
        return FAILED;
    }
    #[allow(unsafe_code)]
    // Safety: the caller passes a Failure it owns, or null (checked above).
    let out = unsafe { &mut *out };
    copy_text(&mut out.class_name, kind.class_name());
    copy_text(&mut out.message, message);
    FAILED
}

fn copy_text(into: &mut [c_char], text: &str) {
    let mut end = text.len().min(into.len() - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    for (slot, byte) in into.iter_mut().zip(&text.as_bytes()[..end]) {
        *slot = *byte as c_char;
    }
    into[end] = 0;
}

/// A NUL-terminated name from C, or a failure.
fn name<'a>(text: *const c_char, what: &str) -> Result<&'a str, (Kind, String)> {
    if text.is_null() {
        return Err((Kind::InvalidRequest, format!("no {what} given")));
    }
    #[allow(unsafe_code)]
    // Safety: the caller passes a NUL-terminated string that outlives the call.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| (Kind::InvalidRequest, format!("the {what} is not UTF-8")))
}

fn parse(dtype: *const c_char, op: *const c_char) -> Result<(DType, ReduceOp), (Kind, String)> {
    let dtype = DType::from_str(name(dtype, "dtype")?).map_err(|e| (Kind::InvalidRequest, e.to_string()))?;
    let op = ReduceOp::from_str(name(op, "reduce op")?).map_err(|e| (Kind::InvalidRequest, e.to_string()))?;
    Ok((dtype, op))
}

/// Runs `body`, turning an error or a panic into a failure.
fn guarded(out: *mut Failure, body: impl FnOnce() -> Result<i32, (Kind, String)>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => code,
        Ok(Err((kind, message))) => fail(out, kind, &message),
        Err(_) => fail(out, Kind::Accord, "accord.torch: internal error (a panic) in the compiled backend's call"),
    }
}

/// # Safety
/// `handle` is `GpuCommunicator._native_handle()` of an object the caller keeps alive.
#[allow(unsafe_code)]
unsafe fn gpu<'a>(handle: usize) -> &'a GpuCommunicator {
    // Safety: see the function's contract.
    unsafe { &*(handle as *const GpuCommunicator) }
}

/// An in-place all_reduce of `count` elements at `ptr` queued on `stream` behind `after`; its
/// mark into `mark`.
#[allow(unsafe_code)]
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn gpu_all_reduce(
    handle: usize,
    ptr: u64,
    count: usize,
    dtype: *const c_char,
    op: *const c_char,
    stream: u64,
    after: u64,
    mark: *mut u64,
    out: *mut Failure,
) -> i32 {
    guarded(out, || {
        let (dtype, op) = parse(dtype, op)?;
        // Safety: the caller's contract (`gpu`).
        let comm = unsafe { gpu(handle) };
        let ticket = comm.all_reduce_marked((ptr, ptr), count, dtype, op, stream, Some(after))?;
        if !mark.is_null() {
            // Safety: the caller passes a u64 it owns, or null.
            unsafe { *mark = ticket };
        }
        Ok(DONE)
    })
}

#[allow(unsafe_code)]
unsafe extern "C" fn gpu_wait_mark(handle: usize, stream: u64, ticket: u64, out: *mut Failure) -> i32 {
    // Safety: the caller's contract (`gpu`).
    guarded(out, || unsafe { gpu(handle) }.wait_mark_on(stream, ticket).map(|()| DONE))
}

#[allow(unsafe_code)]
unsafe extern "C" fn gpu_mark_reached(handle: usize, ticket: u64, reached: *mut i32, out: *mut Failure) -> i32 {
    guarded(out, || {
        // Safety: the caller's contract (`gpu`).
        let done = unsafe { gpu(handle) }.reached(ticket)?;
        if !reached.is_null() {
            // Safety: the caller passes an i32 it owns, or null.
            unsafe { *reached = i32::from(done) };
        }
        Ok(DONE)
    })
}

#[allow(unsafe_code)]
unsafe extern "C" fn gpu_check(handle: usize, out: *mut Failure) -> i32 {
    // Safety: the caller's contract (`gpu`).
    guarded(out, || unsafe { gpu(handle) }.first_error().map(|()| DONE))
}

/// A synchronous in-place all_reduce of `nbytes` at `addr`, which an earlier call registered;
/// [`DECLINED`] where it is not registered or the communicator is busy or closed.
#[allow(unsafe_code)]
unsafe extern "C" fn host_all_reduce(
    handle: usize,
    addr: u64,
    nbytes: usize,
    dtype: *const c_char,
    op: *const c_char,
    out: *mut Failure,
) -> i32 {
    guarded(out, || {
        let (dtype, op) = parse(dtype, op)?;
        if nbytes == 0 || nbytes % dtype.size_bytes() != 0 {
            return Ok(DECLINED);
        }
        // Safety: `handle` is `Communicator._native_handle()` of an object the caller keeps
        // alive.
        let comm = unsafe { &*(handle as *const Communicator) };
        match comm.all_reduce_registered((addr as usize, nbytes), dtype, op) {
            None => Ok(DECLINED),
            Some(Ok(())) => Ok(DONE),
            Some(Err(e)) => Err((coll_error_kind(&e), e.to_string())),
        }
    })
}
