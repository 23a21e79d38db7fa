//! The watchdog of direct calls: no host thread takes part in a direct call, so this one
//! makes sure that none waits forever.
//!
//! A direct call's stream waits on words its peers' streams write (`posted`, `freed`, in the
//! flag board's direct region). A peer that died, closed, aborted or stopped calling would hold
//! the caller's stream (and everything queued behind it) for ever. The watchdog reads only host
//! memory (the board's words, and this rank's own `reached` and `done` words, which its stream
//! sets when it starts and ends a call, in pinned memory no other rank writes): no driver call,
//! so it never waits behind the application's CUDA calls.
//!
//! For the oldest unfinished call `c` it:
//! - checks the liveness (pid alive, not closed, not aborted) of every peer that still owes a
//!   word to a queued call, every [`LIVENESS_CHECK_INTERVAL`] (a peer that closed after its last
//!   call owes nothing), and
//! - once the stream has reached `c`, gives it the op timeout to finish, then blames the peer
//!   whose word the stream still waits for.
//!
//! On a failure it records the error (sticky: the next call raises it), marks this rank aborted
//! on the board (a peer still owed a word by it fails at its next liveness check), and
//! releases: it stores [`RELEASED`] into every word this rank's stream waits on, and keeps doing
//! so until every queued call finished (a late write of a live peer could lower a word again).
//! The released calls reduce whatever their inboxes hold: their results are not to be used,
//! and the recorded error is raised by the next call (or `wait_idle`). Released words are the peers' `posted` and `freed` words for this rank, which
//! is why a rank counts its finished calls from its own `done` word, never from the board.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::super::board::{Board, Deadline, DirectWord, LIVENESS_CHECK_INTERVAL};
use super::super::error::GpuCollError;
use super::super::poll::poll_until;
use super::super::worker::Shared;

/// The value a released word holds: above every call number a communicator reaches.
pub const RELEASED: u64 = u64::MAX >> 1;
/// How often the watchdog looks while a call is unfinished.
const POLL_BUSY: Duration = Duration::from_millis(1);
/// Longest sleep while nothing is queued (a new call wakes it at once).
const POLL_IDLE: Duration = Duration::from_millis(50);

/// What this rank's stream reports about its own calls, in memory only this rank writes.
pub trait OwnWords: Send + Sync {
    /// The last call the stream started.
    fn reached(&self) -> u64;
    /// The last call the stream finished (its last store of the call).
    fn done(&self) -> u64;
}

/// The peer whose word the stream waits for in call `c`, if it waits for one: first the peers
/// that have not yet freed the slot this call pushes into, then those whose push has not landed.
pub fn blame(board: &Board, me: usize, n: usize, c: u64) -> Option<(usize, &'static str)> {
    let peers = || (0..n).filter(move |&p| p != me);
    let pushed_all = peers().all(|p| board.direct_word(DirectWord::Posted, me, p).load(Ordering::Acquire) >= c);
    if !pushed_all {
        if let Some(p) =
            peers().find(|&p| board.direct_word(DirectWord::Freed, p, me).load(Ordering::Acquire) < c.saturating_sub(2))
        {
            return Some((p, "to finish reading this rank's push of two calls before"));
        }
        return None;
    }
    peers()
        .find(|&p| board.direct_word(DirectWord::Posted, p, me).load(Ordering::Acquire) < c)
        .map(|p| (p, "to push its data"))
}

/// Whether peer `p` still owes a word that this rank's calls up to `queued` wait for: its push
/// of the last one, or the freeing of a slot the last one pushes into.
pub fn owes(board: &Board, me: usize, p: usize, queued: u64) -> bool {
    board.direct_word(DirectWord::Posted, p, me).load(Ordering::Acquire) < queued
        || board.direct_word(DirectWord::Freed, p, me).load(Ordering::Acquire) < queued.saturating_sub(2)
}

/// Lets this rank's stream past every wait of its direct calls.
pub fn release(board: &Board, me: usize, n: usize) {
    for p in (0..n).filter(|&p| p != me) {
        board.direct_word(DirectWord::Posted, p, me).store(RELEASED, Ordering::Release);
        board.direct_word(DirectWord::Freed, p, me).store(RELEASED, Ordering::Release);
    }
}

/// What one look found.
#[derive(Debug, PartialEq, Eq)]
pub enum Look {
    /// Every queued call finished.
    Idle,
    /// A call is unfinished and nothing is wrong yet.
    Busy,
}

/// The watchdog's memory between two looks.
#[derive(Debug)]
pub struct Watching {
    /// The oldest unfinished call when last looked.
    call: u64,
    /// When the stream was first seen to have reached it.
    reached_at: Option<Instant>,
    /// The last liveness check.
    checked_at: Instant,
}

impl Watching {
    /// Nothing watched yet.
    pub fn new(now: Instant) -> Watching {
        Watching { call: 0, reached_at: None, checked_at: now }
    }
}

