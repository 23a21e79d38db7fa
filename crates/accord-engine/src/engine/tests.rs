use super::*;
use crate::FaultConfig;
use crate::{PagedWriteOp, ScatterDst, TransferError, WriteOp};
use accord_proto::wire::RejectReason;
use std::net::UdpSocket;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn engine(force_network: bool) -> Engine {
    Engine::builder().ignore_env().force_network(force_network).build().expect("engine builds")
}

/// Bytes that differ by position and seed (shared by the engine's test modules).
pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(2654435761).wrapping_add(seed) >> 7) as u8).collect()
}

fn pair(force_network: bool) -> (Engine, Engine) {
    pair_of(|| engine(force_network))
}

/// A paged write of pages of `page` bytes, `pages.0[i]` of `src` to `pages.1[i]` of `dst`, from
/// `from` with immediate `imm`, waited for: `to` counts the immediate exactly once, and still
/// once a moment later (a second count would come late). Shared by the host and device tests;
/// what landed each checks with [`assert_pages_landed`].
pub(crate) fn write_paged_counted_once(
    from: &Engine,
    to: &Engine,
    src: &MrHandle,
    dst: &MrDescriptor,
    page: usize,
    pages: (&[u64], &[u64]),
    imm: u32,
) {
    let op = PagedWriteOp { src, dst, page_bytes: page as u64, src_pages: pages.0, dst_pages: pages.1, imm: Some(imm) };
    from.write_paged(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert_eq!(to.imm_counter(imm).wait(1, WAIT), 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(to.imm_counter(imm).value(), 1, "one immediate for the whole paged write");
}

/// Every page `pages.0[i]` of `src` stands at page `pages.1[i]` of `got`, pages of `page` bytes.
pub(crate) fn assert_pages_landed(got: &[u8], src: &[u8], page: usize, pages: (&[u64], &[u64])) {
    for (&s, &t) in pages.0.iter().zip(pages.1) {
        let (s, t) = (s as usize * page, t as usize * page);
        assert!(got[t..t + page] == src[s..s + page], "page at {t} differs");
    }
}

/// Two engines from `make` that know each other.
pub(crate) fn pair_of(make: impl Fn() -> Engine) -> (Engine, Engine) {
    let (a, b) = (make(), make());
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    (a, b)
}

#[test]
fn write_over_network_lands_and_counts_imm() {
    let (a, b) = pair(true);
    let len = 3 << 20;
    let src = a.alloc(len).unwrap();
    let dst = b.alloc(len).unwrap();
    let data = pattern(1, len);
    src.write_at(0, &data).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(9) };
    a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert_eq!(b.imm_counter(9).wait(1, WAIT), 1);
    assert!(dst.to_vec() == data, "bytes differ");
}

/// Memory registered as read next by a device, not the CPU, takes writes with streaming stores:
/// the bytes land exactly, at an unaligned offset and length, over the network route (shared
/// memory between engines) and the in-process copy alike, and nothing around them changes.
#[test]
fn writes_into_memory_a_device_reads_next_land_exactly() {
    for force_network in [true, false] {
        let (a, b) = pair(force_network);
        let len = (3 << 20) + 123;
        let src = a.alloc(len).unwrap();
        let data = pattern(7, len);
        src.write_at(0, &data).unwrap();
        let mut dst = vec![0xa5u8; len + 64];
        // Safety: `dst` outlives the registration (deregistered below, before it drops) and no
        // reference to it is used while peers may write it.
        #[allow(unsafe_code)]
        let (handle, d) =
            unsafe { b.register_raw(dst.as_mut_ptr(), dst.len(), crate::MemoryKind::HostForDevice) }.unwrap();
        let h = src.handle();
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 5, len: len as u64, imm: Some(21) };
        a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
        assert_eq!(b.imm_counter(21).wait(1, WAIT), 1);
        b.deregister(&handle);
        assert!(dst[5..5 + len] == data[..], "bytes differ (network route: {force_network})");
        assert!(dst[..5].iter().chain(&dst[5 + len..]).all(|&x| x == 0xa5), "bytes around the write changed");
    }
}

/// With `ACCORD_ENGINE_DEBUG`'s switch on, every worker accounts its loop's time by phase, and
/// a worker that received a write spent some of it receiving; off, nothing is timed.
#[test]
fn workers_account_their_time_by_phase_only_when_asked() {
    for debug in [false, true] {
        let config = EngineConfig { debug_stats: debug, ..EngineConfig::default() };
        let (a, b) =
            pair_of(|| Engine::builder().ignore_env().config(config.clone()).force_network(true).build().unwrap());
        let len = 1 << 20;
        let src = a.alloc(len).unwrap();
        let dst = b.alloc(len).unwrap();
        let (h, d) = (src.handle(), dst.descriptor());
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(23) };
        a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
        assert_eq!(b.imm_counter(23).wait(1, WAIT), 1);
        let mut time = crate::WorkerTime::default();
        b.stats().lanes.iter().for_each(|l| time.add(&l.time));
        if debug {
            assert!(time.receive_ns > 0 && time.total_ns() >= time.receive_ns, "{time:?}");
            assert!(time.shares().contains("receive"), "{}", time.shares());
        } else {
            assert_eq!(time, crate::WorkerTime::default(), "nothing timed with the switch off");
        }
    }
}

