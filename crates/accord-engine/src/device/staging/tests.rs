//! Staging without a GPU: the plan's bookkeeping over random event orders, the slot pool's
//! bound, and the whole staged route between two engines over loopback with a fake copier that
//! "copies from the device" out of host memory.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::driver::{ChunkCopier, StagedSource, Stager};
use super::{Chunk, SlotPool, StagePlan, StagingMemory};
use crate::error::TransferError;
use crate::memory::Allocation;
use crate::{Engine, MemoryOwner, WriteOp};
use accord_proto::wire::RejectReason;

/// Runs one plan to its end with events in a random order and random failures; checks the
/// invariants on the way and returns the outcome and the bytes delivered per chunk.
fn drive(seed: u64, len: u64, chunk_bytes: u64, slots: usize, fail_percent: u32) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut plan = StagePlan::new(len, chunk_bytes);
    let (mut copying, mut on_wire): (Vec<Chunk>, Vec<Chunk>) = (vec![], vec![]);
    let mut delivered = vec![0u32; plan.chunk_count() as usize];
    let mut issued: u64 = 0;
    let mut failed = false;
    let mut steps = 0;
    let outcome = loop {
        steps += 1;
        assert!(steps < 100_000, "seed {seed}: the plan never ended");
        if let Some(outcome) = plan.outcome() {
            break outcome;
        }
        assert!(plan.in_flight() <= slots, "seed {seed}: more chunks in flight than slots");
        let mut options = vec![];
        if copying.len() + on_wire.len() < slots {
            options.push(0);
        }
        if !copying.is_empty() {
            options.push(1);
        }
        if !on_wire.is_empty() {
            options.push(2);
        }
        assert!(!options.is_empty(), "seed {seed}: stuck without an outcome");
        match options[rng.gen_range(0..options.len())] {
            0 => match plan.next_chunk() {
                Some(c) => {
                    assert!(!failed, "seed {seed}: a chunk was issued after a failure");
                    assert_eq!(c.index, issued, "seed {seed}: chunks issued in order");
                    assert_eq!(c.offset, issued * chunk_bytes, "seed {seed}");
                    assert!(c.len > 0 && c.len <= chunk_bytes && c.offset + c.len <= len, "seed {seed}: {c:?}");
                    issued += 1;
                    copying.push(c);
                }
                None => assert!(
                    !copying.is_empty() || !on_wire.is_empty(),
                    "seed {seed}: nothing in flight, nothing to issue, and no outcome"
                ),
            },
            1 => {
                let c = copying.swap_remove(rng.gen_range(0..copying.len()));
                let fail = rng.gen_range(0..100) < fail_percent;
                failed |= fail;
                let result = if fail { Err(TransferError::PeerUnreachable) } else { Ok(()) };
                if plan.copied(c, result) {
                    assert!(!failed, "seed {seed}: a chunk was sent after a failure");
                    on_wire.push(c);
                }
            }
            _ => {
                let c = on_wire.swap_remove(rng.gen_range(0..on_wire.len()));
                let fail = rng.gen_range(0..100) < fail_percent;
                failed |= fail;
                plan.sent(c, if fail { Err(TransferError::Rejected(RejectReason::BadKey)) } else { Ok(()) });
                if !fail {
                    delivered[c.index as usize] += 1;
                }
            }
        }
    };
    assert!(copying.is_empty() && on_wire.is_empty(), "seed {seed}: outcome with chunks in flight");
    assert_eq!(outcome.is_ok(), !failed, "seed {seed}: success exactly when nothing failed");
    if outcome.is_ok() {
        assert!(delivered.iter().all(|&n| n == 1), "seed {seed}: every chunk delivered exactly once");
    }
    assert!(delivered.iter().all(|&n| n <= 1), "seed {seed}: no chunk delivered twice");
}

#[test]
fn plans_deliver_every_chunk_once_or_fail_with_nothing_in_flight() {
    for seed in 0..400 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xabc);
        let chunk = rng.gen_range(1..=64u64);
        let len = rng.gen_range(0..=chunk * 20);
        let slots = rng.gen_range(1..=8);
        let fail = if seed % 3 == 0 { 0 } else { rng.gen_range(0..10) };
        drive(seed, len, chunk, slots, fail);
    }
}

