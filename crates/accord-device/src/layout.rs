//! The memory layout shared with GPU code: descriptors, ring control words, the device table.
//!
//! Every struct here is `#[repr(C)]`, little-endian, and mirrored field for field by
//! `include/accord/device.cuh`. Changing a field here means changing it there and bumping
//! [`LAYOUT_VERSION`]; the header carries the same number, and a table built by one version is
//! refused by the other.

/// Version of this layout; the header defines `ACCORD_DEVICE_LAYOUT_VERSION` to the same value.
pub const LAYOUT_VERSION: u32 = 1;

/// Bytes of one descriptor: one 64-byte line, so a GPU thread writes it with four 16-byte
/// stores and a proxy reads it in one cache line.
pub const DESCRIPTOR_BYTES: usize = 64;

/// What a descriptor asks the proxy to do ([`Descriptor::op`]).
#[repr(u8)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Copy `bytes` from this rank's `src_window` at `src_offset` to `peer`'s `window` at
    /// `dst_offset`.
    Put = 1,
    /// Write the `bytes` (1..=8) low bytes of `src_offset` (an inline value) to `peer`'s
    /// `window` at `dst_offset`.
    PutValue = 2,
    /// Apply only the signal action to `peer` (no data).
    Signal = 3,
}

/// What a descriptor does to a signal of the peer once its bytes landed
/// ([`Descriptor::signal_op`]).
#[repr(u8)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// No signal.
    None = 0,
    /// Add `signal_value` to this rank's contribution to signal `signal_id` at the peer.
    Add = 1,
    /// Set this rank's contribution to signal `signal_id` at the peer to `signal_value`.
    Set = 2,
}

/// [`Descriptor::flags`] bit: bump this rank's counter `counter_id` by one once the source of
/// the put may be reused (the put completed at this end).
pub const FLAG_COUNTER: u16 = 1 << 0;

/// One request from a GPU thread. The producer writes every field, then `seq` last with
/// release semantics (system scope); the proxy reads `seq` with acquire semantics and takes the
/// slot only when `seq == ticket + 1`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The producer's ticket plus one; 0 in a slot never written.
    pub seq: u64,
    /// An [`Op`] as its `u8`.
    pub op: u8,
    /// A [`SignalOp`] as its `u8`.
    pub signal_op: u8,
    /// [`FLAG_COUNTER`] and reserved bits (zero).
    pub flags: u16,
    /// Destination rank in the device communicator.
    pub peer: u32,
    /// Destination window id (the same id on every rank).
    pub window: u32,
    /// Source window id of a [`Op::Put`].
    pub src_window: u32,
    /// Byte offset in the destination window.
    pub dst_offset: u64,
    /// [`Op::Put`]: byte offset in the source window; [`Op::PutValue`]: the inline value.
    pub src_offset: u64,
    /// Bytes to move ([`Op::PutValue`]: 1..=8).
    pub bytes: u64,
    /// Signal of the peer that [`Descriptor::signal_op`] acts on.
    pub signal_id: u32,
    /// Counter of this rank that [`FLAG_COUNTER`] bumps.
    pub counter_id: u32,
    /// Operand of the signal action.
    pub signal_value: u64,
}

/// Control words of one ring, in mapped host memory, each on its own 64-byte line so the host's
/// writes to one never invalidate the line a GPU polls for another.
#[repr(C, align(64))]
#[derive(Copy, Clone, Debug, Default)]
pub struct RingControl {
    /// Tickets whose slots the proxy has freed (written by the proxy only, plain stores). GPU
    /// producers read it only when their cached copy says the ring is full.
    pub consumed: u64,
    _pad0: [u64; 7],
    /// Every ticket below this has its source reusable (the watermark `flush` waits on).
    pub completed: u64,
    _pad1: [u64; 7],
    /// Zero while every descriptor was good; else one plus the ticket of the first one the
    /// proxy refused or that failed (device waits stop and return an error when they see it).
    pub error: u64,
    _pad2: [u64; 7],
}

/// Where one ring lives, as the device sees it.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct RingDevice {
    /// Device address of `Descriptor[slots]` (mapped host memory).
    pub slots: u64,
    /// Device address of the ring's [`RingControl`] (mapped host memory).
    pub control: u64,
    /// Device address of the producers' ticket counter (`u64`, device memory; GPU atomics only).
    pub reserved: u64,
    /// Device address of the producers' cached copy of `consumed` (`u64`, device memory).
    pub cached_consumed: u64,
    /// Slots in the ring (a power of two).
    pub slot_count: u32,
    /// Reserved, zero.
    pub _pad: u32,
}

