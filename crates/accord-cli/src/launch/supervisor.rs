//! The launcher's one loop: waits on the signalfd and every rank's output pipe at once, notes
//! ranks that exited, and stops the job (signal passed on, grace period, SIGKILL) when a rank
//! fails, a signal arrives or a launch fails. It returns only once every rank was reaped.

use super::output::Stream;
use super::watchdog::Watchdog;
use super::TERMINATE_GRACE;
use crate::signal::{self, Signal, SignalEvents};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Longest sleep between looks at the ranks when no event arrives (SIGCHLD normally wakes
/// the loop at once; this only bounds a missed wake-up).
const IDLE_WAIT: Duration = Duration::from_millis(200);
/// How long output still arriving after the last rank exited is copied, through pipes a
/// process outside the ranks' groups may hold open.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);

/// One started rank.
pub struct Rank {
    index: u32,
    child: Child,
    status: Option<ExitStatus>,
}

impl Rank {
    /// Rank `index`, running as `child`.
    pub fn new(index: u32, child: Child) -> Rank {
        Rank { index, child, status: None }
    }

    fn running(&self) -> bool {
        self.status.is_none()
    }
}

/// How the job ended.
#[derive(Debug)]
pub enum Stopped {
    /// Every rank exited with status 0.
    AllSucceeded,
    /// This rank failed first; the others were stopped.
    RankFailed { rank: u32, status: ExitStatus },
    /// The launcher got this signal and passed it on.
    Signalled(Signal),
    /// A rank could not be started; those started were stopped.
    LaunchFailed(String),
}

/// A stop in progress: why, and when SIGKILL follows.
struct Stop {
    why: Stopped,
    kill_at: Instant,
    killed: bool,
}

/// The ranks, their output and the signals of one launch.
pub struct Supervisor {
    events: SignalEvents,
    watchdog: Option<Watchdog>,
    ranks: Vec<Rank>,
    streams: Vec<Stream>,
    stop: Option<Stop>,
}

impl Supervisor {
    /// A supervisor with no ranks yet, taking signals from `events`, telling `watchdog` (if
    /// any) which process groups to kill should this process die.
    pub fn new(events: SignalEvents, watchdog: Option<Watchdog>) -> Supervisor {
        Supervisor { events, watchdog, ranks: Vec::new(), streams: Vec::new(), stop: None }
    }

    /// Adopts a started rank and its output.
    pub fn add(&mut self, rank: Rank, streams: Vec<Stream>) {
        if let Some(w) = self.watchdog.as_mut() {
            w.started(rank.child.id());
        }
        self.ranks.push(rank);
        self.streams.extend(streams);
    }

    /// Whether the job is being stopped (no further rank should start).
    pub fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    /// A rank could not be started: stop those that were.
    pub fn stop_for_launch_failure(&mut self, message: String) {
        if self.stop.is_none() {
            self.begin_stop(Stopped::LaunchFailed(message), Signal::Terminate);
        }
    }

    /// Acts on the signals that arrived so far, without waiting.
    pub fn take_signals(&mut self) {
        for s in self.events.read().stops {
            self.on_signal(s);
        }
    }

    /// Supervises until every rank exited and was reaped; how the job ended.
    pub fn run(mut self) -> Stopped {
        loop {
            self.note_exits();
            if self.ranks.iter().all(|r| !r.running()) {
                break;
            }
            let now = Instant::now();
            let mut wait = IDLE_WAIT;
            if let Some(stop) = self.stop.as_mut() {
                if !stop.killed && now >= stop.kill_at {
                    stop.killed = true;
                    Self::signal_running(&self.ranks, Signal::Kill);
                }
                if !stop.killed {
                    wait = wait.min(stop.kill_at - now);
                }
            }
            self.wait_for_events(wait);
        }
        self.drain_output();
        if let Some(w) = self.watchdog.take() {
            w.finish();
        }
        match self.stop {
            Some(stop) => stop.why,
            None => Stopped::AllSucceeded,
        }
    }

    /// Polls the signalfd and the open pipes for at most `wait`, then handles what is ready.
    fn wait_for_events(&mut self, wait: Duration) {
        let open: Vec<usize> = (0..self.streams.len()).filter(|&i| self.streams[i].raw_fd().is_some()).collect();
        let mut fds = vec![self.events.raw_fd()];
        fds.extend(open.iter().filter_map(|&i| self.streams[i].raw_fd()));
        let ready = match signal::poll_readable(&fds, wait) {
            Ok(ready) => ready,
            Err(e) => {
                // Should not happen (poll fails only on bad arguments); never spin on it.
                eprintln!("accord run: poll failed: {e}");
                std::thread::sleep(wait);
                return;
            }
        };
        if ready[0].readable {
            self.take_signals();
        }
        for (k, &i) in open.iter().enumerate() {
            if ready[k + 1].readable {
                self.streams[i].pump();
            }
        }
    }

    /// Reaps every rank that exited, after killing what it left in its process group (the
    /// group id stays the rank's while it is an unreaped zombie, so no other process can
    /// be hit). The first failure, with no stop under way, stops the others.
    fn note_exits(&mut self) {
        let mut failed = None;
        for rank in self.ranks.iter_mut().filter(|r| r.running()) {
            if !signal::has_exited(rank.child.id()) {
                continue;
            }
            signal::signal_group(rank.child.id(), Signal::Kill);
            if let Some(w) = self.watchdog.as_mut() {
                w.reaping(rank.child.id());
            }
            let status = match rank.child.wait() {
                Ok(status) => status,
                Err(e) => {
                    eprintln!("accord run: cannot reap rank {}: {e}", rank.index);
                    std::os::unix::process::ExitStatusExt::from_raw(1 << 8)
                }
            };
            rank.status = Some(status);
            if !status.success() && failed.is_none() {
                failed = Some((rank.index, status));
            }
        }
        if let (Some((rank, status)), None) = (failed, &self.stop) {
            self.begin_stop(Stopped::RankFailed { rank, status }, Signal::Terminate);
        }
    }

    /// SIGINT, SIGTERM or SIGHUP to the launcher: the first is passed on to every rank, which
    /// gets the grace period; one more (or any during another stop) kills them at once.
    fn on_signal(&mut self, s: Signal) {
        match self.stop.as_mut() {
            None => {
                eprintln!(
                    "accord run: got {}: passed it on to the ranks; SIGKILL follows in {} s (send it again to kill now)",
                    s.name(),
                    TERMINATE_GRACE.as_secs()
                );
                self.begin_stop(Stopped::Signalled(s), s);
            }
            Some(stop) if !stop.killed => {
                eprintln!("accord run: got {} again: killing the ranks", s.name());
                stop.killed = true;
                Self::signal_running(&self.ranks, Signal::Kill);
            }
            Some(_) => {}
        }
    }

    fn begin_stop(&mut self, why: Stopped, first: Signal) {
        Self::signal_running(&self.ranks, first);
        self.stop = Some(Stop { why, kill_at: Instant::now() + TERMINATE_GRACE, killed: false });
    }

    fn signal_running(ranks: &[Rank], s: Signal) {
        for rank in ranks.iter().filter(|r| r.running()) {
            signal::signal_group(rank.child.id(), s);
        }
    }

    /// Copies output still buffered in the pipes once every rank is gone; a pipe held open by
    /// a process that left the ranks' groups is given up after [`DRAIN_AFTER_EXIT`].
    fn drain_output(&mut self) {
        let deadline = Instant::now() + DRAIN_AFTER_EXIT;
        while self.streams.iter().any(|s| s.raw_fd().is_some()) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.wait_for_events(deadline - now);
        }
        for stream in &mut self.streams {
            stream.close();
        }
    }
}
