//! Counters of what one rank's [`super::EngineTransport`] issued, readable at run time: how
//! many writes, how many of them make the engine send their immediate only after every
//! shard was acknowledged, how many control messages (descriptor handshakes).

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of [`super::EngineTransport::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Data writes issued (immediate-only signals not included).
    pub writes: u64,
    /// Bytes those writes carried.
    pub write_bytes: u64,
    /// Writes of at least the engine's shard size (`ACCORD_SHARD_BYTES`) that carried an
    /// immediate: when the peer has two or more lanes the engine splits them and sends the
    /// immediate only once every part is acknowledged, a round trip after the data.
    pub writes_sharded_with_imm: u64,
    /// Immediate-only signals.
    pub signals: u64,
    /// Control messages sent (descriptor handshakes, point-to-point descriptors).
    pub ctrl_messages: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    writes: AtomicU64,
    write_bytes: AtomicU64,
    writes_sharded_with_imm: AtomicU64,
    signals: AtomicU64,
    ctrl_messages: AtomicU64,
}

impl Counters {
    pub(crate) fn write(&self, bytes: u64, sharded_with_imm: bool) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
        if sharded_with_imm {
            self.writes_sharded_with_imm.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn signal(&self) {
        self.signals.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn ctrl(&self) {
        self.ctrl_messages.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> TransportStats {
        TransportStats {
            writes: self.writes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            writes_sharded_with_imm: self.writes_sharded_with_imm.load(Ordering::Relaxed),
            signals: self.signals.load(Ordering::Relaxed),
            ctrl_messages: self.ctrl_messages.load(Ordering::Relaxed),
        }
    }
}
