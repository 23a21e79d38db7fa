//! The listen handle NCCL exchanges between ranks (at most `NCCL_NET_HANDLE_MAXSIZE` bytes):
//! the address of the listener's setup socket, a nonce naming the listen comm, and a
//! fingerprint of the listener's machine (so a connect to another machine's loopback address
//! fails at once, with what to set, instead of reaching whatever listens on our own loopback).
//! `connect` also stores the id of its in-progress state in the handle, so repeated calls
//! resume it.

use crate::abi::NET_HANDLE_BYTES_MAX;
use crate::error::PluginError;
use accord_proto::frame::{FrameError, FrameReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// First four bytes of every Accord handle ("ACRD").
pub const HANDLE_MAGIC: u32 = 0x4143_5244;
/// Layout version of the handle.
pub const HANDLE_VERSION: u16 = 1;
/// Bytes of the handle this plugin uses (the rest stays zero).
pub const HANDLE_BYTES: usize = 56;
const _: () = assert!(HANDLE_BYTES <= NET_HANDLE_BYTES_MAX);

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_FAMILY: usize = 6;
const OFF_PORT: usize = 8;
const OFF_IP: usize = 10;
const OFF_NONCE: usize = 32;
const OFF_STAGE: usize = 40;
const OFF_MACHINE: usize = 48;

/// A decoded handle.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Handle {
    /// The listener's setup socket.
    pub addr: SocketAddr,
    /// Random id of the listen comm; the accepting side checks it.
    pub nonce: u64,
    /// Id of the connect state in progress for this handle (0: none yet).
    pub stage: u64,
    /// [`machine_fingerprint`] of the listener's machine (0: unknown, as in handles of
    /// earlier versions, whose bytes here were zero).
    pub machine: u64,
}

/// A fingerprint of this machine (its kernel's boot id, else its host name), the same in every
/// process and container of one running kernel; 0 when neither can be read. Two processes with
/// different non-zero fingerprints cannot share a loopback address.
pub fn machine_fingerprint() -> u64 {
    static FINGERPRINT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *FINGERPRINT.get_or_init(|| {
        ["/proc/sys/kernel/random/boot_id", "/proc/sys/kernel/hostname"]
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .map(|text| text.trim().to_string())
            .find(|text| !text.is_empty())
            .map_or(0, |text| fingerprint_of(&text))
    })
}

/// FNV-1a of `text`, never 0 (0 means unknown).
fn fingerprint_of(text: &str) -> u64 {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    hash.max(1)
}

impl Handle {
    /// Writes the handle into `out` (the first [`HANDLE_BYTES`]; the rest is zeroed).
    pub fn encode(&self, out: &mut [u8; NET_HANDLE_BYTES_MAX]) {
        out.fill(0);
        out[OFF_MAGIC..OFF_MAGIC + 4].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        out[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&HANDLE_VERSION.to_le_bytes());
        out[OFF_PORT..OFF_PORT + 2].copy_from_slice(&self.addr.port().to_le_bytes());
        out[OFF_MACHINE..OFF_MACHINE + 8].copy_from_slice(&self.machine.to_le_bytes());
        match self.addr.ip() {
            IpAddr::V4(ip) => {
                out[OFF_FAMILY] = 4;
                out[OFF_IP..OFF_IP + 4].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                out[OFF_FAMILY] = 6;
                out[OFF_IP..OFF_IP + 16].copy_from_slice(&ip.octets());
            }
        }
        out[OFF_NONCE..OFF_NONCE + 8].copy_from_slice(&self.nonce.to_le_bytes());
        Self::set_stage(out, self.stage);
    }

    /// Reads a handle, checking magic, version and family.
    pub fn decode(bytes: &[u8; NET_HANDLE_BYTES_MAX]) -> Result<Handle, PluginError> {
        // Every offset lies inside the fixed-size handle, so a read fails only if the offset
        // table above is wrong; that is still an error here, never a panic.
        let field = |at: usize| FrameReader::at(bytes, at);
        let bad = |magic: u32| move |_: FrameError| PluginError::BadHandle { magic };
        let magic = field(OFF_MAGIC).u32().map_err(bad(0))?;
        if magic != HANDLE_MAGIC || field(OFF_VERSION).u16().map_err(bad(magic))? != HANDLE_VERSION {
            return Err(PluginError::BadHandle { magic });
        }
        let port = field(OFF_PORT).u16().map_err(bad(magic))?;
        let ip = match field(OFF_FAMILY).u8().map_err(bad(magic))? {
            4 => IpAddr::V4(Ipv4Addr::from(field(OFF_IP).array::<4>().map_err(bad(magic))?)),
            6 => IpAddr::V6(Ipv6Addr::from(field(OFF_IP).array::<16>().map_err(bad(magic))?)),
            _ => return Err(PluginError::BadHandle { magic }),
        };
        Ok(Handle {
            addr: SocketAddr::new(ip, port),
            nonce: field(OFF_NONCE).u64().map_err(bad(magic))?,
            stage: field(OFF_STAGE).u64().map_err(bad(magic))?,
            machine: field(OFF_MACHINE).u64().map_err(bad(magic))?,
        })
    }

    /// Records the connect state id in an encoded handle.
    pub fn set_stage(bytes: &mut [u8; NET_HANDLE_BYTES_MAX], stage: u64) {
        bytes[OFF_STAGE..OFF_STAGE + 8].copy_from_slice(&stage.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_for_both_families() {
        for addr in ["127.0.0.1:4242", "[fe80::1]:9"] {
            let h = Handle { addr: addr.parse().unwrap(), nonce: 0xdead_beef_1234, stage: 0, machine: 0x77 };
            let mut buf = [0xffu8; NET_HANDLE_BYTES_MAX];
            h.encode(&mut buf);
            assert!(buf[HANDLE_BYTES..].iter().all(|b| *b == 0));
            assert_eq!(Handle::decode(&buf).unwrap(), h);
            Handle::set_stage(&mut buf, 77);
            assert_eq!(Handle::decode(&buf).unwrap().stage, 77);
        }
    }

    #[test]
    fn the_machine_fingerprint_is_stable_and_never_the_unknown_value() {
        assert_eq!(machine_fingerprint(), machine_fingerprint());
        assert_ne!(fingerprint_of(""), 0);
        assert_ne!(fingerprint_of("a"), fingerprint_of("b"));
    }

    #[test]
    fn foreign_handles_are_refused() {
        let buf = [0u8; NET_HANDLE_BYTES_MAX];
        assert!(matches!(Handle::decode(&buf), Err(PluginError::BadHandle { magic: 0 })));
        let mut buf = [0u8; NET_HANDLE_BYTES_MAX];
        Handle { addr: "1.2.3.4:5".parse().unwrap(), nonce: 1, stage: 0, machine: 0 }.encode(&mut buf);
        buf[OFF_FAMILY] = 9;
        assert!(Handle::decode(&buf).is_err());
    }
}
