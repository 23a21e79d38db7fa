//! The host arena: one shared-memory file that every rank of a communicator on one host maps,
//! through which all_reduce moves its data without the engine (`Algo::Arena`).
//!
//! Why: a same-host CPU all_reduce through the engine moves every segment as a write (a copy
//! into a shared-memory ring, a copy out on the peer's worker thread, an immediate, a wait),
//! 2(p-1) dependent steps of them for ring. In the arena each rank copies its input in once,
//! reduces its own block of every rank's copy in place, and copies every reduced block out:
//! one wait for all ranks per chunk, no engine worker, no per-segment bookkeeping, no message
//! per call. On idle cores of the 2-core machine it ran 1.0-2.6x the engine's all_reduce at 16-64
//! MiB and small calls 6.7-66x faster, and CPU DDP steps 2.5-28% faster; on cores kept busy
//! by other work it was 9-22% slower at 64 MiB (each wait for all ranks costs a scheduling turn
//! there) (`scripts/device/host_arena_vs_ring.sh`, `docs/results/2026-11-27-host-arena.md`).
//!
//! Layout (64-bit words, then data): a header (magic, world size, slot bytes, a 128-bit token
//! rank 0 drew, lanes); per lane and rank three cache lines: its step counter in the first
//! (and, in lane 0's lines only, the rank's pid and the call it is in: sequence number, count,
//! dtype, op), its bell and the count of waiters asleep on it (futex words) in the third; then
//! per lane three buffers of one slot of `slot_bytes` per rank.
//! A call moves its vector in chunks of a slot, pipelined over steps numbered over the
//! communicator's life (the same on every rank). At step s a rank:
//! 1. copies its input's chunk s into its slot of buffer s % 3;
//! 2. reduces block `rank` of chunk s - 1 over every rank's slot, in place in its own;
//! 3. copies every rank's reduced block of chunk s - 2 into its output;
//! 4. publishes its step (release, and rings its bell) and waits until every rank has
//!    published it (acquire), except at a call's last step (below).
//!
//! A call of k chunks takes k + 2 steps; its last only reads out, so it neither publishes nor
//! waits (see `run_lane`): k + 1 waits for all ranks, two for a one-chunk call.
//!
//! Lanes: a call of 4k slots is cut into k (at most `lanes`) contiguous parts, each moved by a
//! thread of its own (lane 0: the caller's) through its own copy of the protocol (its own
//! lines, steps and buffers). Lane l of every rank pairs with lane l of the others only, so a
//! rank's lanes never wait on each other; a lane whose thread cannot be started runs on the
//! caller's thread after lane 0, in lane order, which every rank's such lanes share, so no
//! circle of waits forms. One thread copies at one core's memory speed; DDP's buckets are tens
//! of MiB, and while the backward pass holds the cores, more threads also get more of them. A
//! lane that fails makes its siblings' waits give way, and only the first takes the blame path.
//!
//! No message crosses the engine per call: every lane of every rank checks the others'
//! description of the call after its first step's wait, before it reduces anything, so
//! mismatched calls fail naming the peer, with nothing written to any output (ranks whose
//! configurations pick different algorithms find each other's handshakes and fail too).
//!
//! Every byte a rank writes in the data region is its own slot's, between barriers that keep
//! every reader out, so the plain copies never race. Trust is the engine's shared-memory
//! rings' (same user, same host): the file is 0600, created exclusively, checked by every
//! opener (owner, length, rank 0's token), and unlinked once every rank has it mapped.
//! Waits are bounded by the call's deadline and check each peer's process and the other
//! ranks' stuck reports; a failure names the rank through the collectives' usual blame.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use accord_engine::SharedMapping;

use crate::algo::{part, Args, Ctx};
use crate::error::{CollError, TransportError};
use crate::reduce::{finish_avg, reduce_into};
use crate::transport::{BufSlice, CollTransport};

mod setup;

