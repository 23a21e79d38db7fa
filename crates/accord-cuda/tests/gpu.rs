//! GPU paths through the public API. Each test prints `skipped: <reason>` and
//! passes where there is no driver or too few GPUs; on a GPU host they run.

use std::time::Duration;

use accord_cuda::reduce::host_reference::{reduce_bytes, sample_input};
use accord_cuda::{
    copy_peer_async, probe, require_gpu, signal_when_done, CudaError, DType, DeviceBuffer, Gpu, IpcHandle, IpcMapping,
    PinnedHostBuffer, ReduceOp, Reducer, StallGate, StallOutcome, Stream,
};

#[test]
fn probe_never_panics_and_agrees_with_open() {
    let availability = probe();
    if !availability.driver {
        assert_eq!(availability.device_count, 0);
        assert!(availability.driver_problem.is_some());
        assert!(availability.skip_reason(1, false).unwrap().starts_with("no CUDA driver"));
        match Gpu::open(0) {
            Err(CudaError::NotAvailable { reason }) => assert!(reason.contains("libcuda"), "{reason}"),
            other => panic!("expected NotAvailable, got {other:?}"),
        }
        assert!(matches!(availability.require_gpus(1), Err(CudaError::NotAvailable { .. })));
        return;
    }
    assert_eq!(availability.devices.len(), availability.device_count);
    match Gpu::open(availability.device_count) {
        Err(CudaError::InvalidArgument { .. }) | Err(CudaError::NotAvailable { .. }) => {}
        other => panic!("an out-of-range ordinal must be refused, got {other:?}"),
    }
}

#[test]
fn device_round_trip_and_bounds() {
    require_gpu!();
    let gpu = Gpu::open(0).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let mut buffer = DeviceBuffer::alloc(&gpu, 4096).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    buffer.copy_from_host(0, &data, &stream).unwrap();
    let mut back = vec![0u8; 4096];
    buffer.copy_to_host(0, &mut back, &stream).unwrap();
    assert_eq!(back, data);
    assert!(matches!(buffer.copy_to_host(1, &mut back, &stream), Err(CudaError::InvalidArgument { .. })));
    assert!(matches!(DeviceBuffer::alloc(&gpu, 0), Err(CudaError::InvalidArgument { .. })));
}

#[test]
fn raw_host_device_copies_round_trip_and_check_the_device_range() {
    require_gpu!();
    let gpu = Gpu::open(0).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let buffer = DeviceBuffer::alloc(&gpu, 1 << 20).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| ((i * 13) >> 3) as u8).collect();
    let mut back = vec![0u8; 1 << 20];
    // Safety: both host vectors outlive the copies (the stream is synchronised below).
    #[allow(unsafe_code)]
    unsafe {
        accord_cuda::copy_host_to_device_async(buffer.ptr(), data.as_ptr(), data.len(), &stream).unwrap();
        accord_cuda::copy_device_to_host_async(back.as_mut_ptr().add(8), buffer.ptr(), data.len() - 8, &stream)
            .unwrap();
        let past_end =
            accord_cuda::copy_device_to_host_async(back.as_mut_ptr(), buffer.ptr().offset(8), 1 << 20, &stream);
        assert!(matches!(past_end, Err(CudaError::BadDeviceRange { .. })), "{past_end:?}");
    }
    stream.synchronize().unwrap();
    assert_eq!(&back[8..], &data[..data.len() - 8]);
}

#[test]
fn ipc_open_in_exporting_process_is_refused() {
    require_gpu!();
    let gpu = Gpu::open(0).unwrap();
    let buffer = DeviceBuffer::alloc(&gpu, 1 << 20).unwrap();
    let handle = IpcHandle::export(&buffer).unwrap();
    assert!(matches!(IpcMapping::open(&gpu, &handle), Err(CudaError::IpcOpen { .. })));
}

#[test]
fn peer_copy_between_two_gpus() {
    require_gpu!(2);
    let gpu0 = Gpu::open(0).unwrap();
    let gpu1 = Gpu::open(1).unwrap();
    gpu0.enable_peer_access(&gpu1).unwrap();
    let stream = Stream::new(&gpu0).unwrap();
    let mut src = DeviceBuffer::alloc(&gpu0, 1 << 20).unwrap();
    let dst = DeviceBuffer::alloc(&gpu1, 1 << 20).unwrap();
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7) as u8).collect();
    src.copy_from_host(0, &data, &stream).unwrap();
    copy_peer_async(dst.ptr(), &gpu1, src.ptr(), &gpu0, 1 << 20, &stream).unwrap();
    stream.synchronize().unwrap();
    let stream1 = Stream::new(&gpu1).unwrap();
    let mut back = vec![0u8; 1 << 20];
    dst.copy_to_host(0, &mut back, &stream1).unwrap();
    assert_eq!(back, data);
}