/// Unsharded writes on an engine with several lanes: each one part on the next lane, its
/// immediate counted once its bytes landed; pieces of one buffer land exactly and spread over lanes.
#[test]
fn unsharded_writes_spread_over_lanes_and_count_each_immediate() {
    let build = || Engine::builder().ignore_env().force_network(true).workers_per_nic(3).build().unwrap();
    let (a, b) = (build(), build());
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let (len, pieces) = (4 << 20, 4u64);
    let src = a.alloc(len).unwrap();
    let dst = b.alloc(len).unwrap();
    let data = pattern(5, len);
    src.write_at(0, &data).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let piece = len as u64 / pieces;
    let transfers: Vec<_> = (0..pieces)
        .map(|i| {
            let op =
                WriteOp { src: &h, src_offset: i * piece, dst: &d, dst_offset: i * piece, len: piece, imm: Some(11) };
            a.write_unsharded(&op).unwrap()
        })
        .collect();
    for t in transfers {
        t.wait_timeout(WAIT).unwrap();
    }
    assert_eq!(b.imm_counter(11).wait(pieces, WAIT), pieces, "one immediate per piece");
    assert!(dst.to_vec() == data, "bytes differ");
    let busy = a.stats().lanes.iter().filter(|l| l.endpoint.datagrams_sent > 0).count();
    assert!(busy >= 2, "pieces went round robin over lanes, {busy} lane(s) sent");
}

/// EQDS over kernel UDP on loopback: the receiver's credit pacer schedules the writer; a
/// 16 MiB write lands exactly, with its immediate, and credit was what let it go.
#[test]
fn eqds_write_over_udp_lands() {
    let build = || {
        let config = EngineConfig { cc: "eqds".parse().unwrap(), nic_gbps: 25.0, ..Default::default() };
        Engine::builder().ignore_env().config(config).force_network(true).build().expect("engine builds")
    };
    let (a, b) = (build(), build());
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let len = 16 << 20;
    let src = a.alloc(len).unwrap();
    let dst = b.alloc(len).unwrap();
    let data = pattern(5, len);
    src.write_at(0, &data).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(3) };
    a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert_eq!(b.imm_counter(3).wait(1, WAIT), 1);
    assert!(dst.to_vec() == data, "bytes differ");
    // Beyond the speculative start, the receiver's pacer paid for the write.
    let granted: u64 = b.stats().lanes.iter().map(|l| l.credit_granted_bytes).sum();
    assert!(granted >= len as u64 / 2, "credit granted {granted}");
}

#[test]
fn write_in_process_is_memcpy() {
    let (a, b) = pair(false);
    let src = a.alloc(4096).unwrap();
    let dst = b.alloc(4096).unwrap();
    src.fill(7);
    let (h, d) = (src.handle(), dst.descriptor());
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 4096, imm: Some(1) };
    let t = a.write(&op).unwrap();
    assert!(t.is_done(), "a same-process write completes on submission");
    assert_eq!(b.imm_counter(1).value(), 1);
    assert_eq!(dst.to_vec(), vec![7u8; 4096]);
}

#[test]
fn bad_writes_fail_clearly() {
    let (a, b) = pair(true);
    let src = a.alloc(8192).unwrap();
    let dst = b.alloc(4096).unwrap();
    let h = src.handle();
    let d = dst.descriptor();
    let beyond = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 1, len: 4096, imm: None };
    assert!(matches!(a.write(&beyond), Err(SubmitError::DestinationOutOfBounds { .. })));
    let src_beyond = WriteOp { src: &h, src_offset: 8000, dst: &d, dst_offset: 0, len: 4096, imm: None };
    assert!(matches!(a.write(&src_beyond), Err(SubmitError::SourceOutOfBounds { .. })));
    src.fill(3);
    let mut wrong_key = d;
    wrong_key.key ^= 1;
    let op = WriteOp { src: &h, src_offset: 0, dst: &wrong_key, dst_offset: 0, len: 4096, imm: Some(5) };
    let r = a.write(&op).unwrap().wait_timeout(WAIT);
    assert_eq!(r, Err(TransferError::Rejected(RejectReason::BadKey)));
    assert_eq!(dst.to_vec(), vec![0u8; 4096], "nothing placed");
    assert_eq!(b.imm_counter(5).value(), 0);
    let gone = dst.descriptor();
    drop(dst);
    let op = WriteOp { src: &h, src_offset: 0, dst: &gone, dst_offset: 0, len: 4096, imm: None };
    let r = a.write(&op).unwrap().wait_timeout(WAIT);
    assert_eq!(r, Err(TransferError::Rejected(RejectReason::UnknownRegion)));
}

#[test]
fn paged_scatter_send_barrier_over_network() {
    let (a, b) = pair(true);
    let c = engine(true);
    a.add_peer(&c.address()).unwrap();
    let page = 64 * 1024;
    let src = a.alloc(8 * page).unwrap();
    let data = pattern(5, 8 * page);
    src.write_at(0, &data).unwrap();
    let dst = b.alloc(8 * page).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let pages: (&[u64], &[u64]) = (&[0, 1, 2, 5, 7], &[3, 4, 5, 0, 1]);
    write_paged_counted_once(&a, &b, &h, &d, page, pages, 2);
    assert_pages_landed(&dst.to_vec(), &data, page, pages);

    let dst_c = c.alloc(page).unwrap();
    let dsts = [
        ScatterDst { dst: d, dst_offset: 0, src_offset: 0, len: 1000 },
        ScatterDst { dst: dst_c.descriptor(), dst_offset: 10, src_offset: 1000, len: 2000 },
    ];
    let counter = Arc::new(AtomicU64::new(0));
    let t = a.scatter(&h, &dsts, Some(3)).unwrap();
    t.count_into(counter.clone());
    t.wait_timeout(WAIT).unwrap();
    assert_eq!(counter.load(Ordering::Acquire), 1);
    assert!(dst_c.to_vec()[10..2010] == data[1000..3000]);

    let got = Arc::new(Mutex::new(vec![]));
    let g = got.clone();
    b.post_recvs(4096, 4, move |m| g.lock().unwrap().push((m.data.to_vec(), m.imm)));
    let (tx, rx) = std::sync::mpsc::channel();
    a.send(b.id(), b"hello", Some(11)).unwrap().on_complete(move |r| tx.send(r).unwrap());
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), Ok(()));
    let deadline = std::time::Instant::now() + WAIT;
    while got.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(got.lock().unwrap()[0], (b"hello".to_vec(), Some(11)));

    let ids = [a.id(), b.id()];
    std::thread::scope(|s| {
        s.spawn(|| b.barrier(&ids, 77, WAIT).unwrap());
        a.barrier(&ids, 77, WAIT).unwrap();
    });
}

