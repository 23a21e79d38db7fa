//! The landing rendezvous without a GPU: two engines over loopback (`force_network`,
//! `device_ipc` off), the receiver's "device" region is host memory and its host-to-device
//! copier a memcpy; writers with host sources and with a fake-staged device source.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use accord_proto::wire::RejectReason;

use super::wire::{Body, Control, CONTROL_MESSAGE_BYTES};
use super::LandingCopier;
use crate::address::{DeviceRegionInfo, MrDescriptor};
use crate::device::staging::tests::{fake_device, pattern, rig, wait_free, HostMemory};
use crate::device::staging::StagingMemory;
use crate::error::TransferError;
use crate::memory::Allocation;
use crate::{Engine, EngineConfig, MrBuffer, WriteOp};

const SLOT_BYTES: u64 = 64 << 10;

/// Copies landing slots into the fake device at once; completes only while `open`.
struct FakeLander {
    open: Arc<AtomicBool>,
    copies: Arc<AtomicUsize>,
}

impl LandingCopier for FakeLander {
    fn start(&mut self, src: usize, dst: u64, _ordinal: u32, len: usize) -> Result<u64, String> {
        // Safety: `src` is a landing slot leased to this copy, `dst..+len` lies in the fake
        // device region (a live `MrBuffer` of the test), checked against its bounds by the ask.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as usize as *mut u8, len)
        };
        Ok(self.copies.fetch_add(1, Ordering::SeqCst) as u64)
    }
    fn poll(&mut self, _ticket: u64) -> Result<bool, String> {
        Ok(self.open.load(Ordering::SeqCst))
    }
}

pub(crate) struct Receiver {
    pub(crate) b: Engine,
    pub(crate) open: Arc<AtomicBool>,
    pub(crate) copies: Arc<AtomicUsize>,
}

pub(crate) fn config(timeout_ms: u64) -> EngineConfig {
    EngineConfig {
        device_ipc: false,
        device_staging_chunk_bytes: SLOT_BYTES,
        device_staging_chunks: 3,
        device_landing_timeout: Duration::from_millis(timeout_ms),
        ..Default::default()
    }
}

pub(crate) fn engine(timeout_ms: u64) -> Engine {
    Engine::builder().ignore_env().config(config(timeout_ms)).force_network(true).build().unwrap()
}

pub(crate) fn receiver(timeout_ms: u64) -> Receiver {
    fake_landing(engine(timeout_ms))
}

/// `b`, landing into host memory through a [`FakeLander`] (no GPU needed).
pub(crate) fn fake_landing(b: Engine) -> Receiver {
    let (open, copies) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
    let (o, c) = (open.clone(), copies.clone());
    assert!(b.shared.landing.set_opener(Box::new(move |_, slot_bytes, slots| {
        let len = slot_bytes * slots;
        let memory: Box<dyn StagingMemory> = Box::new(HostMemory(Allocation::new(len).unwrap(), len));
        let copier: Box<dyn LandingCopier> = Box::new(FakeLander { open: o.clone(), copies: c.clone() });
        Ok((memory, copier))
    })));
    Receiver { b, open, copies }
}

/// A "device" region of `b` over a host buffer of `len` bytes (read back through the buffer).
pub(crate) fn device_dst(b: &Engine, len: usize) -> (MrBuffer, MrDescriptor) {
    let host = b.alloc(len).unwrap();
    // The region keeps the buffer's memory: a landing copy in flight when the test drops the
    // buffer (or the engine) still writes into live memory, as with a real device region.
    let keep: crate::MemoryOwner = host.alloc.clone();
    let h = b.register_fake_device(host.as_ptr() as usize, len as u64, 0, keep);
    let info = DeviceRegionInfo { ordinal: 0, alloc_offset: 0, ipc: None };
    let d = MrDescriptor {
        engine: b.id(),
        region: h.region.0,
        key: 0x5eed,
        len: len as u64,
        device: Some(info),
        shared: None,
    };
    (host, d)
}

