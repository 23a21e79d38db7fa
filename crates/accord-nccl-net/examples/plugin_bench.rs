//! Throughput bench of the built `libnccl_net_accord.so`, driven the way NCCL's proxy drives a
//! network transport in the bandwidth case: two processes, each with `comms` send comms and
//! `comms` receive comms to the other (both directions at once, like a 2-rank ring), every comm
//! keeping up to `window` requests of `msg` bytes outstanding in host memory and re-posting as
//! they complete, until `total` bytes per comm moved. Prints one table row per configuration:
//! GB/s received per process and per-message latency percentiles (post to `test` done) of
//! receives and sends, and each child's per-thread CPU use during the timed phase (busy
//! workers are copy-bound; idle ones wait on latency), for several environment variants in
//! the same run (default: UDP
//! loopback `ACCORD_SHM=0` as the baseline of the ratio column, shared memory, and shared
//! memory with the engine sharding each message itself, `ACCORD_NET_PIECES=0`).
//!
//! A bench, not a test: `cargo run --release -p accord-nccl-net --example plugin_bench`
//! (build the cdylib first: `cargo build --release -p accord-nccl-net`). Knobs:
//! `BENCH_COMMS=1,2 BENCH_MSGS=524288,4194304 BENCH_WINDOW=8 BENCH_TOTAL_MB=256`,
//! `BENCH_VARIANTS="ACCORD_SHM=0|ACCORD_SHM=1|ACCORD_SHM=1,ACCORD_NET_PIECES=0"` (`|` between
//! variants, `,` between the variables of one; the first is the ratio's baseline).
//! Any `ACCORD_*` variable passes through to the children. `BENCH_GPU=1` puts every buffer in
//! GPU memory instead (rank r on GPU r; registered as `NCCL_PTR_CUDA`, so the plugin's
//! copy-engine route moves them, as NCCL with GPUDirect would), for the GPU host only. Every
//! child checks that its receive buffers hold the peer's bytes at the end.
#![allow(unsafe_code)]

use nccl_net_accord::abi::{self, CommConfig, NetV11, NET_HANDLE_BYTES_MAX};
use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "ACCORD_BENCH_CHILD";
const DEADLINE: Duration = Duration::from_secs(300);

fn env_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn check(what: &str, rc: i32) {
    assert_eq!(rc, abi::NCCL_SUCCESS, "{what} returned NCCL error {rc}");
}

/// CLOCK_MONOTONIC in ns: one clock for both processes (stage latencies across them).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // Safety: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Per thread of this process: (tid, name, user + system CPU ticks) from /proc/self/task.
fn thread_cpu_ticks() -> Vec<(u64, String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return vec![] };
    let mut out = vec![];
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse::<u64>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // "tid (comm) state ..." and comm may hold spaces: the fields follow the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let name = stat[open + 1..close].to_string();
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // Fields after the name start at "state" (field 3); utime and stime are fields 14 and 15.
        let ticks = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        out.push((tid, name, ticks(14) + ticks(15)));
    }
    out
}

