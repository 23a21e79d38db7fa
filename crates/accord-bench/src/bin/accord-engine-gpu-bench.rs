//! GPU0 -> GPU1 write bandwidth through the engine's device route, next to the raw copy-engine
//! ceiling (`cuMemcpyPeerAsync` between the same buffers, peer access on) measured in the same
//! run. Two engines in this process; each engine write carries an immediate and counts as done
//! when the receiver's counter moved (the copy completed, then the immediate landed).
//!
//! With `--ipc` the receiving engine runs in a child process (same host): the write goes through
//! the descriptor's CUDA IPC handle, the immediate over the engine's network transport, and the
//! ceiling is a raw copy into the same IPC mapping. The child checks the bytes and the count.
//!
//! Three engine figures per size: `--window N` writes in flight (default 4; throughput, compared
//! with the ceiling's back-to-back copies), one write at a time (each waited for before the
//! next: the copy, the completion poll and the immediate's trip all count), compared with raw
//! copies one at a time (copy, then synchronise the stream) as well; and one write at a time
//! without an immediate (done when the poller saw the copy complete), which splits the
//! one-at-a-time gap into the poller's share and the immediate's.
//!
//! With `--route staged`, `--route staged-d2d` or `--route h2d` it measures the routes between host and device memory
//! instead (receiver in a child process; see `gpu_bench/routes.rs`).
//!
//! Usage: accord-engine-gpu-bench [--ipc | --route staged|staged-d2d|h2d] [--sizes-mib 64,256] [--iters 20] [--window 4]
//!        [--src 0] [--dst 1]
//! Prints a table and one JSON line per size.

#[path = "gpu_bench/routes.rs"]
mod routes;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use accord_bench::arrivals::{format_arrivals, monotonic_ns, parse_arrivals, watch_arrivals};
use accord_cuda::{copy_peer_async, DeviceBuffer, DevicePtr, Gpu, IpcHandle, IpcMapping, Stream};
use accord_engine::{Engine, EngineAddress, MemoryKind, MrDescriptor, WriteOp};

const IMM: u32 = 1;

/// The median of `values` (0 when empty).
fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(131) >> 3) as u8).collect()
}

/// The receiving side of `--ipc` and `--route`: registers a device buffer and a host region,
/// hands out its address and both descriptors on stdout, then checks the count and the bytes
/// of the region named in the verify line (`verify COUNT SIZE device|host`).
fn child(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let ordinal: usize = arg(args, "--dst", 1);
    let bytes: usize = arg(args, "--bytes", 1 << 20);
    let gpu = Gpu::open(ordinal)?;
    let stream = Stream::new(&gpu)?;
    let engine = Engine::builder().build()?;
    let dst = DeviceBuffer::alloc(&gpu, bytes)?;
    // Safety: the buffer outlives the engine's use (this process ends after the check).
    #[allow(unsafe_code)]
    let (_, d) = unsafe {
        engine.register_raw(dst.ptr().0 as *mut u8, bytes, MemoryKind::CudaDevice { ordinal: ordinal as u32 })
    }?;
    let host = engine.alloc(bytes)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", engine.address().to_string_compact())?;
    writeln!(out, "{}", d.to_string_compact())?;
    writeln!(out, "{}", host.descriptor().to_string_compact())?;
    out.flush()?;
    let mut lines = BufReader::new(std::io::stdin()).lines();
    let peer = EngineAddress::parse(&lines.next().ok_or("no peer address")??)?;
    engine.add_peer(&peer)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = watch_arrivals(engine.imm_counter(IMM), stop.clone());
    let verify = lines.next().ok_or("no verify line")??;
    let words: Vec<&str> = verify.split_whitespace().collect();
    let nums: Vec<u64> = words.iter().skip(1).filter_map(|v| v.parse().ok()).collect();
    let (count, size) = (nums[0], nums[1] as usize);
    let got = engine.imm_counter(IMM).wait(count, Duration::from_secs(30));
    let mut landed = vec![0u8; size];
    if words.get(3) == Some(&"host") {
        host.read_at(0, &mut landed)?;
    } else {
        dst.copy_to_host(0, &mut landed, &stream)?;
    }
    let ok = got == count && landed == pattern(size);
    writeln!(
        out,
        "{} count {got} of {count}, {size} bytes {}",
        if ok { "ok" } else { "bad" },
        if landed == pattern(size) { "match" } else { "differ" }
    )?;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let arrivals = watcher.join().map_err(|_| "watcher panicked")?;
    writeln!(out, "arrivals {}", format_arrivals(&arrivals))?;
    out.flush()?;
    Ok(())
}

