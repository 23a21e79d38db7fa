//! One rank of a collective benchmark: nccl-tests' loop (warm up, time `iters` calls, report the
//! slowest rank's mean), with an optional check of every output element.

use super::values;
use accord_coll::bench_math::{BenchRow, BenchTable};
use accord_coll::engine::{communicator_from_env, EngineTransport};
use accord_coll::{Algo, Bufs, CollTransport, Collective, Communicator, DType, LocalBuf, ReduceOp};
use std::time::Instant;

/// What every rank runs (parsed from the same command line).
#[derive(Clone, Debug)]
pub struct CollBenchSpec {
    pub collective: Collective,
    pub sizes: Vec<u64>,
    pub dtype: DType,
    pub op: ReduceOp,
    pub algo: Option<Algo>,
    pub root: usize,
    pub warmup: usize,
    pub iters: usize,
    pub check: bool,
}

type Comm = Communicator<EngineTransport>;

fn fail<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Element counts of the send and receive buffers for a `bytes`-sized row (nccl-tests' size:
/// per-rank bytes for all_reduce/broadcast/reduce/sendrecv/all_to_all, total bytes for
/// all_gather/reduce_scatter). Also the `count` column.
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
        Collective::AllToAll => {
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

/// Runs one call of the collective.
fn call(comm: &mut Comm, s: &CollBenchSpec, send: &LocalBuf, recv: &LocalBuf, count: usize) -> Result<(), String> {
    let n = comm.world_size();
    let me = comm.rank();
    let bufs = Bufs { send: send.all(), recv: recv.all() };
    let r = match s.collective {
        Collective::AllReduce => comm.all_reduce(bufs, count, s.dtype, s.op, s.algo),
        Collective::Reduce => comm.reduce(bufs, count, s.dtype, s.op, s.root, s.algo),
        Collective::Broadcast => comm.broadcast(bufs, count, s.dtype, s.root, s.algo),
        Collective::AllGather => comm.all_gather(bufs, count, s.dtype, s.algo),
        Collective::ReduceScatter => comm.reduce_scatter(bufs, count, s.dtype, s.op, s.algo),
        Collective::AllToAll => comm.all_to_all(bufs, count, s.dtype, s.algo),
        Collective::SendRecv => {
            comm.send_recv(((me + 1) % n, send.all()), ((me + n - 1) % n, recv.all()), count, s.dtype)
        }
        other => return Err(format!("{other} is not benchmarked")),
    };
    r.map_err(|e| e.to_string())
}

/// Wrong elements in this rank's output after one checked call.
fn count_wrong(comm: &Comm, s: &CollBenchSpec, recv: &LocalBuf, recv_len: usize, count: usize) -> Result<u64, String> {
    let (n, me, d) = (comm.world_size(), comm.rank(), s.dtype);
    let mut out = vec![0u8; recv_len * d.size_bytes()];
    comm.transport().read_local(recv.all(), &mut out).map_err(fail("read output"))?;
    let expected = |i: usize| -> Option<f64> {
        Some(match s.collective {
            Collective::AllReduce => values::reduced(s.op, n, i, d),
            Collective::Reduce if me == s.root => values::reduced(s.op, n, i, d),
            Collective::Reduce => return None,
            Collective::Broadcast => values::input(s.root, i),
            Collective::AllGather => values::input(i / count, i % count),
            Collective::ReduceScatter => values::reduced(s.op, n, me * count + i, d),
            Collective::AllToAll => values::input(i / count, me * count + i % count),
            Collective::SendRecv => values::input((me + n - 1) % n, i),
            _ => return None,
        })
    };
    let size = d.size_bytes();
    let mut wrong = 0;
    for i in 0..recv_len {
        if let Some(e) = expected(i) {
            if values::decode(d, &out[i * size..(i + 1) * size]) != values::stored(d, e) {
                wrong += 1;
            }
        }
    }
    Ok(wrong)
}

/// One f64 reduced across ranks (times: max; wrong counts: sum).
fn reduce_scalar(comm: &mut Comm, value: f64, op: ReduceOp) -> Result<f64, String> {
    let buf = comm.register(value.to_le_bytes().to_vec()).map_err(fail("register"))?;
    comm.all_reduce(Bufs::in_place(buf.all()), 1, DType::F64, op, None).map_err(fail("reduce a scalar"))?;
    let bytes = comm.deregister(buf).map_err(fail("deregister"))?;
    Ok(f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")))
}

/// Runs the sweep on this rank; rank 0 returns the table.
pub fn run_rank(s: &CollBenchSpec) -> Result<Option<BenchTable>, String> {
    let mut comm = communicator_from_env().map_err(fail("joining the job"))?;
    let (n, me) = (comm.world_size(), comm.rank());
    if s.root >= n {
        return Err(format!("--root {} is not a rank of {n}", s.root));
    }
    let mut rows = vec![];
    for &bytes in &s.sizes {
        let (send_len, recv_len, count) = layout(s.collective, bytes, s.dtype, n);
        let send = comm.register(fill(me, send_len, s.dtype)).map_err(fail("register"))?;
        let recv = comm.register(vec![0u8; recv_len * s.dtype.size_bytes()]).map_err(fail("register"))?;
        for _ in 0..s.warmup {
            call(&mut comm, s, &send, &recv, count)?;
        }
        comm.barrier().map_err(fail("barrier"))?;
        let start = Instant::now();
        for _ in 0..s.iters {
            call(&mut comm, s, &send, &recv, count)?;
        }
        let mine_us = start.elapsed().as_secs_f64() * 1e6 / s.iters.max(1) as f64;
        let time_us = reduce_scalar(&mut comm, mine_us, ReduceOp::Max)?;
        let wrong = if s.check {
            // Fresh inputs: an in-place or accumulating algorithm may have changed them.
            comm.transport().write_local(send.all(), &fill(me, send_len, s.dtype)).map_err(fail("refill input"))?;
            call(&mut comm, s, &send, &recv, count)?;
            let mine = count_wrong(&comm, s, &recv, recv_len, count)?;
            reduce_scalar(&mut comm, mine as f64, ReduceOp::Sum)? as u64
        } else {
            0
        };
        let reported = (send_len.max(recv_len) * s.dtype.size_bytes()) as u64;
        let reported = match s.collective {
            Collective::AllGather => (recv_len * s.dtype.size_bytes()) as u64,
            Collective::ReduceScatter => (send_len * s.dtype.size_bytes()) as u64,
            _ => reported,
        };
        rows.push(BenchRow::new(s.collective, n, reported, count as u64, time_us, wrong));
        comm.deregister(send).map_err(fail("deregister"))?;
        comm.deregister(recv).map_err(fail("deregister"))?;
    }
    // Nobody leaves while a peer may still wait for its acknowledgements.
    comm.barrier().map_err(fail("final barrier"))?;
    if me != 0 {
        return Ok(None);
    }
    let reduces = matches!(s.collective, Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter);
    let rooted = matches!(s.collective, Collective::Reduce | Collective::Broadcast);
    Ok(Some(BenchTable {
        collective: s.collective.name().to_string(),
        dtype: s.dtype.name().to_string(),
        redop: if reduces { s.op.name().to_string() } else { "none".into() },
        root: if rooted { s.root as i64 } else { -1 },
        rows,
    }))
}