/// CPU use of each thread between two samples, in percent of one core, busiest first:
/// "name=pct" for every thread that used any.
fn thread_cpu_summary(before: &[(u64, String, u64)], after: &[(u64, String, u64)], secs: f64) -> String {
    // Safety: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut rows: Vec<(String, f64)> = after
        .iter()
        .map(|(tid, name, t)| {
            let start = before.iter().find(|b| b.0 == *tid).map_or(0, |b| b.2);
            (name.clone(), t.saturating_sub(start) as f64 / hz / secs.max(1e-9) * 100.0)
        })
        .filter(|(_, pct)| *pct > 0.0)
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows.iter().map(|(n, p)| format!("{n}={p:.0}")).collect::<Vec<_>>().join(" ")
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The message buffers of one comm and direction: host memory, or GPU memory (`BENCH_GPU=1`).
enum Arena {
    Host(Vec<u8>),
    Gpu(accord_cuda::DeviceBuffer),
}

impl Arena {
    fn new(gpu: Option<&accord_cuda::Gpu>, len: usize, fill: u8) -> Arena {
        match gpu {
            None => Arena::Host(vec![fill; len]),
            Some(gpu) => {
                // cuMemCreate memory, as NCCL's own buffers: the plugin refuses GPU memory that a
                // context owns (cudaMalloc), whose copies could deadlock.
                let mut buf = accord_cuda::DeviceBuffer::alloc_unowned(gpu, len).expect("cuMemCreate");
                let stream = accord_cuda::Stream::new(gpu).expect("stream");
                buf.copy_from_host(0, &vec![fill; len], &stream).expect("fill the GPU arena");
                Arena::Gpu(buf)
            }
        }
    }

    fn base(&mut self) -> usize {
        match self {
            Arena::Host(v) => v.as_mut_ptr() as usize,
            Arena::Gpu(b) => b.ptr().0 as usize,
        }
    }

    fn ptr_type(&self) -> i32 {
        match self {
            Arena::Host(_) => abi::PTR_HOST,
            Arena::Gpu(_) => abi::PTR_CUDA,
        }
    }

    /// The bytes now (copied back from the GPU).
    fn contents(&self) -> Vec<u8> {
        match self {
            Arena::Host(v) => v.clone(),
            Arena::Gpu(b) => {
                let mut out = vec![0u8; b.len_bytes()];
                let stream = accord_cuda::Stream::new(b.gpu()).expect("stream");
                b.copy_to_host(0, &mut out, &stream).expect("read the GPU arena");
                out
            }
        }
    }
}

/// One child: rank `rank` of 2.
fn child(rank: usize) {
    let gpu = (std::env::var("BENCH_GPU").as_deref() == Ok("1")).then(|| {
        let count = accord_cuda::probe().device_count.max(1);
        let gpu = accord_cuda::Gpu::open(rank % count).expect("BENCH_GPU=1 needs a GPU");
        // Current on this thread, which also sets the comms up, as NCCL's proxy thread has its
        // device current: the plugin page-locks its bounce pools for that GPU.
        gpu.bind().expect("bind the GPU");
        gpu
    });
    let comms = env_list("BENCH_COMMS", "1")[0] as usize;
    let msg = env_list("BENCH_MSGS", "524288")[0] as usize;
    let window = env_list("BENCH_WINDOW", "8")[0] as usize;
    let total = (env_list("BENCH_TOTAL_MB", "256")[0] as usize) << 20;
    let msgs_per_comm = total.div_ceil(msg);
    let exe = std::env::current_exe().expect("exe");
    let so = exe.parent().and_then(|p| p.parent()).expect("profile dir").join("libnccl_net_accord.so");
    // Safety: loading our own plugin; its initialisers only set up Rust statics.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap_or_else(|e| panic!("dlopen {}: {e}", so.display()));
    // Safety: ncclNetPlugin_v11 is a static NetV11 in the plugin, alive while `lib` is.
    let t: &NetV11 = unsafe { &**lib.get::<*const NetV11>(b"ncclNetPlugin_v11\0").expect("symbol") };
    let mut ctx = std::ptr::null_mut();
    let mut config = CommConfig { trafficClass: -1 };
    // Safety: valid out-pointers, no logger, no profiler.
    check("init", unsafe { (t.init)(&mut ctx, 1, &mut config, None, std::ptr::null_mut()) });
    let mut listens = vec![];
    let mut line = String::new();
    for _ in 0..comms {
        let mut handle = [0u8; NET_HANDLE_BYTES_MAX];
        let mut lc = std::ptr::null_mut();
        // Safety: a handle buffer of the maximum size and valid out-pointers.
        check("listen", unsafe { (t.listen)(ctx, 0, handle.as_mut_ptr().cast(), &mut lc) });
        listens.push(lc);
        line.extend(handle.iter().map(|b| format!("{b:02x}")));
        line.push(',');
    }
    println!("\n@@HANDLES {line}");
    std::io::stdout().flush().unwrap();
    let mut peer = String::new();
    std::io::stdin().read_line(&mut peer).unwrap();
    let mut peer_handles: Vec<[u8; NET_HANDLE_BYTES_MAX]> = peer
        .trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|h| std::array::from_fn(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap()))
        .collect();
    let mut sends = vec![std::ptr::null_mut::<c_void>(); comms];
    let mut recvs = vec![std::ptr::null_mut::<c_void>(); comms];
    let mut dev = std::ptr::null_mut();
    let start = Instant::now();
    while sends.iter().chain(&recvs).any(|c| c.is_null()) {
        assert!(start.elapsed() < Duration::from_secs(60), "connect/accept did not finish");
        for c in 0..comms {
            if sends[c].is_null() {
                // Safety: the peer's handle, reused across calls as NCCL does.
                check("connect", unsafe {
                    (t.connect)(ctx, 0, peer_handles[c].as_mut_ptr().cast(), &mut sends[c], &mut dev)
                });
            }
            if recvs[c].is_null() {
                // Safety: a live listen comm.
                check("accept", unsafe { (t.calls.accept)(listens[c], &mut recvs[c], &mut dev) });
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // One arena per comm and direction: `window` message buffers.
    let arena_bytes = window * msg;
    // Send arena c holds byte `fill(c)` on both ranks; receive arenas start with other bytes.
    let fill = |i: usize| (i as u8) ^ 0x5a;
    let mut arenas: Vec<Arena> = (0..2 * comms).map(|i| Arena::new(gpu.as_ref(), arena_bytes, fill(i))).collect();
    let mut mrs = vec![std::ptr::null_mut::<c_void>(); 2 * comms];
    for (i, a) in arenas.iter_mut().enumerate() {
        let comm = if i < comms { sends[i] } else { recvs[i - comms] };
        let (base, ptr_type) = (a.base(), a.ptr_type());
        // Safety: the arena lives until the end of this function, after deregMr.
        check("regMr", unsafe { (t.calls.regMr)(comm, base as *mut c_void, arena_bytes, ptr_type, &mut mrs[i]) });
    }
    let bases: Vec<usize> = arenas.iter_mut().map(Arena::base).collect();
    // Per comm and direction: (posted count, done count, outstanding (index, posted at)).
    struct Flow {
        posted: usize,
        done: usize,
        outstanding: std::collections::VecDeque<(*mut c_void, Instant)>,
        /// Per message, host-wide monotonic ns: first post attempt, post accepted, test done.
        stamps: Vec<[u64; 3]>,
    }
    let new_flow = || Flow { posted: 0, done: 0, outstanding: Default::default(), stamps: vec![[0; 3]; msgs_per_comm] };
    let mut send_flows: Vec<Flow> = (0..comms).map(|_| new_flow()).collect();
    let mut recv_flows: Vec<Flow> = (0..comms).map(|_| new_flow()).collect();
    let (mut send_lat, mut recv_lat) = (vec![], vec![]);
    let (mut send_null, mut recv_null, mut tests) = (0u64, 0u64, 0u64);
    let cpu_before = thread_cpu_ticks();
    let begin = Instant::now();
    loop {
        let mut all_done = true;
        for c in 0..comms {
            let (sf, rf) = (&mut send_flows[c], &mut recv_flows[c]);
            all_done &= sf.done == msgs_per_comm && rf.done == msgs_per_comm;
            while rf.posted < msgs_per_comm && rf.outstanding.len() < window {
                let first = &mut rf.stamps[rf.posted][0];
                if *first == 0 {
                    *first = monotonic_ns();
                }
                let slot = rf.posted % window;
                let mut data = (bases[comms + c] + slot * msg) as *mut c_void;
                let (mut size, mut tag, mut mh) = (msg, 0, mrs[comms + c]);
                let mut ph = std::ptr::null_mut();
                let mut req = std::ptr::null_mut();
                // Safety: one receive into a registered buffer of `msg` bytes.
                check("irecv", unsafe {
                    (t.calls.irecv)(recvs[c], 1, &mut data, &mut size, &mut tag, &mut mh, &mut ph, &mut req)
                });
                if req.is_null() {
                    recv_null += 1;
                    break;
                }
                rf.outstanding.push_back((req, Instant::now()));
                rf.stamps[rf.posted][1] = monotonic_ns();
                rf.posted += 1;
            }
            while sf.posted < msgs_per_comm && sf.outstanding.len() < window {
                let first = &mut sf.stamps[sf.posted][0];
                if *first == 0 {
                    *first = monotonic_ns();
                }
                let slot = sf.posted % window;
                let data = (bases[c] + slot * msg) as *mut c_void;
                let mut req = std::ptr::null_mut();
                // Safety: a registered buffer of `msg` bytes.
                check("isend", unsafe {
                    (t.calls.isend)(sends[c], data, msg, 0, mrs[c], std::ptr::null_mut(), &mut req)
                });
                if req.is_null() {
                    send_null += 1;
                    break;
                }
                sf.outstanding.push_back((req, Instant::now()));
                sf.stamps[sf.posted][1] = monotonic_ns();
                sf.posted += 1;
            }
            for (flow, lat) in [(&mut *sf, &mut send_lat), (&mut *rf, &mut recv_lat)] {
                while let Some(&(req, at)) = flow.outstanding.front() {
                    let (mut done, mut size) = (0, 0);
                    tests += 1;
                    // Safety: a live request.
                    check("test", unsafe { (t.calls.test)(req, &mut done, &mut size) });
                    if done == 0 {
                        break;
                    }
                    assert_eq!(size as usize, msg);
                    lat.push(at.elapsed().as_micros() as u64);
                    flow.stamps[flow.done][2] = monotonic_ns();
                    flow.outstanding.pop_front();
                    flow.done += 1;
                }
            }
        }
        if all_done {
            break;
        }
        assert!(begin.elapsed() < DEADLINE, "traffic did not finish in {DEADLINE:?}");
        // NCCL's proxy thread spins too, but yields between rounds on a busy host.
        std::thread::yield_now();
    }
    let secs = begin.elapsed().as_secs_f64();
    let cpu = thread_cpu_summary(&cpu_before, &thread_cpu_ticks(), secs);
    send_lat.sort_unstable();
    recv_lat.sort_unstable();
    let gbps = (comms * msgs_per_comm * msg) as f64 / secs / 1e9;
    println!(
        "\n@@RESULT {gbps:.3} {} {} {} {} {} {} {send_null} {recv_null} {tests}",
        percentile(&recv_lat, 0.5),
        percentile(&recv_lat, 0.9),
        percentile(&recv_lat, 0.99),
        percentile(&send_lat, 0.5),
        percentile(&send_lat, 0.9),
        percentile(&send_lat, 0.99),
    );
    for (kind, flows) in [("send", &send_flows), ("recv", &recv_flows)] {
        for (c, f) in flows.iter().enumerate() {
            let flat: Vec<String> = f.stamps.iter().flatten().map(u64::to_string).collect();
            println!("@@STAMPS {kind} {c} {}", flat.join(" "));
        }
    }
    println!("@@CPU {cpu}");
    for c in 0..comms {
        // The slots some message landed in (fewer than the window when the total is small).
        let written = msgs_per_comm.min(window) * msg;
        let got = arenas[comms + c].contents();
        let wrong = got[..written].iter().filter(|&&b| b != fill(c)).count();
        assert!(wrong == 0, "receive arena {c}: {wrong} of {written} bytes are not the peer's");
    }
    std::io::stdout().flush().unwrap();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    // Safety: handing back what the plugin gave, once each.
    unsafe {
        for (i, mr) in mrs.iter().enumerate() {
            check("deregMr", (t.calls.deregMr)(if i < comms { sends[i] } else { recvs[i - comms] }, *mr));
        }
        for c in 0..comms {
            check("closeSend", (t.calls.closeSend)(sends[c]));
            check("closeRecv", (t.calls.closeRecv)(recvs[c]));
            check("closeListen", (t.calls.closeListen)(listens[c]));
        }
        check("finalize", (t.finalize)(ctx));
    }
    drop(arenas);
    peer_handles.clear();
}

/// Every stdout line of each child as `(rank, Some(line))`, then `(rank, None)` at its end;
/// read to the end so no child writes into a closed pipe. (The tests run their processes with
/// `accord_testkit`; this bench is a plain binary, not a libtest one, so it keeps its own.)
fn stdout_lines(children: &mut [Child]) -> Receiver<(usize, Option<String>)> {
    let (tx, rx) = mpsc::channel();
    for (rank, child) in children.iter_mut().enumerate() {
        let out = BufReader::new(child.stdout.take().expect("children are spawned with piped stdout"));
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send((rank, Some(line)));
            }
            let _ = tx.send((rank, None));
        });
    }
    rx
}

