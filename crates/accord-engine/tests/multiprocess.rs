//! Multi-process tests on loopback: each process is a child running `mp_child`
//! (`accord_testkit`, its role the scenario), processes exchange addresses through the parent,
//! and every byte written, paged, scattered and sent is checked.

use accord_engine::{
    Engine, EngineAddress, EngineId, FaultConfig, MrBuffer, MrDescriptor, PagedReadOp, PagedWriteOp, ReadOp,
    ScatterDst, ShmConfig, StridedPagedWriteOp, SubmitError, Transfer, TransferError, WriteOp,
};

use accord_testkit::{hear, say, Group, Spawn};
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SLICE: usize = 1 << 20;
const PAGE: usize = 16 * 1024;
const PAGES: usize = 16;
const SCATTER: usize = 64 * 1024;
const SEND_LEN: usize = 3000;
const IMM_WRITE: u32 = 1;
/// Random writes each process sends each peer (each with `IMM_WRITE`).
const WRITES_PER_PEER: usize = 24;
const IMM_PAGED: u32 = 2;
const IMM_SCATTER: u32 = 3;
const IMM_BARRIER: u32 = 0xB0;
const IMM_READ: u32 = 4;
const IMM_STRIDED: u32 = 5;
/// Strided paged writes: pages of this size, read every third page of the sender's slice
/// (from byte `STRIDED_SRC_AT`) and landing in every other page slot after `STRIDED_DST_AT`.
const STRIDED_PAGE: usize = 4096;
const STRIDED_PAGES: usize = 8;
const STRIDED_SRC_AT: usize = 100;
const STRIDED_DST_AT: usize = 64;
const WAIT: Duration = Duration::from_secs(60);
const CHILD_DEADLINE: Duration = Duration::from_secs(90);

/// Region layout per receiving engine, for sender `k` of `n`.
fn slice_at(k: usize) -> usize {
    k * SLICE
}
fn paged_at(n: usize, k: usize) -> usize {
    n * SLICE + k * PAGES * PAGE
}
fn scatter_at(n: usize, k: usize) -> usize {
    n * SLICE + n * PAGES * PAGE + k * SCATTER
}
fn strided_at(n: usize, k: usize) -> usize {
    scatter_at(n, n) + k * (STRIDED_DST_AT + 2 * STRIDED_PAGES * STRIDED_PAGE)
}
fn region_len(n: usize) -> usize {
    strided_at(n, n)
}
/// (source page, destination page) of the strided write from `from` to `to`.
fn strided_pages(from: usize, to: usize) -> (Vec<u64>, Vec<u64>) {
    let mut src: Vec<u64> = (0..STRIDED_PAGES as u64).collect();
    src.shuffle(&mut ChaCha8Rng::seed_from_u64(seed(10, from, to)));
    (src, (0..STRIDED_PAGES as u64).rev().collect())
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}
fn seed(kind: u64, from: usize, to: usize) -> u64 {
    kind << 32 | (from as u64) << 16 | to as u64
}
/// Destination page of source page `i` for the pair (from, to): a seeded permutation.
fn page_map(from: usize, to: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..PAGES).collect();
    p.shuffle(&mut ChaCha8Rng::seed_from_u64(seed(9, from, to)));
    p
}

#[derive(Serialize, Deserialize, Clone)]
struct Hello {
    address: EngineAddress,
    region: MrDescriptor,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scenario {
    Clean,
    Lossy,
    TwoNicsOneCut,
    /// Shared memory cannot be set up (the ring directory is missing): everything over UDP.
    NoShm,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Clean => "clean",
            Scenario::Lossy => "lossy",
            Scenario::TwoNicsOneCut => "twonic",
            Scenario::NoShm => "noshm",
        }
    }
    fn parse(s: &str) -> Scenario {
        match s {
            "lossy" => Scenario::Lossy,
            "twonic" => Scenario::TwoNicsOneCut,
            "noshm" => Scenario::NoShm,
            _ => Scenario::Clean,
        }
    }
}