#[test]
fn garbage_datagrams_are_counted_and_dropped_while_writes_go_on() {
    let (a, b) = pair(true);
    let len = 2 << 20;
    let src = a.alloc(len).unwrap();
    let dst = b.alloc(len).unwrap();
    let data = pattern(3, len);
    src.write_at(0, &data).unwrap();
    let targets: Vec<std::net::SocketAddr> = b.address().nics.concat().concat();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let spammer = std::thread::spawn(move || {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut i = 0u64;
        // At least one round of junk even if the writes finish first (over shared memory they
        // can finish before this thread is scheduled).
        while i < 64 || !s.load(Ordering::Relaxed) {
            let junk: Vec<u8> = (0..(i % 200) as usize + 1).map(|k| (k as u64 * 7 + i) as u8).collect();
            let _ = sock.send_to(&junk, targets[i as usize % targets.len()]);
            i += 1;
            if i % 64 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    });
    let (h, d) = (src.handle(), dst.descriptor());
    for _ in 0..4 {
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(4) };
        a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    spammer.join().unwrap();
    assert_eq!(b.imm_counter(4).wait(4, WAIT), 4);
    assert!(dst.to_vec() == data);
    // The junk went to b's sockets; its worker counts it once it reads it.
    let deadline = std::time::Instant::now() + WAIT;
    while b.stats().datagrams_dropped() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(b.stats().datagrams_dropped() > 0, "garbage is counted");
}

#[test]
fn env_overrides_apply() {
    let vars: HashMap<&str, &str> =
        [("ACCORD_NICS", "127.0.0.1,127.0.0.2"), ("ACCORD_CC", "swift"), ("ACCORD_FORCE_NETWORK", "1")].into();
    let c = EngineConfig::default().with_overrides_from(|n| vars.get(n).map(|v| v.to_string())).unwrap();
    assert_eq!(c.nics.len(), 2);
    assert_eq!(c.cc.name(), "swift");
    assert!(c.force_network);
    assert!(c.shm.enabled, "shared memory is on unless turned off");
    assert!(EngineConfig::default().with_overrides_from(|_| Some("x".into())).is_err());
    let shm: HashMap<&str, &str> =
        [("ACCORD_SHM", "0"), ("ACCORD_SHM_RING_BYTES", "1048576"), ("ACCORD_SHM_DIR", "/tmp/x")].into();
    let c = EngineConfig::default().with_overrides_from(|n| shm.get(n).map(|v| v.to_string())).unwrap();
    assert_eq!((c.shm.enabled, c.shm.ring_bytes, c.shm.dir.to_str()), (false, 1 << 20, Some("/tmp/x")));
    let odd: HashMap<&str, &str> = [("ACCORD_SHM_RING_BYTES", "1000000")].into();
    assert!(EngineConfig::default().with_overrides_from(|n| odd.get(n).map(|v| v.to_string())).is_err());
}

#[test]
fn await_poll_is_configurable_and_bounded() {
    assert_eq!(EngineConfig::default().await_poll, crate::AWAIT_POLL_DEFAULT);
    let set = |v: &str| {
        let vars: HashMap<&str, String> = [("ACCORD_AWAIT_POLL_US", v.to_string())].into();
        EngineConfig::default().with_overrides_from(|n| vars.get(n).cloned())
    };
    assert_eq!(set("0").unwrap().await_poll, Duration::ZERO, "0 turns the poll off");
    assert_eq!(set("250").unwrap().await_poll, Duration::from_micros(250));
    assert!(set("x").is_err());
    assert!(set("10000").unwrap().validate().is_ok(), "the maximum itself is allowed");
    assert!(set("10001").unwrap().validate().is_err(), "longer than AWAIT_POLL_MAX");
}

/// The path selector and the EQDS pacer order are chosen by name; unknown names are refused;
/// an engine pair running EQDS with the simulator's choices (recycled paths, shortest remaining
/// first) moves bytes and immediates as any other.
#[test]
fn path_selector_and_pacer_order_by_name() {
    let try_set = |pairs: &[(&str, &str)]| {
        let vars: HashMap<&str, String> = pairs.iter().map(|(k, v)| (*k, v.to_string())).collect();
        EngineConfig::default().with_overrides_from(|n| vars.get(n).cloned())
    };
    let set = |pairs: &[(&str, &str)]| try_set(pairs).unwrap();
    let c = set(&[("ACCORD_PATH_SELECTOR", "recycle"), ("ACCORD_PACER_ORDER", "srpt")]);
    assert!(c.validate().is_ok());
    let ep = c.endpoint_config();
    assert_eq!(ep.connection.selector, accord_proto::path::SelectorKind::Recycle);
    assert_eq!(ep.credit.order, accord_proto::config::PacerOrder::ShortestRemaining);
    assert_eq!(EngineConfig::default().endpoint_config().connection.selector, Default::default());
    // Parsed once, when the variable is read: the error names the variable and what it accepts.
    let e = try_set(&[("ACCORD_PATH_SELECTOR", "fastest")]).unwrap_err().to_string();
    assert!(e.contains("ACCORD_PATH_SELECTOR") && e.contains("p2c, rr, recycle"), "{e}");
    let e = try_set(&[("ACCORD_PACER_ORDER", "lifo")]).unwrap_err().to_string();
    assert!(e.contains("ACCORD_PACER_ORDER") && e.contains("rr, srpt"), "{e}");
    let e = try_set(&[("ACCORD_CC", "bbr")]).unwrap_err().to_string();
    assert!(e.contains("ACCORD_CC") && e.contains("cubic, swift, eqds, fixed"), "{e}");
    // The same names as before are accepted, aliases included.
    let c = set(&[("ACCORD_CC", "EQDS"), ("ACCORD_PATH_SELECTOR", "reps"), ("ACCORD_PACER_ORDER", "fair")]);
    assert_eq!(c.cc.name(), "eqds");
    assert_eq!(c.path_selector, accord_proto::path::SelectorKind::Recycle);
    assert_eq!(c.pacer_order, accord_proto::config::PacerOrder::RoundRobin);

    let config = EngineConfig {
        cc: "eqds".parse().unwrap(),
        path_selector: accord_proto::path::SelectorKind::Recycle,
        pacer_order: accord_proto::config::PacerOrder::ShortestRemaining,
        ..EngineConfig::default()
    };
    let (a, b) = pair_of(|| Engine::builder().ignore_env().config(config.clone()).force_network(true).build().unwrap());
    let src = a.alloc(1 << 20).unwrap();
    src.write_at(0, &(0..1u32 << 20).map(|i| (i * 7) as u8).collect::<Vec<u8>>()).unwrap();
    let dst = b.alloc(1 << 20).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: Some(2) };
    a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert_eq!(b.imm_counter(2).wait(1, WAIT), 1);
    assert_eq!(dst.to_vec(), src.to_vec());
}