/// Hands each of the two ranks the other's connection handles once both are known.
fn exchange_handles(handles: &[Option<String>], children: &mut [Child]) {
    if let [Some(h0), Some(h1)] = handles {
        writeln!(children[0].stdin.as_mut().expect("piped stdin"), "{h1}").unwrap();
        writeln!(children[1].stdin.as_mut().expect("piped stdin"), "{h0}").unwrap();
    }
}

/// Runs one configuration: the two children's result lines.
fn pair(env: &[(String, String)]) -> (Vec<Vec<f64>>, Vec<String>) {
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..2)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.env(CHILD_ENV, rank.to_string()).stdin(Stdio::piped()).stdout(Stdio::piped());
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.spawn().expect("spawn child")
        })
        .collect();
    let rx = stdout_lines(&mut children);
    let mut handles: Vec<Option<String>> = vec![None, None];
    let mut results: Vec<Option<Vec<f64>>> = vec![None, None];
    let mut cpu: Vec<String> = vec![String::new(), String::new()];
    // (rank, kind, comm) -> stamps of each message.
    let mut stamps: std::collections::HashMap<(usize, String, usize), Vec<u64>> = Default::default();
    let mut ended = 0;
    while ended < 2 {
        let (rank, line) = rx.recv_timeout(DEADLINE).expect("children finish");
        let Some(line) = line else {
            ended += 1;
            continue;
        };
        if let Some((_, h)) = line.split_once("@@HANDLES ") {
            handles[rank] = Some(h.trim().to_string());
            exchange_handles(&handles, &mut children);
        } else if let Some((_, r)) = line.split_once("@@STAMPS ") {
            let mut it = r.split_whitespace();
            let kind = it.next().unwrap_or_default().to_string();
            let comm: usize = it.next().and_then(|c| c.parse().ok()).unwrap_or(0);
            stamps.insert((rank, kind, comm), it.filter_map(|x| x.parse().ok()).collect());
        } else if let Some((_, c)) = line.split_once("@@CPU ") {
            cpu[rank] = c.trim().to_string();
        } else if let Some((_, r)) = line.split_once("@@RESULT ") {
            results[rank] = Some(r.split_whitespace().filter_map(|x| x.parse().ok()).collect());
            if results.iter().all(Option::is_some) {
                for c in children.iter_mut() {
                    writeln!(c.stdin.as_mut().unwrap(), "go").unwrap();
                }
            }
        }
    }
    for (rank, c) in children.iter_mut().enumerate() {
        assert!(c.wait().unwrap().success(), "rank {rank} failed");
    }
    let mut out: Vec<Vec<f64>> = results.into_iter().map(|r| r.expect("both ranks report")).collect();
    out.push(stages(&stamps));
    (out, cpu)
}

