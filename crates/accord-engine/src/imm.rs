//! Immediate counters: how many writes carrying each immediate have fully landed here.

use crate::completion::{dispatch, JobSender};
use crate::wait_spin::SleeperCondvar;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most distinct immediate values counted at once; arrivals of further values are dropped and
/// counted in [`crate::EngineStats::imm_overflow`].
pub const IMM_COUNTERS_MAX: usize = 1 << 16;
/// Most callbacks waiting on one counter.
pub const IMM_EXPECTATIONS_MAX: usize = 4096;
/// Most distinct immediates whose lost arrivals are remembered one by one (beyond, only
/// [`crate::EngineStats::imm_overflow`] counts them).
pub const IMM_LOST_TRACKED_MAX: usize = 4096;
/// How often [`ImmCounter::wait_checked`] looks for lost arrivals while it waits.
const LOST_CHECK_INTERVAL: Duration = Duration::from_millis(20);

/// Why [`ImmCounter::wait_checked`] did not return the value it waited for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImmError {
    /// Writes with this immediate landed in memory but were never counted, because the
    /// counter table was full when they arrived: their senders saw them complete. Release
    /// counters you are done with ([`crate::Engine::release_imm`]) or take them
    /// ([`crate::Engine::take_imm`]) so the table has room.
    #[error(
        "immediate {imm}: {lost} write(s) landed but were not counted because the immediate counter table was full \
         ({max} counters held); counted {value}. Release counters you no longer need (release_imm) or take them (take_imm)",
        max = IMM_COUNTERS_MAX
    )]
    Overflow {
        /// The immediate.
        imm: u32,
        /// Its writes that landed uncounted.
        lost: u64,
        /// What the counter shows.
        value: u64,
    },
    /// The engine shut down before the counter reached the target: it will not move again.
    #[error("the engine shut down: immediate {imm} counted {value}")]
    ShutDown {
        /// The immediate.
        imm: u32,
        /// What the counter showed.
        value: u64,
    },
    /// The counter did not reach the target in time.
    #[error("immediate {imm} counted {value} of {target} before the deadline: wait longer, or check the writers")]
    Timeout {
        /// The immediate.
        imm: u32,
        /// What the counter showed at the deadline.
        value: u64,
        /// What the wait asked for.
        target: u64,
    },
}

/// Arrivals dropped per immediate because the table was full.
#[derive(Default)]
pub(crate) struct LostLog {
    by_imm: Mutex<HashMap<u32, u64>>,
}

impl LostLog {
    /// Records one lost arrival of `imm`; true for the first of that immediate (worth a log line).
    fn record(&self, imm: u32) -> bool {
        let mut m = self.by_imm.lock().unwrap();
        let full = m.len() >= IMM_LOST_TRACKED_MAX;
        match m.get_mut(&imm) {
            Some(n) => {
                *n += 1;
                false
            }
            None if full => false,
            None => {
                m.insert(imm, 1);
                true
            }
        }
    }

    fn of(&self, imm: u32) -> u64 {
        self.by_imm.lock().unwrap().get(&imm).copied().unwrap_or(0)
    }
}

type Expectation = (u64, Box<dyn FnOnce(u64) + Send>);

pub(crate) struct ImmSlot {
    count: AtomicU64,
    /// Live [`ImmCounter`] handles: while any exists, the slot is never freed (they would go on
    /// reading a counter that no longer moves).
    observers: AtomicUsize,
    expectations: Mutex<Vec<Expectation>>,
    changed: SleeperCondvar,
    /// How long a waiter polls before it blocks ([`crate::EngineConfig::wait_spin`]).
    wait_spin: Duration,
    /// Set when the engine shut down: the counter will never move again, so waits end.
    engine_closed: Arc<AtomicBool>,
}

impl ImmSlot {
    fn new(wait_spin: Duration, engine_closed: Arc<AtomicBool>) -> Arc<ImmSlot> {
        Arc::new(ImmSlot {
            count: AtomicU64::new(0),
            observers: AtomicUsize::new(0),
            expectations: Mutex::new(vec![]),
            changed: SleeperCondvar::default(),
            wait_spin,
            engine_closed,
        })
    }
}

/// The engine's table of counters.
pub(crate) struct ImmTable {
    slots: Mutex<HashMap<u32, Arc<ImmSlot>>>,
    pub(crate) overflow: AtomicU64,
    pub(crate) lost: Arc<LostLog>,
    wait_spin: Duration,
    closed: Arc<AtomicBool>,
}

