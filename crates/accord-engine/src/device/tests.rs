//! Device-memory tests: the ones without a GPU run everywhere; the GPU ones print `skipped:`
//! where no GPU is usable and run on the device machine.

use std::sync::Arc;
use std::time::Duration;

use accord_cuda::{DeviceBuffer, Gpu, Stream};

use crate::address::{DeviceIpcBytes, DeviceRegionInfo, DEVICE_IPC_HANDLE_BYTES};
use crate::engine::tests::{assert_pages_landed, write_paged_counted_once};
use crate::memory::{Region, RegionTable, REJECT_DEVICE_REGION};
use crate::{Engine, MemoryKind, MrDescriptor, RegisterError, ScatterDst, SubmitError, WriteOp};
use accord_proto::wire::RejectReason;
use accord_proto::RegionKey;

fn engine() -> Engine {
    Engine::builder().ignore_env().build().expect("engine builds")
}

pub(crate) fn device_descriptor() -> MrDescriptor {
    let handle = accord_cuda::IpcHandle::from_parts([7u8; 64], 1 << 20, 42);
    MrDescriptor {
        engine: crate::EngineId(9),
        region: 3,
        key: 5,
        len: 4096,
        device: Some(DeviceRegionInfo { ordinal: 1, alloc_offset: 256, ipc: Some(DeviceIpcBytes(handle.to_bytes())) }),
        shared: None,
    }
}

