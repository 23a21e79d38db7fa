//! One rank of `accord-device-bench`: setup, then each measurement in turn. Every run ends
//! with an all-gather of each rank's status words, so rank 0 prints every rank's verdict and
//! every rank sees the same failures.

use std::time::{Duration, Instant};

use accord_coll::{Bufs, CollTransport, Communicator, DType};
use accord_cuda::{
    copy_peer_async, CudaError, DeviceBuffer, DevicePtr, Event, EventKind, Gpu, Graph, IpcHandle, IpcMapping, Stream,
};
use accord_engine::{MemoryKind, MrDescriptor, WriteOp};

use crate::kernels::{status_name, Kernels, PingMode};
use crate::proxy::{Proxy, ProxyConfig, ProxyStats};
use crate::report::{gbps, header, json_string, median, percentile, row};
use crate::Args;

/// Signals of each run (fresh ones, so every run counts from zero).
const SIGNAL_PING: u32 = 0;
const SIGNAL_DIRECT: u32 = 1;
const SIGNAL_BANDWIDTH: u32 = 2;
const SIGNAL_MANY: u32 = 3;
const SIGNAL_VALUE: u32 = 4;
const SIGNAL_GRAPH: u32 = 5;
const SIGNAL_PING_4K: u32 = 6;
const SIGNAL_WARM: u32 = 7;
const SIGNAL_FLOOR: u32 = 8;
const SIGNAL_DIRECT_RAW: u32 = 9;
const SIGNAL_RAW_WAIT: u32 = 10;
const SIGNAL_FLOOR_CLOCK: u32 = 11;
const SIGNAL_FLOOR_SUM: u32 = 12;
const SIGNAL_FLOOR_FENCE: u32 = 13;
const SIGNAL_FLOOR_ACQUIRE: u32 = 14;
const SIGNAL_PING_1K: u32 = 15;
const SIGNAL_PING_16K: u32 = 16;
const SIGNAL_DIRECT_PEER: u32 = 17;
const SIGNAL_FLOOR_HOISTED: u32 = 18;
const USER_SIGNALS: u32 = 19;
/// Bytes each rank sends each rank per many-peer round: odd, so no copy is aligned.
const MANY_PEER_BYTES: u64 = (1 << 20) + 13;
/// Result words of a launch: status, wrong bytes, kernel-specific count, then samples.
const OUT_HEADER_WORDS: usize = 3;

/// Everything a run needs. `proxy` is declared first so it is dropped (its proxies stopped)
/// before the windows' memory is freed.
struct Ctx {
    proxy: Proxy,
    recv: DeviceBuffer,
    send: DeviceBuffer,
    out: DeviceBuffer,
    out_words: usize,
    kernels: Kernels,
    stream: Stream,
    gpu: Gpu,
    table: u64,
    rank: usize,
    world: usize,
    args: Args,
    timeout_ns: u64,
    failures: Vec<String>,
    /// Whether the ping-pong table's header is out (its rows come from several runs).
    ping_header: bool,
}

/// Every rank's `record`, by rank: lengths first, then the records padded to the longest.
fn all_gather<T: CollTransport>(comm: &mut Communicator<T>, record: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let lengths = gather_fixed(comm, &(record.len() as u64).to_le_bytes())?;
    let lengths: Vec<usize> =
        lengths.iter().map(|l| u64::from_le_bytes(l[..8].try_into().unwrap_or([0; 8])) as usize).collect();
    let longest = lengths.iter().copied().max().unwrap_or(0).max(1);
    let mut padded = record.to_vec();
    padded.resize(longest, 0);
    let all = gather_fixed(comm, &padded)?;
    Ok(all
        .into_iter()
        .zip(lengths)
        .map(|(mut r, len)| {
            r.truncate(len);
            r
        })
        .collect())
}

/// All-gather of records of one length (the same on every rank).
fn gather_fixed<T: CollTransport>(comm: &mut Communicator<T>, record: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let world = comm.world_size();
    let send = comm.register(record.to_vec()).map_err(|e| format!("all_gather: {e}"))?;
    let recv = comm.register(vec![0u8; record.len() * world]).map_err(|e| format!("all_gather: {e}"))?;
    let gathered = comm
        .all_gather(Bufs { send: send.all(), recv: recv.all() }, record.len(), DType::U8, None)
        .and_then(|()| comm.read_typed::<u8>(recv.all()));
    let _ = comm.deregister(send);
    let _ = comm.deregister(recv);
    let all = gathered.map_err(|e| format!("all_gather: {e}"))?;
    Ok(all.chunks(record.len()).map(<[u8]>::to_vec).collect())
}