/// "ACARENA1": a file that is not an arena is refused.
pub(super) const MAGIC: u64 = 0x4143_4152_454e_4131;
pub(super) const HEADER_WORDS: usize = 8;
/// One 64-byte line.
const LINE_WORDS: usize = 8;
/// Per rank: the first line (step, pid, call description), a spare line, the third line (bell
/// and sleepers).
const RANK_WORDS: usize = 3 * LINE_WORDS;
/// How often a wait that stopped spinning checks its peer's process, the stuck reports and
/// the deadline.
const CHECK_INTERVAL: Duration = Duration::from_millis(1);
/// How often a wait looks for a peer's handshake (a peer on another algorithm): a scan of
/// every peer's inbox, so rarer than the other checks.
pub(super) const DETECT_INTERVAL: Duration = Duration::from_millis(10);
/// Rounds a wait only spins (tens of microseconds: a peer on a core of its own answers within
/// them), then rounds it yields, before it sleeps in the kernel on the peer's bell.
const SPIN_ROUNDS: u32 = 64;
const YIELD_ROUNDS: u32 = 4096;

/// Buffers of one slot per rank: chunk k fills buffer k % 3 while chunk k - 1 is reduced in
/// the next and chunk k - 2 read out of the third, one wait for all ranks per step (none
/// after a call's last, see `run_lane`).
const BUFFERS: usize = 3;
/// Where a rank's step counter is (the first word of its first line).
const STEP_WORD: usize = 0;

/// A call uses one more lane per this many slots of its bytes (up to the arena's lanes), so
/// every lane's pipeline has a few chunks and a thread's start (tens of microseconds) is
/// small beside its copies.
const SLOTS_PER_LANE: usize = 4;

/// The arena's shape, which every rank must share: the chunk and the most lanes a call uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub slot_bytes: usize,
    pub lanes: usize,
}

impl Shape {
    /// Whole 8-byte words per slot (every slot aligned for every dtype), at least one lane.
    pub(crate) fn new(slot_bytes: usize, lanes: usize) -> Shape {
        Shape { slot_bytes: slot_bytes.max(8).next_multiple_of(8), lanes: lanes.max(1) }
    }
}

/// A mapped arena, ready for all_reduce.
pub(crate) struct Arena {
    map: SharedMapping,
    n: usize,
    rank: usize,
    slot_bytes: usize,
    lanes: usize,
    data_offset: usize,
    /// Step numbers each lane used up (every rank the same), the one each call skips
    /// included.
    steps_done: Vec<AtomicU64>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("path", &self.map.path())
            .field("slot_bytes", &self.slot_bytes)
            .field("lanes", &self.lanes)
            .finish()
    }
}

/// Where the data region starts: after the flags, on a page.
fn data_offset(n: usize, lanes: usize) -> Option<usize> {
    let words = lanes.checked_mul(n)?.checked_mul(RANK_WORDS)?.checked_add(HEADER_WORDS)?;
    words.checked_mul(8)?.checked_next_multiple_of(4096)
}

/// The arena file's length for `n` ranks of `shape`.
pub(super) fn arena_bytes(n: usize, shape: Shape) -> Option<usize> {
    let slots = BUFFERS.checked_mul(n)?.checked_mul(shape.lanes)?;
    shape.slot_bytes.checked_mul(slots)?.checked_add(data_offset(n, shape.lanes)?)
}

/// Why a lane stopped early.
enum LaneStop {
    /// It failed: the call's error.
    Failed(CollError),
    /// Another lane of this rank failed, so this one gave up its wait.
    Sibling,
}

impl From<CollError> for LaneStop {
    fn from(e: CollError) -> LaneStop {
        LaneStop::Failed(e)
    }
}

/// Why a communicator has no arena, for the error of a call that forced one.
pub(crate) type Unavailable = String;

impl Arena {
    /// The arena of `map` for `rank` of `n` (the setup wrote every rank's pid into it).
    fn new(map: SharedMapping, n: usize, rank: usize, shape: Shape) -> Arena {
        let data_offset = data_offset(n, shape.lanes).expect("the setup sized the file by this offset");
        let steps_done = (0..shape.lanes).map(|_| AtomicU64::new(0)).collect();
        Arena { n, rank, slot_bytes: shape.slot_bytes, lanes: shape.lanes, data_offset, steps_done, map }
    }