#[test]
fn device_descriptors_round_trip_and_malformed_handles_are_parse_errors() {
    let d = device_descriptor();
    let text = d.to_string_compact();
    assert_eq!(MrDescriptor::parse(&text).unwrap(), d);
    let host = MrDescriptor { device: None, ..d };
    assert!(!host.to_string_compact().contains("device"), "host descriptors keep the old form");
    assert_eq!(MrDescriptor::parse(r#"{"engine":9,"region":3,"key":5,"len":4096}"#).unwrap(), host);
    let hex = accord_cuda::IpcHandle::from_bytes(&d.device.unwrap().ipc.unwrap().0).unwrap().to_hex();
    let short = text.replace(&hex, &hex[..hex.len() - 2]);
    assert!(MrDescriptor::parse(&short).is_err(), "a truncated handle is refused");
    let bad_version = text.replace(&hex, &format!("ff{}", &hex[2..]));
    assert!(MrDescriptor::parse(&bad_version).is_err(), "an unknown handle version is refused");
    assert_eq!(DEVICE_IPC_HANDLE_BYTES, 77);
}

#[test]
fn the_host_never_places_bytes_into_device_regions() {
    let mut table = RegionTable::default();
    let key = RegionKey(11);
    let id =
        table.insert(Region { base: 0x1000, len: 4096, key, keep: None, device: Some(0), streamed: false }).unwrap();
    assert_eq!(table.check_write(id, key, 0, 16), Err(REJECT_DEVICE_REGION));
    assert_eq!(table.check_write(id, key, 0, 0), Ok(()), "a zero-byte immediate write is allowed");
    assert_eq!(table.check_write(id, RegionKey(12), 0, 0), Err(RejectReason::BadKey));
    assert!(!table.place(id, 0, &[1, 2, 3]), "placement into device memory is refused");
    assert_eq!(table.check_device_write(id, key, 4000, 96), Ok((0x1000 + 4000, 0)));
    assert_eq!(table.check_device_write(id, key, 4000, 97), Err(RejectReason::OutOfBounds));
}

#[test]
fn registering_host_memory_as_device_memory_is_an_error_not_a_crash() {
    let e = engine();
    let mut host = vec![0u8; 4096];
    // Safety: the buffer outlives the engine's use of it; registration must fail anyway.
    #[allow(unsafe_code)]
    let got = unsafe { e.register_raw(host.as_mut_ptr(), host.len(), MemoryKind::CudaDevice { ordinal: 0 }) };
    assert!(matches!(got, Err(RegisterError::Device(_))), "{got:?}");
}

#[test]
fn device_writes_to_unsupported_places_are_refused_clearly() {
    let (a, b) = (engine(), engine());
    let src = a.alloc(4096).unwrap();
    let mut remote = device_descriptor();
    remote.engine = b.id();
    let h = src.handle();
    let op = WriteOp { src: &h, src_offset: 0, dst: &remote, dst_offset: 0, len: 64, imm: None };
    let err = a.write(&op).unwrap_err();
    assert!(
        matches!(err, SubmitError::Invalid(ref m) if m.contains("refused") && m.contains("UnknownRegion")),
        "{err}"
    );
}

/// Device buffers of `len` bytes on GPUs `from` and `to`, registered with two same-process
/// engines, written from the first to the second with an immediate.
fn same_process_write(from: usize, to: usize) {
    let len = (4 << 20) + 4096;
    let (a, b) = (engine(), engine());
    let (ga, gb) = (Gpu::open(from).unwrap(), Gpu::open(to).unwrap());
    let (sa, sb) = (Stream::new(&ga).unwrap(), Stream::new(&gb).unwrap());
    let mut src = DeviceBuffer::alloc(&ga, len).unwrap();
    let mut dst = DeviceBuffer::alloc(&gb, len).unwrap();
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    src.copy_from_host(0, &pattern, &sa).unwrap();
    dst.memset_async(0, len, 0, &sb).unwrap();
    sb.synchronize().unwrap();
    let owner_a: crate::MemoryOwner = Arc::new(());
    // Safety: both buffers live until the end of this function, after every transfer completed.
    #[allow(unsafe_code)]
    let (h, _) = unsafe {
        a.register_raw_owned(
            src.ptr().0 as *mut u8,
            len,
            MemoryKind::CudaDevice { ordinal: from as u32 },
            Some(owner_a),
        )
    }
    .unwrap();
    #[allow(unsafe_code)]
    let (_, d) =
        unsafe { b.register_raw(dst.ptr().0 as *mut u8, len, MemoryKind::CudaDevice { ordinal: to as u32 }) }.unwrap();
    assert_eq!(d.device.map(|i| i.ordinal), Some(to as u32));
    let op = WriteOp { src: &h, src_offset: 4096, dst: &d, dst_offset: 128, len: (4 << 20) - 128, imm: Some(77) };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(b.imm_counter(77).wait(1, Duration::from_secs(20)), 1, "immediate counted once");
    let mut got = vec![0u8; len];
    dst.copy_to_host(0, &mut got, &sb).unwrap();
    assert!(got[..128].iter().all(|&x| x == 0), "nothing before the range");
    assert_eq!(&got[128..4 << 20], &pattern[4096..4096 + (4 << 20) - 128], "bytes landed");
    assert!(got[4 << 20..].iter().all(|&x| x == 0), "nothing after the range");
    let bad = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 1, len: len as u64, imm: None };
    assert!(matches!(a.write(&bad), Err(SubmitError::DestinationOutOfBounds { .. })));
    let host = b.alloc(4096).unwrap();
    let into_host = WriteOp { src: &h, src_offset: 4096, dst: &host.descriptor(), dst_offset: 0, len: 64, imm: None };
    a.write(&into_host).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(&host.to_vec()[..64], &pattern[4096..4096 + 64], "device to a host region in this process");
}

#[test]
fn same_process_device_write_between_two_gpus() {
    accord_cuda::require_gpu!(2);
    same_process_write(0, 1);
}

/// A paged write (a KV-cache move) from GPU 0 to GPU 1 in this process on the copy engine:
/// every page lands where the page map says, the immediate is counted once.
#[test]
fn same_process_paged_device_write_between_two_gpus() {
    accord_cuda::require_gpu!(2);
    const PAGE: usize = 64 << 10;
    let len = PAGE * 64;
    let (a, b) = (engine(), engine());
    let pattern: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
    let (_src, h, _) = device_region(&a, 0, &pattern);
    let (dst, _, d) = device_region(&b, 1, &vec![0u8; len]);
    // Pages 0..16 in one run to 40..56, then every third page reversed into the low pages.
    let src_pages: Vec<u64> = (0..16).chain((16..64).step_by(3)).collect();
    let dst_pages: Vec<u64> = (40..56).chain((0..16).rev()).collect();
    write_paged_counted_once(&a, &b, &h, &d, PAGE, (&src_pages, &dst_pages), 78);
    assert_pages_landed(&read_device(&dst), &pattern, PAGE, (&src_pages, &dst_pages));
}

/// A scatter from device memory in this process: two ranges into a region on the last GPU (the
/// peer GPU where there are two), one into a region on GPU 0 and one into host memory of
/// another engine. Every range lands, nothing else is written, the immediate is counted once
/// per destination at each receiver.
#[test]
fn same_process_scatter_from_device_memory() {
    accord_cuda::require_gpu!(1);
    let last = accord_cuda::probe().device_count.max(1) - 1;
    let len = 4 << 20;
    let (a, b, c) = (engine(), engine(), engine());
    a.add_peer(&b.address()).unwrap();
    a.add_peer(&c.address()).unwrap();
    let pattern = bytes(len, 9);
    let (_src, h, _) = device_region(&a, 0, &pattern);
    let (far, _, far_d) = device_region(&b, last, &vec![0u8; len]);
    let (near, _, near_d) = device_region(&b, 0, &vec![0u8; len]);
    let host = c.alloc(len).unwrap();
    let dsts = [
        ScatterDst { dst: far_d, dst_offset: 5, src_offset: 0, len: (1 << 20) + 3 },
        ScatterDst { dst: far_d, dst_offset: 3 << 20, src_offset: 2 << 20, len: 4096 },
        ScatterDst { dst: near_d, dst_offset: 100, src_offset: 1 << 20, len: 777_777 },
        ScatterDst { dst: host.descriptor(), dst_offset: 64, src_offset: 3 << 20, len: 65_536 },
    ];
    a.scatter(&h, &dsts, Some(79)).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(b.imm_counter(79).wait(3, Duration::from_secs(20)), 3, "three destinations at b");
    assert_eq!(c.imm_counter(79).wait(1, Duration::from_secs(20)), 1, "one destination at c");
    let want = |ranges: &[&ScatterDst]| {
        let mut w = vec![0u8; len];
        for d in ranges {
            let (at, from, n) = (d.dst_offset as usize, d.src_offset as usize, d.len as usize);
            w[at..at + n].copy_from_slice(&pattern[from..from + n]);
        }
        w
    };
    assert!(read_device(&far) == want(&[&dsts[0], &dsts[1]]), "the last GPU's region");
    assert!(read_device(&near) == want(&[&dsts[2]]), "GPU 0's region");
    assert!(host.to_vec() == want(&[&dsts[3]]), "the host region");
}

/// A KV-shaped paged write listed block by block (every plane of a block, then the next block),
/// as `accord.kv` lists them: each block is a run of equal pieces at the plane strides, which
/// the copy-engine route moves as one 2D copy. Within one GPU and, with two, into a peer GPU;
/// the caches have different block counts, so the two sides' pitches differ. Every page lands,
/// nothing else is written, the immediate counts once: in every copy shape (one stream, one
/// call a 2D copy, the default; spread over 4 streams with batched 2D copies; over 3,
/// unbatched), so neither the spread nor the batch loses or repeats a block
/// or counts the immediate before the last stream's copies landed.
#[test]
fn kv_shaped_paged_device_writes_land_exactly_within_a_gpu_and_to_a_peer() {
    accord_cuda::require_gpu!(1);
    /// The widest spread tried (opt-in: the default is one stream).
    const SPREAD: usize = 4;
    // Pages of 256 KiB: the 6 blocks below are 18 MiB, enough for 4 shares of at least
    // SHARE_BYTES_MIN, so the spread shapes really use several streams.
    const PAGE: usize = 256 << 10;
    let (planes, src_blocks, dst_blocks) = (12usize, 24usize, 40usize);
    let targets: Vec<usize> = if accord_cuda::probe().device_count >= 2 { vec![0, 1] } else { vec![0] };
    let shapes = [(1usize, false), (SPREAD, true), (3, false)];
    let rounds = targets.iter().flat_map(|&t| shapes.iter().map(move |&shape| (t, shape)));
    for (round, (target, (streams, batch_2d))) in rounds.enumerate() {
        let config =
            crate::EngineConfig { device_copy_streams: streams, device_copy_batch_2d: batch_2d, ..Default::default() };
        let shaped = || Engine::builder().config(config.clone()).ignore_env().build().expect("engine builds");
        let (a, b) = (shaped(), shaped());
        let (src_len, dst_len) = (PAGE * planes * src_blocks, PAGE * planes * dst_blocks);
        let pattern: Vec<u8> = (0..src_len).map(|i| (i * 29 + 3 + round) as u8).collect();
        let (_src, h, _) = device_region(&a, 0, &pattern);
        let (dst, _, d) = device_region(&b, target, &vec![0u8; dst_len]);
        // Blocks 5, 6, 7 (consecutive on both sides), then scattered ones.
        let blocks: [(usize, usize); 6] = [(5, 10), (6, 11), (7, 12), (20, 0), (1, 39), (13, 22)];
        let shares_fit = blocks.len() * planes * PAGE / super::copy_plan::SHARE_BYTES_MIN as usize;
        assert!(shares_fit >= SPREAD, "the write must be large enough to spread");
        let (mut src_pages, mut dst_pages) = (vec![], vec![]);
        for &(s, t) in &blocks {
            for p in 0..planes {
                src_pages.push((p * src_blocks + s) as u64);
                dst_pages.push((p * dst_blocks + t) as u64);
            }
        }
        write_paged_counted_once(&a, &b, &h, &d, PAGE, (&src_pages, &dst_pages), 79);
        let got = read_device(&dst);
        let mut want = vec![0u8; dst_len];
        for (&s, &t) in src_pages.iter().zip(&dst_pages) {
            let (s, t) = (s as usize * PAGE, t as usize * PAGE);
            want[t..t + PAGE].copy_from_slice(&pattern[s..s + PAGE]);
        }
        assert!(
            got == want,
            "GPU 0 -> GPU {target}, {streams} streams, batch {batch_2d}: every page where the page map says, nothing else"
        );
    }
}

#[test]
fn same_process_device_write_within_one_gpu() {
    accord_cuda::require_gpu!(1);
    same_process_write(0, 0);
}

/// A device buffer on GPU `ordinal` filled with `pattern`, registered with `engine`; the buffer
/// must outlive every transfer using the handle.
fn device_region(engine: &Engine, ordinal: usize, pattern: &[u8]) -> (DeviceBuffer, crate::MrHandle, MrDescriptor) {
    let gpu = Gpu::open(ordinal).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let mut buffer = DeviceBuffer::alloc(&gpu, pattern.len()).unwrap();
    buffer.copy_from_host(0, pattern, &stream).unwrap();
    // Safety: callers keep the buffer alive until every transfer using it completed.
    #[allow(unsafe_code)]
    let (h, d) = unsafe {
        engine.register_raw(
            buffer.ptr().0 as *mut u8,
            pattern.len(),
            MemoryKind::CudaDevice { ordinal: ordinal as u32 },
        )
    }
    .unwrap();
    (buffer, h, d)
}

fn read_device(buffer: &DeviceBuffer) -> Vec<u8> {
    let stream = Stream::new(buffer.gpu()).unwrap();
    let mut host = vec![0u8; buffer.len_bytes()];
    buffer.copy_to_host(0, &mut host, &stream).unwrap();
    host
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8).collect()
}

