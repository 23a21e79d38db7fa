//! The check table: probe, memory, pinned mapping, events, IPC, peer copy;
//! kernel-based checks live in `checks_gpu_work`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use accord_cuda::{
    copy_peer_async, Availability, CudaError, DeviceBuffer, DeviceCopy, Event, EventKind, Gpu, HostDeviceSpan,
    HostRegistration, IpcHandle, IpcMapping, PinnedHostBuffer, Stream,
};

use crate::check_kit::{ensure, first_mismatch, pattern, step, timed, CheckResult, Row, Status};
use crate::{checks_gpu_work, IPC_CHILD_ENV, IPC_CHILD_GPU_ENV};

/// Longest the IPC child may run.
const IPC_CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs every check and prints the table (or JSON).
pub fn run(availability: &Availability, json: bool) -> ExitCode {
    let mut rows = vec![timed("probe", || probe_detail(availability))];
    let gpu0 = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            rows.push(Row { name: "open gpu 0", status: Status::Fail, elapsed_ms: 0.0, detail: e.to_string() });
            return print(rows, json);
        }
    };
    let gpu1 = if availability.device_count >= 2 { Gpu::open(1).ok() } else { None };
    rows.push(timed("device memory", || device_memory(&gpu0)));
    rows.push(timed("pinned + registered host memory", || pinned_memory(&gpu0)));
    rows.push(timed("events", || events(&gpu0)));
    rows.push(timed("ipc export/open (child process)", || ipc(&gpu0, availability.device_count)));
    rows.push(timed("peer copy gpu0<->gpu1", || peer_copy(&gpu0, gpu1.as_ref())));
    rows.extend(checks_gpu_work::run(&gpu0, availability));
    print(rows, json)
}