pub(crate) fn pair(a: &Engine, b: &Engine) {
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
}

pub(super) fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn host_and_device_sources_land_exactly_with_one_immediate_each() {
    for seed in 0..2u64 {
        let r = receiver(10_000);
        let staged = rig(seed, SLOT_BYTES as usize, 2, None, Duration::from_secs(5));
        // Two writers: one with a host source (its chunks are its configured slot size, as
        // the receiver's), one whose device source a fake stager copies in 64 KiB slots.
        let (a, h) = (&staged.a, engine(10_000));
        pair(a, &r.b);
        pair(&h, &r.b);
        let len = 300_000 + 777 * seed as usize;
        let src = pattern(len, seed);
        let host_src = h.alloc(len).unwrap();
        host_src.write_at(0, &src).unwrap();
        let dev_src = fake_device(a, &src);
        let (dst, d) = device_dst(&r.b, 2 * len + 16);
        let hs = host_src.handle();
        let from_host = WriteOp { src: &hs, src_offset: 1, dst: &d, dst_offset: 3, len: len as u64 - 1, imm: Some(7) };
        let from_dev = WriteOp {
            src: &dev_src,
            src_offset: 0,
            dst: &d,
            dst_offset: len as u64 + 8,
            len: len as u64,
            imm: Some(7),
        };
        let (t1, t2) = (h.write(&from_host).unwrap(), a.write(&from_dev).unwrap());
        t1.wait_timeout(Duration::from_secs(30)).unwrap();
        t2.wait_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(r.b.imm_counter(7).wait(2, Duration::from_secs(10)), 2, "seed {seed}");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(r.b.imm_counter(7).value(), 2, "seed {seed}: each immediate exactly once");
        let got = dst.to_vec();
        assert_eq!(&got[3..3 + len - 1], &src[1..], "seed {seed}: host source landed");
        assert_eq!(&got[len + 8..2 * len + 8], &src[..], "seed {seed}: device source landed");
        assert!(got[..3].iter().chain(&got[len + 2..len + 8]).chain(&got[2 * len + 8..]).all(|&x| x == 0));
        let chunks = (len - 1).div_ceil(SLOT_BYTES as usize) + len.div_ceil(SLOT_BYTES as usize);
        assert_eq!(r.copies.load(Ordering::SeqCst), chunks, "seed {seed}: one landing copy per chunk");
        let stats = r.b.landing_stats();
        assert_eq!((stats.chunks_landed, stats.control_refused, stats.asks_refused), (chunks as u64, 0, 0));
        wait_free(&staged.pool);
    }
}

#[test]
fn a_write_of_more_chunks_than_the_per_peer_limit_lands_whole() {
    let r = receiver(10_000);
    let a = engine(10_000);
    pair(&a, &r.b);
    let chunks = 2 * super::LANDING_ASKS_PER_PEER_MAX + 3;
    let len = chunks * SLOT_BYTES as usize - 100;
    let src = a.alloc(len).unwrap();
    src.write_at(0, &pattern(len, 11)).unwrap();
    let (dst, d) = device_dst(&r.b, len);
    let sh = src.handle();
    let op = WriteOp { src: &sh, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(8) };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(r.b.imm_counter(8).wait(1, Duration::from_secs(10)), 1);
    assert_eq!(dst.to_vec(), *pattern(len, 11));
    assert_eq!(r.copies.load(Ordering::SeqCst), chunks);
}

