//! The descriptor ring: `slot_count` [`Descriptor`]s, a [`RingControl`] and the producers' two
//! device words (`reserved`, their ticket counter, and `cached_consumed`, their copy of the
//! proxy's `consumed`).
//!
//! Producers (GPU threads, or a [`HostProducer`] doing exactly the same for tests) take ticket
//! `t = fetch_add(reserved, 1)`, wait while `t - cached_consumed >= slot_count` (refreshing the
//! cache from `control.consumed` only then, so a GPU reads host memory across the bus only when
//! the ring looks full), write every field of slot `t % slot_count` and store `seq = t + 1` last
//! with release ordering.
//!
//! One consumer ([`RingConsumer`], on the ring's proxy thread) is the only writer of
//! `control.*` and uses no atomic read-modify-write: it takes slot `next % slot_count` when an
//! acquire load of its `seq` is `next + 1`, and publishes `completed` and `consumed` with plain
//! release stores.
//!
//! A slot is freed only once its ticket's work completed: in this version `consumed` equals
//! `completed` (the contiguous watermark of finished tickets). Why not free a slot as soon as
//! the descriptor is copied out: a `PutValue`'s value is staged in a per-ring cell indexed by
//! `ticket % slot_count`, valid until the slot is freed, and tying the two makes a full ring the
//! back-pressure that bounds the work in flight to `slot_count` descriptors per ring. Nothing
//! is ever dropped or overwritten.

mod consumer;
mod producer;
#[cfg(test)]
mod tests;

pub use consumer::RingConsumer;
pub use producer::HostProducer;

use crate::error::DeviceError;
use crate::layout::{Descriptor, RingControl, RingDevice, DESCRIPTOR_BYTES};
use crate::memory::{Block, Placement, Want};
use std::mem::offset_of;
use std::sync::atomic::AtomicU64;

/// Most slots in one ring.
pub const RING_SLOTS_MAX: u32 = 1 << 16;
/// Default slots per ring: 16,384 (1 MiB of descriptors). A slot is freed only when its put
/// landed, so the slots bound the puts in flight: a proxy taking 1,024 descriptors a turn
/// (`DESCRIPTORS_PER_TURN_DEFAULT`) keeps several turns' batches in the copy engine's queue.
/// On the 2xH200 host (stop 44, `accord-device-bench --only rate --slots S --turn T`), 16,384
/// slots with turns of 1,024 won four of five paired comparisons with 1,024 slots and turns of
/// 256: contiguous 8-byte puts at 4.6-8.9 M/s against 4.2-6.4
/// (docs/results/2026-11-27-rate-turns-and-plugin-polling.md).
pub const RING_SLOTS_DEFAULT: u32 = 16384;
/// Byte offset of `cached_consumed` in the producers' word block (its own 64-byte line).
const CACHED_CONSUMED_OFFSET: usize = 64;
/// Bytes of the producers' word block: two 64-byte lines.
const PRODUCER_WORDS_BYTES: usize = 128;

/// One ring's memory.
pub struct Ring {
    index: usize,
    slot_count: u32,
    /// Slots then the control lines (host-visible: host memory or mapped pinned memory).
    slots: Block,
    /// `reserved` and `cached_consumed` (host memory, or device memory on a GPU).
    words: Block,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("index", &self.index).field("slot_count", &self.slot_count).finish()
    }
}

impl Ring {
    /// A zeroed ring of `slot_count` slots (a power of two, at most [`RING_SLOTS_MAX`]).
    pub fn new(index: usize, slot_count: u32, placement: &Placement) -> Result<Ring, DeviceError> {
        if !slot_count.is_power_of_two() || slot_count > RING_SLOTS_MAX {
            return Err(DeviceError::Config {
                what: format!("slot_count {slot_count}: a power of two at most {RING_SLOTS_MAX}"),
            });
        }
        let slot_bytes = slot_count as usize * DESCRIPTOR_BYTES;
        let slots = Block::new(placement, Want::Shared, slot_bytes + std::mem::size_of::<RingControl>())?;
        let words = Block::new(placement, Want::DeviceOnly, PRODUCER_WORDS_BYTES)?;
        Ok(Ring { index, slot_count, slots, words })
    }

    /// The ring's index in its communicator (its proxy thread's name).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Slots in the ring.
    pub fn slot_count(&self) -> u32 {
        self.slot_count
    }

    fn control_word(&self, field_offset: usize) -> &AtomicU64 {
        let at = self.slot_count as usize * DESCRIPTOR_BYTES + field_offset;
        self.slots.word(at / 8).expect("the control lines are host-visible and in bounds")
    }

    /// `control.consumed`.
    pub fn consumed(&self) -> &AtomicU64 {
        self.control_word(offset_of!(RingControl, consumed))
    }

    /// `control.completed`.
    pub fn completed(&self) -> &AtomicU64 {
        self.control_word(offset_of!(RingControl, completed))
    }

    /// `control.error`.
    pub fn error(&self) -> &AtomicU64 {
        self.control_word(offset_of!(RingControl, error))
    }

    /// The slot of `ticket`: `ticket % slot_count`, as a mask (the count is a power of two,
    /// checked in [`Ring::new`]). Why not `%`: with the count known only at run time it is a
    /// 64-bit division, tens of cycles, and a proxy computes a slot several times a descriptor
    /// at millions of descriptors a second.
    pub(crate) fn slot_of(&self, ticket: u64) -> usize {
        (ticket & (u64::from(self.slot_count) - 1)) as usize
    }

    /// The `seq` word of slot `index % slot_count`.
    pub(crate) fn seq(&self, ticket: u64) -> &AtomicU64 {
        let slot = self.slot_of(ticket);
        self.slots.word(slot * DESCRIPTOR_BYTES / 8).expect("slot in bounds")
    }

    /// Host pointer to the slot of `ticket`.
    pub(crate) fn slot_ptr(&self, ticket: u64) -> *mut Descriptor {
        let slot = self.slot_of(ticket);
        let base = self.slots.host_ptr().expect("slots are host-visible");
        base.wrapping_add(slot * DESCRIPTOR_BYTES) as *mut Descriptor
    }

    /// The producers' words, where the host can reach them (host placement only).
    pub(crate) fn producer_words(&self) -> Option<(&AtomicU64, &AtomicU64)> {
        Some((self.words.word(0)?, self.words.word(CACHED_CONSUMED_OFFSET / 8)?))
    }

    /// Where the ring lives, as GPU code sees it.
    pub fn device(&self) -> RingDevice {
        let slots = self.slots.device_addr();
        let words = self.words.device_addr();
        RingDevice {
            slots,
            control: slots + u64::from(self.slot_count) * DESCRIPTOR_BYTES as u64,
            reserved: words,
            cached_consumed: words + CACHED_CONSUMED_OFFSET as u64,
            slot_count: self.slot_count,
            _pad: 0,
        }
    }
}
