//! Two-rank GPU tests: rank 1 is this test again, in a child process (`accord_testkit`).
//! They print `skipped: <reason>` without 2 GPUs.

use accord_testkit::{Group, Spawn};
use std::time::Duration;

use super::check;
use super::{GpuBufs, GpuCollError, GpuCommunicator, GpuConfig};
use crate::store::{Bootstrap, BootstrapConfig};

/// Rank 1's whole life: its waits are bounded at 60 s each, a few in a row.
const CHILD_BOUND: Duration = Duration::from_secs(300);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(29_611)
}

/// Rank 0 spawns rank 1 (this test, in a child process); returns (rank, port, rank 1's group
/// at rank 0).
fn two_ranks(test: &str) -> (usize, u16, Option<Group>) {
    if let Some(ctx) = accord_testkit::child() {
        // The parent is rank 0; its one child is rank 1.
        return (ctx.rank + 1, ctx.parse("port").expect("the parent passes its port"), None);
    }
    let port = free_port();
    let child = Spawn::new(test, 1).value("port", port).bound(CHILD_BOUND).start().expect("spawn rank 1");
    (0, port, Some(child))
}

/// Every collective's checks ([`check::run_all`]) at each of `counts`, each line printed.
fn run_checks(comm: &mut GpuCommunicator, rank: usize, counts: &[usize]) {
    for &count in counts {
        for line in check::run_all(comm, count).expect("checks") {
            println!("rank {rank}: {line}");
        }
    }
}

fn communicator(rank: usize, port: u16, config: GpuConfig) -> GpuCommunicator {
    let bc = BootstrapConfig {
        rank,
        world_size: 2,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        timeout: Duration::from_secs(60),
        secret: None,
    };
    let bootstrap = if rank == 0 { Bootstrap::connect(bc) } else { Bootstrap::join(bc, None) }.expect("bootstrap");
    GpuCommunicator::new(bootstrap, config).expect("communicator")
}

#[test]
fn two_rank_collectives_respect_stream_order() {
    accord_cuda::require_gpu!(2, nvrtc);
    let (rank, port, child) = two_ranks("gpu::gpu_tests::two_rank_collectives_respect_stream_order");
    // A small scratch buffer forces large all_reduce and reduce_scatter calls into several
    // rounds, and small pipeline chunks split each round into many chunks (uneven slices and, from
    // 2 MiB blocks on, the ramp of smaller last chunks included).
    // Direct all_reduces off: this test covers the progress thread's path.
    let config =
        GpuConfig { scratch_bytes: 8 << 20, pipeline_chunk_bytes: 4096, direct_bytes: 0, ..GpuConfig::default() };
    let mut comm = communicator(rank, port, config);
    assert_eq!(comm.direct_bytes_max(), 0);
    run_checks(&mut comm, rank, &[1, 1017, 40_000, 5_000_001]);
    drop(comm);
    if let Some(mut child) = child {
        child.finish().expect("rank 1 succeeds");
    }
}

#[test]
fn a_peer_that_exits_gives_an_error_not_a_crash() {
    accord_cuda::require_gpu!(2, nvrtc);
    let (rank, port, child) = two_ranks("gpu::gpu_tests::a_peer_that_exits_gives_an_error_not_a_crash");
    let config = GpuConfig { op_timeout: Duration::from_secs(20), ..GpuConfig::default() };
    let mut comm = communicator(rank, port, config);
    let gpu = comm.gpu().clone();
    let stream = accord_cuda::Stream::new(&gpu).expect("stream");
    let send = accord_cuda::DeviceBuffer::alloc(&gpu, 1 << 20).expect("alloc");
    let recv = accord_cuda::DeviceBuffer::alloc(&gpu, 2 << 20).expect("alloc");
    comm.register(&recv).expect("register");
    comm.all_gather(GpuBufs { send: &send, recv: &recv }, 1 << 20, &stream).expect("first all_gather");
    comm.wait_idle(Duration::from_secs(30)).expect("first all_gather completes");
    comm.host_all_gather(b"mapped").expect("barrier");
    if rank == 1 {
        // Exit with everything released: buffers freed, context torn down.
        drop(comm);
        drop(recv);
        return;
    }
    child.expect("rank 0 spawned rank 1").finish().expect("rank 1 exits");
    comm.all_gather(GpuBufs { send: &send, recv: &recv }, 1 << 20, &stream).expect("the call itself is queued");
    let err = comm.wait_idle(Duration::from_secs(60)).expect_err("the peer is gone");
    assert!(
        matches!(err, GpuCollError::PeerGone { rank: 1, .. }) || matches!(err, GpuCollError::Failed { .. }),
        "{err}"
    );
    println!("rank 0 got: {err}");
    stream.synchronize().expect("the stream was released");
    let again = comm.all_gather(GpuBufs { send: &send, recv: &recv }, 1 << 20, &stream);
    assert!(matches!(again, Err(GpuCollError::Failed { .. })), "later calls fail fast");
}