#[test]
fn an_empty_write_is_over_at_once_and_chunks_cover_the_length() {
    let plan = StagePlan::new(0, 4096);
    assert_eq!(plan.outcome(), Some(Ok(())));
    let mut plan = StagePlan::new(10_000, 4096);
    assert_eq!(plan.chunk_count(), 3);
    let chunks: Vec<_> = std::iter::from_fn(|| plan.next_chunk()).collect();
    assert_eq!(chunks.iter().map(|c| c.len).collect::<Vec<_>>(), vec![4096, 4096, 1808]);
}

pub(crate) struct HostMemory(pub(crate) Allocation, pub(crate) usize);

impl StagingMemory for HostMemory {
    fn base_addr(&self) -> usize {
        self.0.base()
    }
    fn len_bytes(&self) -> usize {
        self.1
    }
}

fn pool(slot_bytes: usize, slots: usize) -> Arc<SlotPool> {
    let len = slot_bytes * slots + 100;
    SlotPool::new(Box::new(HostMemory(Allocation::new(len).unwrap(), len)), slot_bytes)
}

#[test]
fn the_pool_lends_at_most_its_slots_and_takes_them_back_on_drop() {
    let p = pool(4096, 3);
    assert_eq!(p.slot_count(), 3, "the remainder is no slot");
    let leases: Vec<_> = std::iter::from_fn(|| p.take()).collect();
    assert_eq!(leases.len(), 3);
    let mut addrs: Vec<_> = leases.iter().map(|l| l.addr()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), 3, "distinct slots");
    assert!(p.take().is_none());
    drop(leases);
    assert_eq!(p.free_count(), 3);
}

/// Copies out of host memory standing in for the device; completes each copy after a random
/// number of polls, only while `open`, and fails the copy numbered `fail_copy`.
struct FakeCopier {
    rng: ChaCha8Rng,
    open: Arc<AtomicBool>,
    started: Arc<AtomicUsize>,
    fail_copy: Option<usize>,
}

struct FakeTicket {
    src: usize,
    dst: usize,
    len: usize,
    polls_left: std::cell::Cell<u32>,
    fail: bool,
}

impl ChunkCopier for FakeCopier {
    type Ticket = FakeTicket;
    fn start(
        &mut self,
        source: &StagedSource,
        src_offset: u64,
        dst_addr: usize,
        len: usize,
    ) -> Result<FakeTicket, String> {
        let n = self.started.fetch_add(1, Ordering::SeqCst);
        let src = source.ptr as usize + src_offset as usize;
        let polls_left = std::cell::Cell::new(self.rng.gen_range(0..50));
        Ok(FakeTicket { src, dst: dst_addr, len, polls_left, fail: self.fail_copy == Some(n) })
    }
    fn poll(&mut self, t: &FakeTicket) -> Result<bool, String> {
        if !self.open.load(Ordering::SeqCst) || t.polls_left.get() > 0 {
            t.polls_left.set(t.polls_left.get().saturating_sub(1));
            return Ok(false);
        }
        if t.fail {
            return Err("injected copy failure".into());
        }
        // Safety: `src` lies in the test's source vector (kept alive by the staged write's
        // source) and `dst` in a slot leased to this copy until this poll returns.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(t.src as *const u8, t.dst as *mut u8, t.len)
        };
        Ok(true)
    }
}

pub(crate) struct Rig {
    pub(crate) a: Engine,
    pub(crate) open: Arc<AtomicBool>,
    pub(crate) started: Arc<AtomicUsize>,
    pub(crate) pool: Arc<SlotPool>,
}

/// Engine `a` with a fake stager of `slots` slots of `slot_bytes`, set to stage device writes
/// to same-process peers over loopback (`force_network`, `device_ipc` off).
pub(crate) fn rig(seed: u64, slot_bytes: usize, slots: usize, fail_copy: Option<usize>, idle_timeout: Duration) -> Rig {
    rig_of(staging_engine(idle_timeout), seed, slot_bytes, slots, fail_copy)
}

