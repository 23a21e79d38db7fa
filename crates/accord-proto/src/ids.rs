//! Small identifier types. Each is a newtype so that a region id can never be passed where a
//! connection id is expected.

/// Index of a path (an entropy value the fabric hashes on) within a connection's path table.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PathId(pub u16);

/// An endpoint's local name for a connection; peers address packets to it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ConnectionId(pub u32);

/// Sender-assigned, per-connection identifier of one operation (a write or a send).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct OpId(pub u64);

/// Identifier of a registered memory region at the receiving endpoint.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RegionId(pub u32);

/// The random key that authorises remote access to a region.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct RegionKey(pub u64);

impl core::fmt::Debug for RegionKey {
    /// Keys are secrets: never print them whole.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "RegionKey(..{:04x})", self.0 & 0xffff)
    }
}

/// Identifier of a posted receive buffer (two-sided sends land in one).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RecvBufferId(pub u64);

/// Packet sequence number, per connection and direction. 64 bits: it never wraps.
pub type Psn = u64;
