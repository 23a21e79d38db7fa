//! Correctness checks of every collective on device buffers, with stream
//! order proven: each call's input is produced by a kernel queued on the
//! user's stream right before the call, behind a deliberately slow stall
//! kernel (released by a host thread after [`SLOW_PRODUCER`]); the output
//! is consumed by a kernel queued right after the call. A collective that
//! started early would copy the stale input; one that released the stream
//! early would let the consumer read the 0xAB fill. Used by the GPU tests
//! and by `accord-gpu-bench --check`.

use std::time::Duration;

use accord_cuda::{DeviceBuffer, Reducer, StallGate, Stream};

use super::error::{GpuCollError, GpuResult};
use super::{GpuBufs, GpuCommunicator};
use crate::{DType, ReduceOp};

/// How long the producer is held before it writes the input.
pub const SLOW_PRODUCER: Duration = Duration::from_millis(150);

/// Value of element `index` of rank `rank`'s input.
pub fn input_value(rank: usize, index: usize) -> i32 {
    (rank as i32).wrapping_mul(100_003).wrapping_add((index as i32).wrapping_mul(7)).wrapping_add(1)
}

fn to_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn from_bytes(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Buffers and kernels of the checks on one rank.
pub struct Checker {
    reducer: Reducer,
    stall: StallGate,
    base: DeviceBuffer,
    ones_minus: DeviceBuffer,
    zeros: DeviceBuffer,
    input: DeviceBuffer,
    output: DeviceBuffer,
    consumed: DeviceBuffer,
    elements_max: usize,
}

/// Which collective a check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// all_gather.
    AllGather,
    /// all_to_all.
    AllToAll,
    /// sendrecv.
    SendRecv,
    /// broadcast from the last rank.
    Broadcast,
    /// all_reduce (sum).
    AllReduce,
    /// all_reduce in place (max).
    AllReduceInPlaceMax,
    /// reduce_scatter (sum).
    ReduceScatter,
}

impl CheckKind {
    /// Every check.
    pub const ALL: [CheckKind; 7] = [
        CheckKind::AllGather,
        CheckKind::AllToAll,
        CheckKind::SendRecv,
        CheckKind::Broadcast,
        CheckKind::AllReduce,
        CheckKind::AllReduceInPlaceMax,
        CheckKind::ReduceScatter,
    ];
}

impl Checker {
    /// Allocates buffers for blocks of up to `count` i32 per rank and registers the output ones.
    pub fn new(comm: &mut GpuCommunicator, count: usize) -> GpuResult<Checker> {
        let gpu = comm.gpu().clone();
        let n = comm.world_size();
        let elements_max = count * n;
        let bytes = elements_max * 4;
        let stream = Stream::new(&gpu)?;
        let mut base = DeviceBuffer::alloc(&gpu, bytes)?;
        let values: Vec<i32> = (0..elements_max).map(|i| input_value(comm.rank(), i) - 1).collect();
        base.copy_from_host(0, &to_bytes(&values), &stream)?;
        let mut ones_minus = DeviceBuffer::alloc(&gpu, bytes)?;
        ones_minus.copy_from_host(0, &to_bytes(&vec![1i32; elements_max]), &stream)?;
        let mut zeros = DeviceBuffer::alloc(&gpu, bytes)?;
        zeros.memset_async(0, bytes, 0, &stream)?;
        stream.synchronize()?;
        let input = DeviceBuffer::alloc(&gpu, bytes)?;
        let output = DeviceBuffer::alloc(&gpu, bytes)?;
        let consumed = DeviceBuffer::alloc(&gpu, bytes)?;
        comm.register(&output)?;
        comm.register(&input)?;
        Ok(Checker {
            reducer: Reducer::with_types(&gpu, &[accord_cuda::DType::I32])?,
            stall: StallGate::new(&gpu)?,
            base,
            ones_minus,
            zeros,
            input,
            output,
            consumed,
            elements_max,
        })
    }