/// `ACCORD_INTEGRITY` picks the end-to-end check; every mode moves the bytes intact over the
/// network path (force_network: UDP even in one process), and a bad name is refused. Over the
/// shared-memory rings (full, mac), the datagrams carry a header-only seal that the receiver
/// checks even on the ones it reads in place (none left unverified).
#[test]
fn integrity_modes_by_name_and_each_moves_bytes() {
    use accord_proto::wire::Integrity;
    let secret = "6b".repeat(32);
    let set = |v: &str, shm: &str| {
        let mut vars: HashMap<&str, String> =
            [("ACCORD_INTEGRITY", v.to_string()), ("ACCORD_SHM", shm.to_string())].into();
        if v == "mac" {
            vars.insert("ACCORD_JOB_SECRET", secret.clone());
        }
        EngineConfig::default().with_overrides_from(|n| vars.get(n).cloned())
    };
    assert_eq!(EngineConfig::default().endpoint_config().integrity, Integrity::Full);
    let e = set("sha256", "0").unwrap_err().to_string();
    assert!(e.contains("ACCORD_INTEGRITY") && e.contains("full, header, off, mac"), "{e}");
    let set = |v: &str, shm: &str| set(v, shm).unwrap();
    let modes =
        [("off", Integrity::Off), ("header", Integrity::Header), ("full", Integrity::Full), ("mac", Integrity::Mac)];
    let rings = [("full", Integrity::Full, "1"), ("mac", Integrity::Mac, "1")];
    // UDP (the check's reason to exist) in every mode, and the shared-memory rings.
    for (name, mode, shm) in modes.iter().map(|&(n, m)| (n, m, "0")).chain(rings) {
        let config = set(name, shm);
        assert_eq!(config.endpoint_config().integrity, mode);
        let (a, b) =
            pair_of(|| Engine::builder().ignore_env().config(config.clone()).force_network(true).build().unwrap());
        let src = a.alloc(1 << 20).unwrap();
        src.write_at(0, &(0..1u32 << 20).map(|i| (i * 13) as u8).collect::<Vec<u8>>()).unwrap();
        let dst = b.alloc(1 << 20).unwrap();
        let (h, d) = (src.handle(), dst.descriptor());
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: Some(4) };
        // Over the rings, write again (a bounded number of times) until they carried some: the
        // peers attach their rings asynchronously, and on a loaded 2-core machine a whole first
        // write went over UDP before they had (CI, stop 43).
        let mut writes = 0;
        loop {
            a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
            writes += 1;
            if shm != "1" || a.stats().shm_datagrams_sent() > 0 || writes == 20 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(b.imm_counter(4).wait(writes, WAIT), writes, "{name}");
        assert_eq!(dst.to_vec(), src.to_vec(), "{name}");
        let stats = b.stats();
        assert_eq!(stats.bad_checksums() + stats.bad_tags(), 0, "{name}: every datagram sealed right");
        assert!(stats.lanes.iter().map(|l| l.endpoint.datagrams_received).sum::<u64>() > 0, "{name}");
        if shm == "1" {
            assert!(a.stats().shm_datagrams_sent() > 0, "{name}: the rings carried the write");
            let unverified: u64 = stats.lanes.iter().map(|l| l.endpoint.local_unverified).sum();
            assert_eq!(unverified, 0, "{name}: ring datagrams sealed over the header, checked on arrival");
        }
    }
}

/// The authenticated mode without a job secret is refused when the engine is configured,
/// with a message that names the missing variable.
#[test]
fn mac_without_a_job_secret_is_refused_at_build() {
    let vars: HashMap<&str, String> = [("ACCORD_INTEGRITY", "mac".to_string())].into();
    let config = EngineConfig::default().with_overrides_from(|n| vars.get(n).cloned()).unwrap();
    let Err(e) = Engine::builder().ignore_env().config(config).build() else { panic!("mac without a secret built") };
    let e = e.to_string();
    assert!(e.contains("ACCORD_JOB_SECRET") && e.contains("mac"), "{e}");
}

