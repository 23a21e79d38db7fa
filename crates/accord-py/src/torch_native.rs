//! The C functions `accord.torch`'s compiled backend (`python/accord/native/torch_backend.cpp`)
//! calls for the ops it runs without Python: all_reduce, all_gather_into_tensor and
//! reduce_scatter_tensor of CUDA tensors queued on the group's stream, and synchronous
//! all_reduce, all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single of CPU
//! tensors already registered.
//!
//! Why: torch reaches a Python backend through Python at every op, and a CUDA-aware future made
//! in Python finds its tensors by pickling them. A DDP step pays both at every bucket on its
//! autograd thread, which bound the 2-GPU step (docs/results/2026-11-27-direct-gpu-calls.md);
//! a CPU op pays tens of microseconds of Python on a loaded host, which kept the torch layer's
//! overhead above 10% at 1 MiB (docs/results/2026-11-28-torch-gpu-default.md).
//! The compiled backend calls these functions directly, from threads that hold no GIL.
//!
//! The table is C: a version, then function pointers (`accord_torch_api.h` in the same folder
//! as the C++ file declares the same layout). Each function takes the address
//! `_native_handle()` gave for a `Communicator` or `GpuCommunicator`, which the caller keeps
//! alive, and returns [`DONE`], [`DECLINED`] (the caller goes the Python way, which does
//! everything the fast way does not) or [`FAILED`] with the exception's kind and message in a
//! [`Failure`]. No function unwinds into C: a panic becomes a failure.

use crate::coll::{all_to_allv_layout, overlaps, Communicator};
use crate::errors::{coll_error_kind, Kind};
use crate::gpu_coll::GpuCommunicator;
use accord_coll::{Bufs, CollError, DType, LocalBuf, ReduceOp};
use pyo3::prelude::*;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;

/// The layout's version; the C++ side refuses a table of another.
pub const ABI: u32 = 2;
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
    gpu_all_gather: unsafe extern "C" fn(usize, u64, u64, usize, u64, u64, *mut u64, *mut Failure) -> i32,
    gpu_reduce_scatter: unsafe extern "C" fn(
        usize,
        u64,
        u64,
        usize,
        *const c_char,
        *const c_char,
        u64,
        u64,
        *mut u64,
        *mut Failure,
    ) -> i32,
    host_all_gather: unsafe extern "C" fn(usize, u64, u64, usize, *const c_char, *mut Failure) -> i32,
    host_reduce_scatter:
        unsafe extern "C" fn(usize, u64, u64, usize, *const c_char, *const c_char, *mut Failure) -> i32,
    host_all_to_allv: unsafe extern "C" fn(
        usize,
        u64,
        usize,
        u64,
        usize,
        *const c_char,
        *const u64,
        *const u64,
        usize,
        *mut Failure,
    ) -> i32,
}

static API: Api = Api {
    abi: ABI,
    gpu_all_reduce,
    gpu_wait_mark,
    gpu_mark_reached,
    gpu_check,
    host_all_reduce,
    gpu_all_gather,
    gpu_reduce_scatter,
    host_all_gather,
    host_reduce_scatter,
    host_all_to_allv,
};

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
    let op = ReduceOp::from_str(name(op, "reduce op")?).map_err(|e| (Kind::InvalidRequest, e.to_string()))?;
    Ok((parse_dtype(dtype)?, op))
}

fn parse_dtype(dtype: *const c_char) -> Result<DType, (Kind, String)> {
    DType::from_str(name(dtype, "dtype")?).map_err(|e| (Kind::InvalidRequest, e.to_string()))
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
    // Safety: the caller's contract (`gpu`, and `mark` its own or null).
    unsafe {
        queue_marked(handle, mark, out, |comm| {
            let (dtype, op) = parse(dtype, op)?;
            comm.all_reduce_marked((ptr, ptr), count, dtype, op, stream, Some(after))
        })
    }
}

/// An all_gather of `bytes_per_rank` at `input` into `output` (by rank) queued on `stream`
/// behind `after`; its mark into `mark`.
#[allow(unsafe_code)]
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn gpu_all_gather(
    handle: usize,
    input: u64,
    output: u64,
    bytes_per_rank: usize,
    stream: u64,
    after: u64,
    mark: *mut u64,
    out: *mut Failure,
) -> i32 {
    // Safety: the caller's contract (`gpu`, and `mark` its own or null).
    unsafe {
        queue_marked(handle, mark, out, |comm| {
            comm.all_gather_marked((input, output), bytes_per_rank, stream, Some(after))
        })
    }
}

