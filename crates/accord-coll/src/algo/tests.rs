//! Every collective x algorithm x dtype x op against a locally computed
//! reference, for 1..=7 ranks on threads over `LocalTransport`.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::{Bufs, CollConfig, CollTransport, Communicator, DType, LocalBuf, LocalFabric, LocalTransport, ReduceOp};

const RANKS_MAX: usize = 7;
const SEED: u64 = 0x00ac_c04d;

fn world<R: Send>(n: usize, f: impl Fn(&mut Communicator<LocalTransport>) -> R + Sync) -> Vec<R> {
    world_with(n, CollConfig::default(), f)
}

fn world_with<R: Send>(n: usize, cfg: CollConfig, f: impl Fn(&mut Communicator<LocalTransport>) -> R + Sync) -> Vec<R> {
    let ts = LocalFabric::create(n).unwrap();
    let cfg = CollConfig { timeout: std::time::Duration::from_secs(20), ..cfg };
    std::thread::scope(|s| {
        let hs: Vec<_> = ts
            .into_iter()
            .map(|t| {
                let cfg = cfg.clone();
                let f = &f;
                s.spawn(move || f(&mut Communicator::new(t, cfg).unwrap()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// A value in a dtype, decoded for comparison.
#[derive(Copy, Clone, Debug)]
enum V {
    F(f64),
    I(i64),
}

fn eps(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        DType::F32 => 2f64.powi(-23),
        _ => 2f64.powi(-52),
    }
}

fn encode(d: DType, v: V, out: &mut Vec<u8>) {
    match (d, v) {
        (DType::F32, V::F(x)) => out.extend_from_slice(&(x as f32).to_ne_bytes()),
        (DType::F64, V::F(x)) => out.extend_from_slice(&x.to_ne_bytes()),
        (DType::F16, V::F(x)) => out.extend_from_slice(&f16::from_f64(x).to_ne_bytes()),
        (DType::BF16, V::F(x)) => out.extend_from_slice(&bf16::from_f64(x).to_ne_bytes()),
        (DType::I8, V::I(x)) => out.push(x as i8 as u8),
        (DType::U8, V::I(x)) => out.push(x as u8),
        (DType::I32, V::I(x)) => out.extend_from_slice(&(x as i32).to_ne_bytes()),
        (DType::I64, V::I(x)) => out.extend_from_slice(&x.to_ne_bytes()),
        _ => unreachable!(),
    }
}

fn decode(d: DType, b: &[u8]) -> V {
    match d {
        DType::F32 => V::F(f32::from_ne_bytes(b.try_into().unwrap()) as f64),
        DType::F64 => V::F(f64::from_ne_bytes(b.try_into().unwrap())),
        DType::F16 => V::F(f16::from_ne_bytes(b.try_into().unwrap()).to_f64()),
        DType::BF16 => V::F(bf16::from_ne_bytes(b.try_into().unwrap()).to_f64()),
        DType::I8 => V::I(b[0] as i8 as i64),
        DType::U8 => V::I(b[0] as i64),
        DType::I32 => V::I(i32::from_ne_bytes(b.try_into().unwrap()) as i64),
        DType::I64 => V::I(i64::from_ne_bytes(b.try_into().unwrap())),
    }
}

/// Deterministic input of `rank`: floats exactly representable (quarters, or
/// powers of two for prod) so partial sums are exact; integers full-range so
/// wrapping is exercised.
fn input(d: DType, op: ReduceOp, salt: u64, rank: usize, count: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ salt.wrapping_mul(0x9e37_79b9) ^ (rank as u64) << 48);
    let mut out = Vec::with_capacity(count * d.size_bytes());
    for _ in 0..count {
        let v = if d.is_float() {
            if op == ReduceOp::Prod {
                V::F([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0][rng.gen_range(0..6)])
            } else {
                V::F(rng.gen_range(-32i32..=32) as f64 / 4.0)
            }
        } else {
            V::I(rng.gen::<i64>())
        };
        encode(d, v, &mut out);
    }
    out
}

/// Reference reduction of element `i` over `inputs`, and its tolerance.
fn reference(d: DType, op: ReduceOp, inputs: &[Vec<u8>], i: usize) -> (V, f64) {
    let es = d.size_bytes();
    let vals: Vec<V> = inputs.iter().map(|x| decode(d, &x[i * es..(i + 1) * es])).collect();
    let n = vals.len();
    let wrap = |x: i64| {
        let mut b = Vec::new();
        encode(d, V::I(x), &mut b);
        match decode(d, &b) {
            V::I(v) => v,
            V::F(_) => unreachable!(),
        }
    };
    match vals[0] {
        V::F(_) => {
            let xs: Vec<f64> = vals.iter().map(|v| if let V::F(x) = v { *x } else { unreachable!() }).collect();
            let r = match op {
                ReduceOp::Sum => xs.iter().sum(),
                ReduceOp::Avg => xs.iter().sum::<f64>() / n as f64,
                ReduceOp::Prod => xs.iter().product(),
                ReduceOp::Min => xs.iter().cloned().fold(f64::INFINITY, f64::min),
                ReduceOp::Max => xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            };
            let abs_sum: f64 = xs.iter().map(|x| x.abs()).sum();
            (V::F(r), n as f64 * eps(d) * abs_sum + 2.0 * eps(d) * r.abs())
        }
        V::I(_) => {
            let xs: Vec<i64> = vals.iter().map(|v| if let V::I(x) = v { *x } else { unreachable!() }).collect();
            let r = match op {
                ReduceOp::Sum => wrap(xs.iter().fold(0i64, |a, b| a.wrapping_add(*b))),
                ReduceOp::Avg => wrap(xs.iter().fold(0i64, |a, b| a.wrapping_add(*b))) / n as i64,
                ReduceOp::Prod => wrap(xs.iter().fold(1i64, |a, b| a.wrapping_mul(*b))),
                ReduceOp::Min => *xs.iter().min().unwrap(),
                ReduceOp::Max => *xs.iter().max().unwrap(),
            };
            (V::I(r), 0.0)
        }
    }
}

fn check_elem(d: DType, got: &[u8], want: (V, f64), what: &dyn Fn() -> String) {
    match (decode(d, got), want) {
        (V::F(g), (V::F(w), tol)) => assert!((g - w).abs() <= tol, "{}: got {g}, want {w} (tol {tol})", what()),
        (V::I(g), (V::I(w), _)) => assert_eq!(g, w, "{}", what()),
        _ => unreachable!(),
    }
}

fn read(comm: &Communicator<LocalTransport>, buf: &LocalBuf) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    comm.transport().read_local(buf.all(), &mut out).unwrap();
    out
}

/// Element counts: empty, one, not divisible by n, and a few hundred.
fn counts(n: usize) -> [usize; 4] {
    [0, 1, 3 * n + 1, 257]
}

/// A registered output pre-filled with garbage.
fn out_buf(comm: &Communicator<LocalTransport>, bytes: usize) -> LocalBuf {
    comm.register(vec![0xa5; bytes]).unwrap()
}

fn free(comm: &Communicator<LocalTransport>, bufs: Vec<LocalBuf>) {
    for b in bufs {
        comm.deregister(b).unwrap();
    }
}

/// Runs the reduction collectives (all_reduce, reduce, reduce_scatter) for
/// one world, every algorithm/dtype/op/count, checking every element.
fn reduction_matrix(coll: Collective, n: usize, dtypes: &[DType], extra_counts: &[usize]) {
    reduction_matrix_with(coll, n, dtypes, extra_counts, CollConfig::default())
}

fn reduction_matrix_with(coll: Collective, n: usize, dtypes: &[DType], extra_counts: &[usize], cfg: CollConfig) {
    reduction_matrix_of(coll, coll.algorithms(), n, dtypes, extra_counts, cfg)
}

/// [`reduction_matrix_with`] for the algorithms `algos` only.
fn reduction_matrix_of(
    coll: Collective,
    algos: &[Algo],
    n: usize,
    dtypes: &[DType],
    extra_counts: &[usize],
    cfg: CollConfig,
) {
    world_with(n, cfg, |comm| {
        let me = comm.rank();
        let mut case = 0u64;
        for &algo in algos {
            for &d in dtypes {
                for op in ReduceOp::ALL {
                    for &count in counts(n).iter().chain(extra_counts) {
                        case += 1;
                        let es = d.size_bytes();
                        let in_count = if coll == Collective::ReduceScatter { count * n } else { count };
                        let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(d, op, case, r, in_count)).collect();
                        let root = (case as usize) % n;
                        let send = comm.register(inputs[me].clone()).unwrap();
                        let in_place = case % 2 == 0 && coll != Collective::ReduceScatter;
                        let recv = if in_place { None } else { Some(out_buf(comm, count * es)) };
                        let bufs = match &recv {
                            Some(r) => Bufs { send: send.all(), recv: r.all() },
                            None => Bufs::in_place(send.all()),
                        };
                        let what = |i: usize| {
                            move || {
                                format!("{coll} {algo} n={n} rank={me} {d} {op} count={count} root={root} in_place={in_place} elem {i}")
                            }
                        };
                        match coll {
                            Collective::AllReduce => comm.all_reduce(bufs, count, d, op, Some(algo)),
                            Collective::Reduce => comm.reduce(bufs, count, d, op, root, Some(algo)),
                            _ => comm.reduce_scatter(bufs, count, d, op, Some(algo)),
                        }
                        .unwrap_or_else(|e| panic!("{}: {e}", what(0)()));
                        let got = read(comm, recv.as_ref().unwrap_or(&send));
                        if coll != Collective::Reduce || me == root {
                            for i in 0..count {
                                let src_i = if coll == Collective::ReduceScatter { me * count + i } else { i };
                                check_elem(d, &got[i * es..(i + 1) * es], reference(d, op, &inputs, src_i), &what(i));
                            }
                        }
                        free(comm, recv.into_iter().chain([send]).collect());
                    }
                }
            }
        }
    });
}

#[test]
fn all_reduce_every_algo_dtype_op() {
    for n in 1..=RANKS_MAX {
        reduction_matrix(Collective::AllReduce, n, &DType::ALL, &[]);
    }
}

/// Segments of a few elements: blocks cut in many segments (and some empty ones), every
/// dtype and op, so the pipelined schedules' segment bookkeeping is checked element by element
/// (no block cap, which would grow them).
#[test]
fn all_reduce_in_tiny_segments() {
    for segment_bytes in [1, 8, 24] {
        let cfg = CollConfig { segment_bytes, block_segments_max: 0, ..CollConfig::default() };
        for n in 2..=RANKS_MAX {
            reduction_matrix_with(Collective::AllReduce, n, &DType::ALL, &[64 * n + 5], cfg.clone());
        }
    }
}

/// Large vectors in small segments: more segments than the immediate's step numbers allow,
/// so the schedules cap the count (checked against the reference).
#[test]
fn all_reduce_segment_count_capped_by_step_budget() {
    let cfg = CollConfig { segment_bytes: 64, block_segments_max: 0, ..CollConfig::default() };
    for n in [2, 4, 7] {
        reduction_matrix_sized_with(Collective::AllReduce, n, 3 * 1024 * 1024 / 4, cfg.clone());
    }
}

/// Blocks whose segments grow past `segment_bytes` because of the block cap (2 and 3 segments
/// a block, tiny base segments), every dtype and op: the grown segments' bookkeeping is
/// checked element by element against the reference.
#[test]
fn all_reduce_with_segments_grown_by_the_block_cap() {
    for block_segments_max in [2, 3] {
        let cfg = CollConfig { segment_bytes: 8, block_segments_max, ..CollConfig::default() };
        for n in 2..=RANKS_MAX {
            reduction_matrix_with(Collective::AllReduce, n, &DType::ALL, &[64 * n + 5], cfg.clone());
        }
    }
}

#[test]
fn block_cap_grows_only_all_reduce_segments_of_large_blocks() {
    let mib = 1 << 20;
    // 32 MiB of f32 on 2 ranks: 16 MiB blocks in 16 segments of 1 MiB, not 128 of 128 KiB.
    assert_eq!(call_segment_elems(Collective::AllReduce, 8 * mib, 2, 4, 128 << 10, 16), mib / 4);
    // Without the cap (0), or for a block that 16 base segments cover, the base segment.
    assert_eq!(call_segment_elems(Collective::AllReduce, 8 * mib, 2, 4, 128 << 10, 0), 32 << 10);
    assert_eq!(call_segment_elems(Collective::AllReduce, mib / 4, 4, 4, 128 << 10, 16), 32 << 10);
    // Other collectives keep the base segment.
    assert_eq!(call_segment_elems(Collective::AllGather, 8 * mib, 2, 4, 128 << 10, 16), 32 << 10);
    // Rounded up: 17 elements a block in at most 4 segments is 5 elements each.
    assert_eq!(call_segment_elems(Collective::AllReduce, 34, 2, 1, 1, 4), 5);
    // Degenerate inputs stay at least one element.
    assert_eq!(call_segment_elems(Collective::AllReduce, 0, 3, 8, 4, 16), 1);
}

#[test]
fn segments_fit_the_step_budget() {
    assert_eq!(segments_per_block(1000, 100, 4, 0), 10);
    assert_eq!(segments_per_block(0, 100, 4, 0), 1);
    assert_eq!(segments_per_block(1 << 30, 1, 12, 0), 2046 / 12);
    assert_eq!(segments_per_block(1 << 30, 1, 2046, 10), 1);
    assert_eq!(segments_per_block(5, 0, 2, 0), 5);
}

#[test]
fn reduce_every_algo_dtype_op() {
    for n in 1..=RANKS_MAX {
        reduction_matrix(Collective::Reduce, n, &DType::ALL, &[]);
    }
}

#[test]
fn reduce_scatter_every_algo_dtype_op() {
    for n in 1..=RANKS_MAX {
        reduction_matrix(Collective::ReduceScatter, n, &DType::ALL, &[]);
    }
}

/// The arena all_reduce in slots of a few elements (many chunks, both buffers reused, blocks
/// that are empty where a chunk has fewer elements than ranks), every dtype and op, in one
/// lane and cut into lanes (the matrix's larger calls span many slots).
#[test]
fn arena_all_reduce_in_tiny_slots() {
    for arena_lanes in [1, 3] {
        for arena_slot_bytes in [8, 24, 64] {
            let cfg = CollConfig { arena_slot_bytes, arena_lanes, ..CollConfig::default() };
            for n in [2, 3, 5] {
                reduction_matrix_of(Collective::AllReduce, &[Algo::Arena], n, &DType::ALL, &[], cfg.clone());
            }
        }
    }
}

/// A slot smaller than one element is rounded up to a whole word: float64 still moves, right.
#[test]
fn an_arena_slot_below_a_word_is_rounded_up() {
    let cfg = CollConfig { arena_slot_bytes: 4, ..CollConfig::default() };
    let sums = world_with(3, cfg, |comm| {
        let values: Vec<f64> = (0..5).map(|i| (i * 10 + comm.rank()) as f64).collect();
        let buf = comm.register(values.iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap();
        comm.all_reduce(crate::Bufs::in_place(buf.all()), 5, DType::F64, ReduceOp::Sum, Some(Algo::Arena)).unwrap();
        comm.read_typed::<f64>(buf.all()).unwrap()
    });
    for s in sums {
        assert_eq!(s, vec![3.0, 33.0, 63.0, 93.0, 123.0]);
    }
}

#[test]
fn reductions_of_a_few_mib() {
    // 3 MiB of f32 and 1 MiB of i64 per rank, every algorithm.
    for n in [3, 4, 7] {
        for coll in [Collective::AllReduce, Collective::Reduce] {
            world_large(coll, n);
        }
    }
    reduction_matrix_sized(Collective::ReduceScatter, 5, (256 * 1024) / 5);
}

fn world_large(coll: Collective, n: usize) {
    reduction_matrix_sized(coll, n, 3 * 1024 * 1024 / 4);
}

fn reduction_matrix_sized(coll: Collective, n: usize, count: usize) {
    reduction_matrix_sized_with(coll, n, count, CollConfig::default())
}

fn reduction_matrix_sized_with(coll: Collective, n: usize, count: usize, cfg: CollConfig) {
    world_with(n, cfg, |comm| {
        let me = comm.rank();
        for (k, &algo) in coll.algorithms().iter().enumerate() {
            let (d, op) = if k % 2 == 0 { (DType::F32, ReduceOp::Sum) } else { (DType::I64, ReduceOp::Max) };
            let count = count * 4 / d.size_bytes();
            let in_count = if coll == Collective::ReduceScatter { count * n } else { count };
            let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(d, op, 1000 + k as u64, r, in_count)).collect();
            let send = comm.register(inputs[me].clone()).unwrap();
            let recv = out_buf(comm, count * d.size_bytes());
            let bufs = Bufs { send: send.all(), recv: recv.all() };
            match coll {
                Collective::AllReduce => comm.all_reduce(bufs, count, d, op, Some(algo)),
                Collective::Reduce => comm.reduce(bufs, count, d, op, 0, Some(algo)),
                _ => comm.reduce_scatter(bufs, count, d, op, Some(algo)),
            }
            .unwrap();
            if coll != Collective::Reduce || me == 0 {
                let got = read(comm, &recv);
                let es = d.size_bytes();
                for i in (0..count).step_by(7) {
                    let src_i = if coll == Collective::ReduceScatter { me * count + i } else { i };
                    let what = || format!("{coll} {algo} n={n} {d} {op} elem {i}");
                    check_elem(d, &got[i * es..(i + 1) * es], reference(d, op, &inputs, src_i), &what);
                }
            }
            free(comm, vec![send, recv]);
        }
    });
}

#[test]
fn broadcast_every_algo_dtype() {
    for n in 1..=RANKS_MAX {
        world(n, |comm| {
            let me = comm.rank();
            let mut case = 0u64;
            for &algo in Collective::Broadcast.algorithms() {
                for d in DType::ALL {
                    for count in counts(n).into_iter().chain([300_000]) {
                        case += 1;
                        let root = case as usize % n;
                        let data = input(d, ReduceOp::Sum, case, root, count);
                        let es = d.size_bytes();
                        let send = comm.register(if me == root { data.clone() } else { vec![0; count * es] }).unwrap();
                        let recv = out_buf(comm, count * es);
                        let in_place = case % 2 == 0;
                        let bufs = if in_place {
                            Bufs::in_place(send.all())
                        } else {
                            Bufs { send: send.all(), recv: recv.all() }
                        };
                        comm.broadcast(bufs, count, d, root, Some(algo)).unwrap();
                        let got = read(comm, if in_place { &send } else { &recv });
                        assert!(got == data, "broadcast {algo} n={n} rank={me} {d} count={count} root={root}");
                        free(comm, vec![send, recv]);
                    }
                }
            }
        });
    }
}

#[test]
fn all_gather_every_algo_dtype() {
    all_gather_matrix(CollConfig::default());
}

/// Blocks cut in segments of a few elements (one immediate each, some empty segments).
#[test]
fn all_gather_in_tiny_segments() {
    all_gather_matrix(CollConfig { segment_bytes: 8, ..CollConfig::default() });
}

fn all_gather_matrix(cfg: CollConfig) {
    all_gather_matrix_of(1..=RANKS_MAX, Collective::AllGather.algorithms(), cfg)
}

/// [`all_gather_matrix`] for the rank counts `ns` and the algorithms `algos` only.
fn all_gather_matrix_of(ns: impl IntoIterator<Item = usize>, algos: &[Algo], cfg: CollConfig) {
    for n in ns {
        world_with(n, cfg.clone(), |comm| {
            let me = comm.rank();
            let mut case = 0u64;
            for &algo in algos {
                for d in DType::ALL {
                    for count in counts(n).into_iter().chain([100_000]) {
                        case += 1;
                        let es = d.size_bytes();
                        let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(d, ReduceOp::Sum, case, r, count)).collect();
                        let in_place = case % 2 == 0;
                        let recv = out_buf(comm, n * count * es);
                        let send = comm.register(inputs[me].clone()).unwrap();
                        if in_place {
                            comm.transport().write_local(recv.slice(me * count * es, count * es), &inputs[me]).unwrap();
                        }
                        let send_slice = if in_place { recv.slice(me * count * es, count * es) } else { send.all() };
                        comm.all_gather(Bufs { send: send_slice, recv: recv.all() }, count, d, Some(algo)).unwrap();
                        assert!(
                            read(comm, &recv) == inputs.concat(),
                            "all_gather {algo} n={n} rank={me} {d} count={count}"
                        );
                        free(comm, vec![send, recv]);
                    }
                }
            }
        });
    }
}

#[test]
fn all_to_all_every_algo_dtype() {
    all_to_all_matrix(CollConfig::default());
}

/// Blocks cut in segments of a few elements (counted immediates, some empty segments).
#[test]
fn all_to_all_in_tiny_segments() {
    all_to_all_matrix(CollConfig { segment_bytes: 8, ..CollConfig::default() });
}

fn all_to_all_matrix(cfg: CollConfig) {
    for n in 1..=RANKS_MAX {
        world_with(n, cfg.clone(), |comm| {
            let me = comm.rank();
            let mut case = 0u64;
            for &algo in Collective::AllToAll.algorithms() {
                for d in DType::ALL {
                    for count in counts(n).into_iter().chain([40_000]) {
                        case += 1;
                        let bb = count * d.size_bytes();
                        let inputs: Vec<Vec<u8>> =
                            (0..n).map(|r| input(d, ReduceOp::Sum, case, r, count * n)).collect();
                        let send = comm.register(inputs[me].clone()).unwrap();
                        let recv = out_buf(comm, n * bb);
                        comm.all_to_all(Bufs { send: send.all(), recv: recv.all() }, count, d, Some(algo)).unwrap();
                        let want: Vec<u8> = (0..n).flat_map(|j| inputs[j][me * bb..(me + 1) * bb].to_vec()).collect();
                        assert!(read(comm, &recv) == want, "all_to_all {algo} n={n} rank={me} {d} count={count}");
                        free(comm, vec![send, recv]);
                    }
                }
            }
        });
    }
}

/// Elements rank `from` sends to rank `to` in case `case` (some zero).
fn v_count(case: u64, from: usize, to: usize) -> usize {
    let mut rng = ChaCha8Rng::seed_from_u64(case * 1000 + from as u64 * 31 + to as u64);
    if rng.gen_bool(0.2) {
        0
    } else {
        rng.gen_range(1..50)
    }
}

#[test]
fn all_to_allv_every_algo_dtype() {
    all_to_allv_matrix(CollConfig::default());
}

/// Blocks cut in segments of a few elements (counted immediates, some empty segments).
#[test]
fn all_to_allv_in_tiny_segments() {
    all_to_allv_matrix(CollConfig { segment_bytes: 8, ..CollConfig::default() });
}

fn all_to_allv_matrix(cfg: CollConfig) {
    for n in 1..=RANKS_MAX {
        world_with(n, cfg.clone(), |comm| {
            let me = comm.rank();
            let mut case = 0u64;
            for &algo in Collective::AllToAllV.algorithms() {
                for d in DType::ALL {
                    case += 1;
                    let es = d.size_bytes();
                    // Packed with a one-element gap after every block, to exercise displacements.
                    let displs = |c: &[usize]| {
                        c.iter()
                            .scan(0, |at, c| {
                                let d = *at;
                                *at += c + 1;
                                Some(d)
                            })
                            .collect::<Vec<_>>()
                    };
                    let send_counts: Vec<usize> = (0..n).map(|j| v_count(case, me, j)).collect();
                    let recv_counts: Vec<usize> = (0..n).map(|j| v_count(case, j, me)).collect();
                    let layout = AllToAllVLayout {
                        send_displs: displs(&send_counts),
                        recv_displs: displs(&recv_counts),
                        send_counts: send_counts.clone(),
                        recv_counts: recv_counts.clone(),
                    };
                    let send_total: usize = send_counts.iter().map(|c| c + 1).sum();
                    let recv_total: usize = recv_counts.iter().map(|c| c + 1).sum();
                    let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(d, ReduceOp::Sum, case, r, 50 * n + n)).collect();
                    let send = comm.register(inputs[me][..send_total * es].to_vec()).unwrap();
                    let recv = out_buf(comm, recv_total * es);
                    comm.all_to_allv(Bufs { send: send.all(), recv: recv.all() }, &layout, d, Some(algo)).unwrap();
                    let got = read(comm, &recv);
                    for j in 0..n {
                        // Rank j's send displacement towards me.
                        let j_counts: Vec<usize> = (0..n).map(|k| v_count(case, j, k)).collect();
                        let j_displ = displs(&j_counts)[me];
                        let want = &inputs[j][j_displ * es..(j_displ + recv_counts[j]) * es];
                        let at = layout.recv_displs[j] * es;
                        assert!(&got[at..at + want.len()] == want, "all_to_allv {algo} n={n} rank={me} from {j} {d}");
                    }
                    free(comm, vec![send, recv]);
                }
            }
        });
    }
}

#[test]
fn default_selection_follows_thresholds() {
    let c = CollConfig::default();
    assert_eq!(c.algo_for(Collective::AllReduce, 1024, None), Algo::RecursiveDoubling);
    assert_eq!(c.algo_for(Collective::AllReduce, 512 * 1024, None), Algo::Rabenseifner);
    assert_eq!(c.algo_for(Collective::AllReduce, 64 << 20, None), Algo::Ring);
    assert_eq!(c.algo_for(Collective::AllReduce, 64 << 20, Some(Algo::Rabenseifner)), Algo::Rabenseifner);
    assert_eq!(c.algo_for(Collective::Broadcast, 1 << 20, None), Algo::Ring);
    assert_eq!(c.algo_for(Collective::AllGather, 100, None), Algo::Bruck);
    assert_eq!(c.algo_for(Collective::AllReduce, 16 << 20, None), Algo::Rabenseifner);
    assert_eq!(c.algo_for(Collective::AllToAll, 1 << 20, None), Algo::Direct);
    assert_eq!(c.algo_for(Collective::AllToAll, 8 << 20, None), Algo::Pairwise);
    let mut c2 = c.clone();
    c2.algo_overrides.insert(Collective::AllReduce, Algo::Ring);
    assert_eq!(c2.algo_for(Collective::AllReduce, 8, None), Algo::Ring);
}

#[test]
fn algorithm_names_parse_per_collective() {
    for coll in Collective::ALL {
        for &a in coll.algorithms() {
            assert_eq!(Algo::parse_for(coll, a.name()).unwrap(), a);
        }
    }
    assert_eq!(Algo::parse_for(Collective::Broadcast, "tree").unwrap(), Algo::BinomialTree);
    assert_eq!(Algo::parse_for(Collective::AllReduce, "Recursive-Doubling").unwrap(), Algo::RecursiveDoubling);
    assert!(Algo::parse_for(Collective::AllReduce, "bruck").is_err());
}

#[test]
fn fold_map_covers_every_rank() {
    for n in 1..40 {
        let f = FoldMap::new(n);
        assert_eq!(f.p + f.rem, n);
        let mut seen = vec![false; n];
        for v in 0..f.p {
            seen[f.real(v)] = true;
            assert_eq!(f.role(f.real(v)), Fold::In { new_rank: v, partner_out: (v < f.rem).then(|| 2 * v) });
        }
        for (r, seen) in seen.iter().enumerate() {
            assert!(*seen || f.role(r) == Fold::Out);
        }
        assert_eq!(f.vstart(f.p), n);
    }
}

#[test]
fn exchange_peers_are_mutual_and_ordered_fold_partner_first() {
    let f = FoldMap::new(6); // p = 4, rem = 2: ranks 0 and 2 fold out into 1 and 3
    assert_eq!(f.exchange_peers(0), vec![1]);
    assert_eq!(f.exchange_peers(1), vec![0, 3, 4]);
    assert_eq!(f.exchange_peers(4), vec![5, 1]);
    for n in 1..40 {
        let f = FoldMap::new(n);
        for r in 0..n {
            let peers = f.exchange_peers(r);
            assert_eq!(
                peers.len(),
                if f.role(r) == Fold::Out { 1 } else { f.steps() as usize + usize::from(r < 2 * f.rem) }
            );
            for &q in &peers {
                assert_ne!(q, r);
                assert!(f.exchange_peers(q).contains(&r), "n {n}: {r} exchanges with {q} but not back");
            }
        }
    }
}

/// Direct at the rank counts of a host (8 is above the other matrices' `RANKS_MAX`): every dtype
/// and op, counts below the rank count (empty blocks) and not divisible by it, in place and
/// out of place, in one segment a block and in segments of one or two elements (empty ones
/// included), each element against the reference.
#[test]
fn direct_all_reduce_and_reduce_scatter_at_2_to_8_ranks() {
    for n in [2, 3, 4, 5, 8] {
        for segment_bytes in [CollConfig::default().segment_bytes, 8] {
            let cfg = CollConfig { segment_bytes, ..CollConfig::default() };
            for coll in [Collective::AllReduce, Collective::ReduceScatter] {
                reduction_matrix_of(coll, &[Algo::Direct], n, &DType::ALL, &[n - 1, 64 * n + 5], cfg.clone());
            }
        }
    }
}

#[test]
fn direct_all_gather_at_8_ranks() {
    for segment_bytes in [CollConfig::default().segment_bytes, 8] {
        all_gather_matrix_of([8], &[Algo::Direct], CollConfig { segment_bytes, ..CollConfig::default() });
    }
}

/// Values with rounding (not exactly representable sums), so the order of a reduction shows
/// in its result.
fn rounding_values<E: From<f32>>(rank: usize, count: usize) -> Vec<E> {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 0xd1ec7 ^ rank as u64);
    (0..count).map(|_| E::from(rng.gen_range(-1.0e3f32..1.0e3) / 3.0)).collect()
}