fn build(scenario: Scenario, me: usize) -> Engine {
    let b = Engine::builder().ignore_env().idle_timeout(Duration::from_millis(400));
    let b = match scenario {
        Scenario::Clean => b,
        Scenario::Lossy => {
            // With the pull route on: its control messages then cross the lossy transport too.
            let f = FaultConfig { drop: 0.01, reorder: 0.01, ..FaultConfig::default() };
            b.fault_injection(f, 17 + me as u64).cma(true)
        }
        Scenario::TwoNicsOneCut => b
            .nics(["127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap()])
            .shard_bytes_min(256 * 1024)
            .fault_injection(FaultConfig::default(), 5),
        Scenario::NoShm => b.shm(ShmConfig { dir: "/nonexistent/accord-shm-test".into(), ..ShmConfig::default() }),
    };
    b.build().expect("engine builds")
}

/// The body of one process.
fn child(me: usize, n: usize, scenario: Scenario) -> Result<(), String> {
    let engine = build(scenario, me);
    let region = engine.alloc(region_len(n)).map_err(|e| e.to_string())?;
    let src = engine.alloc(region_len(n)).map_err(|e| e.to_string())?;
    // Source layout mirrors the destination: what `me` sends to `j` sits where `j` expects it.
    for j in 0..n {
        src.write_at(j * SLICE, &bytes(seed(1, me, j), SLICE)).unwrap();
        src.write_at(paged_at(n, j), &bytes(seed(2, me, j), PAGES * PAGE)).unwrap();
    }
    src.write_at(scatter_at(n, 0), &bytes(seed(3, me, 0), n * SCATTER)).unwrap();
    let hello = Hello { address: engine.address(), region: region.descriptor() };
    let all = exchange_hellos(&hello)?;
    let ids: Vec<EngineId> = all.iter().map(|h| h.address.id).collect();
    for h in &all {
        if h.address.id != engine.id() {
            engine.add_peer(&h.address).map_err(|e| e.to_string())?;
        }
    }
    let received = Arc::new(Mutex::new(vec![]));
    let r = received.clone();
    engine.post_recvs(4096, 64, move |m| r.lock().unwrap().push((m.data.to_vec(), m.imm)));
    engine.barrier(&ids, IMM_BARRIER, WAIT).map_err(|e| format!("first barrier: {e}"))?;

    let mut transfers: Vec<(String, Transfer)> = vec![];
    let mut rng = ChaCha8Rng::seed_from_u64(seed(4, me, 0));
    let h = src.handle();
    for (j, peer) in all.iter().enumerate().filter(|(j, _)| *j != me) {
        let d = peer.region;
        // Random writes: the slice cut into random pieces, submitted in random order, one of
        // them large enough to be sharded across NICs.
        // Exactly WRITES_PER_PEER pieces, so the receiver knows its immediate count exactly.
        let mut cuts = std::collections::BTreeSet::from([0usize, SLICE / 2, SLICE]);
        while cuts.len() < WRITES_PER_PEER + 1 {
            cuts.insert(rng.gen_range(SLICE / 2..SLICE));
        }
        let cuts: Vec<usize> = cuts.into_iter().collect();
        let mut pieces: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1] - w[0])).collect();
        pieces.shuffle(&mut rng);
        for (off, len) in pieces {
            let at = (slice_at(me) + off) as u64;
            let src_at = (j * SLICE + off) as u64;
            let op =
                WriteOp { src: &h, src_offset: src_at, dst: &d, dst_offset: at, len: len as u64, imm: Some(IMM_WRITE) };
            transfers.push((format!("write to {j}"), engine.write(&op).map_err(|e| e.to_string())?));
        }
        let src_pages: Vec<u64> = (0..PAGES).map(|i| (paged_at(n, j) / PAGE + i) as u64).collect();
        let dst_pages: Vec<u64> = page_map(me, j).iter().map(|&p| (paged_at(n, me) / PAGE + p) as u64).collect();
        let op = PagedWriteOp {
            src: &h,
            dst: &d,
            page_bytes: PAGE as u64,
            src_pages: &src_pages,
            dst_pages: &dst_pages,
            imm: Some(IMM_PAGED),
        };
        transfers.push((format!("paged to {j}"), engine.write_paged(&op).map_err(|e| e.to_string())?));
        let (src_pages, dst_pages) = strided_pages(me, j);
        let op = StridedPagedWriteOp {
            src: &h,
            src_offset: (j * SLICE + STRIDED_SRC_AT) as u64,
            src_stride: 3 * STRIDED_PAGE as u64,
            dst: &d,
            dst_offset: (strided_at(n, me) + STRIDED_DST_AT) as u64,
            dst_stride: 2 * STRIDED_PAGE as u64,
            page_bytes: STRIDED_PAGE as u64,
            src_pages: &src_pages,
            dst_pages: &dst_pages,
            imm: Some(IMM_STRIDED),
        };
        transfers.push((format!("strided to {j}"), engine.write_paged_strided(&op).map_err(|e| e.to_string())?));
        let msg = bytes(seed(5, me, j), SEND_LEN);
        transfers.push((
            format!("send to {j}"),
            engine.send(peer.address.id, &msg, Some(me as u32)).map_err(|e| e.to_string())?,
        ));
    }
    let dsts: Vec<ScatterDst> = (0..n)
        .filter(|j| *j != me)
        .map(|j| ScatterDst {
            dst: all[j].region,
            dst_offset: scatter_at(n, me) as u64,
            src_offset: (scatter_at(n, 0) + j * SCATTER) as u64,
            len: SCATTER as u64,
        })
        .collect();
    transfers.push(("scatter".into(), engine.scatter(&h, &dsts, Some(IMM_SCATTER)).map_err(|e| e.to_string())?));
    if scenario == Scenario::TwoNicsOneCut && me == 0 {
        assert!(engine.cut_nic(1), "NIC 1 has a fault injector");
    }
    for (what, t) in &transfers {
        t.wait_timeout(WAIT).map_err(|e| format!("{what}: {e}"))?;
    }
    let peers = (n - 1) as u64;
    let expected =
        [(IMM_PAGED, peers), (IMM_SCATTER, peers), (IMM_STRIDED, peers), (IMM_WRITE, peers * WRITES_PER_PEER as u64)];
    for (imm, target) in expected {
        let got = engine.imm_counter(imm).wait(target, WAIT);
        if got < target {
            return Err(format!("imm {imm}: counted {got}, expected {target}"));
        }
    }
    engine.barrier(&ids, IMM_BARRIER, WAIT).map_err(|e| format!("second barrier: {e}"))?;
    // Exact, not at least: a write resent after a failover must not count twice (its tag is
    // deduplicated). Checked after the barrier, when any duplicate would have arrived.
    for (imm, target) in expected {
        let got = engine.imm_counter(imm).value();
        if got != target {
            return Err(format!("imm {imm}: counted {got}, expected exactly {target}"));
        }
    }

    read_back(&engine, &all, me, n)?;
    read_back_batched(&engine, &all, me, n)?;

    let got = region.to_vec();
    for k in (0..n).filter(|k| *k != me) {
        if got[slice_at(k)..slice_at(k) + SLICE] != bytes(seed(1, k, me), SLICE)[..] {
            return Err(format!("random writes from {k} differ"));
        }
        let sent = bytes(seed(2, k, me), PAGES * PAGE);
        for (i, p) in page_map(k, me).into_iter().enumerate() {
            let at = paged_at(n, k) + p * PAGE;
            if got[at..at + PAGE] != sent[i * PAGE..(i + 1) * PAGE] {
                return Err(format!("page {i} from {k} differs"));
            }
        }
        let slice = bytes(seed(1, k, me), SLICE);
        let (src_pages, dst_pages) = strided_pages(k, me);
        for (s, d) in src_pages.into_iter().zip(dst_pages) {
            let at = strided_at(n, k) + STRIDED_DST_AT + d as usize * 2 * STRIDED_PAGE;
            let from = STRIDED_SRC_AT + s as usize * 3 * STRIDED_PAGE;
            if got[at..at + STRIDED_PAGE] != slice[from..from + STRIDED_PAGE] {
                return Err(format!("strided page {s} from {k} differs"));
            }
        }
        let gap = strided_at(n, k)..strided_at(n, k) + STRIDED_DST_AT;
        if got[gap].iter().any(|&b| b != 0) {
            return Err(format!("the strided write from {k} wrote before its offset"));
        }
        let scattered = bytes(seed(3, k, 0), n * SCATTER);
        if got[scatter_at(n, k)..scatter_at(n, k) + SCATTER] != scattered[me * SCATTER..(me + 1) * SCATTER] {
            return Err(format!("scatter from {k} differs"));
        }
    }
    let deadline = Instant::now() + WAIT;
    while received.lock().unwrap().len() < n - 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut msgs = received.lock().unwrap().clone();
    msgs.sort_by_key(|m| m.1);
    let expected: Vec<(Vec<u8>, Option<u32>)> =
        (0..n).filter(|k| *k != me).map(|k| (bytes(seed(5, k, me), SEND_LEN), Some(k as u32))).collect();
    if msgs != expected {
        return Err(format!("sends differ: got {} messages, expected {}", msgs.len(), expected.len()));
    }
    let stats = engine.stats();
    if scenario == Scenario::TwoNicsOneCut && me == 0 && stats.failovers() == 0 {
        return Err("NIC 1 was cut but nothing failed over".into());
    }
    // Same host: the bytes went through shared memory, unless it could not be set up.
    let shm_sent = stats.shm_datagrams_sent();
    match scenario {
        Scenario::NoShm if shm_sent != 0 => return Err(format!("{shm_sent} datagrams over shm without a ring dir")),
        Scenario::Clean | Scenario::Lossy if shm_sent == 0 => {
            return Err(format!("nothing went through shared memory: {:?}", stats.lanes[0].shm))
        }
        _ => {}
    }
    eprintln!(
        "process {me}: failovers {} retransmits {} faults {:?} shm {:?} pulls {:?}",
        stats.failovers(),
        stats.retransmits(),
        stats.faults.first(),
        stats.lanes.first().and_then(|l| l.shm),
        engine.cma_stats()
    );
    engine.barrier(&ids, IMM_BARRIER, WAIT).map_err(|e| format!("last barrier: {e}"))?;
    // Let the last acknowledgements leave before the engine closes.
    std::thread::sleep(Duration::from_millis(300));
    Ok(())
}