/// Memory a framework allocated (here: views into a larger allocation, as PyTorch's caching
/// allocator hands out): registered by address, one registration per allocation, and a freed
/// allocation's registration replaced, not reused, when new memory comes back at its address.
#[test]
fn memory_registered_by_address_receives_and_is_replaced_when_freed() {
    accord_cuda::require_gpu!(2, nvrtc);
    let (rank, port, child) =
        two_ranks("gpu::gpu_tests::memory_registered_by_address_receives_and_is_replaced_when_freed");
    let comm = communicator(rank, port, GpuConfig::default());
    let gpu = comm.gpu().clone();
    let stream = accord_cuda::Stream::new(&gpu).expect("stream");
    const BLOCK: usize = 1 << 20;
    let mut send = accord_cuda::DeviceBuffer::alloc(&gpu, BLOCK).expect("alloc");
    let pattern: Vec<u8> = (0..BLOCK).map(|i| (i * 31 + rank * 7 + 1) as u8).collect();
    send.copy_from_host(0, &pattern, &stream).expect("fill");
    let expect = |r: usize, i: usize| (i * 31 + r * 7 + 1) as u8;
    let registrations_before = comm.registration_count();
    let gather_into = |view: &accord_cuda::DeviceBuffer, what: &str| {
        comm.register_allocation_of(view.ptr(), view.len_bytes()).expect("register by address");
        comm.all_gather(GpuBufs { send: &send, recv: view }, BLOCK, &stream).expect("all_gather");
        comm.wait_idle(Duration::from_secs(60)).expect("all_gather completes");
        let mut got = vec![0u8; 2 * BLOCK];
        view.copy_to_host(0, &mut got, &stream).expect("read back");
        for r in 0..2 {
            let bad = (0..BLOCK).find(|&i| got[r * BLOCK + i] != expect(r, i));
            assert_eq!(bad, None, "{what}: rank {r}'s block differs at that byte");
        }
    };
    let first = accord_cuda::DeviceBuffer::alloc(&gpu, 6 * BLOCK).expect("arena");
    for offset in [BLOCK, 3 * BLOCK] {
        let view = accord_cuda::DeviceBuffer::borrow_raw(&gpu, first.ptr().offset(offset), 2 * BLOCK).expect("view");
        gather_into(&view, &format!("a view at {offset}"));
        assert_eq!(comm.registration_count(), registrations_before + 1, "one registration per allocation");
    }
    let first_base = first.ptr();
    drop(first);
    let second = accord_cuda::DeviceBuffer::alloc(&gpu, 6 * BLOCK).expect("arena");
    let view = accord_cuda::DeviceBuffer::borrow_raw(&gpu, second.ptr(), 2 * BLOCK).expect("view");
    gather_into(&view, "the new allocation");
    if second.ptr() == first_base {
        assert_eq!(comm.registration_count(), registrations_before + 1, "the freed allocation's entry was replaced");
    }
    println!("rank {rank}: same address again: {}", second.ptr() == first_base);
    drop(view);
    drop(second);
    drop(comm);
    if let Some(mut child) = child {
        child.finish().expect("rank 1 succeeds");
    }
}

