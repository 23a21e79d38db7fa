//! The host arena: one shared-memory file that every rank of a communicator on one host maps,
//! through which all_reduce moves its data without the engine (`Algo::Arena`).
//!
//! Why: a same-host CPU all_reduce through the engine moves every segment as a write (a copy
//! into a shared-memory ring, a copy out on the peer's worker thread, an immediate, a wait),
//! 2(p-1) dependent steps of them for ring. In the arena each rank copies its input in once,
//! reduces its own block of every rank's copy in place, and copies every reduced block out:
//! three flag barriers per chunk, no worker thread, no per-segment bookkeeping, no message per
//! call. On the 2-core machine it ran 2.4-3.8x the engine's all_reduce at 4 ranks from 256 KiB
//! and small calls 4.6-77x faster (`scripts/device/host_arena_vs_ring.sh`,
//! `docs/results/2026-11-27-host-arena.md`).
//!
//! Layout (64-bit words, then data): a header (magic, world size, slot bytes, a 128-bit token
//! rank 0 drew); per rank three cache lines, each holding one flag (`in`, `red`, `out`: the
//! last chunk number it reached in that phase) and, in the first, its pid and the call it is
//! in (sequence number, count, dtype, op); then two buffers of one slot of `slot_bytes` per
//! rank. No message crosses the engine per call: each rank checks the others' description of
//! the call after the first chunk's `in` barrier, before it reduces anything, so mismatched
//! calls fail naming the peer (ranks whose configurations pick different algorithms wait on
//! each other until the deadline, naming each other). Chunk `e` (numbered from 1 over the communicator's
//! life, the same on every rank) uses buffer `e % 2`:
//! 1. wait until every rank's `out` reached `e - 2` (the buffer's last readers are done);
//! 2. copy this rank's input chunk into its slot, publish `in = e` (release);
//! 3. wait for every `in` (acquire), reduce block `rank` of the chunk over every slot into
//!    this rank's slot (its own first, then the others in rank order), publish `red = e`;
//! 4. wait for every `red`, copy every rank's reduced block into the output, publish `out = e`.
//!
//! Every byte a rank writes in the data region is its own slot's, between barriers that keep
//! every reader out, so the plain copies never race. Trust is the engine's shared-memory
//! rings' (same user, same host): the file is 0600, created exclusively, checked by every
//! opener (owner, length, rank 0's token), and unlinked once every rank has it mapped.
//! Waits are bounded by the call's deadline and check each peer's process and the other
//! ranks' stuck reports; a failure names the rank through the collectives' usual blame.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use accord_engine::backoff::IdleBackoff;
use accord_engine::SharedMapping;

use crate::algo::{part, Algo, Args, Ctx, Handshake};
use crate::error::{CollError, TransportError};
use crate::reduce::{finish_avg, reduce_into};
use crate::transport::{BufSlice, CollTransport, Imm, STEP_DATA_MAX, STEP_HANDSHAKE};

/// "ACARENA1": a file that is not an arena is refused.
const MAGIC: u64 = 0x4143_4152_454e_4131;
const HEADER_WORDS: usize = 8;
/// One 64-byte line.
const LINE_WORDS: usize = 8;
/// Per rank: the `in` line (flag, pid), the `red` line, the `out` line.
const RANK_WORDS: usize = 3 * LINE_WORDS;
/// How often a wait that stopped spinning checks its peer's process, the stuck reports and
/// the deadline.
const CHECK_INTERVAL: Duration = Duration::from_millis(1);
/// Idle rounds of a wait before it sleeps (spins 64, then yields).
const ROUNDS_BEFORE_SLEEP: u32 = 4096;
const SLEEP: Duration = Duration::from_micros(20);

/// The three phases of a chunk, each a flag per rank.
#[derive(Copy, Clone, Debug)]
enum Phase {
    In,
    Reduced,
    Out,
}

impl Phase {
    fn word(self) -> usize {
        match self {
            Phase::In => 0,
            Phase::Reduced => LINE_WORDS,
            Phase::Out => 2 * LINE_WORDS,
        }
    }

    fn waiting_for(self) -> &'static str {
        match self {
            Phase::In => "its arena input",
            Phase::Reduced => "its arena reduction",
            Phase::Out => "its arena read-out",
        }
    }
}