/// As [`rig`], on an engine of the caller's.
pub(crate) fn rig_of(a: Engine, seed: u64, slot_bytes: usize, slots: usize, fail_copy: Option<usize>) -> Rig {
    let (open, started) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
    let copier =
        FakeCopier { rng: ChaCha8Rng::seed_from_u64(seed), open: open.clone(), started: started.clone(), fail_copy };
    let pool = pool(slot_bytes, slots);
    assert!(a.install_stager(Stager::start(copier, pool.clone(), crate::config::AWAIT_POLL_DEFAULT).unwrap()));
    Rig { a, open, started, pool }
}

pub(crate) fn staging_engine(idle_timeout: Duration) -> Engine {
    let config = crate::EngineConfig { device_ipc: false, ..Default::default() };
    Engine::builder().ignore_env().config(config).force_network(true).idle_timeout(idle_timeout).build().unwrap()
}

pub(crate) fn pattern(len: usize, seed: u64) -> Arc<Vec<u8>> {
    Arc::new((0..len).map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(seed) as u8).collect())
}

/// A "device" region of `a` over `bytes`.
pub(crate) fn fake_device(a: &Engine, bytes: &Arc<Vec<u8>>) -> crate::MrHandle {
    let keep: MemoryOwner = bytes.clone();
    a.register_fake_device(bytes.as_ptr() as usize, bytes.len() as u64, 0, keep)
}

pub(crate) fn wait_free(pool: &SlotPool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.free_count() != pool.slot_count() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(pool.free_count(), pool.slot_count(), "every slot came back");
}

#[test]
fn staged_writes_land_exactly_with_one_immediate_each() {
    for seed in 0..3u64 {
        let r = rig(seed, 64 << 10, 3, None, Duration::from_secs(5));
        let b = staging_engine(Duration::from_secs(5));
        r.a.add_peer(&b.address()).unwrap();
        let len = (1 << 20) + 4097 + seed as usize * 999;
        let src = pattern(len, seed);
        let h = fake_device(&r.a, &src);
        let dst = b.alloc(len + 8192).unwrap();
        let d = dst.descriptor();
        // Two writes at once: the pool is shared, both must finish, each counted once.
        let first = WriteOp { src: &h, src_offset: 3, dst: &d, dst_offset: 0, len: 700_000, imm: Some(9) };
        let second = WriteOp {
            src: &h,
            src_offset: 700_003,
            dst: &d,
            dst_offset: 700_000,
            len: len as u64 - 700_003,
            imm: Some(9),
        };
        let (t1, t2) = (r.a.write(&first).unwrap(), r.a.write(&second).unwrap());
        t1.wait_timeout(Duration::from_secs(20)).unwrap();
        t2.wait_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(b.imm_counter(9).wait(2, Duration::from_secs(10)), 2, "seed {seed}");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(b.imm_counter(9).value(), 2, "seed {seed}: each immediate exactly once");
        let got = dst.to_vec();
        assert_eq!(&got[..len - 3], &src[3..], "seed {seed}: bytes landed in place");
        assert!(got[len - 3..].iter().all(|&x| x == 0), "seed {seed}: nothing past the range");
        let chunks = 700_000usize.div_ceil(64 << 10) + (len - 700_003).div_ceil(64 << 10);
        assert_eq!(r.started.load(Ordering::SeqCst), chunks, "seed {seed}: one copy per chunk");
        wait_free(&r.pool);
    }
}

#[test]
fn a_refused_destination_fails_the_write_and_counts_nothing() {
    let r = rig(7, 64 << 10, 2, None, Duration::from_secs(5));
    let b = staging_engine(Duration::from_secs(5));
    r.a.add_peer(&b.address()).unwrap();
    let src = pattern(300_000, 1);
    let h = fake_device(&r.a, &src);
    let dst = b.alloc(300_000).unwrap();
    let mut d = dst.descriptor();
    d.key ^= 1;
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 300_000, imm: Some(4) };
    let got = r.a.write(&op).unwrap().wait_timeout(Duration::from_secs(20));
    assert_eq!(got, Err(TransferError::Rejected(RejectReason::BadKey)));
    assert_eq!(b.imm_counter(4).value(), 0, "no immediate for a refused write");
    assert!(dst.to_vec().iter().all(|&x| x == 0), "nothing placed");
    wait_free(&r.pool);
}

