//! Kernel UDP driver: one non-blocking socket per path, batched with
//! `sendmmsg`/`recvmmsg`, with UDP GSO/GRO and ECN when the kernel allows.
//!
//! Written on `libc` + `socket2` rather than `quinn-udp`: quinn-udp sends one
//! transmit per call (no `sendmmsg` across datagrams) and owns its receive
//! metadata layout, while this trait wants batches across datagrams and a
//! driver-owned slot pool. All system calls live in `sys`.

mod config;
mod sys;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

pub use config::{UdpConfig, SOCKET_BUFFER_BYTES_DEFAULT, UDP_PATHS_MAX};
use sys::{InMsg, OutMsg, MMSG_BATCH_MAX};

use crate::{Datapath, DatapathCaps, DatapathError, RxBuffers, RxMeta, TxDatagram};

/// Linux's `UDP_MAX_SEGMENTS`: most segments one GSO send may carry.
const GSO_SEGMENTS_MAX: u16 = 64;
/// ECN codepoint ECT(0), put on sends marked `ecn_capable`.
const ECN_ECT0: u8 = 0b10;
/// ECN codepoint CE, "congestion experienced".
const ECN_CE: u8 = 0b11;

/// Counters of the UDP driver, for diagnosis; read with [`UdpDatapath::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// `sendmmsg` calls made.
    pub tx_syscalls: u64,
    /// Messages the kernel accepted (one GSO send counts once).
    pub tx_messages: u64,
    /// `recvmmsg` calls made.
    pub rx_syscalls: u64,
    /// Datagrams received (one GRO datagram counts once).
    pub rx_messages: u64,
    /// Datagrams dropped because the kernel reported the destination
    /// unreachable or forbidden (lost, as the network would lose them).
    pub tx_lost_unreachable: u64,
    /// Segments of a software-split datagram dropped because the socket
    /// filled part-way through it.
    pub tx_segments_lost_full: u64,
    /// Received datagrams discarded as truncated (cannot happen with
    /// buffers from `alloc_rx_buffers`).
    pub rx_truncated: u64,
    /// Times GSO was turned off after the kernel refused a segmented send.
    pub gso_fallbacks: u64,
}

/// Socket buffer sizes as the kernel reports them after bind (Linux
/// reports twice the requested value, the extra being its bookkeeping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketBufferBytes {
    /// `SO_RCVBUF` as read back.
    pub recv: usize,
    /// `SO_SNDBUF` as read back.
    pub send: usize,
    /// Whether the kernel gave less than was asked for (raise
    /// `net.core.rmem_max`/`wmem_max`, or run with `CAP_NET_ADMIN`).
    pub clamped: bool,
}

/// The kernel UDP datapath. See the module documentation.
#[derive(Debug)]
pub struct UdpDatapath {
    sockets: Vec<Socket>,
    local_addrs: Vec<SocketAddr>,
    ipv6: bool,
    caps: DatapathCaps,
    pollfds: Vec<libc::pollfd>,
    rx_next_path: u16,
    rx_scratch: Box<[InMsg; MMSG_BATCH_MAX]>,
    buffer_bytes: SocketBufferBytes,
    stats: UdpStats,
}