/// READs from every peer, once everything was written: the slice this process wrote there and
/// its paged pages, as one range each, byte-exact with one immediate counted here per read;
/// a read with a forged key is refused by the owner and places nothing.
fn read_back(engine: &Engine, all: &[Hello], me: usize, n: usize) -> Result<(), String> {
    let paged_len = PAGES * PAGE;
    let into = engine.alloc(n * (SLICE + paged_len)).map_err(|e| e.to_string())?;
    let h = into.handle();
    let mut reads = vec![];
    for (j, peer) in all.iter().enumerate().filter(|(j, _)| *j != me) {
        let d = peer.region;
        let slice = ReadOp {
            dst: &h,
            dst_offset: (j * SLICE) as u64,
            src: &d,
            src_offset: slice_at(me) as u64,
            len: SLICE as u64,
            imm: Some(IMM_READ),
        };
        let pages = ReadOp {
            dst: &h,
            dst_offset: (n * SLICE + j * paged_len) as u64,
            src: &d,
            src_offset: paged_at(n, me) as u64,
            len: paged_len as u64,
            imm: Some(IMM_READ),
        };
        for op in [slice, pages] {
            reads.push((format!("read from {j}"), engine.read(&op).map_err(|e| e.to_string())?));
        }
        let forged = MrDescriptor { key: d.key ^ 1, ..d };
        let op = ReadOp { dst: &h, dst_offset: 0, src: &forged, src_offset: 0, len: 64, imm: Some(IMM_READ) };
        expect_refused(engine.read(&op), &format!("a read with a forged key from {j}"))?;
    }
    wait_counted_once_each(engine, &reads, IMM_READ, "reads")?;
    let got = into.to_vec();
    if me == 0 && got[..SLICE].iter().any(|&b| b != 0) {
        return Err("the refused read placed bytes".into());
    }
    for j in (0..n).filter(|j| *j != me) {
        if got[j * SLICE..(j + 1) * SLICE] != bytes(seed(1, me, j), SLICE)[..] {
            return Err(format!("the slice read from {j} differs"));
        }
        let sent = bytes(seed(2, me, j), paged_len);
        let at = n * SLICE + j * paged_len;
        for (i, p) in page_map(me, j).into_iter().enumerate() {
            if got[at + p * PAGE..at + (p + 1) * PAGE] != sent[i * PAGE..(i + 1) * PAGE] {
                return Err(format!("page {i} read from {j} differs"));
            }
        }
    }
    Ok(())
}