fn print(rows: Vec<Row>, json: bool) -> ExitCode {
    let failed = rows.iter().any(|r| r.status == Status::Fail);
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap_or_default());
    } else {
        println!("{:<34} {:<5} {:>9}  detail", "check", "ok", "ms");
        for row in &rows {
            let status = match row.status {
                Status::Pass => "pass",
                Status::Fail => "FAIL",
                Status::Skip => "skip",
            };
            println!("{:<34} {:<5} {:>9.1}  {}", row.name, status, row.elapsed_ms, row.detail);
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn probe_detail(availability: &Availability) -> CheckResult {
    let devices: Vec<String> = availability
        .devices
        .iter()
        .map(|d| {
            format!(
                "#{} {} sm_{}{} {} GiB {}",
                d.ordinal,
                d.name,
                d.compute_capability.0,
                d.compute_capability.1,
                d.memory_bytes >> 30,
                d.pci_bus_id
            )
        })
        .collect();
    Ok(format!(
        "driver {} nvrtc {}.{} ({}); {}",
        availability.driver_version,
        availability.nvrtc_version.0,
        availability.nvrtc_version.1,
        availability.nvrtc_problem.as_deref().unwrap_or("loaded"),
        devices.join("; ")
    ))
}

fn device_memory(gpu: &Gpu) -> CheckResult {
    let len = 3 * 1024 * 1024 + 5;
    let stream = step("create stream", Stream::new(gpu))?;
    let mut a = step("alloc a", DeviceBuffer::alloc(gpu, len))?;
    let mut b = step("alloc b", DeviceBuffer::alloc(gpu, len))?;
    let data = pattern(len, 7);
    step("H2D", a.copy_from_host(0, &data, &stream))?;
    step("memset b", b.memset_async(0, len, 0xEE, &stream))?;
    let copy = DeviceCopy { src: &a, src_offset_bytes: 1, dst_offset_bytes: 3, len_bytes: len - 10 };
    step("D2D with offsets", b.copy_from_device_async(copy, &stream))?;
    let mut back = vec![0u8; len];
    step("D2H", b.copy_to_host(0, &mut back, &stream))?;
    let mut want = vec![0xEEu8; len];
    want[3..3 + len - 10].copy_from_slice(&data[1..1 + len - 10]);
    if let Some(i) = first_mismatch(&back, &want) {
        return Err(format!("byte {i}: got {} want {}", back[i], want[i]));
    }
    // Bounds are enforced before the driver sees anything.
    let too_long = copy_peer_async(b.ptr(), gpu, a.ptr(), gpu, len + 1, &stream);
    ensure(matches!(too_long, Err(CudaError::BadDeviceRange { .. })), || {
        format!("copy past the allocation was not refused: {too_long:?}")
    })?;
    Ok(format!("{len} B H2D, D2D at offsets, memset, D2H verified; overlong copy refused"))
}

fn pinned_memory(gpu: &Gpu) -> CheckResult {
    let len = 8 * 1024 * 1024;
    let stream = step("create stream", Stream::new(gpu))?;
    let mut src = step("cuMemHostAlloc src", PinnedHostBuffer::alloc(gpu, len))?;
    let mut dst = step("cuMemHostAlloc dst", PinnedHostBuffer::alloc(gpu, len))?;
    let mut device = step("alloc device", DeviceBuffer::alloc(gpu, len))?;
    let data = pattern(len, 11);
    src.as_mut_slice().copy_from_slice(&data);
    step("pinned H2D", src.copy_to_device_async(HostDeviceSpan::prefix(len), &mut device, &stream))?;
    step("pinned D2H", dst.copy_from_device_async(HostDeviceSpan::prefix(len), &device, &stream))?;
    step("sync", stream.synchronize())?;
    if let Some(i) = first_mismatch(dst.as_slice(), &data) {
        return Err(format!("pinned round trip differs at byte {i}"));
    }
    ensure(src.device_ptr().0 != 0, || "mapped device pointer is null".into())?;
    // The copy engine reads the pinned pages through their device pointer.
    let mut device2 = step("alloc device2", DeviceBuffer::alloc(gpu, len))?;
    step("memset device2", device2.memset_async(0, len, 0, &stream))?;
    step("copy from mapped pointer", copy_peer_async(device2.ptr(), gpu, src.device_ptr(), gpu, len, &stream))?;
    let mut back = vec![0u8; len];
    step("D2H", device2.copy_to_host(0, &mut back, &stream))?;
    if let Some(i) = first_mismatch(&back, &data) {
        return Err(format!("copy through the mapped device pointer differs at byte {i}"));
    }
    // Registered host memory, reached through its device pointer.
    let registered_data = pattern(len, 13);
    let registration = step("cuMemHostRegister", HostRegistration::new(gpu, registered_data.clone()))?;
    step(
        "copy from registered pointer",
        copy_peer_async(device2.ptr(), gpu, registration.device_ptr(), gpu, len, &stream),
    )?;
    step("D2H", device2.copy_to_host(0, &mut back, &stream))?;
    if let Some(i) = first_mismatch(&back, &registered_data) {
        return Err(format!("copy from registered memory differs at byte {i}"));
    }
    let returned = step("cuMemHostUnregister", registration.into_inner())?;
    ensure(returned == registered_data, || "registered vector changed".into())?;
    Ok(format!("{} MiB pinned round trip, mapped and registered pointers read by the copy engine", len >> 20))
}

fn events(gpu: &Gpu) -> CheckResult {
    let len = 256 * 1024 * 1024;
    let stream = step("create stream", Stream::new(gpu))?;
    let mut buffer = step("alloc", DeviceBuffer::alloc(gpu, len))?;
    let start = step("event", Event::new(gpu, EventKind::Timing))?;
    let end = step("event", Event::new(gpu, EventKind::Timing))?;
    step("record start", start.record(&stream))?;
    step("memset", buffer.memset_async(0, len, 1, &stream))?;
    step("record end", end.record(&stream))?;
    step("host wait on event", end.wait_timeout(Duration::from_secs(10)))?;
    let ms = step("elapsed", end.elapsed_ms_since(&start))?;
    ensure(ms > 0.0, || format!("elapsed time {ms} ms is not positive"))?;
    Ok(format!("memset 256 MiB took {ms:.3} ms ({:.0} GB/s)", len as f64 / (ms as f64 * 1e6)))
}

fn ipc(gpu: &Gpu, device_count: usize) -> CheckResult {
    let len = 4 * 1024 * 1024;
    let stream = step("create stream", Stream::new(gpu))?;
    let mut buffer = step("alloc", DeviceBuffer::alloc(gpu, len))?;
    let data = pattern(len, 17);
    step("H2D", buffer.copy_from_host(0, &data, &stream))?;
    let handle = step("cuIpcGetMemHandle", IpcHandle::export(&buffer))?;
    let parsed = IpcHandle::from_hex(&handle.to_hex()).map_err(|e| e.to_string())?;
    ensure(parsed == handle, || "handle changed in a hex round trip".into())?;
    let own = IpcMapping::open(gpu, &handle);
    ensure(matches!(own, Err(CudaError::IpcOpen { .. })), || {
        format!("opening in the exporter was not refused: {own:?}")
    })?;

    let child_gpu = if device_count >= 2 { 1 } else { 0 };
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut child = std::process::Command::new(exe)
        .env(IPC_CHILD_ENV, handle.to_hex())
        .env(IPC_CHILD_GPU_ENV, child_gpu.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn child: {e}"))?;
    let child_pid = child.id();
    let deadline = Instant::now() + IPC_CHILD_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                return Err("the IPC child did not finish in time".into());
            }
            Err(e) => return Err(format!("waiting for the child: {e}")),
        }
    };
    let output = child.wait_with_output().map_err(|e| format!("child output: {e}"))?;
    let child_text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout).trim(), String::from_utf8_lossy(&output.stderr).trim());
    ensure(status.success(), || format!("child (gpu {child_gpu}) failed: {child_text}"))?;

    // The child overwrote the first half with 0x5A.
    let mut back = vec![0u8; len];
    step("D2H after child", buffer.copy_to_host(0, &mut back, &stream))?;
    let mut want = data.clone();
    want[..len / 2].fill(0x5A);
    if let Some(i) = first_mismatch(&back, &want) {
        return Err(format!("after the child wrote, byte {i} is {} not {}", back[i], want[i]));
    }
    // A handle whose exporter exited is refused before the driver sees it.
    let stale = IpcHandle::from_parts(*handle.raw(), handle.len_bytes(), child_pid);
    let stale_open = IpcMapping::open(gpu, &stale);
    ensure(matches!(stale_open, Err(CudaError::IpcOpen { .. })), || {
        format!("a handle of an exited process was not refused: {stale_open:?}")
    })?;
    Ok(format!("child on gpu {child_gpu} read and wrote 4 MiB through the handle ({child_text}); own-process and stale opens refused"))
}