#[test]
fn a_failed_copy_fails_the_write_and_stops_its_chunks() {
    let r = rig(3, 64 << 10, 2, Some(2), Duration::from_secs(5));
    let b = staging_engine(Duration::from_secs(5));
    r.a.add_peer(&b.address()).unwrap();
    let src = pattern(1 << 20, 2);
    let h = fake_device(&r.a, &src);
    let dst = b.alloc(1 << 20).unwrap();
    let d = dst.descriptor();
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: Some(4) };
    let got = r.a.write(&op).unwrap().wait_timeout(Duration::from_secs(20));
    assert_eq!(got, Err(TransferError::PeerUnreachable));
    assert!(r.started.load(Ordering::SeqCst) < 16, "copies stopped after the failure");
    assert_eq!(b.imm_counter(4).value(), 0);
    wait_free(&r.pool);
    // The engine goes on: the next write succeeds.
    let ok = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 100_000, imm: Some(5) };
    r.a.write(&ok).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(b.imm_counter(5).wait(1, Duration::from_secs(5)), 1);
}

#[test]
fn a_peer_that_exits_mid_transfer_fails_the_write_without_a_crash() {
    // The peer is an engine of this process, so no pidfd says it left: the writer declares it
    // dead after `peer_dead_after`, here 1 s instead of the default 5 s (the test's own time).
    let config =
        crate::EngineConfig { device_ipc: false, peer_dead_after: Duration::from_secs(1), ..Default::default() };
    let writer = Engine::builder()
        .ignore_env()
        .config(config)
        .force_network(true)
        .idle_timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let r = rig_of(writer, 5, 64 << 10, 4, None);
    let b = staging_engine(Duration::from_secs(5));
    r.a.add_peer(&b.address()).unwrap();
    let src = pattern(2 << 20, 3);
    let h = fake_device(&r.a, &src);
    let dst = b.alloc(2 << 20).unwrap();
    let d = dst.descriptor();
    // Warm the connection, then hold copies back, drop the peer, and let them go.
    let warm = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1000, imm: None };
    r.a.write(&warm).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    r.open.store(false, Ordering::SeqCst);
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 2 << 20, imm: Some(6) };
    let t = r.a.write(&op).unwrap();
    let b_id = b.id();
    drop(dst);
    drop(b);
    r.open.store(true, Ordering::SeqCst);
    let got = t.wait_timeout(Duration::from_secs(30));
    // Its Close may arrive first (unreachable); if not, the fresh connections the chunks try
    // go unanswered for `peer_dead_after` (an engine of this process: no pidfd says it left).
    assert!(
        matches!(got, Err(TransferError::PeerUnreachable | TransferError::Rejected(_)))
            || matches!(got, Err(TransferError::PeerUnresponsive { peer, .. }) if peer == b_id),
        "{got:?}"
    );
    wait_free(&r.pool);
    // Another peer is still served.
    let c = staging_engine(Duration::from_secs(5));
    r.a.add_peer(&c.address()).unwrap();
    let dst = c.alloc(4096).unwrap();
    let d = dst.descriptor();
    let op = WriteOp { src: &h, src_offset: 10, dst: &d, dst_offset: 0, len: 4096, imm: Some(1) };
    r.a.write(&op).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(&dst.to_vec()[..], &src[10..4106]);
}

