//! Device writes between two processes on one host (GPU tests; they print `skipped:` without a
//! GPU). The child is a process running `device_mp_child` (`accord_testkit`), which
//! registers a device region and a host region, says its address and descriptors, and checks
//! bytes and immediate counts when the parent asks.
//!
//! Routes covered: device -> device and host -> device through CUDA IPC, device -> host
//! region staged through pinned memory over the transport, the same with `device_ipc` off
//! (device destinations then land through the child's pinned landing slots), refused
//! destinations, a child killed in the middle of a staged or landed write, READ of the
//! child's device and host regions into this process's host and device memory, and paged writes
//! with strides and scatters from device memory, through CUDA IPC and over UDP.

use accord_cuda::{DeviceBuffer, Gpu, Stream};
use accord_engine::{
    Engine, EngineAddress, EngineConfig, MemoryKind, MrDescriptor, PagedReadOp, ReadOp, ScatterDst,
    StridedPagedWriteOp, TransferError, WriteOp,
};
use accord_testkit::{hear, say, Group, Spawn};
use serde::{Deserialize, Serialize};
use std::time::Duration;

const DEVICE_BYTES: usize = 16 << 20;
const WAIT: Duration = Duration::from_secs(60);
/// The child's whole life: every step waits at most `WAIT`, a few of them in a row.
const CHILD_BOUND: Duration = Duration::from_secs(600);

#[derive(Serialize, Deserialize)]
struct ChildHello {
    address: EngineAddress,
    device: MrDescriptor,
    host: MrDescriptor,
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(0x9E37_79B9).wrapping_add(seed * 77) >> 5) as u8).collect()
}

/// Progress on stderr (libtest shows it with --nocapture), so a stuck step names itself.
fn step(what: &str) {
    let role = if accord_testkit::child().is_some() { "child" } else { "parent" };
    eprintln!("[{role} {}] {what}", std::process::id());
}

#[test]
fn device_mp_child() {
    let Some(ctx) = accord_testkit::child() else { return };
    if let Err(e) = child(&ctx) {
        say(&format!("bad: {e}"));
    }
}

