//! Interface name to address, through `getifaddrs(3)` (FFI).
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Most interface entries walked (a bound on the list the kernel returns).
const INTERFACE_ENTRIES_MAX: usize = 4096;

/// The address of interface `name` a device binds: see [`preferred_address`]; None when it has
/// none.
pub fn interface_address(name: &str) -> Option<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // Safety: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = vec![];
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
        if family == libc::AF_INET {
            // Safety: an AF_INET sockaddr is a sockaddr_in.
            let sin = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
            found.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
        } else if family == libc::AF_INET6 {
            // Safety: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in6) };
            found.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
        }
    }
    // Safety: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    preferred_address(&found)
}

/// Of an interface's addresses, in the kernel's order: the first IPv4 one, else the first IPv6
/// one that is not link-local, else the first link-local one. A link-local IPv6 address
/// (fe80::/10) names no interface by itself, so binding or reaching it needs a scope id that a
/// handle does not carry; a peer on another host could not use it.
pub fn preferred_address(addresses: &[IpAddr]) -> Option<IpAddr> {
    let link_local = |a: &IpAddr| matches!(a, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
    addresses
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addresses.iter().find(|a| !link_local(a)))
        .or_else(|| addresses.first())
        .copied()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ipv4_then_routable_ipv6_then_link_local() {
        use super::preferred_address;
        let a = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(preferred_address(&[a("fe80::1"), a("2001:db8::5"), a("10.0.0.7")]), Some(a("10.0.0.7")));
        assert_eq!(preferred_address(&[a("fe80::1"), a("2001:db8::5")]), Some(a("2001:db8::5")));
        assert_eq!(preferred_address(&[a("febf::1"), a("fd00::9")]), Some(a("fd00::9")), "fe80::/10 reaches febf");
        assert_eq!(preferred_address(&[a("fe80::1")]), Some(a("fe80::1")), "nothing better");
        assert_eq!(preferred_address(&[]), None);
    }

    #[test]
    fn loopback_interface_resolves_and_unknown_does_not() {
        assert_eq!(super::interface_address("lo").map(|a| a.is_loopback()), Some(true));
        assert_eq!(super::interface_address("no-such-interface-9"), None);
    }
}