/// `what` (a transfer made with a forged key) must fail as refused by its owner.
fn expect_refused(transfer: Result<Transfer, SubmitError>, what: &str) -> Result<(), String> {
    match transfer.map_err(|e| e.to_string())?.wait_timeout(WAIT) {
        Err(TransferError::Rejected(_)) => Ok(()),
        other => Err(format!("{what}: {other:?}")),
    }
}

/// Waits for every named transfer in `transfers`, then checks that `imm` was counted here
/// exactly once per transfer (`what` names them in the error).
fn wait_counted_once_each(
    engine: &Engine,
    transfers: &[(String, Transfer)],
    imm: u32,
    what: &str,
) -> Result<(), String> {
    for (name, t) in transfers {
        t.wait_timeout(WAIT).map_err(|e| format!("{name}: {e}"))?;
    }
    let (counted, target) = (engine.imm_counter(imm).value(), transfers.len() as u64);
    if counted != target {
        return Err(format!("{what} counted {counted}, expected exactly {target}"));
    }
    Ok(())
}

/// Planes and pages of the batched read of a slice: the slice seen as `BATCH_PLANES` planes of
/// `SLICE / BATCH_PLANES` bytes, pages of `BATCH_PAGE`; pages `BATCH_SRC` of every plane land at
/// pages 0.. of planes `BATCH_DST_PLANE` bytes apart.
const BATCH_PLANES: usize = 16;
const BATCH_PAGE: usize = 4096;
const BATCH_SRC: [u64; 5] = [15, 2, 3, 9, 0];
const BATCH_DST_PLANE: usize = 8 * BATCH_PAGE;
const IMM_BATCHED: u32 = 6;