/// A mapped arena, ready for all_reduce.
pub(crate) struct Arena {
    map: SharedMapping,
    n: usize,
    rank: usize,
    slot_bytes: usize,
    data_offset: usize,
    pids: Vec<u32>,
    /// Chunks this communicator moved through the arena (every rank the same).
    chunks_done: AtomicU64,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("path", &self.map.path()).field("slot_bytes", &self.slot_bytes).finish()
    }
}

/// Where the data region starts: after the flags, on a page.
fn data_offset(n: usize) -> usize {
    ((HEADER_WORDS + n * RANK_WORDS) * 8).next_multiple_of(4096)
}

/// The arena file's length for `n` ranks of `slot_bytes`.
fn arena_bytes(n: usize, slot_bytes: usize) -> Option<usize> {
    slot_bytes.checked_mul(2 * n)?.checked_add(data_offset(n))
}

/// This host's identity (the kernel's boot id): ranks that differ are on different hosts.
fn host_identity() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string())
}

/// A rank's first setup message: its host, pid and slot size; rank 0's also the file and token.
#[derive(Debug, PartialEq, Eq)]
struct Offer {
    host: String,
    pid: u32,
    slot_bytes: usize,
    path: String,
    token: u128,
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
        format!("{}\n{}\n{}\n{}\n{:032x}", self.host, self.pid, self.slot_bytes, self.path, self.token).into_bytes()
    }

    fn decode(bytes: &[u8]) -> Option<Offer> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut f = text.split('\n');
        let offer = Offer {
            host: f.next()?.to_string(),
            pid: f.next()?.parse().ok()?,
            slot_bytes: f.next()?.parse().ok()?,
            path: f.next()?.to_string(),
            token: u128::from_str_radix(f.next()?, 16).ok()?,
        };
        f.next().is_none().then_some(offer)
    }
}

/// Why a communicator has no arena, for the error of a call that forced one.
pub(crate) type Unavailable = String;

impl Arena {
    /// Maps an arena shared by every rank, or says why there is none: ranks on several
    /// hosts, a shared-memory directory that is full or not shared (containers), different
    /// slot sizes. Collective: every rank calls it in the same call, and every rank reaches
    /// the same answer. A peer that does not answer fails the call naming it.
    fn setup<T: CollTransport + ?Sized>(
        cx: &Ctx<'_, T>,
        a: &Args<'_>,
        slot_bytes: usize,
    ) -> Result<Result<Arena, Unavailable>, CollError> {
        let (me, n) = (cx.rank, cx.n);
        let host = host_identity().unwrap_or_default();
        let len = arena_bytes(n, slot_bytes);
        let created = match (me, len) {
            (0, Some(len)) if !host.is_empty() => {
                create(n, slot_bytes, len).map_err(|e| tracing::warn!(error = %e, "no host arena")).ok()
            }
            _ => None,
        };
        let offer = Offer {
            host,
            pid: std::process::id(),
            slot_bytes,
            path: created.as_ref().map(|(m, _)| m.path().display().to_string()).unwrap_or_default(),
            token: created.as_ref().map_or(0, |(_, token)| *token),
        };
        let blobs = exchange(cx, a, STEP_DATA_MAX, &offer.encode())?;
        let mut offers = Vec::with_capacity(n);
        for (peer, blob) in blobs.iter().enumerate() {
            let o = Offer::decode(blob).ok_or_else(|| {
                cx.transport(TransportError::Malformed { peer, reason: "an arena offer that does not parse".into() })
            })?;
            offers.push(o);
        }
        let first = &offers[0];
        let mapped = match (verdict(&offers, slot_bytes), created) {
            (Err(why), _) => Err(why),
            (Ok(()), Some((map, _))) => Ok(map),
            (Ok(()), None) => open(n, slot_bytes, len, &first.path, first.token),
        };
        let oks = exchange(cx, a, STEP_DATA_MAX - 1, &[u8::from(mapped.is_ok())])?;
        if let Some(r) = oks.iter().position(|b| b.as_slice() != [1]) {
            return Ok(Err(match mapped {
                Err(why) => why,
                Ok(_) => format!("rank {r} could not map the arena"),
            }));
        }
        let map = mapped.expect("every rank mapped it, this one included");
        if me == 0 {
            // Every rank has it mapped: the name can go, so nothing is left behind.
            if let Err(e) = map.unlink() {
                tracing::warn!(error = %e, "could not unlink the arena file");
            }
        }
        let arena = Arena {
            n,
            rank: me,
            slot_bytes,
            data_offset: data_offset(n),
            pids: offers.iter().map(|o| o.pid).collect(),
            chunks_done: AtomicU64::new(0),
            map,
        };
        arena.word(me, 1).store(u64::from(std::process::id()), Ordering::Relaxed);
        Ok(Ok(arena))
    }

