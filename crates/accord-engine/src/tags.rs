//! Operation tags: what makes a resent part exactly-once across a failover or a reconnect.
//!
//! A part whose connection was lost is resent: on another lane when a NIC failed, or on a
//! fresh connection of its own lane after an outage outlasted the idle timeout (see
//! `Worker::connection_lost`). Its first copy may have landed, only the acknowledgement lost.
//! Nothing of the receiver's per-connection state (receive window, partial operations)
//! carries over to a new connection: packet numbers start afresh. What survives is
//! engine-wide, and this is the rule:
//!
//! - A part keeps one tag for life, chosen here: every copy carries it.
//! - The receiver remembers the tags of the operations it completed (an immediate counted, a
//!   message delivered), across all its connections and lanes, the last [`TAGS_REMEMBERED`].
//! - A completion whose tag is remembered is not counted again (a duplicate message's buffer
//!   goes back to the pool).
//! - The packets of an operation whose tag is remembered are acknowledged, so the sender
//!   completes, but not placed (`accord_proto::LocalMemory::already_completed`): the
//!   receiver may have reused the memory once it saw the immediate.
//! - A plain write (no immediate) is not tracked by the receiver: a resent copy places the
//!   same bytes again. Nothing told the receiver it had completed (only its sender learns
//!   that, after the last copy was acknowledged), so nothing can have reused the memory yet.
//!
//! A resend leaves within `idle_timeout + peer_dead_after` of the original (then the part
//! fails), so [`TAGS_REMEMBERED`] need only cover the operations completed in that time.
//! Left open: a copy whose first packet arrived *before* the original completed is placed to
//! its end; both copies hold the sender's same bytes, so this matters only if a packet of the
//! abandoned connection is delayed in the network past the idle timeout.

use crate::recent::Recent;
#[cfg(test)]
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Tags a receiver remembers. A duplicate arrives at most a connection timeout after the
/// original, so this only needs to cover the operations that complete in that time.
pub const TAGS_REMEMBERED: usize = 1 << 18;

/// Hands out tags unique within this engine and unlikely to collide with another engine's:
/// a bijective mix of a random base plus a counter.
pub(crate) struct TagSource {
    base: u64,
    next: AtomicU64,
}

impl TagSource {
    pub(crate) fn new(random_base: u64) -> Self {
        TagSource { base: random_base, next: AtomicU64::new(1) }
    }

    /// A fresh non-zero tag (zero means "no tag" on the wire).
    pub(crate) fn next(&self) -> u64 {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let tag = mix(self.base.wrapping_add(n));
            if tag != 0 {
                return tag;
            }
        }
    }
}

/// splitmix64's finaliser: a bijection on u64, so distinct inputs give distinct tags.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The receiver's memory of tags already counted, bounded by [`TAGS_REMEMBERED`].
#[derive(Default)]
pub(crate) struct SeenTags {
    inner: Mutex<Recent<u64, (), TAGS_REMEMBERED>>,
}

impl SeenTags {
    /// Whether `tag` was seen (completed here) and is still remembered; never for 0.
    pub(crate) fn contains(&self, tag: u64) -> bool {
        tag != 0 && self.inner.lock().unwrap().contains(&tag)
    }

    /// True the first time `tag` is seen (and for the untagged 0, always).
    pub(crate) fn first_time(&self, tag: u64) -> bool {
        tag == 0 || self.inner.lock().unwrap().insert(tag, ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_unique_and_nonzero() {
        let source = TagSource::new(12345);
        let tags: HashSet<u64> = (0..100_000).map(|_| source.next()).collect();
        assert_eq!(tags.len(), 100_000);
        assert!(!tags.contains(&0));
    }

    #[test]
    fn a_tag_counts_once_within_the_bound() {
        let seen = SeenTags::default();
        assert!(!seen.contains(7));
        assert!(seen.first_time(7));
        assert!(seen.contains(7) && !seen.contains(0));
        assert!(!seen.first_time(7), "a resent operation is not counted again");
        assert!(seen.first_time(0) && seen.first_time(0), "untagged operations always count");
        for t in 100..100 + TAGS_REMEMBERED as u64 {
            seen.first_time(t);
        }
        assert!(seen.first_time(7), "the oldest tag is forgotten first");
    }
}