fn cuda(what: &str) -> impl Fn(CudaError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Ctx {
    fn barrier(&mut self) -> Result<(), String> {
        self.proxy.communicator().barrier().map_err(|e| format!("host barrier: {e}"))
    }

    /// Every rank's `words`, by rank.
    fn gather_words(&mut self, words: &[u64]) -> Result<Vec<Vec<u64>>, String> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let all = all_gather(self.proxy.communicator(), &bytes)?;
        Ok(all
            .iter()
            .map(|r| r.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
            .collect())
    }

    fn zero_out(&mut self) -> Result<(), String> {
        self.out.memset_async(0, self.out_words * 8, 0, &self.stream).map_err(cuda("clearing the result words"))?;
        self.stream.synchronize().map_err(cuda("clearing the result words"))
    }

    fn read_out(&self, words: usize) -> Result<Vec<u64>, String> {
        let mut bytes = vec![0u8; words.min(self.out_words) * 8];
        self.out.copy_to_host(0, &mut bytes, &self.stream).map_err(cuda("reading the result words"))?;
        Ok(bytes.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
    }

    fn sync(&self, what: &str) -> Result<(), String> {
        self.stream.synchronize().map_err(|e| format!("{what}: {e}"))
    }

    /// Records a failure of `what` for each rank whose status or wrong-byte count is not 0.
    fn judge(&mut self, what: &str, gathered: &[Vec<u64>]) -> bool {
        let mut ok = true;
        for (rank, words) in gathered.iter().enumerate() {
            let (status, bad) = (words.first().copied().unwrap_or(0), words.get(1).copied().unwrap_or(0));
            if status != 0 || bad != 0 {
                ok = false;
                self.failures.push(format!("{what}: rank {rank} saw {} and {bad} wrong bytes", status_name(status)));
            }
        }
        ok
    }

    /// The route as the JSON rows name it: `ipc` or `network`, with `+engine` when the stream
    /// lanes are off (every descriptor an engine write).
    fn route(&self) -> String {
        json_string(&format!("{}{}", self.args.route, if self.args.lane { "" } else { "+engine" }))
    }
}

/// The rank's whole run; `Err` for setup failures and for any failed check.
pub fn rank_main(args: &Args) -> Result<(), String> {
    let comm = accord_coll::engine::communicator_from_env().map_err(|e| format!("bootstrap: {e}"))?;
    let (rank, world) = (comm.rank(), comm.world_size());
    if world != 2 {
        return Err(format!("runs with exactly 2 ranks, not {world}"));
    }
    let local_rank: usize = std::env::var("LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(rank);
    let gpu = Gpu::open(local_rank).map_err(cuda("opening the GPU"))?;
    let stream = Stream::new(&gpu).map_err(cuda("stream"))?;
    let largest = args.sizes.iter().copied().max().unwrap_or(1 << 20);
    let window_bytes = largest.max(world as u64 * MANY_PEER_BYTES) as usize;
    let recv = DeviceBuffer::alloc(&gpu, window_bytes).map_err(cuda("window 0"))?;
    let send = DeviceBuffer::alloc(&gpu, window_bytes).map_err(cuda("window 1"))?;
    let out_words = OUT_HEADER_WORDS + args.iters as usize + 100;
    let out = DeviceBuffer::alloc(&gpu, out_words * 8).map_err(cuda("result words"))?;
    let config = ProxyConfig {
        rings: 1,
        slot_count: args.slots,
        descriptors_per_turn: args.turn,
        user_signals: USER_SIGNALS,
        counters: 4,
        stream_lane: args.lane,
    };
    let mut proxy = Proxy::open(comm, &gpu, config)?;
    let w0 = proxy.register_device_window(&recv)?;
    let w1 = proxy.register_device_window(&send)?;
    if (w0, w1) != (0, 1) {
        return Err(format!("windows got ids {w0} and {w1}; the kernels expect 0 (receive) and 1 (source)"));
    }
    let table = proxy.table_ptr()?;
    let kernels = Kernels::load(&gpu, &args.defines)?;
    let timeout_ns = args.timeout.min(Duration::from_secs(60)).as_nanos() as u64;
    let mut ctx = Ctx {
        proxy,
        recv,
        send,
        out,
        out_words,
        kernels,
        stream,
        gpu,
        table,
        rank,
        world,
        args: args.clone(),
        timeout_ns,
        failures: Vec::new(),
        ping_header: false,
    };
    if rank == 0 {
        println!(
            "# accord-device-bench: {} ranks, route {}, stream lanes {}, GPU {} ({}), {} proxy ring(s) of {} slots, {} descriptors a turn",
            ctx.world,
            ctx.args.route,
            if ctx.args.lane { "on" } else { "off" },
            ctx.gpu.ordinal(),
            ctx.gpu.name(),
            config.rings,
            config.slot_count,
            config.descriptors_per_turn
        );
        if !ctx.args.defines.is_empty() {
            println!("# kernels compiled with: {}", ctx.args.defines.join(" "));
        }
    }
    run_refusals(&mut ctx)?;
    run_warmup(&mut ctx)?;
    for (mode, bytes, signal) in [
        (PingMode::Proxy, 8, SIGNAL_PING),
        (PingMode::Proxy, 1024, SIGNAL_PING_1K),
        (PingMode::Proxy, 4096, SIGNAL_PING_4K),
        (PingMode::Proxy, 16384, SIGNAL_PING_16K),
        (PingMode::Value, 8, SIGNAL_VALUE),
        (PingMode::Direct, 8, SIGNAL_DIRECT),
        (PingMode::Floor, 8, SIGNAL_FLOOR),
        (PingMode::DirectToRawWait, 8, SIGNAL_DIRECT_RAW),
        (PingMode::RawToWaitSignal, 8, SIGNAL_RAW_WAIT),
        (PingMode::FloorClock64, 8, SIGNAL_FLOOR_CLOCK),
        (PingMode::FloorSum, 8, SIGNAL_FLOOR_SUM),
        (PingMode::FloorFence, 8, SIGNAL_FLOOR_FENCE),
        (PingMode::FloorAcquireLoad, 8, SIGNAL_FLOOR_ACQUIRE),
        (PingMode::DirectPeer, 8, SIGNAL_DIRECT_PEER),
        (PingMode::FloorHoisted, 8, SIGNAL_FLOOR_HOISTED),
    ] {
        if ctx.args.runs("pingpong") {
            run_pingpong(&mut ctx, mode, bytes, signal)?;
        }
    }
    if ctx.args.runs("many_peer") {
        run_many_peer(&mut ctx)?;
    }
    if ctx.args.runs("graph") {
        run_graph(&mut ctx)?;
    }
    if ctx.args.runs("rate") {
        run_rate(&mut ctx, 8)?;
        run_rate(&mut ctx, 64)?;
    }
    if ctx.args.runs("bandwidth") {
        run_bandwidth(&mut ctx)?;
    }
    finish(ctx)
}

/// The proxies' errors and statistics, then the verdict.
fn finish(mut ctx: Ctx) -> Result<(), String> {
    let errors = ctx.proxy.errors();
    for e in &errors {
        ctx.failures.push(format!("rank {}: proxy error: {e}", ctx.rank));
    }
    let s = ctx.proxy.stats();
    let gathered = ctx.gather_words(&[
        s.executed,
        s.bytes,
        s.errors,
        s.signal_writes,
        s.signal_coalesced,
        s.lane_batches,
        s.lane_ops,
        s.lane_submit_ns,
        s.lane_complete_ns,
        s.lane_items,
        s.lane_copies,
        s.lane_queue_ns,
    ])?;
    if ctx.rank == 0 {
        header(
            "proxy statistics per rank (lane: stream-lane batches, their driver calls, mean host time (of it queueing: merging and driver calls) and queued-to-done time, descriptors and merged copies per batch)",
            &[
                ("rank", 5),
                ("descriptors", 12),
                ("bytes", 14),
                ("errors", 7),
                ("signal_wr", 10),
                ("coalesced", 10),
                ("lane_batches", 13),
                ("lane_calls", 11),
                ("host_us", 8),
                ("queue_us", 9),
                ("done_us", 8),
                ("items/b", 8),
                ("copies/b", 9),
            ],
        );
        for (rank, w) in gathered.iter().enumerate() {
            let word = |i: usize| w.get(i).copied().unwrap_or(0);
            let cell = |i: usize| word(i).to_string();
            let per_batch = |i: usize| if word(5) == 0 { 0.0 } else { word(i) as f64 / word(5) as f64 };
            let per_batch_us = |i: usize| per_batch(i) / 1e3;
            row(&[
                (rank.to_string(), 5),
                (cell(0), 12),
                (cell(1), 14),
                (cell(2), 7),
                (cell(3), 10),
                (cell(4), 10),
                (cell(5), 13),
                (cell(6), 11),
                (format!("{:.2}", per_batch_us(7)), 8),
                (format!("{:.2}", per_batch_us(11)), 9),
                (format!("{:.2}", per_batch_us(8)), 8),
                (format!("{:.1}", per_batch(9)), 8),
                (format!("{:.1}", per_batch(10)), 9),
            ]);
            println!(
                "{{\"bench\":\"device_proxy_stats\",\"route\":{},\"rank\":{rank},\"descriptors\":{},\"bytes\":{},\"errors\":{},\"signal_writes\":{},\"signal_coalesced\":{},\"lane_batches\":{},\"lane_driver_calls\":{},\"lane_host_us_per_batch\":{:.3},\"lane_done_us_per_batch\":{:.3},\"lane_items\":{},\"lane_copies\":{},\"lane_queue_us_per_batch\":{:.3}}}",
                ctx.route(),
                cell(0),
                cell(1),
                cell(2),
                cell(3),
                cell(4),
                cell(5),
                cell(6),
                per_batch_us(7),
                per_batch_us(8),
                cell(9),
                cell(10),
                per_batch_us(11)
            );
        }
    }
    let failures = std::mem::take(&mut ctx.failures);
    let Ctx { proxy, .. } = ctx;
    proxy.close()?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} check(s) failed: {}", failures.len(), failures.join("; ")))
    }
}

/// The API's own argument checks: every bad call comes back BAD_ARGUMENT, no descriptor is
/// written (the proxies' error count stays 0).
fn run_refusals(ctx: &mut Ctx) -> Result<(), String> {
    ctx.zero_out()?;
    ctx.kernels.refusals(&ctx.stream, ctx.table, ctx.out.ptr())?;
    ctx.sync("refusals")?;
    let words = ctx.read_out(OUT_HEADER_WORDS)?;
    let errors = ctx.proxy.stats().errors;
    let gathered = ctx.gather_words(&[words[0], 0, words[2], errors])?;
    let mut ok = ctx.judge("refusals", &gathered);
    for (rank, w) in gathered.iter().enumerate() {
        if w[2] != 0 || w[3] != 0 {
            ok = false;
            ctx.failures
                .push(format!("refusals: rank {rank}: {} bad call(s) were not refused, {} proxy error(s)", w[2], w[3]));
        }
    }
    if ctx.rank == 0 {
        println!(
            "# refusals: 9 bad calls per rank: {}",
            if ok { "all refused, no descriptor written" } else { "FAILED" }
        );
        println!("{{\"bench\":\"device_refusals\",\"route\":{},\"ok\":{ok}}}", ctx.route());
    }
    Ok(())
}

/// Every rank puts once to every rank and the host waits, with no kernel spinning, until the
/// proxy ran them: the engine opens its peer mappings (windows, signal slots) on an idle GPU,
/// before any timed kernel, where a mapping call that waited for running kernels could stall a
/// spinning one. Then a device wait checks every rank's signal arrived.
fn run_warmup(ctx: &mut Ctx) -> Result<(), String> {
    ctx.zero_out()?;
    ctx.barrier()?;
    let before = ctx.proxy.stats().executed;
    ctx.kernels.warm(&ctx.stream, ctx.table, SIGNAL_WARM, ctx.out.ptr())?;
    ctx.sync("warm-up puts")?;
    let want = before + ctx.world as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while ctx.proxy.stats().executed < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let executed = ctx.proxy.stats().executed - before;
    ctx.barrier()?;
    ctx.kernels.wait(&ctx.stream, ctx.table, SIGNAL_WARM, ctx.world as u64, ctx.timeout_ns, ctx.out.ptr())?;
    ctx.sync("warm-up wait")?;
    let words = ctx.read_out(OUT_HEADER_WORDS)?;
    let gathered = ctx.gather_words(&[words[0], words[1], executed])?;
    let mut ok = ctx.judge("warm-up", &gathered);
    for (rank, w) in gathered.iter().enumerate() {
        if w[2] != ctx.world as u64 {
            ok = false;
            ctx.failures.push(format!("warm-up: rank {rank}'s proxy ran {} of {} puts within 30 s", w[2], ctx.world));
        }
    }
    if ctx.rank == 0 {
        println!(
            "# warm-up: one put with a signal from every rank to every rank: {}",
            if ok { "ok" } else { "FAILED" }
        );
    }
    Ok(())
}

/// Kernel-to-kernel ping-pong: medians and p99 of the round trip over `--iters` iterations
/// (after a warm-up), the stamp and pattern of every message checked at the receiver.
fn run_pingpong(ctx: &mut Ctx, mode: PingMode, bytes: u64, signal: u32) -> Result<(), String> {
    if !matches!(mode, PingMode::Proxy | PingMode::Value) {
        ctx.zero_out()?;
        ctx.kernels.probe_direct(&ctx.stream, ctx.table, (ctx.rank ^ 1) as u32, ctx.out.ptr())?;
        ctx.sync("direct-store probe")?;
        let mapped = ctx.read_out(OUT_HEADER_WORDS)?[2];
        let gathered = ctx.gather_words(&[mapped])?;
        if gathered.iter().any(|w| w[0] == 0) {
            if ctx.rank == 0 {
                let why = "the host side mapped no peer window for direct stores (WindowEntry.peer_bases[peer] = 0)";
                println!("# ping-pong {}: skipped: {why}", mode.name());
                println!(
                    "{{\"bench\":\"device_pingpong\",\"route\":{},\"mode\":\"{}\",\"skipped\":{}}}",
                    ctx.route(),
                    mode.name(),
                    json_string(why)
                );
            }
            return Ok(());
        }
    }
    let warm = (ctx.args.iters / 10).clamp(1, 100);
    let total = warm + ctx.args.iters;
    ctx.zero_out()?;
    ctx.barrier()?;
    ctx.kernels.pingpong(&ctx.stream, ctx.table, total, bytes, mode, signal, ctx.timeout_ns, ctx.out.ptr())?;
    ctx.sync("ping-pong")?;
    let words = ctx.read_out(OUT_HEADER_WORDS + total as usize)?;
    let gathered = ctx.gather_words(&words[..OUT_HEADER_WORDS])?;
    let what = format!("ping-pong {}", mode.name());
    let mut ok = ctx.judge(&what, &gathered);
    for (rank, w) in gathered.iter().enumerate() {
        if w[2] != total {
            ok = false;
            ctx.failures.push(format!("{what}: rank {rank} finished {} of {total} iterations", w[2]));
        }
    }
    if ctx.rank == 0 {
        let samples: Vec<f64> = words[OUT_HEADER_WORDS + warm as usize..].iter().map(|ns| *ns as f64 / 1e3).collect();
        let (med, p99) = (median(&samples), percentile(&samples, 0.99));
        if !ctx.ping_header {
            ctx.ping_header = true;
            header(
                &format!(
                    "ping-pong, kernel to kernel, {} iterations after {warm} warm-up (round trip; one way = half)",
                    ctx.args.iters
                ),
                &[
                    ("mode", 11),
                    ("bytes", 7),
                    ("rtt_med_us", 11),
                    ("rtt_p99_us", 11),
                    ("one_way_us", 11),
                    ("wrong", 6),
                    ("ok", 4),
                ],
            );
        }
        let bad: u64 = gathered.iter().map(|w| w[1]).sum();
        row(&[
            (mode.name().into(), 11),
            (bytes.to_string(), 7),
            (format!("{med:.2}"), 11),
            (format!("{p99:.2}"), 11),
            (format!("{:.2}", med / 2.0), 11),
            (bad.to_string(), 6),
            (ok.to_string(), 4),
        ]);
        println!(
            "{{\"bench\":\"device_pingpong\",\"route\":{},\"mode\":\"{}\",\"bytes\":{bytes},\"iters\":{},\"rtt_median_us\":{med:.3},\"rtt_p99_us\":{p99:.3},\"one_way_us\":{:.3},\"wrong_bytes\":{bad},\"ok\":{ok}}}",
            ctx.route(),
            mode.name(),
            ctx.args.iters,
            med / 2.0
        );
    }
    Ok(())
}

/// Every rank puts a distinct pattern into every rank (itself included) with a signal, waits
/// for all, checks every byte; a device barrier separates the rounds.
fn run_many_peer(ctx: &mut Ctx) -> Result<(), String> {
    ctx.zero_out()?;
    ctx.barrier()?;
    let start = Instant::now();
    for round in 0..ctx.args.rounds {
        let (stream, table, out) = (&ctx.stream, ctx.table, ctx.out.ptr());
        ctx.kernels.many_peer(stream, table, 256, MANY_PEER_BYTES, round, SIGNAL_MANY, ctx.timeout_ns, out)?;
        ctx.kernels.barrier(stream, table, 1, ctx.timeout_ns, out)?;
    }
    ctx.sync("many-peer")?;
    let seconds = start.elapsed().as_secs_f64();
    let words = ctx.read_out(OUT_HEADER_WORDS)?;
    let gathered = ctx.gather_words(&words)?;
    let mut ok = ctx.judge("many-peer", &gathered);
    for (rank, w) in gathered.iter().enumerate() {
        if w[2] != ctx.args.rounds {
            ok = false;
            ctx.failures.push(format!("many-peer: rank {rank} passed {} of {} barriers", w[2], ctx.args.rounds));
        }
    }
    if ctx.rank == 0 {
        let bad: u64 = gathered.iter().map(|w| w[1]).sum();
        header(
            "many-peer puts with signals, every rank to every rank (itself included), bytes checked on the GPU",
            &[
                ("ranks", 6),
                ("rounds", 7),
                ("bytes/peer", 11),
                ("ms/round", 9),
                ("barriers", 9),
                ("wrong", 6),
                ("ok", 4),
            ],
        );
        let per_round_ms = seconds * 1e3 / ctx.args.rounds as f64;
        row(&[
            (ctx.world.to_string(), 6),
            (ctx.args.rounds.to_string(), 7),
            (MANY_PEER_BYTES.to_string(), 11),
            (format!("{per_round_ms:.2}"), 9),
            (gathered[0][2].to_string(), 9),
            (bad.to_string(), 6),
            (ok.to_string(), 4),
        ]);
        println!(
            "{{\"bench\":\"device_many_peer\",\"route\":{},\"ranks\":{},\"rounds\":{},\"bytes_per_peer\":{MANY_PEER_BYTES},\"ms_per_round\":{per_round_ms:.3},\"wrong_bytes\":{bad},\"ok\":{ok}}}",
            ctx.route(),
            ctx.world,
            ctx.args.rounds
        );
    }
    Ok(())
}

/// A one-iteration ping-pong kernel captured in a CUDA graph, replayed `--replays` times: each
/// replay continues the count the last one left, and every message is checked.
fn run_graph(ctx: &mut Ctx) -> Result<(), String> {
    ctx.zero_out()?;
    let (kernels, table, timeout_ns, out) = (&ctx.kernels, ctx.table, ctx.timeout_ns, ctx.out.ptr());
    let graph = Graph::capture(&ctx.stream, |s| {
        kernels
            .pingpong(s, table, 1, 64, PingMode::Proxy, SIGNAL_GRAPH, timeout_ns, out)
            .map_err(|what| CudaError::InvalidArgument { what })
    })
    .map_err(cuda("capturing the ping-pong kernel"))?;
    ctx.barrier()?;
    let start = Instant::now();
    for _ in 0..ctx.args.replays {
        graph.launch(&ctx.stream).map_err(cuda("graph launch"))?;
    }
    ctx.sync("graph replays")?;
    let us_per_replay = start.elapsed().as_secs_f64() * 1e6 / ctx.args.replays as f64;
    drop(graph);
    let words = ctx.read_out(OUT_HEADER_WORDS)?;
    let gathered = ctx.gather_words(&words)?;
    let mut ok = ctx.judge("graph replay", &gathered);
    for (rank, w) in gathered.iter().enumerate() {
        if w[2] != ctx.args.replays {
            ok = false;
            ctx.failures.push(format!("graph replay: rank {rank} completed {} of {} replays", w[2], ctx.args.replays));
        }
    }
    if ctx.rank == 0 {
        let bad: u64 = gathered.iter().map(|w| w[1]).sum();
        header(
            "CUDA graph: one ping-pong (put 64 B + signal, wait, reply) captured, replayed",
            &[("replays", 8), ("completed", 10), ("us/replay", 10), ("wrong", 6), ("ok", 4)],
        );
        row(&[
            (ctx.args.replays.to_string(), 8),
            (gathered[0][2].to_string(), 10),
            (format!("{us_per_replay:.2}"), 10),
            (bad.to_string(), 6),
            (ok.to_string(), 4),
        ]);
        println!(
            "{{\"bench\":\"device_graph_replay\",\"route\":{},\"replays\":{},\"completed\":{},\"us_per_replay\":{us_per_replay:.3},\"wrong_bytes\":{bad},\"ok\":{ok}}}",
            ctx.route(),
            ctx.args.replays,
            gathered[0][2]
        );
    }
    Ok(())
}

/// Descriptors per second through one proxy thread: rank 0's grid issues small puts to rank 1,
/// then one thread flushes; timed with events around both kernels. Every put must have been
/// executed by the proxy exactly once (its executed count moves by exactly the puts issued).
fn run_rate(ctx: &mut Ctx, stride: u64) -> Result<(), String> {
    const BYTES: u64 = 8;
    let (blocks, threads) = ctx.args.rate_grid;
    let puts = u64::from(blocks) * u64::from(threads) * ctx.args.rate_puts;
    ctx.zero_out()?;
    ctx.barrier()?;
    let mut seconds = 0.0;
    let mut executed = 0;
    let mut lane = ProxyStats::default();
    if ctx.rank == 0 {
        let stats_before = ctx.proxy.stats();
        let before = stats_before.executed;
        let start = Event::new(&ctx.gpu, EventKind::Timing).map_err(cuda("event"))?;
        let end = Event::new(&ctx.gpu, EventKind::Timing).map_err(cuda("event"))?;
        start.record(&ctx.stream).map_err(cuda("event"))?;
        ctx.kernels.rate(
            &ctx.stream,
            ctx.table,
            (blocks, threads),
            1,
            ctx.args.rate_puts,
            BYTES,
            stride,
            ctx.out.ptr(),
        )?;
        ctx.kernels.flush(&ctx.stream, ctx.table, ctx.timeout_ns, ctx.out.ptr())?;
        end.record(&ctx.stream).map_err(cuda("event"))?;
        end.synchronize().map_err(cuda("descriptor rate"))?;
        seconds = f64::from(end.elapsed_ms_since(&start).map_err(cuda("event"))?) / 1e3;
        // The flush saw every ticket completed; the executed count is bumped beside it, so give
        // it a bounded moment to catch up before comparing.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            executed = ctx.proxy.stats().executed - before;
            if executed >= puts || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        lane = ctx.proxy.stats().since(&stats_before);
    }
    let words = ctx.read_out(OUT_HEADER_WORDS)?;
    let gathered = ctx.gather_words(&[words[0], words[1], words[2], executed])?;
    let mut ok = ctx.judge("descriptor rate", &gathered);
    if gathered[0][2] != puts || gathered[0][3] != puts {
        ok = false;
        ctx.failures.push(format!(
            "descriptor rate: {puts} puts asked, {} issued, {} executed by the proxy",
            gathered[0][2], gathered[0][3]
        ));
    }
    if ctx.rank == 0 {
        let rate = if seconds > 0.0 { puts as f64 / seconds } else { 0.0 };
        if stride == BYTES {
            header(
                "descriptor rate: small puts from a grid of threads, one proxy thread, until flushed \
                 (stride = bytes: neighbours contiguous; stride > bytes: gaps, nothing merges); this run's \
                 stream-lane batches: descriptors and merged copies per batch, the proxy's mean µs a batch from \
                 its turn's start to queued (of it in merging and driver calls), the proxy's µs a batch taking and \
                 checking descriptors and retiring done batches, and the share of the run's time in those three",
                &[
                    ("grid", 9),
                    ("puts", 9),
                    ("bytes", 6),
                    ("stride", 7),
                    ("ms", 9),
                    ("Mputs/s", 9),
                    ("executed", 9),
                    ("ok", 4),
                    ("batches", 8),
                    ("items/b", 8),
                    ("copies/b", 9),
                    ("host_us", 8),
                    ("queue_us", 9),
                    ("take_us", 8),
                    ("retire_us", 10),
                    ("busy", 6),
                ],
            );
        }
        let per_batch = |v: u64| if lane.lane_batches > 0 { v as f64 / lane.lane_batches as f64 } else { 0.0 };
        let busy_ns = lane.take_ns + lane.lane_queue_ns + lane.lane_retire_ns;
        let busy = if seconds > 0.0 { busy_ns as f64 / 1e9 / seconds } else { 0.0 };
        row(&[
            (format!("{blocks}x{threads}"), 9),
            (puts.to_string(), 9),
            (BYTES.to_string(), 6),
            (stride.to_string(), 7),
            (format!("{:.3}", seconds * 1e3), 9),
            (format!("{:.3}", rate / 1e6), 9),
            (gathered[0][3].to_string(), 9),
            (ok.to_string(), 4),
            (lane.lane_batches.to_string(), 8),
            (format!("{:.1}", per_batch(lane.lane_items)), 8),
            (format!("{:.1}", per_batch(lane.lane_copies)), 9),
            (format!("{:.2}", per_batch(lane.lane_submit_ns) / 1e3), 8),
            (format!("{:.2}", per_batch(lane.lane_queue_ns) / 1e3), 9),
            (format!("{:.2}", per_batch(lane.take_ns) / 1e3), 8),
            (format!("{:.2}", per_batch(lane.lane_retire_ns) / 1e3), 10),
            (format!("{:.2}", busy), 6),
        ]);
        println!(
            "{{\"bench\":\"device_put_rate\",\"route\":{},\"blocks\":{blocks},\"threads\":{threads},\"puts\":{puts},\"bytes\":{BYTES},\"stride\":{stride},\"seconds\":{seconds:.6},\"puts_per_s\":{rate:.0},\"executed\":{},\"ok\":{ok},\"lane_batches\":{},\"lane_items\":{},\"lane_copies\":{},\"lane_host_ns\":{},\"lane_queue_ns\":{},\"take_ns\":{},\"lane_retire_ns\":{},\"proxy_busy\":{busy:.3}}}",
            ctx.route(),
            gathered[0][3],
            lane.lane_batches,
            lane.lane_items,
            lane.lane_copies,
            lane.lane_submit_ns,
            lane.lane_queue_ns,
            lane.take_ns,
            lane.lane_retire_ns
        );
    }
    ctx.barrier()
}

/// Large puts from rank 0 to rank 1: GB/s of `--bw-iters` puts of each size (issued by one
/// thread, flushed), the IPC copy ceiling (raw copies into rank 1's window mapped through CUDA
/// IPC, route ipc only) and the engine's own host-initiated writes of the same size, measured in
/// the same run; rank 1 checks every byte of each size.
fn run_bandwidth(ctx: &mut Ctx) -> Result<(), String> {
    let largest = ctx.args.sizes.iter().copied().max().unwrap_or(1 << 20) as usize;
    // The receiver's window for the ceiling, through CUDA IPC.
    let handle = if ctx.rank == 1 {
        IpcHandle::export(&ctx.recv).map_err(cuda("exporting window 0"))?.to_bytes().to_vec()
    } else {
        Vec::new()
    };
    let handles = all_gather(ctx.proxy.communicator(), &handle)?;
    let mapping = if ctx.rank == 0 && ctx.args.route == "ipc" {
        let bytes: [u8; accord_cuda::ipc::IPC_HANDLE_BYTES] = handles[1]
            .as_slice()
            .try_into()
            .map_err(|_| "rank 1 sent an IPC handle of the wrong length".to_string())?;
        let handle = IpcHandle::from_bytes(&bytes).map_err(|e| format!("rank 1's IPC handle: {e}"))?;
        Some(IpcMapping::open(&ctx.gpu, &handle).map_err(cuda("mapping rank 1's window"))?)
    } else {
        None
    };
    // The engine's host-initiated writes between buffers of its own, the same memory kind.
    let engine = ctx.proxy.communicator().transport().engine().clone();
    let base = DeviceBuffer::alloc(&ctx.gpu, largest).map_err(cuda("engine baseline buffer"))?;
    let kind = MemoryKind::CudaDevice { ordinal: ctx.gpu.ordinal() as u32 };
    // Safety: `base` outlives the registration (deregistered at the end of this function, after
    // every write was waited for) and no Rust reference points into it.
    #[allow(unsafe_code)]
    let registered = unsafe { engine.register_raw(base.ptr().0 as *mut u8, largest, kind) };
    let (base_handle, base_desc) = registered.map_err(|e| format!("registering the baseline buffer: {e}"))?;
    let descs = all_gather(ctx.proxy.communicator(), base_desc.to_string_compact().as_bytes())?;
    let peer_desc = MrDescriptor::parse(&String::from_utf8_lossy(&descs[1])).map_err(|e| format!("{e}"))?;
    if ctx.rank == 0 {
        header(
            &format!(
                "large puts rank 0 -> 1, {} puts per size, one issuing thread then flush; ceiling: raw IPC copies; engine: host-initiated writes",
                ctx.args.bw_iters
            ),
            &[
                ("bytes", 11),
                ("ceil_GB/s", 10),
                ("engine_GB/s", 12),
                ("put_GB/s", 9),
                ("put/ceil", 9),
                ("put/eng", 8),
                ("copy_SMs", 9),
                ("wrong", 6),
                ("ok", 4),
            ],
        );
    }
    let sizes = ctx.args.sizes.clone();
    let mut result = Ok(());
    for (k, &bytes) in sizes.iter().enumerate() {
        result = bandwidth_size(ctx, k as u64, bytes, mapping.as_ref(), (&engine, &base_handle, &peer_desc));
        if result.is_err() {
            break;
        }
    }
    engine.deregister(&base_handle);
    drop(base);
    if ctx.rank == 0 {
        println!(
            "# copy_SMs: SMs spent moving the bytes of a put. 0 through the proxy: in the timed window the GPU runs one \
             kernel, accord_dev_bandwidth (1 CTA, 1 thread), which writes descriptors and polls the flush; the bytes \
             move by the engine's copy-engine copies (cuMemcpy*Async, which launch no kernel) or its network route."
        );
    }
    result
}

/// GB/s of `iters` raw IPC copies of `len` bytes into the peer's window, dealt round robin over
/// `streams` streams (can several copy engines together beat one stream's ceiling at this size?).
fn ceiling_over_streams(ctx: &Ctx, m: &IpcMapping, len: usize, iters: u64, streams: u32) -> Result<f64, String> {
    let list: Vec<Stream> =
        (0..streams).map(|_| Stream::new(&ctx.gpu).map_err(cuda("ceiling stream"))).collect::<Result<_, _>>()?;
    let copy = |s: &Stream| copy_peer_async(m.ptr(), &ctx.gpu, ctx.send.ptr(), &ctx.gpu, len, s);
    for s in &list {
        copy(s).map_err(cuda("ceiling copy"))?;
        s.synchronize().map_err(cuda("ceiling copy"))?;
    }
    let t = Instant::now();
    for i in 0..iters {
        copy(&list[i as usize % list.len()]).map_err(cuda("ceiling copy"))?;
    }
    for s in &list {
        s.synchronize().map_err(cuda("ceiling copies"))?;
    }
    Ok(gbps(len as u64 * iters, t.elapsed().as_secs_f64()))
}

type Baseline<'a> = (&'a std::sync::Arc<accord_engine::Engine>, &'a accord_engine::MrHandle, &'a MrDescriptor);