/// Over UDP, both engines replay a tenth of what they send 200 ms later (data, ACKs, credit,
/// handshakes) and flip a header bit of one packet in fifty after the UDP checksum. Writes
/// spread over more than the replay delay all land intact; the receiver dropped the flipped
/// packets on the end-to-end check and the replays as stale or duplicate.
#[test]
fn replays_and_header_flips_past_the_udp_checksum_change_no_byte() {
    let faults = FaultConfig {
        replay: 0.1,
        replay_delay: Duration::from_millis(200),
        corrupt_header: 0.02,
        ..Default::default()
    };
    let mut config = EngineConfig::default();
    config.shm.enabled = false;
    let make = |seed| {
        Engine::builder()
            .ignore_env()
            .config(config.clone())
            .force_network(true)
            .fault_injection(faults.clone(), seed)
            .build()
            .unwrap()
    };
    let (a, b) = (make(1), make(2));
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let len = 1 << 20;
    let dst = b.alloc(len).unwrap();
    let d = dst.descriptor();
    // Six rounds 60 ms apart plus the 250 ms pause: replays of early rounds land mid-run.
    for round in 0..6u8 {
        let src = a.alloc(len).unwrap();
        let bytes = pattern(round as u64 + 20, len);
        src.write_at(0, &bytes).unwrap();
        let h = src.handle();
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(9) };
        a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
        assert_eq!(b.imm_counter(9).wait(round as u64 + 1, WAIT), round as u64 + 1);
        assert_eq!(dst.to_vec(), bytes, "round {round}");
        // Spread the rounds so replays of earlier rounds arrive during later ones.
        std::thread::sleep(Duration::from_millis(60));
    }
    // Let the last replays land, then check the connection still works.
    std::thread::sleep(Duration::from_millis(250));
    let src = a.alloc(len).unwrap();
    let bytes = pattern(99, len);
    src.write_at(0, &bytes).unwrap();
    let h = src.handle();
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: None };
    a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert_eq!(dst.to_vec(), bytes);
    let (sa, sb) = (a.stats(), b.stats());
    let injected: u64 = sa.faults.iter().chain(&sb.faults).map(|f| f.header_corrupted).sum();
    let replayed: u64 = sa.faults.iter().chain(&sb.faults).map(|f| f.replayed).sum();
    assert!(injected > 0 && replayed > 0, "faults were injected: {injected} flips, {replayed} replays");
    assert!(sa.bad_checksums() + sb.bad_checksums() > 0, "flipped headers failed the end-to-end check");
}

/// Engines holding the job secret exchange writes; an engine without it (or with another)
/// cannot get a single byte or message into one that has it: no connection, so no token.
#[test]
fn only_holders_of_the_job_secret_connect() {
    let secret = "5a".repeat(32);
    let with = |hex: &str| {
        let vars: HashMap<&str, String> = [("ACCORD_JOB_SECRET", hex.to_string()), ("ACCORD_SHM", "0".into())].into();
        EngineConfig::default().with_overrides_from(|n| vars.get(n).cloned()).unwrap()
    };
    let bad = HashMap::from([("ACCORD_JOB_SECRET", "xyz".to_string())]);
    let err = EngineConfig::default().with_overrides_from(|n| bad.get(n).cloned()).unwrap_err().to_string();
    assert!(err.contains("64 hex digits") && !err.contains("xyz"), "{err}");
    let build = |config: EngineConfig| {
        let config = EngineConfig { idle_timeout: Duration::from_millis(500), ..config };
        Engine::builder().ignore_env().config(config).force_network(true).build().unwrap()
    };
    let mut no_secret = EngineConfig::default();
    no_secret.shm.enabled = false;
    let (a, b) = (build(with(&secret)), build(with(&secret)));
    let outsiders = [build(no_secret), build(with(&"a5".repeat(32)))];
    let dst = b.alloc(4096).unwrap();
    let d = dst.descriptor();
    for (i, writer) in std::iter::once(&a).chain(&outsiders).enumerate() {
        writer.add_peer(&b.address()).unwrap();
        b.add_peer(&writer.address()).unwrap();
        let src = writer.alloc(4096).unwrap();
        src.fill(i as u8 + 1);
        let h = src.handle();
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 4096, imm: Some(7) };
        let result = writer.write(&op).unwrap().wait_timeout(WAIT);
        if i == 0 {
            assert_eq!(result, Ok(()), "a holder of the secret writes");
            assert_eq!(dst.to_vec(), vec![1u8; 4096]);
        } else {
            assert!(result.is_err(), "outsider {i} wrote: {result:?}");
            assert_eq!(dst.to_vec(), vec![1u8; 4096], "outsider {i} changed no byte");
        }
    }
    assert_eq!(b.imm_counter(7).wait(1, WAIT), 1, "only the holder's immediate counted");
    let refused: u64 = b.stats().lanes.iter().map(|l| l.endpoint.unadmitted).sum();
    assert!(refused > 0, "the outsiders' Hellos were refused and counted");
}

#[test]
fn wait_spin_is_configurable_and_bounded() {
    let set = |v: &str| {
        let vars: HashMap<&str, String> = [("ACCORD_WAIT_SPIN_US", v.to_string())].into();
        EngineConfig::default().with_overrides_from(|n| vars.get(n).cloned())
    };
    assert_eq!(set("0").unwrap().wait_spin, Duration::ZERO, "0 sleeps at once");
    assert_eq!(set("300").unwrap().wait_spin, Duration::from_micros(300));
    assert!(set("-1").is_err());
    assert!(set("100000").unwrap().validate().is_ok(), "the maximum itself is allowed");
    assert!(set("100001").unwrap().validate().is_err(), "longer than WAIT_SPIN_MAX");
}