/// The progress thread in a CUDA context of its own, the scratch and the user's buffers in VMM
/// memory exported as file descriptors, the caller's stream in the primary context (as
/// PyTorch's is): the checks of every collective pass (each order but `stall`), and an
/// all_reduce and an all_gather land exactly in VMM memory registered by address.
#[test]
fn a_private_context_runs_the_collectives_on_vmm_memory() {
    use super::StreamOrder;
    accord_cuda::require_gpu!(2, nvrtc);
    let (rank, port, child) = two_ranks("gpu::gpu_tests::a_private_context_runs_the_collectives_on_vmm_memory");
    let mut comm = communicator(rank, port, private_waitvalue(1 << 20));
    assert!(comm.set_stream_order(StreamOrder::Stall).is_err(), "stall needs the primary context");
    run_checks(&mut comm, rank, &[1017, 5_000_001]);
    let gpu = comm.gpu().clone();
    let stream = accord_cuda::Stream::new(comm.callers_gpu()).expect("a stream of the primary context");
    const BLOCK: usize = 3 << 20; // elements of f32: 12 MiB, several 2 MiB mappings' worth
    let bytes = BLOCK * 4;
    let send = vmm_f32(&gpu, BLOCK, |i| (i % 1000) as f32 + rank as f32 * 0.5, &stream);
    let recv = accord_cuda::DeviceBuffer::alloc_shareable(&gpu, 2 * bytes).expect("alloc_shareable");
    comm.register_allocation_of(recv.ptr(), recv.len_bytes()).expect("register VMM memory by address");
    comm.register_allocation_of(send.ptr(), send.len_bytes()).expect("register VMM memory by address");
    comm.all_gather(GpuBufs { send: &send, recv: &recv }, bytes, &stream).expect("all_gather");
    comm.all_reduce(GpuBufs { send: &send, recv: &send }, BLOCK, crate::DType::F32, crate::ReduceOp::Sum, &stream)
        .expect("all_reduce in place");
    comm.wait_idle(Duration::from_secs(60)).expect("both complete");
    stream.synchronize().expect("the stream was released");
    let gathered = read_back(&recv, &stream);
    let reduced = read_back(&send, &stream);
    for r in 0..2 {
        let block = &gathered[r * bytes..(r + 1) * bytes];
        let bad = (0..BLOCK).find(|&i| f32_at(block, i) != (i % 1000) as f32 + r as f32 * 0.5);
        assert_eq!(bad, None, "rank {r}'s gathered block differs at that element");
    }
    let bad = (0..BLOCK).find(|&i| f32_at(&reduced, i) != 2.0 * (i % 1000) as f32 + 0.5);
    assert_eq!(bad, None, "the sum differs at that element");
    drop(comm);
    if let Some(mut child) = child {
        child.finish().expect("rank 1 succeeds");
    }
}

