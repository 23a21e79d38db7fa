//! READ with GPU memory on either side, two engines in one process (GPU tests; they print
//! `skipped:` without a GPU). In this process the owner's write back is one copy-engine copy;
//! with `force_network` (and `device_ipc` off) the same reads cross the owner's staging and
//! the reader's landing slots over loopback, as between hosts. Every read is checked byte for
//! byte, with its immediate counted once at the reader, and a wrong key is refused. Batched
//! READs (`Engine::read_paged`: scattered pages of several planes in one request) the same way:
//! in this process one batch of copy-engine copies, over the network staged and landed.

use accord_cuda::{DeviceBuffer, Gpu, Stream};
use accord_engine::{Engine, EngineConfig, MemoryKind, MrDescriptor, MrHandle, PagedReadOp, ReadOp, TransferError};
use std::time::Duration;

const BYTES: usize = 6 << 20;
const WAIT: Duration = Duration::from_secs(60);

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(0x9E37_79B9).wrapping_add(seed * 131) >> 7) as u8).collect()
}

fn engine(force_network: bool) -> Engine {
    let config = EngineConfig {
        device_ipc: false,
        device_staging_chunk_bytes: 1 << 20,
        device_staging_chunks: 4,
        ..Default::default()
    };
    Engine::builder().ignore_env().config(config).force_network(force_network).build().unwrap()
}

/// One engine's memory: a device buffer and a host buffer of [`BYTES`], both registered.
struct Side {
    device: DeviceBuffer,
    device_h: MrHandle,
    device_d: MrDescriptor,
    host: accord_engine::MrBuffer,
}

fn side(engine: &Engine, gpu: &Gpu, stream: &Stream, seed: u64) -> Side {
    let mut device = DeviceBuffer::alloc(gpu, BYTES).unwrap();
    device.copy_from_host(0, &pattern(seed, BYTES), stream).unwrap();
    // Safety: `device` lives in the returned `Side`, which outlives every read of the test.
    #[allow(unsafe_code)]
    let (device_h, device_d) = unsafe {
        engine.register_raw(device.ptr().0 as *mut u8, BYTES, MemoryKind::CudaDevice { ordinal: gpu.ordinal() as u32 })
    }
    .unwrap();
    let host = engine.alloc(BYTES).unwrap();
    host.write_at(0, &pattern(seed + 100, BYTES)).unwrap();
    Side { device, device_h, device_d, host }
}

fn device_bytes(side: &Side, stream: &Stream, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    side.device.copy_to_host(offset, &mut out, stream).unwrap();
    out
}

/// GPU 0, a stream on it, and the owner and reader engines (peers of each other over the
/// network when `force_network`).
fn owner_and_reader(force_network: bool) -> (Gpu, Stream, Engine, Engine) {
    let gpu = Gpu::open(0).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let (owner, reader) = (engine(force_network), engine(force_network));
    if force_network {
        owner.add_peer(&reader.address()).unwrap();
        reader.add_peer(&owner.address()).unwrap();
    }
    (gpu, stream, owner, reader)
}

fn every_direction(force_network: bool) {
    let (gpu, stream, owner, reader) = owner_and_reader(force_network);
    let (o, r) = (side(&owner, &gpu, &stream, 1), side(&reader, &gpu, &stream, 2));
    let third = (BYTES / 3) as u64;
    let read = |dst: &MrHandle, dst_offset, src: &MrDescriptor, src_offset, len, imm| {
        let op = ReadOp { dst, dst_offset, src, src_offset, len, imm: Some(imm) };
        let result = reader.read(&op).unwrap().wait_timeout(WAIT);
        if result.is_ok() {
            assert_eq!(reader.imm_counter(imm).wait(1, WAIT), 1, "imm {imm}");
        }
        result
    };
    // Device -> device (an uneven length).
    read(&r.device_h, 0, &o.device_d, 8, third + 5, 1).unwrap();
    assert!(device_bytes(&r, &stream, 0, (third + 5) as usize) == pattern(1, BYTES)[8..8 + (third + 5) as usize]);
    // Device -> host.
    read(&r.host.handle(), 3, &o.device_d, 0, third, 2).unwrap();
    assert!(r.host.to_vec()[3..3 + third as usize] == pattern(1, BYTES)[..third as usize]);
    // Host -> device.
    let host_d = o.host.descriptor();
    read(&r.device_h, 2 * third, &host_d, 17, third, 3).unwrap();
    let got = device_bytes(&r, &stream, 2 * third as usize, third as usize);
    assert!(got == pattern(101, BYTES)[17..17 + third as usize]);
    // A wrong key on a device source: refused, nothing counted.
    let mut bad = o.device_d;
    bad.key ^= 1;
    refused_and_each_counted_once(&reader, read(&r.device_h, 0, &bad, 0, 4096, 4), 4, 1..=3);
}

