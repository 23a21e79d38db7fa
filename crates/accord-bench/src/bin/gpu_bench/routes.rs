//! The routes between host and device memory, receiver in a child process on this host:
//!
//! - `--route staged`: device memory here -> a host region of the child, staged through the
//!   engine's pinned slots over the transport (shared-memory rings on one host). Baselines from
//!   the same run: a raw device-to-host copy of the same size into pinned memory (the staging
//!   copy alone) and an engine host -> host write of the same size into the same region (the
//!   transport alone).
//! - `--route staged-d2d`: device memory here -> the child's device region with CUDA IPC off
//!   here (`device_ipc` false: the route a peer on another host takes): staged through this
//!   engine's pinned slots, landed in the child's pinned landing slots, copied host-to-device
//!   there. Baselines as for `staged` (raw device-to-host copy into pinned memory, engine host
//!   write into the child's host region).
//! - `--route h2d`: pinned host memory here, registered as a host region -> the child's device
//!   region through CUDA IPC. Baseline: a raw host-to-device copy from the same pinned memory
//!   into the same IPC mapping.
//!
//! Each reports `--window` writes in flight and one write at a time (waited for, immediate
//! acknowledged). `ACCORD_DEVICE_STAGING_CHUNK_BYTES` / `_CHUNKS` size the staging pool.

use std::error::Error;
use std::io::Lines;
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use accord_cuda::{DeviceBuffer, Gpu, HostDeviceSpan, IpcHandle, IpcMapping, PinnedHostBuffer, Stream};
use accord_engine::{Engine, EngineAddress, EngineConfig, MemoryKind, MrDescriptor, Transfer, WriteOp};

use super::{arg, pattern, sizes_arg, IMM};

const WAIT: Duration = Duration::from_secs(60);

