//! READ with device memory on either side, without a GPU: a "device" region is host memory
//! registered as device memory, its staging copier and its landing copier memcpys (the fakes of
//! the staging and landing tests), and the two engines talk over loopback (`force_network`,
//! `device_ipc` off), so the owner's write back takes the staged and the landing routes.

use std::time::Duration;

use accord_proto::wire::RejectReason;

use super::*;
use crate::device::staging::tests::{fake_device, pattern, rig, staging_engine, wait_free};
use crate::engine::route::landing::tests::{config as landing_config, device_dst, engine, pair, receiver};
use crate::TransferError;

const WAIT: Duration = Duration::from_secs(20);
const SLOT_BYTES: usize = 64 << 10;

/// The descriptor the owner of a fake device region hands out (its key is the fake's).
fn fake_device_descriptor(owner: &Engine, handle: &MrHandle) -> MrDescriptor {
    MrDescriptor {
        engine: owner.id(),
        region: handle.region.0,
        key: 0x5eed,
        len: handle.len,
        device: Some(DeviceRegionInfo { ordinal: 0, alloc_offset: 0, ipc: None }),
        shared: None,
    }
}

#[test]
fn a_request_into_device_memory_says_so_and_unknown_flags_are_refused() {
    let request = Request {
        src_region: 3,
        src_key: 7,
        src_offset: 11,
        dst_region: 4,
        dst_key: 9,
        dst_offset: 13,
        len: 1 << 30,
        dst_device: true,
    };
    let message = ReadMessage { from: EngineId(5), req: 6, body: Body::Request(request) };
    let bytes = message.encode().unwrap();
    assert_eq!(ReadMessage::decode(0, &bytes).unwrap(), message);
    let mut frame = ControlFrame::decode(0, &bytes).unwrap();
    frame.flags = DST_DEVICE | 2;
    assert_eq!(ReadMessage::decode(0, &frame.encode()), Err(FrameError::Reserved));
    let reply = ReadMessage { from: EngineId(5), req: 6, body: Body::Reply(Outcome::Done) };
    let mut frame = ControlFrame::decode(0, &reply.encode().unwrap()).unwrap();
    frame.flags = DST_DEVICE;
    assert_eq!(ReadMessage::decode(0, &frame.encode()), Err(FrameError::Reserved), "a reply has no flags");
}

