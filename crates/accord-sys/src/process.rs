//! Process liveness.
//!
//! `kill(pid, 0)` succeeds on a zombie (a process that exited but was not yet reaped by its
//! parent), and a zombie's `/proc/<pid>` directory still exists, so neither alone tells a dead
//! peer from a live one: a peer whose parent (a launcher, a test harness) has not reaped it yet
//! would look alive forever. The process state in `/proc/<pid>/stat` does tell them apart.

use std::io;

/// Whether process `pid` runs. A zombie (`Z`) or a dead task (`X`) counts as gone, as do pid 0
/// and pids beyond the kernel's range. Reads `/proc/<pid>/stat`; where `/proc` cannot be read
/// (not mounted), falls back to `kill(pid, 0)`, which cannot tell zombies apart. A stat line
/// that cannot be parsed counts as running: declaring a live peer dead fails its work, while
/// the callers' bounded waits catch a dead one that was missed.
pub fn process_alive(pid: u32) -> bool {
    let Ok(signed) = libc::pid_t::try_from(pid) else { return false };
    if signed <= 0 {
        return false;
    }
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(stat_state(&stat), Some(b'Z' | b'X')),
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => false,
        Err(_) => exists_by_signal(signed),
    }
}

/// The state letter of a `/proc/<pid>/stat` line: the first field after the command name,
/// which is in parentheses and may itself contain `)` and spaces, so the last `)` ends it.
fn stat_state(stat: &[u8]) -> Option<u8> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat[close + 1..].iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// Whether `pid` exists by `kill(pid, 0)` (EPERM: it exists, owned by another user).
#[allow(unsafe_code)]
fn exists_by_signal(pid: libc::pid_t) -> bool {
    // Safety: signal 0 performs only the existence and permission check; nothing is sent.
    let ret = unsafe { libc::kill(pid, 0) };
    ret == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A pidfd for process `pid` (`pidfd_open(2)`, Linux 5.3+): EINVAL for pid 0 or a pid beyond
/// the kernel's range, else the OS error (no such process, old kernel). The one place this
/// syscall is made: `accord-net`'s exit watcher and [`take_fd_of`] both open theirs here.
#[allow(unsafe_code)]
pub fn pidfd_open(pid: u32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let signed = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    if signed <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // Safety: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, signed, 0) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // Safety: the kernel just returned this descriptor; nobody else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(ret as std::os::fd::RawFd) })
}

/// A duplicate of process `pid`'s descriptor `fd` (`pidfd_open` + `pidfd_getfd`, Linux 5.6+).
/// The kernel allows it with ptrace permission over `pid`: the same user and, under Yama's
/// scope 1, only a descendant. Used to share GPU memory exported as file descriptors.
#[allow(unsafe_code)]
pub fn take_fd_of(pid: u32, fd: std::os::fd::RawFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let pidfd = pidfd_open(pid).map_err(|e| io::Error::new(e.kind(), format!("pidfd_open({pid}): {e}")))?;
    // Safety: a syscall on integers, the pidfd alive for its duration.
    let taken = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if taken < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("pidfd_getfd of pid {pid}'s descriptor {fd}: {e}")));
    }
    // Safety: the kernel returned a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(taken as std::os::fd::RawFd) })
}

#[cfg(test)]
mod tests;
