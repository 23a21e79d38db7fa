//! The one system call the launcher needs that `std` lacks: signalling a process group.
#![allow(unsafe_code)]

/// Signals the launcher sends.
#[derive(Copy, Clone, Debug)]
pub enum Signal {
    /// SIGTERM: please exit.
    Terminate,
    /// SIGKILL: exit now.
    Kill,
}

/// Sends `signal` to the process group led by `pid` (each rank leads its own).
pub fn signal_group(pid: u32, signal: Signal) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    let number = match signal {
        Signal::Terminate => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
    };
    // Safety: kill(2) takes plain integers and touches no memory of ours; a group that is
    // already gone returns ESRCH, which is ignored.
    unsafe {
        libc::kill(-pid, number);
    }
}