#[test]
fn refused_keys_and_out_of_bounds_ranges_fail_the_write_and_count_nothing() {
    let r = receiver(10_000);
    let a = engine(10_000);
    pair(&a, &r.b);
    let src = a.alloc(200_000).unwrap();
    src.fill(0xab);
    let (dst, d) = device_dst(&r.b, 200_000);
    let mut bad_key = d;
    bad_key.key ^= 1;
    // The descriptor claims more than the region has: only the receiver can refuse it.
    let mut too_long = d;
    too_long.len = 400_000;
    let cases = [(bad_key, 0, RejectReason::BadKey), (too_long, 150_000, RejectReason::OutOfBounds)];
    for (desc, offset, reason) in cases {
        let sh = src.handle();
        let op = WriteOp { src: &sh, src_offset: 0, dst: &desc, dst_offset: offset, len: 200_000, imm: Some(3) };
        let got = a.write(&op).unwrap().wait_timeout(Duration::from_secs(30));
        assert_eq!(got, Err(TransferError::Rejected(reason)));
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.b.imm_counter(3).value(), 0, "no immediate for a refused write");
    assert!(r.b.landing_stats().asks_refused >= 2);
    assert_eq!(r.copies.load(Ordering::SeqCst), 0, "nothing copied to the device");
    assert!(dst.to_vec().iter().all(|&x| x == 0), "nothing placed");
}

#[test]
fn a_receiver_that_exits_mid_transfer_fails_the_write_without_a_crash() {
    let r = receiver(10_000);
    let a = engine(500);
    pair(&a, &r.b);
    let src = a.alloc(1 << 20).unwrap();
    let (dst, d) = device_dst(&r.b, 1 << 20);
    // Copies never complete: the chunks stay in flight until the receiver is gone.
    r.open.store(false, Ordering::SeqCst);
    let sh = src.handle();
    let op = WriteOp { src: &sh, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: Some(1) };
    let t = a.write(&op).unwrap();
    wait_until("a first landing copy", || r.copies.load(Ordering::SeqCst) > 0);
    drop(dst);
    drop(r);
    let got = t.wait_timeout(Duration::from_secs(30));
    assert!(matches!(got, Err(TransferError::PeerUnreachable | TransferError::Rejected(_))), "{got:?}");
    // Another receiver is still served.
    let c = receiver(10_000);
    pair(&a, &c.b);
    let (dst, d) = device_dst(&c.b, 4096);
    src.write_at(0, &[9u8; 4096]).unwrap();
    let op = WriteOp { src: &sh, src_offset: 0, dst: &d, dst_offset: 0, len: 4096, imm: Some(1) };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(dst.to_vec(), vec![9u8; 4096]);
}

/// Writes raw bytes into `b`'s control region from `a` (what a hostile or confused peer can do).
pub(super) fn poke(a: &Engine, b: &Engine, offset: u64, bytes: &[u8]) {
    let buf = a.alloc(CONTROL_MESSAGE_BYTES).unwrap();
    buf.write_at(0, bytes).unwrap();
    let mut control = b.address().control;
    control.len = CONTROL_MESSAGE_BYTES as u64;
    let h = buf.handle();
    let op = WriteOp { src: &h, src_offset: 0, dst: &control, dst_offset: offset, len: bytes.len() as u64, imm: None };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(10)).unwrap();
}

