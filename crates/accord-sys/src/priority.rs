//! The calling thread's scheduling priority (its nice value, per thread on Linux).
//!
//! Why: DDP runs its all_reduces beside the backward pass, whose intra-op threads keep every
//! core busy. A communication thread then gets a fair share of a core like any other, and each
//! step that waits for all ranks waits for the slowest rank's next time slice
//! (`docs/results/2026-11-27-host-arena.md`). A communication thread with a lower nice value
//! weighs more in the kernel's fair scheduler: it runs soon after it wakes and takes what it
//! needs, which is little beside the computation. Lowering a nice value needs `CAP_SYS_NICE`
//! (or an `RLIMIT_NICE` that allows it); without it the call fails and nothing changes.

use std::io;

/// Lowers the calling thread's nice value to `-raise` (0 leaves it alone). Fails where the
/// process may not (no `CAP_SYS_NICE`), with the thread unchanged.
#[allow(unsafe_code)]
pub fn raise_current_thread(raise: u8) -> io::Result<()> {
    if raise == 0 {
        return Ok(());
    }
    let nice = -i32::from(raise.min(20));
    // Safety: gettid and setpriority take and return plain integers. On Linux
    // PRIO_PROCESS with a thread id changes that thread only.
    let done = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's nice value.
#[allow(unsafe_code)]
pub fn current_thread_nice() -> io::Result<i32> {
    // Safety: as above; getpriority returns -1 both as a value and as an error, so errno is
    // cleared first and read after.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(nice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_leaves_the_thread_alone_and_a_raise_changes_only_this_thread() {
        let before = current_thread_nice().unwrap();
        let raised = std::thread::spawn(move || {
            raise_current_thread(0).unwrap();
            assert_eq!(current_thread_nice().unwrap(), before);
            match raise_current_thread(1) {
                // Root (or CAP_SYS_NICE): this thread is at -1 now, and a thread it starts
                // inherits that (Linux copies the creator's value).
                Ok(()) => {
                    assert_eq!(current_thread_nice().unwrap(), -1);
                    let child = std::thread::spawn(|| current_thread_nice().unwrap()).join().unwrap();
                    assert_eq!(child, -1);
                    true
                }
                // Not allowed: an error, and nothing changed.
                Err(e) => {
                    assert!(matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)), "{e}");
                    assert_eq!(current_thread_nice().unwrap(), before);
                    false
                }
            }
        })
        .join()
        .unwrap();
        // Either way the thread that started it is as it was.
        assert_eq!(current_thread_nice().unwrap(), before, "raised: {raised}");
    }
}
