//! `accord bench p2p` as a library: two processes on loopback, Accord writes against a plain TCP
//! stream between the same two processes in the same run, and Accord with shared memory (the
//! default for same-host peers; `ACCORD_SHM=0` turns it off) against Accord forced onto UDP.
//!
//! The calling program must call [`run_child_if_requested`] first thing in `main` and exit with
//! the code it returns: the benchmark re-executes the current binary as its second process.

use accord_engine::{Engine, EngineAddress, FaultConfig, MrDescriptor, PagedWriteOp, Transfer, WriteOp};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

pub mod telemetry_ab;
pub use telemetry_ab::{format_ab_json, format_ab_table, run_telemetry_ab, AbOptions, AbReport, AbRow};

/// Environment variable that marks the benchmark's second process (value: the TCP address to
/// connect to).
pub const CHILD_ENV: &str = "ACCORD_P2P_BENCH_CHILD";
/// Environment variable carrying `--loss` to the second process.
const CHILD_LOSS_ENV: &str = "ACCORD_P2P_BENCH_LOSS";
/// Largest write size the benchmark accepts.
pub const BENCH_BYTES_MAX: u64 = 1 << 30;
/// Bytes moved per size and transport (bounds the run time).
const BYTES_PER_SIZE: u64 = 512 << 20;
/// Most writes per size.
const ITERATIONS_MAX: u64 = 2000;
/// Writes timed one at a time per size for `one_write_us`.
const LATENCY_SAMPLES: usize = 20;
/// The whole benchmark must finish within this.
const CHILD_DEADLINE: Duration = Duration::from_secs(300);
/// How long one write of the bench may take before the run fails.
const WRITE_WAIT: Duration = Duration::from_secs(120);

/// Options of `accord bench p2p`.
#[derive(Clone, Debug)]
pub struct P2pOptions {
    /// Write sizes in bytes.
    pub sizes: Vec<u64>,
    /// Add a row of paged writes with this page size (64 KiB by default).
    pub paged_page_bytes: Option<u64>,
    /// Pages per paged write.
    pub paged_pages: u64,
    /// Inject this packet loss probability on both engines.
    pub loss: Option<f64>,
}

impl Default for P2pOptions {
    /// 4 KiB to 256 MiB in powers of four, plus 64 KiB paged writes (256 pages), no loss.
    fn default() -> Self {
        P2pOptions {
            sizes: (0..9).map(|i| 4096u64 << (2 * i)).collect(),
            paged_page_bytes: Some(64 * 1024),
            paged_pages: 256,
            loss: None,
        }
    }
}

/// One row of the result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct P2pRow {
    /// `write` or `paged`.
    pub op: String,
    /// Bytes per write (for paged writes: all pages of one write).
    pub bytes: u64,
    /// Accord throughput, GB/s (1e9 bytes per second).
    pub accord_gbps: f64,
    /// TCP throughput between the same processes, GB/s.
    pub tcp_gbps: f64,
    /// `accord_gbps / tcp_gbps`.
    pub vs_tcp: f64,
    /// Accord throughput with shared memory off (kernel UDP over loopback), GB/s: the
    /// baseline of the same-host datapath, measured in the same run.
    pub udp_gbps: f64,
    /// `accord_gbps / udp_gbps`.
    pub vs_udp: f64,
    /// Share of the engine under test's datagrams (this row) that went through shared memory:
    /// 1.0 when the same-host datapath carried everything, 0.0 with `ACCORD_SHM=0`.
    pub shm_share: f64,
    /// Share of this row's written bytes that the receiver pulled straight from the sender's
    /// memory (`process_vm_readv`, writes of at least `ACCORD_CMA_MIN_BYTES`) instead of
    /// receiving them as datagrams.
    pub cma_share: f64,
    /// Time from submitting one write of this size, alone, to its completion at the sender,
    /// microseconds (median of 20): a completion time that grows with the size; a latency only
    /// for the smallest rows.
    pub one_write_us: f64,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Setup or I/O failed.
    #[error("benchmark I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// The engine failed.
    #[error("benchmark engine error: {0}")]
    Engine(String),
    /// Bad options.
    #[error("invalid benchmark options: {0}")]
    Options(String),
}

fn engine_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Engine(e.to_string())
}