    /// Rank `r`'s word `i` of its lines in lane 0 (pid and call description live there).
    fn word(&self, r: usize, i: usize) -> &AtomicU64 {
        self.lane_word(0, r, i)
    }

    /// Rank `r`'s word `i` of its lines in `lane`.
    fn lane_word(&self, lane: usize, r: usize, i: usize) -> &AtomicU64 {
        &self.map.words()[word_index(lane * self.n + r, i)]
    }

    /// How many lanes a call of `bytes` uses: the same on every rank for the same call.
    fn lanes_for(&self, bytes: usize) -> usize {
        (bytes / SLOTS_PER_LANE.saturating_mul(self.slot_bytes)).clamp(1, self.lanes)
    }

    /// Publishes that this rank finished `step` of `lane`, then rings its bell: a peer asleep
    /// on it (see [`Self::sleep_on`]) is woken, with a system call only when one sleeps.
    fn publish(&self, lane: usize, step: u64) {
        self.lane_word(lane, self.rank, STEP_WORD).store(step, Ordering::Release);
        let (bell, sleepers) = self.bell(lane, self.rank);
        bell.fetch_add(1, Ordering::SeqCst);
        if sleepers.load(Ordering::SeqCst) > 0 {
            accord_sys::futex::wake_all(bell);
        }
    }

    /// Rank `r`'s bell in `lane` (rung at every publish) and the count of waiters asleep on
    /// it, 32-bit words of its third line for the futex.
    fn bell(&self, lane: usize, r: usize) -> (&AtomicU32, &AtomicU32) {
        let words = self.map.words32();
        let line = lane * self.n + r;
        (&words[2 * word_index(line, BELL_WORD)], &words[2 * word_index(line, SLEEPERS_WORD)])
    }