/// A device source, a host destination in another "process": the owner stages its bytes
/// (several chunks and a tail), the reader counts its immediate once, after every byte.
#[test]
fn a_read_from_device_memory_is_staged_by_the_owner_byte_exact() {
    let owner = rig(21, SLOT_BYTES, 3, None, WAIT);
    let reader = staging_engine(WAIT);
    pair(&owner.a, &reader);
    let src = pattern(5 * SLOT_BYTES + 777, 21);
    let h = fake_device(&owner.a, &src);
    let d = fake_device_descriptor(&owner.a, &h);
    let dst = reader.alloc(src.len() + 100).unwrap();
    let len = src.len() as u64 - 5;
    let op = ReadOp { dst: &dst.handle(), dst_offset: 100, src: &d, src_offset: 5, len, imm: Some(3) };
    reader.read(&op).unwrap().wait_timeout(WAIT).unwrap();
    let got = dst.to_vec();
    assert!(got[100..100 + len as usize] == src[5..], "the bytes read");
    assert!(got[..100].iter().chain(&got[100 + len as usize..]).all(|&b| b == 0), "nothing outside");
    assert_eq!(reader.imm_counter(3).wait(1, WAIT), 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(reader.imm_counter(3).value(), 1, "one immediate for the read");
    assert_eq!(owner.a.read_stats().requests_served, 1);
    wait_free(&owner.pool);
}

/// A host source, a device destination: the owner's write lands through the reader's landing
/// slots (the request carries no IPC handle), chunk by chunk, byte-exact.
#[test]
fn a_read_into_device_memory_lands_through_the_readers_slots() {
    let r = receiver(10_000);
    let owner = engine(10_000);
    pair(&owner, &r.b);
    let len = 3 * SLOT_BYTES + 999;
    let src = owner.alloc(len).unwrap();
    let data = pattern(len, 22);
    src.write_at(0, &data).unwrap();
    let (dst_host, dst_d) = device_dst(&r.b, len + 64);
    let dst_h = MrHandle { engine: r.b.id(), region: RegionId(dst_d.region), len: dst_d.len };
    let d = src.descriptor();
    let op = ReadOp { dst: &dst_h, dst_offset: 64, src: &d, src_offset: 0, len: len as u64, imm: Some(4) };
    r.b.read(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert!(dst_host.to_vec()[64..] == data[..], "the bytes read");
    assert_eq!(r.b.imm_counter(4).wait(1, WAIT), 1);
}

/// Device memory on both sides: staged at the owner, landed at the reader.
#[test]
fn a_read_from_device_into_device_memory_is_staged_then_landed() {
    let r = receiver(10_000);
    let owner = rig(23, SLOT_BYTES, 3, None, WAIT);
    pair(&owner.a, &r.b);
    let src = pattern(2 * SLOT_BYTES + 5, 23);
    let h = fake_device(&owner.a, &src);
    let d = fake_device_descriptor(&owner.a, &h);
    let (dst_host, dst_d) = device_dst(&r.b, src.len());
    let dst_h = MrHandle { engine: r.b.id(), region: RegionId(dst_d.region), len: dst_d.len };
    let op = ReadOp { dst: &dst_h, dst_offset: 0, src: &d, src_offset: 0, len: src.len() as u64, imm: None };
    r.b.read(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert!(dst_host.to_vec()[..] == src[..], "the bytes read");
    wait_free(&owner.pool);
}

/// A device source is checked as a host one: a wrong key or a range past its end is refused
/// by the owner, and nothing lands.
#[test]
fn bad_reads_of_device_memory_are_refused_and_place_nothing() {
    let owner = rig(24, SLOT_BYTES, 2, None, WAIT);
    let reader = staging_engine(WAIT);
    pair(&owner.a, &reader);
    let src = pattern(SLOT_BYTES, 24);
    let h = fake_device(&owner.a, &src);
    let good = fake_device_descriptor(&owner.a, &h);
    let dst = reader.alloc(2 * SLOT_BYTES).unwrap();
    let mut bad_key = good;
    bad_key.key ^= 1;
    let op = ReadOp { dst: &dst.handle(), dst_offset: 0, src: &bad_key, src_offset: 0, len: 100, imm: Some(5) };
    assert_eq!(reader.read(&op).unwrap().wait_timeout(WAIT), Err(TransferError::Rejected(RejectReason::BadKey)));
    // Past the end as the owner knows it (the descriptor claims more than the region holds).
    let mut long = good;
    long.len = 2 * SLOT_BYTES as u64;
    let op =
        ReadOp { dst: &dst.handle(), dst_offset: 0, src: &long, src_offset: 10, len: SLOT_BYTES as u64, imm: Some(5) };
    assert_eq!(reader.read(&op).unwrap().wait_timeout(WAIT), Err(TransferError::Rejected(RejectReason::OutOfBounds)));
    assert!(dst.to_vec().iter().all(|&b| b == 0), "nothing landed");
    assert_eq!(reader.imm_counter(5).value(), 0);
}

/// An owner that was told the destination's IPC handle (with this key) writes through it: here
/// the handle is made up, so the write fails and the read with it (on a GPU host the mapping
/// fails too); a request with another key does not use it and lands.
#[test]
fn an_announced_destination_is_written_through_ipc_and_only_with_its_key() {
    use crate::address::{DeviceIpcBytes, DEVICE_IPC_HANDLE_BYTES};
    let r = receiver(10_000);
    // An owner that may write device regions of this host through IPC.
    let config = crate::EngineConfig { device_ipc: true, ..landing_config(10_000) };
    let owner = Engine::builder().ignore_env().config(config).force_network(true).build().unwrap();
    pair(&owner, &r.b);
    let len = SLOT_BYTES;
    let src = owner.alloc(len).unwrap();
    src.write_at(0, &pattern(len, 25)).unwrap();
    let (dst_host, dst_d) = device_dst(&r.b, len);
    let mut handle = [3u8; DEVICE_IPC_HANDLE_BYTES];
    handle[0] = accord_cuda::ipc::IPC_HANDLE_VERSION;
    let made_up = DeviceRegionInfo { ordinal: 0, alloc_offset: 0, ipc: Some(DeviceIpcBytes(handle)) };
    // Announced for another key first: not used.
    let frames = dst_info::encode(dst_d.key ^ 1, dst_d.len, &made_up).unwrap();
    for (index, words) in frames.into_iter().enumerate() {
        let body = Body::DstInfo { region: dst_d.region, index: index as u32, words };
        let bytes = ReadMessage { from: r.b.id(), req: 5, body }.encode().unwrap();
        assert!(serve(&owner.shared, 0, &bytes).is_none());
    }
    let dst_h = MrHandle { engine: r.b.id(), region: RegionId(dst_d.region), len: dst_d.len };
    let d = src.descriptor();
    let op = ReadOp { dst: &dst_h, dst_offset: 0, src: &d, src_offset: 0, len: len as u64, imm: None };
    r.b.read(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert!(dst_host.to_vec()[..] == pattern(len, 25)[..], "landed");
    assert_eq!(owner.read_stats().device_destinations_mapped, 0);
    // Announced with its key, shorter than the region: a read past the announced length is
    // refused by the owner, nothing written.
    let announce = |len: u64, id: u64| {
        let frames = dst_info::encode(dst_d.key, len, &made_up).unwrap();
        for (index, words) in frames.into_iter().enumerate().rev() {
            let body = Body::DstInfo { region: dst_d.region, index: index as u32, words };
            let bytes = ReadMessage { from: r.b.id(), req: id, body }.encode().unwrap();
            assert!(serve(&owner.shared, 0, &bytes).is_none());
        }
    };
    announce(dst_d.len - 1, 6);
    let refused = r.b.read(&op).unwrap().wait_timeout(WAIT);
    assert_eq!(refused, Err(TransferError::Rejected(RejectReason::OutOfBounds)));
    assert_eq!(owner.read_stats().device_destinations_mapped, 0);
    // Announced whole: the owner maps it, and the made-up handle fails the read.
    announce(dst_d.len, 7);
    assert!(r.b.read(&op).unwrap().wait_timeout(WAIT).is_err());
    assert_eq!(owner.read_stats().device_destinations_mapped, 1);
}

#[test]
fn announcement_frames_round_trip_and_bad_ones_are_errors() {
    let body = Body::DstInfo { region: 7, index: 3, words: [1, 2, 3, u64::MAX] };
    let message = ReadMessage { from: EngineId(4), req: 9, body };
    let bytes = message.encode().unwrap();
    assert_eq!(ReadMessage::decode(0, &bytes).unwrap(), message);
    let mut frame = ControlFrame::decode(0, &bytes).unwrap();
    frame.halves[1] = dst_info::DST_INFO_FRAMES;
    assert!(matches!(ReadMessage::decode(0, &frame.encode()), Err(FrameError::Field(_))));
    frame.halves[1] = 0;
    frame.flags = DST_DEVICE;
    assert_eq!(ReadMessage::decode(0, &frame.encode()), Err(FrameError::Reserved));
}

/// Reads of device memory under loss, reordering and duplication at the reader: every byte
/// lands once in place, each read's immediate counts once.
#[test]
fn reads_of_device_memory_under_the_fault_injector_land_byte_exact() {
    let owner = rig(26, SLOT_BYTES, 3, None, WAIT);
    let fault = crate::FaultConfig { drop: 0.02, reorder: 0.05, duplicate: 0.01, ..Default::default() };
    let config = crate::EngineConfig { device_ipc: false, ..Default::default() };
    let reader = Engine::builder().ignore_env().config(config).force_network(true).fault_injection(fault, 26);
    let reader = reader.idle_timeout(WAIT).build().unwrap();
    pair(&owner.a, &reader);
    for seed in 0..3u64 {
        let src = pattern(3 * SLOT_BYTES + 1000 * seed as usize + 1, 30 + seed);
        let h = fake_device(&owner.a, &src);
        let d = fake_device_descriptor(&owner.a, &h);
        let dst = reader.alloc(src.len()).unwrap();
        let op =
            ReadOp { dst: &dst.handle(), dst_offset: 0, src: &d, src_offset: 0, len: src.len() as u64, imm: Some(6) };
        reader.read(&op).unwrap().wait_timeout(WAIT).unwrap();
        assert!(dst.to_vec()[..] == src[..], "bytes differ (seed {seed})");
    }
    assert_eq!(reader.imm_counter(6).wait(3, WAIT), 3);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(reader.imm_counter(6).value(), 3, "each read counted once");
    let faults = reader.stats().faults;
    assert!(faults.iter().map(|f| f.dropped + f.reordered + f.duplicated).sum::<u64>() > 0, "faults were injected");
    wait_free(&owner.pool);
}

/// A batched read of `pages` pages of `page` bytes in `planes` planes of `plane` bytes, whole
/// regions of `len` bytes on each side.
fn batched<'a>(dst: &'a MrHandle, src: &'a MrDescriptor, plane: u64, pages: &'a [[u64; 5]; 2]) -> PagedReadOp<'a> {
    PagedReadOp {
        dst,
        dst_offset: 0,
        dst_stride: 4096,
        src,
        src_offset: 0,
        src_stride: 4096,
        page_bytes: 4096,
        src_pages: &pages[0],
        dst_pages: &pages[1],
        planes: 3,
        src_plane_stride: plane,
        dst_plane_stride: plane,
        imm: Some(8),
    }
}

fn batch_landed(got: &[u8], src: &[u8], plane: usize, pages: &[[u64; 5]; 2]) -> bool {
    (0..3).all(|p| {
        pages[0].iter().zip(&pages[1]).all(|(&s, &d)| {
            let (s, d) = (p * plane + s as usize * 4096, p * plane + d as usize * 4096);
            got[d..d + 4096] == src[s..s + 4096]
        })
    })
}

/// Batched reads with device memory on either side: a device source staged by the owner (each
/// run a staged write), a device destination landed through the reader's slots, and both; the
/// pieces land byte-exact with one immediate per batched read; a wrong key is refused.
#[test]
fn batched_reads_with_device_memory_are_staged_and_landed_byte_exact() {
    let plane = 16 * 4096u64;
    let len = 3 * plane as usize;
    let pages = [[3u64, 0, 1, 2, 15], [9, 10, 11, 12, 0]];
    let r = receiver(10_000);
    let owner = rig(27, SLOT_BYTES, 3, None, WAIT);
    pair(&owner.a, &r.b);
    let src = pattern(len, 27);
    let h = fake_device(&owner.a, &src);
    let d = fake_device_descriptor(&owner.a, &h);
    // Device -> host.
    let host = r.b.alloc(len).unwrap();
    r.b.read_paged(&batched(&host.handle(), &d, plane, &pages)).unwrap().wait_timeout(WAIT).unwrap();
    assert!(batch_landed(&host.to_vec(), &src, plane as usize, &pages), "device -> host");
    // Device -> device.
    let (dst_host, dst_d) = device_dst(&r.b, len);
    let dst_h = MrHandle { engine: r.b.id(), region: RegionId(dst_d.region), len: dst_d.len };
    r.b.read_paged(&batched(&dst_h, &d, plane, &pages)).unwrap().wait_timeout(WAIT).unwrap();
    assert!(batch_landed(&dst_host.to_vec(), &src, plane as usize, &pages), "device -> device");
    // Host -> device.
    let host_src = owner.a.alloc(len).unwrap();
    let other = pattern(len, 28);
    host_src.write_at(0, &other).unwrap();
    let hd = host_src.descriptor();
    r.b.read_paged(&batched(&dst_h, &hd, plane, &pages)).unwrap().wait_timeout(WAIT).unwrap();
    assert!(batch_landed(&dst_host.to_vec(), &other, plane as usize, &pages), "host -> device");
    assert_eq!(r.b.imm_counter(8).wait(3, WAIT), 3);
    // A wrong key on the device source: refused, nothing counted.
    let mut bad = d;
    bad.key ^= 1;
    let host_h = host.handle();
    let op = PagedReadOp { imm: Some(9), ..batched(&host_h, &bad, plane, &pages) };
    assert_eq!(r.b.read_paged(&op).unwrap().wait_timeout(WAIT), Err(TransferError::Rejected(RejectReason::BadKey)));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!((r.b.imm_counter(8).value(), r.b.imm_counter(9).value()), (3, 0), "each counted once");
    wait_free(&owner.pool);
}
