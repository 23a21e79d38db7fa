//! The shared-memory datapath's control datagrams, carried over the UDP path 0 sockets: attach
//! (here is a ring for you), attached / refused (the answer), and the doorbell that wakes a
//! consumer that went to sleep.
//!
//! Every control datagram starts with [`CONTROL_MAGIC`], whose first byte (0xC5) is neither
//! accord-proto's version byte (1) nor the engine's wake byte (0xA5), so no protocol datagram
//! is ever taken for a control datagram or the reverse. Parsing is checked: a short, long or
//! malformed datagram is `None`, never a panic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// First 8 bytes of every control datagram.
pub const CONTROL_MAGIC: [u8; 8] = [0xC5, b'A', b'C', b'S', b'H', b'M', 1, 0];
/// Most paths an attach message lists (the proto's path bound).
pub const ATTACH_PATHS_MAX: usize = 256;
/// Bytes per encoded socket address: family, 16 address bytes, port.
const ADDR_BYTES: usize = 19;

const KIND_ATTACH: u8 = 1;
const KIND_ATTACHED: u8 = 2;
const KIND_REFUSED: u8 = 3;
const KIND_DOORBELL: u8 = 4;

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// "I created ring `name` of `data_bytes` with `nonce` for you; my paths are `paths`."
    Attach {
        /// Nonce written into the ring header, echoed in the answer.
        nonce: u64,
        /// Data-area size of the ring.
        data_bytes: u64,
        /// File name in the ring directory.
        name: String,
        /// The sender's path addresses, path 0 first (where it receives control datagrams).
        paths: Vec<SocketAddr>,
    },
    /// "I mapped the ring with this nonce; use it."
    Attached {
        /// The ring's nonce.
        nonce: u64,
    },
    /// "I could not map it; keep using UDP."
    Refused {
        /// The ring's nonce.
        nonce: u64,
    },
    /// "There is data in your ring."
    Doorbell,
}

/// Whether `bytes` is a control datagram (starts with the magic).
pub fn is_control(bytes: &[u8]) -> bool {
    bytes.len() > CONTROL_MAGIC.len() && bytes[..CONTROL_MAGIC.len()] == CONTROL_MAGIC
}

impl Control {
    /// Encodes into a fresh buffer.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = CONTROL_MAGIC.to_vec();
        match self {
            Control::Attach { nonce, data_bytes, name, paths } => {
                out.push(KIND_ATTACH);
                out.extend_from_slice(&nonce.to_le_bytes());
                out.extend_from_slice(&data_bytes.to_le_bytes());
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(&(paths.len() as u16).to_le_bytes());
                for addr in paths {
                    encode_addr(addr, &mut out);
                }
            }
            Control::Attached { nonce } => {
                out.push(KIND_ATTACHED);
                out.extend_from_slice(&nonce.to_le_bytes());
            }
            Control::Refused { nonce } => {
                out.push(KIND_REFUSED);
                out.extend_from_slice(&nonce.to_le_bytes());
            }
            Control::Doorbell => out.push(KIND_DOORBELL),
        }
        out
    }

    /// Parses a control datagram; `None` for anything malformed.
    pub fn parse(bytes: &[u8]) -> Option<Control> {
        if !is_control(bytes) {
            return None;
        }
        let mut r = Reader { rest: &bytes[CONTROL_MAGIC.len()..] };
        let msg = match r.u8()? {
            KIND_ATTACH => {
                let nonce = r.u64()?;
                let data_bytes = r.u64()?;
                let name_len = usize::from(r.u8()?);
                let name = std::str::from_utf8(r.take(name_len)?).ok()?.to_string();
                let count = usize::from(r.u16()?);
                if count == 0 || count > ATTACH_PATHS_MAX {
                    return None;
                }
                let paths = (0..count).map(|_| decode_addr(r.take(ADDR_BYTES)?)).collect::<Option<Vec<_>>>()?;
                Control::Attach { nonce, data_bytes, name, paths }
            }
            KIND_ATTACHED => Control::Attached { nonce: r.u64()? },
            KIND_REFUSED => Control::Refused { nonce: r.u64()? },
            KIND_DOORBELL => Control::Doorbell,
            _ => return None,
        };
        r.rest.is_empty().then_some(msg)
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

fn encode_addr(addr: &SocketAddr, out: &mut Vec<u8>) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
            out.extend_from_slice(&[0u8; 12]);
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_le_bytes());
}

fn decode_addr(b: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_le_bytes([b[17], b[18]]);
    let ip = match b[0] {
        4 => IpAddr::V4(Ipv4Addr::new(b[1], b[2], b[3], b[4])),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[1..17]).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}
