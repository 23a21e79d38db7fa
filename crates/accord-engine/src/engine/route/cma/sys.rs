#![allow(unsafe_code)]
//! Cross-memory attach: copying from another process's memory with one system call, the kernel
//! moving the bytes (one copy, no shared buffer in between).

use std::io;

/// Copies `len` bytes at address `remote` of process `pid` to `local`. Partial reads (the
/// kernel may stop at a page boundary) are continued; an error names how far it got.
///
/// # Safety
/// `local..local + len` must be memory of this process that stays valid and writable for the
/// call and that nothing else reads or writes meanwhile except as the caller allows (the
/// engine holds the destination region's table lock, as it does while placing a datagram).
pub(crate) unsafe fn read_from_process(pid: i32, remote: u64, local: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let local_iov = libc::iovec { iov_base: local.add(done).cast(), iov_len: len - done };
        let remote_iov = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        let n = libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io::Error::new(e.kind(), format!("process_vm_readv after {done} of {len} bytes: {e}")));
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("process_vm_readv stopped at {done}")));
        }
        done += n as usize;
    }
    Ok(())
}