    /// Sleeps until rank `r` publishes again in `lane` (or `CHECK_INTERVAL` passes), unless
    /// `flag` already reached `step`. Counted as a sleeper first and the bell read after, so a
    /// publish either sees the sleeper and wakes it or changed the bell before the wait.
    fn sleep_on(&self, lane: usize, r: usize, flag: &AtomicU64, step: u64) {
        let (bell, sleepers) = self.bell(lane, r);
        sleepers.fetch_add(1, Ordering::SeqCst);
        let rung = bell.load(Ordering::SeqCst);
        if flag.load(Ordering::Acquire) < step {
            accord_sys::futex::wait(bell, rung, CHECK_INTERVAL);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Writes this call's description into this rank's first line (published with the call's
    /// first step): every peer checks it before reducing, in place of a handshake message.
    fn describe<T: CollTransport + ?Sized>(&self, cx: &Ctx<'_, T>, a: &Args<'_>) {
        for (i, v) in describe(cx, a).into_iter().enumerate() {
            self.word(self.rank, DESCRIPTION_WORD + i).store(v, Ordering::Relaxed);
        }
    }

    /// Compares every peer's description of this call with this rank's (after the call's first
    /// wait for all ranks, which publishes them).
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

    /// Byte offset of rank `r`'s slot in buffer `b` of `lane`.
    fn slot(&self, lane: usize, b: usize, r: usize) -> usize {
        self.data_offset + ((lane * BUFFERS + b) * self.n + r) * self.slot_bytes
    }

    /// Waits until every other rank finished `step` of `lane`, or another lane of this rank
    /// failed (`siblings_failed`).
    fn wait_all<T: CollTransport + ?Sized>(
        &self,
        cx: &Ctx<'_, T>,
        a: &Args<'_>,
        lane: usize,
        step: u64,
        siblings_failed: &AtomicBool,
    ) -> Result<(), LaneStop> {
        for r in (0..self.n).filter(|&r| r != self.rank) {
            let flag = self.lane_word(lane, r, STEP_WORD);
            if flag.load(Ordering::Acquire) >= step {
                continue;
            }
            let start = Instant::now();
            let (mut last_check, mut last_scan) = (start, start);
            let mut on_board = None;
            let mut rounds = 0u32;
            while flag.load(Ordering::Acquire) < step {
                rounds = rounds.saturating_add(1);
                if rounds <= SPIN_ROUNDS {
                    std::hint::spin_loop();
                    continue;
                }
                if siblings_failed.load(Ordering::Relaxed) {
                    return Err(LaneStop::Sibling);
                }
                let now = Instant::now();
                on_board.get_or_insert_with(|| cx.progress.waiting(r, "its arena step", None, 1));
                if now.duration_since(last_scan) >= DETECT_INTERVAL {
                    last_scan = now;
                    if let Some(e) = setup::on_another_algorithm(cx, a) {
                        return Err(e.into());
                    }
                }
                if now.duration_since(last_check) >= CHECK_INTERVAL {
                    last_check = now;
                    self.check_waiting_on(cx, lane, r, start, siblings_failed)?;
                }
                if rounds <= SPIN_ROUNDS + YIELD_ROUNDS {
                    std::thread::yield_now();
                } else {
                    self.sleep_on(lane, r, flag, step);
                }
            }
        }
        Ok(())
    }

    /// `PeerDied` if rank `r`'s process has exited. Every rank wrote its pid before the setup
    /// ended, and the setup checked that all share one pid namespace, so the number names the
    /// same process here.
    fn exited(&self, r: usize) -> Option<TransportError> {
        if r >= self.n {
            return None; // a report from the wire names a rank this arena does not have
        }
        let pid = self.word(r, PID_WORD).load(Ordering::Acquire) as u32;
        (pid != 0 && !accord_sys::process_alive(pid)).then(|| TransportError::PeerDied {
            peer: r,
            reason: format!("its process (pid {pid} on this host) exited"),
        })
    }

    /// While waiting on `r` in `lane`: fails if its process is gone, another rank reported
    /// being stuck, or the call's deadline passed. Only the first lane of this rank to fail
    /// takes the blame path (reports, stuck files, the grace wait); the others give way.
    fn check_waiting_on<T: CollTransport + ?Sized>(
        &self,
        cx: &Ctx<'_, T>,
        lane: usize,
        r: usize,
        start: Instant,
        siblings_failed: &AtomicBool,
    ) -> Result<(), LaneStop> {
        let failure = if let Some(died) = self.exited(r) {
            died
        } else if let Some(&(reported_by, waiting_on)) = cx.t.stuck_reports().first() {
            // The rank that reported waits for a rank of this host: if that one's process is
            // gone, say so here too (following the reports alone would only say it stopped
            // responding).
            self.exited(waiting_on).unwrap_or(TransportError::Aborted { reported_by, waiting_on })
        } else if Instant::now() >= cx.deadline {
            let what = format!("rank {r} to finish {} in the host arena", step_reached(self, lane, r));
            TransportError::Timeout { what, waited: start.elapsed() }
        } else {
            return Ok(());
        };
        if siblings_failed.swap(true, Ordering::SeqCst) {
            return Err(LaneStop::Sibling);
        }
        Err(LaneStop::Failed(cx.fail(failure, &[r])))
    }
}

/// Rank `r`'s flags in words, for a timeout's message.
fn step_reached(a: &Arena, lane: usize, r: usize) -> String {
    let reached = a.lane_word(lane, r, STEP_WORD).load(Ordering::Relaxed);
    if a.lanes == 1 {
        format!("its step (it reached step {reached})")
    } else {
        format!("its step of lane {lane} (it reached step {reached})")
    }
}

/// Whether this communicator has an arena, mapping it first if it has not tried yet
/// (collective: every rank asks in the same call). `dir` is the transport's shared-memory
/// directory; `None` (shared memory off, or every byte forced onto the network) means none.
pub(crate) fn available<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    arena: &OnceLock<Result<Arena, Unavailable>>,
    shape: Shape,
) -> Result<bool, CollError> {
    if arena.get().is_none() {
        let made = match cx.t.host_memory_dir() {
            Some(dir) => setup::setup(cx, a, &dir, shape)?,
            None => {
                Err("the transport keeps every byte on its own routes (ACCORD_SHM=0 or ACCORD_FORCE_NETWORK=1)".into())
            }
        };
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
    shape: Shape,
    streaming_min_bytes: usize,
) -> Result<(), CollError> {
    available(cx, a, arena, shape)?;
    let streamed = streaming_min_bytes > 0 && a.count * a.es() >= streaming_min_bytes;
    match arena.get() {
        Some(Ok(arena)) => all_reduce(cx, a, arena, streamed),
        Some(Err(why)) => Err(CollError::InvalidArgument {
            collective: cx.collective.name(),
            reason: format!(
                "the arena algorithm needs every rank on one host, sharing its shared-memory directory: {why}"
            ),
        }),
        None => Err(CollError::InvalidArgument {
            collective: cx.collective.name(),
            reason: "the host arena was set up by another thread at once".into(),
        }),
    }
}

/// Where a rank's pid is in its first line (after the step).
const PID_WORD: usize = 1;
/// Where a rank's bell and its sleepers' count are (64-bit words of its third line, each used
/// as one 32-bit futex word through its low half).
const BELL_WORD: usize = 2 * LINE_WORDS + 4;
const SLEEPERS_WORD: usize = 2 * LINE_WORDS + 5;

/// Word `i` of the `line`-th set of lines (lane l's of rank r: l * n + r), as an index into
/// the mapping's words.
fn word_index(line: usize, i: usize) -> usize {
    HEADER_WORDS + line * RANK_WORDS + i
}

/// Rank `r`'s pid word (the setup writes it before the rank answers rank 0).
pub(super) fn pid_word(r: usize) -> usize {
    word_index(r, PID_WORD)
}
/// Where a rank's call description starts in its first line (after the step and the pid).
const DESCRIPTION_WORD: usize = 2;

/// One call, as three words: its sequence number, its count, and dtype, op and collective.
fn describe<T: CollTransport + ?Sized>(cx: &Ctx<'_, T>, a: &Args<'_>) -> [u64; 3] {
    let kind = u64::from(a.dtype.code()) | u64::from(a.op.code()) << 8 | u64::from(cx.collective.code()) << 16;
    [cx.seq, a.count as u64, kind]
}

/// all_reduce through the arena (see the module's protocol). `a.send` and `a.recv` may be
/// the same region.
/// `streamed`: the reduced blocks go into the output with streaming stores (see
/// `CollConfig::arena_streaming_min_bytes`).
fn all_reduce<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    arena: &Arena,
    streamed: bool,
) -> Result<(), CollError> {
    arena.describe(cx, a);
    let chunk_elems = arena.slot_bytes / a.es();
    if chunk_elems == 0 {
        return Err(CollError::InvalidArgument {
            collective: cx.collective.name(),
            reason: format!(
                "an arena slot of {} bytes holds no {} element; raise ACCORD_COLL_ARENA_SLOT_BYTES",
                arena.slot_bytes, a.dtype
            ),
        });
    }
    let lanes = arena.lanes_for(a.count * a.es());
    let siblings_failed = AtomicBool::new(false);
    let lane = |l: usize| {
        let moves = Moves { chunk_elems, streamed };
        let run = || run_lane(cx, a, arena, l, part(a.count, lanes, l), moves, &siblings_failed);
        // A panic (a bug) ends this lane with an error and the others' waits with it.
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
            Err(LaneStop::Failed(CollError::InvalidArgument {
                collective: cx.collective.name(),
                reason: format!("arena lane {l} panicked (a bug in accord)"),
            }))
        });
        if done.is_err() {
            siblings_failed.store(true, Ordering::SeqCst);
        }
        done
    };
    if lanes == 1 {
        return first_failure(cx, vec![lane(0)]);
    }
    let lane = &lane;
    let results: Vec<Result<(), LaneStop>> = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..lanes)
            .map(|l| {
                (l, std::thread::Builder::new().name(format!("accord-arena-{l}")).spawn_scoped(s, move || lane(l)))
            })
            .collect();
        let mut results = vec![lane(0)];
        // A lane whose thread did not start runs here, before any join and in lane order: lane
        // l waits only on lane l of the others, whose own such lanes also run in lane order, so
        // no rank's lanes end up waiting on each other in a circle.
        let mut started = Vec::new();
        for (l, helper) in helpers {
            match helper {
                Ok(h) => started.push(h),
                Err(_) => results.push(lane(l)),
            }
        }
        // `lane` catches its panics, so a join fails only if that did.
        results.extend(started.into_iter().map(|h| h.join().unwrap_or(Err(LaneStop::Sibling))));
        results
    });
    first_failure(cx, results)
}