/// `--sizes-mib 64,256` in bytes.
fn sizes_arg(args: &[String]) -> Vec<usize> {
    args.iter()
        .position(|a| a == "--sizes-mib")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| "64,256".to_string(), |s| s.clone())
        .split(',')
        .filter_map(|s| s.trim().parse::<usize>().ok())
        .map(|m| m << 20)
        .collect()
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--child") {
        return child(&args);
    }
    if let Some(route) = args.iter().position(|a| a == "--route").and_then(|i| args.get(i + 1)) {
        return routes::run(route, &args);
    }
    let ipc = args.iter().any(|a| a == "--ipc");
    let sizes = sizes_arg(&args);
    let iters: usize = arg(&args, "--iters", 20).max(1);
    let window: usize = arg(&args, "--window", 4).max(1);
    let (src_ordinal, dst_ordinal): (usize, usize) = (arg(&args, "--src", 0), arg(&args, "--dst", 1));
    if let Some(reason) = accord_cuda::probe().skip_reason(src_ordinal.max(dst_ordinal) + 1, false) {
        println!("skipped: {reason}");
        return Ok(());
    }
    let (ga, gb) = (Gpu::open(src_ordinal)?, Gpu::open(dst_ordinal)?);
    ga.enable_peer_access(&gb)?;
    let stream = Stream::new(&ga)?;
    let a = Engine::builder().build()?;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let mut src = DeviceBuffer::alloc(&ga, largest)?;
    src.copy_from_host(0, &pattern(largest), &stream)?;
    // Safety: the buffer outlives every transfer (all are waited for below, before the drop).
    #[allow(unsafe_code)]
    let (h, _) = unsafe {
        a.register_raw(src.ptr().0 as *mut u8, largest, MemoryKind::CudaDevice { ordinal: src_ordinal as u32 })
    }?;
    // The receiver: an engine here, or one in a child process reached through CUDA IPC.
    let mut local_b = None;
    let mut local_dst = None;
    let mut child_io = None;
    let (d, ceiling_dst, ceiling_gpu, _mapping): (MrDescriptor, DevicePtr, &Gpu, Option<IpcMapping>) = if ipc {
        let mut c = Command::new(std::env::current_exe()?)
            .args(["--child", "--dst", &dst_ordinal.to_string(), "--bytes", &largest.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(c.stdout.take().ok_or("child stdout")?).lines();
        let peer = EngineAddress::parse(&lines.next().ok_or("child gave no address")??)?;
        let d = MrDescriptor::parse(&lines.next().ok_or("child gave no descriptor")??)?;
        let _host = lines.next().ok_or("child gave no host descriptor")??;
        a.add_peer(&peer)?;
        let mut stdin = c.stdin.take().ok_or("child stdin")?;
        writeln!(stdin, "{}", a.address().to_string_compact())?;
        stdin.flush()?;
        let info = d.device.ok_or("child descriptor is not of device memory")?;
        let handle = IpcHandle::from_bytes(&info.ipc.ok_or("child region not exportable")?.0)?;
        let mapping = IpcMapping::open(&ga, &handle)?;
        let ptr = mapping.ptr().offset(info.alloc_offset as usize);
        child_io = Some((c, stdin, lines));
        (d, ptr, &ga, Some(mapping))
    } else {
        let b = Engine::builder().build()?;
        let dst = DeviceBuffer::alloc(&gb, largest)?;
        // Safety: as for the source buffer.
        #[allow(unsafe_code)]
        let (_, d) = unsafe {
            b.register_raw(dst.ptr().0 as *mut u8, largest, MemoryKind::CudaDevice { ordinal: dst_ordinal as u32 })
        }?;
        let ptr = dst.ptr();
        local_b = Some(b);
        local_dst = Some(dst);
        (d, ptr, &gb, None)
    };
    println!(
        "GPU{src_ordinal} -> GPU{dst_ordinal} ({}), {}, {iters} iterations per size, one write at a time",
        ga.name(),
        if ipc { "receiver in a child process (CUDA IPC)" } else { "both engines in this process" }
    );
    println!(
        "{:>10} {:>13} {:>15} {:>7} | {:>11} {:>11} {:>7} {:>11} {:>12}",
        "size",
        "ceiling GB/s",
        format!("engine win {window}"),
        "ratio",
        "raw 1-by-1",
        "engine 1-by-1",
        "ratio",
        "vs ceiling",
        "no imm 1x1"
    );
    let stream2 = Stream::new(&ga)?;
    let mut latencies: Vec<SizeLatency> = Vec::new();
    let mut imm_target = 0u64;
    for &size in &sizes {
        // Raw ceiling: back-to-back copies on one stream into the same destination, timed on
        // the host around a sync.
        copy_peer_async(ceiling_dst, ceiling_gpu, src.ptr(), &ga, size, &stream)?;
        stream.synchronize()?;
        let t = Instant::now();
        for _ in 0..iters {
            copy_peer_async(ceiling_dst, ceiling_gpu, src.ptr(), &ga, size, &stream)?;
        }
        stream.synchronize()?;
        let ceiling = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        // The same bytes as two halves on two streams at once (two copy engines): whether
        // splitting a write could beat one stream's ceiling.
        let t = Instant::now();
        for _ in 0..iters {
            let half = size / 2;
            copy_peer_async(ceiling_dst, ceiling_gpu, src.ptr(), &ga, half, &stream)?;
            copy_peer_async(ceiling_dst.offset(half), ceiling_gpu, src.ptr().offset(half), &ga, size - half, &stream2)?;
        }
        stream.synchronize()?;
        stream2.synchronize()?;
        let ceiling_split = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        // Raw copies one at a time (the floor of any one-at-a-time write).
        let mut raw_us = Vec::with_capacity(iters);
        let t = Instant::now();
        for _ in 0..iters {
            let t1 = Instant::now();
            copy_peer_async(ceiling_dst, ceiling_gpu, src.ptr(), &ga, size, &stream)?;
            stream.synchronize()?;
            raw_us.push(t1.elapsed().as_secs_f64() * 1e6);
        }
        let raw_single = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        // Engine: one write with an immediate at a time. In this process it is done when the
        // receiver's counter moved; across processes when the sender's transfer completed (the
        // zero-byte immediate write was acknowledged, so the receiver counted it).
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: size as u64, imm: Some(IMM) };
        // Per write: (immediate count it makes, submit ns, receiver counted ns if in this
        // process, sender completed ns).
        let mut stamps: Vec<(u64, u64, Option<u64>, u64)> = Vec::with_capacity(iters);
        let one =
            |target: u64, stamps: &mut Vec<(u64, u64, Option<u64>, u64)>| -> Result<(), Box<dyn std::error::Error>> {
                let submitted = monotonic_ns();
                let transfer = a.write(&op)?;
                let mut counted = None;
                if let Some(b) = &local_b {
                    if b.imm_counter(IMM).wait(target, Duration::from_secs(30)) < target {
                        return Err("immediate not counted within 30 s".into());
                    }
                    counted = Some(monotonic_ns());
                }
                transfer.wait_timeout(Duration::from_secs(30))?;
                stamps.push((target, submitted, counted, monotonic_ns()));
                Ok(())
            };
        imm_target += 1;
        one(imm_target, &mut Vec::new())?;
        let t = Instant::now();
        for _ in 0..iters {
            imm_target += 1;
            one(imm_target, &mut stamps)?;
        }
        let engine = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let ratio = engine / ceiling;
        // The same without an immediate: done when the poller saw the copy's event, so the gap
        // to `engine` is the immediate's trip and the receiver's wake-up, and the gap to
        // `raw_single` the poller's.
        let bare = WriteOp { imm: None, ..op };
        let t = Instant::now();
        for _ in 0..iters {
            a.write(&bare)?.wait_timeout(Duration::from_secs(30))?;
        }
        let engine_no_imm = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        // Windowed: keep `window` writes in flight.
        let t = Instant::now();
        let mut flight = std::collections::VecDeque::with_capacity(window);
        for _ in 0..iters {
            if flight.len() == window {
                let oldest: accord_engine::Transfer = flight.pop_front().expect("window is full");
                oldest.wait_timeout(Duration::from_secs(30))?;
            }
            flight.push_back(a.write(&op)?);
            imm_target += 1;
        }
        for transfer in flight {
            transfer.wait_timeout(Duration::from_secs(30))?;
        }
        if let Some(b) = &local_b {
            if b.imm_counter(IMM).wait(imm_target, Duration::from_secs(30)) < imm_target {
                return Err("immediates not counted within 30 s".into());
            }
        }
        let windowed = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let windowed_ratio = windowed / ceiling;
        let single_ratio = engine / raw_single;
        latencies.push(SizeLatency { size, ceiling, ceiling_split, raw_us: median(&mut raw_us), stamps });
        println!(
            "{:>6} MiB {ceiling:>13.1} {windowed:>15.1} {windowed_ratio:>7.3} | {raw_single:>11.1} {engine:>13.1} {single_ratio:>7.3} {ratio:>11.3} {engine_no_imm:>12.1}",
            size >> 20
        );
        println!(
            "{{\"bench\":\"engine_gpu_write\",\"ipc\":{ipc},\"bytes\":{size},\"iters\":{iters},\"window\":{window},\"ceiling_gbps\":{ceiling:.2},\"engine_gbps\":{engine:.2},\"ratio\":{ratio:.4},\"engine_window_gbps\":{windowed:.2},\"window_ratio\":{windowed_ratio:.4},\"raw_single_gbps\":{raw_single:.2},\"single_vs_raw_single\":{single_ratio:.4},\"engine_single_no_imm_gbps\":{engine_no_imm:.2}}}"
        );
    }
    // Check what landed: the last write covered the largest size.
    if let Some((mut c, mut stdin, mut lines)) = child_io {
        writeln!(stdin, "verify {imm_target} {largest} device")?;
        stdin.flush()?;
        let verdict = lines.next().ok_or("child gave no verdict")??;
        println!("receiver: {verdict}");
        let arrivals = parse_arrivals(lines.next().ok_or("child gave no arrivals")??.trim_start_matches("arrivals "));
        print_latencies(&latencies, |target| arrivals.get(&target).copied());
        c.wait()?;
        if !verdict.starts_with("ok") {
            return Err("the receiver saw wrong bytes or counts".into());
        }
    } else if let (Some(b), Some(dst)) = (&local_b, &local_dst) {
        let mut host = vec![0u8; largest];
        dst.copy_to_host(0, &mut host, &Stream::new(&gb)?)?;
        let ok = host == pattern(largest) && b.imm_counter(IMM).value() == imm_target;
        println!("receiver: {} count {} of {imm_target}", if ok { "ok" } else { "bad" }, b.imm_counter(IMM).value());
        print_latencies(&latencies, |_| None);
        if !ok {
            return Err("the receiver saw wrong bytes or counts".into());
        }
    }
    Ok(())
}