#[test]
fn hostile_and_stale_control_messages_are_refused_and_counted() {
    let r = receiver(300);
    let a = engine(10_000);
    pair(&a, &r.b);
    let (dst, d) = device_dst(&r.b, 1 << 20);
    let msg = |req, body| Control { from: a.id(), req, body }.encode();
    let stranger = Control { from: crate::EngineId(12345), req: 1, body: Body::Landed }.encode();
    let mut bad_magic = msg(1, Body::Done);
    bad_magic[0] ^= 0xff;
    let mut bad_kind = msg(1, Body::Done);
    bad_kind[5] = 99;
    // Not a whole frame of a known route: the worker counts them and hands them to no route.
    let unrouted: Vec<(u64, Vec<u8>)> =
        vec![(0, vec![1, 2, 3]), (8, msg(1, Body::Landed)[..32].to_vec()), (0, bad_magic.to_vec())];
    for (offset, bytes) in &unrouted {
        poke(&a, &r.b, *offset, bytes);
    }
    let unrouted_count = |e: &Engine| e.stats().lanes.iter().map(|l| l.control_unrouted).sum::<u64>();
    wait_until("every unrouted message counted", || unrouted_count(&r.b) == unrouted.len() as u64);
    // Frames of the landing route that its thread refuses: malformed, foreign or stale.
    let hostile: Vec<(u64, Vec<u8>)> = vec![
        (0, bad_kind.to_vec()),
        (0, stranger.to_vec()),
        (0, msg(77, Body::Landed).to_vec()),
        (0, msg(78, Body::Abandon).to_vec()),
        (0, msg(79, Body::Done).to_vec()),
        (0, msg(80, Body::Grant { region: 1, key: 2, offset: 0, len: 10 }).to_vec()),
    ];
    for (offset, bytes) in &hostile {
        poke(&a, &r.b, *offset, bytes);
    }
    wait_until("every hostile message counted", || r.b.landing_stats().control_refused == hostile.len() as u64);
    // An ask whose writer never writes: granted, then reclaimed after the timeout, and no byte
    // of the device region is touched.
    let ask = Body::Ask { region: d.region, key: d.key, offset: 0, len: 1000 };
    poke(&a, &r.b, 0, &msg(90, ask));
    wait_until("the quiet writer's slot reclaimed", || r.b.landing_stats().slots_reclaimed == 1);
    // The grant reached `a`, which never asked: stale there, counted, ignored.
    wait_until("the unasked grant counted at the writer", || a.landing_stats().control_refused == 1);
    // Landed after the reclaim is stale.
    poke(&a, &r.b, 0, &msg(90, Body::Landed));
    wait_until("the stale landed counted", || r.b.landing_stats().control_refused == hostile.len() as u64 + 1);
    assert_eq!(r.copies.load(Ordering::SeqCst), 0);
    assert!(dst.to_vec().iter().all(|&x| x == 0));
    assert_eq!(unrouted_count(&r.b), unrouted.len() as u64, "landing frames are never unrouted");
    // The receiver still serves an honest write, with every slot back in its pool.
    let src = a.alloc(3 * SLOT_BYTES as usize).unwrap();
    src.fill(5);
    let sh = src.handle();
    let op = WriteOp { src: &sh, src_offset: 0, dst: &d, dst_offset: 10, len: 3 * SLOT_BYTES, imm: Some(2) };
    a.write(&op).unwrap().wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(r.b.imm_counter(2).wait(1, Duration::from_secs(10)), 1);
    assert!(dst.to_vec()[10..10 + 3 * SLOT_BYTES as usize].iter().all(|&x| x == 5));
}

#[test]
fn control_messages_round_trip_and_garbage_is_an_error() {
    let bodies = [
        Body::Ask { region: 3, key: u64::MAX, offset: 17, len: 4096 },
        Body::AskInline { region: u32::MAX, key: 5, offset: u64::MAX, len: 8, bytes: [0xff; 8] },
        Body::AskInline { region: 0, key: 5, offset: 3, len: 1, bytes: [7, 0, 0, 0, 0, 0, 0, 0] },
        Body::Grant { region: u32::MAX, key: 1, offset: 0, len: 1 },
        Body::Refuse { reason: RejectReason::BadKey },
        Body::Refuse { reason: RejectReason::Other(0xDE71) },
        Body::Landed,
        Body::Abandon,
        Body::Done,
    ];
    for body in bodies {
        let m = Control { from: crate::EngineId(42), req: 0x1234_5678_9abc, body };
        assert_eq!(Control::decode(0, &m.encode()), Ok(m));
        assert!(Control::decode(64, &m.encode()).is_err());
        assert!(Control::decode(0, &m.encode()[..63]).is_err());
    }
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
    for _ in 0..10_000 {
        let mut bytes = [0u8; CONTROL_MESSAGE_BYTES];
        rand::RngCore::fill_bytes(&mut rng, &mut bytes);
        if rand::Rng::gen_bool(&mut rng, 0.5) {
            bytes[..5].copy_from_slice(b"ACDL\x01");
        }
        let _ = Control::decode(0, &bytes); // never panics
    }
    let mut region_too_big = Control { from: crate::EngineId(1), req: 1, body: Body::Landed }.encode();
    region_too_big[5] = 1;
    region_too_big[28] = 1;
    assert!(Control::decode(0, &region_too_big).is_err());
}

