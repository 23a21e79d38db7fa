//! Configuration of the UDP driver, with its `ACCORD_NET_UDP_*` overrides in one place.

use std::net::{IpAddr, Ipv4Addr};

use crate::DatapathError;

/// Most paths (sockets) one `UdpDatapath` may open: each costs a file
/// descriptor and socket buffers, and the fabric needs far fewer entropy values.
pub const UDP_PATHS_MAX: u16 = 1024;

/// Default socket buffer size, per direction and socket: 4 MiB holds a few
/// bandwidth-delay products of a datacenter path at 100 Gb/s.
pub const SOCKET_BUFFER_BYTES_DEFAULT: usize = 4 << 20;

/// How to open a [`super::UdpDatapath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// Local address to bind every path on. Default `127.0.0.1`, so an
    /// unconfigured process never listens beyond loopback.
    pub ip: IpAddr,
    /// Port of path 0; path `i` binds `base_port + i`. 0 (default) gives
    /// each path its own ephemeral port.
    pub base_port: u16,
    /// Number of paths (sockets, entropy values). Default 4.
    pub path_count: u16,
    /// `SO_RCVBUF` per socket. Default [`SOCKET_BUFFER_BYTES_DEFAULT`].
    pub recv_buffer_bytes: usize,
    /// `SO_SNDBUF` per socket. Default [`SOCKET_BUFFER_BYTES_DEFAULT`].
    pub send_buffer_bytes: usize,
    /// Use UDP GSO (`UDP_SEGMENT`) when the kernel has it. Default true.
    pub gso: bool,
    /// Use UDP GRO (`UDP_GRO`) when the kernel has it. Default true.
    pub gro: bool,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            base_port: 0,
            path_count: 4,
            recv_buffer_bytes: SOCKET_BUFFER_BYTES_DEFAULT,
            send_buffer_bytes: SOCKET_BUFFER_BYTES_DEFAULT,
            gso: true,
            gro: true,
        }
    }
}

impl UdpConfig {
    /// Applies the `ACCORD_NET_UDP_*` knobs from the process environment.
    pub fn with_env_overrides(self) -> Result<Self, DatapathError> {
        self.with_overrides_from(|name| std::env::var(name).ok())
    }

    /// Applies the `ACCORD_NET_UDP_*` knobs (`accord_knobs::of(Component::Udp)`) read through
    /// `lookup` (tests pass a map instead of touching the process environment), each parsed by
    /// its registered type.
    pub fn with_overrides_from(mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, DatapathError> {
        use accord_knobs::get;
        let env: &dyn Fn(&str) -> Option<String> = &lookup;
        let bad = |e: accord_knobs::KnobError| DatapathError::InvalidConfig(e.to_string());
        if let Some(n) = get(env, "ACCORD_NET_UDP_PATHS").map_err(bad)? {
            self.path_count = n;
        }
        if let Some(port) = get(env, "ACCORD_NET_UDP_BASE_PORT").map_err(bad)? {
            self.base_port = port;
        }
        if let Some(bytes) = get(env, "ACCORD_NET_UDP_RCVBUF_BYTES").map_err(bad)? {
            self.recv_buffer_bytes = bytes;
        }
        if let Some(bytes) = get(env, "ACCORD_NET_UDP_SNDBUF_BYTES").map_err(bad)? {
            self.send_buffer_bytes = bytes;
        }
        if let Some(on) = get(env, "ACCORD_NET_UDP_GSO").map_err(bad)? {
            self.gso = on;
        }
        if let Some(on) = get(env, "ACCORD_NET_UDP_GRO").map_err(bad)? {
            self.gro = on;
        }
        Ok(self)
    }

    /// Checks ranges before any socket is opened.
    pub fn validate(&self) -> Result<(), DatapathError> {
        if self.path_count == 0 || self.path_count > UDP_PATHS_MAX {
            return Err(DatapathError::InvalidConfig(format!(
                "path_count {} must be in 1..={UDP_PATHS_MAX}",
                self.path_count
            )));
        }
        if self.base_port != 0 && u32::from(self.base_port) + u32::from(self.path_count) > 65_536 {
            return Err(DatapathError::InvalidConfig(format!(
                "base_port {} + path_count {} runs past port 65535; lower base_port",
                self.base_port, self.path_count
            )));
        }
        let buffer_max = i32::MAX as usize / 2;
        for (name, bytes) in
            [("recv_buffer_bytes", self.recv_buffer_bytes), ("send_buffer_bytes", self.send_buffer_bytes)]
        {
            if bytes == 0 || bytes > buffer_max {
                return Err(DatapathError::InvalidConfig(format!("{name} {bytes} must be in 1..={buffer_max}")));
            }
        }
        Ok(())
    }
}