/// Batched READs from every peer, once everything was written: this process's paged pages
/// back in the order it sent them (the page map inverted, one request naming every page), and
/// scattered pages of every plane of its slice (one request, `BATCH_PLANES` planes), byte-exact,
/// one immediate counted here per batched read; a forged key is refused and places nothing.
fn read_back_batched(engine: &Engine, all: &[Hello], me: usize, n: usize) -> Result<(), String> {
    let paged_len = PAGES * PAGE;
    let planes_len = BATCH_PLANES * BATCH_DST_PLANE;
    let into = engine.alloc(n * (paged_len + planes_len)).map_err(|e| e.to_string())?;
    let h = into.handle();
    let mut reads = vec![];
    for (j, peer) in all.iter().enumerate().filter(|(j, _)| *j != me) {
        let d = peer.region;
        // Sent page i landed at page_map[i] there: read page_map[i] into page i here.
        let src_pages: Vec<u64> = page_map(me, j).into_iter().map(|p| p as u64).collect();
        let dst_pages: Vec<u64> = (0..PAGES as u64).collect();
        let pages = PagedReadOp {
            dst: &h,
            dst_offset: (j * paged_len) as u64,
            dst_stride: PAGE as u64,
            src: &d,
            src_offset: paged_at(n, me) as u64,
            src_stride: PAGE as u64,
            page_bytes: PAGE as u64,
            src_pages: &src_pages,
            dst_pages: &dst_pages,
            planes: 1,
            src_plane_stride: 0,
            dst_plane_stride: 0,
            imm: Some(IMM_BATCHED),
        };
        let dst_ids: Vec<u64> = (0..BATCH_SRC.len() as u64).collect();
        let planes = PagedReadOp {
            dst_offset: (n * paged_len + j * planes_len) as u64,
            src_offset: slice_at(me) as u64,
            src_stride: BATCH_PAGE as u64,
            dst_stride: BATCH_PAGE as u64,
            page_bytes: BATCH_PAGE as u64,
            src_pages: &BATCH_SRC,
            dst_pages: &dst_ids,
            planes: BATCH_PLANES as u64,
            src_plane_stride: (SLICE / BATCH_PLANES) as u64,
            dst_plane_stride: BATCH_DST_PLANE as u64,
            ..pages
        };
        for op in [pages, planes] {
            reads.push((format!("batched read from {j}"), engine.read_paged(&op).map_err(|e| e.to_string())?));
        }
        let forged = MrDescriptor { key: d.key ^ 1, ..d };
        let op = PagedReadOp { src: &forged, imm: Some(IMM_BATCHED), ..pages };
        expect_refused(engine.read_paged(&op), &format!("a batched read with a forged key from {j}"))?;
    }
    wait_counted_once_each(engine, &reads, IMM_BATCHED, "batched reads")?;
    let got = into.to_vec();
    for j in (0..n).filter(|j| *j != me) {
        if got[j * paged_len..(j + 1) * paged_len] != bytes(seed(2, me, j), paged_len)[..] {
            return Err(format!("the pages batch-read from {j} differ from those sent"));
        }
        let slice = bytes(seed(1, me, j), SLICE);
        let at = n * paged_len + j * planes_len;
        for p in 0..BATCH_PLANES {
            let plane = &slice[p * (SLICE / BATCH_PLANES)..];
            for (i, &s) in BATCH_SRC.iter().enumerate() {
                let (s, d) = (s as usize * BATCH_PAGE, at + p * BATCH_DST_PLANE + i * BATCH_PAGE);
                if got[d..d + BATCH_PAGE] != plane[s..s + BATCH_PAGE] {
                    return Err(format!("plane {p}, page {i} batch-read from {j} differs"));
                }
            }
            let tail = at + p * BATCH_DST_PLANE + BATCH_SRC.len() * BATCH_PAGE;
            if got[tail..at + (p + 1) * BATCH_DST_PLANE].iter().any(|&b| b != 0) {
                return Err(format!("bytes placed between plane {p}'s pages from {j}"));
            }
        }
    }
    Ok(())
}