    /// Rank `r`'s word `i` of its lines.
    fn word(&self, r: usize, i: usize) -> &AtomicU64 {
        &self.map.words()[HEADER_WORDS + r * RANK_WORDS + i]
    }

    fn publish(&self, phase: Phase, chunk: u64) {
        self.word(self.rank, phase.word()).store(chunk, Ordering::Release);
    }

    /// Writes this call's description into this rank's `in` line (published with the first
    /// chunk's `in`): every peer checks it before reducing, in place of a handshake message.
    fn describe<T: CollTransport + ?Sized>(&self, cx: &Ctx<'_, T>, a: &Args<'_>) {
        for (i, v) in describe(cx, a).into_iter().enumerate() {
            self.word(self.rank, DESCRIPTION_WORD + i).store(v, Ordering::Relaxed);
        }
    }

    /// Compares every peer's description of this call with this rank's (after the first
    /// chunk's `in` barrier, which publishes them).
    fn check_peers<T: CollTransport + ?Sized>(&self, cx: &Ctx<'_, T>, a: &Args<'_>) -> Result<(), CollError> {
        let mine = describe(cx, a);
        for r in (0..self.n).filter(|&r| r != self.rank) {
            let theirs: Vec<u64> =
                (0..mine.len()).map(|i| self.word(r, DESCRIPTION_WORD + i).load(Ordering::Relaxed)).collect();
            let field = match (0..mine.len()).find(|&i| mine[i] != theirs[i]) {
                None => continue,
                Some(0) => "call (sequence number: the ranks called different collectives before this one)",
                Some(1) => "count",
                Some(_) => "dtype, op or collective",
            };
            let show = |v: &[u64]| format!("seq {} count {} kind {:#x}", v[0], v[1], v[2]);
            return Err(CollError::Mismatch {
                collective: cx.collective.name(),
                peer: r,
                field,
                ours: show(&mine),
                theirs: show(&theirs),
            });
        }
        Ok(())
    }

    /// Byte offset of rank `r`'s slot in buffer `b`.
    fn slot(&self, b: usize, r: usize) -> usize {
        self.data_offset + (b * self.n + r) * self.slot_bytes
    }

    /// Waits until every other rank reached `chunk` in `phase`.
    fn wait_all<T: CollTransport + ?Sized>(
        &self,
        cx: &Ctx<'_, T>,
        a: &Args<'_>,
        phase: Phase,
        chunk: u64,
    ) -> Result<(), CollError> {
        for r in (0..self.n).filter(|&r| r != self.rank) {
            let flag = self.word(r, phase.word());
            if flag.load(Ordering::Acquire) >= chunk {
                continue;
            }
            let start = Instant::now();
            let mut backoff = IdleBackoff::new(ROUNDS_BEFORE_SLEEP, SLEEP);
            let mut last_check = start;
            let mut on_board = None;
            while flag.load(Ordering::Acquire) < chunk {
                if !backoff.will_spin() {
                    let now = Instant::now();
                    on_board.get_or_insert_with(|| cx.progress.waiting(r, phase.waiting_for(), None, 1));
                    if now.duration_since(last_check) >= CHECK_INTERVAL {
                        last_check = now;
                        self.check_waiting_on(cx, a, r, start)?;
                    }
                }
                backoff.after_round(false);
            }
        }
        Ok(())
    }