impl UdpDatapath {
    /// Opens one socket per path as `config` says, probing GSO, GRO and ECN.
    pub fn bind(config: UdpConfig) -> Result<Self, DatapathError> {
        config.validate()?;
        let ipv6 = config.ip.is_ipv6();
        let mut sockets = Vec::with_capacity(usize::from(config.path_count));
        let mut local_addrs = Vec::with_capacity(usize::from(config.path_count));
        let mut gso = config.gso;
        let mut gro = config.gro;
        let mut ecn = true;
        let mut buffer_bytes = SocketBufferBytes { recv: usize::MAX, send: usize::MAX, clamped: false };
        for path in 0..config.path_count {
            let port = if config.base_port == 0 { 0 } else { config.base_port + path };
            let addr = SocketAddr::new(config.ip, port);
            let socket = open_socket(path, addr)?;
            let bytes = set_buffers(&socket, &config)?;
            buffer_bytes.recv = buffer_bytes.recv.min(bytes.recv);
            buffer_bytes.send = buffer_bytes.send.min(bytes.send);
            buffer_bytes.clamped |= bytes.clamped;

            let fd = socket.as_raw_fd();
            if gso && sys::getsockopt_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT).is_err() {
                tracing::info!("UDP GSO unavailable on this kernel; segmenting in software");
                gso = false;
            }
            if gro && sys::setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_err() {
                tracing::info!("UDP GRO unavailable on this kernel; receiving packet by packet");
                gro = false;
            }
            let recv_tos = if ipv6 {
                sys::setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)
            } else {
                sys::setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)
            };
            ecn &= recv_tos.is_ok();

            let local = socket.local_addr().ok().and_then(|a| a.as_socket()).ok_or_else(|| {
                DatapathError::io("reading the bound address of a UDP socket", io::Error::other("no inet address"))
            })?;
            sockets.push(socket);
            local_addrs.push(local);
        }
        if config.gro && !gro {
            // Sockets probed before GRO was found missing on a later one.
            for socket in &sockets {
                let _ = sys::setsockopt_int(socket.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 0);
            }
        }
        if buffer_bytes.clamped {
            tracing::warn!(?buffer_bytes, "kernel clamped UDP socket buffers; raise net.core.rmem_max/wmem_max");
        }
        let max_payload_bytes = if ipv6 { 65_535 - 8 } else { 65_535 - 8 - 20 };
        let pollfds = sockets.iter().map(|s| sys::pollfd(s.as_raw_fd())).collect();
        Ok(UdpDatapath {
            sockets,
            local_addrs,
            ipv6,
            caps: DatapathCaps {
                max_payload_bytes,
                gso_max_segments: if gso { GSO_SEGMENTS_MAX } else { 1 },
                gro,
                ecn,
                timestamps: false,
            },
            pollfds,
            rx_next_path: 0,
            rx_scratch: Box::new([InMsg::default(); MMSG_BATCH_MAX]),
            buffer_bytes,
            stats: UdpStats::default(),
        })
    }

    /// Counters since bind.
    pub fn stats(&self) -> UdpStats {
        self.stats
    }

    /// Smallest socket buffer sizes over all paths, as the kernel granted them.
    pub fn socket_buffer_bytes(&self) -> SocketBufferBytes {
        self.buffer_bytes
    }

    fn gso_enabled(&self) -> bool {
        self.caps.gso_max_segments > 1
    }

    /// Sends datagrams `batch[start..]` that share `batch[start].path`, with
    /// one `sendmmsg`. Returns (input datagrams consumed, whether the socket
    /// is full so the caller should stop).
    fn send_run(&mut self, batch: &[TxDatagram<'_>], start: usize) -> Result<(usize, bool), DatapathError> {
        let path = batch[start].path;
        let fd = self.sockets[usize::from(path)].as_raw_fd();
        let gso = self.gso_enabled();
        // Plan messages: (input index, message) up to MMSG_BATCH_MAX.
        let mut msgs =
            [OutMsg { dst: batch[start].dst, bytes: &[], segment_bytes: None, ecn_codepoint: None }; MMSG_BATCH_MAX];
        let mut owner = [0usize; MMSG_BATCH_MAX];
        let mut count = 0;
        for (index, dgram) in batch.iter().enumerate().skip(start) {
            if dgram.path != path {
                break;
            }
            let ecn_codepoint = dgram.ecn_capable.then_some(ECN_ECT0);
            let offload = match dgram.segment_bytes {
                Some(s) => gso && usize::from(s) < dgram.bytes.len(),
                None => true,
            };
            let needed = if offload { 1 } else { dgram.segment_count() };
            if count + needed > MMSG_BATCH_MAX {
                break;
            }
            if offload {
                let segment_bytes = dgram.segment_bytes.filter(|&s| gso && usize::from(s) < dgram.bytes.len());
                msgs[count] = OutMsg { dst: dgram.dst, bytes: dgram.bytes, segment_bytes, ecn_codepoint };
                owner[count] = index;
                count += 1;
            } else {
                for segment in dgram.segments() {
                    msgs[count] = OutMsg { dst: dgram.dst, bytes: segment, segment_bytes: None, ecn_codepoint };
                    owner[count] = index;
                    count += 1;
                }
            }
        }
        debug_assert!(count > 0, "a validated datagram always fits an empty batch");
        self.stats.tx_syscalls += 1;
        match sys::send_mmsg(fd, self.ipv6, &msgs[..count]) {
            Ok(sent) => {
                self.stats.tx_messages += sent as u64;
                if sent == 0 {
                    return Ok((0, true));
                }
                // An input counts as sent once its first message went; the
                // unsent tail of a software-split datagram is lost.
                let last_owner = owner[sent - 1];
                let tail_lost = owner[sent..count].iter().filter(|&&o| o == last_owner).count();
                self.stats.tx_segments_lost_full += tail_lost as u64;
                Ok((last_owner + 1 - start, sent < count))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok((0, true)),
            Err(e) if e.raw_os_error() == Some(libc::EIO) && msgs[0].segment_bytes.is_some() => {
                // The device cannot checksum-offload segmented sends: split in
                // software from now on, and retry this run.
                tracing::warn!("kernel refused a UDP GSO send (EIO); disabling GSO");
                self.caps.gso_max_segments = 1;
                self.stats.gso_fallbacks += 1;
                Ok((0, false))
            }
            Err(e) if is_unreachable(&e) => {
                self.stats.tx_lost_unreachable += 1;
                Ok((owner[0] + 1 - start, false))
            }
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                Err(DatapathError::MessageTooLarge { len: msgs[0].bytes.len(), max: self.caps.max_payload_bytes })
            }
            Err(e) => {
                Err(DatapathError::io("sendmmsg on a UDP path failed; the socket is unusable, rebuild the datapath", e))
            }
        }
    }

    /// Drains one path into `bufs` until it is empty or `bufs` holds `max`.
    fn recv_path(&mut self, path: u16, bufs: &mut RxBuffers, max: usize) -> Result<(), DatapathError> {
        let fd = self.sockets[usize::from(path)].as_raw_fd();
        while bufs.len() < max {
            let want = (max - bufs.len()).min(MMSG_BATCH_MAX);
            self.stats.rx_syscalls += 1;
            let received = match sys::recv_mmsg(fd, bufs.free_slots_mut(), want, &mut self.rx_scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => {
                    return Err(DatapathError::io(
                        "recvmmsg on a UDP path failed; the socket is unusable, rebuild the datapath",
                        e,
                    ))
                }
            };
            self.stats.rx_messages += received as u64;
            let first_new = bufs.len();
            let mut truncated_mask = 0u64;
            for (i, msg) in self.rx_scratch[..received].iter().enumerate() {
                if msg.truncated {
                    truncated_mask |= 1 << i;
                }
                let segment_bytes = match msg.gro_segment_bytes {
                    Some(s) if s > 0 && s < msg.len => s,
                    _ => msg.len,
                };
                bufs.commit(RxMeta {
                    path,
                    src: msg.src,
                    len: msg.len,
                    segment_bytes,
                    ecn_ce: msg.tos.is_some_and(|t| t & ECN_CE == ECN_CE),
                    local_channel: false,
                });
            }
            if truncated_mask != 0 {
                self.stats.rx_truncated += u64::from(truncated_mask.count_ones());
                let mut index = 0usize;
                bufs.retain(|_, _| {
                    let keep = index < first_new || truncated_mask & (1 << (index - first_new)) == 0;
                    index += 1;
                    keep
                });
            }
            if received < want {
                return Ok(());
            }
        }
        Ok(())
    }
}