fn bandwidth_size(
    ctx: &mut Ctx,
    round: u64,
    bytes: u64,
    mapping: Option<&IpcMapping>,
    baseline: Baseline<'_>,
) -> Result<(), String> {
    let iters = ctx.args.bw_iters;
    let len = bytes as usize;
    let (mut ceiling, mut engine_gbps, mut put_gbps) = (None, 0.0, 0.0);
    if ctx.rank == 0 {
        ctx.kernels.fill(&ctx.stream, ctx.send.ptr(), bytes, (0, 1), round)?;
        ctx.sync("fill")?;
        if let Some(m) = mapping {
            let copy = |ctx: &Ctx| copy_peer_async(m.ptr(), &ctx.gpu, ctx.send.ptr(), &ctx.gpu, len, &ctx.stream);
            copy(ctx).map_err(cuda("ceiling copy"))?;
            ctx.sync("ceiling copy")?;
            let t = Instant::now();
            for _ in 0..iters {
                copy(ctx).map_err(cuda("ceiling copy"))?;
            }
            ctx.sync("ceiling copies")?;
            ceiling = Some(gbps(bytes * iters, t.elapsed().as_secs_f64()));
            if ctx.args.ceiling_streams > 1 {
                let n = ctx.args.ceiling_streams;
                let many = ceiling_over_streams(ctx, m, len, iters, n)?;
                println!(
                    "# ceiling over {n} streams, {bytes} B copies dealt round robin: {many:.1} GB/s ({:.3}x one stream)",
                    many / ceiling.unwrap_or(f64::NAN)
                );
                println!(
                    "{{\"bench\":\"device_copy_ceiling\",\"route\":{},\"bytes\":{bytes},\"iters\":{iters},\"streams\":{n},\"gbps\":{many:.2},\"one_stream_gbps\":{:.2}}}",
                    ctx.route(),
                    ceiling.unwrap_or(0.0)
                );
            }
        }
        let (engine, handle, peer) = baseline;
        let op = WriteOp { src: handle, src_offset: 0, dst: peer, dst_offset: 0, len: bytes, imm: None };
        let write_wait = |n: u64| -> Result<(), String> {
            let transfers: Vec<_> = (0..n)
                .map(|_| engine.write(&op).map_err(|e| format!("engine write: {e}")))
                .collect::<Result<_, _>>()?;
            for t in transfers {
                t.wait_timeout(Duration::from_secs(60)).map_err(|e| format!("engine write: {e}"))?;
            }
            Ok(())
        };
        write_wait(1)?;
        let t = Instant::now();
        write_wait(iters)?;
        engine_gbps = gbps(bytes * iters, t.elapsed().as_secs_f64());
    }
    ctx.barrier()?;
    if ctx.rank == 1 {
        ctx.recv.memset_async(0, len, 0, &ctx.stream).map_err(cuda("clearing window 0"))?;
        ctx.sync("clearing window 0")?;
    }
    ctx.zero_out()?;
    ctx.barrier()?;
    if ctx.rank == 0 {
        let start = Event::new(&ctx.gpu, EventKind::Timing).map_err(cuda("event"))?;
        let end = Event::new(&ctx.gpu, EventKind::Timing).map_err(cuda("event"))?;
        start.record(&ctx.stream).map_err(cuda("event"))?;
        let out = ctx.out.ptr();
        ctx.kernels.bandwidth(&ctx.stream, ctx.table, 1, bytes, iters, SIGNAL_BANDWIDTH, ctx.timeout_ns, out)?;
        end.record(&ctx.stream).map_err(cuda("event"))?;
        end.synchronize().map_err(cuda("bandwidth"))?;
        put_gbps = gbps(bytes * iters, f64::from(end.elapsed_ms_since(&start).map_err(cuda("event"))?) / 1e3);
    } else {
        let out: DevicePtr = ctx.out.ptr();
        ctx.kernels.wait(&ctx.stream, ctx.table, SIGNAL_BANDWIDTH, round + 1, ctx.timeout_ns, out)?;
        ctx.kernels.check(&ctx.stream, ctx.recv.ptr(), bytes, (0, 1), round, out)?;
        ctx.sync("bandwidth check")?;
    }
    let words = ctx.read_out(OUT_HEADER_WORDS)?;
    let gathered = ctx.gather_words(&words[..2])?;
    let ok = ctx.judge(&format!("bandwidth {bytes} B"), &gathered);
    if ctx.rank == 0 {
        let bad: u64 = gathered.iter().map(|w| w[1]).sum();
        let ratio = |base: f64| if base > 0.0 { format!("{:.3}", put_gbps / base) } else { "-".into() };
        let ceiling_text = ceiling.map_or("-".into(), |c| format!("{c:.1}"));
        row(&[
            (bytes.to_string(), 11),
            (ceiling_text, 10),
            (format!("{engine_gbps:.1}"), 12),
            (format!("{put_gbps:.1}"), 9),
            (ratio(ceiling.unwrap_or(0.0)), 9),
            (ratio(engine_gbps), 8),
            ("0".into(), 9),
            (bad.to_string(), 6),
            (ok.to_string(), 4),
        ]);
        println!(
            "{{\"bench\":\"device_put_bandwidth\",\"route\":{},\"bytes\":{bytes},\"iters\":{iters},\"ceiling_gbps\":{},\"engine_write_gbps\":{engine_gbps:.2},\"put_gbps\":{put_gbps:.2},\"put_vs_ceiling\":{},\"put_vs_engine\":{},\"copy_sms\":0,\"issuer_ctas\":1,\"wrong_bytes\":{bad},\"ok\":{ok}}}",
            ctx.route(),
            ceiling.map_or("null".into(), |c| format!("{c:.2}")),
            ceiling.map_or("null".into(), |c| if c > 0.0 { format!("{:.4}", put_gbps / c) } else { "null".into() }),
            if engine_gbps > 0.0 { format!("{:.4}", put_gbps / engine_gbps) } else { "null".into() },
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use accord_coll::{CollConfig, LocalFabric};

    /// Records of different lengths (one empty) come back whole, by rank, on every rank.
    #[test]
    fn all_gather_returns_every_ranks_record_whole() {
        let records: Vec<Vec<u8>> = vec![b"rank zero".to_vec(), Vec::new(), vec![7u8; 300]];
        let transports = LocalFabric::create(records.len()).expect("fabric");
        let threads: Vec<_> = transports
            .into_iter()
            .zip(records.clone())
            .map(|(t, record)| {
                std::thread::spawn(move || {
                    let mut comm = Communicator::new(t, CollConfig::default()).expect("communicator");
                    all_gather(&mut comm, &record)
                })
            })
            .collect();
        for thread in threads {
            assert_eq!(thread.join().expect("rank thread").expect("all_gather"), records);
        }
    }
}
