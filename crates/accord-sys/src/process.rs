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

#[cfg(test)]
mod tests;