impl ImmTable {
    /// An empty table whose waiters poll for `wait_spin` before they block.
    pub(crate) fn new(wait_spin: Duration) -> Self {
        ImmTable {
            slots: Mutex::new(HashMap::new()),
            overflow: AtomicU64::new(0),
            lost: Arc::default(),
            wait_spin,
            closed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The engine shut down: every counter stops for good, and whoever waits on one returns
    /// now instead of at its timeout.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let slots: Vec<Arc<ImmSlot>> = self.slots.lock().unwrap().values().cloned().collect();
        for slot in slots {
            // Under the waiters' lock, so none is between its check and its sleep.
            let _guard = slot.expectations.lock().unwrap();
            slot.changed.notify_all();
        }
    }

    pub(crate) fn slot(&self, imm: u32) -> Option<Arc<ImmSlot>> {
        let mut slots = self.slots.lock().unwrap();
        if let Some(s) = slots.get(&imm) {
            return Some(s.clone());
        }
        if slots.len() >= IMM_COUNTERS_MAX {
            return None;
        }
        let slot = ImmSlot::new(self.wait_spin, self.closed.clone());
        slots.insert(imm, slot.clone());
        Some(slot)
    }

    /// Waits until `imm` has counted at least `count`, subtracts `count`, and frees the counter
    /// once it is back to zero and nobody else observes it. Returns the value seen at the
    /// deadline when it never got there. This is how long-running users (collectives, whose
    /// immediates encode a sequence number) keep the table small: a counter that is only ever
    /// taken from never accumulates.
    pub(crate) fn take(&self, imm: u32, count: u64, timeout: Duration) -> Result<(), u64> {
        let slot = self.slot(imm).ok_or(0u64)?;
        let deadline = std::time::Instant::now() + timeout;
        crate::wait_spin::spin_until(slot.wait_spin.min(timeout), || slot.count.load(Ordering::Acquire) >= count);
        {
            let mut guard = slot.expectations.lock().unwrap();
            loop {
                let value = slot.count.load(Ordering::Acquire);
                if value >= count {
                    slot.count.fetch_sub(count, Ordering::AcqRel);
                    break;
                }
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(value);
                }
                guard = slot.changed.wait_timeout(guard, left);
            }
        }
        // Arrivals increment under the table lock (see `bump`), so a slot found at zero here
        // cannot have an increment in flight: freeing it loses nothing, and the next arrival
        // makes a fresh one.
        let mut slots = self.slots.lock().unwrap();
        let current = slots.get(&imm).is_some_and(|s| Arc::ptr_eq(s, &slot));
        let idle = slot.count.load(Ordering::Acquire) == 0
            && slot.observers.load(Ordering::Acquire) == 0
            && slot.expectations.lock().unwrap().is_empty();
        if current && idle {
            slots.remove(&imm);
        }
        Ok(())
    }

    /// Forgets `imm`'s counter whatever its value and whoever observes it, so the table has
    /// room again; returns the value it had, or None when there was none. Handles still held
    /// keep the final value; a later arrival starts a fresh counter at zero.
    pub(crate) fn release(&self, imm: u32) -> Option<u64> {
        let slot = self.slots.lock().unwrap().remove(&imm)?;
        let value = slot.count.load(Ordering::Acquire);
        let _guard = slot.expectations.lock().unwrap();
        slot.changed.notify_all();
        Some(value)
    }

    /// Lost arrivals per immediate since the last call, and forgets them (the poll API).
    pub(crate) fn drain_lost(&self) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = self.lost.by_imm.lock().unwrap().drain().collect();
        v.sort_unstable();
        v
    }

    /// Distinct counters held (for tests and stats).
    pub(crate) fn len(&self) -> usize {
        self.slots.lock().unwrap().len()
    }

    /// Counters held with their values (diagnostics).
    pub(crate) fn held(&self) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> =
            self.slots.lock().unwrap().iter().map(|(k, s)| (*k, s.count.load(Ordering::Acquire))).collect();
        v.sort_unstable();
        v
    }

    /// One more write with `imm` landed.
    pub(crate) fn bump(&self, imm: u32, jobs: &JobSender) {
        // Find and increment under the table lock, so `take` never frees a slot between the
        // two (which would lose this arrival).
        let slot = {
            let mut slots = self.slots.lock().unwrap();
            let slot = match slots.get(&imm) {
                Some(s) => s.clone(),
                None if slots.len() >= IMM_COUNTERS_MAX => {
                    self.overflow.fetch_add(1, Ordering::Relaxed);
                    let first = self.lost.record(imm);
                    drop(slots);
                    // Logged outside the table lock: a log sink may block (a Python bridge
                    // waits for the GIL), and nothing must wait for it while holding the table.
                    if first {
                        tracing::error!(
                            imm,
                            "immediate counter table full: a write with this immediate landed but is not counted \
                             (its sender saw it complete); release or take counters you are done with"
                        );
                    }
                    return;
                }
                None => {
                    let s = ImmSlot::new(self.wait_spin, self.closed.clone());
                    slots.insert(imm, s.clone());
                    s
                }
            };
            slot.count.fetch_add(1, Ordering::AcqRel);
            slot
        };
        let ready: Vec<Expectation> = {
            let mut ex = slot.expectations.lock().unwrap();
            let value = slot.count.load(Ordering::Acquire);
            let (ready, waiting) = std::mem::take(&mut *ex).into_iter().partition(|(target, _)| *target <= value);
            *ex = waiting;
            ready
        };
        slot.changed.notify_all();
        let value = slot.count.load(Ordering::Acquire);
        for (_, cb) in ready {
            dispatch(jobs, move || cb(value));
        }
    }
}