/// Waits complete whether they catch the completion while polling or after falling asleep:
/// with no poll, with a poll far shorter than the write, and with one longer than it.
#[test]
fn waits_complete_with_and_without_polling() {
    for spin in [Duration::ZERO, Duration::from_micros(1), Duration::from_millis(50)] {
        let (a, b) = pair_of(|| Engine::builder().ignore_env().force_network(true).wait_spin(spin).build().unwrap());
        let src = a.alloc(1 << 20).unwrap();
        let dst = b.alloc(1 << 20).unwrap();
        let (h, d) = (src.handle(), dst.descriptor());
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: Some(7) };
        for round in 1..=3u64 {
            a.write(&op).unwrap().wait_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(b.imm_counter(7).wait(round, Duration::from_secs(20)), round, "spin {spin:?}");
        }
        a.write(&op).unwrap().wait().unwrap();
        assert_eq!(b.imm_counter(7).wait(4, Duration::from_secs(20)), 4);
    }
}

#[test]
fn receive_batch_follows_the_datapath_unless_set() {
    use crate::worker::rx_batch_slots;
    let lending = EngineConfig::default();
    assert_eq!(rx_batch_slots(&lending, 65_535), crate::config::LENDING_RX_BATCH_SLOTS);
    let mut copying = EngineConfig::default();
    copying.shm.lend = false;
    assert_eq!(rx_batch_slots(&copying, 65_535), 8, "full 64 KiB slots: as many as fit the cache target");
    assert_eq!(rx_batch_slots(&copying, 4_096), crate::RX_BATCH_SLOTS);
    let vars: HashMap<&str, &str> = [("ACCORD_RX_BATCH_SLOTS", "16")].into();
    let set = EngineConfig::default().with_overrides_from(|n| vars.get(n).map(|v| v.to_string())).unwrap();
    assert_eq!(rx_batch_slots(&set, 65_535), 16, "an explicit setting wins");
    let too_many = EngineConfig { rx_batch_slots: crate::RX_BATCH_SLOTS + 1, ..EngineConfig::default() };
    assert!(too_many.validate().is_err());
}

/// A command for a sleeping worker costs one wake datagram, and the statistics count it.
#[test]
fn wakes_of_sleeping_workers_are_counted() {
    let make = || Engine::builder().ignore_env().force_network(true).await_poll(Duration::ZERO).build().unwrap();
    let (a, b) = (make(), make());
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let (src, dst) = (a.alloc(64).unwrap(), b.alloc(64).unwrap());
    let op = WriteOp { src: &src.handle(), src_offset: 0, dst: &dst.descriptor(), dst_offset: 0, len: 64, imm: None };
    // The worker wakes on its own every IDLE_WAIT_MAX, so a submission may find it awake:
    // submit whenever it says it sleeps, until one submission had to wake it.
    let end = std::time::Instant::now() + WAIT;
    while a.stats().wakes() == 0 {
        assert!(std::time::Instant::now() < end, "no submission ever found the worker asleep");
        while !a.shared.lanes[0].sleeping.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < end, "the idle worker never slept");
            std::thread::yield_now();
        }
        a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    }
    assert_eq!(a.stats().lanes.len(), 1);
}

