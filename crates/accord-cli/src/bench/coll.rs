//! One rank of a collective benchmark: nccl-tests' loop. For every size, dtype, op and root:
//! warm up, time `iters` out-of-place calls, then `iters` in-place calls, reduce the times
//! across ranks as `-a` says, and check the output of fresh calls (`-c`).

use super::report::{Placement, Row};
use super::values;
use accord_coll::bench_math::{algbw_gbps, busbw_gbps};
use accord_coll::engine::{communicator_from_env, EngineTransport};
use accord_coll::{
    Algo, AllToAllVLayout, BufSlice, Bufs, CollTransport, Collective, Communicator, DType, LocalBuf, ReduceOp,
};
use std::time::Instant;

/// Test-only: set to `1` to make rank 0 (the root for reduce) report one wrong element per
/// checked call, so a test can see the footer say FAILED and the exit status turn non-zero.
pub const CORRUPT_ENV: &str = "ACCORD_BENCH_CORRUPT";

/// How the per-rank times become the row's time (nccl-tests `-a`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Average {
    /// Rank 0's own time (`-a 0`).
    Rank0,
    /// Mean over ranks (`-a 1`, the default).
    Mean,
    /// Fastest rank (`-a 2`).
    Min,
    /// Slowest rank (`-a 3`).
    Max,
}

impl Average {
    /// From nccl-tests' number.
    pub fn from_flag(v: u32) -> Result<Average, String> {
        Ok(match v {
            0 => Average::Rank0,
            1 => Average::Mean,
            2 => Average::Min,
            3 => Average::Max,
            _ => return Err(format!("-a {v}: use 0 (rank 0), 1 (mean), 2 (min) or 3 (max)")),
        })
    }

    /// Words for the header.
    pub fn name(self) -> &'static str {
        match self {
            Average::Rank0 => "rank 0",
            Average::Mean => "mean over ranks",
            Average::Min => "fastest rank",
            Average::Max => "slowest rank",
        }
    }
}

/// Which roots to run (`-r N` or `-r all`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Roots {
    One(usize),
    All,
}

/// What every rank runs (parsed from the same command line).
#[derive(Clone, Debug)]
pub struct CollBenchSpec {
    pub collective: Collective,
    pub sizes: Vec<u64>,
    pub dtypes: Vec<DType>,
    pub ops: Vec<ReduceOp>,
    pub roots: Roots,
    pub algo: Option<Algo>,
    pub warmup: usize,
    pub iters: usize,
    /// Checked calls per row and placement (0: no check).
    pub check: usize,
    pub average: Average,
    /// Write progress lines to stderr (rank 0).
    pub progress: bool,
}

/// What rank 0 hands back: the rows and the engine's datapath counters.
pub struct RankOutcome {
    pub rows: Vec<Row>,
    pub ranks: usize,
    pub datapath: super::datapath::Datapath,
}

type Comm = Communicator<EngineTransport>;

fn fail<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Whether the collective reduces (has an op) and whether it has a root.
fn reduces(c: Collective) -> bool {
    matches!(c, Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter)
}
fn rooted(c: Collective) -> bool {
    matches!(c, Collective::Reduce | Collective::Broadcast)
}
/// Collectives whose in-place form would overwrite input a peer still has to read
/// (all_to_all, sendrecv): their in-place group reads N/A.
pub fn has_in_place(c: Collective) -> bool {
    !matches!(c, Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv)
}

/// Element counts of the send and receive buffers for a `bytes`-sized row (nccl-tests' size:
/// per-rank bytes for all_reduce/broadcast/reduce/sendrecv/all_to_all, total bytes for
/// all_gather/reduce_scatter). The third is the `count` column.
fn layout(c: Collective, bytes: u64, dtype: DType, n: usize) -> (usize, usize, usize) {
    let elems = (bytes as usize / dtype.size_bytes()).max(1);
    match c {
        Collective::AllGather => {
            let per = (elems / n).max(1);
            (per, per * n, per)
        }
        Collective::ReduceScatter => {
            let per = (elems / n).max(1);
            (per * n, per, per)
        }
        Collective::AllToAll | Collective::AllToAllV => {
            let per = (elems / n).max(1);
            (per * n, per * n, per)
        }
        _ => (elems, elems, elems),
    }
}

fn fill(rank: usize, len: usize, dtype: DType) -> Vec<u8> {
    let mut v = Vec::with_capacity(len * dtype.size_bytes());
    for i in 0..len {
        values::encode(dtype, values::input(rank, i), &mut v);
    }
    v
}