/// The call's outcome from its lanes': the first lane that failed for a reason of its own (only
/// one lane takes the blame path, see [`Arena::check_waiting_on`]; the others give way).
fn first_failure<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    results: Vec<Result<(), LaneStop>>,
) -> Result<(), CollError> {
    let mut gave_way = false;
    for r in results {
        match r {
            Ok(()) => {}
            Err(LaneStop::Failed(e)) => return Err(e),
            Err(LaneStop::Sibling) => gave_way = true,
        }
    }
    if gave_way {
        // A lane gives way only after another set the flag, and every lane that sets it
        // returns its failure: not reached.
        debug_assert!(false, "an arena lane gave way with no failing lane");
        return Err(CollError::InvalidArgument {
            collective: cx.collective.name(),
            reason: "an arena lane stopped for a failure no lane reported (a bug in accord)".into(),
        });
    }
    Ok(())
}

/// How every lane of one call moves its bytes.
#[derive(Clone, Copy)]
struct Moves {
    /// Elements in a chunk (one slot).
    chunk_elems: usize,
    /// Reduced blocks go into the output with streaming stores.
    streamed: bool,
}

/// One lane's share of the call: the elements `elems` of the vector, in chunks of
/// `moves.chunk_elems`, through `lane`'s buffers.
fn run_lane<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    arena: &Arena,
    lane: usize,
    elems: std::ops::Range<usize>,
    moves: Moves,
    siblings_failed: &AtomicBool,
) -> Result<(), LaneStop> {
    let Moves { chunk_elems, streamed } = moves;
    // Chunk i is copied in at step i, reduced at step i + 1 and read out at step i + 2, in
    // buffer (its first step) % 3; every step but the last ends with one wait for all ranks,
    // which orders each of those after the previous one everywhere. Steps are numbered over
    // the communicator's life per lane (the same on every rank), so buffers rotate across
    // calls. The last step only reads out, so it neither publishes nor waits: the next call
    // skips one step number, so its first two steps write buffers whose readers finished
    // before this call's last wait, and the third writes the buffer read out here only after
    // the next call's first wait, which every rank passes after its own last read-out. A call
    // of k chunks waits k + 1 times (a one-chunk call twice, not three times).
    let chunks = elems.len().div_ceil(chunk_elems);
    // A lane of no chunk would wait once only, and a peer's next call could then overwrite the
    // description this lane checks; `lanes_for` gives every lane at least four slots.
    debug_assert!(chunks > 0, "an arena lane with nothing to move");
    let first = arena.steps_done[lane].fetch_add(chunks as u64 + LAST_STEP_SKIPPED, Ordering::Relaxed) + 1;
    let range = |i: usize| elems.start + i * chunk_elems..(elems.start + (i + 1) * chunk_elems).min(elems.end);
    let at = |i: usize| Place { lane, buffer: ((first + i as u64) % BUFFERS as u64) as usize };
    for step in 0..chunks + 2 {
        if step < chunks {
            copy_in(cx, a, arena, range(step), at(step))?;
        }
        if let Some(i) = step.checked_sub(1).filter(|&i| i < chunks) {
            reduce_block(cx, a, arena, range(i).len(), at(i))?;
        }
        if let Some(i) = step.checked_sub(2) {
            copy_out(cx, a, arena, range(i), at(i), streamed)?;
        }
        if step == chunks + 1 {
            break;
        }
        let global = first + step as u64;
        arena.publish(lane, global);
        arena.wait_all(cx, a, lane, global, siblings_failed)?;
        if step == 0 {
            // The same call everywhere, or a clear mismatch before this lane reduces anything:
            // every peer wrote its description before it started its lanes, so its publish of
            // this lane's first step carries it.
            arena.check_peers(cx, a)?;
        }
    }
    Ok(())
}

