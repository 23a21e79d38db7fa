//! The owner's thread for writing batched READs back.
//!
//! Why not the completion thread, as a single READ's write back: a batched request is up to
//! [`super::READ_PIECES_PER_REQUEST_MAX`] pieces, and on the staged or landed routes each piece
//! is a device write whose submission waits for room in the staging queue, while each finished
//! piece queues a completion job. Submitting them all from the completion thread would stop it
//! from running those jobs until the last piece was queued: past `COMPLETION_JOBS_MAX` jobs the
//! staging thread would wait for the completion thread, which waits for the staging thread.
//! Here the submissions may wait; completions run as usual.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};

use crate::engine::route::read::limits::{READ_PIECES_PER_REQUEST_MAX, READ_REQUESTS_IN_FLIGHT_MAX};

/// Batched READs an owner has accepted and not started writing back; past that a request is
/// refused (`TooManyMessages`) rather than queued without bound. As many as one reader may have
/// in flight, so a reader's own reads never overflow it while the write-back thread is late:
/// with 256 here, the 257th of 300 reads in flight was refused once, in a CI rehearsal on a
/// 2-core machine whose cores also ran a build (session 52; 12 runs under load since did not
/// repeat it).
pub const READ_WRITE_BACKS_QUEUED_MAX: usize = READ_REQUESTS_IN_FLIGHT_MAX;
/// Runs (contiguous pieces; tens of bytes each, held until written) the queued write backs may
/// hold together: four of the largest requests. Past that a request is refused as above, so
/// what the queue holds stays bounded whatever the requests' sizes.
pub const READ_WRITE_BACK_RUNS_QUEUED_MAX: usize = 4 * READ_PIECES_PER_REQUEST_MAX;

/// One request's write back (submits its pieces, arranges its answer).
pub(crate) type WriteBack = Box<dyn FnOnce() + Send>;

/// The queue of the write-back thread (`accord-read-back`), started on first use; the thread
/// ends once the engine's shared state (holding the queue's sender) is gone.
#[derive(Default)]
pub(crate) struct WriteBacks {
    tx: Mutex<Option<SyncSender<WriteBack>>>,
    /// Runs of the jobs queued and not started.
    runs: Arc<AtomicUsize>,
}

impl WriteBacks {
    /// Queues `job`, which holds `runs` runs until it starts; false (the job dropped unrun) when
    /// [`READ_WRITE_BACKS_QUEUED_MAX`] jobs or [`READ_WRITE_BACK_RUNS_QUEUED_MAX`] runs are
    /// queued already, or the thread could not start.
    pub(crate) fn submit(&self, job: WriteBack, runs: usize) -> bool {
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
                return false;
            }
            *tx = Some(sender);
        }
        let Some(sender) = tx.as_ref() else { return false };
        // Under the lock: the reservation and the send are one step for submitters.
        if self.runs.load(Ordering::Acquire).saturating_add(runs) > READ_WRITE_BACK_RUNS_QUEUED_MAX {
            return false;
        }
        self.runs.fetch_add(runs, Ordering::AcqRel);
        let queued = self.runs.clone();
        let counted: WriteBack = Box::new(move || {
            queued.fetch_sub(runs, Ordering::AcqRel);
            job();
        });
        if sender.try_send(counted).is_err() {
            self.runs.fetch_sub(runs, Ordering::AcqRel);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(20);

    /// Queues a job of `runs` runs that holds the write-back thread until the returned sender
    /// releases it, then sends 0 on the returned receiver (which later jobs share, through the
    /// second sender); returns once that job has started.
    fn hold_the_thread(backs: &WriteBacks, runs: usize) -> (Sender<()>, Sender<usize>, Receiver<usize>) {
        let (release_tx, release_rx) = channel::<()>();
        let (started_tx, started_rx) = channel::<()>();
        let (ran_tx, ran_rx) = channel::<usize>();
        let ran = ran_tx.clone();
        let first: WriteBack = Box::new(move || {
            started_tx.send(()).unwrap();
            release_rx.recv_timeout(WAIT).unwrap();
            ran.send(0).unwrap();
        });
        assert!(backs.submit(first, runs));
        started_rx.recv_timeout(WAIT).unwrap();
        (release_tx, ran_tx, ran_rx)
    }

    #[test]
    fn the_queue_is_bounded_and_jobs_run_in_order() {
        let backs = WriteBacks::default();
        let (release, ran_tx, ran_rx) = hold_the_thread(&backs, 1);
        // Exactly the bound fits behind it; the next is refused.
        for n in 1..=READ_WRITE_BACKS_QUEUED_MAX {
            let ran = ran_tx.clone();
            assert!(backs.submit(Box::new(move || ran.send(n).unwrap()), 1), "job {n}");
        }
        assert!(!backs.submit(Box::new(|| {}), 1), "a full queue refuses the job");
        release.send(()).unwrap();
        let order: Vec<usize> = (0..=READ_WRITE_BACKS_QUEUED_MAX).map(|_| ran_rx.recv_timeout(WAIT).unwrap()).collect();
        assert_eq!(order, (0..=READ_WRITE_BACKS_QUEUED_MAX).collect::<Vec<_>>(), "in submission order");
    }

    #[test]
    fn the_runs_queued_are_bounded_and_freed_as_jobs_start() {
        let backs = WriteBacks::default();
        // The running job's runs no longer count.
        let (release, ran_tx, ran_rx) = hold_the_thread(&backs, READ_WRITE_BACK_RUNS_QUEUED_MAX);
        let half = READ_WRITE_BACK_RUNS_QUEUED_MAX / 2;
        for n in 1..=2 {
            let ran = ran_tx.clone();
            assert!(backs.submit(Box::new(move || ran.send(n).unwrap()), half), "job {n}");
        }
        assert!(!backs.submit(Box::new(|| {}), 1), "one run past the bound is refused");
        release.send(()).unwrap();
        for n in 0..=2 {
            assert_eq!(ran_rx.recv_timeout(WAIT).unwrap(), n);
        }
        let ran = ran_tx.clone();
        assert!(backs.submit(Box::new(move || ran.send(3).unwrap()), READ_WRITE_BACK_RUNS_QUEUED_MAX), "room again");
        assert_eq!(ran_rx.recv_timeout(WAIT).unwrap(), 3);
    }
}