#[derive(Serialize, Deserialize)]
struct Hello {
    address: EngineAddress,
    region: MrDescriptor,
}

const OP_TCP: u8 = 1;
const OP_VERIFY: u8 = 2;
const OP_EXIT: u8 = 3;
/// As `OP_VERIFY`, on the UDP-only engine.
const OP_VERIFY_UDP: u8 = 4;
/// Pause (`a` = 0) or resume (`a` = 1) telemetry's recording in the second process, so both
/// ends of a telemetry A/B block record or neither does.
const OP_RECORDING: u8 = 5;

fn send_cmd(s: &mut TcpStream, op: u8, a: u64, b: u64) -> std::io::Result<()> {
    let mut m = [0u8; 17];
    m[0] = op;
    m[1..9].copy_from_slice(&a.to_le_bytes());
    m[9..17].copy_from_slice(&b.to_le_bytes());
    s.write_all(&m)
}

fn read_byte(s: &mut TcpStream) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(b[0])
}

/// The engine under test (environment overrides apply) and, with `udp_only`, the same with
/// shared memory off whatever the environment says.
fn build_engine(loss: Option<f64>, udp_only: bool) -> Result<Engine, BenchError> {
    let mut config =
        accord_engine::EngineConfig::default().with_overrides_from(|n| std::env::var(n).ok()).map_err(engine_err)?;
    if let Some(p) = loss.filter(|p| *p > 0.0) {
        config.fault = Some(FaultConfig { drop: p, ..FaultConfig::default() });
        config.fault_seed = std::process::id() as u64;
    }
    if udp_only {
        // The kernel-UDP baseline: no shared-memory rings and no pulls between processes.
        config.shm.enabled = false;
        config.cma = false;
    }
    Engine::builder().config(config).ignore_env().build().map_err(engine_err)
}

/// Runs the benchmark's second process when this process is it and returns the code that
/// process must exit with; returns `None` at once otherwise. Call it first thing in `main` of any
/// binary that calls [`run`], and return the code from `main`: a library does not end the
/// process.
#[must_use = "the second process must exit with this code instead of going on with main"]
pub fn run_child_if_requested() -> Option<ExitCode> {
    let addr = std::env::var(CHILD_ENV).ok()?;
    Some(match child(&addr) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("accord p2p bench child: {e}");
            ExitCode::FAILURE
        }
    })
}

fn child(addr: &str) -> Result<(), BenchError> {
    let loss = std::env::var(CHILD_LOSS_ENV).ok().and_then(|v| v.parse().ok());
    let engines = [build_engine(loss, false)?, build_engine(loss, true)?];
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let max = accord_knobs::env::<u64>("ACCORD_P2P_BENCH_MAX").map_err(|e| BenchError::Options(e.to_string()))?;
    let max = max.unwrap_or(1 << 20);
    let mut regions = vec![];
    for engine in &engines {
        let region = engine.alloc(max as usize).map_err(engine_err)?;
        region.fill(0);
        let hello = serde_json::to_vec(&Hello { address: engine.address(), region: region.descriptor() })
            .map_err(engine_err)?;
        s.write_all(&(hello.len() as u32).to_le_bytes())?;
        s.write_all(&hello)?;
        regions.push(region);
    }
    let mut sink = vec![0u8; max as usize];
    // Touch every page up front so neither transport pays first-touch faults while timed.
    sink.fill(1);
    loop {
        let mut m = [0u8; 17];
        s.read_exact(&mut m)?;
        let a = u64::from_le_bytes(m[1..9].try_into().expect("8 bytes"));
        let b = u64::from_le_bytes(m[9..17].try_into().expect("8 bytes"));
        match m[0] {
            OP_TCP => {
                for _ in 0..b {
                    s.read_exact(&mut sink[..a as usize])?;
                }
                s.write_all(&[1])?;
            }
            OP_VERIFY | OP_VERIFY_UDP => {
                let engine = &engines[usize::from(m[0] == OP_VERIFY_UDP)];
                let got = engine.imm_counter(a as u32).wait(b, Duration::from_secs(60));
                s.write_all(&[u8::from(got >= b)])?;
            }
            OP_RECORDING => {
                accord_engine::telemetry::set_recording(a != 0);
                s.write_all(&[1])?;
            }
            _ => return Ok(()),
        }
    }
}