/// A view of one immediate's counter; see [`crate::Engine::imm_counter`]. While one exists
/// the counter is kept (never freed by [`crate::Engine::take_imm`]).
pub struct ImmCounter {
    slot: Arc<ImmSlot>,
    imm: u32,
    lost: Arc<LostLog>,
}

impl ImmCounter {
    pub(crate) fn new(slot: Arc<ImmSlot>, imm: u32, lost: Arc<LostLog>) -> Self {
        slot.observers.fetch_add(1, Ordering::AcqRel);
        ImmCounter { slot, imm, lost }
    }
}

impl Clone for ImmCounter {
    fn clone(&self) -> Self {
        ImmCounter::new(self.slot.clone(), self.imm, self.lost.clone())
    }
}

impl Drop for ImmCounter {
    fn drop(&mut self) {
        self.slot.observers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for ImmCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImmCounter").field("value", &self.value()).finish()
    }
}

impl ImmCounter {
    /// Writes with this immediate that have fully landed so far.
    pub fn value(&self) -> u64 {
        self.slot.count.load(Ordering::Acquire)
    }

    /// Blocks until the counter reaches `target`, `timeout` passes or the engine shuts down
    /// (at once if it has); returns the value then (compare it with `target` to tell which, or
    /// use [`ImmCounter::wait_checked`]).
    /// Polls for the engine's [`crate::EngineConfig::wait_spin`] first, then sleeps.
    pub fn wait(&self, target: u64, timeout: Duration) -> u64 {
        let deadline = std::time::Instant::now() + timeout;
        let closed = || self.slot.engine_closed.load(Ordering::Acquire);
        crate::wait_spin::spin_until(self.slot.wait_spin.min(timeout), || self.value() >= target || closed());
        let mut guard = self.slot.expectations.lock().unwrap();
        loop {
            let value = self.value();
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if value >= target || left.is_zero() || closed() {
                return value;
            }
            guard = self.slot.changed.wait_timeout(guard, left);
        }
    }

    /// Writes with this immediate that landed but were never counted because the counter
    /// table was full (not yet drained by [`crate::Engine::imm_overflows`]).
    pub fn lost(&self) -> u64 {
        self.lost.of(self.imm)
    }

    /// As [`ImmCounter::wait`], but an error whenever the wait ended short or cannot be trusted:
    /// the engine shut down ([`ImmError::ShutDown`], at once if it had), writes with this
    /// immediate were lost to a full counter table ([`ImmError::Overflow`]: the target may never
    /// be reached), or the deadline passed first ([`ImmError::Timeout`]).
    pub fn wait_checked(&self, target: u64, timeout: Duration) -> Result<u64, ImmError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let lost = self.lost();
            if lost > 0 {
                return Err(ImmError::Overflow { imm: self.imm, lost, value: self.value() });
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let value = self.wait(target, left.min(LOST_CHECK_INTERVAL));
            if value >= target {
                return Ok(value);
            }
            if self.engine_closed() {
                return Err(ImmError::ShutDown { imm: self.imm, value });
            }
            if left <= LOST_CHECK_INTERVAL {
                return Err(ImmError::Timeout { imm: self.imm, value, target });
            }
        }
    }

    /// Whether the engine this counter belongs to shut down (the value no longer moves).
    pub fn engine_closed(&self) -> bool {
        self.slot.engine_closed.load(Ordering::Acquire)
    }

    pub(crate) fn expect(&self, target: u64, callback: Box<dyn FnOnce(u64) + Send>, jobs: &JobSender) -> bool {
        let mut ex = self.slot.expectations.lock().unwrap();
        let value = self.value();
        if value >= target {
            drop(ex);
            dispatch(jobs, move || callback(value));
            return true;
        }
        if ex.len() >= IMM_EXPECTATIONS_MAX {
            return false;
        }
        ex.push((target, callback));
        true
    }
}
