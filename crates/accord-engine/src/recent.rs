//! [`Recent`]: the most recent keys a receiver took, each with what it answered, at most `MAX`
//! of them, the oldest forgotten first.
//!
//! Why one type: a request resent after its connection failed reaches its receiver twice, and
//! four receivers must take it once: the transport's completed-operation tags
//! ([`crate::tags`]), an owner's READ requests (`engine/route/read/state.rs`), the pull route's
//! served pulls (`engine/route/cma/state.rs`) and the landing route's inline asks
//! (`engine/route/landing/receiver.rs`). Each keeps the keys of the last
//! requests it took, bounded so that a flood of new ones cannot grow it.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// At most `MAX` keys with a value each; inserting a new key past the bound forgets the oldest.
#[derive(Debug)]
pub(crate) struct Recent<K, V, const MAX: usize> {
    values: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K, V, const MAX: usize> Default for Recent<K, V, MAX> {
    fn default() -> Self {
        Recent { values: HashMap::new(), order: VecDeque::new() }
    }
}

impl<K: Copy + Eq + Hash, V, const MAX: usize> Recent<K, V, MAX> {
    /// The value of `key`, if it is remembered.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.values.get(key)
    }

    /// The value of `key` to change, if it is remembered.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.values.get_mut(key)
    }

    /// Whether `key` is remembered.
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.values.contains_key(key)
    }

    /// Remembers `value` for `key`; true when `key` is new (a known key keeps its place in the
    /// order and takes the new value). A new key past the bound forgets the oldest.
    pub(crate) fn insert(&mut self, key: K, value: V) -> bool {
        if self.values.insert(key, value).is_some() {
            return false;
        }
        self.order.push_back(key);
        if self.order.len() > MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.values.remove(&oldest);
            }
        }
        true
    }

    /// Keys remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_keys_past_the_bound_forget_the_oldest_and_known_keys_take_new_values() {
        let mut r: Recent<u32, &str, 3> = Recent::default();
        assert!(r.insert(1, "a") && r.insert(2, "b") && r.insert(3, "c"));
        assert!(!r.insert(1, "A"), "known: no new place");
        assert_eq!(r.get(&1), Some(&"A"));
        assert!(r.insert(4, "d"));
        assert_eq!((r.len(), r.contains(&1), r.contains(&4)), (3, false, true), "1 was the oldest");
        *r.get_mut(&2).unwrap() = "B";
        assert_eq!(r.get(&2), Some(&"B"));
        assert_eq!(r.get_mut(&9), None);
    }
}
