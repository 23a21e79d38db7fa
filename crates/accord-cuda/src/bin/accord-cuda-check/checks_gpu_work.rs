//! Checks that run kernels: NVRTC reductions against the CPU, and stream
//! ordering with host functions, events and the stall kernel.

use std::time::Duration;

use accord_cuda::reduce::host_reference::{reduce_bytes, sample_input};
use accord_cuda::{
    signal_when_done, Availability, DType, DeviceBuffer, Event, EventKind, Gpu, PinnedHostBuffer, ReduceOp,
    ReduceOpKind, Reducer, StallGate, StallOutcome, Stream,
};

use crate::check_kit::{ensure, first_mismatch, step, timed, CheckResult, Row};

/// Elements per reduction check: odd, so the scalar tail runs after the vector loop.
const REDUCE_COUNT: usize = 1_000_003;

/// Runs the kernel checks through `timed`.
pub fn run(gpu: &Gpu, availability: &Availability) -> Vec<Row> {
    if !availability.nvrtc {
        let reason = availability.nvrtc_problem.clone().unwrap_or_default();
        return ["nvrtc reductions (5 ops x 5 types)", "host fn + event ordering", "stall kernel ordering"]
            .into_iter()
            .map(|name| Row {
                name,
                status: crate::check_kit::Status::Fail,
                elapsed_ms: 0.0,
                detail: format!("no NVRTC: {reason}"),
            })
            .collect();
    }
    let gpu_a = gpu.clone();
    let gpu_b = gpu.clone();
    let gpu_c = gpu.clone();
    vec![
        timed("nvrtc reductions (5 ops x 5 types)", move || reductions(&gpu_a)),
        timed("host fn + event ordering", move || host_fn_ordering(&gpu_b)),
        timed("stall kernel ordering", move || stall_ordering(&gpu_c)),
    ]
}

fn ops() -> [ReduceOp; 5] {
    [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg { divisor: 3 }]
}

fn reductions(gpu: &Gpu) -> CheckResult {
    let reducer = step("compile + load reduction kernels", Reducer::new(gpu))?;
    let stream = step("stream", Stream::new(gpu))?;
    let mut failures = Vec::new();
    let mut passed = 0;
    for dtype in DType::ALL {
        let size = dtype.size_bytes();
        let len = REDUCE_COUNT * size;
        // One spare element each, so the misaligned variant stays in bounds.
        let mut a = step("alloc a", DeviceBuffer::alloc(gpu, len + size))?;
        let mut b = step("alloc b", DeviceBuffer::alloc(gpu, len + size))?;
        let dst = step("alloc dst", DeviceBuffer::alloc(gpu, len + size))?;
        let a_host = sample_input(dtype, REDUCE_COUNT + 1, 1 + size as u64);
        let b_host = sample_input(dtype, REDUCE_COUNT + 1, 2 + size as u64);
        step("H2D a", a.copy_from_host(0, &a_host, &stream))?;
        step("H2D b", b.copy_from_host(0, &b_host, &stream))?;
        for op in ops() {
            // Aligned (vectorised) over REDUCE_COUNT elements, then misaligned by one element (scalar).
            for shift in [0usize, 1] {
                let offset = shift * size;
                let result = reducer.reduce(
                    dst.ptr().offset(offset),
                    a.ptr().offset(offset),
                    b.ptr().offset(offset),
                    REDUCE_COUNT,
                    dtype,
                    op,
                    &stream,
                );
                step(&format!("reduce {:?} {}", op.kind(), dtype.name()), result)?;
                let mut got = vec![0u8; len];
                step("D2H", dst.copy_to_host(offset, &mut got, &stream))?;
                let want = reduce_bytes(dtype, op, &a_host[offset..offset + len], &b_host[offset..offset + len]);
                match first_mismatch(&got, &want) {
                    None => passed += 1,
                    Some(i) => failures.push(format!(
                        "{}/{} shift {shift}: element {} got {:?} want {:?}",
                        op.kind().name(),
                        dtype.name(),
                        i / size,
                        &got[i / size * size..(i / size + 1) * size],
                        &want[i / size * size..(i / size + 1) * size]
                    )),
                }
            }
        }
        // In place: a = a + b.
        let a_ptr = a.ptr();
        step("in-place reduce", reducer.reduce(a_ptr, a_ptr, b.ptr(), REDUCE_COUNT, dtype, ReduceOp::Sum, &stream))?;
        let mut got = vec![0u8; len];
        step("D2H", a.copy_to_host(0, &mut got, &stream))?;
        let want = reduce_bytes(dtype, ReduceOp::Sum, &a_host[..len], &b_host[..len]);
        match first_mismatch(&got, &want) {
            None => passed += 1,
            Some(i) => failures.push(format!("in-place sum/{} differs at element {}", dtype.name(), i / size)),
        }
    }
    ensure(failures.is_empty(), || format!("{} failed: {}", failures.len(), failures.join("; ")))?;
    Ok(format!(
        "{passed} cases bit-exact vs CPU ({} ops x {} types, aligned + misaligned, + in-place), {REDUCE_COUNT} elements",
        ReduceOpKind::ALL.len(),
        DType::ALL.len()
    ))
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(|v| v.to_le_bytes()).collect()
}