/// One size's one-write-at-a-time timings.
struct SizeLatency {
    size: usize,
    ceiling: f64,
    ceiling_split: f64,
    raw_us: f64,
    stamps: Vec<(u64, u64, Option<u64>, u64)>,
}

/// Medians of one write at a time: the raw copy, the receiver counting the immediate (one way:
/// what a consumer waiting for the data sees) and the sender's completion (after the
/// immediate's acknowledgement), each also as GB/s and against the ceiling. `arrival` gives
/// the receiver's time for an immediate count when it was taken in another process.
fn print_latencies(latencies: &[SizeLatency], arrival: impl Fn(u64) -> Option<u64>) {
    println!(
        "one write at a time, medians: {:>8} {:>12} {:>13} {:>9} {:>14} {:>9} {:>13} {:>9} {:>11}",
        "size",
        "raw copy us",
        "recv count us",
        "GB/s",
        "vs ceiling",
        "send done us",
        "GB/s",
        "vs ceiling",
        "split ceil"
    );
    for l in latencies {
        let mut counted: Vec<f64> = l
            .stamps
            .iter()
            .filter_map(|&(target, submitted, here, _)| {
                let at = here.or_else(|| arrival(target))?;
                Some(at.saturating_sub(submitted) as f64 / 1e3)
            })
            .collect();
        let mut done: Vec<f64> = l.stamps.iter().map(|&(_, s, _, d)| d.saturating_sub(s) as f64 / 1e3).collect();
        let (counted_us, done_us) = (median(&mut counted), median(&mut done));
        let gbps = |us: f64| if us > 0.0 { l.size as f64 / us / 1e3 } else { 0.0 };
        println!(
            "{:>38} MiB {:>12.1} {:>13.1} {:>9.1} {:>14.3} {:>9.1} {:>13.1} {:>9.3} {:>11.1}",
            l.size >> 20,
            l.raw_us,
            counted_us,
            gbps(counted_us),
            gbps(counted_us) / l.ceiling,
            done_us,
            gbps(done_us),
            gbps(done_us) / l.ceiling,
            l.ceiling_split
        );
        println!(
            "{{\"bench\":\"engine_gpu_write_latency\",\"bytes\":{},\"ceiling_gbps\":{:.2},\"ceiling_split2_gbps\":{:.2},\"raw_copy_us\":{:.2},\"recv_counted_us\":{counted_us:.2},\"send_done_us\":{done_us:.2},\"recv_counted_vs_ceiling\":{:.4},\"send_done_vs_ceiling\":{:.4}}}",
            l.size,
            l.ceiling,
            l.ceiling_split,
            l.raw_us,
            gbps(counted_us) / l.ceiling,
            gbps(done_us) / l.ceiling
        );
    }
}