/// A reduce_scatter of `count_per_rank` elements a rank from `input` into `output` queued on
/// `stream` behind `after`; its mark into `mark`.
#[allow(unsafe_code)]
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn gpu_reduce_scatter(
    handle: usize,
    input: u64,
    output: u64,
    count_per_rank: usize,
    dtype: *const c_char,
    op: *const c_char,
    stream: u64,
    after: u64,
    mark: *mut u64,
    out: *mut Failure,
) -> i32 {
    // Safety: the caller's contract (`gpu`, and `mark` its own or null).
    unsafe {
        queue_marked(handle, mark, out, |comm| {
            let (dtype, op) = parse(dtype, op)?;
            comm.reduce_scatter_marked((input, output), count_per_rank, dtype, op, stream, Some(after))
        })
    }
}

/// Queues an op on the GpuCommunicator of `handle` (`queue`, which returns the op's mark) and
/// writes the mark where the caller asked (null: nowhere).
///
/// # Safety
/// `handle` is as [`gpu`] needs; `mark` is a u64 the caller owns, or null.
#[allow(unsafe_code)]
unsafe fn queue_marked(
    handle: usize,
    mark: *mut u64,
    out: *mut Failure,
    queue: impl FnOnce(&GpuCommunicator) -> Result<u64, (Kind, String)>,
) -> i32 {
    guarded(out, || {
        // Safety: this function's contract.
        let ticket = queue(unsafe { gpu(handle) })?;
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

/// # Safety
/// `handle` is `Communicator._native_handle()` of an object the caller keeps alive.
#[allow(unsafe_code)]
unsafe fn host<'a>(handle: usize) -> &'a Communicator {
    // Safety: see the function's contract.
    unsafe { &*(handle as *const Communicator) }
}

/// Runs `job` on the registrations of `regions` (see `Communicator::run_registered`):
/// [`DECLINED`] where one is not registered or the communicator is busy or closed.
fn on_registered<const N: usize>(
    comm: &Communicator,
    regions: [(usize, usize); N],
    job: impl FnOnce(&mut crate::coll::Comm, &[&LocalBuf]) -> Result<(), CollError>,
) -> Result<i32, (Kind, String)> {
    match comm.run_registered(&regions, job) {
        None => Ok(DECLINED),
        Some(Ok(())) => Ok(DONE),
        Some(Err(e)) => Err((coll_error_kind(&e), e.to_string())),
    }
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
        let count = nbytes / dtype.size_bytes();
        // Safety: the caller's contract (`host`).
        on_registered(unsafe { host(handle) }, [(addr as usize, nbytes)], |comm, bufs| {
            comm.all_reduce(Bufs::in_place(bufs[0].slice(0, nbytes)), count, dtype, op, None)
        })
    })
}

/// A synchronous all_gather of `bytes_per_rank` at `input` into `output` (world size times as
/// many bytes, by rank), registered memory both (or `input` this rank's block of `output`: in
/// place, NCCL's rule, only `output` registered); [`DECLINED`] otherwise, and where the two
/// overlap any other way.
#[allow(unsafe_code)]
unsafe extern "C" fn host_all_gather(
    handle: usize,
    input: u64,
    output: u64,
    bytes_per_rank: usize,
    dtype: *const c_char,
    out: *mut Failure,
) -> i32 {
    guarded(out, || {
        let dtype = parse_dtype(dtype)?;
        if bytes_per_rank == 0 || bytes_per_rank % dtype.size_bytes() != 0 {
            return Ok(DECLINED);
        }
        // Safety: the caller's contract (`host`).
        let comm = unsafe { host(handle) };
        let (rank, world) = comm.place();
        let count = bytes_per_rank / dtype.size_bytes();
        let (b, total) = (bytes_per_rank, bytes_per_rank.saturating_mul(world));
        let (input, output, at) = (input as usize, output as usize, rank.saturating_mul(b));
        if input == output.saturating_add(at) {
            return on_registered(comm, [(output, total)], |c, bufs| {
                c.all_gather(Bufs { send: bufs[0].slice(at, b), recv: bufs[0].slice(0, total) }, count, dtype, None)
            });
        }
        if overlaps((input, b), (output, total)) {
            return Ok(DECLINED);
        }
        on_registered(comm, [(input, b), (output, total)], |c, bufs| {
            c.all_gather(Bufs { send: bufs[0].slice(0, b), recv: bufs[1].slice(0, total) }, count, dtype, None)
        })
    })
}

/// A synchronous reduce_scatter of `input` (world size blocks of `output_bytes`) into
/// `output`, registered memory both, not overlapping; [`DECLINED`] otherwise.
#[allow(unsafe_code)]
unsafe extern "C" fn host_reduce_scatter(
    handle: usize,
    input: u64,
    output: u64,
    output_bytes: usize,
    dtype: *const c_char,
    op: *const c_char,
    out: *mut Failure,
) -> i32 {
    guarded(out, || {
        let (dtype, op) = parse(dtype, op)?;
        if output_bytes == 0 || output_bytes % dtype.size_bytes() != 0 {
            return Ok(DECLINED);
        }
        // Safety: the caller's contract (`host`).
        let comm = unsafe { host(handle) };
        let total = output_bytes.saturating_mul(comm.place().1);
        let (input, output) = (input as usize, output as usize);
        if overlaps((input, total), (output, output_bytes)) {
            return Ok(DECLINED);
        }
        let count = output_bytes / dtype.size_bytes();
        on_registered(comm, [(input, total), (output, output_bytes)], |c, bufs| {
            c.reduce_scatter(
                Bufs { send: bufs[0].slice(0, total), recv: bufs[1].slice(0, output_bytes) },
                count,
                dtype,
                op,
                None,
            )
        })
    })
}

/// A synchronous all_to_allv: `send_counts[j]` elements of `input` (packed by rank) to rank j,
/// `recv_counts[i]` elements from rank i into `output` (packed), `ranks` entries each;
/// registered memory both, not overlapping, neither empty. [`DECLINED`] otherwise, and where
/// the counts do not fit the tensors (the Python path says what is wrong).
#[allow(unsafe_code)]
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn host_all_to_allv(
    handle: usize,
    input: u64,
    input_bytes: usize,
    output: u64,
    output_bytes: usize,
    dtype: *const c_char,
    send_counts: *const u64,
    recv_counts: *const u64,
    ranks: usize,
    out: *mut Failure,
) -> i32 {
    guarded(out, || {
        let dtype = parse_dtype(dtype)?;
        let es = dtype.size_bytes();
        // Safety: the caller's contract (`host`).
        let comm = unsafe { host(handle) };
        let (rank, world) = comm.place();
        if send_counts.is_null() || recv_counts.is_null() || ranks != world {
            return Ok(DECLINED);
        }
        if input_bytes == 0 || output_bytes == 0 || input_bytes % es != 0 || output_bytes % es != 0 {
            return Ok(DECLINED);
        }
        let (input, output) = (input as usize, output as usize);
        if overlaps((input, input_bytes), (output, output_bytes)) {
            return Ok(DECLINED);
        }
        // Safety: the caller passes `ranks` counts on each side, alive for the call.
        let (send, recv) =
            unsafe { (std::slice::from_raw_parts(send_counts, ranks), std::slice::from_raw_parts(recv_counts, ranks)) };
        let (Ok(send), Ok(recv)) = (
            send.iter().map(|&c| usize::try_from(c)).collect::<Result<Vec<_>, _>>(),
            recv.iter().map(|&c| usize::try_from(c)).collect::<Result<Vec<_>, _>>(),
        ) else {
            return Ok(DECLINED);
        };
        let Ok(layout) =
            all_to_allv_layout(world, rank, (send, None, input_bytes / es), (recv, None, output_bytes / es))
        else {
            return Ok(DECLINED);
        };
        on_registered(comm, [(input, input_bytes), (output, output_bytes)], |c, bufs| {
            c.all_to_allv(
                Bufs { send: bufs[0].slice(0, input_bytes), recv: bufs[1].slice(0, output_bytes) },
                &layout,
                dtype,
                None,
            )
        })
    })
}