/// One dtype/op/root combination of a row.
#[derive(Copy, Clone, Debug)]
struct Combo {
    dtype: DType,
    op: ReduceOp,
    root: usize,
}

/// Registered buffers of one placement: where the input goes and where the output lands.
struct Placed {
    /// Buffers to deregister afterwards.
    owned: Vec<LocalBuf>,
    send_len: usize,
    recv_len: usize,
    count: usize,
}

impl Placed {
    fn send(&self, in_place: bool, me: usize, es: usize) -> BufSlice<'_> {
        match in_place {
            false => self.owned[0].all(),
            // all_gather in place: the input is this rank's block of the output.
            true if self.recv_len > self.send_len => self.owned[0].slice(me * self.send_len * es, self.send_len * es),
            true => self.owned[0].all(),
        }
    }
    fn recv(&self, in_place: bool, me: usize, es: usize) -> BufSlice<'_> {
        match in_place {
            false => self.owned[1].all(),
            // reduce_scatter in place: the output is this rank's block of the input.
            true if self.send_len > self.recv_len => self.owned[0].slice(me * self.recv_len * es, self.recv_len * es),
            true => self.owned[0].all(),
        }
    }
}

/// Runs one call of the collective.
fn call(comm: &mut Comm, s: &CollBenchSpec, k: Combo, bufs: Bufs<'_>, count: usize) -> Result<(), String> {
    let n = comm.world_size();
    let me = comm.rank();
    let r = match s.collective {
        Collective::AllReduce => comm.all_reduce(bufs, count, k.dtype, k.op, s.algo),
        Collective::Reduce => comm.reduce(bufs, count, k.dtype, k.op, k.root, s.algo),
        Collective::Broadcast => comm.broadcast(bufs, count, k.dtype, k.root, s.algo),
        Collective::AllGather => comm.all_gather(bufs, count, k.dtype, s.algo),
        Collective::ReduceScatter => comm.reduce_scatter(bufs, count, k.dtype, k.op, s.algo),
        Collective::AllToAll => comm.all_to_all(bufs, count, k.dtype, s.algo),
        Collective::AllToAllV => {
            // Even blocks, as all_to_all's, with every count and offset spelled out. Built per
            // call, inside the timing, as torch's all_to_all_single hands its lists over per call.
            let counts = vec![count; n];
            let displs: Vec<usize> = (0..n).map(|r| r * count).collect();
            let layout = AllToAllVLayout {
                send_counts: counts.clone(),
                send_displs: displs.clone(),
                recv_counts: counts,
                recv_displs: displs,
            };
            comm.all_to_allv(bufs, &layout, k.dtype, s.algo)
        }
        Collective::SendRecv => {
            comm.send_recv(((me + 1) % n, bufs.send), ((me + n - 1) % n, bufs.recv), count, k.dtype)
        }
        other => return Err(format!("{other} is not benchmarked")),
    };
    r.map_err(|e| e.to_string())
}

/// The value element `i` of this rank's output must hold, or None where it does not matter.
fn expected(s: &CollBenchSpec, k: Combo, n: usize, me: usize, count: usize, i: usize) -> Option<f64> {
    let d = k.dtype;
    Some(match s.collective {
        Collective::AllReduce => values::reduced(k.op, n, i, d),
        Collective::Reduce if me == k.root => values::reduced(k.op, n, i, d),
        Collective::Reduce => return None,
        Collective::Broadcast => values::input(k.root, i),
        Collective::AllGather => values::input(i / count, i % count),
        Collective::ReduceScatter => values::reduced(k.op, n, me * count + i, d),
        Collective::AllToAll | Collective::AllToAllV => values::input(i / count, me * count + i % count),
        Collective::SendRecv => values::input((me + n - 1) % n, i),
        _ => return None,
    })
}

