//! Latency of small writes with an immediate between two processes on this host, one write at
//! a time: when the receiver's counter moved (one way, what a consumer waiting on the
//! immediate sees) and when the sender's transfer completed (after the acknowledgement). The
//! baseline, measured in the same run between the same two processes: a UDP ping-pong over
//! loopback with blocking sockets (half its round trip is the kernel's one-way figure).
//!
//! The receiver's arrival times come from a thread polling its counter; both processes read
//! CLOCK_MONOTONIC, one clock on one host, so the parent's submit times and the child's arrival
//! times subtract.
//!
//! Usage: accord-latency-bench [--sizes 0,4096,65536] [--writes 2000]
//! Any `ACCORD_*` engine variable applies to both processes (e.g. `ACCORD_SHM=0` for UDP).

use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use accord_bench::arrivals::{format_arrivals, monotonic_ns, parse_arrivals, watch_arrivals};
use accord_engine::{Engine, EngineAddress, MrDescriptor, WriteOp};

const IMM: u32 = 9;
/// Largest write the child's region takes.
const REGION_BYTES: usize = 4 << 20;
const WAIT: Duration = Duration::from_secs(30);

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `p`-quantile of `values` in microseconds (sorts them).
fn quantile_us(values: &mut [u64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_unstable();
    let index = ((values.len() - 1) as f64 * p).round() as usize;
    values[index] as f64 / 1e3
}

/// The receiving process: an engine with a region, a thread stamping each counter value, a UDP
/// echo socket for the baseline. Lines on stdin: `report` prints the arrivals, `quit` ends.
fn child() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::builder().build()?;
    let region = engine.alloc(REGION_BYTES)?;
    let echo = UdpSocket::bind("127.0.0.1:0")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", engine.address().to_string_compact())?;
    writeln!(out, "{}", region.descriptor().to_string_compact())?;
    writeln!(out, "{}", echo.local_addr()?)?;
    out.flush()?;
    let mut lines = BufReader::new(std::io::stdin()).lines();
    engine.add_peer(&EngineAddress::parse(&lines.next().ok_or("no peer address")??)?)?;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_arrivals(engine.imm_counter(IMM), stop.clone());
    let echoer = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        echo.set_read_timeout(Some(WAIT)).ok();
        while let Ok((n, from)) = echo.recv_from(&mut buf) {
            if n == 1 && buf[0] == b'q' {
                break;
            }
            let _ = echo.send_to(&buf[..n], from);
        }
    });
    // The next line ("report") asks for the arrivals; anything else, or the end, quits.
    if lines.next().transpose()?.as_deref() == Some("report") {
        stop.store(true, Ordering::Release);
        let seen = watcher.join().map_err(|_| "watcher panicked")?;
        writeln!(out, "{}", format_arrivals(&seen))?;
        out.flush()?;
    }
    let _ = echoer.join();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--child") {
        return child();
    }
    let sizes: Vec<u64> = arg(&args, "--sizes", "0,4096,65536".to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|&s| s <= REGION_BYTES as u64)
        .collect();
    let writes: usize = arg(&args, "--writes", 2000).max(1);
    let mut c =
        Command::new(std::env::current_exe()?).arg("--child").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    let mut lines = BufReader::new(c.stdout.take().ok_or("child stdout")?).lines();
    let mut next = || -> Result<String, Box<dyn std::error::Error>> { Ok(lines.next().ok_or("child ended")??) };
    let peer = EngineAddress::parse(&next()?)?;
    let dst = MrDescriptor::parse(&next()?)?;
    let echo_addr: std::net::SocketAddr = next()?.parse()?;
    let engine = Engine::builder().build()?;
    engine.add_peer(&peer)?;
    let mut stdin = c.stdin.take().ok_or("child stdin")?;
    writeln!(stdin, "{}", engine.address().to_string_compact())?;
    stdin.flush()?;
    let src = engine.alloc(REGION_BYTES)?;
    src.fill(7);

    // Baseline: UDP ping-pong with blocking sockets between the same processes.
    let udp = UdpSocket::bind("127.0.0.1:0")?;
    udp.set_read_timeout(Some(WAIT))?;
    let mut rtts = Vec::with_capacity(writes);
    let mut buf = [0u8; 64];
    for i in 0..writes + 100 {
        let t = monotonic_ns();
        udp.send_to(&[1u8; 32], echo_addr)?;
        udp.recv_from(&mut buf)?;
        if i >= 100 {
            rtts.push(monotonic_ns() - t);
        }
    }
    udp.send_to(b"q", echo_addr)?;

    // Accord: one write at a time; the warm-up writes count too (the child stamps every value).
    let mut stamps: Vec<(u64, u64, u64, u64)> = Vec::new(); // (size, count, submit ns, done ns)
    let mut count = 0u64;
    for &size in &sizes {
        let op = WriteOp { src: &src.handle(), src_offset: 0, dst: &dst, dst_offset: 0, len: size, imm: Some(IMM) };
        for i in 0..writes + 100 {
            count += 1;
            let submitted = monotonic_ns();
            engine.write(&op)?.wait_timeout(WAIT)?;
            let done = monotonic_ns();
            if i >= 100 {
                stamps.push((size, count, submitted, done));
            }
        }
    }
    writeln!(stdin, "report")?;
    stdin.flush()?;
    let arrivals = parse_arrivals(&next()?);
    c.wait()?;

    let half_rtt = quantile_us(&mut rtts, 0.5) / 2.0;
    println!("{writes} writes one at a time per size; baseline: UDP ping-pong between the same processes");
    println!(
        "{:>9} {:>11} {:>11} {:>11} {:>11} {:>13} {:>12} {:>9}",
        "bytes", "one-way p50", "one-way p99", "done p50", "done p99", "udp 1-way p50", "vs udp", "missed"
    );
    for &size in &sizes {
        let rows: Vec<&(u64, u64, u64, u64)> = stamps.iter().filter(|s| s.0 == size).collect();
        let mut one_way: Vec<u64> =
            rows.iter().filter_map(|&&(_, n, t, _)| arrivals.get(&n).map(|&at| at.saturating_sub(t))).collect();
        let missed = rows.len() - one_way.len();
        let mut done: Vec<u64> = rows.iter().map(|&&(_, _, t, d)| d - t).collect();
        let p50 = quantile_us(&mut one_way, 0.5);
        println!(
            "{size:>9} {p50:>11.1} {:>11.1} {:>11.1} {:>11.1} {half_rtt:>13.1} {:>12.2} {missed:>9}",
            quantile_us(&mut one_way, 0.99),
            quantile_us(&mut done, 0.5),
            quantile_us(&mut done, 0.99),
            if half_rtt > 0.0 { p50 / half_rtt } else { 0.0 }
        );
        println!(
            "{{\"bench\":\"write_latency\",\"bytes\":{size},\"one_way_p50_us\":{p50:.2},\"done_p50_us\":{:.2},\"udp_one_way_p50_us\":{half_rtt:.2}}}",
            quantile_us(&mut done, 0.5)
        );
    }
    Ok(())
}