/// `ACCORD_GPU_REDUCE_ON_CALLER` in a private context: on a stream of the primary context (as a
/// framework's) the reductions run on that stream, gated by the words the progress thread sets.
/// An all_reduce of several rounds of many chunks (small scratch, small chunks), in place and as
/// an average, and a reduce_scatter land exactly; every collective's checks (on streams of the
/// private context, which keep the progress thread's reductions) pass too.
#[test]
fn reductions_on_the_callers_stream_land_exactly() {
    use super::StreamOrder;
    accord_cuda::require_gpu!(2, nvrtc);
    let (rank, port, child) = two_ranks("gpu::gpu_tests::reductions_on_the_callers_stream_land_exactly");
    let config = GpuConfig { reduce_on_caller: true, ..private_waitvalue(64 << 10) };
    let mut comm = communicator(rank, port, config);
    assert!(comm.set_stream_order(StreamOrder::HostFn).is_err(), "the caller's reductions need waitvalue");
    run_checks(&mut comm, rank, &[1017, 40_000]);
    let gpu = comm.gpu().clone();
    let stream = accord_cuda::Stream::new(comm.callers_gpu()).expect("a stream of the primary context");
    const COUNT: usize = 5 << 20; // f32 elements: 20 MiB, two rounds of an 8 MiB scratch at 2 ranks
    let bytes = COUNT * 4;
    let value = |i: usize, r: usize| (i % 1000) as f32 + r as f32 * 0.5;
    let data = vmm_f32(&gpu, COUNT, |i| value(i, rank), &stream);
    let half = accord_cuda::DeviceBuffer::alloc_shareable(&gpu, bytes / 2).expect("alloc_shareable");
    comm.register_allocation_of(data.ptr(), data.len_bytes()).expect("register");
    comm.register_allocation_of(half.ptr(), half.len_bytes()).expect("register");
    let bufs = GpuBufs { send: &data, recv: &half };
    comm.reduce_scatter(bufs, COUNT / 2, crate::DType::F32, crate::ReduceOp::Sum, &stream).expect("reduce_scatter");
    let bufs = GpuBufs { send: &data, recv: &data };
    comm.all_reduce(bufs, COUNT, crate::DType::F32, crate::ReduceOp::Sum, &stream).expect("all_reduce in place");
    comm.all_reduce(bufs, COUNT, crate::DType::F32, crate::ReduceOp::Avg, &stream).expect("average in place");
    comm.wait_idle(Duration::from_secs(60)).expect("all complete");
    stream.synchronize().expect("the stream was released");
    let scattered = read_back(&half, &stream);
    let reduced = read_back(&data, &stream);
    let base = rank * COUNT / 2;
    let bad = (0..COUNT / 2).find(|&i| f32_at(&scattered, i) != value(base + i, 0) + value(base + i, 1));
    assert_eq!(bad, None, "the reduce_scatter differs at that element");
    // Sum then average of two equal sums: the sum itself.
    let bad = (0..COUNT).find(|&i| f32_at(&reduced, i) != value(i, 0) + value(i, 1));
    assert_eq!(bad, None, "the all_reduce differs at that element");
    drop(comm);
    if let Some(mut child) = child {
        child.finish().expect("rank 1 succeeds");
    }
}

/// The caller-stream reductions when the peer is gone: the call fails on the progress thread,
/// which lets the caller's stream past every chunk it queued (the stream finishes, within a
/// bound), and later calls fail fast.
#[test]
fn a_peer_gone_lets_the_callers_stream_past_its_reductions() {
    accord_cuda::require_gpu!(2, nvrtc);
    let (rank, port, child) = two_ranks("gpu::gpu_tests::a_peer_gone_lets_the_callers_stream_past_its_reductions");
    let config =
        GpuConfig { reduce_on_caller: true, op_timeout: Duration::from_secs(20), ..private_waitvalue(64 << 10) };
    let comm = communicator(rank, port, config);
    assert!(comm.reduces_on_caller(), "the kernels were built in the caller's context");
    let gpu = comm.gpu().clone();
    let stream = accord_cuda::Stream::new(comm.callers_gpu()).expect("a stream of the primary context");
    const COUNT: usize = 1 << 20;
    let data = vmm_f32(&gpu, COUNT, |i| i as f32, &stream);
    comm.register_allocation_of(data.ptr(), data.len_bytes()).expect("register");
    after_the_peer_exits(comm, rank, child, &data, COUNT, &stream);
}

/// One all_reduce of `count` f32 of `data` in place on both ranks; then rank 1 drops everything
/// and exits, and rank 0's next all_reduce must fail naming rank 1, let `stream` finish within a
/// bound, and make later calls fail fast.
fn after_the_peer_exits(
    mut comm: GpuCommunicator,
    rank: usize,
    child: Option<Group>,
    data: &accord_cuda::DeviceBuffer,
    count: usize,
    stream: &accord_cuda::Stream,
) {
    let bufs = GpuBufs { send: data, recv: data };
    comm.all_reduce(bufs, count, crate::DType::F32, crate::ReduceOp::Sum, stream).expect("first all_reduce");
    comm.wait_idle(Duration::from_secs(30)).expect("first all_reduce completes");
    comm.host_all_gather(b"done").expect("barrier");
    if rank == 1 {
        drop(comm);
        return;
    }
    child.expect("rank 0 spawned rank 1").finish().expect("rank 1 exits");
    let started = std::time::Instant::now();
    comm.all_reduce(bufs, count, crate::DType::F32, crate::ReduceOp::Sum, stream).expect("the call itself is queued");
    let err = comm.wait_idle(Duration::from_secs(60)).expect_err("the peer is gone");
    println!("rank 0 got after {:?}: {err}", started.elapsed());
    assert!(err.to_string().contains("rank 1"), "{err}");
    let released = std::time::Instant::now() + Duration::from_secs(30);
    while !stream.query().expect("stream state") {
        assert!(std::time::Instant::now() < released, "the caller's stream still waits after the failure");
        std::thread::sleep(Duration::from_millis(5));
    }
    let again = comm.all_reduce(bufs, count, crate::DType::F32, crate::ReduceOp::Sum, stream);
    assert!(matches!(again, Err(GpuCollError::Failed { .. })), "later calls fail fast");
}