fn is_unreachable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ECONNREFUSED | libc::EPERM | libc::EACCES)
    )
}

fn open_socket(path: u16, addr: SocketAddr) -> Result<Socket, DatapathError> {
    let bind_err = |source| DatapathError::Bind { path, addr, source };
    let domain = match addr.ip() {
        IpAddr::V4(_) => Domain::IPV4,
        IpAddr::V6(_) => Domain::IPV6,
    };
    let socket = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP)).map_err(bind_err)?;
    socket.set_nonblocking(true).map_err(bind_err)?;
    socket.bind(&addr.into()).map_err(bind_err)?;
    Ok(socket)
}

/// Sets both buffer sizes, forcing past the sysctl limits when privileged.
fn set_buffers(socket: &Socket, config: &UdpConfig) -> Result<SocketBufferBytes, DatapathError> {
    let fd = socket.as_raw_fd();
    let io = |e| DatapathError::io("setting UDP socket buffer sizes", e);
    socket.set_recv_buffer_size(config.recv_buffer_bytes).map_err(io)?;
    socket.set_send_buffer_size(config.send_buffer_bytes).map_err(io)?;
    // Linux doubles the value on set and reports the doubled value.
    let mut recv = socket.recv_buffer_size().map_err(io)?;
    let mut send = socket.send_buffer_size().map_err(io)?;
    if recv / 2 < config.recv_buffer_bytes {
        let _ = sys::setsockopt_int(fd, libc::SOL_SOCKET, sys::SO_RCVBUFFORCE, config.recv_buffer_bytes as i32);
        recv = socket.recv_buffer_size().map_err(io)?;
    }
    if send / 2 < config.send_buffer_bytes {
        let _ = sys::setsockopt_int(fd, libc::SOL_SOCKET, sys::SO_SNDBUFFORCE, config.send_buffer_bytes as i32);
        send = socket.send_buffer_size().map_err(io)?;
    }
    Ok(SocketBufferBytes {
        recv,
        send,
        clamped: recv / 2 < config.recv_buffer_bytes || send / 2 < config.send_buffer_bytes,
    })
}

