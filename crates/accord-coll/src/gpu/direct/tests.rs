//! Host-side tests of direct collectives: the board's direct words, the watchdog's decisions,
//! and the start's agreement on the slot. (The calls themselves need two GPUs:
//! `super::super::gpu_tests`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::super::board::{board_words, direct_word_offset, Board, DirectWord, GPU_WORLD_SIZE_MAX, SEGMENT_WORDS_MAX};
use super::super::error::GpuCollError;
use super::super::worker::Shared;
use super::super::GpuConfig;
use super::setup::inboxes_of;
use super::slot_bytes;
use super::watch::{blame, owes, release, Look, OwnWords, Watch, Watching, RELEASED};

fn board(world: usize, tag: &str) -> Board {
    let path = std::env::temp_dir().join(format!("accord-direct-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let board = Board::create(&path, world).unwrap();
    board.init_header();
    board.unlink().unwrap();
    for r in 0..world {
        board.open_rank(r, std::process::id());
    }
    board
}

fn shared(world: usize, tag: &str) -> Arc<Shared> {
    Arc::new(Shared {
        board: board(world, tag),
        error: Mutex::new(None),
        completed: AtomicU64::new(0),
        mappings_opened: AtomicU64::new(0),
    })
}

#[test]
fn the_direct_region_is_whole_pages_with_a_line_per_word() {
    for world in [1, 2, 3, 8, GPU_WORLD_SIZE_MAX] {
        assert!(board_words(world) <= SEGMENT_WORDS_MAX, "{world} ranks fit the segment bound");
        let mut offsets = Vec::new();
        for which in [DirectWord::Posted, DirectWord::Freed] {
            for src in 0..world {
                for dst in 0..world {
                    offsets.push(direct_word_offset(world, which, src, dst));
                }
            }
        }
        offsets.sort_unstable();
        assert!(offsets.windows(2).all(|w| w[1] - w[0] >= 64), "{world} ranks: one cache line per word");
    }
    let b = board(3, "region");
    let (start, len) = b.direct_region();
    assert_eq!(start as usize % 4096, 0, "page-aligned, so only the region is page-locked");
    assert_eq!(len % 4096, 0);
    let last = b.direct_word(DirectWord::Freed, 2, 2) as *const AtomicU64 as usize;
    assert!(last + 8 <= start as usize + len, "every word lies inside the region");
}

#[test]
fn a_slot_is_an_even_share_of_the_inbox_on_256_byte_boundaries() {
    assert_eq!(slot_bytes(128 << 20, 2), 32 << 20);
    assert_eq!(slot_bytes(128 << 20, 8), 8 << 20);
    assert_eq!(slot_bytes(1000, 2), 0, "250 bytes round down to nothing: direct calls off");
    assert_eq!(slot_bytes(128 << 20, 1), 0, "one rank has no peers to push to");
    assert_eq!(slot_bytes(0, 4), 0);
    assert_eq!(slot_bytes(3 << 20, 3) % 256, 0);
}

#[test]
fn the_ranks_must_agree_on_the_slot() {
    let blob = |id: u64, slot: u64| [id.to_le_bytes(), slot.to_le_bytes()].concat();
    assert_eq!(inboxes_of(&[blob(2, 4096), blob(3, 4096)], 4096).unwrap(), vec![2, 3]);
    let err = inboxes_of(&[blob(2, 4096), blob(2, 0)], 4096).unwrap_err();
    assert!(matches!(&err, GpuCollError::InvalidArgument { what } if what.contains("rank 1")), "{err}");
    assert!(err.to_string().contains("ACCORD_GPU_DIRECT_BYTES"), "{err}");
    let err = inboxes_of(&[blob(2, 4096), vec![1, 2, 3]], 4096).unwrap_err();
    assert!(matches!(err, GpuCollError::Protocol { rank: 1, .. }), "{err}");
}

#[test]
fn the_direct_knob_reads_bytes_and_zero_turns_it_off() {
    assert_eq!(GpuConfig::default().direct_bytes, 128 << 20);
    let c = GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_DIRECT_BYTES").then(|| "0".to_string())).unwrap();
    assert_eq!(c.direct_bytes, 0);
    let c = GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_DIRECT_BYTES").then(|| "65536".to_string())).unwrap();
    assert_eq!(c.direct_bytes, 65536);
    assert!(GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_DIRECT_BYTES").then(|| "lots".to_string())).is_err());
}

/// Rank `me`'s stream finished `calls` calls: its board words of each.
fn finish_calls(b: &Board, me: usize, world: usize, calls: u64) {
    for p in (0..world).filter(|&p| p != me) {
        b.direct_word(DirectWord::Posted, me, p).store(calls, Ordering::Release);
        b.direct_word(DirectWord::Freed, me, p).store(calls, Ordering::Release);
    }
}

/// A stream's own words, set by hand.
#[derive(Default)]
struct Own {
    reached: AtomicU64,
    done: AtomicU64,
}

impl OwnWords for Own {
    fn reached(&self) -> u64 {
        self.reached.load(Ordering::Acquire)
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }
}

#[test]
fn the_watchdog_blames_the_peer_whose_word_the_stream_waits_for() {
    let b = board(3, "blame");
    // Rank 0 finished call 4; everyone finished call 4.
    for r in 0..3 {
        finish_calls(&b, r, 3, 4);
    }
    assert_eq!(blame(&b, 0, 3, 5), None, "call 5: nothing waited for yet (rank 0 has not pushed)");
    // Rank 0 pushed call 5 to both peers; rank 2 pushed its own, rank 1 not yet.
    for p in [1, 2] {
        b.direct_word(DirectWord::Posted, 0, p).store(5, Ordering::Release);
    }
    b.direct_word(DirectWord::Posted, 2, 0).store(5, Ordering::Release);
    assert_eq!(blame(&b, 0, 3, 5).map(|(p, _)| p), Some(1));
    // Call 7 cannot push before both peers freed call 5's slot; rank 2 has not.
    finish_calls(&b, 0, 3, 6);
    finish_calls(&b, 1, 3, 6);
    b.direct_word(DirectWord::Freed, 2, 0).store(4, Ordering::Release);
    let (p, why) = blame(&b, 0, 3, 7).unwrap();
    assert_eq!(p, 2);
    assert!(why.contains("finish reading"), "{why}");
}

#[test]
fn release_lets_every_wait_of_this_rank_past_and_only_those() {
    let b = board(3, "release");
    release(&b, 1, 3);
    for p in [0, 2] {
        assert_eq!(b.direct_word(DirectWord::Posted, p, 1).load(Ordering::Acquire), RELEASED);
        assert_eq!(b.direct_word(DirectWord::Freed, p, 1).load(Ordering::Acquire), RELEASED);
        // The words the peers wait on (rank 1's own stores) are untouched.
        assert_eq!(b.direct_word(DirectWord::Posted, 1, p).load(Ordering::Acquire), 0);
        assert_eq!(b.direct_word(DirectWord::Freed, 1, p).load(Ordering::Acquire), 0);
    }
}

fn watch(shared: &Arc<Shared>, timeout: Duration, own: &Arc<Own>) -> Watch {
    Watch::new(Arc::clone(shared), 0, 2, timeout, Arc::clone(own) as Arc<dyn OwnWords>)
}

#[test]
fn a_call_the_peer_never_joins_times_out_naming_it_counted_from_when_the_stream_reached_it() {
    let shared = shared(2, "timeout");
    let own = Arc::new(Own::default());
    let w = watch(&shared, Duration::from_millis(100), &own);
    let t0 = Instant::now();
    let mut watching = Watching::new(t0);
    assert_eq!(w.look(&mut watching, t0).unwrap(), Look::Idle);
    w.queued(1);
    // The stream has not reached the call (earlier work runs): no clock yet, however long.
    assert_eq!(w.look(&mut watching, t0 + Duration::from_secs(3600)).unwrap(), Look::Busy);
    own.reached.store(1, Ordering::Release);
    let t1 = t0 + Duration::from_secs(3600);
    assert_eq!(w.look(&mut watching, t1).unwrap(), Look::Busy);
    shared.board.direct_word(DirectWord::Posted, 0, 1).store(1, Ordering::Release);
    let err = w.look(&mut watching, t1 + Duration::from_millis(150)).unwrap_err();
    assert!(matches!(&err, GpuCollError::Timeout { what, .. } if what.contains("rank 1 to push")), "{err}");
    // The call finishing (the stream's own `done` word) ends the watch.
    own.done.store(1, Ordering::Release);
    assert_eq!(w.look(&mut watching, t1 + Duration::from_millis(200)).unwrap(), Look::Idle);
}

#[test]
fn a_peer_that_closed_fails_the_call_at_once_and_the_stream_is_let_past() {
    let shared = shared(2, "gone");
    let own = Arc::new(Own::default());
    let w = Arc::new(watch(&shared, Duration::from_secs(3600), &own));
    let runner = Arc::clone(&w);
    let thread = std::thread::spawn(move || runner.run());
    w.queued(1);
    own.reached.store(1, Ordering::Release);
    shared.board.close_rank(1);
    // The "stream": waits for rank 1's push, bounded here, then finishes the call.
    let deadline = Instant::now() + Duration::from_secs(10);
    while shared.board.direct_word(DirectWord::Posted, 1, 0).load(Ordering::Acquire) < 1 {
        assert!(Instant::now() < deadline, "the watchdog released the wait");
        std::thread::sleep(Duration::from_millis(1));
    }
    finish_calls(&shared.board, 0, 2, 1);
    own.done.store(1, Ordering::Release);
    assert!(w.wait_finished(Duration::from_secs(10)));
    let error = shared.error.lock().unwrap().clone().expect("the failure is recorded");
    assert!(error.contains("rank 1"), "{error}");
    assert!(shared.board.check_peer(0).is_err(), "this rank is marked aborted for its peers");
    w.stop();
    thread.join().unwrap();
}

#[test]
fn a_peer_that_closed_after_its_last_call_is_not_an_error() {
    let shared = shared(2, "closed-after");
    let own = Arc::new(Own::default());
    own.reached.store(1, Ordering::Release);
    let w = watch(&shared, Duration::from_secs(3600), &own);
    w.queued(1);
    // Rank 1 pushed call 1 and closed; rank 0's stream is still reducing it.
    finish_calls(&shared.board, 1, 2, 1);
    shared.board.close_rank(1);
    assert!(!owes(&shared.board, 0, 1, 1));
    let t0 = Instant::now();
    let mut watching = Watching::new(t0);
    assert_eq!(w.look(&mut watching, t0 + Duration::from_secs(1)).unwrap(), Look::Busy);
    // A second call would need its push: now the closed peer is an error.
    w.queued(2);
    assert!(owes(&shared.board, 0, 1, 2));
    let err = w.look(&mut watching, t0 + Duration::from_secs(2)).unwrap_err();
    assert!(matches!(err, GpuCollError::PeerGone { rank: 1, .. }), "{err}");
}

/// The words a failing rank releases are its peers' `posted` and `freed` words for it: a peer
/// that counted its finished calls from them would think its calls done and stop watching. It
/// counts from its own `done` word, so it goes on watching, and finds the failed rank aborted.
#[test]
fn a_failed_peers_release_does_not_finish_this_ranks_calls() {
    let shared = shared(2, "released");
    let own = Arc::new(Own::default());
    let w = watch(&shared, Duration::from_secs(3600), &own);
    w.queued(1);
    own.reached.store(1, Ordering::Release);
    // Rank 1 fails: it aborts and releases its own waits, the words rank 0's stream writes.
    shared.board.abort_rank(1);
    release(&shared.board, 1, 2);
    assert_eq!(shared.board.direct_word(DirectWord::Freed, 0, 1).load(Ordering::Acquire), RELEASED);
    assert_eq!(w.progress(), (1, 0), "call 1 is still unfinished here");
    let t0 = Instant::now();
    let mut watching = Watching::new(t0);
    let err = w.look(&mut watching, t0 + Duration::from_secs(1)).unwrap_err();
    assert!(matches!(err, GpuCollError::PeerAborted { rank: 1 }), "{err}");
}