/// `check <device|host> <imm> <count> <dst_offset> <len> <seed> <src_offset>`: waits for the
/// count, then compares the region's bytes with the pattern; `exit` ends.
fn child(ctx: &accord_testkit::Context) -> Result<(), String> {
    let ordinal: usize = ctx.parse("ordinal")?;
    let host_bytes: usize = ctx.parse("host_bytes")?;
    step("building the engine");
    let engine = Engine::builder().ignore_env().build().map_err(|e| e.to_string())?;
    step("opening the GPU");
    let gpu = Gpu::open(ordinal).map_err(|e| e.to_string())?;
    let stream = Stream::new(&gpu).map_err(|e| e.to_string())?;
    let mut device = DeviceBuffer::alloc(&gpu, DEVICE_BYTES).map_err(|e| e.to_string())?;
    device.memset_async(0, DEVICE_BYTES, 0, &stream).map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    // Safety: the buffer lives until this function returns, after the last check.
    #[allow(unsafe_code)]
    let (_, device_d) = unsafe {
        engine.register_raw(device.ptr().0 as *mut u8, DEVICE_BYTES, MemoryKind::CudaDevice { ordinal: ordinal as u32 })
    }
    .map_err(|e| e.to_string())?;
    step("registered the device region");
    let host = engine.alloc(host_bytes).map_err(|e| e.to_string())?;
    let hello = ChildHello { address: engine.address(), device: device_d, host: host.descriptor() };
    say(&serde_json::to_string(&hello).map_err(|e| e.to_string())?);
    let peer = hear().ok_or("no parent address")?;
    engine.add_peer(&EngineAddress::parse(&peer).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    while let Some(line) = hear() {
        step(&format!("command {line:?}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"exit") {
            return Ok(());
        }
        if let Some(address) = line.strip_prefix("peer ") {
            // Another writer: the landing rendezvous answers only peers it knows.
            let address = EngineAddress::parse(address).map_err(|e| e.to_string())?;
            engine.add_peer(&address).map_err(|e| e.to_string())?;
            say("ok");
            continue;
        }
        let nums: Vec<u64> = words.iter().skip(2).filter_map(|w| w.parse().ok()).collect();
        if words.first() == Some(&"pages") {
            say(&check_pages(&engine, words.get(1) == Some(&"device"), (&device, &stream), &host, &nums)?);
            continue;
        }
        let [imm, count, dst_offset, len, seed, src_offset] = nums[..] else {
            return Err(format!("bad command {line:?}"));
        };
        let got_count = engine.imm_counter(imm as u32).wait(count, WAIT);
        let mut region = vec![0u8; len as usize];
        if words.get(1) == Some(&"device") {
            let mut all = vec![0u8; DEVICE_BYTES];
            device.copy_to_host(0, &mut all, &stream).map_err(|e| e.to_string())?;
            region.copy_from_slice(&all[dst_offset as usize..(dst_offset + len) as usize]);
        } else {
            host.read_at(dst_offset as usize, &mut region).map_err(|e| e.to_string())?;
        }
        let want = &bytes(seed, (src_offset + len) as usize)[src_offset as usize..];
        std::thread::sleep(Duration::from_millis(20));
        let final_count = engine.imm_counter(imm as u32).value();
        if got_count == count && final_count == count && region == want {
            say("ok");
        } else {
            say(&format!("bad: count {got_count} then {final_count} of {count}, bytes match {}", region == want));
        }
    }
    Ok(())
}

/// The child's check of a strided paged write (`pages imm dst_offset page n seed src_offset
/// src_stride`): page `i` of `n` at `dst_offset + i * page` of the device or host region equals
/// the pattern of `seed` at `src_offset + i * src_stride`, after one write with `imm`.
fn check_pages(
    engine: &Engine,
    device_region: bool,
    (device, stream): (&DeviceBuffer, &Stream),
    host: &accord_engine::MrBuffer,
    nums: &[u64],
) -> Result<String, String> {
    let [imm, dst_offset, page, n, seed, src_offset, src_stride] = nums[..] else {
        return Err(format!("bad pages command {nums:?}"));
    };
    let got_count = engine.imm_counter(imm as u32).wait(1, WAIT);
    let mut all = vec![0u8; (dst_offset + n * page) as usize];
    if device_region {
        device.copy_to_host(0, &mut all, stream).map_err(|e| e.to_string())?;
    } else {
        host.read_at(0, &mut all).map_err(|e| e.to_string())?;
    }
    let source = bytes(seed, (src_offset + n * src_stride) as usize);
    let wrong = (0..n)
        .filter(|i| {
            let (d, s) = ((dst_offset + i * page) as usize, (src_offset + i * src_stride) as usize);
            all[d..d + page as usize] != source[s..s + page as usize]
        })
        .count();
    Ok(if got_count == 1 && wrong == 0 {
        "ok".into()
    } else {
        format!("bad: count {got_count}, {wrong} of {n} pages wrong")
    })
}

/// What the child should find: `len` bytes at `dst_offset` of its `which` region equal to the
/// pattern of `seed` from `src_offset`, after `count` writes with `imm`.
struct Expect {
    which: &'static str,
    imm: u32,
    count: u64,
    dst_offset: u64,
    len: u64,
    seed: u64,
    src_offset: u64,
}

/// Why the owner refuses a write to a [`forged`] descriptor.
const REFUSED: TransferError = TransferError::Rejected(accord_proto::wire::RejectReason::BadKey);

/// `desc` with a key its owner never gave out: every write to it must be refused.
fn forged(desc: MrDescriptor) -> MrDescriptor {
    MrDescriptor { key: desc.key ^ 1, ..desc }
}

/// The child process; dropping it kills it (its group's drop).
struct ChildProc {
    group: Group,
    hello: ChildHello,
}

impl ChildProc {
    fn spawn(host_bytes: usize) -> ChildProc {
        let ordinal = (accord_cuda::probe().device_count.max(1) - 1).min(1);
        let mut group = Spawn::new("device_mp_child", 1)
            .value("ordinal", ordinal)
            .value("host_bytes", host_bytes)
            .bound(CHILD_BOUND)
            .start()
            .unwrap();
        step("child spawned, waiting for its hello");
        let line = group.said().unwrap().1;
        step("child said hello");
        let hello = serde_json::from_str(&line).unwrap_or_else(|e| panic!("child hello {line:?}: {e}"));
        ChildProc { group, hello }
    }

    fn next_line(&mut self) -> String {
        self.group.said().unwrap().1
    }

    fn send(&mut self, line: &str) {
        self.group.send(0, line).unwrap();
    }

    fn introduce(&mut self, parent: &Engine) {
        self.send(&parent.address().to_string_compact());
    }

    /// Makes another engine of the parent a peer of the child (after `introduce`).
    fn add_writer(&mut self, writer: &Engine) {
        self.send(&format!("peer {}", writer.address().to_string_compact()));
        assert_eq!(self.next_line(), "ok");
    }

    /// Asks the child to check a region range; panics on a bad verdict.
    fn check(&mut self, e: Expect) {
        let Expect { which, imm, count, dst_offset, len, seed, src_offset } = e;
        step(&format!("asking the child to check imm {imm}"));
        self.send(&format!("check {which} {imm} {count} {dst_offset} {len} {seed} {src_offset}"));
        let verdict = self.next_line();
        assert_eq!(verdict, "ok", "{which} imm {imm}: {verdict}");
    }

    /// Asks the child to check a strided paged write's pages (see [`check_pages`]): `pages` of
    /// pattern 1 landed at `dst_offset` of its `which` region, with immediate `imm`.
    fn check_pages(&mut self, which: &str, imm: u32, dst_offset: u64, pages: &Pages) {
        let Pages { page, n, src_offset, src_stride } = *pages;
        step(&format!("asking the child to check the pages of imm {imm}"));
        self.send(&format!("pages {which} {imm} {dst_offset} {page} {n} 1 {src_offset} {src_stride}"));
        let verdict = self.next_line();
        assert_eq!(verdict, "ok", "{which} pages, imm {imm}: {verdict}");
    }

    fn finish(mut self) {
        self.send("exit");
        self.group.finish().unwrap();
    }

    /// Kills the child (kill -9) and reaps it.
    fn kill(&mut self) {
        self.group.kill(0);
    }
}

fn parent(device_ipc: bool, idle_timeout: Duration) -> Engine {
    let config = EngineConfig {
        device_ipc,
        device_staging_chunk_bytes: 1 << 20,
        device_staging_chunks: 4,
        ..Default::default()
    };
    Engine::builder().ignore_env().config(config).idle_timeout(idle_timeout).build().unwrap()
}

/// A strided paged write's source side: `n` pages of `page` bytes, page `i` read at
/// `src_offset + i * src_stride` (and written at `i * page` from the destination offset).
#[derive(Copy, Clone)]
struct Pages {
    page: u64,
    n: u64,
    src_offset: u64,
    src_stride: u64,
}

/// An engine of this process whose writes to the child take the network route: no CUDA IPC and
/// no shared-memory rings, so device bytes are staged or landed through pinned slots over UDP.
fn parent_over_udp() -> Engine {
    let mut config = EngineConfig {
        device_ipc: false,
        device_staging_chunk_bytes: 1 << 20,
        device_staging_chunks: 4,
        ..Default::default()
    };
    config.shm.enabled = false;
    Engine::builder().ignore_env().config(config).idle_timeout(Duration::from_secs(5)).build().unwrap()
}

/// A child with a host region of `host_bytes`, and this process's engine (`device_ipc`,
/// `idle_timeout`), each knowing the other.
fn child_and_parent(host_bytes: usize, device_ipc: bool, idle_timeout: Duration) -> (ChildProc, Engine) {
    let mut c = ChildProc::spawn(host_bytes);
    let a = parent(device_ipc, idle_timeout);
    a.add_peer(&c.hello.address).unwrap();
    c.introduce(&a);
    (c, a)
}

/// GPU 0, a stream on it, and `DEVICE_BYTES` of its memory holding pattern `seed`.
fn device_source_filled(seed: u64) -> (Gpu, Stream, DeviceBuffer) {
    let gpu = Gpu::open(0).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let mut src = DeviceBuffer::alloc(&gpu, DEVICE_BYTES).unwrap();
    src.copy_from_host(0, &bytes(seed, DEVICE_BYTES), &stream).unwrap();
    (gpu, stream, src)
}

#[test]
fn two_processes_every_device_route() {
    accord_cuda::require_gpu!(1);
    let (mut c, a) = child_and_parent(DEVICE_BYTES, true, Duration::from_secs(5));
    let (_gpu, _stream, src) = device_source_filled(1);
    // Safety: `src` outlives every transfer (all waited for below).
    #[allow(unsafe_code)]
    let (dev_h, _) =
        unsafe { a.register_raw(src.ptr().0 as *mut u8, DEVICE_BYTES, MemoryKind::CudaDevice { ordinal: 0 }) }.unwrap();
    let host_src = a.alloc(DEVICE_BYTES).unwrap();
    host_src.write_at(0, &bytes(2, DEVICE_BYTES)).unwrap();
    let host_h = host_src.handle();
    let (dev_d, host_d) = (c.hello.device, c.hello.host);
    let quarter = (DEVICE_BYTES / 4) as u64;
    let write = |src, src_offset, dst, dst_offset, len, imm| {
        step(&format!("write imm {imm}, {len} bytes"));
        let op = WriteOp { src, src_offset, dst, dst_offset, len, imm: Some(imm) };
        a.write(&op).unwrap().wait_timeout(WAIT)
    };
    // Each write (source, its offset, its pattern; the child's region, destination, its offset;
    // length; immediate), then the child's check of what landed.
    for (src, src_offset, seed, which, dst, dst_offset, len, imm) in [
        // Device -> device through IPC.
        (&dev_h, 8, 1, "device", &dev_d, 0, quarter, 1),
        // Host -> device through IPC.
        (&host_h, 16, 2, "device", &dev_d, quarter, quarter + 13, 2),
        // Device -> host region of the child: staged (several chunks, an uneven tail).
        (&dev_h, 3, 1, "host", &host_d, 100, 3 * quarter + 999, 3),
    ] {
        write(src, src_offset, dst, dst_offset, len, imm).unwrap();
        c.check(Expect { which, imm, count: 1, dst_offset, len, seed, src_offset });
    }
    // A refused destination: a transfer error, nothing counted.
    assert_eq!(write(&dev_h, 0, &forged(host_d), 0, quarter, 9), Err(REFUSED));
    // With device IPC off the child counts as remote: device destinations go through the
    // landing rendezvous (pinned slots of the child, host-to-device there), host destinations
    // are staged.
    let b = parent(false, Duration::from_secs(5));
    b.add_peer(&c.hello.address).unwrap();
    c.add_writer(&b);
    let (b_h, _) = {
        // Safety: as for `a`'s registration.
        #[allow(unsafe_code)]
        let r = unsafe { b.register_raw(src.ptr().0 as *mut u8, DEVICE_BYTES, MemoryKind::CudaDevice { ordinal: 0 }) };
        r.unwrap()
    };
    let b_host = b.alloc(DEVICE_BYTES).unwrap();
    b_host.write_at(0, &bytes(2, DEVICE_BYTES)).unwrap();
    let b_host_h = b_host.handle();
    let b_write = |src, src_offset, dst, dst_offset, len, imm| {
        step(&format!("write (IPC off) imm {imm}, {len} bytes"));
        let op = WriteOp { src, src_offset, dst, dst_offset, len, imm: Some(imm) };
        b.write(&op).unwrap().wait_timeout(WAIT)
    };
    // The same for these writes (as above: source, offset, pattern; region, destination,
    // offset; length; immediate).
    for (src, src_offset, seed, which, dst, dst_offset, len, imm) in [
        // Device -> device of the child, staged here and landed there (several chunks, a tail).
        (&b_h, 5, 1, "device", &dev_d, 11, 2 * quarter + 4097, 10),
        // Host -> device of the child, landed there.
        (&b_host_h, 9, 2, "device", &dev_d, 3 * quarter, quarter - 1, 11),
    ] {
        b_write(src, src_offset, dst, dst_offset, len, imm).unwrap();
        c.check(Expect { which, imm, count: 1, dst_offset, len, seed, src_offset });
    }
    // A refused device destination: a transfer error at the writer, nothing counted.
    assert_eq!(b_write(&b_h, 0, &forged(dev_d), 0, quarter, 12), Err(REFUSED));
    let op = WriteOp { src: &b_h, src_offset: 50, dst: &host_d, dst_offset: 7, len: quarter + 1, imm: Some(4) };
    b.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    c.check(Expect { which: "host", imm: 4, count: 1, dst_offset: 7, len: quarter + 1, seed: 1, src_offset: 50 });
    c.finish();
}

/// Strided paged writes and scatters from device memory into the child's device and host
/// regions, through CUDA IPC and over UDP: every page where its index says (listed out of order,
/// source pages with gaps between them), every scattered range in place; a paged write's
/// immediate counted once after its last byte, a scatter's once per destination. Each route writes its own ranges, so one route's bytes cannot pass
/// for the other's.
#[test]
fn two_processes_paged_strided_and_scatter_from_device_memory() {
    accord_cuda::require_gpu!(1);
    let (mut c, a) = child_and_parent(DEVICE_BYTES, true, Duration::from_secs(5));
    let b = parent_over_udp();
    b.add_peer(&c.hello.address).unwrap();
    c.add_writer(&b);
    let (_gpu, _stream, src) = device_source_filled(1);
    let (dev_d, host_d) = (c.hello.device, c.hello.host);
    let pages = Pages { page: 64 << 10, n: 48, src_offset: 8, src_stride: (64 << 10) + 4096 };
    let Pages { page, n, src_offset, src_stride } = pages;
    // Page indices out of order: i -> 29 i mod 48 visits every page once (29 and 48 are coprime).
    let order: Vec<u64> = (0..n).map(|i| i * 29 % n).collect();
    for (route, engine, shift, imm) in [("ipc", &a, 0u64, 40u32), ("udp", &b, 4u64 << 20, 50)] {
        // Safety: `src` outlives every transfer (each waited for below).
        #[allow(unsafe_code)]
        let (h, _) =
            unsafe { engine.register_raw(src.ptr().0 as *mut u8, DEVICE_BYTES, MemoryKind::CudaDevice { ordinal: 0 }) }
                .unwrap();
        for (which, dst, dst_offset, imm) in
            [("device", &dev_d, 4096 + shift, imm), ("host", &host_d, 100 + shift, imm + 1)]
        {
            step(&format!("{route}: strided paged write into the child's {which} region"));
            let op = StridedPagedWriteOp {
                src: &h,
                src_offset,
                src_stride,
                dst,
                dst_offset,
                dst_stride: page,
                page_bytes: page,
                src_pages: &order,
                dst_pages: &order,
                imm: Some(imm),
            };
            engine.write_paged_strided(&op).unwrap().wait_timeout(WAIT).unwrap();
            c.check_pages(which, imm, dst_offset, &pages);
        }
        let scatter_shift = shift / 2;
        let dsts = [
            ScatterDst { dst: dev_d, dst_offset: (8 << 20) + scatter_shift, src_offset: 3, len: (1 << 20) + 5 },
            ScatterDst { dst: dev_d, dst_offset: (12 << 20) + scatter_shift, src_offset: 2 << 20, len: 4097 },
            ScatterDst { dst: host_d, dst_offset: (9 << 20) + scatter_shift, src_offset: 5 << 20, len: 300_000 },
        ];
        step(&format!("{route}: scatter into three ranges of the child"));
        engine.scatter(&h, &dsts, Some(imm + 2)).unwrap().wait_timeout(WAIT).unwrap();
        for d in &dsts {
            let which = if d.dst == dev_d { "device" } else { "host" };
            let (dst_offset, len, src_offset) = (d.dst_offset, d.len, d.src_offset);
            // Each destination carries the immediate (Engine::scatter): three into this child.
            let count = dsts.len() as u64;
            c.check(Expect { which, imm: imm + 2, count, dst_offset, len, seed: 1, src_offset });
        }
    }
    c.finish();
}

#[test]
fn staged_write_to_a_child_killed_mid_transfer_fails_without_a_crash() {
    accord_cuda::require_gpu!(1);
    let len = 256 << 20;
    write_to_a_child_killed_mid_transfer_fails(len, true, len, |c| c.hello.host);
}

#[test]
fn landed_write_to_a_child_killed_mid_transfer_fails_without_a_crash() {
    accord_cuda::require_gpu!(1);
    write_to_a_child_killed_mid_transfer_fails(4096, false, DEVICE_BYTES, |c| c.hello.device);
}

/// Writes `len` bytes of device memory into the region `dst` of a child with `host_bytes` of
/// host region (staged with IPC on, landed with it off), kills the child mid-transfer, and
/// expects an error that is not a timeout (the peer's death, seen by its pidfd) and no crash.
fn write_to_a_child_killed_mid_transfer_fails(
    host_bytes: usize,
    device_ipc: bool,
    len: usize,
    dst: impl Fn(&ChildProc) -> MrDescriptor,
) {
    let (mut c, a) = child_and_parent(host_bytes, device_ipc, Duration::from_millis(500));
    let gpu = Gpu::open(0).unwrap();
    let src = DeviceBuffer::alloc(&gpu, len).unwrap();
    // Safety: `src` outlives the transfers (waited for below).
    #[allow(unsafe_code)]
    let (h, _) = unsafe { a.register_raw(src.ptr().0 as *mut u8, len, MemoryKind::CudaDevice { ordinal: 0 }) }.unwrap();
    let dst = dst(&c);
    let warm = WriteOp { src: &h, src_offset: 0, dst: &dst, dst_offset: 0, len: 4096, imm: None };
    a.write(&warm).unwrap().wait_timeout(WAIT).unwrap();
    let op = WriteOp { src: &h, src_offset: 0, dst: &dst, dst_offset: 0, len: len as u64, imm: Some(5) };
    let t = a.write(&op).unwrap();
    c.kill();
    let got = t.wait_timeout(WAIT);
    assert!(got.is_err() && got != Err(TransferError::Timeout), "{got:?}");
}

/// READ between two processes, the child the owner: its device region (filled by a write
/// through IPC first) read into this process's host memory (the child stages it) and device
/// memory (through CUDA IPC once this process announced its region to the child, landed in this
/// process's slots before: either way the same bytes), its host region read into device memory;
/// a wrong key is refused. Each read's immediate is counted once, here, after its bytes landed.
#[test]
fn two_processes_read_device_regions() {
    accord_cuda::require_gpu!(1);
    let (mut c, a) = child_and_parent(DEVICE_BYTES, true, Duration::from_secs(5));
    let (gpu, stream, src) = device_source_filled(1);
    let dst = DeviceBuffer::alloc(&gpu, DEVICE_BYTES).unwrap();
    // Safety: `src` and `dst` outlive every transfer (all waited for below).
    #[allow(unsafe_code)]
    let ((src_h, _), (dst_h, _)) = unsafe {
        let kind = MemoryKind::CudaDevice { ordinal: 0 };
        (
            a.register_raw(src.ptr().0 as *mut u8, DEVICE_BYTES, kind).unwrap(),
            a.register_raw(dst.ptr().0 as *mut u8, DEVICE_BYTES, kind).unwrap(),
        )
    };
    let (dev_d, host_d) = (c.hello.device, c.hello.host);
    let host_src = a.alloc(DEVICE_BYTES).unwrap();
    host_src.write_at(0, &bytes(2, DEVICE_BYTES)).unwrap();
    // Fill the child's regions: its device region from our device memory, its host region from ours.
    let len = DEVICE_BYTES as u64;
    a.write(&WriteOp { src: &src_h, src_offset: 0, dst: &dev_d, dst_offset: 0, len, imm: Some(1) })
        .unwrap()
        .wait_timeout(WAIT)
        .unwrap();
    c.check(Expect { which: "device", imm: 1, count: 1, dst_offset: 0, len, seed: 1, src_offset: 0 });
    let host_h = host_src.handle();
    a.write(&WriteOp { src: &host_h, src_offset: 0, dst: &host_d, dst_offset: 0, len, imm: Some(2) })
        .unwrap()
        .wait_timeout(WAIT)
        .unwrap();
    c.check(Expect { which: "host", imm: 2, count: 1, dst_offset: 0, len, seed: 2, src_offset: 0 });
    let quarter = (DEVICE_BYTES / 4) as u64;
    let read = |dst: &accord_engine::MrHandle, dst_offset, src: &MrDescriptor, src_offset, len, imm| {
        step(&format!("read imm {imm}, {len} bytes"));
        let op = ReadOp { dst, dst_offset, src, src_offset, len, imm: Some(imm) };
        let result = a.read(&op).unwrap().wait_timeout(WAIT);
        if result.is_ok() {
            assert_eq!(a.imm_counter(imm).wait(1, WAIT), 1, "imm {imm}");
        }
        result
    };
    let pattern = |seed, from: u64, len: u64| bytes(seed, (from + len) as usize)[from as usize..].to_vec();
    let device_range = |offset: u64, len: u64| {
        let mut out = vec![0u8; len as usize];
        dst.copy_to_host(offset as usize, &mut out, &stream).unwrap();
        out
    };
    // The child's device memory into our host memory: staged by the child (chunks, a tail).
    let landing = a.alloc(DEVICE_BYTES).unwrap();
    read(&landing.handle(), 5, &dev_d, 9, 3 * quarter + 999, 10).unwrap();
    assert!(landing.to_vec()[5..5 + (3 * quarter + 999) as usize] == pattern(1, 9, 3 * quarter + 999)[..]);
    // The child's device memory into our device memory (IPC once announced, else landed).
    read(&dst_h, 0, &dev_d, 3, 2 * quarter + 4097, 11).unwrap();
    assert!(device_range(0, 2 * quarter + 4097) == pattern(1, 3, 2 * quarter + 4097));
    // The child's host memory into our device memory (IPC once announced, else landed).
    read(&dst_h, 3 * quarter, &host_d, 7, quarter - 1, 12).unwrap();
    assert!(device_range(3 * quarter, quarter - 1) == pattern(2, 7, quarter - 1));
    // A wrong key: refused by the child, nothing counted here.
    let mut bad = dev_d;
    bad.key ^= 1;
    assert_eq!(
        read(&landing.handle(), 0, &bad, 0, quarter, 13),
        Err(TransferError::Rejected(accord_proto::wire::RejectReason::BadKey))
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(a.imm_counter(13).value(), 0);
    for imm in 10..=12 {
        assert_eq!(a.imm_counter(imm).value(), 1, "imm {imm} counted once");
    }
    // Batched: scattered 32 KiB pages of 8 planes of the child's device memory in one request,
    // into our device memory (one batch of copies through IPC, the region announced above)
    // and into our host memory (staged by the child).
    let (page, planes) = (32u64 << 10, 8u64);
    let plane = DEVICE_BYTES as u64 / planes;
    let (src_pages, dst_pages) = ([7u64, 0, 1, 2, 11], [3u64, 4, 5, 6, 0]);
    let batched = |dst: &accord_engine::MrHandle, imm| {
        step(&format!("batched read imm {imm}"));
        let op = PagedReadOp {
            dst,
            dst_offset: 0,
            dst_stride: page,
            src: &dev_d,
            src_offset: 0,
            src_stride: page,
            page_bytes: page,
            src_pages: &src_pages,
            dst_pages: &dst_pages,
            planes,
            src_plane_stride: plane,
            dst_plane_stride: plane,
            imm: Some(imm),
        };
        a.read_paged(&op).unwrap().wait_timeout(WAIT).unwrap();
        assert_eq!(a.imm_counter(imm).wait(1, WAIT), 1, "imm {imm}");
    };
    let landed = |got: &dyn Fn(u64, u64) -> Vec<u8>| {
        (0..planes).all(|p| {
            src_pages
                .iter()
                .zip(&dst_pages)
                .all(|(&s, &d)| got(p * plane + d * page, page) == pattern(1, p * plane + s * page, page))
        })
    };
    batched(&dst_h, 14);
    assert!(landed(&device_range), "batched device -> device");
    batched(&landing.handle(), 15);
    let host = landing.to_vec();
    assert!(landed(&|at: u64, len: u64| host[at as usize..(at + len) as usize].to_vec()), "batched device -> host");
    c.finish();
}
