//! The host watcher: a host thread watches a word GPU code bumps and runs a handler on each new
//! value, so device progress can start host work (a transfer the host issues once a kernel
//! finished a layer, say) without the host synchronising with the stream.
//!
//! The word lives where both sides reach it: mapped pinned host memory on a GPU (a kernel
//! stores to [`HostWatcher::device_addr`] with `st.release.sys`, or `atomicAdd_system`), plain
//! host memory otherwise. The watcher reads it with acquire loads; it spins for
//! [`WatchTiming::spin`] after each change, then sleeps [`WatchTiming::park`] between looks,
//! so an idle watcher costs a wake-up per `park`. The handler sees every value the word takes
//! between two looks only as the latest one: counters (a kernel adds) lose nothing, since the
//! handler learns how far the count moved.
//!
//! The handler runs on the watcher's thread (`accord-watch-<name>`); dropping or
//! [`HostWatcher::stop`]ping the watcher ends the thread and joins it.

use crate::error::DeviceError;
use crate::memory::{Block, Placement, Want};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a watcher waits between looks at its word.
#[derive(Copy, Clone, Debug)]
pub struct WatchTiming {
    /// How long it keeps looking without sleeping after the word last changed.
    pub spin: Duration,
    /// How long it sleeps between looks once idle.
    pub park: Duration,
}

impl Default for WatchTiming {
    fn default() -> Self {
        WatchTiming { spin: Duration::from_micros(200), park: Duration::from_micros(500) }
    }
}

/// A word GPU code bumps and a host thread that reacts to it.
pub struct HostWatcher {
    word: Arc<Block>,
    stop: Arc<AtomicBool>,
    handled: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HostWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWatcher").field("device_addr", &self.device_addr()).finish_non_exhaustive()
    }
}

impl HostWatcher {
    /// Allocates a zeroed word for `placement` and starts a thread named `accord-watch-<name>`
    /// that calls `handler(previous, current)` each time it sees the word change.
    pub fn start(
        placement: &Placement,
        name: &str,
        timing: WatchTiming,
        mut handler: impl FnMut(u64, u64) + Send + 'static,
    ) -> Result<HostWatcher, DeviceError> {
        let word = Arc::new(Block::new(placement, Want::Shared, 8)?);
        word.word(0).ok_or_else(|| DeviceError::Memory { what: "a host-visible watched word".into() })?;
        let stop = Arc::new(AtomicBool::new(false));
        let handled = Arc::new(AtomicU64::new(0));
        let (w, s, h) = (word.clone(), stop.clone(), handled.clone());
        let thread = std::thread::Builder::new()
            .name(format!("accord-watch-{name}"))
            .spawn(move || {
                let cell = w.word(0).expect("checked before the thread started");
                // The word was zeroed at allocation: changes made before this thread ran are
                // still reported, from zero.
                let mut seen = 0;
                let mut changed_at = Instant::now();
                while !s.load(Ordering::Acquire) {
                    let now = cell.load(Ordering::Acquire);
                    if now != seen {
                        handler(seen, now);
                        h.fetch_add(1, Ordering::Relaxed);
                        seen = now;
                        changed_at = Instant::now();
                    } else if changed_at.elapsed() < timing.spin {
                        std::hint::spin_loop();
                    } else {
                        std::thread::park_timeout(timing.park);
                    }
                }
            })
            .map_err(|e| DeviceError::Memory { what: format!("the watcher thread: {e}") })?;
        Ok(HostWatcher { word, stop, handled, thread: Some(thread) })
    }

    /// The address GPU code bumps (a host address under [`Placement::Host`]).
    pub fn device_addr(&self) -> u64 {
        self.word.device_addr()
    }

    /// The word's value now.
    pub fn value(&self) -> u64 {
        self.word.word(0).map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Stores `value` into the word from the host (what a kernel does, for tests and for host
    /// producers).
    pub fn store(&self, value: u64) {
        if let Some(w) = self.word.word(0) {
            w.store(value, Ordering::Release);
        }
    }

    /// Times the handler ran.
    pub fn handled(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    /// Ends the thread (after the handler call in progress, if any) and joins it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for HostWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn the_handler_sees_each_change_and_a_counter_loses_nothing() {
        let (tx, rx) = mpsc::channel();
        let watcher = HostWatcher::start(&Placement::Host, "test", WatchTiming::default(), move |before, now| {
            tx.send((before, now)).unwrap();
        })
        .unwrap();
        // A producer that counts (as a kernel's atomicAdd would), with pauses so some bumps are
        // seen one by one and others together.
        for i in 1..=200u64 {
            watcher.store(i);
            if i % 20 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let mut covered = 0;
        let mut last = 0;
        while last < 200 {
            let (before, now) = rx.recv_timeout(Duration::from_secs(10)).expect("the watcher saw the count move");
            assert_eq!(before, last, "each call starts where the previous one ended");
            assert!(now > before);
            covered += now - before;
            last = now;
        }
        assert_eq!(covered, 200, "the handler learned of every increment");
        assert!(watcher.handled() >= 1);
        watcher.stop();
    }

    #[test]
    fn an_idle_watcher_stops_promptly_and_its_word_is_host_memory_here() {
        let watcher = HostWatcher::start(
            &Placement::Host,
            "idle",
            WatchTiming { spin: Duration::ZERO, park: Duration::from_millis(50) },
            |_, _| {},
        )
        .unwrap();
        assert_ne!(watcher.device_addr(), 0);
        assert_eq!(watcher.value(), 0);
        std::thread::sleep(Duration::from_millis(20)); // asleep in park_timeout by now
        drop(watcher); // unparks and joins: a hang here would fail the test run's deadline
    }
}
