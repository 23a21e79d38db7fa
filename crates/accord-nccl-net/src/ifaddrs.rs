//! Interface name to address, through `getifaddrs(3)` (FFI).
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Most interface entries walked (a bound on the list the kernel returns).
const INTERFACE_ENTRIES_MAX: usize = 4096;

/// The first address of interface `name`, IPv4 preferred; None when it has none.
pub fn interface_address(name: &str) -> Option<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // Safety: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut v4 = None;
    let mut v6 = None;
    let mut cursor = head;
    let mut walked = 0;
    while !cursor.is_null() && walked < INTERFACE_ENTRIES_MAX {
        walked += 1;
        // Safety: cursor is a non-null node of the list getifaddrs returned, alive until freed.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        if entry.ifa_name.is_null() || entry.ifa_addr.is_null() {
            continue;
        }
        // Safety: ifa_name is a NUL-terminated string owned by the list.
        let entry_name = unsafe { CStr::from_ptr(entry.ifa_name) };
        if entry_name.to_bytes() != name.as_bytes() {
            continue;
        }
        // Safety: ifa_addr is non-null and points at a sockaddr whose family says its type.
        let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
        if family == libc::AF_INET && v4.is_none() {
            // Safety: an AF_INET sockaddr is a sockaddr_in.
            let sin = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
            v4 = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
        } else if family == libc::AF_INET6 && v6.is_none() {
            // Safety: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in6) };
            v6 = Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
        }
    }
    // Safety: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    v4.or(v6)
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_interface_resolves_and_unknown_does_not() {
        assert_eq!(super::interface_address("lo").map(|a| a.is_loopback()), Some(true));
        assert_eq!(super::interface_address("no-such-interface-9"), None);
    }
}