fn peer_copy(gpu0: &Gpu, gpu1: Option<&Gpu>) -> CheckResult {
    let Some(gpu1) = gpu1 else { return Ok("skip: needs 2 GPUs".into()) };
    let can = step("cuDeviceCanAccessPeer", gpu0.can_access_peer(gpu1))?;
    let enabled01 = step("enable 0->1", gpu0.enable_peer_access(gpu1))?;
    let enabled10 = step("enable 1->0", gpu1.enable_peer_access(gpu0))?;
    let len = 64 * 1024 * 1024;
    let stream0 = step("stream gpu0", Stream::new(gpu0))?;
    let stream1 = step("stream gpu1", Stream::new(gpu1))?;
    let mut src = step("alloc gpu0", DeviceBuffer::alloc(gpu0, len))?;
    let mut dst = step("alloc gpu1", DeviceBuffer::alloc(gpu1, len))?;
    let data = pattern(len, 23);
    step("H2D gpu0", src.copy_from_host(0, &data, &stream0))?;
    step("memset gpu1", dst.memset_async(0, len, 0, &stream1))?;
    step("sync gpu1", stream1.synchronize())?;
    step("peer copy 0->1", copy_peer_async(dst.ptr(), gpu1, src.ptr(), gpu0, len, &stream0))?;
    step("sync gpu0", stream0.synchronize())?;
    let mut back = vec![0u8; len];
    step("D2H gpu1", dst.copy_to_host(0, &mut back, &stream1))?;
    if let Some(i) = first_mismatch(&back, &data) {
        return Err(format!("GPU1 copy differs at byte {i}"));
    }
    // And back, on a stream of the destination GPU.
    step("memset gpu0", src.memset_async(0, len, 0, &stream0))?;
    step("sync gpu0", stream0.synchronize())?;
    step("peer copy 1->0", copy_peer_async(src.ptr(), gpu0, dst.ptr(), gpu1, len, &stream0))?;
    step("D2H gpu0", src.copy_to_host(0, &mut back, &stream0))?;
    if let Some(i) = first_mismatch(&back, &data) {
        return Err(format!("copy back to GPU0 differs at byte {i}"));
    }
    Ok(format!("64 MiB each way verified; can_access_peer={can}, enable: {enabled01:?}/{enabled10:?}"))
}
