//! The system calls the launcher needs that `std` lacks: signalling a process group, taking
//! SIGINT/SIGTERM/SIGHUP/SIGCHLD as readable events (a signalfd) instead of handlers, tying a
//! rank's life to the launcher's (PR_SET_PDEATHSIG), and polling many pipes from one thread.
//! Everything unsafe in the crate lives here, each call with the reason it is sound.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Signals the launcher sends or receives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT: Ctrl-C.
    Interrupt,
    /// SIGTERM: please exit.
    Terminate,
    /// SIGHUP: the terminal went away.
    Hangup,
    /// SIGKILL: exit now.
    Kill,
}

impl Signal {
    /// The Linux signal number.
    pub fn number(self) -> i32 {
        match self {
            Signal::Interrupt => libc::SIGINT,
            Signal::Terminate => libc::SIGTERM,
            Signal::Hangup => libc::SIGHUP,
            Signal::Kill => libc::SIGKILL,
        }
    }

    /// The conventional name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
            Signal::Hangup => "SIGHUP",
            Signal::Kill => "SIGKILL",
        }
    }

    fn from_number(n: i32) -> Option<Signal> {
        match n {
            libc::SIGINT => Some(Signal::Interrupt),
            libc::SIGTERM => Some(Signal::Terminate),
            libc::SIGHUP => Some(Signal::Hangup),
            _ => None,
        }
    }
}

/// Sends `signal` to the process group led by `pid` (each rank leads its own).
pub fn signal_group(pid: u32, signal: Signal) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // Safety: kill(2) takes plain integers and touches no memory of ours; a group that is
    // already gone returns ESRCH, which is ignored.
    unsafe {
        libc::kill(-pid, signal.number());
    }
}

/// Whether child `pid` has exited, without reaping it: while it stays a zombie its process
/// group id cannot be handed to anyone else, so the group can still be signalled safely.
pub fn has_exited(pid: u32) -> bool {
    let pid: libc::id_t = pid;
    // Safety: waitid writes only into the zeroed siginfo we pass; WNOWAIT leaves the child
    // to be reaped by `Child::wait`.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT);
        // ECHILD (already reaped) counts as exited; si_pid stays 0 while it still runs.
        rc != 0 || info.si_pid() != 0
    }
}

/// What the launcher's events arrive on: a signalfd for SIGINT, SIGTERM, SIGHUP and SIGCHLD,
/// which are blocked for this thread while it lives (and unblocked again on drop). Rust's
/// `Command` clears the signal mask in each child before `exec`, so ranks see signals
/// normally.
pub struct SignalEvents {
    fd: OwnedFd,
    old_mask: libc::sigset_t,
}

/// What [`SignalEvents::read`] found.
#[derive(Debug, Default)]
pub struct Arrived {
    /// SIGINT, SIGTERM or SIGHUP, in arrival order.
    pub stops: Vec<Signal>,
    /// Whether a child changed state.
    pub child: bool,
}

impl SignalEvents {
    /// Blocks the four signals for the calling thread and opens the signalfd. Call before any
    /// thread is started, so none of them takes the signals instead.
    pub fn open() -> io::Result<SignalEvents> {
        // Safety: the sigset functions only write into the sets we own; pthread_sigmask and
        // signalfd take pointers to them for the duration of the call.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGCHLD] {
                libc::sigaddset(&mut set, s);
            }
            let mut old_mask: libc::sigset_t = std::mem::zeroed();
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask);
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
            if fd < 0 {
                let e = io::Error::last_os_error();
                libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
                return Err(e);
            }
            Ok(SignalEvents { fd: OwnedFd::from_raw_fd(fd), old_mask })
        }
    }

    /// Drains every pending signal.
    pub fn read(&self) -> Arrived {
        let mut arrived = Arrived::default();
        loop {
            // Safety: read(2) writes at most size_of::<signalfd_siginfo>() bytes into `info`,
            // a plain struct for which all bytes are valid.
            let (n, info) = unsafe {
                let mut info: libc::signalfd_siginfo = std::mem::zeroed();
                let size = std::mem::size_of::<libc::signalfd_siginfo>();
                let n = libc::read(self.fd.as_raw_fd(), (&mut info as *mut libc::signalfd_siginfo).cast(), size);
                (n, info)
            };
            if n != std::mem::size_of::<libc::signalfd_siginfo>() as isize {
                return arrived;
            }
            let number = info.ssi_signo as i32;
            if number == libc::SIGCHLD {
                arrived.child = true;
            } else if let Some(s) = Signal::from_number(number) {
                arrived.stops.push(s);
            }
        }
    }

    /// The descriptor to poll.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for SignalEvents {
    fn drop(&mut self) {
        // Anything still pending was read by the owner or is dropped with the descriptor:
        // drain it so unblocking does not deliver a stale SIGINT with its default action.
        let _ = self.read();
        // Safety: restores the mask saved in `open`; the pointer is to our own field.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut());
        }
    }
}

