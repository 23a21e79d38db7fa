//! Every system call of the UDP driver, and the only `unsafe` of this crate.
//!
//! Kept to thin wrappers that take and return safe Rust types, so the driver
//! logic in `mod.rs` stays safe. Linux only: `sendmmsg`/`recvmmsg`,
//! `UDP_SEGMENT`/`UDP_GRO` and the TOS/TCLASS control messages.
#![allow(unsafe_code)]

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::slice::ChunksExactMut;
use std::time::Duration;

/// Most messages handed to one `sendmmsg`/`recvmmsg` call; Linux caps a
/// call at `UIO_MAXIOV` (1024) and gains little past a few dozen.
pub(crate) const MMSG_BATCH_MAX: usize = 64;

/// Control-message space per message: room for `UDP_SEGMENT` or `UDP_GRO`
/// plus `IP_TOS`/`IPV6_TCLASS`, each at most an `int`.
const CMSG_BUF_BYTES: usize = 64;

/// `SO_SNDBUFFORCE` / `SO_RCVBUFFORCE` (asm-generic values, x86 and arm).
pub(crate) const SO_SNDBUFFORCE: libc::c_int = 32;
/// See [`SO_SNDBUFFORCE`].
pub(crate) const SO_RCVBUFFORCE: libc::c_int = 33;

#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_BUF_BYTES]);

/// One message for [`send_mmsg`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutMsg<'a> {
    pub dst: SocketAddr,
    pub bytes: &'a [u8],
    /// `UDP_SEGMENT` size, for an offloaded segmented send.
    pub segment_bytes: Option<u16>,
    /// ECN codepoint to put in the TOS / traffic-class byte.
    pub ecn_codepoint: Option<u8>,
}

/// What [`recv_mmsg`] learned about one message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InMsg {
    pub len: usize,
    pub src: SocketAddr,
    /// `UDP_GRO` stride when the kernel coalesced packets.
    pub gro_segment_bytes: Option<usize>,
    /// TOS / traffic-class byte, when the kernel reported it.
    pub tos: Option<u8>,
    /// The datagram did not fit its slot (`MSG_TRUNC`).
    pub truncated: bool,
}

impl Default for InMsg {
    fn default() -> Self {
        InMsg {
            len: 0,
            src: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            gro_segment_bytes: None,
            tos: None,
            truncated: false,
        }
    }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `setsockopt` with an `int` value.
pub(crate) fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // Safety: `value` lives across the call and the length passed is its size.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    cvt(ret).map(drop)
}

/// `getsockopt` of an `int` value.
pub(crate) fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // Safety: `value` and `len` are valid for writes and `len` is `value`'s size.
    let ret = unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut libc::c_int).cast(), &mut len) };
    cvt(ret).map(|_| value)
}

/// Writes `addr` into `storage`; returns the length to pass to the kernel.
fn write_sockaddr(addr: &SocketAddr, storage: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // Safety: sockaddr_storage is larger than and aligned for every
            // sockaddr type; the write stays inside `storage`.
            unsafe { std::ptr::write((storage as *mut libc::sockaddr_storage).cast(), sin) };
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // Safety: as above, sockaddr_storage holds a sockaddr_in6.
            unsafe { std::ptr::write((storage as *mut libc::sockaddr_storage).cast(), sin6) };
            mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads the address the kernel wrote into `storage`.
fn read_sockaddr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // Safety: the family says the kernel wrote a sockaddr_in, and
            // sockaddr_storage is aligned for it.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // Safety: as above, for sockaddr_in6.
            let sin6: libc::sockaddr_in6 = unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Appends one control message to `hdr`'s control buffer. `hdr.msg_control`
/// must point at a `CmsgBuf` and `msg_controllen` be the space used so far.
///
/// Safety: `hdr.msg_control` points at a live `CmsgBuf` with room for
/// `used + CMSG_SPACE(size_of::<T>())` bytes.
unsafe fn push_cmsg<T: Copy>(hdr: &mut libc::msghdr, level: libc::c_int, kind: libc::c_int, value: T) {
    // msg_controllen is size_t on glibc but socklen_t on musl.
    #[allow(clippy::unnecessary_cast)]
    let used = hdr.msg_controllen as usize;
    let space = libc::CMSG_SPACE(mem::size_of::<T>() as u32) as usize;
    debug_assert!(used + space <= CMSG_BUF_BYTES);
    let cmsg = hdr.msg_control.cast::<u8>().add(used).cast::<libc::cmsghdr>();
    (*cmsg).cmsg_level = level;
    (*cmsg).cmsg_type = kind;
    (*cmsg).cmsg_len = libc::CMSG_LEN(mem::size_of::<T>() as u32) as _;
    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<T>(), value);
    hdr.msg_controllen = (used + space) as _;
}