#[test]
fn reductions_match_the_cpu() {
    require_gpu!(1, nvrtc);
    let gpu = Gpu::open(0).unwrap();
    let reducer = Reducer::new(&gpu).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let count = 10_007;
    for dtype in DType::ALL {
        let len = count * dtype.size_bytes();
        let (a_host, b_host) = (sample_input(dtype, count, 1), sample_input(dtype, count, 2));
        let mut a = DeviceBuffer::alloc(&gpu, len).unwrap();
        let mut b = DeviceBuffer::alloc(&gpu, len).unwrap();
        let dst = DeviceBuffer::alloc(&gpu, len).unwrap();
        a.copy_from_host(0, &a_host, &stream).unwrap();
        b.copy_from_host(0, &b_host, &stream).unwrap();
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg { divisor: 4 }] {
            reducer.reduce(dst.ptr(), a.ptr(), b.ptr(), count, dtype, op, &stream).unwrap();
            let mut got = vec![0u8; len];
            dst.copy_to_host(0, &mut got, &stream).unwrap();
            assert_eq!(got, reduce_bytes(dtype, op, &a_host, &b_host), "{op:?} {dtype:?}");
        }
    }
}

#[test]
fn stall_holds_the_stream_until_released_and_host_fn_signals() {
    require_gpu!(1, nvrtc);
    let gpu = Gpu::open(0).unwrap();
    let gate = StallGate::new(&gpu).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let ticket = gate.stall(&stream, Duration::from_secs(20)).unwrap();
    let done = signal_when_done(&stream).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!done.is_signalled());
    gate.release(ticket);
    done.wait(Duration::from_secs(20)).unwrap();
    assert_eq!(gate.outcome(ticket), StallOutcome::Released);
    let lost = gate.stall(&stream, Duration::from_millis(10)).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(gate.outcome(lost), StallOutcome::TimedOut);
    let pinned = PinnedHostBuffer::alloc(&gpu, 64).unwrap();
    assert!(pinned.atomic_u64(8).is_err(), "word 8 of a 64-byte buffer is out of bounds");
}

/// Copies `data` into the start of `buffer` and back on `stream` (raw host pointers, as the
/// engine's route does), and returns what came back.
fn round_trip(stream: &Stream, buffer: &DeviceBuffer, data: &[u8]) -> Vec<u8> {
    let mut back = vec![0u8; data.len()];
    // Safety: both host slices outlive the copies (the stream is synchronised below).
    #[allow(unsafe_code)]
    unsafe {
        accord_cuda::copy_host_to_device_async(buffer.ptr(), data.as_ptr(), data.len(), stream).unwrap();
        accord_cuda::copy_device_to_host_async(back.as_mut_ptr(), buffer.ptr(), data.len(), stream).unwrap();
    }
    stream.synchronize().unwrap();
    back
}

#[test]
fn a_private_context_copies_primary_memory_and_leaves_the_thread_as_it_was() {
    require_gpu!();
    let primary = Gpu::open(0).unwrap();
    let buffer = DeviceBuffer::alloc(&primary, 1 << 16).unwrap();
    assert!(accord_cuda::has_owner_context(buffer.ptr()).unwrap(), "cuMemAlloc memory belongs to a context");
    let before = accord_cuda::current_device_ordinal();
    let private = Gpu::open_private(0).unwrap();
    assert!(private.is_private() && !primary.is_private());
    assert_eq!(accord_cuda::current_device_ordinal(), before, "creating the context must not leave it current");
    let data: Vec<u8> = (0..1u32 << 16).map(|i| (i * 7) as u8).collect();
    let back = {
        let _restore = accord_cuda::CurrentContextGuard::save();
        round_trip(&Stream::new(&private).unwrap(), &buffer, &data)
    };
    assert_eq!(back, data);
    primary.bind().unwrap();
    let primary_thread = accord_cuda::current_device_ordinal();
    {
        let _restore = accord_cuda::CurrentContextGuard::save();
        private.bind().unwrap();
    }
    assert_eq!(accord_cuda::current_device_ordinal(), primary_thread);
}

#[test]
fn an_unowned_buffer_belongs_to_no_context_and_round_trips_through_a_private_one() {
    require_gpu!();
    let primary = Gpu::open(0).unwrap();
    let buffer = DeviceBuffer::alloc_unowned(&primary, 100_000).unwrap();
    assert!(!accord_cuda::has_owner_context(buffer.ptr()).unwrap(), "cuMemCreate memory has no owning context");
    accord_cuda::check_device_range(buffer.ptr(), 100_000).unwrap();
    let private = Gpu::open_private(0).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 11) as u8).collect();
    let back = round_trip(&Stream::new(&private).unwrap(), &buffer, &data);
    assert_eq!(back, data);
    assert!(matches!(DeviceBuffer::alloc_unowned(&primary, 0), Err(CudaError::InvalidArgument { .. })));
}

