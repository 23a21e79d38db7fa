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
    let config = GpuConfig { scratch_bytes: 8 << 20, pipeline_chunk_bytes: 4096, ..GpuConfig::default() };
    let mut comm = communicator(rank, port, config);
    for count in [1, 1017, 40_000, 5_000_001] {
        for line in check::run_all(&mut comm, count).expect("checks") {
            println!("rank {rank}: {line}");
        }
    }
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