/// One engine of the parent and where it writes.
struct Side {
    engine: Engine,
    src: accord_engine::MrBuffer,
    dst: MrDescriptor,
}

/// Index of the engine under test in `Parent::sides`; the other is the UDP-only baseline.
const SIDE_DEFAULT: usize = 0;
const SIDE_UDP: usize = 1;

struct Parent {
    sides: Vec<Side>,
    tcp: TcpStream,
    data: Vec<u8>,
}

fn iterations(bytes: u64) -> u64 {
    (BYTES_PER_SIZE / bytes.max(1)).clamp(2, ITERATIONS_MAX)
}

impl Parent {
    fn tcp(&mut self, bytes: u64, iters: u64) -> Result<f64, BenchError> {
        let data = &self.data;
        let start = Instant::now();
        send_cmd(&mut self.tcp, OP_TCP, bytes, iters)?;
        for _ in 0..iters {
            self.tcp.write_all(&data[..bytes as usize])?;
        }
        read_byte(&mut self.tcp)?;
        Ok((bytes * iters) as f64 / start.elapsed().as_secs_f64() / 1e9)
    }

    fn verify(&mut self, side: usize, imm: u32, target: u64) -> Result<(), BenchError> {
        let op = if side == SIDE_UDP { OP_VERIFY_UDP } else { OP_VERIFY };
        send_cmd(&mut self.tcp, op, imm as u64, target)?;
        match read_byte(&mut self.tcp)? {
            1 => Ok(()),
            _ => Err(BenchError::Engine(format!("peer counted fewer than {target} writes with imm {imm}"))),
        }
    }