#[test]
fn staging_knobs_come_from_the_environment_and_bad_values_are_refused() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    };
    let c = crate::EngineConfig::default()
        .with_overrides_from(env(&[
            ("ACCORD_DEVICE_IPC", "0"),
            ("ACCORD_DEVICE_STAGING_CHUNK_BYTES", "1048576"),
            ("ACCORD_DEVICE_STAGING_CHUNKS", "3"),
        ]))
        .unwrap();
    assert!(!c.device_ipc);
    assert_eq!((c.device_staging_chunk_bytes, c.device_staging_chunks), (1 << 20, 3));
    c.validate().unwrap();
    let d = crate::EngineConfig::default();
    assert!(d.device_ipc && d.validate().is_ok(), "defaults: IPC on, 4 MiB x 8");
    for (bytes, chunks) in [(1024, 8), (4 << 20, 0), (4 << 20, super::DEVICE_STAGING_CHUNKS_MAX + 1), (1 << 30, 8)] {
        let c = crate::EngineConfig { device_staging_chunk_bytes: bytes, device_staging_chunks: chunks, ..d.clone() };
        assert!(c.validate().is_err(), "{bytes} x {chunks} must be refused");
    }
    let bad = crate::EngineConfig::default().with_overrides_from(env(&[("ACCORD_DEVICE_STAGING_CHUNKS", "many")]));
    assert!(bad.is_err());
    assert_eq!(d.device_context, crate::DeviceContext::Primary, "copies share the runtime's context by default");
    let private = crate::EngineConfig::default().with_overrides_from(env(&[("ACCORD_DEVICE_CONTEXT", "private")]));
    assert_eq!(private.unwrap().device_context, crate::DeviceContext::Private);
    let odd = crate::EngineConfig::default().with_overrides_from(env(&[("ACCORD_DEVICE_CONTEXT", "own")]));
    assert!(odd.unwrap_err().to_string().contains("ACCORD_DEVICE_CONTEXT"));
    let t = crate::EngineConfig::default()
        .with_overrides_from(env(&[("ACCORD_DEVICE_LANDING_TIMEOUT_MS", "250")]))
        .unwrap();
    assert_eq!(t.device_landing_timeout, std::time::Duration::from_millis(250), "the variable is in milliseconds");
    assert_eq!(d.device_landing_timeout, crate::LANDING_TIMEOUT_DEFAULT);
    let zero = crate::EngineConfig { device_landing_timeout: std::time::Duration::ZERO, ..d.clone() };
    assert!(zero.validate().is_err());
    let sub_ms = crate::EngineConfig { device_landing_timeout: std::time::Duration::from_micros(500), ..d.clone() };
    assert!(sub_ms.validate().is_err(), "below the variable's unit");
}

/// Not a test of correctness: the staged route with the fake copier (a memcpy standing in for
/// the device-to-host copy) against a plain host write of the same bytes over the same
/// loopback transport, in one run. Prints a table; run with
/// `cargo test --release -p accord-engine --lib staged_route_vs_host_write -- --ignored --nocapture`.
#[test]
#[ignore]
fn staged_route_vs_host_write() {
    let (len, iters) = (64usize << 20, 8);
    println!("{:>12} {:>10} {:>14} {:>14} {:>7}", "slot bytes", "slots", "host GB/s", "staged GB/s", "ratio");
    for (slot, slots) in [(1usize << 20, 8), (4 << 20, 8), (16 << 20, 4)] {
        let r = rig(1, slot, slots, None, Duration::from_secs(5));
        let b = staging_engine(Duration::from_secs(5));
        r.a.add_peer(&b.address()).unwrap();
        let src = pattern(len, 1);
        let h = fake_device(&r.a, &src);
        let host = r.a.alloc(len).unwrap();
        host.write_at(0, &src).unwrap();
        let dst = b.alloc(len).unwrap();
        let d = dst.descriptor();
        let hh = host.handle();
        let time = |h: &crate::MrHandle| {
            let op = WriteOp { src: h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: None };
            r.a.write(&op).unwrap().wait_timeout(Duration::from_secs(60)).unwrap();
            let t = Instant::now();
            for _ in 0..iters {
                r.a.write(&op).unwrap().wait_timeout(Duration::from_secs(60)).unwrap();
            }
            (len * iters) as f64 / t.elapsed().as_secs_f64() / 1e9
        };
        let (host_gbps, staged_gbps) = (time(&hh), time(&h));
        println!("{slot:>12} {slots:>10} {host_gbps:>14.2} {staged_gbps:>14.2} {:>7.3}", staged_gbps / host_gbps);
        assert_eq!(dst.to_vec(), *src);
    }
}
