//! `SIGUSR1` as a request for diagnostics: the handler only counts (an atomic increment is
//! async-signal-safe); a thread that polls [`count`] does the work (stuck reports).
#![allow(unsafe_code)]

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

static USR1: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr1(_signal: libc::c_int) {
    USR1.fetch_add(1, Ordering::Relaxed);
}

/// Installs the counting handler for `SIGUSR1` (replacing the default action, which would
/// end the process). Idempotent.
pub fn install() -> io::Result<()> {
    // Safety: a zeroed sigaction is a valid starting value; the handler only touches an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `SIGUSR1`s received since [`install`].
pub fn count() -> u64 {
    USR1.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_raised_sigusr1_is_counted() {
        super::install().expect("installed");
        let before = super::count();
        // Safety: raise(2) delivers to this thread; the handler only counts.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
        assert!(super::count() > before);
    }
}