/// Wrong elements in this rank's output (`recv`, `recv_len` elements) after one checked call.
fn count_wrong(
    comm: &Comm,
    s: &CollBenchSpec,
    k: Combo,
    recv: BufSlice<'_>,
    recv_len: usize,
    count: usize,
) -> Result<u64, String> {
    let (n, me, d) = (comm.world_size(), comm.rank(), k.dtype);
    let size = d.size_bytes();
    let mut out = vec![0u8; recv_len * size];
    comm.transport().read_local(recv.sub(0, out.len()), &mut out).map_err(fail("read output"))?;
    let corrupt_rank = if s.collective == Collective::Reduce { k.root } else { 0 };
    if me == corrupt_rank && accord_knobs::env::<bool>(CORRUPT_ENV).map_err(|e| e.to_string())? == Some(true) {
        // Test-only: one element off by one, as a broken transport would leave it.
        if let Some(e) = expected(s, k, n, me, count, 0) {
            let mut bad = vec![];
            values::encode(d, values::stored(d, e) + 1.0, &mut bad);
            out[..size].copy_from_slice(&bad);
        }
    }
    let mut wrong = 0;
    for i in 0..recv_len {
        if let Some(e) = expected(s, k, n, me, count, i) {
            if values::decode(d, &out[i * size..(i + 1) * size]) != values::stored(d, e) {
                wrong += 1;
            }
        }
    }
    Ok(wrong)
}

/// One f64 reduced across ranks (times, wrong counts).
fn reduce_scalar(comm: &mut Comm, value: f64, op: ReduceOp) -> Result<f64, String> {
    let buf = comm.register(value.to_le_bytes().to_vec()).map_err(fail("register"))?;
    comm.all_reduce(Bufs::in_place(buf.all()), 1, DType::F64, op, None).map_err(fail("reduce a scalar"))?;
    let bytes = comm.deregister(buf).map_err(fail("deregister"))?;
    Ok(f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")))
}

/// Rank time as `-a` says (every rank takes part, so all agree on the call sequence).
fn row_time(comm: &mut Comm, mine_us: f64, average: Average) -> Result<f64, String> {
    let n = comm.world_size() as f64;
    match average {
        Average::Rank0 => {
            // Everybody sums rank 0's time alone, so every rank makes the same call.
            let v = if comm.rank() == 0 { mine_us } else { 0.0 };
            reduce_scalar(comm, v, ReduceOp::Sum)
        }
        Average::Mean => Ok(reduce_scalar(comm, mine_us, ReduceOp::Sum)? / n),
        Average::Min => reduce_scalar(comm, mine_us, ReduceOp::Min),
        Average::Max => reduce_scalar(comm, mine_us, ReduceOp::Max),
    }
}

/// Registers the buffers of one placement, inputs filled.
fn place(comm: &Comm, c: Collective, k: Combo, bytes: u64, in_place: bool) -> Result<Placed, String> {
    let (n, me, d) = (comm.world_size(), comm.rank(), k.dtype);
    let (send_len, recv_len, count) = layout(c, bytes, d, n);
    let mut owned = vec![];
    if in_place {
        let len = send_len.max(recv_len);
        let mut data = vec![0u8; len * d.size_bytes()];
        let input = fill(me, send_len, d);
        let at = if recv_len > send_len { me * send_len * d.size_bytes() } else { 0 };
        data[at..at + input.len()].copy_from_slice(&input);
        owned.push(comm.register(data).map_err(fail("register"))?);
    } else {
        owned.push(comm.register(fill(me, send_len, d)).map_err(fail("register"))?);
        owned.push(comm.register(vec![0u8; recv_len * d.size_bytes()]).map_err(fail("register"))?);
    }
    Ok(Placed { owned, send_len, recv_len, count })
}

/// Puts fresh inputs back (an in-place or accumulating call changed them).
fn refill(comm: &Comm, p: &Placed, in_place: bool, d: DType) -> Result<(), String> {
    let me = comm.rank();
    let es = d.size_bytes();
    if in_place && p.recv_len > p.send_len {
        comm.transport().write_local(p.owned[0].all(), &vec![0u8; p.recv_len * es]).map_err(fail("refill"))?;
    }
    let send = p.send(in_place, me, es);
    comm.transport().write_local(send.sub(0, p.send_len * es), &fill(me, p.send_len, d)).map_err(fail("refill"))
}

/// Times and checks one placement of one row.
fn measure(
    comm: &mut Comm,
    s: &CollBenchSpec,
    k: Combo,
    bytes: u64,
    in_place: bool,
) -> Result<(Placement, u64), String> {
    let (n, me, es) = (comm.world_size(), comm.rank(), k.dtype.size_bytes());
    let p = place(comm, s.collective, k, bytes, in_place)?;
    fn bufs(p: &Placed, in_place: bool, me: usize, es: usize) -> Bufs<'_> {
        Bufs { send: p.send(in_place, me, es), recv: p.recv(in_place, me, es) }
    }
    for _ in 0..s.warmup {
        call(comm, s, k, bufs(&p, in_place, me, es), p.count)?;
    }
    comm.barrier().map_err(fail("barrier"))?;
    let start = Instant::now();
    for _ in 0..s.iters {
        call(comm, s, k, bufs(&p, in_place, me, es), p.count)?;
    }
    let mine_us = start.elapsed().as_secs_f64() * 1e6 / s.iters.max(1) as f64;
    let time_us = row_time(comm, mine_us, s.average)?;
    let mut wrong = 0u64;
    for _ in 0..s.check {
        refill(comm, &p, in_place, k.dtype)?;
        comm.barrier().map_err(fail("barrier"))?;
        call(comm, s, k, bufs(&p, in_place, me, es), p.count)?;
        let mine = count_wrong(comm, s, k, p.recv(in_place, me, es), p.recv_len, p.count)?;
        wrong += reduce_scalar(comm, mine as f64, ReduceOp::Sum)? as u64;
    }
    let reported = match s.collective {
        Collective::AllGather => p.recv_len * es,
        Collective::ReduceScatter => p.send_len * es,
        _ => p.send_len.max(p.recv_len) * es,
    } as u64;
    let placement = Placement {
        time_us,
        algbw_gbps: algbw_gbps(reported, time_us),
        busbw_gbps: busbw_gbps(s.collective, n, reported, time_us),
        wrong,
    };
    for b in p.owned {
        comm.deregister(b).map_err(fail("deregister"))?;
    }
    Ok((placement, reported))
}

