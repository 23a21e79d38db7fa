//! A small least-recently-used map with a fixed maximum number of entries.

/// Least-recently-used map holding at most `capacity` entries. Lookups are
/// linear, which is right for the few dozen compiled modules it holds.
#[derive(Debug)]
pub struct BoundedCache<K, V> {
    capacity: usize,
    tick: u64,
    entries: Vec<(K, V, u64)>,
    evictions: u64,
}

impl<K: PartialEq, V: Clone> BoundedCache<K, V> {
    /// An empty cache for at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> BoundedCache<K, V> {
        BoundedCache { capacity: capacity.max(1), tick: 0, entries: Vec::new(), evictions: 0 }
    }

    /// The value under `key`, marking it most recently used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.iter_mut().find(|(k, _, _)| k == key).map(|(_, v, used)| {
            *used = tick;
            v.clone()
        })
    }

    /// Inserts or replaces `key`, evicting the least recently used entry when full.
    pub fn insert(&mut self, key: K, value: V) {
        self.tick += 1;
        if let Some(entry) = self.entries.iter_mut().find(|(k, _, _)| *k == key) {
            entry.1 = value;
            entry.2 = self.tick;
            return;
        }
        if self.entries.len() >= self.capacity {
            let oldest = self.entries.iter().enumerate().min_by_key(|(_, (_, _, used))| *used).map(|(i, _)| i);
            if let Some(index) = oldest {
                self.entries.swap_remove(index);
                self.evictions += 1;
            }
        }
        self.entries.push((key, value, self.tick));
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The maximum number of entries.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}