#[test]
fn same_process_host_to_device_and_device_to_host() {
    accord_cuda::require_gpu!(1);
    let ordinal = accord_cuda::probe().device_count.min(2) - 1;
    let (a, b) = (engine(), engine());
    let len = (3 << 20) + 777;
    let host_src = a.alloc(len).unwrap();
    host_src.write_at(0, &bytes(len, 1)).unwrap();
    let (dev, dev_h, dev_d) = device_region(&b, ordinal, &vec![0u8; len]);
    // Host -> device, into b's device region.
    let hs = host_src.handle();
    let op = WriteOp { src: &hs, src_offset: 5, dst: &dev_d, dst_offset: 64, len: len as u64 - 64, imm: Some(31) };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(b.imm_counter(31).wait(1, Duration::from_secs(10)), 1);
    let got = read_device(&dev);
    assert!(got[..64].iter().all(|&x| x == 0));
    assert_eq!(&got[64..], &bytes(len, 1)[5..len - 59]);
    // Device -> host, from b's device region into a host region of a.
    let host_dst = a.alloc(len).unwrap();
    let hd = host_dst.descriptor();
    let op = WriteOp { src: &dev_h, src_offset: 64, dst: &hd, dst_offset: 1, len: len as u64 - 64, imm: Some(32) };
    b.write(&op).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(a.imm_counter(32).wait(1, Duration::from_secs(10)), 1);
    let back = host_dst.to_vec();
    assert_eq!(back[0], 0);
    assert_eq!(&back[1..len - 63], &got[64..]);
    assert!(back[len - 63..].iter().all(|&x| x == 0));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!((b.imm_counter(31).value(), a.imm_counter(32).value()), (1, 1), "each immediate once");
}