/// A part promised to a lane (a device write's immediate, while its copy runs) wakes a
/// sleeping worker at once and keeps it from sleeping until the promise is dropped; the part,
/// routed to that lane, then goes as any other.
#[test]
fn a_promised_lane_wakes_and_stays_awake_until_the_promise_ends() {
    let make = || Engine::builder().ignore_env().force_network(true).build().unwrap();
    let (a, b) = (make(), make());
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let lane = &a.shared.lanes[0];
    let end = std::time::Instant::now() + WAIT;
    while !lane.sleeping.load(Ordering::SeqCst) {
        assert!(std::time::Instant::now() < end, "the idle worker never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    let promise = a.shared.expect_on_lane(0);
    assert_eq!(promise.lane(), 0);
    assert_eq!(lane.expected.load(Ordering::SeqCst), 1);
    assert!(a.stats().wakes() >= 1, "the sleeping worker was woken by the promise");
    // Far past the poll window (500 us) and the idle wait, the worker has not gone back to sleep.
    std::thread::sleep(crate::IDLE_WAIT_MAX * 3);
    assert!(!lane.sleeping.load(Ordering::SeqCst), "a promised lane polls");
    let (src, dst) = (a.alloc(64).unwrap(), b.alloc(64).unwrap());
    let op = WriteOp { src: &src.handle(), src_offset: 0, dst: &dst.descriptor(), dst_offset: 0, len: 0, imm: Some(3) };
    a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    drop(promise);
    assert_eq!(lane.expected.load(Ordering::SeqCst), 0);
    assert_eq!(b.imm_counter(3).wait(1, WAIT), 1);
    while !lane.sleeping.load(Ordering::SeqCst) {
        assert!(std::time::Instant::now() < end, "the worker never slept again after the promise ended");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Writes with immediates both ways and back to back, with the worker poll off, at its default
/// and at its longest: the poll changes when a worker sleeps, never what arrives.
#[test]
fn transfers_complete_whether_workers_poll_or_sleep() {
    for poll in [Duration::ZERO, crate::AWAIT_POLL_DEFAULT, crate::AWAIT_POLL_MAX] {
        let make =
            || Engine::builder().ignore_env().workers_per_nic(2).force_network(true).await_poll(poll).build().unwrap();
        let (a, b) = (make(), make());
        a.add_peer(&b.address()).unwrap();
        b.add_peer(&a.address()).unwrap();
        let (sa, db) = (a.alloc(4096).unwrap(), b.alloc(4096).unwrap());
        let (sb, da) = (b.alloc(4096).unwrap(), a.alloc(4096).unwrap());
        for round in 0..50u32 {
            let bytes: Vec<u8> = (0..4096u32).map(|i| (i ^ round) as u8).collect();
            sa.write_at(0, &bytes).unwrap();
            sb.write_at(0, &bytes).unwrap();
            let len = 1 + u64::from(round) * 61;
            let ab =
                WriteOp { src: &sa.handle(), src_offset: 0, dst: &db.descriptor(), dst_offset: 0, len, imm: Some(7) };
            let ba =
                WriteOp { src: &sb.handle(), src_offset: 0, dst: &da.descriptor(), dst_offset: 0, len, imm: Some(8) };
            let (t1, t2) = (a.write(&ab).unwrap(), b.write(&ba).unwrap());
            t1.wait_timeout(WAIT).unwrap();
            t2.wait_timeout(WAIT).unwrap();
            b.take_imm(7, 1, WAIT).unwrap();
            a.take_imm(8, 1, WAIT).unwrap();
            let (mut got_b, mut got_a) = (vec![0u8; len as usize], vec![0u8; len as usize]);
            db.read_at(0, &mut got_b).unwrap();
            da.read_at(0, &mut got_a).unwrap();
            assert_eq!(got_b, bytes[..len as usize], "poll {poll:?} round {round}");
            assert_eq!(got_a, bytes[..len as usize], "poll {poll:?} round {round}");
        }
    }
}

#[test]
fn workers_follow_the_host_share_unless_set() {
    assert_eq!(crate::config::workers_for_share(32, 2), 8, "half of a 16-core share");
    assert_eq!(crate::config::workers_for_share(128, 1), 8, "at most AUTO_WORKERS_PER_NIC_MAX");
    assert_eq!(crate::config::workers_for_share(32, 4), 4);
    assert_eq!(crate::config::workers_for_share(32, 16), 1);
    assert_eq!(crate::config::workers_for_share(2, 4), 1);
    let shared: HashMap<&str, &str> = [("LOCAL_WORLD_SIZE", "1")].into();
    let c = EngineConfig::default().with_overrides_from(|n| shared.get(n).map(|v| v.to_string())).unwrap();
    let cores = crate::config::host_cores();
    assert_eq!(c.workers_per_nic, (cores / 2).clamp(1, 8));
    let pinned: HashMap<&str, &str> = [("LOCAL_WORLD_SIZE", "1"), ("ACCORD_WORKERS_PER_NIC", "1")].into();
    let c = EngineConfig::default().with_overrides_from(|n| pinned.get(n).map(|v| v.to_string())).unwrap();
    assert_eq!(c.workers_per_nic, 1, "an explicit setting wins");
    // On a 32-core host: mpirun's and srun's variables size the workers too, an explicit count
    // still wins, and a launcher's malformed value is skipped, not fatal.
    let sized = |vars: &[(&str, &str)]| {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        let mut c = EngineConfig::default();
        c.size_workers_to_host(|n| vars.get(n).map(|v| v.to_string()), 32);
        c.workers_per_nic
    };
    assert_eq!(sized(&[("LOCAL_WORLD_SIZE", "2")]), 8);
    assert_eq!(sized(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "4")]), 4);
    assert_eq!(sized(&[("SLURM_STEP_TASKS_PER_NODE", "8(x2)"), ("SLURM_NODEID", "1")]), 2);
    assert_eq!(sized(&[("LOCAL_WORLD_SIZE", "x"), ("MPI_LOCALNRANKS", "2")]), 8);
    assert_eq!(
        sized(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "2"), ("ACCORD_WORKERS_PER_NIC", "3")]),
        1,
        "left to the override"
    );
    assert_eq!(sized(&[("LOCAL_WORLD_SIZE", "x")]), EngineConfig::default().workers_per_nic, "nothing usable");
    let bad: HashMap<&str, &str> = [("LOCAL_WORLD_SIZE", "x")].into();
    assert!(EngineConfig::default().with_overrides_from(|n| bad.get(n).map(|v| v.to_string())).is_ok());
}

/// A count chosen on the builder (the NCCL plugin's, Python's `workers_per_nic`) stands over the
/// one sized from a launcher's rank count; `ACCORD_WORKERS_PER_NIC` stands over both.
#[test]
fn a_chosen_worker_count_stands_over_the_launcher_sizing() {
    let configured = |chosen: Option<usize>, vars: &[(&str, &str)]| {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        let mut builder = Engine::builder();
        if let Some(count) = chosen {
            builder = builder.workers_per_nic(count);
        }
        builder.configured(|n| vars.get(n).map(|v| v.to_string())).unwrap().workers_per_nic
    };
    let cores = crate::config::host_cores();
    let launcher_sized = crate::config::workers_for_share(cores, 2);
    assert_eq!(configured(None, &[("LOCAL_WORLD_SIZE", "2")]), launcher_sized);
    assert_eq!(configured(Some(12), &[("LOCAL_WORLD_SIZE", "2")]), 12);
    assert_eq!(configured(Some(12), &[]), 12);
    assert_eq!(configured(Some(12), &[("LOCAL_WORLD_SIZE", "2"), ("ACCORD_WORKERS_PER_NIC", "3")]), 3);
    assert_eq!(configured(None, &[("ACCORD_WORKERS_PER_NIC", "3")]), 3);
}