/// Not a test of correctness: a host source landed in a fake device region (rendezvous per
/// chunk, memcpy standing in for the host-to-device copy) against a plain host write of the
/// same bytes over the same loopback transport, in one run. Prints a table; run with
/// `cargo test --release -p accord-engine --lib landed_route_vs_host_write -- --ignored --nocapture`.
#[test]
#[ignore]
fn landed_route_vs_host_write() {
    let (len, iters) = (64usize << 20, 8);
    println!("{:>12} {:>6} {:>14} {:>14} {:>7}", "slot bytes", "slots", "host GB/s", "landed GB/s", "ratio");
    for (slot, slots) in [(1u64 << 20, 8usize), (4 << 20, 8), (16 << 20, 4)] {
        let config = EngineConfig {
            device_ipc: false,
            device_staging_chunk_bytes: slot,
            device_staging_chunks: slots,
            ..Default::default()
        };
        let build = || Engine::builder().ignore_env().config(config.clone()).force_network(true).build().unwrap();
        let (a, receiver) = (build(), fake_landing(build())); // the receiver's slots follow its own config
        let b = &receiver.b;
        pair(&a, b);
        let src = a.alloc(len).unwrap();
        src.write_at(0, &pattern(len, 1)).unwrap();
        let host_dst = b.alloc(len).unwrap();
        let (dev_dst, dev_d) = device_dst(b, len);
        let (sh, hd) = (src.handle(), host_dst.descriptor());
        let time = |d: &MrDescriptor| {
            let op = WriteOp { src: &sh, src_offset: 0, dst: d, dst_offset: 0, len: len as u64, imm: None };
            a.write(&op).unwrap().wait_timeout(Duration::from_secs(60)).unwrap();
            let t = Instant::now();
            for _ in 0..iters {
                a.write(&op).unwrap().wait_timeout(Duration::from_secs(60)).unwrap();
            }
            (len * iters) as f64 / t.elapsed().as_secs_f64() / 1e9
        };
        let (host_gbps, landed_gbps) = (time(&hd), time(&dev_d));
        println!("{slot:>12} {slots:>6} {host_gbps:>14.2} {landed_gbps:>14.2} {:>7.3}", landed_gbps / host_gbps);
        assert_eq!(dev_dst.to_vec(), *pattern(len, 1));
    }
}

/// Pieces of the two-process paged write: as many, and as large, as one 16-block request of
/// kv_gpu_bench's Llama-like layout (16 blocks x 80 layers x K,V of 32 KiB).
const MP_PIECE: usize = 32 << 10;
const MP_PIECES: usize = 2560;

fn mp_config(shm: bool) -> EngineConfig {
    let shm = accord_net::shm::ShmConfig { enabled: shm, ..Default::default() };
    EngineConfig { device_ipc: false, shm, ..Default::default() }
}

/// (source page, destination page) of the two-process paged write: scattered on both sides.
fn mp_pages() -> (Vec<u64>, Vec<u64>) {
    let n = MP_PIECES as u64;
    ((0..n).map(|i| (i * 7919) % n).collect(), (0..n).map(|i| (i * 104_729 + 11) % n).collect())
}