/// Step numbers a call of k chunks takes beyond k: its k + 2 steps and the one the next call
/// skips (see [`run_lane`]).
const LAST_STEP_SKIPPED: u64 = 3;

/// Where a chunk lives: its lane and that lane's buffer.
#[derive(Clone, Copy)]
struct Place {
    lane: usize,
    buffer: usize,
}

/// This rank's input elements `elems` into its slot of the buffer at `at`.
fn copy_in<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    arena: &Arena,
    elems: std::ops::Range<usize>,
    at: Place,
) -> Result<(), CollError> {
    let es = a.es();
    let input = a.send.sub(elems.start * es, elems.len() * es);
    cx.t.access_local(input, input.buf.slice(0, 0), &mut |s, _| {
        // SAFETY (of `bytes_mut`): this rank's slot in the lane's buffer, which only this
        // lane's thread touches. Its last readers used it for a chunk at least three step
        // numbers back and were done before a wait for all ranks this rank passed (the next
        // call's first copy-ins skip the buffer a call's unwaited last step reads, see
        // `run_lane`); its next readers start after this step's wait, after this copy.
        #[allow(unsafe_code)]
        let slot = unsafe { arena.map.bytes_mut(arena.slot(at.lane, at.buffer, arena.rank), s.len()) };
        slot.expect("the slot lies in the arena").copy_from_slice(s);
    })
    .map_err(|e| cx.transport(e))
}