#[test]
fn mp_child() {
    let Some(ctx) = accord_testkit::child() else { return };
    let (me, n) = (ctx.rank, ctx.ranks);
    let result = match ctx.role.as_str() {
        "kill" => kill_child(me),
        "killread" => kill_read_child(me, false),
        "killbatchedread" => kill_read_child(me, true),
        scenario => child(me, n, Scenario::parse(scenario)),
    };
    match result {
        Ok(()) => say("OK"),
        Err(e) => say(&format!("FAIL {e}")),
    }
}

/// Bytes of each write in the kill test.
const KILL_WRITE: usize = 8 << 20;

/// Prints this process's hello for the parent and reads back every process's, in rank order.
fn exchange_hellos(hello: &Hello) -> Result<Vec<Hello>, String> {
    say(&format!("ADDR {}", serde_json::to_string(hello).unwrap()));
    let line = hear().ok_or("the parent sent no addresses")?;
    serde_json::from_str(&line).map_err(|e| e.to_string())
}

/// A kill test's engine: a short idle timeout, so the survivor notices the killed process soon.
fn kill_engine() -> Result<Engine, String> {
    Engine::builder().ignore_env().idle_timeout(Duration::from_millis(400)).build().map_err(|e| e.to_string())
}

/// Trades hellos (this engine and its `region`) with the other process of a kill test, adds it
/// as a peer and returns its hello.
fn meet_the_other(engine: &Engine, region: &MrBuffer, me: usize) -> Result<Hello, String> {
    let mut all = exchange_hellos(&Hello { address: engine.address(), region: region.descriptor() })?;
    let peer = all.swap_remove(1 - me);
    engine.add_peer(&peer.address).map_err(|e| e.to_string())?;
    Ok(peer)
}

/// The victim of a kill test, once it said "LANDED": waits for the parent's kill until `deadline`.
fn wait_to_be_killed(deadline: Instant) -> Result<(), String> {
    say("LANDED");
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("was not killed".into())
}

