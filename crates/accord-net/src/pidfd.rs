//! Process-exit notification for peers on this host: a pidfd (`pidfd_open(2)`, Linux 5.3+)
//! becomes readable the moment its process exits (zombies included), so a watcher learns of a
//! peer's death in one `poll(2)` wake-up instead of after a network timeout. The process's
//! start time (from `/proc/<pid>/stat`) guards against a recycled pid or a pid that names
//! another process in a different pid namespace: a watch is opened only when both match what
//! the peer advertised.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

/// A descriptor that becomes readable when its process exits.
#[derive(Debug)]
pub struct PidFd {
    fd: OwnedFd,
    pid: u32,
}

impl PidFd {
    /// Opens a pidfd for `pid` (fails with the OS error: no such process, old kernel, ...).
    pub fn open(pid: u32) -> io::Result<PidFd> {
        Ok(PidFd { fd: accord_sys::pidfd_open(pid)?, pid })
    }

    /// Opens a pidfd for `pid` only if the process there started at `start_ticks` (see
    /// [`process_start_ticks`]); `None` when it does not (exited, recycled, other namespace).
    /// The start time is read again after opening, so a pid recycled in between is caught.
    pub fn open_verified(pid: u32, start_ticks: u64) -> Option<PidFd> {
        if start_ticks == 0 || process_start_ticks(pid) != Some(start_ticks) {
            return None;
        }
        let fd = PidFd::open(pid).ok()?;
        (process_start_ticks(pid) == Some(start_ticks)).then_some(fd)
    }

    /// The process watched.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has exited (a zero-timeout poll).
    pub fn exited(&self) -> bool {
        poll_exited(&[self], Duration::ZERO).map(|v| !v.is_empty()).unwrap_or(false)
    }
}

/// Waits up to `timeout` for any of `fds` to report its process's exit; returns the indices
/// of those that did (empty on timeout).
pub fn poll_exited(fds: &[&PidFd], timeout: Duration) -> io::Result<Vec<usize>> {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|f| libc::pollfd { fd: f.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    if pfds.is_empty() {
        std::thread::sleep(timeout);
        return Ok(vec![]);
    }
    // Safety: `pfds` is a valid array of `pfds.len()` pollfd structures for the call's duration.
    let ret = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(vec![]) } else { Err(e) };
    }
    Ok(pfds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents & (libc::POLLIN | libc::POLLHUP) != 0)
        .map(|(i, _)| i)
        .collect())
}

/// The start time of process `pid` in clock ticks after boot (field 22 of `/proc/<pid>/stat`),
/// `None` when there is no such process (or it is a zombie: it has exited).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_start(&text)
}

/// This process's start time (see [`process_start_ticks`]).
pub fn own_start_ticks() -> u64 {
    process_start_ticks(std::process::id()).unwrap_or(0)
}

/// Field 22 of a `/proc/<pid>/stat` line; `None` for a zombie (state `Z`) or a malformed line.
/// The command name (field 2) may hold spaces and parentheses, so fields are counted after
/// its last `)`.
fn parse_stat_start(line: &str) -> Option<u64> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?; // field 3
    if state == "Z" || state == "X" {
        return None;
    }
    // Fields 4..=21 are 18 more; field 22 follows.
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_with_odd_command_name_parses() {
        let line = "1234 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(parse_stat_start(line), Some(987654));
        assert_eq!(parse_stat_start("1 (x) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 5"), None);
        assert_eq!(parse_stat_start("garbage"), None);
    }

    #[test]
    fn own_process_is_watchable_and_alive() {
        let start = own_start_ticks();
        assert!(start > 0);
        let fd = PidFd::open_verified(std::process::id(), start).expect("own pidfd");
        assert!(!fd.exited());
        assert!(PidFd::open_verified(std::process::id(), start + 1).is_none(), "a different start time is refused");
    }

    #[test]
    fn child_exit_is_seen_before_it_is_reaped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let pid = child.id();
        let fd = PidFd::open_verified(pid, process_start_ticks(pid).expect("child runs")).expect("pidfd");
        assert!(!fd.exited());
        child.kill().expect("kill");
        // Not reaped yet: the child is a zombie, which kill(pid, 0) would call alive.
        let seen = poll_exited(&[&fd], Duration::from_secs(10)).expect("poll");
        assert_eq!(seen, vec![0]);
        let _ = child.wait();
    }
}