    /// Seconds `n` writes take on `side`, all submitted, then all awaited (each at most
    /// [`WRITE_WAIT`]).
    fn pipelined(
        &self,
        side: usize,
        n: u64,
        submit: &dyn Fn(&Side) -> Result<Transfer, BenchError>,
    ) -> Result<f64, BenchError> {
        let start = Instant::now();
        let transfers: Vec<Transfer> = (0..n).map(|_| submit(&self.sides[side])).collect::<Result<_, _>>()?;
        for t in &transfers {
            t.wait_timeout(WRITE_WAIT).map_err(engine_err)?;
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Times `iters` pipelined submissions and `LATENCY_SAMPLES` lone ones on engine `side`.
    fn accord(
        &mut self,
        side: usize,
        iters: u64,
        imm: u32,
        submit: impl Fn(&Side) -> Result<Transfer, BenchError>,
    ) -> Result<(f64, f64), BenchError> {
        let secs = self.pipelined(side, iters, &submit)?;
        let mut lat = vec![];
        for _ in 0..LATENCY_SAMPLES.min(iters as usize) {
            let t0 = Instant::now();
            submit(&self.sides[side])?.wait_timeout(WRITE_WAIT).map_err(engine_err)?;
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        lat.sort_by(f64::total_cmp);
        self.verify(side, imm, iters + lat.len() as u64)?;
        Ok((secs, lat[lat.len() / 2]))
    }
}

/// Measured figures of one size, turned into a row.
struct Measured {
    shm_share: f64,
    cma_share: f64,
    accord_bytes_per_s: f64,
    udp_bytes_per_s: f64,
    tcp_gbps: f64,
    one_write_us: f64,
}

/// The figures of one size from its timed runs (seconds, median latency) on the default side
/// and the UDP-only side: `bytes_total` moved per side, shared-memory share since `before`.
fn measured(p: &Parent, before: Counts, timed: [(f64, f64); 2], bytes_total: u64, tcp_gbps: f64) -> Measured {
    let per_s = |secs: f64| bytes_total as f64 / secs;
    let engine = &p.sides[SIDE_DEFAULT].engine;
    Measured {
        shm_share: shm_share(before.datagrams, datagram_counts(engine)),
        cma_share: before.cma_share(engine),
        accord_bytes_per_s: per_s(timed[SIDE_DEFAULT].0),
        udp_bytes_per_s: per_s(timed[SIDE_UDP].0),
        tcp_gbps,
        one_write_us: timed[SIDE_DEFAULT].1,
    }
}

fn row(op: &str, bytes: u64, m: Measured) -> P2pRow {
    let accord_gbps = m.accord_bytes_per_s / 1e9;
    let udp_gbps = m.udp_bytes_per_s / 1e9;
    P2pRow {
        op: op.into(),
        bytes,
        accord_gbps,
        tcp_gbps: m.tcp_gbps,
        vs_tcp: accord_gbps / m.tcp_gbps.max(1e-12),
        udp_gbps,
        vs_udp: accord_gbps / udp_gbps.max(1e-12),
        shm_share: m.shm_share,
        cma_share: m.cma_share,
        one_write_us: m.one_write_us,
    }
}

/// Runs the benchmark: spawns the second process, measures each size over TCP and Accord.
pub fn run(opts: &P2pOptions) -> Result<Vec<P2pRow>, BenchError> {
    let (max, paged_total) = checked_sizes(opts)?;
    with_second_process(opts.loss, max, |parent| measure(opts, parent, paged_total))
}

/// (largest bytes one write moves, bytes of one paged write) of valid options.
fn checked_sizes(opts: &P2pOptions) -> Result<(u64, u64), BenchError> {
    let paged_total = opts.paged_page_bytes.map_or(0, |p| p * opts.paged_pages);
    let max = opts.sizes.iter().copied().max().unwrap_or(0).max(paged_total);
    if max == 0 || max > BENCH_BYTES_MAX || opts.sizes.contains(&0) {
        return Err(BenchError::Options(format!("sizes must be in 1..={BENCH_BYTES_MAX}")));
    }
    if let Some(p) = opts.loss.filter(|p| !(0.0..1.0).contains(p)) {
        return Err(BenchError::Options(format!("loss {p} must be a probability below 1 (0 <= loss < 1)")));
    }
    Ok((max, paged_total))
}

/// Spawns the second process, connects to it (writes of up to `max` bytes), runs `drive`
/// and makes sure the second process is gone before returning what `drive` returned.
fn with_second_process<T>(
    loss: Option<f64>,
    max: u64,
    drive: impl FnOnce(&mut Parent) -> Result<T, BenchError>,
) -> Result<T, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut cmd = Command::new(std::env::current_exe()?);
    die_with_this_process(&mut cmd);
    cmd.env(CHILD_ENV, listener.local_addr()?.to_string()).env("ACCORD_P2P_BENCH_MAX", max.to_string());
    if let Some(p) = loss {
        cmd.env(CHILD_LOSS_ENV, p.to_string());
    }
    let mut child: Child = cmd.spawn()?;
    let result = connect(&listener, loss, max).and_then(|mut parent| {
        let out = drive(&mut parent)?;
        // This side's engines go first (a trace file is written as they drop): the second
        // process ending is then no peer's death to them, and nothing warns about it.
        let Parent { sides, mut tcp, .. } = parent;
        drop(sides);
        send_cmd(&mut tcp, OP_EXIT, 0, 0)?;
        Ok(out)
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait()? {
            Some(_) => break,
            None if Instant::now() > deadline || result.is_err() => {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    result
}

/// The second process gets SIGKILL from the kernel when this one dies (PR_SET_PDEATHSIG), so
/// an interrupted or killed benchmark leaves no process behind.
#[allow(unsafe_code)]
fn die_with_this_process(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // Safety: the hook runs between fork and exec and makes only async-signal-safe system
    // calls (prctl, getppid); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0
                || libc::getppid() != parent
            {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Accepts the second process, builds this side's two engines (the one under test, then the
/// UDP-only one) against its two, and warms both up: the connections open, the rings attach
/// and the windows grow.
fn connect(listener: &TcpListener, loss: Option<f64>, max: u64) -> Result<Parent, BenchError> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let tcp = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e.into()),
        }
    };
    tcp.set_nonblocking(false)?;
    tcp.set_nodelay(true)?;
    tcp.set_read_timeout(Some(CHILD_DEADLINE))?;
    let mut tcp = tcp;
    let fill: Vec<u8> = (0..max).map(|i| (i * 31 % 251) as u8).collect();
    let mut sides = vec![];
    for udp_only in [false, true] {
        let mut len = [0u8; 4];
        tcp.read_exact(&mut len)?;
        let mut hello = vec![0u8; u32::from_le_bytes(len) as usize];
        tcp.read_exact(&mut hello)?;
        let hello: Hello = serde_json::from_slice(&hello).map_err(engine_err)?;
        let engine = build_engine(loss, udp_only)?;
        engine.add_peer(&hello.address).map_err(engine_err)?;
        let src = engine.alloc(max as usize).map_err(engine_err)?;
        src.write_at(0, &fill).map_err(engine_err)?;
        sides.push(Side { engine, src, dst: hello.region });
    }
    let mut p = Parent { sides, tcp, data: fill };
    let warm = max.min(16 << 20);
    for side in [SIDE_DEFAULT, SIDE_UDP] {
        p.accord(side, 4, 1, |s| submit_write(s, warm, 1))?;
    }
    Ok(p)
}

/// The benchmark's rows: per size TCP, then Accord on each engine; then the paged row.
fn measure(opts: &P2pOptions, p: &mut Parent, paged_total: u64) -> Result<Vec<P2pRow>, BenchError> {
    let mut rows = vec![];
    for (i, &bytes) in opts.sizes.iter().enumerate() {
        let iters = iterations(bytes);
        let tcp_gbps = p.tcp(bytes, iters)?;
        let imm = 100 + i as u32;
        let mut timed = [(0.0, 0.0); 2];
        let before = Counts::now(&p.sides[SIDE_DEFAULT].engine, bytes, iters);
        for side in [SIDE_DEFAULT, SIDE_UDP] {
            timed[side] = p
                .accord(side, iters, imm, |s| submit_write(s, bytes, imm))
                .map_err(|e| BenchError::Engine(format!("writes of {bytes} bytes: {e}")))?;
        }
        let m = measured(p, before, timed, bytes * iters, tcp_gbps);
        rows.push(row("write", bytes, m));
    }
    if let Some(page) = opts.paged_page_bytes {
        let iters = iterations(paged_total);
        let tcp_gbps = p.tcp(paged_total, iters)?;
        let (src_pages, dst_pages) = paged_layout(opts.paged_pages);
        let imm = 99;
        let mut timed = [(0.0, 0.0); 2];
        let before = Counts::now(&p.sides[SIDE_DEFAULT].engine, paged_total, iters);
        for side in [SIDE_DEFAULT, SIDE_UDP] {
            timed[side] = p.accord(side, iters, imm, |s| submit_paged(s, page, &src_pages, &dst_pages, imm))?;
        }
        let m = measured(p, before, timed, paged_total * iters, tcp_gbps);
        rows.push(row("paged", paged_total, m));
    }
    Ok(rows)
}

/// Source pages `0..pages` and the fixed permutation of destination pages they land in, as a
/// KV-cache move scatters them.
fn paged_layout(pages: u64) -> (Vec<u64>, Vec<u64>) {
    ((0..pages).collect(), (0..pages).map(|i| (i * 97 + 13) % pages).collect())
}

fn submit_paged(s: &Side, page: u64, src_pages: &[u64], dst_pages: &[u64], imm: u32) -> Result<Transfer, BenchError> {
    let h = s.src.handle();
    let op = PagedWriteOp { src: &h, dst: &s.dst, page_bytes: page, src_pages, dst_pages, imm: Some(imm) };
    s.engine.write_paged(&op).map_err(engine_err)
}

/// The engine under test's counters before a row, and what the row will write.
struct Counts {
    datagrams: (u64, u64),
    cma_bytes: u64,
    /// Bytes the row writes on that engine: the timed writes and the lone ones after them.
    written: u64,
}

impl Counts {
    fn now(engine: &Engine, bytes: u64, iters: u64) -> Counts {
        Counts {
            datagrams: datagram_counts(engine),
            cma_bytes: engine.cma_stats().bytes_pulled,
            written: bytes * (iters + LATENCY_SAMPLES.min(iters as usize) as u64),
        }
    }

    /// Share of the row's bytes pulled with `process_vm_readv` since [`Counts::now`].
    fn cma_share(&self, engine: &Engine) -> f64 {
        let pulled = engine.cma_stats().bytes_pulled.saturating_sub(self.cma_bytes);
        (pulled as f64 / self.written.max(1) as f64).min(1.0)
    }
}

/// (datagrams sent, of which through shared memory) by `engine` so far.
fn datagram_counts(engine: &Engine) -> (u64, u64) {
    let stats = engine.stats();
    (stats.lanes.iter().map(|l| l.endpoint.datagrams_sent).sum(), stats.shm_datagrams_sent())
}

/// Share of datagrams through shared memory between two `datagram_counts`.
fn shm_share(before: (u64, u64), after: (u64, u64)) -> f64 {
    let sent = after.0.saturating_sub(before.0);
    after.1.saturating_sub(before.1) as f64 / sent.max(1) as f64
}

fn submit_write(s: &Side, bytes: u64, imm: u32) -> Result<Transfer, BenchError> {
    let h = s.src.handle();
    let op = WriteOp { src: &h, src_offset: 0, dst: &s.dst, dst_offset: 0, len: bytes, imm: Some(imm) };
    s.engine.write(&op).map_err(engine_err)
}

/// The table `accord bench p2p` prints: a header naming the datapath that carried the bytes
/// (from the engine's counters), the rows, and what every column means.
pub fn format_table(rows: &[P2pRow]) -> String {
    let mut out = String::from(
        "# p2p: one-sided writes (each with an immediate counted at the receiver) from one process to another on this host\n",
    );
    out += &format!("# {}\n", datapath_line(rows));
    out += "# baselines, same run and same two processes: tcp = a TCP stream over loopback; udp = Accord with shared memory and pulls off (kernel UDP)\n";
    out += &format!(
        "{:>6} {:>12} {:>12} {:>10} {:>7} {:>10} {:>7} {:>13} {:>9} {:>9}\n",
        "op",
        "bytes",
        "accord_GBps",
        "tcp_GBps",
        "vs_tcp",
        "udp_GBps",
        "vs_udp",
        "one_write_us",
        "shm_share",
        "cma_share"
    );
    for r in rows {
        out += &format!(
            "{:>6} {:>12} {:>12.3} {:>10.3} {:>7.2} {:>10.3} {:>7.2} {:>13.1} {:>9.2} {:>9.2}\n",
            r.op,
            r.bytes,
            r.accord_gbps,
            r.tcp_gbps,
            r.vs_tcp,
            r.udp_gbps,
            r.vs_udp,
            r.one_write_us,
            r.shm_share,
            r.cma_share
        );
    }
    out += "# op: write = one contiguous write of `bytes`; paged = one write of 256 scattered 64 KiB pages (`bytes` in all)\n";
    out += "# accord_GBps: bytes / time for a pipelined batch of writes, all awaited (GB = 1e9 bytes); tcp_GBps, udp_GBps: the same for the baselines\n";
    out += "# vs_tcp, vs_udp: accord_GBps divided by the baseline's\n";
    out += "# one_write_us: one write submitted alone until it completed at the sender, median of 20 (a completion time; a latency only for small rows)\n";
    out += "# shm_share: share of the Accord engine's datagrams in this row sent through shared-memory rings (1 = all, 0 = kernel UDP)\n";
    out += "# cma_share: share of the row's bytes the receiver pulled from the sender's memory with process_vm_readv (no datagrams)\n";
    out
}

/// Which datapath the Accord columns went through, from the rows' shares.
fn datapath_line(rows: &[P2pRow]) -> String {
    if rows.is_empty() {
        return "datapath: no rows".into();
    }
    let min_shm = rows.iter().map(|r| r.shm_share).fold(f64::INFINITY, f64::min);
    let max_cma = rows.iter().map(|r| r.cma_share).fold(0.0, f64::max);
    let datagrams = if min_shm >= 0.999 {
        "shared-memory rings for every datagram"
    } else if rows.iter().all(|r| r.shm_share <= 0.001) {
        "kernel UDP over loopback for every datagram"
    } else {
        "shared-memory rings for some datagrams, kernel UDP for the rest (see shm_share)"
    };
    let pulls = if max_cma > 0.0 {
        format!("; up to {:.0}% of a row's bytes pulled with process_vm_readv (see cma_share)", max_cma * 100.0)
    } else {
        String::new()
    };
    format!("datapath of the accord columns: {datagrams}{pulls}")
}

/// The `--json` form: `{"rows":[{"op":..,"bytes":..,"accord_gbps":..,"tcp_gbps":..,"vs_tcp":..,
/// "udp_gbps":..,"vs_udp":..,"shm_share":..,"cma_share":..,"one_write_us":..}]}`.
pub fn format_json(rows: &[P2pRow]) -> String {
    serde_json::json!({ "rows": rows }).to_string()
}