/// Direct all_reduce's `Sum` is `x_0 + x_1 + ... + x_{n-1}` in rank order, bit for bit, on
/// every rank, in place and out of place, in one segment a block and in many: the owner of
/// each block reduces in rank order whatever the arrival order and the others copy its bytes.
/// (Any other association, or a rank reducing on its own, would differ in the last bits.)
fn direct_sums_in_rank_order<E>(n: usize, segment_bytes: usize)
where
    E: crate::Element + From<f32> + std::ops::Add<Output = E> + Copy + PartialEq + std::fmt::Debug,
{
    let count = 1000 + n;
    let inputs: Vec<Vec<E>> = (0..n).map(|r| rounding_values(r, count)).collect();
    let want: Vec<E> = (0..count).map(|i| inputs[1..].iter().fold(inputs[0][i], |acc, x| acc + x[i])).collect();
    let cfg = CollConfig { segment_bytes, ..CollConfig::default() };
    world_with(n, cfg, |comm| {
        let me = comm.rank();
        for in_place in [false, true] {
            let send = comm.register_typed(&inputs[me]).unwrap();
            let recv = out_buf(comm, count * std::mem::size_of::<E>());
            let bufs = if in_place { Bufs::in_place(send.all()) } else { Bufs { send: send.all(), recv: recv.all() } };
            comm.all_reduce(bufs, count, E::DTYPE, ReduceOp::Sum, Some(Algo::Direct)).unwrap();
            let got: Vec<E> = comm.read_typed(if in_place { send.all() } else { recv.all() }).unwrap();
            let first_diff = got.iter().zip(&want).position(|(g, w)| g != w);
            assert!(
                first_diff.is_none(),
                "n={n} rank={me} in_place={in_place} segment_bytes={segment_bytes}: elem {first_diff:?} differs"
            );
            free(comm, vec![send, recv]);
        }
    });
}

