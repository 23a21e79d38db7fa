//! Waiting on a 32-bit word of memory shared between processes, in the kernel (Linux futexes).
//!
//! Why: a wait that spins or yields keeps its thread runnable, and on a host whose cores are
//! all busy (DDP's backward pass beside its all_reduce) every such waiter takes time slices
//! that the computation, or the thread everybody waits for, could use. The host arena's waits
//! sleep here after spinning and yielding. (That alone did not cure the arena's slowness on
//! busy cores, `docs/results/2026-11-27-host-arena.md`: there each wait for all ranks costs a
//! scheduling turn whether the waiters spin or sleep; fewer such waits did.) The word may be in a file mapping several
//! processes share: these are the shared (not process-private) futex operations.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `expected`, at most `timeout`, or until [`wake_all`] on it (or a
/// signal, or a spurious wake-up: callers re-check their condition). Returns at once if the
/// word no longer holds `expected`.
#[allow(unsafe_code)]
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // Safety: FUTEX_WAIT reads the aligned 32-bit word behind a live reference and a timespec
    // on our stack; it writes nothing of ours. The result (woken, timed out, value changed,
    // interrupted) needs no handling: the caller re-checks.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread, in any process, sleeping in [`wait`] on `word`.
#[allow(unsafe_code)]
pub fn wake_all(word: &AtomicU32) {
    // Safety: FUTEX_WAKE only uses the word's address as a key; no memory is touched.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    #[test]
    fn a_wait_returns_at_once_on_a_changed_word_and_at_its_timeout_otherwise() {
        let w = AtomicU32::new(5);
        let start = Instant::now();
        wait(&w, 4, Duration::from_secs(5));
        assert!(start.elapsed() < Duration::from_secs(1), "the word did not hold 4");
        let start = Instant::now();
        wait(&w, 5, Duration::from_millis(20));
        assert!(start.elapsed() >= Duration::from_millis(15), "returned after {:?}", start.elapsed());
    }

    #[test]
    fn a_wake_ends_a_sleeping_wait() {
        let w = AtomicU32::new(0);
        std::thread::scope(|s| {
            let sleeper = s.spawn(|| {
                let start = Instant::now();
                while w.load(Ordering::Acquire) == 0 {
                    wait(&w, 0, Duration::from_secs(10));
                }
                start.elapsed()
            });
            std::thread::sleep(Duration::from_millis(20));
            w.store(1, Ordering::Release);
            wake_all(&w);
            assert!(sleeper.join().unwrap() < Duration::from_secs(5));
        });
    }
}