/// The receiving process of [`a_kv_sized_paged_write_from_device_memory_lands_in_another_process`]:
/// a fake device region and a fake landing copier (host memory), the engine's defaults
/// otherwise (4 MiB slots, 8 of them), shared memory as the parent says.
#[test]
fn landing_mp_child() {
    let Some(ctx) = accord_testkit::child() else { return };
    let result = (|| -> Result<(), String> {
        let shm: bool = ctx.parse("shm")?;
        let b = Engine::builder().ignore_env().config(mp_config(shm)).build().map_err(|e| e.to_string())?;
        let receiver = fake_landing(b);
        let b = &receiver.b;
        let (dst, d) = device_dst(b, MP_PIECES * MP_PIECE);
        accord_testkit::say(&serde_json::to_string(&(b.address(), d)).unwrap());
        let writer: crate::EngineAddress =
            serde_json::from_str(&accord_testkit::hear().ok_or("no writer address")?).map_err(|e| e.to_string())?;
        b.add_peer(&writer).map_err(|e| e.to_string())?;
        accord_testkit::say("ready");
        if accord_testkit::hear().as_deref() != Some("check") {
            return Err("expected check".into());
        }
        let (got, src) = (dst.to_vec(), pattern(MP_PIECES * MP_PIECE, 17));
        let (s, t) = mp_pages();
        for (&s, &t) in s.iter().zip(&t) {
            let (s, t) = (s as usize * MP_PIECE, t as usize * MP_PIECE);
            if got[t..t + MP_PIECE] != src[s..s + MP_PIECE] {
                return Err(format!("piece at {t} differs"));
            }
        }
        accord_testkit::say(&format!("ok {:?}", b.landing_stats()));
        let _ = accord_testkit::hear(); // exit
        Ok(())
    })();
    if let Err(e) = result {
        accord_testkit::say(&format!("bad: {e}"));
    }
}

/// kv_gpu_bench's network case with the GPUs replaced by host-memory fakes: a paged write of
/// 2,560 pieces of 32 KiB (one 16-block KV request) from (fake) device memory into (fake) device
/// memory of another process, staged here and landed there over the transport, with shared
/// memory on and off: completes within its bound, byte-exact.
#[test]
fn a_kv_sized_paged_write_from_device_memory_lands_in_another_process() {
    for shm in [true, false] {
        let mut group = accord_testkit::Spawn::new("engine::route::landing::tests::landing_mp_child", 1)
            .value("shm", shm)
            .bound(Duration::from_secs(120))
            .start()
            .unwrap();
        let hello = group.said().unwrap().1;
        let (address, d): (crate::EngineAddress, MrDescriptor) =
            serde_json::from_str(&hello).unwrap_or_else(|e| panic!("child said {hello:?}: {e}"));
        let a = Engine::builder().ignore_env().config(mp_config(shm)).build().unwrap();
        let staged = crate::device::staging::tests::rig_of(a, 17, 4 << 20, 8, None);
        staged.a.add_peer(&address).unwrap();
        group.send(0, &serde_json::to_string(&staged.a.address()).unwrap()).unwrap();
        assert_eq!(group.said().unwrap().1, "ready");
        let src = pattern(MP_PIECES * MP_PIECE, 17);
        let h = fake_device(&staged.a, &src);
        let (src_pages, dst_pages) = mp_pages();
        let op = crate::PagedWriteOp {
            src: &h,
            dst: &d,
            page_bytes: MP_PIECE as u64,
            src_pages: &src_pages,
            dst_pages: &dst_pages,
            imm: None,
        };
        let started = Instant::now();
        let got = staged.a.write_paged(&op).unwrap().wait_timeout(Duration::from_secs(60));
        eprintln!(
            "shm {shm}: {MP_PIECES} pieces staged and landed in another process: {got:?} in {:?}",
            started.elapsed()
        );
        got.unwrap_or_else(|e| panic!("shm {shm}: {e}"));
        group.send(0, "check").unwrap();
        let verdict = group.said().unwrap().1;
        assert!(verdict.starts_with("ok"), "shm {shm}: {verdict}");
        group.send(0, "exit").unwrap();
        group.finish().unwrap();
        wait_free(&staged.pool);
    }
}