#[test]
fn direct_all_reduce_sums_in_rank_order_bit_for_bit_on_every_rank() {
    for n in [3, 5, 8] {
        for segment_bytes in [CollConfig::default().segment_bytes, 40] {
            direct_sums_in_rank_order::<f32>(n, segment_bytes);
            direct_sums_in_rank_order::<f64>(n, segment_bytes);
        }
    }
}

#[test]
fn direct_scratch_is_one_slot_per_other_rank() {
    let ar = |count, es, n| scratch_bytes(Collective::AllReduce, Algo::Direct, count, es, n);
    assert_eq!(ar(1000, 4, 8), 7 * 125 * 4);
    assert_eq!(ar(1001, 4, 8), 7 * 126 * 4); // slots of the largest block
    assert_eq!(ar(3, 4, 8), 7 * 4); // count below the rank count: one-element slots
                                    // reduce_scatter: `count` is the per-rank block.
    assert_eq!(scratch_bytes(Collective::ReduceScatter, Algo::Direct, 10, 8, 4), 3 * 80);
    assert_eq!(scratch_bytes(Collective::AllGather, Algo::Direct, 10, 8, 4), 0);
    // Never more than ring's one vector once every rank has an element.
    for n in 2..=16 {
        for count in [n, 1000, (1 << 20) + 3] {
            assert!(ar(count, 4, n) <= scratch_bytes(Collective::AllReduce, Algo::Ring, count, 4, n), "n={n} {count}");
        }
    }
}