    /// While waiting on `r`: fails if its process is gone, another rank reported being stuck,
    /// or the call's deadline passed.
    fn check_waiting_on<T: CollTransport + ?Sized>(
        &self,
        cx: &Ctx<'_, T>,
        a: &Args<'_>,
        r: usize,
        start: Instant,
    ) -> Result<(), CollError> {
        if let Some(e) = on_another_algorithm(cx, a, r) {
            return Err(e);
        }
        let pid = self.pids[r];
        if !accord_sys::process_alive(pid) {
            let reason = format!("its process (pid {pid} on this host) exited");
            return Err(cx.fail(TransportError::PeerDied { peer: r, reason }, &[r]));
        }
        if let Some(&(reported_by, waiting_on)) = cx.t.stuck_reports().first() {
            return Err(cx.fail(TransportError::Aborted { reported_by, waiting_on }, &[r]));
        }
        if Instant::now() >= cx.deadline {
            let what = format!("rank {r} to finish {} in the host arena", match_phase_words(self, r));
            return Err(cx.fail(TransportError::Timeout { what, waited: start.elapsed() }, &[r]));
        }
        Ok(())
    }
}

/// Rank `r`'s flags in words, for a timeout's message.
fn match_phase_words(a: &Arena, r: usize) -> String {
    let f = |p: Phase| a.word(r, p.word()).load(Ordering::Relaxed);
    format!("a chunk (it reached in {}, reduced {}, out {})", f(Phase::In), f(Phase::Reduced), f(Phase::Out))
}

/// Whether every rank can share rank 0's arena, from everyone's offer (the same answer on
/// every rank, as every rank sees the same offers).
fn verdict(offers: &[Offer], slot_bytes: usize) -> Result<(), Unavailable> {
    let first = &offers[0];
    if first.path.is_empty() {
        Err("rank 0 could not create the arena file".to_string())
    } else if let Some(r) = offers.iter().position(|o| o.host != first.host || o.host.is_empty()) {
        Err(format!("rank {r} is on another host than rank 0"))
    } else if let Some(r) = offers.iter().position(|o| o.slot_bytes != slot_bytes) {
        Err(format!("rank {r} asks for arena slots of {} bytes, this rank {slot_bytes}", offers[r].slot_bytes))
    } else {
        Ok(())
    }
}

/// Every rank's `blob` for setup step `step` of this call, in rank order; a peer that fails
/// to answer is blamed by the collectives' usual rules, and one that runs another algorithm
/// in this call is a mismatch (see [`on_another_algorithm`]).
fn exchange<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    step: u32,
    blob: &[u8],
) -> Result<Vec<Vec<u8>>, CollError> {
    let tag = Imm::new(cx.seq, step, 0).encode();
    for peer in (0..cx.n).filter(|&p| p != cx.rank) {
        cx.t.send_ctrl(peer, tag, blob).map_err(|e| cx.fail(e, &[peer]))?;
    }
    let mut blobs = Vec::with_capacity(cx.n);
    for peer in 0..cx.n {
        if peer == cx.rank {
            blobs.push(blob.to_vec());
            continue;
        }
        let _waiting = cx.progress.waiting(peer, "the arena's setup", None, 1);
        loop {
            let slice = cx.deadline.min(Instant::now() + CHECK_INTERVAL);
            match cx.t.recv_ctrl(peer, tag, slice) {
                Ok(b) => {
                    blobs.push(b);
                    break;
                }
                Err(TransportError::Timeout { .. }) if Instant::now() < cx.deadline => {
                    if let Some(e) = on_another_algorithm(cx, a, peer) {
                        return Err(e);
                    }
                }
                Err(e) => return Err(cx.fail(e, &[peer])),
            }
        }
    }
    Ok(blobs)
}

/// Whether `peer` sent this call's handshake, so runs one of the transport's schedules while
/// this rank runs the arena (their `ACCORD_ALGO_ALL_REDUCE` or `ACCORD_COLL_ARENA` differ):
/// then this rank answers with its own handshake, naming the arena, so `peer` fails at once
/// with the same mismatch instead of waiting out its deadline, and returns the mismatch.
fn on_another_algorithm<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>, peer: usize) -> Option<CollError> {
    let theirs = cx.t.recv_ctrl(peer, cx.imm(STEP_HANDSHAKE, peer), Instant::now()).ok()?;
    let _ = cx.t.send_ctrl(peer, cx.imm(STEP_HANDSHAKE, cx.rank), &cx.handshake_of(a, false).encode());
    let algo = Handshake::decode(&theirs)
        .ok()
        .and_then(|h| cx.collective.algorithms().iter().find(|x| x.code() == h.algo).copied())
        .map_or("?", Algo::name);
    Some(CollError::Mismatch {
        collective: cx.collective.name(),
        peer,
        field: "algorithm (set ACCORD_ALGO_* and ACCORD_COLL_ARENA identically everywhere)",
        ours: Algo::Arena.name().to_string(),
        theirs: algo.to_string(),
    })
}

