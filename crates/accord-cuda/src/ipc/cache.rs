//! A bounded cache of IPC mappings, least recently used evicted first: the one the engine's
//! copy-engine route and the GPU collectives share.
//!
//! Why one: both keep peers' allocations mapped across calls (opening a mapping costs a driver
//! round trip and an entry in the peer's context), both bound how many stay open, and both
//! evict the least recently used. They differ only in *when* an evicted mapping may be closed,
//! because closing one synchronises the context: the engine drops it at once (an in-flight copy
//! holds its own `Arc`, so the close waits for that copy), while the collectives keep it until
//! no collective is in flight (a user stream may be blocked on the collective itself). So the
//! cache hands every evicted mapping back to its caller instead of closing it.
//!
//! Generic over the value so that its rules are tested without a GPU.

use std::collections::HashMap;
use std::hash::Hash;

/// At most `max` values by key; the least recently used goes first.
#[derive(Debug)]
pub struct MappingCache<K, V> {
    entries: HashMap<K, (V, u64)>,
    max: usize,
    clock: u64,
    opened_total: u64,
}

impl<K: Hash + Eq + Copy, V: Clone> MappingCache<K, V> {
    /// An empty cache of at most `max` (at least 1) values.
    pub fn new(max: usize) -> MappingCache<K, V> {
        MappingCache { entries: HashMap::new(), max: max.max(1), clock: 0, opened_total: 0 }
    }

    /// The value cached for `key`, marked as just used; on a miss, `open()`'s value, cached.
    /// When that leaves more than `max` cached, the least recently used other value is evicted
    /// and returned as the second element: the caller closes it (drops it) when it is safe.
    /// A failed `open` caches and evicts nothing.
    pub fn get_or_open<E>(&mut self, key: K, open: impl FnOnce() -> Result<V, E>) -> Result<(V, Option<V>), E> {
        self.clock += 1;
        let now = self.clock;
        if let Some((value, used)) = self.entries.get_mut(&key) {
            *used = now;
            return Ok((value.clone(), None));
        }
        let value = open()?;
        self.opened_total += 1;
        self.entries.insert(key, (value.clone(), now));
        let evicted = if self.entries.len() > self.max { self.evict_oldest() } else { None };
        Ok((value, evicted))
    }

    fn evict_oldest(&mut self) -> Option<V> {
        let oldest = self.entries.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k)?;
        self.entries.remove(&oldest).map(|(value, _)| value)
    }

    /// Removes every value whose key `stale` says, and returns them (for the caller to close).
    pub fn remove_where(&mut self, stale: impl Fn(&K) -> bool) -> Vec<V> {
        let keys: Vec<K> = self.entries.keys().filter(|k| stale(k)).copied().collect();
        keys.into_iter().filter_map(|k| self.entries.remove(&k)).map(|(value, _)| value).collect()
    }

    /// Values opened since creation (cache misses).
    pub fn opened_total(&self) -> u64 {
        self.opened_total
    }

    /// Values cached now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(v: u32) -> impl FnOnce() -> Result<u32, String> {
        move || Ok(v)
    }

    #[test]
    fn a_hit_returns_the_cached_value_without_opening() {
        let mut c = MappingCache::new(2);
        assert_eq!(c.get_or_open('a', open(1)), Ok((1, None)));
        assert_eq!(c.get_or_open('a', || Err::<u32, String>("must not open".into())), Ok((1, None)));
        assert_eq!(c.opened_total(), 1);
    }

    #[test]
    fn the_least_recently_used_is_evicted_and_handed_back() {
        let mut c = MappingCache::new(2);
        c.get_or_open('a', open(1)).unwrap();
        c.get_or_open('b', open(2)).unwrap();
        c.get_or_open('a', open(9)).unwrap(); // a is now the most recent
        assert_eq!(c.get_or_open('c', open(3)), Ok((3, Some(2))), "b was least recently used");
        assert_eq!(c.len(), 2);
        assert_eq!(c.get_or_open('b', open(4)), Ok((4, Some(1))), "b reopens; a is now the oldest");
        assert_eq!(c.opened_total(), 4);
    }

    #[test]
    fn a_failed_open_caches_and_evicts_nothing() {
        let mut c = MappingCache::new(1);
        c.get_or_open('a', open(1)).unwrap();
        assert_eq!(c.get_or_open('b', || Err::<u32, _>("no driver")), Err("no driver"));
        assert_eq!((c.len(), c.opened_total()), (1, 1));
        assert_eq!(c.get_or_open('a', open(9)), Ok((1, None)), "a is still cached");
    }

    #[test]
    fn stale_values_are_removed_and_handed_back() {
        let mut c = MappingCache::new(8);
        for (k, v) in [((0, 1), 10), ((1, 1), 11), ((0, 2), 12)] {
            c.get_or_open(k, open(v)).unwrap();
        }
        let mut gone = c.remove_where(|(peer, _)| *peer == 0);
        gone.sort();
        assert_eq!(gone, vec![10, 12]);
        assert_eq!(c.len(), 1);
        assert!(c.remove_where(|_| false).is_empty());
    }
}