/// Rows of `width` bytes `src_pitch` apart land `dst_pitch` apart and nothing between them is
/// touched, on one GPU and (with two) into a peer GPU's memory; rows wider than a pitch are
/// refused before the driver sees them.
#[test]
fn two_d_copies_move_strided_rows_on_one_gpu_and_to_a_peer() {
    require_gpu!();
    let (width, height, src_pitch, dst_pitch) = (4096usize, 24usize, 3 * 4096usize, 5 * 4096usize);
    let gpu0 = Gpu::open(0).unwrap();
    assert!(gpu0.max_pitch().unwrap() >= dst_pitch as u64, "max pitch {:?}", gpu0.max_pitch());
    let stream = Stream::new(&gpu0).unwrap();
    let mut src = DeviceBuffer::alloc(&gpu0, src_pitch * height).unwrap();
    let data: Vec<u8> = (0..(src_pitch * height) as u32).map(|i| ((i * 31) >> 5) as u8).collect();
    src.copy_from_host(0, &data, &stream).unwrap();
    let mut targets = vec![Gpu::open(0).unwrap()];
    if probe().device_count >= 2 {
        let gpu1 = Gpu::open(1).unwrap();
        gpu0.enable_peer_access(&gpu1).unwrap();
        targets.push(gpu1);
    }
    for target in targets {
        let mut dst = DeviceBuffer::alloc(&target, dst_pitch * height).unwrap();
        let own = Stream::new(&target).unwrap();
        dst.memset_async(0, dst_pitch * height, 0xEE, &own).unwrap();
        own.synchronize().unwrap();
        gpu0.bind().unwrap();
        // Safety: every row lies inside `src` and `dst`, both alive past the synchronisation.
        #[allow(unsafe_code)]
        unsafe {
            stream.copy_2d_unchecked(dst.ptr(), dst_pitch, src.ptr(), src_pitch, width, height).unwrap();
            let wide = stream.copy_2d_unchecked(dst.ptr(), dst_pitch, src.ptr(), width - 1, width, 2);
            assert!(matches!(wide, Err(CudaError::InvalidArgument { .. })), "{wide:?}");
        }
        stream.synchronize().unwrap();
        let mut back = vec![0u8; dst_pitch * height];
        dst.copy_to_host(0, &mut back, &own).unwrap();
        for row in 0..height {
            let (d, s) = (row * dst_pitch, row * src_pitch);
            assert_eq!(&back[d..d + width], &data[s..s + width], "row {row} on GPU {}", target.ordinal());
            assert!(back[d + width..d + dst_pitch].iter().all(|&b| b == 0xEE), "gap after row {row}");
        }
    }
}

#[test]
fn vmm_export_refuses_memory_that_is_not_exportable_vmm_memory() {
    require_gpu!();
    let gpu = Gpu::open(0).unwrap();
    let plain = DeviceBuffer::alloc(&gpu, 1 << 20).unwrap();
    let refused = accord_cuda::ipc::vmm::export_vmm_range(&gpu, plain.ptr(), 1 << 20);
    assert!(matches!(refused, Err(CudaError::InvalidArgument { .. })), "cuMemAlloc memory: {refused:?}");
    let unowned = DeviceBuffer::alloc_unowned(&gpu, 1 << 20).unwrap();
    let refused = accord_cuda::ipc::vmm::export_vmm_range(&gpu, unowned.ptr(), 1 << 20);
    assert!(matches!(refused, Err(CudaError::InvalidArgument { .. })), "VMM without fd handles: {refused:?}");
}

