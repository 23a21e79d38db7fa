//! What the routes that wait on their peer's answer (the pull route, READ) share to expire
//! requests a quiet peer left outstanding: a sweep runs on every worker turn, so it must cost one
//! atomic load when nothing waits and run its scan at most once a millisecond.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Shortest time between two scans of one route's table.
const SWEEP_INTERVAL_NS: u64 = 1_000_000;

/// Whether a scan is due at `now_ns` (engine-epoch nanoseconds); claims it when it is, so one
/// worker scans and the others skip.
pub(crate) fn due(last_sweep_ns: &AtomicU64, now_ns: u64) -> bool {
    let last = last_sweep_ns.load(Ordering::Relaxed);
    now_ns.saturating_sub(last) >= SWEEP_INTERVAL_NS
        && last_sweep_ns.compare_exchange(last, now_ns, Ordering::AcqRel, Ordering::Relaxed).is_ok()
}

/// The ids of the requests in `pending` whose deadline has passed.
pub(crate) fn expired<P>(pending: &Mutex<HashMap<u64, P>>, deadline: impl Fn(&P) -> Instant) -> Vec<u64> {
    let now = Instant::now();
    pending.lock().unwrap().iter().filter(|(_, p)| deadline(p) <= now).map(|(req, _)| *req).collect()
}

/// The expired requests of a route's table, if any are outstanding (`pending_count`, one atomic
/// load when none) and a scan is due (see [`due`]); else none.
pub(crate) fn expired_if_due<P>(
    pending_count: &AtomicUsize,
    last_sweep_ns: &AtomicU64,
    now_ns: u64,
    pending: &Mutex<HashMap<u64, P>>,
    deadline: impl Fn(&P) -> Instant,
) -> Vec<u64> {
    if pending_count.load(Ordering::Acquire) == 0 || !due(last_sweep_ns, now_ns) {
        return Vec::new();
    }
    expired(pending, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_scan_is_due_once_per_interval() {
        let last = AtomicU64::new(0);
        assert!(due(&last, SWEEP_INTERVAL_NS));
        assert!(!due(&last, SWEEP_INTERVAL_NS + 1), "claimed: the next is an interval later");
        assert!(due(&last, 2 * SWEEP_INTERVAL_NS));
    }

    #[test]
    fn only_passed_deadlines_expire() {
        let now = Instant::now();
        let pending =
            Mutex::new(HashMap::from([(1, now - Duration::from_secs(1)), (2, now + Duration::from_secs(60))]));
        assert_eq!(expired(&pending, |d| *d), vec![1]);
    }
}