    /// Runs `kind` on blocks of `count` elements and compares with the reference.
    pub fn run(&mut self, comm: &GpuCommunicator, kind: CheckKind, count: usize, stream: &Stream) -> GpuResult<()> {
        let n = comm.world_size();
        let me = comm.rank();
        let total = count * n;
        if total > self.elements_max {
            return Err(GpuCollError::InvalidArgument { what: "check larger than the checker's buffers".into() });
        }
        let bytes = self.elements_max * 4;
        self.input.memset_async(0, bytes, 0xAB, stream)?;
        self.output.memset_async(0, bytes, 0xAB, stream)?;
        // Slow producer: a stall kernel held by a host thread, then the kernel that writes the input.
        let ticket = self.stall.stall(stream, Duration::from_secs(30))?;
        let i32t = accord_cuda::DType::I32;
        let sum = accord_cuda::ReduceOp::Sum;
        self.reducer.reduce(self.input.ptr(), self.base.ptr(), self.ones_minus.ptr(), total, i32t, sum, stream)?;
        let in_place = kind == CheckKind::AllReduceInPlaceMax;
        let bufs = GpuBufs { send: &self.input, recv: if in_place { &self.input } else { &self.output } };
        std::thread::scope(|scope| -> GpuResult<()> {
            let stall = &self.stall;
            scope.spawn(move || {
                std::thread::sleep(SLOW_PRODUCER);
                stall.release(ticket);
            });
            match kind {
                CheckKind::AllGather => comm.all_gather(bufs, count * 4, stream),
                CheckKind::AllToAll => comm.all_to_all(bufs, count * 4, stream),
                CheckKind::SendRecv => comm.sendrecv(bufs, count * 4, stream),
                CheckKind::Broadcast => comm.broadcast(bufs, count * 4, n - 1, stream),
                CheckKind::AllReduce => comm.all_reduce(bufs, total, DType::I32, ReduceOp::Sum, stream),
                CheckKind::AllReduceInPlaceMax => comm.all_reduce(bufs, total, DType::I32, ReduceOp::Max, stream),
                CheckKind::ReduceScatter => comm.reduce_scatter(bufs, count, DType::I32, ReduceOp::Sum, stream),
            }
        })?;
        // Consumer: a kernel right after the call reads the output.
        let out = if in_place { &self.input } else { &self.output };
        self.reducer.reduce(self.consumed.ptr(), out.ptr(), self.zeros.ptr(), total, i32t, sum, stream)?;
        let mut host = vec![0u8; total * 4];
        self.consumed.copy_to_host(0, &mut host, stream)?;
        comm.wait_idle(Duration::from_secs(60))?;
        let got = from_bytes(&host);
        let want = reference(kind, n, me, count);
        let checked = if kind == CheckKind::ReduceScatter || kind == CheckKind::SendRecv || kind == CheckKind::Broadcast
        {
            count
        } else {
            total
        };
        if let Some(i) = (0..checked).find(|&i| got[i] != want[i]) {
            return Err(GpuCollError::InvalidArgument {
                what: format!(
                    "{kind:?} on rank {me}: element {i} is {} (0x{:x}), expected {}",
                    got[i], got[i], want[i]
                ),
            });
        }
        Ok(())
    }
}

/// The expected output of `kind` on rank `me`.
pub fn reference(kind: CheckKind, n: usize, me: usize, count: usize) -> Vec<i32> {
    let total = count * n;
    let sum_at = |i: usize| (0..n).fold(0i32, |acc, r| acc.wrapping_add(input_value(r, i)));
    match kind {
        CheckKind::AllGather => (0..total).map(|i| input_value(i / count, i % count)).collect(),
        CheckKind::AllToAll => (0..total).map(|i| input_value(i / count, me * count + i % count)).collect(),
        CheckKind::SendRecv => (0..count).map(|i| input_value((me + n - 1) % n, i)).collect(),
        CheckKind::Broadcast => (0..count).map(|i| input_value(n - 1, i)).collect(),
        CheckKind::AllReduce => (0..total).map(sum_at).collect(),
        CheckKind::AllReduceInPlaceMax => {
            (0..total).map(|i| (0..n).map(|r| input_value(r, i)).max().unwrap_or(0)).collect()
        }
        CheckKind::ReduceScatter => (0..count).map(|i| sum_at(me * count + i)).collect(),
    }
}

/// Runs every check in every stream-order mode; returns one line per check.
pub fn run_all(comm: &mut GpuCommunicator, count: usize) -> GpuResult<Vec<String>> {
    let stream = Stream::new(comm.gpu())?;
    let mut checker = Checker::new(comm, count)?;
    let mut lines = Vec::new();
    let original = comm.stream_order();
    for order in [super::StreamOrder::HostFn, super::StreamOrder::Stall, super::StreamOrder::WaitValue] {
        if !comm.order_available(order) {
            continue; // stall, in a private context
        }
        comm.set_stream_order(order)?;
        for kind in CheckKind::ALL {
            checker.run(comm, kind, count, &stream)?;
            lines.push(format!("ok {kind:?} {} count={count} ranks={}", order.name(), comm.world_size()));
        }
    }
    // Repeated calls with the same buffers map nothing new.
    let opened = comm.mappings_opened();
    checker.run(comm, CheckKind::AllGather, count, &stream)?;
    if comm.mappings_opened() != opened {
        return Err(GpuCollError::InvalidArgument {
            what: format!("a repeated call opened mappings ({opened} -> {})", comm.mappings_opened()),
        });
    }
    lines.push(format!("ok mapping cache: {opened} mappings opened, none by the repeated call"));
    comm.set_stream_order(original)?;
    Ok(lines)
}