#[test]
fn vmm_memory_travels_as_file_descriptors_and_maps_for_the_peer_gpu() {
    use accord_cuda::ipc::vmm::{export_vmm_range, take_fd_of, VmmMapping};
    use std::os::fd::{AsFd, AsRawFd};
    require_gpu!();
    let gpu0 = Gpu::open(0).unwrap();
    let reader = if accord_cuda::probe().device_count >= 2 { Gpu::open(1).unwrap() } else { gpu0.clone() };
    let stream0 = Stream::new(&gpu0).unwrap();
    let mut shared = DeviceBuffer::alloc_shareable(&gpu0, 4 << 20).unwrap();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    shared.copy_from_host(0, &data, &stream0).unwrap();
    stream0.synchronize().unwrap();

    // The middle 2 MiB, exported; the descriptors taken back as another process would take them.
    let export = export_vmm_range(&gpu0, shared.ptr().offset(1 << 20), 2 << 20).unwrap();
    assert_eq!(export.pieces.len(), 1);
    assert_eq!(export.ptr_offset, 1 << 20);
    let taken: Vec<_> =
        export.pieces.iter().map(|p| take_fd_of(std::process::id(), p.fd.as_raw_fd()).unwrap()).collect();
    let pieces: Vec<_> = export.pieces.iter().zip(&taken).map(|(p, fd)| (p.offset, p.len_bytes, fd.as_fd())).collect();
    let mapping = VmmMapping::map(&reader, &pieces).unwrap();
    assert!(mapping.len_bytes() >= 4 << 20);

    let stream_r = Stream::new(&reader).unwrap();
    let dst = DeviceBuffer::alloc(&reader, 2 << 20).unwrap();
    copy_peer_async(dst.ptr(), &reader, mapping.base().offset(export.ptr_offset as usize), &reader, 2 << 20, &stream_r)
        .unwrap();
    stream_r.synchronize().unwrap();
    let mut back = vec![0u8; 2 << 20];
    dst.copy_to_host(0, &mut back, &stream_r).unwrap();
    assert_eq!(back, data[1 << 20..3 << 20]);

    // A piece list that does not match the memory is an error, not a mapping.
    let wrong: Vec<_> = pieces.iter().map(|&(o, l, fd)| (o, l + (2 << 20), fd)).collect();
    assert!(VmmMapping::map(&reader, &wrong).is_err());
    drop(mapping);
}

/// Many 2D copies in one call (`copy_2d_many_unchecked`, batched where the driver has
/// `cuMemcpy3DBatchAsync`, else one call each) move exactly what one `copy_2d_unchecked` each
/// would: blocks of strided rows, scattered on both sides, to this GPU and to a peer; the calls
/// taken are fewer than the copies where the driver batches; a row wider than a pitch is refused
/// before anything is queued.
#[test]
fn batched_2d_copies_move_scattered_blocks_of_rows_like_single_ones() {
    require_gpu!();
    // A KV-like cache: `planes` planes of `blocks` blocks of `page` bytes each.
    let (page, planes, blocks) = (2048usize, 12usize, 40usize);
    let plane = page * blocks;
    let size = plane * planes;
    let gpu0 = Gpu::open(0).unwrap();
    let stream = Stream::new(&gpu0).unwrap();
    let mut src = DeviceBuffer::alloc(&gpu0, size).unwrap();
    let data: Vec<u8> = (0..size as u32).map(|i| ((i * 29) >> 3) as u8).collect();
    src.copy_from_host(0, &data, &stream).unwrap();
    let ids: Vec<(usize, usize)> = (0..17).map(|i| ((i * 7) % blocks, (i * 11 + 5) % blocks)).collect();
    let mut targets = vec![Gpu::open(0).unwrap()];
    if probe().device_count >= 2 {
        let gpu1 = Gpu::open(1).unwrap();
        gpu0.enable_peer_access(&gpu1).unwrap();
        targets.push(gpu1);
    }
    let batched = accord_cuda::copy_2d_batch_support();
    println!("2D batches: {batched:?}");
    for target in targets {
        let mut dst = DeviceBuffer::alloc(&target, size).unwrap();
        let own = Stream::new(&target).unwrap();
        dst.memset_async(0, size, 0xEE, &own).unwrap();
        own.synchronize().unwrap();
        gpu0.bind().unwrap();
        let copies: Vec<accord_cuda::Copy2d> = ids
            .iter()
            .map(|&(s, d)| accord_cuda::Copy2d {
                dst: accord_cuda::DevicePtr(dst.ptr().0 + (d * page) as u64),
                dst_pitch: plane,
                src: accord_cuda::DevicePtr(src.ptr().0 + (s * page) as u64),
                src_pitch: plane,
                width: page,
                height: planes,
            })
            .collect();
        // Safety: every row lies inside `src` and `dst`, both alive past the synchronisation.
        #[allow(unsafe_code)]
        unsafe {
            let calls = stream.copy_2d_many_unchecked(&copies).unwrap();
            if batched.is_ok() {
                assert!(calls < copies.len(), "{calls} calls for {} copies with a batching driver", copies.len());
            }
            let mut wide = copies[..2].to_vec();
            wide[1].width = plane + 1;
            let refused = stream.copy_2d_many_unchecked(&wide);
            assert!(matches!(refused, Err((0, CudaError::InvalidArgument { .. }))), "{refused:?}");
        }
        stream.synchronize().unwrap();
        let mut back = vec![0u8; size];
        dst.copy_to_host(0, &mut back, &own).unwrap();
        let mut want = vec![0xEEu8; size];
        for &(s, d) in &ids {
            for p in 0..planes {
                let (from, to) = (p * plane + s * page, p * plane + d * page);
                want[to..to + page].copy_from_slice(&data[from..from + page]);
            }
        }
        assert!(back == want, "GPU {}: the batch moved exactly the blocks' rows", target.ordinal());
    }
}