/// Readiness of one polled descriptor.
#[derive(Copy, Clone, Debug, Default)]
pub struct Ready {
    /// Data, end of file or an error is waiting: a read will not block.
    pub readable: bool,
}

/// Waits at most `timeout` for any of `fds` to become readable (or hung up); one entry per fd.
/// An interrupted wait returns with nothing ready.
pub fn poll_readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<Ready>> {
    let mut polled: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // Safety: poll(2) reads and writes `polled.len()` entries of the vector we own.
    let rc = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![Ready::default(); fds.len()]);
        }
        return Err(e);
    }
    Ok(polled
        .iter()
        .map(|p| Ready { readable: p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 })
        .collect())
}

/// Makes reads of `fd` return `WouldBlock` instead of waiting.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // Safety: fcntl on a descriptor we own, with integer arguments only.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The soft and hard limits on open descriptors.
pub fn fd_limits() -> (u64, u64) {
    // Safety: getrlimit writes into the struct we pass.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return (1024, 1024);
        }
        (r.rlim_cur, r.rlim_max)
    }
}

/// Raises the soft limit on open descriptors to `wanted` (at most the hard limit), since the
/// launcher holds two pipes per rank; returns the soft limit in force.
pub fn raise_fd_limit(wanted: u64) -> u64 {
    let (soft, hard) = fd_limits();
    if soft >= wanted {
        return soft;
    }
    let new = wanted.min(hard);
    let r = libc::rlimit { rlim_cur: new, rlim_max: hard };
    // Safety: setrlimit reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } == 0 {
        new
    } else {
        soft
    }
}

/// Runs in each rank between `fork` and `exec` (async-signal-safe calls only): the kernel
/// sends the rank SIGKILL when the launcher dies, however it dies; a launcher that died
/// before this ran is caught by comparing the parent. Also gives the rank back the
/// descriptor limit the launcher started with.
pub fn tie_to_parent(launcher: libc::pid_t, fd_soft_limit: u64) -> io::Result<()> {
    // Safety: prctl, getppid and setrlimit are plain system calls, safe between fork and exec.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::getppid() != launcher {
            // The launcher is gone already (ESRCH: no such process); the rank never starts.
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur > fd_soft_limit {
            r.rlim_cur = fd_soft_limit;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
    Ok(())
}

/// Installs [`tie_to_parent`] as `command`'s pre-exec hook.
pub fn tie_command_to_this_process(command: &mut std::process::Command, fd_soft_limit: u64) {
    use std::os::unix::process::CommandExt;
    let launcher = std::process::id() as libc::pid_t;
    // Safety: the hook only makes async-signal-safe system calls and allocates nothing.
    unsafe {
        command.pre_exec(move || tie_to_parent(launcher, fd_soft_limit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_numbers_round_trip() {
        for s in [Signal::Interrupt, Signal::Terminate, Signal::Hangup] {
            assert_eq!(Signal::from_number(s.number()), Some(s));
            assert!(s.name().starts_with("SIG"));
        }
        assert_eq!(Signal::from_number(libc::SIGKILL), None, "the launcher never receives SIGKILL");
    }

    #[test]
    fn poll_sees_a_closed_pipe_as_readable() {
        let mut child = std::process::Command::new("true").stdout(std::process::Stdio::piped()).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        child.wait().unwrap();
        let ready = poll_readable(&[out.as_raw_fd()], Duration::from_secs(10)).unwrap();
        assert!(ready[0].readable, "end of file is readable");
    }

    #[test]
    fn an_exited_child_is_seen_before_it_is_reaped() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let mut seen = false;
        for _ in 0..10_000 {
            if has_exited(pid) {
                seen = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(seen, "`true` never exited");
        assert!(child.wait().unwrap().success(), "has_exited left the status to reap");
    }
}