#[test]
fn chosen_poll_windows_stand_until_their_knobs_say_otherwise() {
    use std::time::Duration;
    let configured = |vars: &[(&str, &str)]| {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        let config = Engine::builder()
            .await_poll(Duration::from_millis(5))
            .shm_spin(Duration::from_millis(2))
            .configured(|n| vars.get(n).map(|v| v.to_string()))
            .unwrap();
        (config.await_poll, config.shm.spin)
    };
    assert_eq!(configured(&[]), (Duration::from_millis(5), Duration::from_millis(2)));
    let knobs = [("ACCORD_AWAIT_POLL_US", "100"), ("ACCORD_SHM_SPIN_US", "7")];
    assert_eq!(configured(&knobs), (Duration::from_micros(100), Duration::from_micros(7)));
}

#[test]
fn a_chosen_ring_size_stands_until_its_knob_says_otherwise() {
    let configured = |vars: &[(&str, &str)]| {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        let builder = Engine::builder().shm_ring_bytes(2 << 20);
        builder.configured(|n| vars.get(n).map(|v| v.to_string())).map(|c| c.shm.ring_bytes)
    };
    assert_eq!(configured(&[]).unwrap(), 2 << 20);
    assert_eq!(configured(&[("ACCORD_SHM_RING_BYTES", "1048576")]).unwrap(), 1 << 20);
    assert!(configured(&[("ACCORD_SHM_RING_BYTES", "1000000")]).is_err(), "the knob is still checked");
    let odd = Engine::builder().shm_ring_bytes(1000).configured(|_| None);
    assert!(odd.and_then(|c| c.validate()).is_err(), "a chosen size is checked like the knob's");
}

#[test]
fn addresses_and_descriptors_round_trip() {
    let a = engine(true);
    let addr = a.address();
    assert_eq!(EngineAddress::parse(&addr.to_string_compact()).unwrap(), addr);
    let buf = a.alloc(100).unwrap();
    let d = buf.descriptor();
    assert_eq!(MrDescriptor::parse(&d.to_string_compact()).unwrap(), d);
    assert!(MrDescriptor::parse("{").is_err());
    assert!(a.deregister(&buf.handle()));
    assert!(!a.deregister(&buf.handle()));
}

#[test]
fn taken_immediates_free_their_counters() {
    let (a, b) = pair(false);
    let src = a.alloc(64).unwrap();
    let dst = b.alloc(64).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let base = b.imm_counters_held();
    for imm in 1000..1100u32 {
        for _ in 0..3 {
            let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 64, imm: Some(imm) };
            a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
        }
        b.take_imm(imm, 2, WAIT).unwrap();
        b.take_imm(imm, 1, WAIT).unwrap();
    }
    assert_eq!(b.imm_counters_held(), base, "counters taken back to zero are freed");
    assert_eq!(b.take_imm(5, 1, std::time::Duration::from_millis(20)), Err(0), "nothing arrived: times out");
}

#[test]
fn a_receiver_that_leaves_right_after_the_data_landed_still_acknowledges_it() {
    for round in 0..20 {
        // The receiver loses a third of what it sends (its ACKs), so the writer often has to
        // ask again after the receiver already decided to leave.
        let lossy = FaultConfig { drop: 0.33, ..Default::default() };
        let a = Engine::builder().ignore_env().force_network(true).fault_injection(lossy, round).build().unwrap();
        let b = engine(true);
        a.add_peer(&b.address()).unwrap();
        b.add_peer(&a.address()).unwrap();
        let len = 256 * 1024;
        let src = b.alloc(len).unwrap();
        let dst = a.alloc(len).unwrap();
        src.fill(round as u8);
        let (h, d) = (src.handle(), dst.descriptor());
        // Open the connection first, retrying: a handshake whose first replies are all lost
        // gives up after its attempt limit (a protocol bound this test is not about; with the
        // receiver answering several hellos at once it happens for some seeds).
        let warm = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1, imm: None };
        let opened = (0..5).any(|_| b.write(&warm).unwrap().wait_timeout(WAIT).is_ok());
        assert!(opened, "round {round}: no connection after 5 handshakes");
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: Some(4) };
        let t = b.write(&op).unwrap();
        assert_eq!(a.imm_counter(4).wait(1, WAIT), 1);
        drop(dst);
        drop(a); // leaves the moment its data is in, before the writer heard back
        assert_eq!(t.wait_timeout(WAIT), Ok(()), "round {round}: the writer saw the receiver close first");
    }
}

#[test]
#[allow(unsafe_code)]
fn an_owned_registration_outlives_deregistration_while_a_transfer_reads_it() {
    let (a, b) = pair(true);
    let len = 1 << 20;
    let data = pattern(11, len);
    let owner = Arc::new(std::sync::Mutex::new(data.clone()));
    let ptr = owner.lock().unwrap().as_mut_ptr();
    let weak = Arc::downgrade(&owner);
    let dyn_owner: crate::MemoryOwner = owner.clone();
    // Safety: the Vec behind `owner` never moves or resizes and lives while `owner` does.
    let (h, _) = unsafe { a.register_raw_owned(ptr, len, crate::MemoryKind::Host, Some(dyn_owner)) }.unwrap();
    let dst = b.alloc(len).unwrap();
    let d = dst.descriptor();
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: len as u64, imm: None };
    let t = a.write(&op).unwrap();
    // Deregister and let go of our reference before the transfer is done: the transfer keeps
    // the memory alive.
    assert!(a.deregister(&h));
    drop(owner);
    t.wait_timeout(WAIT).unwrap();
    assert!(dst.to_vec() == data, "bytes read from the deregistered region differ");
    let deadline = std::time::Instant::now() + WAIT;
    while weak.upgrade().is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(weak.upgrade().is_none(), "the memory is freed once no transfer reads it");
}
