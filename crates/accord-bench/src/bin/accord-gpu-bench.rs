//! `accord-gpu-bench`: Accord's GPU collectives on one host, nccl-tests
//! style. Run under `torchrun --nproc_per_node <gpus>`; rank 0 prints one
//! JSON object per measured row (see `scripts/device/gpu_vs_nccl.sh`): GPU µs a call back to
//! back (`time_us`) and host µs a call spent queuing (`host_us`).
//!
//! Options: `--check` (correctness with stream order proven, both modes),
//! `--min-bytes N`, `--max-bytes N` (defaults 4096 and 256 MiB, x4 steps),
//! `--order hostfn|stall|waitvalue|both` (default both: hostfn and stall), `--collectives a,b,...`
//! (all_gather, all_to_all, sendrecv, all_reduce, reduce_scatter), `--latency-max-bytes N`
//! (sizes up to N are timed in both modes; default 1 MiB).

use std::process::ExitCode;
use std::time::Duration;

use accord_coll::bench_math::busbw_gbps;
use accord_coll::gpu::{check, GpuBufs, GpuCommunicator, GpuResult, StreamOrder};
use accord_coll::{Collective, DType, ReduceOp};
use accord_cuda::{DeviceBuffer, Event, EventKind, Stream};

struct Args {
    check: bool,
    min_bytes: usize,
    max_bytes: usize,
    latency_max_bytes: usize,
    orders: Vec<StreamOrder>,
    collectives: Vec<Collective>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        check: false,
        min_bytes: 4096,
        max_bytes: 256 << 20,
        latency_max_bytes: 1 << 20,
        orders: vec![StreamOrder::HostFn, StreamOrder::Stall],
        collectives: vec![Collective::AllGather, Collective::AllToAll, Collective::SendRecv, Collective::AllReduce],
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--check" => args.check = true,
            "--min-bytes" => args.min_bytes = value("--min-bytes")?.parse().map_err(|e| format!("--min-bytes: {e}"))?,
            "--max-bytes" => args.max_bytes = value("--max-bytes")?.parse().map_err(|e| format!("--max-bytes: {e}"))?,
            "--latency-max-bytes" => {
                args.latency_max_bytes = value("--latency-max-bytes")?.parse().map_err(|e| format!("{e}"))?
            }
            "--order" => {
                let v = value("--order")?;
                args.orders = match v.as_str() {
                    "both" => vec![StreamOrder::HostFn, StreamOrder::Stall],
                    other => {
                        vec![StreamOrder::parse(other)
                            .ok_or(format!("--order {other}: use hostfn, stall, waitvalue or both"))?]
                    }
                };
            }
            "--collectives" => {
                args.collectives = value("--collectives")?
                    .split(',')
                    .map(|c| match c {
                        "all_gather" => Ok(Collective::AllGather),
                        "all_to_all" => Ok(Collective::AllToAll),
                        "sendrecv" => Ok(Collective::SendRecv),
                        "all_reduce" => Ok(Collective::AllReduce),
                        "reduce_scatter" => Ok(Collective::ReduceScatter),
                        other => Err(format!("unknown collective {other}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown argument {other}; see the doc comment of accord-gpu-bench")),
        }
    }
    if args.min_bytes == 0 || args.min_bytes > args.max_bytes {
        return Err("need 0 < --min-bytes <= --max-bytes".into());
    }
    Ok(args)
}

fn name(c: Collective) -> &'static str {
    match c {
        Collective::AllGather => "all_gather",
        Collective::AllToAll => "all_to_all",
        Collective::SendRecv => "sendrecv",
        Collective::AllReduce => "all_reduce",
        Collective::ReduceScatter => "reduce_scatter",
        _ => "other",
    }
}

struct Bench {
    send: DeviceBuffer,
    recv: DeviceBuffer,
    stream: Stream,
}

fn issue(comm: &GpuCommunicator, b: &Bench, c: Collective, bytes: usize) -> GpuResult<()> {
    let n = comm.world_size();
    let bufs = GpuBufs { send: &b.send, recv: &b.recv };
    match c {
        Collective::AllGather => comm.all_gather(bufs, bytes / n, &b.stream),
        Collective::AllToAll => comm.all_to_all(bufs, bytes / n, &b.stream),
        Collective::SendRecv => comm.sendrecv(bufs, bytes, &b.stream),
        Collective::ReduceScatter => comm.reduce_scatter(bufs, bytes / 4 / n, DType::F32, ReduceOp::Sum, &b.stream),
        _ => comm.all_reduce(bufs, bytes / 4, DType::F32, ReduceOp::Sum, &b.stream),
    }
}