/// Engines that stage device bytes for same-process peers over loopback, with small slots.
fn staging_engine(idle_timeout: Duration) -> Engine {
    let config = crate::EngineConfig {
        device_ipc: false,
        device_staging_chunk_bytes: 256 << 10,
        device_staging_chunks: 4,
        ..Default::default()
    };
    Engine::builder().ignore_env().config(config).force_network(true).idle_timeout(idle_timeout).build().unwrap()
}

#[test]
fn staged_device_to_host_over_the_transport() {
    accord_cuda::require_gpu!(1);
    let (a, b) = (staging_engine(Duration::from_secs(5)), staging_engine(Duration::from_secs(5)));
    a.add_peer(&b.address()).unwrap();
    let len = (8 << 20) + 12345;
    let pattern = bytes(len, 7);
    let (_dev, h, _) = device_region(&a, 0, &pattern);
    let dst = b.alloc(len).unwrap();
    let d = dst.descriptor();
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(41) };
    let second = WriteOp { src: &h, src_offset: 100, dst: &d, dst_offset: 100, len: 1000, imm: Some(41) };
    let (t1, t2) = (a.write(&op).unwrap(), a.write(&second).unwrap());
    t1.wait_timeout(Duration::from_secs(30)).unwrap();
    t2.wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(b.imm_counter(41).wait(2, Duration::from_secs(10)), 2);
    assert_eq!(dst.to_vec(), pattern, "every staged byte landed");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(b.imm_counter(41).value(), 2, "one immediate per write");
    refused_destination_counts_nothing(&a, &b, &h, d, 42);
}

