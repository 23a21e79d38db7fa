//! The owner's thread for writing batched READs back.
//!
//! Why not the completion thread, as a single READ's write back: a batched request is up to
//! [`super::READ_PIECES_PER_REQUEST_MAX`] pieces, and on the staged or landed routes each piece
//! is a device write whose submission waits for room in the staging queue, while each finished
//! piece queues a completion job. Submitting them all from the completion thread would stop it
//! from running those jobs until the last piece was queued: past `COMPLETION_JOBS_MAX` jobs the
//! staging thread would wait for the completion thread, which waits for the staging thread.
//! Here the submissions may wait; completions run as usual.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Mutex;

/// Batched READs an owner has accepted and not started writing back; past that a request is
/// refused (`TooManyMessages`) rather than queued without bound.
pub const READ_WRITE_BACKS_QUEUED_MAX: usize = 256;

/// One request's write back (submits its pieces, arranges its answer).
pub(crate) type WriteBack = Box<dyn FnOnce() + Send>;

/// The queue of the write-back thread (`accord-read-back`), started on first use; the thread
/// ends once the engine's shared state (holding the queue's sender) is gone.
#[derive(Default)]
pub(crate) struct WriteBacks {
    tx: Mutex<Option<SyncSender<WriteBack>>>,
}

impl WriteBacks {
    /// Queues `job`; gives it back when [`READ_WRITE_BACKS_QUEUED_MAX`] are queued or the thread
    /// could not start.
    pub(crate) fn submit(&self, job: WriteBack) -> Result<(), WriteBack> {
        let mut tx = self.tx.lock().unwrap();
        if tx.is_none() {
            let (sender, receiver) = sync_channel::<WriteBack>(READ_WRITE_BACKS_QUEUED_MAX);
            let spawned = std::thread::Builder::new().name("accord-read-back".into()).spawn(move || {
                while let Ok(job) = receiver.recv() {
                    job();
                }
            });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "could not start the batched READ write-back thread");
                return Err(job);
            }
            *tx = Some(sender);
        }
        let Some(sender) = tx.as_ref() else { return Err(job) };
        sender.try_send(job).map_err(|e| match e {
            TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn the_queue_is_bounded_and_jobs_run_in_order() {
        const WAIT: Duration = Duration::from_secs(20);
        let backs = WriteBacks::default();
        let (release_tx, release_rx) = channel::<()>();
        let (started_tx, started_rx) = channel::<()>();
        let (ran_tx, ran_rx) = channel::<usize>();
        // The first job holds the thread until released.
        let ran = ran_tx.clone();
        let first: WriteBack = Box::new(move || {
            started_tx.send(()).unwrap();
            release_rx.recv_timeout(WAIT).unwrap();
            ran.send(0).unwrap();
        });
        assert!(backs.submit(first).is_ok());
        started_rx.recv_timeout(WAIT).unwrap();
        // Exactly the bound fits behind it; the next is given back.
        for n in 1..=READ_WRITE_BACKS_QUEUED_MAX {
            let ran = ran_tx.clone();
            assert!(backs.submit(Box::new(move || ran.send(n).unwrap())).is_ok(), "job {n}");
        }
        assert!(backs.submit(Box::new(|| {})).is_err(), "a full queue gives the job back");
        release_tx.send(()).unwrap();
        let order: Vec<usize> = (0..=READ_WRITE_BACKS_QUEUED_MAX).map(|_| ran_rx.recv_timeout(WAIT).unwrap()).collect();
        assert_eq!(order, (0..=READ_WRITE_BACKS_QUEUED_MAX).collect::<Vec<_>>(), "in submission order");
    }
}