/// The read with immediate `refused_imm` (from a source with a wrong key) was refused and
/// counted nothing; each immediate of `counted` was counted exactly once.
fn refused_and_each_counted_once<T: std::fmt::Debug>(
    reader: &Engine,
    refused: Result<T, TransferError>,
    refused_imm: u32,
    counted: std::ops::RangeInclusive<u32>,
) {
    assert!(matches!(refused, Err(TransferError::Rejected(_))), "{refused:?}");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(reader.imm_counter(refused_imm).value(), 0);
    for imm in counted {
        assert_eq!(reader.imm_counter(imm).value(), 1, "imm {imm} counted once");
    }
}

#[test]
fn reads_in_process_with_device_memory_on_either_side() {
    accord_cuda::require_gpu!(1);
    every_direction(false);
}

#[test]
fn reads_over_the_network_with_device_memory_on_either_side() {
    accord_cuda::require_gpu!(1);
    every_direction(true);
}

/// Pages of the batched reads: 64 KiB, in 4 planes of a quarter of the buffer each; source page
/// `BATCH_SRC[i]` of every plane lands at page `BATCH_DST[i]` of that plane (three of them
/// consecutive on both sides: one run).
const BATCH_PAGE: u64 = 64 << 10;
const BATCH_PLANES: u64 = 4;
const BATCH_SRC: [u64; 6] = [5, 0, 1, 2, 17, 9];
const BATCH_DST: [u64; 6] = [0, 3, 4, 5, 1, 20];

fn batch<'a>(dst: &'a MrHandle, src: &'a MrDescriptor, imm: u32) -> PagedReadOp<'a> {
    let plane = (BYTES as u64 / BATCH_PLANES / BATCH_PAGE) * BATCH_PAGE;
    PagedReadOp {
        dst,
        dst_offset: 0,
        dst_stride: BATCH_PAGE,
        src,
        src_offset: 0,
        src_stride: BATCH_PAGE,
        page_bytes: BATCH_PAGE,
        src_pages: &BATCH_SRC,
        dst_pages: &BATCH_DST,
        planes: BATCH_PLANES,
        src_plane_stride: plane,
        dst_plane_stride: plane,
        imm: Some(imm),
    }
}

/// Whether every batched page of `source` (all of it, as a pattern) is at its place in `got`.
fn batch_landed(got: &[u8], source: &[u8]) -> bool {
    let (page, plane) = (BATCH_PAGE as usize, (BYTES as u64 / BATCH_PLANES / BATCH_PAGE * BATCH_PAGE) as usize);
    (0..BATCH_PLANES as usize).all(|p| {
        BATCH_SRC.iter().zip(&BATCH_DST).all(|(&s, &d)| {
            let (s, d) = (p * plane + s as usize * page, p * plane + d as usize * page);
            got[d..d + page] == source[s..s + page]
        })
    })
}

fn batched_every_direction(force_network: bool) {
    let (gpu, stream, owner, reader) = owner_and_reader(force_network);
    let (o, r) = (side(&owner, &gpu, &stream, 3), side(&reader, &gpu, &stream, 4));
    let read = |op: PagedReadOp<'_>| {
        let imm = op.imm.unwrap();
        let result = reader.read_paged(&op).unwrap().wait_timeout(WAIT);
        if result.is_ok() {
            assert_eq!(reader.imm_counter(imm).wait(1, WAIT), 1, "imm {imm}");
        }
        result
    };
    // Device -> device.
    read(batch(&r.device_h, &o.device_d, 21)).unwrap();
    assert!(batch_landed(&device_bytes(&r, &stream, 0, BYTES), &pattern(3, BYTES)), "device -> device");
    // Device -> host.
    read(batch(&r.host.handle(), &o.device_d, 22)).unwrap();
    assert!(batch_landed(&r.host.to_vec(), &pattern(3, BYTES)), "device -> host");
    // Host -> device.
    let host_d = o.host.descriptor();
    let r2 = side(&reader, &gpu, &stream, 5);
    read(batch(&r2.device_h, &host_d, 23)).unwrap();
    assert!(batch_landed(&device_bytes(&r2, &stream, 0, BYTES), &pattern(103, BYTES)), "host -> device");
    // A wrong key on a device source: refused, nothing counted.
    let mut bad = o.device_d;
    bad.key ^= 1;
    refused_and_each_counted_once(&reader, read(batch(&r.device_h, &bad, 24)), 24, 21..=23);
}

#[test]
fn batched_reads_in_process_with_device_memory_on_either_side() {
    accord_cuda::require_gpu!(1);
    batched_every_direction(false);
}

#[test]
fn batched_reads_over_the_network_with_device_memory_on_either_side() {
    accord_cuda::require_gpu!(1);
    batched_every_direction(true);
}