impl Datapath for UdpDatapath {
    fn caps(&self) -> DatapathCaps {
        self.caps
    }

    fn path_count(&self) -> u16 {
        self.sockets.len() as u16
    }

    fn local_addr(&self, path: u16) -> Option<SocketAddr> {
        self.local_addrs.get(usize::from(path)).copied()
    }

    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DatapathError> {
        let path_count = self.path_count();
        for dgram in batch {
            dgram.validate(&self.caps, path_count)?;
            if dgram.dst.is_ipv6() != self.ipv6 {
                return Err(DatapathError::AddressFamilyMismatch {
                    path: dgram.path,
                    local: self.local_addrs[usize::from(dgram.path)],
                    dst: dgram.dst,
                });
            }
        }
        let mut done = 0;
        // Bounded: every round consumes at least one datagram, stops, or
        // turns GSO off (which happens at most once).
        let mut rounds_left = batch.len() + 2;
        while done < batch.len() && rounds_left > 0 {
            rounds_left -= 1;
            let (consumed, full) = self.send_run(batch, done)?;
            done += consumed;
            if full {
                break;
            }
        }
        Ok(done)
    }

    fn recv_batch(&mut self, bufs: &mut RxBuffers, max: usize) -> Result<usize, DatapathError> {
        let max = bufs.start_batch(self.rx_slot_bytes(), max)?;
        let path_count = self.path_count();
        // One poll over every path first, then recvmmsg only on the readable ones: a worker
        // polling for traffic calls this on every turn, and with several paths mostly idle
        // (or all idle while shared memory carries the data) one syscall replaces one per
        // path that would only say EAGAIN.
        self.stats.rx_syscalls += 1;
        if !sys::poll_readable(&mut self.pollfds, Duration::ZERO)
            .map_err(|e| DatapathError::io("poll on UDP sockets failed", e))?
        {
            return Ok(0);
        }
        // Start at a rotating path so one busy path cannot starve the rest.
        let start = self.rx_next_path;
        self.rx_next_path = (start + 1) % path_count;
        for step in 0..path_count {
            if bufs.len() >= max {
                break;
            }
            let path = (start + step) % path_count;
            if self.pollfds[usize::from(path)].revents == 0 {
                continue;
            }
            self.recv_path(path, bufs, max)?;
        }
        Ok(bufs.len())
    }

    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, DatapathError> {
        sys::poll_readable(&mut self.pollfds, timeout).map_err(|e| DatapathError::io("poll on UDP sockets failed", e))
    }
}

#[cfg(test)]
mod tests;