/// One window as the device sees it.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct WindowEntry {
    /// Device address of this rank's window.
    pub local_base: u64,
    /// Bytes in the window (the same on every rank).
    pub bytes: u64,
    /// Device address of `u64[world]`: each peer's window mapped into this process for direct
    /// stores, 0 where the peer cannot be stored to directly.
    pub peer_bases: u64,
}

/// The table a kernel receives (by pointer, in device memory): everything the device API needs.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct DeviceTable {
    /// [`LAYOUT_VERSION`] of the code that built the table.
    pub layout_version: u32,
    /// This rank.
    pub rank: u32,
    /// Ranks in the device communicator.
    pub world: u32,
    /// Rings (one per proxy thread).
    pub ring_count: u32,
    /// Signals per rank, the barrier's included (the last one; users get `signal_count - 1`).
    pub signal_count: u32,
    /// Counters per rank.
    pub counter_count: u32,
    /// Windows registered.
    pub window_count: u32,
    /// Bit `w` set: window `w` is this GPU's own device memory, which its threads may read, so
    /// an aligned 8-byte put from it travels inline (the header's `ACCORD_DEVICE_PUT_INLINE`).
    /// Windows 32 and up, host windows and tables of older builders (zero here) never do.
    pub readable_windows: u32,
    /// Device address of `RingDevice[ring_count]`.
    pub rings: u64,
    /// Device address of this rank's incoming signal slots, `u64[signal_count][world]`: slot
    /// `[s][r]` is written only by rank `r`'s proxy and holds rank `r`'s running contribution to
    /// signal `s`, so no remote atomic is ever needed and a resent write is harmless.
    pub signals: u64,
    /// Device address of `u64[signal_count]`: the sum of signal `s` at its last reset.
    pub signal_bases: u64,
    /// Device address of this rank's counters, `u64[counter_count]` (mapped host memory: the
    /// proxy bumps them with host stores).
    pub counters: u64,
    /// Device address of `WindowEntry[window_count]`.
    pub windows: u64,
    /// Device address of `u64[world]`: each peer's signal slots mapped into this process for
    /// direct stores and atomics, 0 where the peer cannot be reached directly. A signal is
    /// driven either through the proxy or directly, never both (the proxy owns the running
    /// value of the slots it writes).
    pub peer_signals: u64,
    /// Device address of one `u64` in device memory: how many device barriers this rank has
    /// entered. The barrier uses signal [`DeviceTable::signal_count`]` - 1`, reserved for it.
    pub barrier_epoch: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn descriptor_is_one_line_with_the_documented_offsets() {
        assert_eq!(size_of::<Descriptor>(), DESCRIPTOR_BYTES);
        assert_eq!(offset_of!(Descriptor, seq), 0);
        assert_eq!(offset_of!(Descriptor, op), 8);
        assert_eq!(offset_of!(Descriptor, signal_op), 9);
        assert_eq!(offset_of!(Descriptor, flags), 10);
        assert_eq!(offset_of!(Descriptor, peer), 12);
        assert_eq!(offset_of!(Descriptor, window), 16);
        assert_eq!(offset_of!(Descriptor, src_window), 20);
        assert_eq!(offset_of!(Descriptor, dst_offset), 24);
        assert_eq!(offset_of!(Descriptor, src_offset), 32);
        assert_eq!(offset_of!(Descriptor, bytes), 40);
        assert_eq!(offset_of!(Descriptor, signal_id), 48);
        assert_eq!(offset_of!(Descriptor, counter_id), 52);
        assert_eq!(offset_of!(Descriptor, signal_value), 56);
    }

    #[test]
    fn ring_control_words_sit_on_separate_lines() {
        assert_eq!(size_of::<RingControl>(), 192);
        assert_eq!(offset_of!(RingControl, consumed), 0);
        assert_eq!(offset_of!(RingControl, completed), 64);
        assert_eq!(offset_of!(RingControl, error), 128);
    }

    #[test]
    fn device_side_tables_have_fixed_sizes() {
        assert_eq!(size_of::<RingDevice>(), 40);
        assert_eq!(size_of::<WindowEntry>(), 24);
        assert_eq!(size_of::<DeviceTable>(), 88);
    }
}