/// Sends up to [`MMSG_BATCH_MAX`] messages from one socket with one
/// `sendmmsg`; returns how many the kernel took (a prefix). `EINTR` is retried.
pub(crate) fn send_mmsg(fd: RawFd, ipv6: bool, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
    let count = msgs.len().min(MMSG_BATCH_MAX);
    if count == 0 {
        return Ok(0);
    }
    // Safety: all-zero is a valid value of these plain C structs (null
    // pointers, zero lengths).
    let mut names: [libc::sockaddr_storage; MMSG_BATCH_MAX] = unsafe { mem::zeroed() };
    let mut iovs: [libc::iovec; MMSG_BATCH_MAX] = unsafe { mem::zeroed() };
    let mut hdrs: [libc::mmsghdr; MMSG_BATCH_MAX] = unsafe { mem::zeroed() };
    let mut cmsgs = [CmsgBuf([0; CMSG_BUF_BYTES]); MMSG_BATCH_MAX];

    for (i, msg) in msgs[..count].iter().enumerate() {
        let name_len = write_sockaddr(&msg.dst, &mut names[i]);
        iovs[i] = libc::iovec { iov_base: msg.bytes.as_ptr() as *mut libc::c_void, iov_len: msg.bytes.len() };
        let hdr = &mut hdrs[i].msg_hdr;
        hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
        hdr.msg_namelen = name_len;
        hdr.msg_iov = &mut iovs[i];
        hdr.msg_iovlen = 1;
        hdr.msg_control = cmsgs[i].0.as_mut_ptr().cast();
        hdr.msg_controllen = 0;
        // Safety: msg_control points at cmsgs[i], 64 bytes, and at most two
        // int-sized messages (2 x CMSG_SPACE(4) = 40 bytes) are appended.
        unsafe {
            if let Some(segment) = msg.segment_bytes {
                push_cmsg::<u16>(hdr, libc::SOL_UDP, libc::UDP_SEGMENT, segment);
            }
            if let Some(codepoint) = msg.ecn_codepoint {
                let value = libc::c_int::from(codepoint);
                if ipv6 {
                    push_cmsg(hdr, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, value);
                } else {
                    push_cmsg(hdr, libc::IPPROTO_IP, libc::IP_TOS, value);
                }
            }
        }
        if hdr.msg_controllen == 0 {
            hdr.msg_control = std::ptr::null_mut();
        }
    }
    loop {
        // Safety: hdrs[..count] point at names, iovs and cmsgs that live on
        // this frame and at payloads borrowed from `msgs` for the call.
        let ret = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), count as u32, 0) };
        match cvt(ret) {
            Ok(sent) => return Ok(sent as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Receives up to `max` (and [`MMSG_BATCH_MAX`]) datagrams from one socket
/// with one non-blocking `recvmmsg`, into consecutive `slots`; fills `out`
/// and returns the count. `EINTR` is retried.
pub(crate) fn recv_mmsg(
    fd: RawFd,
    slots: ChunksExactMut<'_, u8>,
    max: usize,
    out: &mut [InMsg; MMSG_BATCH_MAX],
) -> io::Result<usize> {
    // Safety: all-zero is a valid value of these plain C structs.
    let mut names: [libc::sockaddr_storage; MMSG_BATCH_MAX] = unsafe { mem::zeroed() };
    let mut iovs: [libc::iovec; MMSG_BATCH_MAX] = unsafe { mem::zeroed() };
    let mut hdrs: [libc::mmsghdr; MMSG_BATCH_MAX] = unsafe { mem::zeroed() };
    let mut cmsgs = [CmsgBuf([0; CMSG_BUF_BYTES]); MMSG_BATCH_MAX];

    let mut count = 0;
    for slot in slots.take(max.min(MMSG_BATCH_MAX)) {
        iovs[count] = libc::iovec { iov_base: slot.as_mut_ptr().cast(), iov_len: slot.len() };
        count += 1;
    }
    if count == 0 {
        return Ok(0);
    }
    for i in 0..count {
        let hdr = &mut hdrs[i].msg_hdr;
        hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
        hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        hdr.msg_iov = &mut iovs[i];
        hdr.msg_iovlen = 1;
        hdr.msg_control = cmsgs[i].0.as_mut_ptr().cast();
        hdr.msg_controllen = CMSG_BUF_BYTES as _;
    }
    let received = loop {
        // Safety: hdrs[..count] point at names, cmsgs on this frame and at
        // slots of the caller's buffer, mutably borrowed for this call
        // through `slots`; the kernel writes within the lengths given.
        let ret =
            unsafe { libc::recvmmsg(fd, hdrs.as_mut_ptr(), count as u32, libc::MSG_DONTWAIT, std::ptr::null_mut()) };
        match cvt(ret) {
            Ok(n) => break n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    for i in 0..received {
        let hdr = &hdrs[i].msg_hdr;
        let mut meta = InMsg {
            len: (hdrs[i].msg_len as usize).min(iovs[i].iov_len),
            truncated: hdr.msg_flags & libc::MSG_TRUNC != 0,
            ..InMsg::default()
        };
        meta.src = read_sockaddr(&names[i], hdr.msg_namelen).unwrap_or(meta.src);
        // Safety: the kernel filled the control buffer up to msg_controllen
        // (at most its 64 bytes); CMSG_FIRSTHDR/NXTHDR stay within it and
        // data is read unaligned with the length each header declares.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
            while !cmsg.is_null() {
                let c = &*cmsg;
                let data = libc::CMSG_DATA(cmsg);
                let data_len = (c.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                let read_int = || -> Option<i32> {
                    match data_len {
                        1 => Some(i32::from(*data)),
                        n if n >= 4 => Some(std::ptr::read_unaligned(data.cast::<i32>())),
                        _ => None,
                    }
                };
                match (c.cmsg_level, c.cmsg_type) {
                    (libc::SOL_UDP, libc::UDP_GRO) => {
                        meta.gro_segment_bytes = read_int().and_then(|v| usize::try_from(v).ok());
                    }
                    (libc::IPPROTO_IP, libc::IP_TOS) | (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                        meta.tos = read_int().map(|v| v as u8);
                    }
                    _ => {}
                }
                cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
            }
        }
        out[i] = meta;
    }
    Ok(received)
}

/// `poll(2)` for readability on `fds`; returns whether any is readable.
/// `EINTR` counts as "nothing yet".
pub(crate) fn poll_readable(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<bool> {
    for fd in fds.iter_mut() {
        fd.events = libc::POLLIN;
        fd.revents = 0;
    }
    // Round up so a sub-millisecond wait does not become a busy spin.
    let millis = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
    // Safety: `fds` is a valid, exclusively borrowed array of its length.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
    match cvt(ret) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// An entry for [`poll_readable`].
pub(crate) fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd { fd, events: libc::POLLIN, revents: 0 }
}