/// A write from `src` into `dst` under a wrong key is refused as a transfer error (`BadKey`), and
/// `to` counts nothing of its immediate `imm`.
fn refused_destination_counts_nothing(from: &Engine, to: &Engine, src: &crate::MrHandle, dst: MrDescriptor, imm: u32) {
    let bad = MrDescriptor { key: dst.key ^ 1, ..dst };
    let op = WriteOp { src, src_offset: 0, dst: &bad, dst_offset: 0, len: 1 << 20, imm: Some(imm) };
    let got = from.write(&op).unwrap().wait_timeout(Duration::from_secs(30));
    assert_eq!(got, Err(crate::TransferError::Rejected(RejectReason::BadKey)));
    assert_eq!(to.imm_counter(imm).value(), 0);
}

#[test]
fn landed_writes_into_device_regions_over_the_transport() {
    accord_cuda::require_gpu!(1);
    let to = accord_cuda::probe().device_count.min(2) - 1;
    let (a, b) = (staging_engine(Duration::from_secs(5)), staging_engine(Duration::from_secs(5)));
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap(); // the receiver answers the rendezvous of known peers only
    let len = (4 << 20) + 4321;
    let pattern = bytes(len, 9);
    let (_src_dev, h, _) = device_region(&a, 0, &pattern);
    let host_src = a.alloc(len).unwrap();
    host_src.write_at(0, &bytes(len, 4)).unwrap();
    let (dst_dev, _, dev_d) = device_region(&b, to, &vec![0u8; 2 * len + 64]);
    // Device -> device (staged here, landed there) and host -> device (landed there) at once.
    let from_dev = WriteOp { src: &h, src_offset: 0, dst: &dev_d, dst_offset: 0, len: len as u64, imm: Some(51) };
    let hs = host_src.handle();
    let from_host = WriteOp {
        src: &hs,
        src_offset: 3,
        dst: &dev_d,
        dst_offset: len as u64 + 32,
        len: len as u64 - 3,
        imm: Some(51),
    };
    let (t1, t2) = (a.write(&from_dev).unwrap(), a.write(&from_host).unwrap());
    t1.wait_timeout(Duration::from_secs(30)).unwrap();
    t2.wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(b.imm_counter(51).wait(2, Duration::from_secs(10)), 2);
    let got = read_device(&dst_dev);
    assert_eq!(&got[..len], &pattern[..], "device source landed");
    assert!(got[len..len + 32].iter().all(|&x| x == 0));
    assert_eq!(&got[len + 32..2 * len + 29], &bytes(len, 4)[3..], "host source landed");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(b.imm_counter(51).value(), 2, "one immediate per write");
    assert!(b.landing_stats().chunks_landed >= (2 * len as u64).div_ceil(256 << 10));
    refused_destination_counts_nothing(&a, &b, &h, dev_d, 52);
}