/// A private context, the `waitvalue` order (the only one whose stream waits on words, which
/// both the private context and the caller-stream reductions need) and an 8 MiB scratch, so
/// that large calls run in rounds; chunks of `chunk_bytes`.
fn private_waitvalue(chunk_bytes: usize) -> GpuConfig {
    GpuConfig {
        private_context: true,
        stream_order: super::StreamOrder::WaitValue,
        scratch_bytes: 8 << 20,
        pipeline_chunk_bytes: chunk_bytes,
        // The tests built on this cover the progress thread's paths.
        direct_bytes: 0,
        ..GpuConfig::default()
    }
}

/// `count` f32 values `value(i)` in VMM memory (as PyTorch's expandable segments allocate),
/// written on `stream`.
fn vmm_f32(
    gpu: &accord_cuda::Gpu,
    count: usize,
    value: impl Fn(usize) -> f32,
    stream: &accord_cuda::Stream,
) -> accord_cuda::DeviceBuffer {
    let mut buf = accord_cuda::DeviceBuffer::alloc_shareable(gpu, count * 4).expect("alloc_shareable");
    let bytes: Vec<u8> = (0..count).flat_map(|i| value(i).to_le_bytes()).collect();
    buf.copy_from_host(0, &bytes, stream).expect("fill");
    buf
}

/// The whole of `buf`, read back on `stream`.
fn read_back(buf: &accord_cuda::DeviceBuffer, stream: &accord_cuda::Stream) -> Vec<u8> {
    let mut bytes = vec![0u8; buf.len_bytes()];
    buf.copy_to_host(0, &mut bytes, stream).expect("read back");
    bytes
}