/// A kernel writes into pinned host memory; the host reads it right after
/// the host function fires (or the event completes), with no other sync.
fn host_fn_ordering(gpu: &Gpu) -> CheckResult {
    let count = 16 * 1024 * 1024;
    let len = count * 4;
    let reducer = step("reduction kernels", Reducer::with_types(gpu, &[DType::F32]))?;
    let stream = step("stream", Stream::new(gpu))?;
    let mut a = step("alloc a", DeviceBuffer::alloc(gpu, len))?;
    let mut b = step("alloc b", DeviceBuffer::alloc(gpu, len))?;
    let out = step("pinned out", PinnedHostBuffer::alloc(gpu, len))?;
    let a_host = f32_bytes((0..count).map(|i| (i % 1000) as f32));
    let b_host = f32_bytes((0..count).map(|i| (i % 7) as f32));
    step("H2D a", a.copy_from_host(0, &a_host, &stream))?;
    step("H2D b", b.copy_from_host(0, &b_host, &stream))?;

    step(
        "reduce into pinned",
        reducer.reduce(out.device_ptr(), a.ptr(), b.ptr(), count, DType::F32, ReduceOp::Sum, &stream),
    )?;
    let waiter = step("cuLaunchHostFunc", signal_when_done(&stream))?;
    step("wait for host fn", waiter.wait(Duration::from_secs(20)))?;
    let want = reduce_bytes(DType::F32, ReduceOp::Sum, &a_host, &b_host);
    if let Some(i) = first_mismatch(out.as_slice(), &want) {
        return Err(format!("host fn fired before the kernel's writes were visible (byte {i})"));
    }

    let event = step("event", Event::new(gpu, EventKind::SyncOnly))?;
    step(
        "reduce max into pinned",
        reducer.reduce(out.device_ptr(), a.ptr(), b.ptr(), count, DType::F32, ReduceOp::Max, &stream),
    )?;
    step("record", event.record(&stream))?;
    step("host wait on event", event.wait_timeout(Duration::from_secs(20)))?;
    let want = reduce_bytes(DType::F32, ReduceOp::Max, &a_host, &b_host);
    if let Some(i) = first_mismatch(out.as_slice(), &want) {
        return Err(format!("event completed before the kernel's writes were visible (byte {i})"));
    }
    Ok(format!("{} MiB written by a kernel into pinned memory, complete at host fn and at event", len >> 20))
}

/// A stall holds back a kernel that reads host memory until the host wrote
/// it and released the stall; a never-released stall times out.
fn stall_ordering(gpu: &Gpu) -> CheckResult {
    let count = 1024 * 1024;
    let len = count * 4;
    let gate = step("compile + load stall kernel", StallGate::new(gpu))?;
    let reducer = step("reduction kernels", Reducer::with_types(gpu, &[DType::F32]))?;
    let stream = step("stream", Stream::new(gpu))?;
    let mut input = step("pinned in", PinnedHostBuffer::alloc(gpu, len))?;
    let out = step("pinned out", PinnedHostBuffer::alloc(gpu, len))?;
    let mut b = step("alloc b", DeviceBuffer::alloc(gpu, len))?;
    let b_host = f32_bytes((0..count).map(|i| (i % 5) as f32));
    step("H2D b", b.copy_from_host(0, &b_host, &stream))?;

    let ticket = step("launch stall", gate.stall(&stream, Duration::from_secs(20)))?;
    step(
        "queue reduce",
        reducer.reduce(out.device_ptr(), input.device_ptr(), b.ptr(), count, DType::F32, ReduceOp::Sum, &stream),
    )?;
    let done = step("cuLaunchHostFunc", signal_when_done(&stream))?;
    std::thread::sleep(Duration::from_millis(200));
    ensure(!done.is_signalled(), || "the stream ran past the stall before release".into())?;
    ensure(out.as_slice().iter().all(|b| *b == 0), || "the reduce ran before the stall was released".into())?;
    ensure(gate.outcome(ticket) == StallOutcome::Pending, || {
        format!("outcome before release: {:?}", gate.outcome(ticket))
    })?;
    let a_host = f32_bytes((0..count).map(|i| (i % 11) as f32 + 0.5));
    input.as_mut_slice().copy_from_slice(&a_host);
    gate.release(ticket);
    step("wait after release", done.wait(Duration::from_secs(20)))?;
    ensure(gate.outcome(ticket) == StallOutcome::Released, || {
        format!("outcome after release: {:?}", gate.outcome(ticket))
    })?;
    let want = reduce_bytes(DType::F32, ReduceOp::Sum, &a_host, &b_host);
    if let Some(i) = first_mismatch(out.as_slice(), &want) {
        return Err(format!("the reduce did not see the host's data written before release (byte {i})"));
    }

    let lost = step("launch stall (never released)", gate.stall(&stream, Duration::from_millis(50)))?;
    step("sync after timeout", stream.synchronize())?;
    ensure(gate.outcome(lost) == StallOutcome::TimedOut, || format!("unreleased stall: {:?}", gate.outcome(lost)))?;
    Ok("stream held 200 ms until release, kernel saw host data; unreleased stall timed out after 50 ms".into())
}