/// One core copying `bytes` in this process, GB/s: the ceiling of one copy on this host,
/// measured in the same run as the table it sits beside.
fn memcpy_gbps(bytes: u64, iters: usize) -> f64 {
    let len = bytes as usize;
    let src = vec![7u8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src); // first touch outside the timing
    let reps = iters.max(1);
    let start = Instant::now();
    for _ in 0..reps {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    algbw_gbps(bytes * reps as u64, start.elapsed().as_secs_f64() * 1e6)
}

/// Runs the sweep on this rank; rank 0 returns the rows.
pub fn run_rank(s: &CollBenchSpec) -> Result<Option<RankOutcome>, String> {
    let mut comm = communicator_from_env().map_err(fail("joining the job"))?;
    let (n, me) = (comm.world_size(), comm.rank());
    let roots: Vec<usize> = match s.roots {
        Roots::One(r) if r >= n => return Err(format!("-r {r} is not a rank of {n}")),
        _ if !rooted(s.collective) => vec![0],
        Roots::One(r) => vec![r],
        Roots::All => (0..n).collect(),
    };
    let ops: &[ReduceOp] = if reduces(s.collective) { &s.ops } else { &[ReduceOp::Sum] };
    let mut combos = vec![];
    for &dtype in &s.dtypes {
        for &op in ops {
            for &root in &roots {
                combos.push(Combo { dtype, op, root });
            }
        }
    }
    let mut rows = vec![];
    let total = s.sizes.len() * combos.len();
    for &bytes in &s.sizes {
        for &k in &combos {
            let (oop, reported) = measure(&mut comm, s, k, bytes, false)?;
            let ip = if has_in_place(s.collective) { Some(measure(&mut comm, s, k, bytes, true)?.0) } else { None };
            let memcpy = if me == 0 { memcpy_gbps(reported, s.iters) } else { 0.0 };
            let (_, _, count) = layout(s.collective, bytes, k.dtype, n);
            rows.push(Row {
                bytes: reported,
                count: count as u64,
                dtype: k.dtype.name().to_string(),
                op: if reduces(s.collective) { k.op.name().to_string() } else { "none".into() },
                root: if rooted(s.collective) { k.root as i64 } else { -1 },
                out_of_place: oop,
                in_place: ip,
                memcpy_gbps: memcpy,
            });
            if me == 0 && s.progress {
                eprintln!("accord bench: {} of {total} rows done ({reported} bytes, {})", rows.len(), k.dtype.name());
            }
        }
    }
    // Nobody leaves while a peer may still wait for its acknowledgements.
    comm.barrier().map_err(fail("final barrier"))?;
    if me != 0 {
        return Ok(None);
    }
    let engine = comm.transport().engine();
    let datapath = super::datapath::Datapath::of(&engine.stats(), engine.cma_stats());
    Ok(Some(RankOutcome { rows, ranks: n, datapath }))
}