fn f32_at(bytes: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

/// Direct calls ([`super::direct`]): with 200,192-byte slots, the checks' all_reduce and
/// reduce_scatter of 1, 1017 and 40,000 elements go direct and those of 5,000,001 through the
/// progress thread, on the same stream as the other collectives, with stream order proven both
/// ways (slow producer, early consumer). Then 40 in-place sums back to back (slots alternate,
/// every call from the third waits for the peer to free its slot), an in-place all_gather and a
/// direct sum after it land exactly, and so does a 20 MiB sum and average in place on VMM memory
/// with the default inbox.
#[test]
fn direct_calls_keep_stream_order_and_land_exactly() {
    accord_cuda::require_gpu!(2, nvrtc);
    let (rank, port, child) = two_ranks("gpu::gpu_tests::direct_calls_keep_stream_order_and_land_exactly");
    let config = GpuConfig {
        scratch_bytes: 8 << 20,
        pipeline_chunk_bytes: 64 << 10,
        direct_bytes: 4 * 200_192,
        ..GpuConfig::default()
    };
    let mut comm = communicator(rank, port, config);
    assert_eq!(comm.direct_bytes_max(), 200_192);
    run_checks(&mut comm, rank, &[1, 1017, 40_000, 5_000_001]);
    let gpu = comm.gpu().clone();
    let stream = accord_cuda::Stream::new(&gpu).expect("stream");
    const COUNT: usize = 40_000;
    let ones = vmm_f32(&gpu, COUNT, |_| 1.0, &stream);
    let bufs = GpuBufs { send: &ones, recv: &ones };
    for _ in 0..40 {
        comm.all_reduce(bufs, COUNT, crate::DType::F32, crate::ReduceOp::Sum, &stream).expect("direct sum");
    }
    comm.wait_idle(Duration::from_secs(60)).expect("all finish");
    let got = read_back(&ones, &stream);
    let bad = (0..COUNT).find(|&i| f32_at(&got, i) != (1u64 << 40) as f32);
    assert_eq!(bad, None, "40 doublings differ at that element");
    // all_gather in place (through the progress thread: all_gather never goes direct) between
    // direct calls on the same stream: each rank's block already sits at its place.
    const B: usize = 10_000;
    let value = |i: usize, r: usize| (i % 977) as f32 + r as f32 * 0.25;
    let whole = vmm_f32(&gpu, 2 * B, |i| if i / B == rank { value(i % B, rank) } else { -1.0 }, &stream);
    comm.register_allocation_of(whole.ptr(), whole.len_bytes()).expect("register");
    let mine = accord_cuda::DeviceBuffer::borrow_raw(&gpu, whole.ptr().offset(rank * B * 4), B * 4).expect("view");
    comm.all_gather(GpuBufs { send: &mine, recv: &whole }, B * 4, &stream).expect("all_gather in place");
    let twice = vmm_f32(&gpu, 2 * B, |_| 0.5, &stream);
    let bufs = GpuBufs { send: &twice, recv: &twice };
    comm.all_reduce(bufs, 2 * B, crate::DType::F32, crate::ReduceOp::Sum, &stream).expect("direct sum after it");
    comm.wait_idle(Duration::from_secs(60)).expect("both finish");
    let got = read_back(&whole, &stream);
    let bad = (0..2 * B).find(|&i| f32_at(&got, i) != value(i % B, i / B));
    assert_eq!(bad, None, "the gathered blocks differ at that element");
    let got = read_back(&twice, &stream);
    assert_eq!((0..2 * B).find(|&i| f32_at(&got, i) != 1.0), None, "the direct sum after the all_gather");
    let (queued, finished) = comm.progress();
    assert_eq!(queued, finished, "every call counted as finished");
    drop(comm);

    let mut comm = communicator(rank, port + 1, GpuConfig::default());
    assert_eq!(comm.direct_bytes_max(), 32 << 20);
    run_checks(&mut comm, rank, &[1017]);
    const BIG: usize = 5 << 20; // 20 MiB of f32
    let value = |i: usize, r: usize| (i % 1000) as f32 + r as f32 * 0.5;
    let data = vmm_f32(&gpu, BIG, |i| value(i, rank), &stream);
    let bufs = GpuBufs { send: &data, recv: &data };
    comm.all_reduce(bufs, BIG, crate::DType::F32, crate::ReduceOp::Sum, &stream).expect("sum in place");
    comm.all_reduce(bufs, BIG, crate::DType::F32, crate::ReduceOp::Avg, &stream).expect("average in place");
    comm.wait_idle(Duration::from_secs(60)).expect("both finish");
    let got = read_back(&data, &stream);
    let bad = (0..BIG).find(|&i| f32_at(&got, i) != value(i, 0) + value(i, 1));
    assert_eq!(bad, None, "the sum (then the average of two equal sums) differs at that element");
    drop(comm);
    if let Some(mut child) = child {
        child.finish().expect("rank 1 succeeds");
    }
}

/// A direct all_reduce whose peer is gone: no host thread takes part in the call, so the
/// watchdog finds the peer closed, fails the call naming it and lets the stream past (within a
/// bound, long before the op timeout); later calls fail fast.
#[test]
fn a_peer_gone_lets_a_direct_all_reduce_past() {
    accord_cuda::require_gpu!(2, nvrtc);
    let (rank, port, child) = two_ranks("gpu::gpu_tests::a_peer_gone_lets_a_direct_all_reduce_past");
    let config = GpuConfig { op_timeout: Duration::from_secs(120), ..GpuConfig::default() };
    let comm = communicator(rank, port, config);
    let gpu = comm.gpu().clone();
    let stream = accord_cuda::Stream::new(&gpu).expect("stream");
    const COUNT: usize = 1 << 18;
    assert!(COUNT * 4 <= comm.direct_bytes_max(), "the calls go direct");
    let data = vmm_f32(&gpu, COUNT, |i| i as f32, &stream);
    after_the_peer_exits(comm, rank, child, &data, COUNT, &stream);
}