/// Seconds for `iters` submissions with at most `window` in flight.
fn timed(
    iters: usize,
    window: usize,
    mut submit: impl FnMut() -> Result<Transfer, Box<dyn Error>>,
) -> Result<f64, Box<dyn Error>> {
    let t = Instant::now();
    let mut flight = std::collections::VecDeque::with_capacity(window);
    for _ in 0..iters {
        if flight.len() == window {
            let oldest: Transfer = flight.pop_front().expect("window is full");
            oldest.wait_timeout(WAIT)?;
        }
        flight.push_back(submit()?);
    }
    for transfer in flight {
        transfer.wait_timeout(WAIT)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> Result<String, Box<dyn Error>> {
    Ok(lines.next().ok_or("the child ended early")??)
}

pub(crate) fn run(route: &str, args: &[String]) -> Result<(), Box<dyn Error>> {
    let (staged, d2d) = match route {
        "staged" => (true, false),
        "staged-d2d" => (true, true),
        "h2d" => (false, false),
        other => return Err(format!("unknown route {other:?}: use staged, staged-d2d or h2d").into()),
    };
    let sizes = sizes_arg(args);
    let iters: usize = arg(args, "--iters", 20).max(1);
    let window: usize = arg(args, "--window", 4).max(1);
    let (src_ordinal, dst_ordinal): (usize, usize) = (arg(args, "--src", 0), arg(args, "--dst", 1));
    if let Some(reason) = accord_cuda::probe().skip_reason(src_ordinal.max(dst_ordinal) + 1, false) {
        println!("skipped: {reason}");
        return Ok(());
    }
    let largest = sizes.iter().copied().max().ok_or("no sizes")?;
    let gpu = Gpu::open(src_ordinal)?;
    let stream = Stream::new(&gpu)?;
    let a = if d2d {
        // The child's device region as if it were on another host (ACCORD_DEVICE_IPC=0 here).
        Engine::builder().config(EngineConfig { device_ipc: false, ..Default::default() }).build()?
    } else {
        Engine::builder().build()?
    };
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--child", "--dst", &dst_ordinal.to_string(), "--bytes", &largest.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("child stdout")?).lines();
    let peer = EngineAddress::parse(&next_line(&mut lines)?)?;
    let dev_d = MrDescriptor::parse(&next_line(&mut lines)?)?;
    let host_d = MrDescriptor::parse(&next_line(&mut lines)?)?;
    a.add_peer(&peer)?;
    let mut stdin = child.stdin.take().ok_or("child stdin")?;
    writeln!(stdin, "{}", a.address().to_string_compact())?;
    stdin.flush()?;

    let mut src = DeviceBuffer::alloc(&gpu, largest)?;
    src.copy_from_host(0, &pattern(largest), &stream)?;
    let mut pinned = PinnedHostBuffer::alloc(&gpu, largest)?;
    pinned.as_mut_slice().copy_from_slice(&pattern(largest));
    // Safety: both buffers outlive every transfer (all are waited for before they drop).
    #[allow(unsafe_code)]
    let (dev_h, _) = unsafe {
        a.register_raw(src.ptr().0 as *mut u8, largest, MemoryKind::CudaDevice { ordinal: src_ordinal as u32 })
    }?;
    #[allow(unsafe_code)]
    let (pinned_h, _) = unsafe { a.register_raw(pinned.host_ptr(), largest, MemoryKind::Host) }?;
    let mapping = if staged {
        None
    } else {
        let info = dev_d.device.ok_or("child descriptor is not of device memory")?;
        let handle = IpcHandle::from_bytes(&info.ipc.ok_or("child region not exportable")?.0)?;
        let mapping = IpcMapping::open(&gpu, &handle)?;
        let ptr = mapping.ptr().offset(info.alloc_offset as usize);
        Some((mapping, ptr))
    };

    let what = match (staged, d2d) {
        (true, false) => "device -> child's host region, staged",
        (true, true) => "device -> child's device region, staged here and landed there (no IPC)",
        _ => "pinned host -> child's device, IPC",
    };
    println!("{what} (GPU{src_ordinal}, child GPU{dst_ordinal}), {iters} iterations, window {window}");
    if staged {
        println!(
            "{:>10} {:>11} {:>13} {:>12} {:>9} {:>9} {:>12}",
            "size", "raw DtoH", "host write", "staged win", "vs DtoH", "vs host", "staged 1x1"
        );
    } else {
        println!(
            "{:>10} {:>11} {:>12} {:>9} {:>12} {:>9}",
            "size", "raw HtoD", "engine win", "ratio", "engine 1x1", "ratio"
        );
    }
    let mut imm_target = 0u64;
    for &size in &sizes {
        let gbps = |secs: f64| (size * iters) as f64 / secs / 1e9;
        // The raw copy, back to back on one stream.
        let t = Instant::now();
        for _ in 0..iters {
            match &mapping {
                None => pinned.copy_from_device_async(HostDeviceSpan::prefix(size), &src, &stream)?,
                Some((_, ptr)) => {
                    // Safety: the pinned buffer outlives the copy (synchronised below).
                    #[allow(unsafe_code)]
                    unsafe {
                        accord_cuda::copy_host_to_device_async(*ptr, pinned.host_ptr(), size, &stream)?
                    }
                }
            }
        }
        stream.synchronize()?;
        let raw = gbps(t.elapsed().as_secs_f64());
        let op = if d2d {
            WriteOp { src: &dev_h, src_offset: 0, dst: &dev_d, dst_offset: 0, len: size as u64, imm: Some(IMM) }
        } else if staged {
            WriteOp { src: &dev_h, src_offset: 0, dst: &host_d, dst_offset: 0, len: size as u64, imm: Some(IMM) }
        } else {
            WriteOp { src: &pinned_h, src_offset: 0, dst: &dev_d, dst_offset: 0, len: size as u64, imm: Some(IMM) }
        };
        a.write(&op)?.wait_timeout(WAIT)?; // warm-up: pool, mappings, connections
        imm_target += 1;
        let windowed = gbps(timed(iters, window, || Ok(a.write(&op)?))?);
        let single = gbps(timed(iters, 1, || Ok(a.write(&op)?))?);
        imm_target += 2 * iters as u64;
        if staged {
            let host_op = WriteOp { src: &pinned_h, dst: &host_d, imm: None, ..op };
            let host = gbps(timed(iters, window, || Ok(a.write(&host_op)?))?);
            // The host write left the same pattern in place, so the final check still holds.
            println!(
                "{:>6} MiB {raw:>11.1} {host:>13.1} {windowed:>12.1} {:>9.3} {:>9.3} {single:>12.1}",
                size >> 20,
                windowed / raw,
                windowed / host
            );
            println!(
                "{{\"bench\":\"engine_gpu_route\",\"route\":\"{route}\",\"bytes\":{size},\"iters\":{iters},\"window\":{window},\"raw_dtoh_gbps\":{raw:.2},\"host_write_gbps\":{host:.2},\"staged_window_gbps\":{windowed:.2},\"staged_vs_dtoh\":{:.4},\"staged_vs_host_write\":{:.4},\"staged_single_gbps\":{single:.2}}}",
                windowed / raw,
                windowed / host
            );
        } else {
            println!(
                "{:>6} MiB {raw:>11.1} {windowed:>12.1} {:>9.3} {single:>12.1} {:>9.3}",
                size >> 20,
                windowed / raw,
                single / raw
            );
            println!(
                "{{\"bench\":\"engine_gpu_route\",\"route\":\"h2d\",\"bytes\":{size},\"iters\":{iters},\"window\":{window},\"raw_htod_gbps\":{raw:.2},\"engine_window_gbps\":{windowed:.2},\"window_ratio\":{:.4},\"engine_single_gbps\":{single:.2},\"single_ratio\":{:.4}}}",
                windowed / raw,
                single / raw
            );
        }
    }
    writeln!(stdin, "verify {imm_target} {largest} {}", if staged && !d2d { "host" } else { "device" })?;
    stdin.flush()?;
    let verdict = next_line(&mut lines)?;
    println!("receiver: {verdict}");
    child.wait()?;
    drop(mapping);
    if !verdict.starts_with("ok") {
        return Err("the receiver saw wrong bytes or counts".into());
    }
    Ok(())
}
