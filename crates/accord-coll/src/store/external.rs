//! Rendezvous through a key-value store someone else runs.
//!
//! Why: inside a framework job (PyTorch's c10d, a launcher's agent) a store already exists and
//! the rendezvous port belongs to it. Opening a second server there either fails (the port is
//! taken) or needs a port the job never agreed on. [`KeyValueStore`] is the little a
//! rendezvous needs (set, and a get that waits), so any such store can carry the exchange of
//! engine addresses, and the job opens no port of its own for it.

use std::time::Duration;

use super::StoreClient;
use crate::error::StoreError;
use crate::transport::WORLD_SIZE_MAX;

/// The operations a rendezvous needs from a store.
///
/// `get` must wait until the key is set, up to `timeout`, and report a timeout as
/// [`StoreError::KeyTimeout`] naming the key (other failures as any other [`StoreError`]).
pub trait KeyValueStore: Send {
    /// Sets `key` to `value`, replacing any value.
    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// The value of `key`, waiting up to `timeout` for some rank to set it.
    fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError>;
}

impl KeyValueStore for StoreClient {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        StoreClient::set(self, key, value)
    }

    fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        StoreClient::get(self, key, timeout)
    }
}

/// Every rank's `blob`, by rank, exchanged through `store` under keys that start with
/// `prefix` (give each exchange its own prefix: keys are never deleted). Every rank of
/// `world_size` calls it with the same prefix. Waits up to `timeout` per missing rank; a rank
/// that never published is named in [`StoreError::RanksMissing`].
pub fn all_gather_through(
    store: &mut dyn KeyValueStore,
    prefix: &str,
    rank: usize,
    world_size: usize,
    blob: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, StoreError> {
    if world_size == 0 || world_size > WORLD_SIZE_MAX || rank >= world_size {
        return Err(StoreError::InvalidEnv {
            name: "RANK",
            value: rank.to_string(),
            reason: format!("rank {rank} of world size {world_size}: give 0 <= rank < world_size <= {WORLD_SIZE_MAX}"),
        });
    }
    let key = |r: usize| format!("{prefix}{r}");
    store.set(&key(rank), blob)?;
    (0..world_size)
        .map(|r| match store.get(&key(r), timeout) {
            Err(StoreError::KeyTimeout { waited, .. }) => Err(StoreError::RanksMissing { missing: vec![r], waited }),
            other => other,
        })
        .collect()
}