/// GPU µs a call back to back (events around the calls), and host µs a call spent queuing them
/// (the slowest rank's of each).
fn time_us(comm: &mut GpuCommunicator, b: &Bench, c: Collective, bytes: usize) -> GpuResult<(f64, f64)> {
    let iters = if bytes <= 1 << 20 {
        50
    } else if bytes <= 16 << 20 {
        20
    } else {
        10
    };
    for _ in 0..3 {
        issue(comm, b, c, bytes)?;
    }
    b.stream.synchronize()?;
    comm.wait_idle(Duration::from_secs(120))?;
    comm.host_all_gather(b"go")?;
    let start = Event::new(comm.gpu(), EventKind::Timing)?;
    let end = Event::new(comm.gpu(), EventKind::Timing)?;
    start.record(&b.stream)?;
    let queuing = std::time::Instant::now();
    for _ in 0..iters {
        issue(comm, b, c, bytes)?;
    }
    let host_us = queuing.elapsed().as_secs_f64() * 1e6 / iters as f64;
    end.record(&b.stream)?;
    end.synchronize()?;
    comm.wait_idle(Duration::from_secs(120))?;
    let mine = f64::from(end.elapsed_ms_since(&start)?) * 1000.0 / f64::from(iters);
    let all = comm.host_all_gather(&[mine.to_le_bytes(), host_us.to_le_bytes()].concat())?;
    let at = |v: &[u8], i: usize| {
        f64::from_le_bytes(v.get(8 * i..8 * i + 8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]))
    };
    Ok((all.iter().map(|v| at(v, 0)).fold(0.0, f64::max), all.iter().map(|v| at(v, 1)).fold(0.0, f64::max)))
}

fn run(args: &Args) -> GpuResult<()> {
    let mut comm = GpuCommunicator::from_env()?;
    let rank = comm.rank();
    let n = comm.world_size();
    if args.check {
        for count in [1, 1000 + 17, 300_000] {
            for line in check::run_all(&mut comm, count)? {
                if rank == 0 {
                    println!("{line}");
                }
            }
        }
    }
    let stream = Stream::new(comm.gpu())?;
    let mut send = DeviceBuffer::alloc(comm.gpu(), args.max_bytes)?;
    let mut recv = DeviceBuffer::alloc(comm.gpu(), args.max_bytes)?;
    send.memset_async(0, args.max_bytes, 0, &stream)?;
    recv.memset_async(0, args.max_bytes, 0, &stream)?;
    stream.synchronize()?;
    comm.register(&recv)?;
    let bench = Bench { send, recv, stream };
    for &c in &args.collectives {
        let mut bytes = args.min_bytes;
        while bytes <= args.max_bytes {
            let bytes_rounded = bytes - bytes % (4 * n);
            for &order in &args.orders {
                if order == StreamOrder::Stall && bytes > args.latency_max_bytes && args.orders.len() > 1 {
                    continue;
                }
                if !comm.order_available(order) {
                    continue; // stall, in a private context (ACCORD_GPU_PRIVATE_CONTEXT=1)
                }
                comm.set_stream_order(order)?;
                let (t, host_us) = time_us(&mut comm, &bench, c, bytes_rounded)?;
                if rank == 0 {
                    println!(
                        "{{\"impl\":\"accord\",\"collective\":\"{}\",\"bytes\":{},\"order\":\"{}\",\"time_us\":{:.2},\"host_us\":{:.2},\"busbw_gbps\":{:.2},\"sms\":{},\"ranks\":{}}}",
                        name(c),
                        bytes_rounded,
                        order.name(),
                        t,
                        host_us,
                        busbw_gbps(c, n, bytes_rounded as u64, t),
                        comm.sms_used(c, bytes_rounded, DType::F32),
                        n
                    );
                }
            }
            bytes *= 4;
        }
    }
    comm.set_stream_order(StreamOrder::HostFn)?;
    comm.host_all_gather(b"end")?;
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("accord-gpu-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("accord-gpu-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