/// Median per-message stage latencies in us over both directions and every comm: the sender
/// waiting for the clear-to-send (isend refused after both sides posted), isend accepted ->
/// receiver's test done, isend accepted -> sender's test done, irecv -> receiver's test done.
fn stages(stamps: &std::collections::HashMap<(usize, String, usize), Vec<u64>>) -> Vec<f64> {
    let mut columns: [Vec<u64>; 4] = Default::default();
    for ((rank, kind, comm), send) in stamps {
        if kind != "send" {
            continue;
        }
        let Some(recv) = stamps.get(&(1 - rank, "recv".to_string(), *comm)) else { continue };
        for (s, r) in send.chunks_exact(3).zip(recv.chunks_exact(3)) {
            let us = |a: u64, b: u64| b.saturating_sub(a) / 1000;
            columns[0].push(us(s[0].max(r[1]), s[1]));
            columns[1].push(us(s[1], r[2]));
            columns[2].push(us(s[1], s[2]));
            columns[3].push(us(r[1], r[2]));
        }
    }
    columns
        .iter_mut()
        .map(|c| {
            c.sort_unstable();
            percentile(c, 0.5) as f64
        })
        .collect()
}

fn main() {
    if let Ok(rank) = std::env::var(CHILD_ENV) {
        child(rank.parse().expect("rank"));
        return;
    }
    let window = env_list("BENCH_WINDOW", "8")[0];
    let total_mb = env_list("BENCH_TOTAL_MB", "256")[0];
    println!("# NCCL-proxy-like bench of libnccl_net_accord.so: 2 processes, both directions, window {window}, {total_mb} MiB per comm");
    println!(
        "# GB/s: bytes received per process / wall time (mean of the 2 ranks); latencies in us, post -> test done"
    );
    println!(
        "{:>5} {:>9} {:>30} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "comms",
        "msg",
        "variant",
        "GB/s",
        "rx_p50",
        "rx_p90",
        "rx_p99",
        "tx_p50",
        "tx_p90",
        "tx_p99",
        "busy_null",
        "vs_first",
        "cts_wait",
        "snd>rcv",
        "snd>sdn",
        "rcv>rdn"
    );
    println!("# stage medians (us): cts_wait = isend refused for want of a clear-to-send after both sides posted;");
    println!("#   snd>rcv = isend accepted -> receiver test done; snd>sdn = -> sender test done; rcv>rdn = irecv -> test done");
    for comms in env_list("BENCH_COMMS", "1,2") {
        for msg in env_list("BENCH_MSGS", "524288,4194304") {
            let mut baseline = None;
            let mut rows = vec![];
            let variants = std::env::var("BENCH_VARIANTS")
                .unwrap_or_else(|_| "ACCORD_SHM=0|ACCORD_SHM=1|ACCORD_SHM=1,ACCORD_NET_PIECES=0".to_string());
            for variant in variants.split('|') {
                let mut env =
                    vec![("BENCH_COMMS".to_string(), comms.to_string()), ("BENCH_MSGS".to_string(), msg.to_string())];
                for kv in variant.split(',').filter(|s| !s.is_empty()) {
                    let (k, v) = kv.split_once('=').expect("variant entries are NAME=VALUE");
                    env.push((k.to_string(), v.to_string()));
                }
                let (r, cpu) = pair(&env);
                let mean = |i: usize| (r[0][i] + r[1][i]) / 2.0;
                baseline.get_or_insert(mean(0));
                rows.push((
                    variant.to_string(),
                    mean(0),
                    (1..7).map(mean).collect::<Vec<_>>(),
                    mean(7) + mean(8),
                    r[2].clone(),
                    cpu,
                ));
            }
            for (shm, gbps, lat, nulls, stage, cpu) in rows {
                let ratio = baseline.map_or("-".to_string(), |b| format!("{:.2}x", gbps / b));
                print!("{comms:>5} {msg:>9} {shm:>30} {gbps:>8.3}");
                for l in lat {
                    print!(" {l:>8.0}");
                }
                print!(" {nulls:>9.0} {ratio:>9}");
                for st in stage {
                    print!(" {st:>8.0}");
                }
                println!();
                for (rank, c) in cpu.iter().enumerate() {
                    println!("#   cpu % of a core during the timed phase, rank {rank}: {c}");
                }
            }
        }
    }
}