#[test]
fn staged_write_to_a_peer_that_exits_fails_without_a_crash() {
    accord_cuda::require_gpu!(1);
    let a = staging_engine(Duration::from_millis(500));
    let b = staging_engine(Duration::from_secs(5));
    a.add_peer(&b.address()).unwrap();
    let len = 256 << 20;
    let (_dev, h, _) = device_region(&a, 0, &bytes(len, 3));
    let dst = b.alloc(len).unwrap();
    let d = dst.descriptor();
    let warm = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 4096, imm: None };
    a.write(&warm).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(5) };
    let t = a.write(&op).unwrap();
    // The destination goes first, then its engine: an engine that is dropped lingers while its
    // peer still sends (up to 2 s), long enough for the whole write to land, so without the
    // region the remaining chunks are refused and the engine's exit cannot hide the failure.
    drop(dst);
    drop(b);
    let got = t.wait_timeout(Duration::from_secs(60));
    assert!(got.is_err() && got != Err(crate::TransferError::Timeout), "{got:?}");
    // The engine and its pool recover: another peer is served.
    let c = staging_engine(Duration::from_secs(5));
    a.add_peer(&c.address()).unwrap();
    let dst = c.alloc(1 << 20).unwrap();
    let d = dst.descriptor();
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: Some(6) };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(dst.to_vec(), bytes(len, 3)[..1 << 20]);
}