/// Whether this communicator has an arena, mapping it first if it has not tried yet
/// (collective: every rank asks in the same call).
pub(crate) fn available<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    arena: &OnceLock<Result<Arena, Unavailable>>,
    slot_bytes: usize,
) -> Result<bool, CollError> {
    if arena.get().is_none() {
        let made = Arena::setup(cx, a, slot_bytes)?;
        if let Err(why) = &made {
            tracing::info!(reason = %why, "all_reduce runs without the host arena");
        }
        let _ = arena.set(made);
    }
    Ok(matches!(arena.get(), Some(Ok(_))))
}

/// Runs an arena all_reduce, mapping the arena first if this communicator has not tried yet.
pub(crate) fn run<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    arena: &OnceLock<Result<Arena, Unavailable>>,
    slot_bytes: usize,
) -> Result<(), CollError> {
    available(cx, a, arena, slot_bytes)?;
    match arena.get() {
        Some(Ok(arena)) => all_reduce(cx, a, arena),
        Some(Err(why)) => Err(CollError::InvalidArgument {
            collective: cx.collective.name(),
            reason: format!("the arena algorithm needs every rank on one host, sharing /dev/shm: {why}"),
        }),
        None => unreachable!("set above"),
    }
}

/// Where a rank's call description starts in its `in` line (after the flag and the pid).
const DESCRIPTION_WORD: usize = 2;

/// One call, as three words: its sequence number, its count, and dtype, op and collective.
fn describe<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> [u64; 3] {
    let kind = u64::from(a.dtype.code()) | u64::from(a.op.code()) << 8 | u64::from(cx.collective.code()) << 16;
    [cx.seq, a.count as u64, kind]
}

/// Rank 0's side: a new file with the header and a fresh token.
fn create(n: usize, slot_bytes: usize, len: usize) -> Result<(SharedMapping, u128), String> {
    use std::io::Read;
    let mut random = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(|e| format!("no random token: {e}"))?;
    let token = u128::from_le_bytes(random);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let path = PathBuf::from(format!("/dev/shm/accord-arena-{}-{nanos}", std::process::id()));
    let map = SharedMapping::create(&path, len).map_err(|e| e.to_string())?;
    let w = map.words();
    w[1].store(n as u64, Ordering::Relaxed);
    w[2].store(slot_bytes as u64, Ordering::Relaxed);
    w[3].store(token as u64, Ordering::Relaxed);
    w[4].store((token >> 64) as u64, Ordering::Relaxed);
    w[0].store(MAGIC, Ordering::Release);
    Ok((map, token))
}

/// Another rank's side: the file rank 0 named, checked against what it said.
fn open(n: usize, slot_bytes: usize, len: Option<usize>, path: &str, token: u128) -> Result<SharedMapping, String> {
    let len = len.ok_or("an arena of that size does not fit this machine's addresses")?;
    let map = SharedMapping::open(std::path::Path::new(path), len).map_err(|e| e.to_string())?;
    let w = map.words();
    let header = [w[0].load(Ordering::Acquire), w[1].load(Ordering::Relaxed), w[2].load(Ordering::Relaxed)];
    let theirs = u128::from(w[3].load(Ordering::Relaxed)) | (u128::from(w[4].load(Ordering::Relaxed)) << 64);
    if header != [MAGIC, n as u64, slot_bytes as u64] || theirs != token {
        return Err(format!("{path} is not the arena rank 0 created"));
    }
    Ok(map)
}