/// Process 0 writes to process 1 over shared memory, byte-exact, until the parent kills
/// process 1 (after "STARTED"); then a write must fail with an error, not hang.
fn kill_child(me: usize) -> Result<(), String> {
    let engine = kill_engine()?;
    let region = engine.alloc(KILL_WRITE).map_err(|e| e.to_string())?;
    let peer = meet_the_other(&engine, &region, me)?;
    let deadline = Instant::now() + CHILD_DEADLINE;
    if me == 1 {
        // The victim: checks the first write landed exactly, then waits to be killed.
        let got = engine.imm_counter(IMM_WRITE).wait(1, WAIT);
        if got < 1 || region.to_vec() != bytes(seed(7, 0, 1), KILL_WRITE) {
            return Err("the first write did not land byte-exact".into());
        }
        return wait_to_be_killed(deadline);
    }
    let src = engine.alloc(KILL_WRITE).map_err(|e| e.to_string())?;
    src.write_at(0, &bytes(seed(7, 0, 1), KILL_WRITE)).unwrap();
    let h = src.handle();
    let op = WriteOp {
        src: &h,
        src_offset: 0,
        dst: &peer.region,
        dst_offset: 0,
        len: KILL_WRITE as u64,
        imm: Some(IMM_WRITE),
    };
    let mut writes = 0u64;
    while Instant::now() < deadline {
        let result = engine.write(&op).map_err(|e| e.to_string())?.wait_timeout(WAIT);
        match result {
            Ok(()) => {
                writes += 1;
                if writes == 1 {
                    let sent = engine.stats().shm_datagrams_sent();
                    if sent == 0 {
                        return Err("the first write did not go through shared memory".into());
                    }
                    say("STARTED");
                }
            }
            Err(TransferError::Timeout) => return Err("a write to the killed peer hung".into()),
            Err(e) if writes > 0 => {
                eprintln!("after {writes} writes, as expected: {e}");
                return Ok(());
            }
            Err(e) => return Err(format!("the first write failed: {e}")),
        }
    }
    Err("writes kept succeeding after the peer was killed".into())
}

/// Process 0 reads from process 1 (one READ of the whole region, or with `batched` a batched
/// READ of it as 64 planes of 32 pages, every other page), byte-exact, until the parent kills
/// process 1 (after "STARTED"); then a read must fail naming process 1's engine, not hang.
fn kill_read_child(me: usize, batched: bool) -> Result<(), String> {
    let engine = kill_engine()?;
    let region = engine.alloc(KILL_WRITE).map_err(|e| e.to_string())?;
    region.write_at(0, &bytes(seed(8, me, 0), KILL_WRITE)).unwrap();
    let peer = meet_the_other(&engine, &region, me)?;
    let deadline = Instant::now() + CHILD_DEADLINE;
    if me == 1 {
        // The owner: serves reads until it is killed.
        return wait_to_be_killed(deadline);
    }
    let h = region.handle();
    let op = ReadOp { dst: &h, dst_offset: 0, src: &peer.region, src_offset: 0, len: KILL_WRITE as u64, imm: None };
    // Every other 2 KiB page of 64 planes of 128 KiB, at the same place here.
    let (page, planes) = (2048u64, 64u64);
    let ids: Vec<u64> = (0..KILL_WRITE as u64 / planes / page).step_by(2).collect();
    let batch = PagedReadOp {
        dst: &h,
        dst_offset: 0,
        dst_stride: page,
        src: &peer.region,
        src_offset: 0,
        src_stride: page,
        page_bytes: page,
        src_pages: &ids,
        dst_pages: &ids,
        planes,
        src_plane_stride: KILL_WRITE as u64 / planes,
        dst_plane_stride: KILL_WRITE as u64 / planes,
        imm: None,
    };
    let mut reads = 0u64;
    while Instant::now() < deadline {
        let read = if batched { engine.read_paged(&batch) } else { engine.read(&op) };
        match read.map_err(|e| e.to_string())?.wait_timeout(WAIT) {
            Ok(()) => {
                reads += 1;
                if reads == 1 {
                    let (got, theirs, mine) =
                        (region.to_vec(), bytes(seed(8, 1, 0), KILL_WRITE), bytes(seed(8, me, 0), KILL_WRITE));
                    // A batched read writes every other page; the others keep this process's bytes.
                    let landed = |at: usize| !batched || (at as u64 / page) % 2 == 0;
                    if (0..KILL_WRITE).step_by(page as usize).any(|at| {
                        let want = if landed(at) { &theirs } else { &mine };
                        got[at..at + page as usize] != want[at..at + page as usize]
                    }) {
                        return Err("the first read did not land byte-exact".into());
                    }
                    say("STARTED");
                }
            }
            Err(TransferError::Timeout) => return Err("a read from the killed peer hung".into()),
            Err(TransferError::NoReply { peer: named, waited_ms }) if reads > 0 => {
                if named != peer.address.id.0 {
                    return Err(format!("the failed read named {named:x}, not the killed peer"));
                }
                eprintln!("after {reads} reads, as expected: no reply in {waited_ms} ms");
                return Ok(());
            }
            // Same host: the liveness watcher sees the process exit before any reply is due.
            Err(TransferError::PeerDied { peer: named, cause }) if reads > 0 => {
                if named != peer.address.id {
                    return Err(format!("the failed read named {named:?}, not the killed peer"));
                }
                eprintln!("after {reads} reads, as expected: the peer died ({cause})");
                return Ok(());
            }
            Err(e) => return Err(format!("read {} failed without naming the peer: {e}", reads + 1)),
        }
    }
    Err("reads kept succeeding after the peer was killed".into())
}