/// The state the submitting thread and the watchdog share.
pub struct Watch {
    shared: Arc<Shared>,
    rank: usize,
    world_size: usize,
    op_timeout: Duration,
    own: Arc<dyn OwnWords>,
    /// The last call number queued.
    queued: AtomicU64,
    stop: AtomicBool,
    wake: (Mutex<()>, Condvar),
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("rank", &self.rank).field("queued", &self.queued).finish()
    }
}

impl Watch {
    /// The watch of rank `rank` of `world_size`.
    pub fn new(
        shared: Arc<Shared>,
        rank: usize,
        world_size: usize,
        op_timeout: Duration,
        own: Arc<dyn OwnWords>,
    ) -> Watch {
        Watch {
            shared,
            rank,
            world_size,
            op_timeout,
            own,
            queued: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(()), Condvar::new()),
        }
    }

    /// How long a call may wait once its stream reached it.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Records that call `call` is queued, and wakes the watchdog.
    pub fn queued(&self, call: u64) {
        self.queued.fetch_max(call, Ordering::Release);
        self.wake.1.notify_one();
    }

    /// Calls queued and calls finished.
    pub fn progress(&self) -> (u64, u64) {
        (self.queued.load(Ordering::Acquire), self.own.done())
    }

    /// Whether the communicator failed (this watch's error or any other).
    fn failed(&self) -> bool {
        self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Records `error` (the first one stays), tells the peers, and releases this rank's waits.
    pub fn fail(&self, error: &GpuCollError) {
        tracing::error!(rank = self.rank, error = %error, "a direct collective failed");
        self.shared.board.abort_rank(self.rank);
        self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error.to_string());
        release(&self.shared.board, self.rank, self.world_size);
        self.wake.1.notify_one();
    }

    /// One look at the oldest unfinished call: an error when a peer is gone or the call
    /// outlived the op timeout since the stream reached it.
    pub fn look(&self, watching: &mut Watching, now: Instant) -> Result<Look, GpuCollError> {
        let board = &self.shared.board;
        let done = self.own.done();
        if done >= self.queued.load(Ordering::Acquire) {
            watching.reached_at = None;
            return Ok(Look::Idle);
        }
        let call = done + 1;
        if watching.call != call {
            *watching = Watching { call, reached_at: None, checked_at: watching.checked_at };
        }
        if watching.reached_at.is_none() && self.own.reached() >= call {
            watching.reached_at = Some(now);
        }
        if now.duration_since(watching.checked_at) >= LIVENESS_CHECK_INTERVAL {
            watching.checked_at = now;
            let queued = self.queued.load(Ordering::Acquire);
            for p in (0..self.world_size).filter(|&p| p != self.rank) {
                // A peer that closed after its last call owes nothing: not an error.
                if owes(board, self.rank, p, queued) {
                    board.check_peer(p)?;
                }
            }
        }
        if let Some(at) = watching.reached_at {
            if now.duration_since(at) >= self.op_timeout {
                let what = match blame(board, self.rank, self.world_size, call) {
                    Some((p, why)) => format!("rank {p} {why} (direct collective, call {call})"),
                    None => format!("this rank's own GPU to finish direct collective call {call}"),
                };
                return Err(GpuCollError::Timeout { what, waited: self.op_timeout });
            }
        }
        Ok(Look::Busy)
    }

    /// The watchdog's loop, until [`Watch::stop`].
    pub fn run(&self) {
        let mut watching = Watching::new(Instant::now());
        while !self.stop.load(Ordering::Acquire) {
            let look = if self.failed() {
                // Failed (here or by another path): keep this rank's stream moving.
                release(&self.shared.board, self.rank, self.world_size);
                let (queued, done) = self.progress();
                if done >= queued {
                    Look::Idle
                } else {
                    Look::Busy
                }
            } else {
                match self.look(&mut watching, Instant::now()) {
                    Ok(look) => look,
                    Err(e) => {
                        self.fail(&e);
                        Look::Busy
                    }
                }
            };
            let wait = if look == Look::Idle { POLL_IDLE } else { POLL_BUSY };
            let guard = self.wake.0.lock().unwrap_or_else(|p| p.into_inner());
            if look == Look::Idle && self.progress().1 >= self.queued.load(Ordering::Acquire) {
                let _ = self.wake.1.wait_timeout(guard, wait);
            } else {
                drop(guard);
                std::thread::sleep(wait);
            }
        }
    }

    /// Ends [`Watch::run`] (it returns within one poll).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.1.notify_one();
    }

    /// Waits until every queued call finished, at most `timeout` (the progress thread's poll).
    pub fn wait_finished(&self, timeout: Duration) -> bool {
        let finished = || {
            let (queued, done) = self.progress();
            Ok(done >= queued)
        };
        poll_until(Deadline::after(timeout), || "the direct calls to finish".into(), finished).is_ok()
    }
}