/// Block `rank` of a chunk of `len` elements in the buffer at `at`, reduced over every rank's
/// slot into this rank's (its own first, then the others in rank order).
fn reduce_block<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    arena: &Arena,
    len: usize,
    at: Place,
) -> Result<(), CollError> {
    let (me, n, es) = (arena.rank, arena.n, a.es());
    let block = part(len, n, me);
    if block.is_empty() {
        return Ok(());
    }
    let (off, bytes) = (block.start * es, block.len() * es);
    let reduce_err = |source| CollError::Reduce { collective: cx.collective.name(), source };
    // SAFETY: block `me` of this rank's slot is written by this rank alone in this step (the
    // others read only their own blocks of it), and every slot's block `me` is stable: each
    // owner copied it in one step back, before that step's wait for all ranks.
    #[allow(unsafe_code)]
    let acc = unsafe { arena.map.bytes_mut(arena.slot(at.lane, at.buffer, me) + off, bytes) }.expect("in the arena");
    for r in (0..n).filter(|&r| r != me) {
        #[allow(unsafe_code)]
        let other = unsafe { arena.map.bytes(arena.slot(at.lane, at.buffer, r) + off, bytes) }.expect("in the arena");
        reduce_into(acc, other, a.dtype, a.op).map_err(reduce_err)?;
    }
    finish_avg(acc, a.dtype, a.op, n).map_err(reduce_err)
}

/// Every rank's reduced block of a chunk (elements `elems` of the vector) in the buffer at
/// `at`, into this rank's output; with streaming stores where `streamed`.
fn copy_out<T: CollTransport + ?Sized>(
    cx: &Ctx<'_, T>,
    a: &Args<'_>,
    arena: &Arena,
    elems: std::ops::Range<usize>,
    at: Place,
    streamed: bool,
) -> Result<(), CollError> {
    let es = a.es();
    for r in 0..arena.n {
        let block = part(elems.len(), arena.n, r);
        if block.is_empty() {
            continue;
        }
        let (off, bytes) = (block.start * es, block.len() * es);
        let out: BufSlice<'_> = a.recv.sub((elems.start + block.start) * es, bytes);
        cx.t.access_local(out.buf.slice(0, 0), out, &mut |_, d| {
            // SAFETY: rank `r` reduced this block one step back, before that step's wait for
            // all ranks, and nobody writes this buffer again before this rank publishes again
            // (this step's, or at a call's last step the next call's first).
            #[allow(unsafe_code)]
            let reduced = unsafe { arena.map.bytes(arena.slot(at.lane, at.buffer, r) + off, bytes) };
            let reduced = reduced.expect("in the arena");
            if streamed {
                accord_engine::streaming::copy_into(d, reduced);
            } else {
                d.copy_from_slice(reduced);
            }
        })
        .map_err(|e| cx.transport(e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