#[test]
fn peer_killed_mid_read() {
    run_kill("killread");
}

#[test]
fn peer_killed_mid_batched_read() {
    run_kill("killbatchedread");
}

#[test]
fn peer_killed_mid_transfer_over_shared_memory() {
    run_kill("kill");
}

/// Runs the two processes of `role`, kills process 1 once process 0 started and process 1 is
/// ready, and checks process 0 said OK.
fn run_kill(role: &str) {
    let mut group = start(2, role);
    let mut hellos: Vec<Option<String>> = vec![None; 2];
    let (mut started, mut landed, mut killed) = (false, false, false);
    let outcome = loop {
        let (me, msg) = group.said().unwrap_or_else(|f| panic!("{role}: {f}"));
        if let Some(addr) = msg.strip_prefix("ADDR ") {
            hellos[me] = Some(addr.to_string());
            relay_addresses_once_all_known(&hellos, &mut group);
        } else if msg == "STARTED" {
            started = true;
        } else if msg == "LANDED" {
            landed = true;
        } else if me == 0 {
            break msg;
        } else {
            panic!("{role}: the victim said {msg}");
        }
        if started && landed && !killed {
            group.kill(1);
            killed = true;
        }
    };
    assert!(killed, "the victim was never killed: {outcome:?}");
    assert_eq!(outcome, "OK");
    group.finish().unwrap();
}

#[test]
fn two_processes_without_shared_memory() {
    run_group(2, Scenario::NoShm);
}

/// Starts `n` processes running `mp_child` as `role`; each says `@@`-marked lines.
fn start(n: usize, role: &str) -> Group {
    // The children's own deadline, and time to say how it passed.
    let bound = CHILD_DEADLINE + Duration::from_secs(30);
    Spawn::new("mp_child", n).role(role).bound(bound).start().expect("spawn the test processes")
}

/// Once every child said its address, sends the list to all of them (once: when the last
/// one arrives).
fn relay_addresses_once_all_known(hellos: &[Option<String>], group: &mut Group) {
    if hellos.iter().any(Option::is_none) {
        return;
    }
    let list = format!("[{}]", hellos.iter().map(|h| h.clone().unwrap()).collect::<Vec<_>>().join(","));
    group.send_all(&list).expect("every process hears the addresses");
}

/// Spawns `n` processes running `scenario`, relays addresses, and checks every one said OK.
fn run_group(n: usize, scenario: Scenario) {
    let mut group = start(n, scenario.name());
    let mut hellos: Vec<Option<String>> = vec![None; n];
    let mut results: Vec<Option<String>> = vec![None; n];
    while results.iter().any(Option::is_none) {
        let (me, msg) = group.said().unwrap_or_else(|f| panic!("{scenario:?} x{n}: results so far {results:?}: {f}"));
        if let Some(addr) = msg.strip_prefix("ADDR ") {
            hellos[me] = Some(addr.to_string());
            relay_addresses_once_all_known(&hellos, &mut group);
        } else {
            results[me] = Some(msg);
        }
    }
    group.finish().unwrap_or_else(|f| panic!("{scenario:?} x{n}: {f}"));
    for (me, r) in results.iter().enumerate() {
        assert_eq!(r.as_deref(), Some("OK"), "{scenario:?} x{n}: process {me}");
    }
}

/// One test per (processes, scenario), named for both: each runs [`run_group`].
macro_rules! group_tests {
    ($($name:ident: $n:expr, $scenario:ident;)*) => {
        $(
            #[test]
            fn $name() {
                run_group($n, Scenario::$scenario);
            }
        )*
    };
}

group_tests! {
    two_processes: 2, Clean;
    four_processes: 4, Clean;
    two_processes_loss_and_reordering: 2, Lossy;
    four_processes_loss_and_reordering: 4, Lossy;
    two_nics_one_cut_mid_transfer: 2, TwoNicsOneCut;
}
