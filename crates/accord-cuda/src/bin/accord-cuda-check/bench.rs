//! `--bench`: copy bandwidth in GB/s (10^9 bytes per second, bytes moved
//! once, not counted for read and write), timed with CUDA events.

use std::process::ExitCode;
use std::time::Instant;

use accord_cuda::{
    copy_peer_async, Availability, DeviceBuffer, DeviceCopy, Event, EventKind, Gpu, HostDeviceSpan, PinnedHostBuffer,
    Stream,
};
use serde::Serialize;

use crate::check_kit::step;

/// Untimed copies before measuring.
const WARMUP_ITERATIONS: usize = 3;
/// Timed copies per measurement.
const TIMED_ITERATIONS: usize = 20;
const MIB: usize = 1024 * 1024;

/// One measurement.
#[derive(Serialize)]
struct Measurement {
    name: String,
    size_bytes: usize,
    iterations: usize,
    gbps: f64,
}

/// Runs every measurement and prints a table (or JSON).
pub fn run(availability: &Availability, json: bool) -> ExitCode {
    match measure_all(availability) {
        Ok(rows) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&rows).unwrap_or_default());
            } else {
                println!("{:<40} {:>10} {:>6} {:>10}", "transfer", "MiB", "iters", "GB/s");
                for row in &rows {
                    println!("{:<40} {:>10} {:>6} {:>10.1}", row.name, row.size_bytes / MIB, row.iterations, row.gbps);
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Times `TIMED_ITERATIONS` runs of `issue` on `stream` with events.
fn time_on_stream(
    gpu: &Gpu,
    stream: &Stream,
    mut issue: impl FnMut() -> accord_cuda::Result<()>,
) -> Result<f64, String> {
    for _ in 0..WARMUP_ITERATIONS {
        step("warm-up copy", issue())?;
    }
    let start = step("event", Event::new(gpu, EventKind::Timing))?;
    let end = step("event", Event::new(gpu, EventKind::Timing))?;
    step("record start", start.record(stream))?;
    for _ in 0..TIMED_ITERATIONS {
        step("copy", issue())?;
    }
    step("record end", end.record(stream))?;
    step("sync", end.synchronize())?;
    let ms = step("elapsed", end.elapsed_ms_since(&start))?;
    Ok(ms as f64 / 1e3)
}

fn gbps(bytes: usize, iterations: usize, seconds: f64) -> f64 {
    (bytes * iterations) as f64 / seconds / 1e9
}

fn measure_all(availability: &Availability) -> Result<Vec<Measurement>, String> {
    let mut rows = Vec::new();
    let gpu0 = step("open gpu 0", Gpu::open(0))?;
    let stream0 = step("stream", Stream::new(&gpu0))?;
    let size = 256 * MIB;

    let src = step("alloc", DeviceBuffer::alloc(&gpu0, size))?;
    let mut dst = step("alloc", DeviceBuffer::alloc(&gpu0, size))?;
    let seconds = time_on_stream(&gpu0, &stream0, || dst.copy_from_device_async(DeviceCopy::whole(&src), &stream0))?;
    rows.push(Measurement {
        name: "D2D gpu0 (copy engine)".into(),
        size_bytes: size,
        iterations: TIMED_ITERATIONS,
        gbps: gbps(size, TIMED_ITERATIONS, seconds),
    });

    let mut pinned = step("pinned", PinnedHostBuffer::alloc(&gpu0, size))?;
    let seconds = time_on_stream(&gpu0, &stream0, || {
        pinned.copy_to_device_async(HostDeviceSpan::prefix(size), &mut dst, &stream0)
    })?;
    rows.push(Measurement {
        name: "H2D pinned gpu0".into(),
        size_bytes: size,
        iterations: TIMED_ITERATIONS,
        gbps: gbps(size, TIMED_ITERATIONS, seconds),
    });
    let seconds = time_on_stream(&gpu0, &stream0, || {
        pinned.copy_from_device_async(HostDeviceSpan::prefix(size), &src, &stream0)
    })?;
    rows.push(Measurement {
        name: "D2H pinned gpu0".into(),
        size_bytes: size,
        iterations: TIMED_ITERATIONS,
        gbps: gbps(size, TIMED_ITERATIONS, seconds),
    });
    drop((src, dst, pinned));

    if availability.device_count >= 2 {
        let gpu1 = step("open gpu 1", Gpu::open(1))?;
        step("peer access 0->1", gpu0.enable_peer_access(&gpu1))?;
        step("peer access 1->0", gpu1.enable_peer_access(&gpu0))?;
        let stream1 = step("stream gpu1", Stream::new(&gpu1))?;
        for size in [64 * MIB, 256 * MIB] {
            let on0 = step("alloc gpu0", DeviceBuffer::alloc(&gpu0, size))?;
            let on1 = step("alloc gpu1", DeviceBuffer::alloc(&gpu1, size))?;
            let on0b = step("alloc gpu0", DeviceBuffer::alloc(&gpu0, size))?;
            let on1b = step("alloc gpu1", DeviceBuffer::alloc(&gpu1, size))?;
            let seconds = time_on_stream(&gpu0, &stream0, || {
                copy_peer_async(on1.ptr(), &gpu1, on0.ptr(), &gpu0, size, &stream0)
            })?;
            rows.push(Measurement {
                name: "peer gpu0->gpu1 (copy engine)".into(),
                size_bytes: size,
                iterations: TIMED_ITERATIONS,
                gbps: gbps(size, TIMED_ITERATIONS, seconds),
            });
            let seconds = time_on_stream(&gpu1, &stream1, || {
                copy_peer_async(on0.ptr(), &gpu0, on1.ptr(), &gpu1, size, &stream1)
            })?;
            rows.push(Measurement {
                name: "peer gpu1->gpu0 (copy engine)".into(),
                size_bytes: size,
                iterations: TIMED_ITERATIONS,
                gbps: gbps(size, TIMED_ITERATIONS, seconds),
            });
            // Bidirectional: both directions at once, each on its source GPU's stream; wall clock
            // over both, bytes of both directions counted.
            let issue_both = || -> accord_cuda::Result<()> {
                copy_peer_async(on1.ptr(), &gpu1, on0.ptr(), &gpu0, size, &stream0)?;
                copy_peer_async(on0b.ptr(), &gpu0, on1b.ptr(), &gpu1, size, &stream1)
            };
            for _ in 0..WARMUP_ITERATIONS {
                step("warm-up", issue_both())?;
            }
            step("sync", stream0.synchronize().and(stream1.synchronize()))?;
            let start = Instant::now();
            for _ in 0..TIMED_ITERATIONS {
                step("bidirectional copy", issue_both())?;
            }
            step("sync", stream0.synchronize().and(stream1.synchronize()))?;
            let seconds = start.elapsed().as_secs_f64();
            rows.push(Measurement {
                name: "peer bidirectional (sum of both)".into(),
                size_bytes: size,
                iterations: TIMED_ITERATIONS,
                gbps: gbps(2 * size, TIMED_ITERATIONS, seconds),
            });
        }
    }
    Ok(rows)
}