/// all_reduce through the arena (see the module's protocol). `a.send` and `a.recv` may be
/// the same region.
fn all_reduce<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>, arena: &Arena) -> Result<(), CollError> {
    let (me, n, es) = (cx.rank, cx.n, a.es());
    arena.describe(cx, a);
    let chunk_elems = arena.slot_bytes / es;
    if chunk_elems == 0 {
        return Err(CollError::InvalidArgument {
            collective: cx.collective.name(),
            reason: format!(
                "an arena slot of {} bytes holds no {} element; raise ACCORD_COLL_ARENA_SLOT_BYTES",
                arena.slot_bytes, a.dtype
            ),
        });
    }
    let mut base = 0;
    while base < a.count {
        let len = chunk_elems.min(a.count - base);
        let chunk = arena.chunks_done.fetch_add(1, Ordering::Relaxed) + 1;
        let b = (chunk % 2) as usize;
        if chunk > 2 {
            arena.wait_all(cx, a, Phase::Out, chunk - 2)?;
        }
        // 2. This rank's input chunk into its slot.
        let input = a.send.sub(base * es, len * es);
        cx.t.access_local(input, input.buf.slice(0, 0), &mut |s, _| {
            // SAFETY (of `bytes_mut`): this rank's slot in buffer `b`; every other rank last
            // read it before publishing `out >= chunk - 2` (waited for above) and reads it
            // next only after our `in = chunk` (published below, after this copy).
            #[allow(unsafe_code)]
            let slot = unsafe { arena.map.bytes_mut(arena.slot(b, me), s.len()) };
            slot.expect("the slot lies in the arena").copy_from_slice(s);
        })
        .map_err(|e| cx.transport(e))?;
        arena.publish(Phase::In, chunk);
        arena.wait_all(cx, a, Phase::In, chunk)?;
        if base == 0 {
            // The same call everywhere, or a clear mismatch before anything is reduced.
            arena.check_peers(cx, a)?;
        }
        // 3. Block `me` of the chunk, reduced into this rank's slot.
        let block = part(len, n, me);
        if !block.is_empty() {
            let (off, bytes) = (block.start * es, block.len() * es);
            // SAFETY: block `me` of this rank's slot is written by this rank alone (the others
            // read only their own blocks of it until our `red = chunk`), and every slot's
            // block `me` is stable: its owner published `in = chunk` after writing it.
            #[allow(unsafe_code)]
            let acc = unsafe { arena.map.bytes_mut(arena.slot(b, me) + off, bytes) }.expect("in the arena");
            for r in (0..n).filter(|&r| r != me) {
                #[allow(unsafe_code)]
                let other = unsafe { arena.map.bytes(arena.slot(b, r) + off, bytes) }.expect("in the arena");
                reduce_into(acc, other, a.dtype, a.op)
                    .map_err(|source| CollError::Reduce { collective: cx.collective.name(), source })?;
            }
            finish_avg(acc, a.dtype, a.op, n)
                .map_err(|source| CollError::Reduce { collective: cx.collective.name(), source })?;
        }
        arena.publish(Phase::Reduced, chunk);
        arena.wait_all(cx, a, Phase::Reduced, chunk)?;
        // 4. Every reduced block into the output.
        for r in 0..n {
            let block = part(len, n, r);
            if block.is_empty() {
                continue;
            }
            let (off, bytes) = (block.start * es, block.len() * es);
            let out: BufSlice<'_> = a.recv.sub((base + block.start) * es, bytes);
            cx.t.access_local(out.buf.slice(0, 0), out, &mut |_, d| {
                // SAFETY: rank `r` published `red = chunk` after its last write to this block,
                // and nobody writes this slot again before our `out = chunk` (published below).
                #[allow(unsafe_code)]
                let reduced = unsafe { arena.map.bytes(arena.slot(b, r) + off, bytes) };
                d.copy_from_slice(reduced.expect("in the arena"));
            })
            .map_err(|e| cx.transport(e))?;
        }
        arena.publish(Phase::Out, chunk);
        base += len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_round_trips_and_garbage_is_refused() {
        let o =
            Offer { host: "h".into(), pid: 7, slot_bytes: 1 << 20, path: "/dev/shm/x".into(), token: u128::MAX - 3 };
        assert_eq!(Offer::decode(&o.encode()), Some(o));
        assert_eq!(Offer::decode(b"h\n7\n1\n/p"), None);
        assert_eq!(Offer::decode(b"h\nseven\n1\n/p\n00"), None);
        assert_eq!(Offer::decode(b"h\n7\n1\n/p\n00\nextra"), None);
        assert_eq!(Offer::decode(&[0xff, 0xfe]), None);
    }

    fn ctx<'a>(
        t: &'a crate::LocalTransport,
        progress: &'a crate::report::Progress,
        timeout: Duration,
    ) -> Ctx<'a, crate::LocalTransport> {
        Ctx {
            t,
            collective: crate::Collective::AllReduce,
            algo: crate::Algo::Arena,
            seq: 1,
            rank: t.rank(),
            n: t.world_size(),
            deadline: Instant::now() + timeout,
            timeout,
            abort_grace: Duration::from_millis(1),
            progress,
        }
    }

    fn args(buf: &crate::LocalBuf) -> Args<'_> {
        Args {
            send: buf.all(),
            recv: buf.all(),
            count: 2,
            dtype: crate::DType::F32,
            op: crate::ReduceOp::Sum,
            root: 0,
            scratch: None,
            chunks: 1,
            segment_elems: 1,
            layout: None,
        }
    }

    /// Three ranks map one arena; a wait on a phase nobody reached ends at the deadline
    /// naming the first rank behind, and the arena's file is gone once everyone mapped it.
    #[test]
    fn ranks_map_one_arena_and_a_wait_names_the_rank_behind() {
        let ts = crate::LocalFabric::create(3).unwrap();
        let arenas: Vec<Arena> = std::thread::scope(|s| {
            let hs: Vec<_> = ts
                .iter()
                .map(|t| {
                    s.spawn(move || {
                        let progress = crate::report::Progress::new(t.rank(), 3, "c".into(), None);
                        let buf = t.register(vec![0u8; 8]).unwrap();
                        Arena::setup(&ctx(t, &progress, Duration::from_secs(10)), &args(&buf), 4096).unwrap().unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(!arenas[0].map.path().exists(), "the arena file is unlinked once mapped");
        assert_eq!(arenas[1].pids, vec![std::process::id(); 3]);
        arenas[2].publish(Phase::In, 5);
        let progress = crate::report::Progress::new(0, 3, "c".into(), None);
        let cx = ctx(&ts[0], &progress, Duration::from_millis(30));
        let buf = ts[0].register(vec![0u8; 8]).unwrap();
        let e = arenas[0].wait_all(&cx, &args(&buf), Phase::In, 5).unwrap_err();
        assert!(matches!(&e, CollError::Timeout { missing, .. } if missing == &[1]), "{e}");
        assert_eq!(ts[2].stuck_reports(), vec![(0, 1)], "the others are told whom rank 0 waited for");
    }

    #[test]
    fn another_host_another_slot_size_or_no_file_means_no_arena() {
        let o = |host: &str, slot_bytes: usize, path: &str| Offer {
            host: host.into(),
            pid: 1,
            slot_bytes,
            path: path.into(),
            token: 0,
        };
        assert_eq!(verdict(&[o("a", 64, "/dev/shm/x"), o("a", 64, "")], 64), Ok(()));
        let why = verdict(&[o("a", 64, "/dev/shm/x"), o("a", 64, ""), o("b", 64, "")], 64).unwrap_err();
        assert!(why.contains("rank 2 is on another host"), "{why}");
        let why = verdict(&[o("a", 64, "/dev/shm/x"), o("a", 128, "")], 64).unwrap_err();
        assert!(why.contains("rank 1 asks for arena slots of 128 bytes"), "{why}");
        let why = verdict(&[o("a", 64, ""), o("a", 64, "")], 64).unwrap_err();
        assert!(why.contains("could not create"), "{why}");
        assert!(verdict(&[o("", 64, "/dev/shm/x"), o("", 64, "")], 64).is_err(), "an unknown host is no host");
    }

    #[test]
    fn the_data_region_starts_on_a_page_after_the_flags() {
        for n in [1, 2, 7, 64, 1024] {
            let d = data_offset(n);
            assert_eq!(d % 4096, 0);
            assert!(d >= (HEADER_WORDS + n * RANK_WORDS) * 8);
        }
        assert_eq!(arena_bytes(usize::MAX, 2), None);
    }
}
